//! An operator broadcast in a worker: encoded once per form a connection may read, then
//! written out a slice of connections per turn of the loop, so shakes wait at most a
//! slice's worth of writes — and paced (`Pacer`) while shakes are being served and they,
//! or the worker itself, wait longer than `broadcast_yield_ms`, so the shakes keep the CPU
//! they need, here and in every other process on the machine; but never so slowly that a
//! broadcast is not written out within `BROADCAST_DEADLINE` of reaching the worker.
//!
//! This file: the broadcasts in flight and their pacing (`Broadcasts`, `Pacer`), on the
//! worker's clock, so a test drives them with the times it chooses; the worker's writing
//! them out is `broadcast.rs`.

use std::collections::VecDeque;
use std::time::Duration;

use hongbao_sys::clock::Uptime;
use hongbao_sys::usage::CpuWait;

/// Connections a broadcast is written to per turn of the loop, between two reads of
/// every ready connection (`ready::read_batch`): a shake that comes during a broadcast
/// waits for about this many writes (~0.5 ms; 256 left a 60,000/s shake p99 at 17–19 ms
/// beside a broadcast every 5 s, on a machine that something else kept busy meanwhile,
/// where 64 gave 10: docs/BENCHMARKS.md).
const BROADCAST_SLICE: usize = 64;
/// A turn may also write what the deadlines' pace needs over this long, if that is more
/// than a slice: turns long with reads (a saturated worker reads up to 512 connections
/// before each slice) still keep the deadline.
const DEADLINE_TURN: Duration = PACE_WINDOW;
/// Connections written per turn once a broadcast is past its deadline (turns long with
/// reads wrote less than the deadline needed): it catches up four times as fast.
const LATE_SLICE: usize = 4 * BROADCAST_SLICE;
/// The pace is judged over windows this long.
const PACE_WINDOW: Duration = Duration::from_millis(10);
/// Broadcast writes per second a worker allows itself: at most (in effect unpaced)...
const PACE_MAX: f64 = 4_000_000.0;
/// ...and at least, however long shakes wait.
const PACE_MIN: f64 = 1_000.0;
/// A broadcast starts at most this fast and speeds up window by window, so its first
/// writes are no burst the shakes' signals would come too late to stop.
const PACE_START: f64 = 2_000.0;
/// After a window in which a shake waited too long the pace halves; after one in which
/// none did it grows by a tenth (doubling in about 70 ms).
const PACE_DOWN: f64 = 0.5;
const PACE_UP: f64 = 1.1;
/// However long shakes wait, a broadcast is written to every connection of this worker
/// within this long of reaching it: a person waits about a second for a message, and
/// broadcasts sent every few seconds must not queue behind one another.
const BROADCAST_DEADLINE: Duration = Duration::from_millis(800);

/// How fast a worker writes broadcasts out: a token bucket whose rate halves after every
/// window in which a shake waited in the kernel longer than the yield, or in which shakes
/// were read and the worker waited for a CPU more than the yield's share of the window
/// (the machine is saturated: the shakes wait somewhere, perhaps in their clients), and
/// grows after every other window. Judged all the time, not only while a broadcast is
/// being written, so a broadcast starts at the pace the shakes of the moment allow rather
/// than with a burst. With no shakes a broadcast goes as fast as the machine allows.
///
/// The pace never drops below `floor`: the rate that writes every queued broadcast by
/// its deadline (`BROADCAST_DEADLINE` after it reached the worker), set each turn by
/// [`deadline_floor`]. The shakes decide how fast; the deadline, how slow.
pub(super) struct Pacer {
    /// Writes per second allowed now.
    rate: f64,
    /// Writes per second the queued broadcasts' deadlines need now.
    floor: f64,
    tokens: f64,
    refilled: Uptime,
    window_start: Uptime,
    /// The longest a shake read in this window waited in the kernel.
    window_worst: Duration,
    /// Shakes read in this window.
    window_shakes: u32,
    /// The worker's wait for a CPU so far, when the window started.
    cpu_wait_at_start: Option<Duration>,
}

impl Pacer {
    pub(super) fn new(now: Uptime) -> Pacer {
        Pacer {
            rate: PACE_MAX,
            floor: 0.0,
            tokens: BROADCAST_SLICE as f64,
            refilled: now,
            window_start: now,
            window_worst: Duration::ZERO,
            window_shakes: 0,
            cpu_wait_at_start: None,
        }
    }

