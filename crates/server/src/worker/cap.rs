//! The shake cap: once a queue of shakes past `max_queue_ms` has drained, a worker admits
//! no more shakes a second than it was just seen to serve, and answers the rest
//! `overloaded` at once, as they are read. Only in the `fifo` read order (`ready_order`):
//! the adaptive order reads the newest connections first instead (ready.rs), and against
//! clients that ignore the back-off hint a cap held workers at their least for good.
//!
//! Shedding only what has waited too long acts on the queue's length, and the users it
//! sends away act on what arrives only once they have heard it and stayed away: one
//! integral behind another. The served rate swung in waves of 15–25 s, and each wave
//! ended in seconds of a queue so long that nearly all of it was shed (docs/BENCHMARKS.md,
//! issue 16). The cap acts on the rate instead: what arrives above it is shed as it
//! arrives, so no queue builds and the shedding matches the excess second by second, and
//! what is served stays at the cap.
//!
//! The cap follows the machine. A queue past the limit is first shed as late (a share
//! of what waited past it, handler.rs); once it has drained — a tenth of a second with no
//! shake waiting past half the limit — the worker caps its shakes at nine tenths of the
//! most it admitted in a tenth of a second over the last second (a rate it did serve, at
//! a moment it was behind). Then, each tenth of a second:
//! - the cap refused a shake and none waited past half the limit: it grows by a
//!   hundredth (about a tenth a second) — or by a tenth, when none waited past a
//!   twentieth of the limit: the worker reads as fast as shakes come, so the cap, not
//!   the machine, is what holds it back (a cap cut while the machine was starved climbs
//!   back in seconds, not minutes);
//! - a shake waited past half the limit after a tenth without such waits (a queue formed
//!   under the cap): it is cut to nine tenths of the most admitted in a tenth since the
//!   last cut. A queue that does not drain is the reading falling behind (the worker
//!   starved of CPU), which a lower cap would not help: it is shed as late meanwhile;
//! - it refused nothing for `IDLE_TENTHS` tenths (30 s) in a row: it is dropped. The
//!   overload is over, and a rise in shakes is admitted in full again. Not sooner: the
//!   users sent away in the backlog come back over tens of seconds, and a cap dropped
//!   meanwhile let them build a second backlog, shed as late, that sent them away again
//!   (docs/BENCHMARKS.md); a cap kept refuses them as they come instead, and while the
//!   worker keeps up it grows by a tenth a tenth, out of the way within a second or two.

use std::time::Duration;

/// A cap is cut to this share of the rate it was just seen to serve...
const CUT: f64 = 0.9;
/// ...and grows by this share per tenth of a second while it refuses shakes...
const GROWTH: f64 = 0.01;
/// ...or by this share, when no shake waited past `1 / IDLE_WAIT` of the limit.
const FAST_GROWTH: f64 = 0.1;
/// A wait under this fraction (its reciprocal) of the limit is no queue at all.
const IDLE_WAIT: u64 = 20;
/// A cap that refused nothing for this many tenths of a second in a row is dropped.
const IDLE_TENTHS: u32 = 300;
/// The least a cap admits a second: a worker never sheds everything.
const MIN_PER_SEC: f64 = 10.0;
/// Tenths of a second over which the rate served is judged.
const RECENT: usize = 10;
/// A tenth of a second, in µs.
const TENTH_US: u64 = 100_000;

#[derive(Default)]
pub(super) struct Cap {
    /// Shakes admitted a second; 0: no cap.
    per_sec: f64,
    /// What the cap may admit now (a hundredth of a second's worth at most), and when
    /// that was last topped up (µs since the Unix epoch).
    tokens: f64,
    topped_us: u64,
    /// When the shake last counted was read (µs since the Unix epoch).
    now_us: u64,
    /// The tenth of a second being counted (since the Unix epoch), and in it: shakes
    /// admitted, the longest wait in the kernel (µs), whether the cap refused one.
    tenth: u64,
    admitted: u32,
    longest_us: u64,
    refused: bool,
    /// Shakes admitted in each of the last `RECENT` whole tenths (a ring; emptied at a
    /// cut, so that it holds what was served under the cap).
    recent: [u32; RECENT],
    /// Uncapped: a shake waited past the limit. Capped: a tenth since the last cut saw no
    /// wait past half the limit.
    behind: bool,
    drained: bool,
    idle_tenths: u32,
}

