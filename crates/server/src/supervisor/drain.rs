//! SIGTERM's drain, as the supervisor runs it (the workers' side: `worker/drain.rs`).

use std::time::Duration;

use hongbao_sys::clock::Uptime;

use super::event_loop::Supervisor;
use crate::link::{self, ToWorker};

/// How long past a drain's window the supervisor waits for its workers to stop (their
/// last kicks written, their last reports in) before it stops them.
pub(super) const DRAIN_LAST_WRITES: Duration = Duration::from_secs(3);

impl Supervisor {
    /// A stop was asked for at `now`: whether to serve on meanwhile, draining. SIGTERM
    /// (`Stop::gently`) with a `drain_secs` window starts a drain: not ready from now
    /// (an orchestrator or nginx sends no one new), and every worker told to stop
    /// accepting and to let its connections go over the window, each told to come back
    /// (`worker/drain.rs`); the ledger commits on for the shakes still coming in. It is
    /// over once every worker has stopped, at the window's end (with a little room for
    /// the last writes), or at SIGINT.
    pub(super) fn draining(&mut self, now: Uptime) -> bool {
        if !self.stop.gently() || self.cfg.processes.drain_secs == 0 {
            return false;
        }
        let Some((began, until)) = self.draining else {
            let window = Duration::from_secs(self.cfg.processes.drain_secs.into());
            self.draining = Some((now, now + window + DRAIN_LAST_WRITES));
            self.shutting_down = true; // a worker that stops is not started again
                                       // The supervisor's copies of the listening sockets closed with the workers'
                                       // (`worker/drain.rs`): a client that connects now is refused and goes to
                                       // another gateway, not left in a queue nobody reads.
            self.sockets.close_all();
            self.health.stopping(false);
            self.tell_systemd(|n| n.stopping("draining"));
            tracing::info!(
                workers = self.worker_links.len(),
                window_secs = self.cfg.processes.drain_secs,
                "SIGTERM: draining, the connections let go over the window (SIGINT stops at once)"
            );
            let window_ms = window.as_millis().min(u32::MAX.into()) as u32;
            for link in self.links.iter_mut().map(|(_, l)| l) {
                let drain = ToWorker::Drain {
                    window_ms,
                    retry_after_ms: crate::worker::DRAIN_RETRY_AFTER_MS,
                };
                link::encode(&drain, &mut link.outbuf);
            }
            return true;
        };
        if self.worker_links.is_empty() || now >= until {
            tracing::info!(
                took_ms = now.since(began).as_millis() as u64,
                workers_left = self.worker_links.len(),
                "drained"
            );
            return false;
        }
        true
    }
}
