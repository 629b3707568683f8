//! Every deadline of a load client's loop, in one table: the schedule's current second
//! (its firings and notice polls in time order, and its end, when its report goes out),
//! the users waiting out a back-off before they connect again, when connecting may
//! begin, and the once-a-second look for connections that took too long.
//!
//! The client's time is Unix time: the schedule is shared with every other client
//! process, on every machine, at the coordinator's epoch (less this machine's measured
//! offset), so its clock is the wall clock; the client's own deadlines are kept on the
//! same clock so that the two compare without a conversion. The loop reads the clock once
//! a turn and hands that `now` down; nothing here reads it, so the tests run on a clock
//! they move.
//!
//! The poll's timeout is the nearest of the schedule's deadlines, and never more than a
//! turn ([`TURN`]): connects are paced by the turn (the token bucket fills as time passes,
//! and the back-offs and the connect start fall due between firings).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use hongbao_sys::clock::UnixTime;

use crate::schedule::Firing;

/// The longest the loop waits between turns.
pub(super) const TURN: Duration = Duration::from_millis(10);

/// A Unix time to the millisecond, in 8 bytes where a `UnixTime` takes 16: what a user's
/// record and the back-off queue keep of a time, for half a million users a process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct UnixMs(u64);

impl UnixMs {
    /// `at`, to the millisecond below.
    pub(super) fn of(at: UnixTime) -> UnixMs {
        UnixMs(at.as_millis())
    }

    pub(super) fn time(self) -> UnixTime {
        UnixTime::from_millis(self.0)
    }

    /// How long after `earlier` this is, in whole ms (zero if it is not after it).
    pub(super) fn since(self, earlier: UnixMs) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

pub(super) struct Timers {
    /// Schedule second 0 on this machine's clock.
    epoch: UnixTime,
    /// The second whose firings and polls are loaded (until the first is: the second the
    /// loop started in); its report goes out when it ends.
    second: u64,
    loaded: bool,
    /// The second's firings and notice polls (offset µs into it, user index), in time
    /// order, and the first of each not yet due.
    firings: Vec<Firing>,
    next_firing: usize,
    polls: Vec<(u64, usize)>,
    next_poll: usize,
    /// Users to connect again, by when (their back-off over).
    retry: BinaryHeap<Reverse<(UnixMs, u32)>>,
    /// When connecting may begin.
    connect_from: UnixTime,
    /// When connections are next looked at for taking too long: each whole Unix second.
    next_timeout_check: UnixTime,
}

impl Timers {
    /// A table for a loop starting at `now`, on the schedule from `epoch`.
    pub(super) fn new(epoch: UnixTime, connect_from: UnixTime, now: UnixTime) -> Timers {
        Timers {
            epoch,
            second: now.since(epoch).as_secs(),
            loaded: false,
            firings: Vec::new(),
            next_firing: 0,
            polls: Vec::new(),
            next_poll: 0,
            retry: BinaryHeap::new(),
            connect_from,
            next_timeout_check: now + now.until_next_second(),
        }
    }

    /// The schedule's second 0 moved: the coordinator's clock was measured again.
    pub(super) fn set_epoch(&mut self, epoch: UnixTime) {
        self.epoch = epoch;
    }

    /// The second loaded (or, before the first, the one the loop started in).
    pub(super) fn second(&self) -> u64 {
        self.second
    }

    /// Whether a second's firings are loaded yet.
    pub(super) fn loaded(&self) -> bool {
        self.loaded
    }

    /// The schedule's second at `now` when the loaded one is over, or none is loaded yet:
    /// the loop then finishes the old and loads the new. `None` before the epoch.
    pub(super) fn second_ended(&self, now: UnixTime) -> Option<u64> {
        if now < self.epoch {
            return None;
        }
        let current = now.since(self.epoch).as_secs();
        (!self.loaded || current > self.second).then_some(current)
    }

    /// The vectors of the loaded second, emptied, to fill with the next one's.
    pub(super) fn spare(&mut self) -> (Vec<Firing>, Vec<(u64, usize)>) {
        let mut firings = std::mem::take(&mut self.firings);
        let mut polls = std::mem::take(&mut self.polls);
        firings.clear();
        polls.clear();
        (firings, polls)
    }

    /// Second `second` is loaded: its firings and notice polls, each in time order.
    pub(super) fn load(&mut self, second: u64, firings: Vec<Firing>, polls: Vec<(u64, usize)>) {
        self.second = second;
        self.loaded = true;
        self.firings = firings;
        self.next_firing = 0;
        self.polls = polls;
        self.next_poll = 0;
    }

    /// The next firing of the loaded second with its intended send time, if due at `now`.
    pub(super) fn firing_due(&mut self, now: UnixTime) -> Option<(Firing, UnixTime)> {
        let f = *self.firings.get(self.next_firing)?;
        let intended = self.base() + firing_offset(f);
        (intended <= now).then(|| {
            self.next_firing += 1;
            (f, intended)
        })
    }

