//! The worker draining: it closes its listeners and lets its connections go at the pace
//! `Drain` (drain.rs) sets, each kicked with when to come back, then stops.

use std::time::Duration;

use hongbao_proto::KickReason;
use hongbao_sys::clock::Uptime;

use super::conn::Phase;
use super::drain::Drain;
use super::event_loop::Worker;

impl Worker {
    /// The supervisor said drain, over `window`: the listeners closed, the connections
    /// held now let go in turn from here on (`drain_step`).
    pub(super) fn start_drain(&mut self, window: Duration, retry_after_ms: u32) {
        if self.drain.is_some() {
            return;
        }
        self.listeners.close_all(self.poll.registry());
        self.drain_order = self.conns.iter().map(|(key, _)| key).collect();
        let now = self.time.polled;
        tracing::info!(
            connections = self.drain_order.len(),
            window_ms = window.as_millis() as u64,
            "draining: not accepting, letting the connections go over the window"
        );
        self.drain = Some(Drain::new(now, window, self.drain_order.len()).telling(retry_after_ms));
        self.drain_step(now);
    }

    /// Lets go the connections whose turn has come: an open one kicked `shutdown` with
    /// when to come back, one whose TLS handshake is under way closed. Stops the
    /// worker once it holds nothing, or once the window is over.
    pub(super) fn drain_step(&mut self, now: Uptime) {
        let Some(drain) = self.drain.as_mut() else {
            return;
        };
        let due = drain.due(now);
        let over = drain.over(now);
        let retry_after_ms = drain.retry_after_ms();
        let mut turn = drain.take_answering();
        // No connection is accepted while draining, so a key still in the slab is the
        // connection it was at the drain's start.
        turn.extend(self.drain_order.drain(..due.min(self.drain_order.len())));
        for key in turn {
            let conn = self.conns.get(key);
            match conn.map(|c| c.state.phase) {
                // Its handshake not done: nothing to tell it over, nothing lost.
                Some(Phase::Open) if self.is_handshaking(key) => self.close(key),
                // Its answer first: what it was told it won, it is told.
                Some(Phase::Open) if !over && conn.is_some_and(|c| c.state.awaiting > 0) => {
                    if let Some(drain) = self.drain.as_mut() {
                        drain.answer_first(key);
                    }
                }
                Some(Phase::Open) => self.kick_after(
                    key,
                    KickReason::Shutdown,
                    "server shutting down: come back soon",
                    retry_after_ms,
                ),
                // Half closed or saying goodbye: it closes itself once written.
                Some(Phase::Draining | Phase::Closing) | None => {}
            }
        }
        if self.conns.is_empty() || over {
            self.shutdown = true;
        }
    }

    /// The supervisor lets the first `count` go now (`Drain::grant`).
    pub(super) fn grant_drain(&mut self, count: usize) {
        if let Some(drain) = self.drain.as_mut() {
            drain.grant(count);
        }
        let now = self.time.polled;
        self.drain_step(now);
    }

    /// How long the loop may wait before the drain's next kick.
    pub(super) fn drain_wait(&self) -> Option<Duration> {
        self.drain
            .as_ref()
            .and_then(|d| d.next_in(self.time.polled))
    }
}
