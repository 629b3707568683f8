//! A process the lab started: its name, host, id and log. Stopping sends SIGTERM, waits,
//! then SIGKILL; `kill` is the fault-injection SIGKILL. The ids are also written to the
//! lab's state file, so `hongbao lab down` can stop a lab whose owner was killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// What the state file records of a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecord {
    pub name: String,
    pub pid: u32,
    /// The process's start time (clock ticks since boot, /proc/PID/stat field 22): a
    /// reused id is not taken for ours.
    pub start_ticks: u64,
}

pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    start_ticks: u64,
}

pub use hongbao_sys::usage::start_ticks;

impl Proc {
    /// Starts `command` with its stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Proc> {
        let opening = || format!("opening {}", log.display());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::io(opening(), e))?;
        let stdout = file.try_clone().map_err(|e| Error::io(opening(), e))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(file)
            .spawn()
            .map_err(|e| Error::io(format!("starting {name}"), e))?;
        let start_ticks = start_ticks(child.id()).unwrap_or(0);
        Ok(Proc {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
            start_ticks,
        })
    }

    /// Starts `command` with piped stdout (read it with `stdout`) and stderr to `log`.
    pub fn spawn_piped(
        name: &str,
        mut command: Command,
        log: &Path,
    ) -> Result<(Proc, std::process::ChildStdout)> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .map_err(|e| Error::io(format!("starting {name}"), e))?;
        let stdout = child.stdout.take().expect("piped");
        let start_ticks = start_ticks(child.id()).unwrap_or(0);
        let proc = Proc {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
            start_ticks,
        };
        Ok((proc, stdout))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn record(&self) -> ProcRecord {
        ProcRecord {
            name: self.name.clone(),
            pid: self.pid(),
            start_ticks: self.start_ticks,
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of its log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// SIGKILL, at once (a host dying).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit either way.
    pub fn stop(&mut self, grace: Duration) {
        self.terminate(grace);
    }

    /// SIGTERM, then SIGKILL after `grace`; waits for the exit either way, and says
    /// whether it exited on its own (within `grace`, or before it was asked).
    pub fn terminate(&mut self, grace: Duration) -> bool {
        if !self.running() {
            return true;
        }
        // SAFETY: kill(2) on our own child's id, which is not reaped yet (try_wait said
        // running), so it cannot have been reused.
        unsafe {
            libc::kill(self.pid() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Stops a process from a state file: only if the id still names the process recorded
/// (same start time). SIGTERM, then SIGKILL after `grace`.
pub fn stop_recorded(record: &ProcRecord, grace: Duration) {
    let ours = || start_ticks(record.pid) == Some(record.start_ticks);
    if !ours() {
        return;
    }
    // SAFETY: kill(2) with a pid whose start time matches the one we recorded.
    unsafe {
        libc::kill(record.pid as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !ours() || is_zombie(record.pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if ours() {
        // SAFETY: as above.
        unsafe {
            libc::kill(record.pid as i32, libc::SIGKILL);
        }
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_known_by_its_start_time() {
        let dir = std::env::temp_dir().join(format!("hb-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut sleep = Command::new("sleep");
        sleep.arg("30");
        let mut p = Proc::spawn("sleep", sleep, &dir.join("sleep.log")).unwrap();
        let record = p.record();
        assert!(record.start_ticks > 0);
        assert_eq!(start_ticks(record.pid), Some(record.start_ticks));
        // A record whose start time differs is someone else's process: left alone.
        let stranger = ProcRecord {
            start_ticks: record.start_ticks + 1,
            ..record.clone()
        };
        stop_recorded(&stranger, Duration::from_millis(100));
        assert!(p.running());
        p.stop(Duration::from_secs(2));
        assert!(!p.running());
        let _ = std::fs::remove_dir_all(dir);
    }
}