    /// The next firing of the loaded second, due or not (the second is over).
    pub(super) fn firing_left(&mut self) -> Option<(Firing, UnixTime)> {
        let f = *self.firings.get(self.next_firing)?;
        self.next_firing += 1;
        Some((f, self.base() + firing_offset(f)))
    }

    /// The user whose notice poll of the loaded second is next, if it is due at `now`.
    pub(super) fn poll_due(&mut self, now: UnixTime) -> Option<usize> {
        let &(offset_us, i) = self.polls.get(self.next_poll)?;
        (self.base() + Duration::from_micros(offset_us) <= now).then(|| {
            self.next_poll += 1;
            i
        })
    }

    /// The user whose notice poll of the loaded second is next, due or not.
    pub(super) fn poll_left(&mut self) -> Option<usize> {
        let &(_, i) = self.polls.get(self.next_poll)?;
        self.next_poll += 1;
        Some(i)
    }

    /// How long the loop may wait at `now`: until the next firing, notice poll or the
    /// second's end (before the first second: the epoch), at most a turn.
    pub(super) fn timeout(&self, now: UnixTime) -> Duration {
        let next = if !self.loaded {
            self.epoch
        } else {
            let firing = self
                .firings
                .get(self.next_firing)
                .map(|&f| firing_offset(f));
            let poll = self
                .polls
                .get(self.next_poll)
                .map(|p| Duration::from_micros(p.0));
            let offset = firing.into_iter().chain(poll).min();
            self.base() + offset.unwrap_or(Duration::from_secs(1))
        };
        next.since(now).min(TURN)
    }

    /// Whether connecting may begin at `now`.
    pub(super) fn connecting(&self, now: UnixTime) -> bool {
        now >= self.connect_from
    }

    /// User `i` connects again at `at`.
    pub(super) fn retry_at(&mut self, at: UnixTime, i: usize) {
        self.retry.push(Reverse((UnixMs::of(at), i as u32)));
    }

    /// A user whose back-off is over at `now`, the earliest first.
    pub(super) fn retry_due(&mut self, now: UnixTime) -> Option<usize> {
        match self.retry.peek() {
            Some(Reverse((at, _))) if *at <= UnixMs::of(now) => {
                self.retry.pop().map(|Reverse((_, i))| i as usize)
            }
            _ => None,
        }
    }

    /// Whether users are waiting out a back-off.
    pub(super) fn retrying(&self) -> bool {
        !self.retry.is_empty()
    }

    /// Whether connections are to be looked at for taking too long at `now` (at the first
    /// turn of each whole Unix second; once a second is plenty).
    pub(super) fn timeouts_due(&mut self, now: UnixTime) -> bool {
        if now < self.next_timeout_check {
            return false;
        }
        self.next_timeout_check = now + now.until_next_second();
        true
    }

