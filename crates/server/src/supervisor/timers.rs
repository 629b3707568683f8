//! Every deadline of the supervisor's loop, in one table: the money side's tick, the
//! round just after each whole Unix second (once the workers' reports of it are in), and
//! the look at the workers (exited ones, respawns). The poll's timeout is the nearest.
//! Time comes in as a value, never read here, so the tests run on a clock they move.

use std::time::Duration;

use hongbao_sys::clock::{UnixTime, Uptime};

/// How long after each whole Unix second the supervisor's round falls: the workers tick
/// 20 ms after it (`worker/timers.rs`), and their reports of the second are in by then.
pub(super) const SECOND_REPORT_DELAY: Duration = Duration::from_millis(150);
/// How often the supervisor looks at its workers.
const CHECK_EVERY: Duration = Duration::from_millis(100);

pub(super) struct Timers {
    /// The money side's tick, and how often it comes.
    tick: Uptime,
    tick_every: Duration,
    /// The per-second round.
    second: Uptime,
    /// The look at the workers.
    check: Uptime,
}

impl Timers {
    /// At `now` (the Unix time then: `unix`): the tick and the check at once, the round
    /// just after the next whole Unix second.
    pub(super) fn new(now: Uptime, unix: UnixTime, tick_every: Duration) -> Timers {
        Timers {
            tick: now,
            tick_every,
            second: now + unix.until_next_second() + SECOND_REPORT_DELAY,
            check: now,
        }
    }

    /// The loop starts at `now` (the Unix time then: `unix`): every deadline as `new`
    /// files them, from there (the start before it may have taken seconds).
    pub(super) fn restart(&mut self, now: Uptime, unix: UnixTime) {
        *self = Timers::new(now, unix, self.tick_every);
    }

    /// How long the loop may wait at `now` before its nearest deadline.
    pub(super) fn timeout(&self, now: Uptime) -> Duration {
        self.tick.min(self.second).min(self.check).since(now)
    }

    /// Whether the tick is due at `now`; if so, the next is filed `tick_every` on.
    pub(super) fn tick_due(&mut self, now: Uptime) -> bool {
        let due = now >= self.tick;
        if due {
            self.tick = now + self.tick_every;
        }
        due
    }

    /// Whether the round is due at `now`.
    pub(super) fn second_due(&self, now: Uptime) -> bool {
        now >= self.second
    }

    /// The round ran at `now` (the Unix time then, read again: `unix`): the next falls
    /// just after the Unix second that follows.
    pub(super) fn seconded(&mut self, now: Uptime, unix: UnixTime) {
        self.second = now + unix.until_next_second() + SECOND_REPORT_DELAY;
    }

    /// Whether the look at the workers is due at `now`; if so, the next is filed.
    pub(super) fn check_due(&mut self, now: Uptime) -> bool {
        let due = now >= self.check;
        if due {
            self.check = now + CHECK_EVERY;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_deadline_comes_at_its_time_and_the_wait_is_the_nearest() {
        let ms = Uptime::from_millis;
        // Started 400 ms into a Unix second; the money side ticks every 20 ms.
        let mut t = Timers::new(
            ms(0),
            UnixTime::from_millis(5_400),
            Duration::from_millis(20),
        );
        assert_eq!(t.timeout(ms(0)), Duration::ZERO);
        assert!(t.tick_due(ms(0)) && t.check_due(ms(0)));
        assert!(!t.tick_due(ms(19)) && !t.check_due(ms(19)));
        assert_eq!(t.timeout(ms(5)), Duration::from_millis(15));
        assert!(t.tick_due(ms(20)));
        assert_eq!(t.timeout(ms(20)), Duration::from_millis(20));
        // The round falls 150 ms after the next whole second: at 750 ms.
        assert!(!t.second_due(ms(749)));
        assert!(t.second_due(ms(750)));
        t.seconded(ms(750), UnixTime::from_millis(6_150));
        assert!(!t.second_due(ms(1_749)) && t.second_due(ms(1_750)));
        // The check comes every 100 ms, filed from when it ran.
        assert!(t.check_due(ms(130)));
        assert!(!t.check_due(ms(229)) && t.check_due(ms(230)));
        // Past every deadline, the loop does not wait.
        assert_eq!(t.timeout(ms(10_000)), Duration::ZERO);
        // The loop starting late (at 20 s, 900 ms into a Unix second) files them afresh.
        t.restart(ms(20_000), UnixTime::from_millis(9_900));
        assert!(t.tick_due(ms(20_000)) && t.check_due(ms(20_000)));
        assert!(!t.second_due(ms(20_249)) && t.second_due(ms(20_250)));
    }
}