    /// A shake was read after waiting `waited` in the kernel.
    pub(super) fn shake_waited(&mut self, waited: Duration) {
        self.window_worst = self.window_worst.max(waited);
        // Never reset while pacing is off: it must not overflow.
        self.window_shakes = self.window_shakes.saturating_add(1);
    }

    /// Judges the window when it is over (call every turn of the loop): `cpu_wait` reads
    /// the worker's wait for a CPU so far, once per window.
    pub(super) fn judge(
        &mut self,
        now: Uptime,
        yield_after: Duration,
        cpu_wait: impl FnOnce() -> Option<Duration>,
    ) {
        let window = now.since(self.window_start);
        if window < PACE_WINDOW {
            return;
        }
        let cpu_wait = cpu_wait();
        // Waiting for a CPU more than yield_after per PACE_WINDOW of the window.
        let starved = match (self.cpu_wait_at_start, cpu_wait) {
            (Some(then), Some(now)) => {
                now.saturating_sub(then).as_secs_f64() * PACE_WINDOW.as_secs_f64()
                    > yield_after.as_secs_f64() * window.as_secs_f64()
            }
            _ => false,
        };
        let slow = self.window_worst > yield_after || (self.window_shakes > 0 && starved);
        self.rate = if slow {
            (self.rate * PACE_DOWN).max(PACE_MIN)
        } else {
            // A loop that slept through several windows found nothing wrong in any.
            let windows = (window.as_secs_f64() / PACE_WINDOW.as_secs_f64()).min(100.0);
            (self.rate * PACE_UP.powf(windows.floor())).min(PACE_MAX)
        };
        self.window_start = now;
        self.window_worst = Duration::ZERO;
        self.window_shakes = 0;
        self.cpu_wait_at_start = cpu_wait;
    }

    /// A broadcast starts with none under way.
    pub(super) fn start(&mut self, now: Uptime) {
        self.rate = self.rate.min(PACE_START);
        self.refilled = now;
        self.tokens = 1.0;
    }

    /// The least pace the queued broadcasts' deadlines need (`f64::INFINITY`: one is
    /// late, so no pace at all).
    pub(super) fn set_floor(&mut self, floor: f64) {
        self.floor = floor;
    }

    /// Writes per second allowed now: the shakes' pace, or the deadlines' if faster.
    fn pace(&self) -> f64 {
        self.rate.max(self.floor)
    }

    /// Connections that may be written to now (at most a slice, or what the deadlines
    /// need over `DEADLINE_TURN` if more, or a late slice once a broadcast is late);
    /// `yield_after` zero means never pace.
    pub(super) fn allowance(&mut self, now: Uptime, yield_after: Duration) -> usize {
        if self.floor.is_infinite() {
            return LATE_SLICE;
        }
        if yield_after.is_zero() {
            return BROADCAST_SLICE;
        }
        let elapsed = now.since(self.refilled).as_secs_f64();
        self.refilled = now;
        let most = (BROADCAST_SLICE as f64).max(self.floor * DEADLINE_TURN.as_secs_f64());
        self.tokens = (self.tokens + elapsed * self.pace()).min(most);
        self.tokens as usize
    }

    /// `n` connections were written to.
    pub(super) fn spent(&mut self, n: usize) {
        self.tokens = (self.tokens - n as f64).max(0.0);
    }

    /// How long until the next write is allowed (zero: now).
    pub(super) fn next_in(&self, yield_after: Duration) -> Duration {
        if yield_after.is_zero() || self.tokens >= 1.0 || self.floor.is_infinite() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - self.tokens) / self.pace())
    }

    /// Writes per second allowed now.
    #[cfg(test)]
    fn rate(&self) -> f64 {
        self.rate
    }
}

/// One broadcast being written out: its bytes, and the slots of the connection table
/// still to visit.
pub(super) struct BroadcastJob {
    /// The broadcast in each form, indexed by `Form as usize`.
    pub bytes: [Vec<u8>; 3],
    pub next_key: usize,
    pub end_key: usize,
    /// When it must be written out by (`BROADCAST_DEADLINE` after it came).
    deadline: Uptime,
}

/// The least writes per second that write every queued broadcast (oldest first, as
/// they are written; `(slots left, deadline)`) by its deadline: for each, all it and
/// those before it have left over the time to its deadline. `f64::INFINITY` when one
/// is already late.
pub(super) fn deadline_floor(now: Uptime, queued: impl Iterator<Item = (usize, Uptime)>) -> f64 {
    let mut left = 0usize;
    let mut floor = 0.0f64;
    for (slots, deadline) in queued {
        left += slots;
        let time = deadline.since(now).as_secs_f64();
        if time <= 0.0 {
            return f64::INFINITY;
        }
        floor = floor.max(left as f64 / time);
    }
    floor
}