impl Cap {
    /// Counts a shake read at `now` after waiting `waited` in the kernel, with shakes
    /// waiting past `max` meaning overload, closing the tenths that have ended.
    pub(super) fn shake(&mut self, now: Duration, waited: Duration, max: Duration) {
        self.now_us = now.as_micros() as u64;
        let tenth = self.now_us / TENTH_US;
        if tenth != self.tenth {
            self.close_tenth(tenth, max);
            self.tenth = tenth;
            self.admitted = 0;
            self.longest_us = 0;
            self.refused = false;
        }
        self.longest_us = self.longest_us.max(waited.as_micros() as u64);
    }

    /// Closes the tenth counted, `next` having begun.
    fn close_tenth(&mut self, next: u64, max: Duration) {
        let gap = next.saturating_sub(self.tenth);
        for t in self.tenth..next.min(self.tenth + RECENT as u64) {
            self.recent[t as usize % RECENT] = if t == self.tenth { self.admitted } else { 0 };
        }
        let max_us = max.as_micros() as u64;
        let queued = self.longest_us > max_us / 2;
        let served = f64::from(self.recent.iter().copied().max().unwrap_or(0)) * 10.0;
        if self.per_sec == 0.0 {
            if max_us > 0 && self.longest_us > max_us {
                self.behind = true;
            } else if self.behind && !queued {
                self.behind = false;
                self.cut_to(served * CUT);
            }
            return;
        }
        if queued {
            if self.drained {
                self.cut_to(served * CUT);
            }
            self.idle_tenths = 0;
            return;
        }
        self.drained = true;
        if self.refused {
            let fast = self.longest_us <= max_us / IDLE_WAIT;
            self.per_sec *= 1.0 + if fast { FAST_GROWTH } else { GROWTH };
            self.idle_tenths = 0;
        } else {
            let idle = u32::try_from(gap).unwrap_or(u32::MAX);
            self.idle_tenths = self.idle_tenths.saturating_add(idle);
            if self.idle_tenths >= IDLE_TENTHS {
                *self = Cap::default();
            }
        }
    }

    fn cut_to(&mut self, per_sec: f64) {
        self.per_sec = per_sec.max(MIN_PER_SEC);
        // Enough for the shake being read: what comes after it, at the cap's rate.
        self.tokens = 1.0;
        self.topped_us = (self.tenth + 1) * TENTH_US;
        self.recent = [0; RECENT];
        self.drained = false;
        self.idle_tenths = 0;
    }

    fn burst(&self) -> f64 {
        (self.per_sec / 100.0).max(1.0)
    }

    /// Whether the shake just counted is admitted.
    pub(super) fn admit(&mut self) -> bool {
        if self.per_sec > 0.0 {
            let elapsed = self.now_us.saturating_sub(self.topped_us) as f64 / 1e6;
            self.topped_us = self.now_us;
            self.tokens = (self.tokens + elapsed * self.per_sec).min(self.burst());
            if self.tokens < 1.0 {
                self.refused = true;
                return false;
            }
            self.tokens -= 1.0;
        }
        self.admitted += 1;
        true
    }

