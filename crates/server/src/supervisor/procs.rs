//! A worker process and its link, as the supervisor keeps them: the child, its
//! restarts and when it starts again, its last stats; the link's stream and bytes.

use std::process::Child;
use std::time::Duration;

use hongbao_money::WorkerId;
use hongbao_sys::clock::Uptime;
use mio::net::UnixStream;

use crate::stats::WorkerStats;

/// A worker whose link output backs up past this is treated as dead.
pub(super) const MAX_LINK_BACKLOG: usize = 256 << 20;

pub(super) struct Link {
    pub(super) stream: UnixStream,
    /// Set once the worker said hello.
    pub(super) worker: Option<WorkerId>,
    /// The worker this link was made for.
    pub(super) expected: WorkerId,
    pub(super) inbuf: Vec<u8>,
    pub(super) outbuf: Vec<u8>,
}

pub(super) struct WorkerProc {
    pub(super) child: Option<Child>,
    pub(super) restarts: u32,
    pub(super) respawn_at: Option<Uptime>,
    /// Stats reports: latest and the one a second before, for per-second rates.
    pub(super) latest: Option<WorkerStats>,
    pub(super) previous: Option<WorkerStats>,
}

impl WorkerProc {
    pub(super) fn new(child: Child) -> WorkerProc {
        WorkerProc {
            child: Some(child),
            restarts: 0,
            respawn_at: None,
            latest: None,
            previous: None,
        }
    }

    /// Counts a restart and sets when to start the worker: later each time it keeps
    /// dying (or failing to start), so a crash loop cannot spin, from `now`. Returns the
    /// wait.
    pub(super) fn start_later(&mut self, now: Uptime) -> Duration {
        self.restarts += 1;
        let delay = Duration::from_millis(100 * self.restarts.min(50) as u64);
        self.respawn_at = Some(now + delay);
        delay
    }
}
