//! Every deadline of a worker's loop, in one table: the once-a-second tick, and each
//! connection's next deadline — its login, its idle timeout, an HTTP request's, a kicked
//! connection's grace, a half-closed one's answers — filed under the second it falls in.
//!
//! A connection is visited when a second it was filed under comes, never by a walk of
//! every connection: a logged-in session with no idle timeout is not in the table at all,
//! and a million of them cost the tick nothing. What a visit decides is the tick's
//! (`tick.rs`): close or kick the connection, or file it again under its deadline as
//! its state says now — a deadline moved since it was filed (a read resets the idle
//! clock) is found then, not tracked as it moves. A connection filed twice (its state
//! changed and filed it anew) is visited once a second (`due` drops the repeats), and its
//! entries meet at the one deadline its state gives.
//!
//! The poll's timeout is the nearest of the loop's deadlines: the tick, or the broadcast
//! pacer's next write (`Worker::broadcast_wait`). Time comes in as a value, never read
//! here, so the tests run on a clock they move.

use std::collections::BTreeMap;
use std::time::Duration;

use hongbao_money::ConnId;
use hongbao_sys::clock::{UnixTime, Uptime, UptimeSecs};

/// How long after each whole Unix second the tick falls: every worker's per-second
/// counters then describe the same second, and the supervisor (which reports 150 ms
/// after it) has them all.
pub(super) const TICK_AFTER_SECOND: Duration = Duration::from_millis(20);

pub(super) struct Timers {
    /// When the next tick falls.
    next_tick: Uptime,
    /// Connections to visit, by the second their deadline falls in.
    by_second: BTreeMap<UptimeSecs, Vec<ConnId>>,
}

impl Timers {
    /// The first tick just after the next whole Unix second: `now` is that moment's
    /// `Uptime`, `unix` its Unix time.
    pub(super) fn new(now: Uptime, unix: UnixTime) -> Timers {
        Timers {
            next_tick: now + unix.until_next_second() + TICK_AFTER_SECOND,
            by_second: BTreeMap::new(),
        }
    }

    /// Whether the tick is due at `now`.
    pub(super) fn tick_due(&self, now: Uptime) -> bool {
        now >= self.next_tick
    }

    /// The tick ran at `now` (the Unix time then: `unix`): the next falls just after the
    /// Unix second that follows.
    pub(super) fn ticked(&mut self, now: Uptime, unix: UnixTime) {
        self.next_tick = now + unix.until_next_second() + TICK_AFTER_SECOND;
    }

    /// How long the loop may wait at `now` before its next deadline: the tick, or
    /// `sooner` (the pacer's) if nearer.
    pub(super) fn timeout(&self, now: Uptime, sooner: Option<Duration>) -> Duration {
        let until_tick = self.next_tick.since(now);
        sooner.map_or(until_tick, |s| s.min(until_tick))
    }

    /// Files connection `conn` to be visited in second `at`.
    pub(super) fn file(&mut self, at: UptimeSecs, conn: ConnId) {
        self.by_second.entry(at).or_default().push(conn);
    }

    /// Takes out every connection filed under a second up to `now`, each once.
    pub(super) fn due(&mut self, now: UptimeSecs) -> Vec<ConnId> {
        let later = self.by_second.split_off(&now.after(1));
        let due = std::mem::replace(&mut self.by_second, later);
        let mut conns: Vec<ConnId> = due.into_values().flatten().collect();
        conns.sort_unstable_by_key(|c| (c.key, c.generation));
        conns.dedup();
        conns
    }

    /// Connections filed, counting repeats.
    #[cfg(test)]
    fn filed(&self) -> usize {
        self.by_second.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(key: u32) -> ConnId {
        ConnId { key, generation: 1 }
    }

    #[test]
    fn a_connection_is_visited_when_its_second_comes_and_once() {
        let mut t = Timers::new(Uptime::ZERO, UnixTime::from_millis(1_000_000_500));
        t.file(UptimeSecs(10), conn(1));
        t.file(UptimeSecs(12), conn(2));
        t.file(UptimeSecs(10), conn(1));
        t.file(UptimeSecs(5), conn(1));
        assert!(t.due(UptimeSecs(4)).is_empty());
        assert_eq!(
            t.due(UptimeSecs(10)),
            [conn(1)],
            "filed three times, visited once"
        );
        assert!(t.due(UptimeSecs(11)).is_empty());
        // A tick that came late takes every second it missed.
        t.file(UptimeSecs(13), conn(3));
        assert_eq!(t.due(UptimeSecs(20)), [conn(2), conn(3)]);
        assert_eq!(t.filed(), 0);
    }

    #[test]
    fn the_tick_falls_just_after_each_unix_second() {
        // Started 300 ms into a Unix second: the first tick 720 ms later.
        let mut t = Timers::new(Uptime::ZERO, UnixTime::from_millis(7_000_300));
        assert_eq!(t.timeout(Uptime::ZERO, None), Duration::from_millis(720));
        assert!(!t.tick_due(Uptime::from_millis(719)));
        // Due at 720 ms (Unix 7_001.020 s): the next 1 s later.
        assert!(t.tick_due(Uptime::from_millis(720)));
        t.ticked(Uptime::from_millis(720), UnixTime::from_millis(7_001_020));
        assert_eq!(
            t.timeout(Uptime::from_millis(720), None),
            Duration::from_millis(1000)
        );
        // A nearer deadline of the pacer wins; a farther one does not.
        let now = Uptime::from_millis(800);
        assert_eq!(
            t.timeout(now, Some(Duration::from_millis(3))),
            Duration::from_millis(3)
        );
        assert_eq!(
            t.timeout(now, Some(Duration::from_secs(5))),
            Duration::from_millis(920)
        );
        // A late turn sets the next tick from when it ran.
        assert!(t.tick_due(Uptime::from_millis(2_500)));
        t.ticked(Uptime::from_millis(2_500), UnixTime::from_millis(7_002_800));
        assert_eq!(
            t.timeout(Uptime::from_millis(2_500), None),
            Duration::from_millis(220)
        );
    }
}