    /// Shakes admitted a second now; 0 when there is no cap.
    pub(super) fn per_sec(&self) -> u32 {
        self.per_sec as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_millis(200);

    /// `n` shakes spread over tenth `t` (since the epoch), each having waited `waited_ms`;
    /// how many were admitted.
    fn tenth(c: &mut Cap, t: u64, n: u64, waited_ms: u64) -> u64 {
        (0..n)
            .filter(|i| {
                let us = t * TENTH_US + i * TENTH_US / n;
                c.shake(
                    Duration::from_micros(us),
                    Duration::from_millis(waited_ms),
                    MAX,
                );
                c.admit()
            })
            .count() as u64
    }

    /// A queue past the limit in tenth 1000, drained in 1001 (`n` shakes in each); the
    /// cap is set as 1002 begins.
    fn behind_then_drained(c: &mut Cap, n: u64) {
        tenth(c, 1000, n, 250);
        tenth(c, 1001, n, 10);
        tenth(c, 1002, 1, 10);
    }

    #[test]
    fn a_drained_backlog_caps_at_nine_tenths_of_the_most_served() {
        let mut c = Cap::default();
        assert_eq!(tenth(&mut c, 1000, 500, 10), 500);
        assert_eq!(tenth(&mut c, 1001, 400, 250), 400);
        // Shed as late while it drains: no cap yet.
        tenth(&mut c, 1002, 300, 150);
        tenth(&mut c, 1003, 300, 10);
        assert_eq!(c.per_sec(), 0);
        // Closing 1003, drained: the most served in a tenth was 500, 5,000 a second.
        tenth(&mut c, 1004, 1, 10);
        assert_eq!(c.per_sec(), 4500);
        // What arrives above the cap is refused as it is read.
        let admitted = tenth(&mut c, 1005, 1000, 10);
        assert!((440..=500).contains(&admitted), "{admitted}");
    }

    #[test]
    fn a_queue_formed_under_the_cap_cuts_it_and_one_that_stays_does_not() {
        let mut c = Cap::default();
        behind_then_drained(&mut c, 500);
        assert_eq!(c.per_sec(), 4500);
        let a1 = tenth(&mut c, 1003, 1000, 20);
        let a2 = tenth(&mut c, 1004, 1000, 150);
        let grown = f64::from(c.per_sec());
        assert!((grown - 4545.0).abs() <= 1.0, "{grown}: +1% for refusing");
        // Closing 1004: a queue formed under the cap: cut to nine tenths of the most
        // admitted in a tenth since the cap was set.
        tenth(&mut c, 1005, 1000, 150);
        let cap = f64::from(c.per_sec());
        let served = a1.max(a2) as f64 * 10.0;
        assert!(
            (cap - served * 0.9).abs() <= 1.0,
            "{cap} after serving {served}"
        );
        // The queue stays: no further cut (it is shed as late meanwhile).
        for t in 1006..1016 {
            tenth(&mut c, t, 1000, 300);
        }
        assert_eq!(f64::from(c.per_sec()), cap);
    }

    #[test]
    fn a_cap_that_refuses_grows_and_one_that_does_not_for_30_s_is_dropped() {
        let mut c = Cap::default();
        behind_then_drained(&mut c, 100);
        assert_eq!(c.per_sec(), 900);
        // Refusing, with waits under half the limit: +1% a tenth (the tenth with one
        // shake refused none).
        for t in 1003..1013 {
            tenth(&mut c, t, 1000, 20);
        }
        let grown = c.per_sec();
        assert!((980..=990).contains(&grown), "{grown}");
        // Fewer shakes than the cap: nothing refused (once the tokens spent refusing are
        // back); after 30 s of that the cap goes.
        tenth(&mut c, 1013, 50, 5);
        for t in 1014..1313 {
            assert_eq!(tenth(&mut c, t, 50, 5), 50);
        }
        assert!(c.per_sec() > 0);
        tenth(&mut c, 1400, 1, 5);
        assert_eq!(c.per_sec(), 0);
        assert_eq!(tenth(&mut c, 1401, 5000, 5), 5000);
    }

    #[test]
    fn a_cap_that_refuses_while_shakes_wait_nothing_grows_by_a_tenth_a_tenth() {
        let mut c = Cap::default();
        behind_then_drained(&mut c, 100);
        assert_eq!(c.per_sec(), 900);
        // Refusing, and no shake waited past a twentieth of the limit (10 ms): +10% a
        // tenth, 2.36x in nine tenths (the first tenth after the cap refused none).
        for t in 1003..1013 {
            tenth(&mut c, t, 5000, 10);
        }
        let grown = f64::from(c.per_sec());
        assert!((grown - 900.0 * 1.1f64.powi(9)).abs() <= 2.0, "{grown}");
        // A wait of 11 ms (in 1013, closed as 1014 begins): back to +1%.
        tenth(&mut c, 1013, 5000, 11);
        tenth(&mut c, 1014, 1, 11);
        let slow = f64::from(c.per_sec());
        let expected = grown * 1.1 * 1.01;
        assert!((slow - expected).abs() <= 2.0, "{slow}, not {expected}");
    }

    #[test]
    fn a_cap_admits_at_least_the_floor() {
        let mut c = Cap::default();
        // Everything shed as late: nothing admitted before the queue drained.
        for (ms, waited) in [(100_000, 900), (100_100, 10), (100_200, 10)] {
            c.shake(
                Duration::from_millis(ms),
                Duration::from_millis(waited),
                MAX,
            );
        }
        assert_eq!(f64::from(c.per_sec()), MIN_PER_SEC);
    }

    #[test]
    fn no_cap_while_read_in_time_nor_before_the_backlog_drained_nor_without_a_limit() {
        for waited_ms in [150, 5000] {
            let mut c = Cap::default();
            for t in 1000..1100 {
                assert_eq!(tenth(&mut c, t, 500, waited_ms), 500);
            }
            assert_eq!(c.per_sec(), 0, "waits of {waited_ms} ms");
        }
        let mut c = Cap::default();
        for (ms, waited) in [(100_000, 5000), (100_100, 10), (100_200, 10)] {
            let waited = Duration::from_millis(waited);
            c.shake(Duration::from_millis(ms), waited, Duration::ZERO);
        }
        assert_eq!(c.per_sec(), 0);
    }
}