/// The broadcasts a worker is writing out, oldest first, and how fast it may.
pub(super) struct Broadcasts {
    jobs: VecDeque<BroadcastJob>,
    pacer: Pacer,
    /// This worker's wait for a CPU, which paces broadcasts while shakes are served.
    cpu_wait: CpuWait,
}

impl Broadcasts {
    pub(super) fn new(now: Uptime) -> Broadcasts {
        Broadcasts {
            jobs: VecDeque::new(),
            pacer: Pacer::new(now),
            cpu_wait: CpuWait::open(),
        }
    }

    /// Whether a broadcast is being written.
    pub(super) fn under_way(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// A shake was read after waiting `waited` in the kernel: the pace judges by it.
    pub(super) fn shake_waited(&mut self, waited: Duration) {
        self.pacer.shake_waited(waited);
    }

    /// A broadcast came at `now`, `bytes` in each form, for the table's slots up to
    /// `end_key`: written out by `BROADCAST_DEADLINE`.
    pub(super) fn queue(&mut self, now: Uptime, bytes: [Vec<u8>; 3], end_key: usize) {
        if self.jobs.is_empty() {
            self.pacer.start(now);
        }
        self.jobs.push_back(BroadcastJob {
            bytes,
            next_key: 0,
            end_key,
            deadline: now + BROADCAST_DEADLINE,
        });
    }

    /// The pace judged at `now` (when shakes are served and `yield_after` is on), the
    /// oldest broadcast and how many slots it may visit this turn; none when there is
    /// none or the pace allows none now. Handed back with `visited`.
    pub(super) fn next_slice(
        &mut self,
        now: Uptime,
        yield_after: Duration,
    ) -> Option<(BroadcastJob, usize)> {
        if yield_after.is_zero() && self.jobs.is_empty() {
            return None;
        }
        if !yield_after.is_zero() {
            let cpu_wait = &self.cpu_wait;
            self.pacer.judge(now, yield_after, || cpu_wait.read());
        }
        if self.jobs.is_empty() {
            return None;
        }
        let queued = self
            .jobs
            .iter()
            .map(|j| (j.end_key - j.next_key, j.deadline));
        self.pacer.set_floor(deadline_floor(now, queued));
        let allowed = self.pacer.allowance(now, yield_after);
        if allowed == 0 {
            return None;
        }
        Some((self.jobs.pop_front()?, allowed))
    }

    /// The slice of `job` written, `visited` slots of it: the rest kept, oldest still.
    pub(super) fn visited(&mut self, job: BroadcastJob, visited: usize) {
        self.pacer.spent(visited);
        if job.next_key < job.end_key {
            self.jobs.push_front(job);
        }
    }

    /// How long the loop may sleep before the broadcast under way may write again.
    pub(super) fn wait(&self, yield_after: Duration) -> Option<Duration> {
        self.under_way().then(|| self.pacer.next_in(yield_after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YIELD: Duration = Duration::from_millis(5);

    /// Runs `windows` windows of 10 ms in which shakes waited `waited` (and the worker
    /// never waited for a CPU), writing what the pace allows; returns the rate after them.
    fn windows(pacer: &mut Pacer, at: &mut Uptime, windows: u32, waited: Duration) -> f64 {
        for _ in 0..windows {
            pacer.shake_waited(waited);
            *at += PACE_WINDOW;
            pacer.judge(*at, YIELD, || Some(Duration::ZERO));
            let allowed = pacer.allowance(*at, YIELD);
            pacer.spent(allowed);
        }
        pacer.rate()
    }

    #[test]
    fn unpaced_when_shakes_do_not_wait_or_the_yield_is_off() {
        let mut at = Uptime::from_secs(100);
        let mut pacer = Pacer::new(at);
        assert_eq!(windows(&mut pacer, &mut at, 20, YIELD), PACE_MAX);
        at += PACE_WINDOW;
        assert_eq!(pacer.allowance(at, YIELD), BROADCAST_SLICE);
        pacer.shake_waited(Duration::from_secs(1));
        at += PACE_WINDOW;
        pacer.judge(at, Duration::ZERO, || None);
        assert_eq!(pacer.allowance(at, Duration::ZERO), BROADCAST_SLICE);
        assert_eq!(pacer.next_in(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn halves_per_window_of_long_waits_down_to_the_least_then_recovers() {
        let mut at = Uptime::from_secs(100);
        let mut pacer = Pacer::new(at);
        let long = YIELD + Duration::from_millis(1);
        assert_eq!(windows(&mut pacer, &mut at, 1, long), PACE_MAX / 2.0);
        assert_eq!(windows(&mut pacer, &mut at, 2, long), PACE_MAX / 8.0);
        assert_eq!(windows(&mut pacer, &mut at, 40, long), PACE_MIN);
        // At the least pace a 10 ms window allows 10 writes, and the next is at most
        // 1 ms away (less the fraction of a write left over).
        at += PACE_WINDOW;
        assert_eq!(pacer.allowance(at, YIELD), 10);
        pacer.spent(10);
        let next = pacer.next_in(YIELD);
        assert!(
            next > Duration::ZERO && next <= Duration::from_millis(1),
            "{next:?}"
        );
        // Calm windows: a tenth more each (the 20 ms since the last judgement are two).
        let after = windows(&mut pacer, &mut at, 1, Duration::ZERO);
        assert!(
            (after - PACE_MIN * PACE_UP * PACE_UP).abs() < 1e-6,
            "{after}"
        );
        assert_eq!(windows(&mut pacer, &mut at, 200, Duration::ZERO), PACE_MAX);
    }

    #[test]
    fn a_quiet_stretch_between_turns_counts_as_that_many_calm_windows() {
        let mut at = Uptime::from_secs(100);
        let mut pacer = Pacer::new(at);
        windows(&mut pacer, &mut at, 40, Duration::from_secs(1));
        assert_eq!(pacer.rate(), PACE_MIN);
        // The loop slept 50 ms: five calm windows at once.
        at += PACE_WINDOW * 5;
        pacer.judge(at, YIELD, || Some(Duration::ZERO));
        let expected = PACE_MIN * PACE_UP.powi(5);
        assert!((pacer.rate() - expected).abs() < 1e-6, "{}", pacer.rate());
    }

    #[test]
    fn the_bucket_holds_at_most_a_slice() {
        let mut at = Uptime::from_secs(100);
        let mut pacer = Pacer::new(at);
        windows(&mut pacer, &mut at, 12, Duration::from_secs(1));
        at += Duration::from_secs(60);
        pacer.start(at);
        assert!(pacer.allowance(at, YIELD) <= BROADCAST_SLICE);
    }

    #[test]
    fn a_broadcast_starts_slow_and_speeds_up_while_calm() {
        let mut at = Uptime::from_secs(100);
        let mut pacer = Pacer::new(at);
        assert_eq!(pacer.rate(), PACE_MAX);
        pacer.start(at);
        assert_eq!(pacer.rate(), PACE_START);
        assert_eq!(pacer.allowance(at, YIELD), 1);
        let after = windows(&mut pacer, &mut at, 10, Duration::ZERO);
        assert!(
            (after - PACE_START * PACE_UP.powi(10)).abs() < 1e-6,
            "{after}"
        );
        // Slower than the start stays slower.
        windows(&mut pacer, &mut at, 40, Duration::from_secs(1));
        pacer.start(at);
        assert_eq!(pacer.rate(), PACE_MIN);
    }

    #[test]
    fn the_deadline_floor_covers_every_queued_broadcast() {
        let now = Uptime::from_secs(100);
        let ms = Duration::from_millis;
        assert_eq!(deadline_floor(now, std::iter::empty()), 0.0);
        // 8,000 left with 800 ms to go: 10,000 a second.
        assert_eq!(
            deadline_floor(now, [(8_000, now + ms(800))].into_iter()),
            10_000.0
        );
        // A second broadcast behind it with 1,600 ms: both 16,000 by then, also 10,000/s;
        // with only 1,000 ms it is the one that needs more.
        let two = |second| {
            deadline_floor(
                now,
                [(8_000, now + ms(800)), (8_000, now + second)].into_iter(),
            )
        };
        assert_eq!(two(ms(1_600)), 10_000.0);
        assert_eq!(two(ms(1_000)), 16_000.0);
        // One already late: no pace.
        assert!(deadline_floor(now, [(1, now)].into_iter()).is_infinite());
    }

    /// Writes a broadcast to 10,000 connections turn by turn, a turn every `turn`, while
    /// shakes wait a second all the time (the shakes' pace at its least), each turn no
    /// later than `late_by` past the deadline. Returns the pacer, when the last write
    /// was, the deadline and the most written in one turn.
    fn write_out_while_shakes_wait(
        turn: Duration,
        late_by: Duration,
    ) -> (Pacer, Uptime, Uptime, usize) {
        let mut at = Uptime::from_secs(100);
        let mut pacer = Pacer::new(at);
        windows(&mut pacer, &mut at, 40, Duration::from_secs(1));
        assert_eq!(pacer.rate(), PACE_MIN);
        pacer.start(at);
        let deadline = at + BROADCAST_DEADLINE;
        let mut left = 10_000usize;
        let mut most = 0;
        while left > 0 {
            at += turn;
            assert!(at <= deadline + late_by, "{left} left at the deadline");
            pacer.shake_waited(Duration::from_secs(1));
            pacer.judge(at, YIELD, || Some(Duration::ZERO));
            pacer.set_floor(deadline_floor(at, [(left, deadline)].into_iter()));
            let n = pacer.allowance(at, YIELD).min(left);
            most = most.max(n);
            pacer.spent(n);
            left -= n;
        }
        (pacer, at, deadline, most)
    }

    /// Shakes waiting long all the time hold the shakes' pace at its least, yet a
    /// broadcast to 10,000 connections is written out by its deadline, turn by turn.
    #[test]
    fn a_broadcast_meets_its_deadline_however_long_shakes_wait() {
        let (_, at, deadline, _) =
            write_out_while_shakes_wait(Duration::from_millis(1), PACE_WINDOW);
        // Done before the deadline, and not much before it: the shakes kept the rest.
        assert!(
            at + Duration::from_millis(100) >= deadline,
            "done {:?} early",
            deadline.since(at)
        );
    }

    /// Turns 10 ms long (a saturated worker reading up to 512 connections before each
    /// slice), shakes waiting long all the while, still write a 10,000-connection
    /// broadcast out by its deadline: a turn may write what the deadline's pace needs
    /// over 10 ms (a slice alone is 6,400 a second). Once late, four slices a turn, paced
    /// or not.
    #[test]
    fn long_turns_keep_the_deadline_and_a_late_broadcast_writes_four_slices() {
        let (mut pacer, at, _, most) = write_out_while_shakes_wait(PACE_WINDOW, Duration::ZERO);
        assert!(
            most > BROADCAST_SLICE && most < 2 * BROADCAST_SLICE + 10,
            "{most}"
        );
        pacer.set_floor(f64::INFINITY);
        assert_eq!(pacer.allowance(at, YIELD), LATE_SLICE);
        assert_eq!(pacer.allowance(at, Duration::ZERO), LATE_SLICE);
        pacer.set_floor(0.0);
        assert_eq!(pacer.allowance(at, Duration::ZERO), BROADCAST_SLICE);
    }

    #[test]
    fn waiting_for_a_cpu_slows_it_only_while_shakes_are_served() {
        let mut at = Uptime::from_secs(100);
        let mut pacer = Pacer::new(at);
        let mut cpu_wait = Duration::ZERO;
        pacer.judge(at + PACE_WINDOW, YIELD, || Some(cpu_wait));
        at += PACE_WINDOW;
        // The machine saturated by the broadcast alone: no shakes, full speed.
        for _ in 0..5 {
            cpu_wait += YIELD * 2;
            at += PACE_WINDOW;
            pacer.judge(at, YIELD, || Some(cpu_wait));
        }
        assert_eq!(pacer.rate(), PACE_MAX);
        // Shakes read promptly, but the worker waited for a CPU longer than the yield.
        for _ in 0..3 {
            pacer.shake_waited(Duration::ZERO);
            cpu_wait += YIELD * 2;
            at += PACE_WINDOW;
            pacer.judge(at, YIELD, || Some(cpu_wait));
        }
        assert_eq!(pacer.rate(), PACE_MAX / 8.0);
        // A wait no longer than the yield is not starving.
        pacer.shake_waited(Duration::ZERO);
        cpu_wait += YIELD;
        at += PACE_WINDOW;
        pacer.judge(at, YIELD, || Some(cpu_wait));
        assert!((pacer.rate() - PACE_MAX / 8.0 * PACE_UP).abs() < 1e-6);
        // Over a window twice as long, the same wait is half the share.
        pacer.shake_waited(Duration::ZERO);
        cpu_wait += YIELD * 2;
        at += PACE_WINDOW * 2;
        pacer.judge(at, YIELD, || Some(cpu_wait));
        assert!(pacer.rate() > PACE_MAX / 8.0 * PACE_UP);
    }
}