    /// The loaded second's start.
    fn base(&self) -> UnixTime {
        self.epoch + Duration::from_secs(self.second)
    }
}

/// A firing's offset into its second, to the µs (its intended time, from which its
/// latency is measured, is on the µs).
fn firing_offset(f: Firing) -> Duration {
    Duration::from_micros(u64::from(f.offset_ns) / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH_MS: u64 = 1_000_000_000;

    fn at(ms_after_epoch: u64) -> UnixTime {
        UnixTime::from_millis(EPOCH_MS + ms_after_epoch)
    }

    fn firing(user_index: u64, offset_ms: u32) -> Firing {
        Firing {
            user_index,
            offset_ns: offset_ms * 1_000_000,
        }
    }

    fn table(now: UnixTime) -> Timers {
        Timers::new(at(0), at(0), now)
    }

    #[test]
    fn before_the_epoch_nothing_is_due_and_the_loop_waits_for_it() {
        let t = table(UnixTime::from_millis(EPOCH_MS - 4));
        assert_eq!(t.second(), 0);
        assert!(!t.loaded());
        assert_eq!(t.second_ended(UnixTime::from_millis(EPOCH_MS - 1)), None);
        assert_eq!(
            t.timeout(UnixTime::from_millis(EPOCH_MS - 4)),
            Duration::from_millis(4)
        );
        // Far from it, the loop still turns.
        assert_eq!(t.timeout(UnixTime::from_millis(EPOCH_MS - 500)), TURN);
        assert!(!t.connecting(UnixTime::from_millis(EPOCH_MS - 1)));
        assert!(t.connecting(at(0)));
        // At the epoch the first second is to be loaded.
        assert_eq!(t.second_ended(at(0)), Some(0));
    }

    #[test]
    fn firings_and_polls_fall_due_at_their_offsets_and_the_wait_is_the_nearest() {
        // Started 2.5 s after the epoch, in second 2.
        let mut t = table(at(2_500));
        assert_eq!(t.second(), 2);
        let (mut firings, mut polls) = t.spare();
        firings.extend([firing(7, 600), firing(8, 900)]);
        polls.push((700_000, 3));
        t.load(2, firings, polls);
        assert_eq!(t.second_ended(at(2_999)), None);
        let now = at(2_595);
        assert_eq!(t.firing_due(now), None);
        assert_eq!(t.timeout(now), Duration::from_millis(5));
        let now = at(2_600);
        assert_eq!(t.firing_due(now), Some((firing(7, 600), at(2_600))));
        assert_eq!(t.firing_due(now), None);
        assert_eq!(t.poll_due(now), None);
        // The poll at 700 ms is nearer than the firing at 900 ms, but a turn nearer yet.
        assert_eq!(t.timeout(now), TURN);
        assert_eq!(t.timeout(at(2_695)), Duration::from_millis(5));
        assert_eq!(t.poll_due(at(2_700)), Some(3));
        assert_eq!(t.timeout(at(2_895)), Duration::from_millis(5));
        assert_eq!(t.firing_due(at(2_900)), Some((firing(8, 900), at(2_900))));
        // Nothing left: the second's end.
        assert_eq!(t.timeout(at(2_995)), Duration::from_millis(5));
        assert_eq!(t.second_ended(at(3_000)), Some(3));
    }

    #[test]
    fn what_is_left_of_a_second_goes_out_with_its_intended_time() {
        let mut t = table(at(0));
        let (mut firings, mut polls) = t.spare();
        firings.extend([firing(1, 100), firing(2, 200)]);
        polls.push((500_000, 4));
        t.load(0, firings, polls);
        // A stall: the loop comes back in second 5.
        assert_eq!(t.second_ended(at(5_010)), Some(5));
        assert_eq!(t.firing_left(), Some((firing(1, 100), at(100))));
        assert_eq!(t.firing_left(), Some((firing(2, 200), at(200))));
        assert_eq!(t.firing_left(), None);
        assert_eq!(t.poll_left(), Some(4));
        assert_eq!(t.poll_left(), None);
        // The vectors come back empty for the next second.
        let (firings, polls) = t.spare();
        assert!(firings.is_empty() && polls.is_empty());
        t.load(1, vec![firing(1, 100)], Vec::new());
        assert_eq!(t.firing_left(), Some((firing(1, 100), at(1_100))));
    }

    #[test]
    fn a_moved_epoch_moves_the_schedule() {
        let mut t = table(at(1_200));
        t.load(1, vec![firing(1, 300)], Vec::new());
        assert_eq!(t.firing_due(at(1_299)), None);
        // This machine's clock found 50 ms ahead of the coordinator's: later here.
        t.set_epoch(at(50));
        assert_eq!(t.firing_due(at(1_300)), None);
        assert_eq!(t.firing_due(at(1_350)), Some((firing(1, 300), at(1_350))));
    }

    #[test]
    fn back_offs_end_in_order_to_the_millisecond() {
        let mut t = table(at(0));
        assert!(!t.retrying());
        t.retry_at(at(30), 2);
        t.retry_at(at(10), 5);
        t.retry_at(at(20) + Duration::from_micros(900), 1);
        assert!(t.retrying());
        assert_eq!(t.retry_due(at(9)), None);
        assert_eq!(t.retry_due(at(25)), Some(5));
        // Kept to the ms below: due within its millisecond.
        assert_eq!(t.retry_due(at(25)), Some(1));
        assert_eq!(t.retry_due(at(25)), None);
        assert_eq!(t.retry_due(at(30)), Some(2));
        assert!(!t.retrying());
    }

    #[test]
    fn connections_are_looked_at_once_each_whole_second() {
        let mut t = table(at(300));
        assert!(!t.timeouts_due(at(999)));
        assert!(t.timeouts_due(at(1_004)));
        assert!(!t.timeouts_due(at(1_015)), "once a second");
        // A turn that came late looks at once, then at the next whole second.
        assert!(t.timeouts_due(at(3_400)));
        assert!(!t.timeouts_due(at(3_999)));
        assert!(t.timeouts_due(at(4_000)));
    }

    #[test]
    fn a_time_kept_to_the_millisecond() {
        let t = UnixTime::from_micros(1_234_567);
        assert_eq!(UnixMs::of(t).time(), UnixTime::from_millis(1_234));
        assert_eq!(
            UnixMs::of(t).since(UnixMs::of(UnixTime::from_millis(1_000))),
            Duration::from_millis(234)
        );
        assert_eq!(UnixMs::default().since(UnixMs::of(t)), Duration::ZERO);
        assert_eq!(std::mem::size_of::<UnixMs>(), 8);
    }
}
