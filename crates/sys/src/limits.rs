//! The per-process open-file limit, and what it means for how many sockets one process
//! (a gateway worker, a load client) may hold. On these machines the hard limit is 20,000
//! and cannot be raised, so servers and load generators split into processes under it.

/// Raises the soft open-file limit to the hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    lim.rlim_cur
}

/// How many sockets one process may hold: the open-file limit less 5% headroom for its
/// own files (listeners, links, epoll, stdio).
pub fn sockets_per_process(nofile_limit: u64) -> u64 {
    nofile_limit.saturating_sub(nofile_limit / 20).max(100)
}

/// How many connections to plan per process: 95% of what one may hold. SO_REUSEPORT
/// spreads connections by a hash, not evenly; planned full, the fullest workers turned ~1
/// in 1,000 connections away at a million (each came back on another worker, but only
/// after a reconnect).
pub fn planned_sockets_per_process(nofile_limit: u64) -> u64 {
    (sockets_per_process(nofile_limit) * 19 / 20).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_under_the_limit() {
        assert_eq!(sockets_per_process(20_000), 19_000);
        assert_eq!(planned_sockets_per_process(20_000), 18_050);
        assert_eq!(sockets_per_process(50), 100);
    }
}
