//! A worker's drain (SIGTERM): it stops accepting at once — its listeners closed, so a
//! client that connects now is refused and goes to another gateway, not left waiting in
//! a queue nobody reads — and kicks the connections it holds `shutdown`, each with
//! `retry_after_ms` (SIGTERM: `DRAIN_RETRY_AFTER_MS`, to the other gateways; an upgrade:
//! a tenth of it, to the new server on the same sockets), spread evenly over the drain window: the
//! k-th of n goes k/n of the way through it. The clients come back at the pace they were
//! let go, not as one storm. Once it holds no connection (or the window is over and the
//! last are kicked) the worker stops.
//!
//! In an upgrade the window is a ceiling: the supervisor also lets connections go ahead
//! of it (`grant`, `ToWorker::DrainTo`) while the new server keeps up — the k-th goes at
//! its turn on the window's clock or once k are granted, whichever comes first.
//!
//! `Drain` is the pacing alone, on the worker's clock, so that a test can drive it with
//! the times it chooses.

use std::time::Duration;

use hongbao_sys::clock::Uptime;

/// When a client drained by SIGTERM is told to come back: about a second (a client takes
/// ½ to 1½ of it), at a gateway that admits it — the kicks are already spread over the
/// window.
pub const DRAIN_RETRY_AFTER_MS: u32 = 1_000;

/// How long after the window's end a worker still waits for its last kicks to be
/// written before it stops regardless.
const LAST_WRITES: Duration = Duration::from_secs(1);

/// The pacing of a drain: `total` connections let go evenly over `window` from `began`.
#[derive(Debug)]
pub(super) struct Drain {
    began: Uptime,
    window: Duration,
    total: usize,
    /// How many have been let go so far.
    done: usize,
    /// What each is told: come back in this many milliseconds.
    retry_after_ms: u32,
    /// How many the supervisor has let go ahead of the window (an upgrade's credit).
    granted: usize,
    /// Connections whose turn came while a request of theirs was with the supervisor: let go
    /// once its answer is written (a win is told before the kick), or at the window's end.
    answering: Vec<usize>,
}

impl Drain {
    pub(super) fn new(began: Uptime, window: Duration, total: usize) -> Drain {
        Drain {
            began,
            window,
            total,
            done: 0,
            retry_after_ms: DRAIN_RETRY_AFTER_MS,
            granted: 0,
            answering: Vec::new(),
        }
    }

    /// The drain, each let go told to come back in `ms` milliseconds.
    pub(super) fn telling(self, ms: u32) -> Drain {
        Drain {
            retry_after_ms: ms,
            ..self
        }
    }

    /// When each let go is told to come back, in milliseconds.
    pub(super) fn retry_after_ms(&self) -> u32 {
        self.retry_after_ms
    }

    /// Those whose turn came while a request of theirs was with the supervisor, taken
    /// to be looked at again.
    pub(super) fn take_answering(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.answering)
    }

    /// `key`'s turn came with a request of its with the supervisor: let go once its
    /// answer is written.
    pub(super) fn answer_first(&mut self, key: usize) {
        self.answering.push(key);
    }

    /// How many more to let go at `now`: those whose turn has come (the k-th of n at
    /// k/n of the window; all of them once it is over).
    pub(super) fn due(&mut self, now: Uptime) -> usize {
        let elapsed = now.since(self.began);
        let by_now = if elapsed >= self.window {
            self.total
        } else {
            let share = self.total as u128 * elapsed.as_nanos() / self.window.as_nanos();
            (share as usize).max(self.granted.min(self.total))
        };
        let due = by_now.saturating_sub(self.done);
        self.done += due;
        due
    }

    /// The supervisor lets the first `count` go, whatever the window says (never fewer
    /// than before).
    pub(super) fn grant(&mut self, count: usize) {
        self.granted = self.granted.max(count);
    }

    /// How long from `now` until the next one's turn (none when all have gone).
    pub(super) fn next_in(&self, now: Uptime) -> Option<Duration> {
        if self.done >= self.total {
            return None;
        }
        // The (done + 1)-th goes at (done + 1)/total of the window.
        let at = self.window.as_nanos() * (self.done as u128 + 1) / self.total as u128;
        let at = self.began + Duration::from_nanos(at as u64);
        Some(at.since(now))
    }

    /// Whether the worker has waited long enough for the last of its kicks.
    pub(super) fn over(&self, now: Uptime) -> bool {
        now.since(self.began) >= self.window + LAST_WRITES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Uptime {
        Uptime::from_millis(ms)
    }

    #[test]
    fn a_drain_lets_its_connections_go_evenly_over_its_window() {
        // 10 over 5 s from t = 100 s: one each half-second, the 10th at the window's end.
        let mut d = Drain::new(at(100_000), Duration::from_secs(5), 10);
        assert_eq!(d.due(at(100_000)), 0);
        assert_eq!(d.next_in(at(100_000)), Some(Duration::from_millis(500)));
        assert_eq!(d.due(at(100_499)), 0);
        assert_eq!(d.due(at(100_500)), 1);
        assert_eq!(d.next_in(at(100_600)), Some(Duration::from_millis(400)));
        // A loop late by 2 s lets go the 4 whose turn came meanwhile, no more.
        assert_eq!(d.due(at(102_600)), 4);
        assert_eq!(d.due(at(102_600)), 0);
        // The window over: the rest at once, then nothing is left to wait for.
        assert_eq!(d.due(at(105_000)), 5);
        assert_eq!(d.next_in(at(105_000)), None);
        assert!(!d.over(at(105_999)));
        assert!(d.over(at(106_000)));
    }

    #[test]
    fn a_grant_lets_them_go_ahead_of_the_window_never_behind_it() {
        // 100 over 100 s: one a second by the window.
        let mut d = Drain::new(at(0), Duration::from_secs(100), 100);
        assert_eq!(d.due(at(1_000)), 1);
        // The new server keeps up: 30 granted, 29 more go now.
        d.grant(30);
        assert_eq!(d.due(at(1_000)), 29);
        assert_eq!(d.due(at(2_000)), 0, "the window is behind the grant");
        // A smaller grant takes nothing back; the window overtakes it.
        d.grant(10);
        assert_eq!(d.due(at(31_000)), 1);
        // More than there are: all, no more.
        d.grant(1_000);
        assert_eq!(d.due(at(31_000)), 69);
        assert_eq!(d.next_in(at(31_000)), None);
    }

    #[test]
    fn a_million_over_ten_seconds_is_a_hundred_thousand_a_second() {
        let mut d = Drain::new(at(0), Duration::from_secs(10), 1_000_000);
        let per_second: Vec<usize> = (1..=10).map(|s| d.due(at(s * 1_000))).collect();
        assert_eq!(per_second, [100_000; 10]);
        // Nothing held, or no window: all at once.
        assert_eq!(Drain::new(at(0), Duration::from_secs(10), 0).due(at(0)), 0);
        assert_eq!(Drain::new(at(0), Duration::ZERO, 7).due(at(0)), 7);
        assert_eq!(
            Drain::new(at(0), Duration::ZERO, 7).next_in(at(0)),
            Some(Duration::ZERO)
        );
    }
}
