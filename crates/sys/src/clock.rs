//! Time as values with types. A process's loops schedule by `Uptime`, the time since
//! its `Clock` started (monotonic: it never steps back); what crosses processes — the
//! per-second reports, a request's arrival as the kernel stamped it, the load's shared
//! schedule — is `UnixTime`. The two are different types, so one cannot be passed for
//! the other, and a loop's logic takes `now` as a value (quinn-proto's way): it is read
//! once a turn and handed down, and tests run on a clock they move themselves.
//!
//! `UptimeSecs` is `Uptime` in whole seconds, four bytes, for records kept per
//! connection (a million of them). Every helper that reads the wall clock is here, once.

use std::ops::{Add, AddAssign, Sub};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Time since a process's `Clock` started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uptime(Duration);

/// `Uptime` in whole seconds: what a connection record keeps of a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UptimeSecs(pub u32);

/// Time since the Unix epoch (wall-clock time: it may step when the clock is set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixTime(Duration);

impl Uptime {
    pub const ZERO: Uptime = Uptime(Duration::ZERO);

    pub const fn from_duration(d: Duration) -> Uptime {
        Uptime(d)
    }

    pub const fn from_millis(ms: u64) -> Uptime {
        Uptime(Duration::from_millis(ms))
    }

    pub const fn from_secs(secs: u64) -> Uptime {
        Uptime(Duration::from_secs(secs))
    }

    /// Since the clock started.
    pub const fn as_duration(self) -> Duration {
        self.0
    }

    pub fn as_micros(self) -> u64 {
        self.0.as_micros() as u64
    }

    /// The whole seconds (a process up for 136 years wraps).
    pub fn secs(self) -> UptimeSecs {
        UptimeSecs(self.0.as_secs() as u32)
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: Uptime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Uptime {
    type Output = Uptime;
    fn add(self, d: Duration) -> Uptime {
        Uptime(self.0 + d)
    }
}

impl AddAssign<Duration> for Uptime {
    fn add_assign(&mut self, d: Duration) {
        self.0 += d;
    }
}

impl Sub<Duration> for Uptime {
    type Output = Uptime;
    /// Saturates at the clock's start.
    fn sub(self, d: Duration) -> Uptime {
        Uptime(self.0.saturating_sub(d))
    }
}

impl UptimeSecs {
    /// Whole seconds from `earlier` to this (zero if it is not after it).
    pub fn since(self, earlier: UptimeSecs) -> u32 {
        self.0.saturating_sub(earlier.0)
    }

    /// `secs` seconds later.
    pub fn after(self, secs: u32) -> UptimeSecs {
        UptimeSecs(self.0.saturating_add(secs))
    }
}

impl UnixTime {
    /// Reads the wall clock.
    pub fn now() -> UnixTime {
        UnixTime(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
        )
    }

    pub const fn from_duration(d: Duration) -> UnixTime {
        UnixTime(d)
    }

    pub const fn from_millis(ms: u64) -> UnixTime {
        UnixTime(Duration::from_millis(ms))
    }

    pub const fn from_micros(us: u64) -> UnixTime {
        UnixTime(Duration::from_micros(us))
    }

    pub const fn as_duration(self) -> Duration {
        self.0
    }

    pub fn as_millis(self) -> u64 {
        self.0.as_millis() as u64
    }

    pub fn as_micros(self) -> u64 {
        self.0.as_micros() as u64
    }

    /// The Unix second this falls in.
    pub fn second(self) -> u64 {
        self.0.as_secs()
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: UnixTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// How long from this to the next whole Unix second (a whole second when this is one).
    pub fn until_next_second(self) -> Duration {
        Duration::from_secs(1) - Duration::from_nanos(self.0.subsec_nanos().into())
    }
}

impl Add<Duration> for UnixTime {
    type Output = UnixTime;
    fn add(self, d: Duration) -> UnixTime {
        UnixTime(self.0 + d)
    }
}

/// The wall clock in milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    UnixTime::now().as_millis()
}

/// Unix milliseconds as a UTC date and time an operator reads (`2026-12-02 01:23:45 UTC`):
/// the civil calendar from the day count (Howard Hinnant's `civil_from_days`).
pub fn utc_text(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The wall clock in microseconds since the Unix epoch.
pub fn unix_us() -> u64 {
    UnixTime::now().as_micros()
}

/// A process's clock: when it started (monotonic), and the Unix time then, so that a
/// time read once converts to the other kind without a second reading. `resync` follows
/// the wall clock if it is set meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    started: Instant,
    unix_at_start: Duration,
}

impl Clock {
    pub fn start() -> Clock {
        let started = Instant::now();
        Clock {
            started,
            unix_at_start: UnixTime::now().0,
        }
    }

    /// Reads the clock (~0.1 µs on a VM: read once a turn, not once a request).
    pub fn now(&self) -> Uptime {
        Uptime(self.started.elapsed())
    }

    /// The Unix time at `at`, without reading the clock.
    pub fn unix(&self, at: Uptime) -> UnixTime {
        UnixTime(self.unix_at_start + at.0)
    }

    /// The instant of `at`, for what takes an `Instant` (a poll's timeout is a duration).
    pub fn instant(&self, at: Uptime) -> Instant {
        self.started + at.0
    }

    /// Sets the Unix time at start again from the wall clock now; returns that Unix time.
    pub fn resync(&mut self) -> UnixTime {
        let unix = UnixTime::now();
        self.unix_at_start = unix.0.saturating_sub(self.started.elapsed());
        unix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_second_is_never_now_and_never_more_than_a_second_away() {
        let at = |ms| UnixTime::from_millis(ms).until_next_second();
        assert_eq!(at(1_000_000_250), Duration::from_millis(750));
        assert_eq!(at(1_000_000_999), Duration::from_millis(1));
        assert_eq!(at(1_000_000_000), Duration::from_secs(1));
    }

    #[test]
    fn uptime_arithmetic_saturates_and_rounds_down_to_seconds() {
        let t = Uptime::from_millis(2_900);
        assert_eq!(t.secs(), UptimeSecs(2));
        assert_eq!((t - Duration::from_secs(5)), Uptime::ZERO);
        assert_eq!(Uptime::ZERO.since(t), Duration::ZERO);
        assert_eq!(t.since(Uptime::from_secs(1)), Duration::from_millis(1_900));
        assert_eq!(UptimeSecs(3).since(UptimeSecs(5)), 0);
        assert_eq!(UptimeSecs(u32::MAX).after(2), UptimeSecs(u32::MAX));
    }

    #[test]
    fn a_clock_converts_without_reading_again() {
        let clock = Clock::start();
        let at = Uptime::from_secs(10);
        assert_eq!(
            clock.unix(at).since(clock.unix(Uptime::ZERO)),
            Duration::from_secs(10)
        );
        assert_eq!(
            clock.instant(at) - clock.instant(Uptime::ZERO),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn utc_text_reads_as_the_calendar() {
        assert_eq!(utc_text(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_text(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_text(1_795_293_847_606), "2026-11-21 20:44:07 UTC");
    }
}
