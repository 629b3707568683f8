//! Work that must not take the machine from a server beside it (a backup of its ledger):
//! the idle CPU scheduling policy (`SCHED_IDLE`: below nice 19, and it never preempts a
//! waking task), nice 19 for schedulers without it, and the idle I/O class, so it runs on
//! what the server leaves.

/// Makes this process background work: `SCHED_IDLE`, nice 19 and the idle I/O
/// scheduling class (`ioprio_set(2)`; a disk scheduler without I/O classes ignores it).
/// Its threads made afterwards and its children inherit all three.
pub fn background() -> std::io::Result<()> {
    // SAFETY: sched_setscheduler, setpriority and ioprio_set on this process, with
    // constant arguments.
    unsafe {
        if libc::setpriority(libc::PRIO_PROCESS, 0, 19) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_IDLE: libc::c_long = 3;
        const IOPRIO_CLASS_SHIFT: libc::c_long = 13;
        if libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// In a child process (the priority cannot be raised back): SCHED_IDLE and nice 19
    /// afterwards.
    #[test]
    fn background_work_runs_idle_at_nice_19() {
        // SAFETY: a fork whose child only calls async-signal-safe functions and exits.
        unsafe {
            let pid = libc::fork();
            if pid == 0 {
                let ok = super::background().is_ok()
                    && libc::getpriority(libc::PRIO_PROCESS, 0) == 19
                    && libc::sched_getscheduler(0) == libc::SCHED_IDLE;
                libc::_exit(if ok { 0 } else { 1 });
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert_eq!(libc::WEXITSTATUS(status), 0);
        }
    }
}
