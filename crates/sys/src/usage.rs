//! A process's resident memory and CPU time, read from /proc: what every instance reports
//! each second and what the bench holds per connection.

/// Field 22 of /proc/PID/stat: when the process started (clock ticks after boot), which
/// with its id names one process: an id reused later has another start.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After "pid (comm) ": the comm may contain spaces and parentheses.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's private resident memory (bytes) and CPU time used (ms).
pub fn self_usage() -> (u64, u64) {
    usage_of("self")
}

/// Private resident memory (bytes) and CPU time (ms) of process `pid` ("self" for this
/// one); zeros when it cannot be read (the process is gone). Private: the resident pages
/// less the file-backed and shared ones (`statm`'s resident − shared) — what the process
/// holds of its own. The binary's code, paged in as more of it runs, is shared by every
/// process of it: counted in each worker's RSS it made a 200,000-connection server look
/// 57 bytes a connection heavier than it was (docs/benchmarks/diary.md, issue 51).
pub fn usage_of(pid: &str) -> (u64, u64) {
    let page = 4096;
    let rss = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| {
            let mut f = s.split_whitespace().skip(1);
            let resident: u64 = f.next()?.parse().ok()?;
            let shared: u64 = f.next()?.parse().ok()?;
            Some(resident.saturating_sub(shared))
        })
        .map_or(0, |pages| pages * page);
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = f.get(11)?.parse().ok()?;
            let stime: u64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) * 10) // clock ticks are 10 ms on Linux (USER_HZ = 100)
        })
        .unwrap_or(0);
    (rss, cpu)
}

/// How long this thread has waited, runnable, for a CPU since it started
/// (`/proc/thread-self/schedstat`, its second field); kept open so each reading is one
/// `pread`.
pub struct CpuWait {
    file: Option<std::fs::File>,
}

impl CpuWait {
    pub fn open() -> CpuWait {
        CpuWait {
            file: std::fs::File::open("/proc/thread-self/schedstat").ok(),
        }
    }

    /// The wait so far; `None` when the kernel does not keep it.
    pub fn read(&self) -> Option<std::time::Duration> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let ns: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
        Some(std::time::Duration::from_nanos(ns))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_our_own_usage() {
        let (rss, _cpu) = super::self_usage();
        assert!(rss > 0);
        assert_eq!(super::usage_of("0"), (0, 0));
    }

    #[test]
    fn reads_our_wait_for_a_cpu() {
        let wait = super::CpuWait::open();
        let first = wait.read().expect("schedstat");
        // More threads spinning than there are cores: this one waits for a CPU too.
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let spin = || {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
            while std::time::Instant::now() < until {}
        };
        let spinners: Vec<_> = (0..cores * 2).map(|_| std::thread::spawn(spin)).collect();
        spin();
        for s in spinners {
            s.join().unwrap();
        }
        assert!(wait.read().unwrap() > first);
    }
}
