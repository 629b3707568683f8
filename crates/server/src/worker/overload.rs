//! A shake's way through overload, in one room: whether a shake read now is served or
//! answered `overloaded`, and the wait that answer asks of its client. Four rules, in the
//! order `Overload::gate` applies them:
//!
//! 1. **Late** (`max_queue_ms`): a shake that waited in the kernel past the limit means the
//!    machine is not keeping up: shed a share of those just past it, all of those past
//!    twice it, so that a queue just over the limit sheds what it must and not everything
//!    behind it — and the clients told `overloaded` back off, so what arrives comes down.
//! 2. **Back-off** (`Backoff`): every shake is counted by the wait rule, which sets how
//!    long a shed client is asked to stay away: a user's shake interval, doubled while
//!    shedding lasts and the queue does not shorten, drawn from an exponential around
//!    that mean so the shed users do not come back together.
//! 3. **Cap** (`Cap`, the `fifo` read order only): once a queue past the limit has
//!    drained, no more shakes a second than the worker was just seen to serve; what
//!    arrives above it is shed as it is read, so no second queue builds.
//! 4. **Rate** (`Admission`): this worker's share of the server's `max_shake_qps`, per
//!    wall-clock second.
//!
//! Beside the gate, but not in it: the order connections are read in under a standing
//! queue (`ready.rs`: newest first, which is why the adaptive order needs no cap), and
//! the broadcast pacer (`broadcast.rs`), which slows a broadcast while shakes wait.
//!
//! Every rule takes its time as a value (`UnixTime`: the per-second rules count
//! wall-clock seconds, alike in every worker; the waits are measured from the kernel's
//! receive stamps, also Unix time), so the tests run on a simulated clock.

use std::time::Duration;

use hongbao_sys::clock::UnixTime;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[cfg(test)]
mod tests;

/// What the gate needs to know of the server's settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Shakes that waited longer than this are late; zero: never.
    pub max_queue: Duration,
    /// This worker's share of `max_shake_qps`.
    pub per_sec: u32,
    /// The cap applies (the `fifo` read order).
    pub cap: bool,
}

/// A shake's fate at the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Admit,
    /// Answer `overloaded`, asking the client to wait `retry_after_ms`.
    Shed {
        why: Shed,
        retry_after_ms: u32,
    },
}

/// Which rule shed a shake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shed {
    Late,
    Capped,
    /// Over this worker's share of `max_shake_qps`.
    Rate,
}

/// A worker's overload state: the four rules' counters and the draws they make.
pub(super) struct Overload {
    admission: Admission,
    backoff: Backoff,
    cap: Cap,
    rng: SmallRng,
}

impl Default for Overload {
    fn default() -> Self {
        Overload {
            admission: Admission::default(),
            backoff: Backoff::default(),
            cap: Cap::default(),
            rng: SmallRng::from_entropy(),
        }
    }
}

impl Overload {
    /// The gate: a shake read at `now` after waiting `waited` in the kernel, among
    /// `users` logged-in users. Every rule counts it (the rules judge seconds and
    /// tenths by all that arrived); the first that refuses it sheds it.
    pub(super) fn gate(
        &mut self,
        now: UnixTime,
        waited: Duration,
        users: u64,
        limits: Limits,
    ) -> Verdict {
        let late = !limits.max_queue.is_zero() && self.late(waited, limits.max_queue);
        self.backoff.shake(now, waited, users);
        if limits.cap {
            self.cap.shake(now, waited, limits.max_queue);
        }
        let why = if late {
            Shed::Late
        } else if limits.cap && !self.cap.admit() {
            Shed::Capped
        } else if !self.admission.admit(now, limits.per_sec) {
            Shed::Rate
        } else {
            return Verdict::Admit;
        };
        Verdict::Shed {
            why,
            retry_after_ms: self.backoff.shed(&mut self.rng),
        }
    }

    /// Shakes the cap admits a second now; 0 when there is none.
    pub(super) fn cap_per_sec(&self) -> u32 {
        self.cap.per_sec()
    }

    /// Rule 1: whether a shake that waited `waited` is shed — none under `max`, all over
    /// twice it, and in between a share rising with the excess.
    fn late(&mut self, waited: Duration, max: Duration) -> bool {
        if waited <= max {
            return false;
        }
        let excess = (waited - max).as_secs_f64() / max.as_secs_f64();
        excess >= 1.0 || self.rng.gen::<f64>() < excess
    }
}

// ----- rule 2: the wait a shed client is asked for ------------------------------------

/// The wait an `overloaded` answer asks for, in this worker's trouble. The base is one
/// of a user's shake intervals (the worker's logged-in users over its shakes in the last
/// second), at least `BACKOFF_BASE_MS`: a shed user skips about one shake. It doubles for
/// every further second in a row with shedding in which the queue did not shorten (the
/// longest wait of a shake read is not below the second before's: what arrives is still
/// more than the worker serves), up to `BACKOFF_MAX_MS`, but not again before the users
/// told the last wait can have heard it: for as many whole seconds as that longest wait
/// (a queue of seconds delays the answers that make clients back off by as much, and
/// raising the wait every second meanwhile sent users away for far longer than the
/// overload needed). It holds while the queue drains, and comes back down one step for
/// every `BACKOFF_CALM_SECS` seconds without shedding. A moment's stall costs the
/// clients it sheds about a second; a lasting overload sends them away long enough that
/// what they offer comes down to what the worker serves; and the slow way down keeps the
/// wait long while the users it sent away come back, so the overload does not restart
/// in waves.
///
/// That wait is the mean: each shed shake is asked for a wait drawn from an exponential
/// distribution around it (at most `BACKOFF_MAX_MS`). Users shed in the same second then
/// come back spread over many of their intervals rather than within a few seconds of
/// each other, which is what made a lasting overload come in waves.
#[derive(Default)]
struct Backoff {
    second: u64,
    shakes: u32,
    shed: u32,
    level: u32,
    calm_secs: u32,
    /// The longest a shake of this second and of the one before waited (µs).
    queued_us: u64,
    queued_before_us: u64,
    /// A user's shake interval as the last whole second saw it (ms).
    interval_ms: u32,
    /// The wait is not raised again before this second.
    raised_until: u64,
}

const BACKOFF_BASE_MS: u32 = 1000;
const BACKOFF_MAX_MS: u32 = 64_000;
const BACKOFF_CALM_SECS: u32 = 5;

/// A second counts as shedding when at least 1 in this many of its shakes was shed.
const SHEDDING_ONE_IN: u32 = 100;

impl Backoff {
    /// Counts a shake read at `now` after waiting `queued` in the kernel, among `users`
    /// logged-in users, closing the seconds that have ended.
    fn shake(&mut self, now: UnixTime, queued: Duration, users: u64) {
        let second = now.second();
        if second != self.second {
            let shedding =
                self.shed > 0 && self.shed.saturating_mul(SHEDDING_ONE_IN) >= self.shakes;
            let draining = self.queued_us < self.queued_before_us;
            let queued_us = self.queued_us;
            let whole = second == self.second + 1;
            self.interval_ms = if whole && self.shakes > 0 {
                u32::try_from(users.saturating_mul(1000) / u64::from(self.shakes))
                    .unwrap_or(u32::MAX)
            } else {
                0
            };
            self.queued_before_us = if whole { self.queued_us } else { 0 };
            self.queued_us = 0;
            // Seconds with no shakes at all were calm.
            let idle = second.saturating_sub(self.second).saturating_sub(1);
            let idle = u32::try_from(idle).unwrap_or(u32::MAX);
            if shedding {
                if !draining && second >= self.raised_until {
                    self.level += 1;
                    self.raised_until = second + queued_us.div_ceil(1_000_000);
                }
                self.calm_secs = 0;
            } else {
                self.calm_secs = self.calm_secs.saturating_add(1);
            }
            self.calm_secs = self.calm_secs.saturating_add(idle);
            if self.calm_secs >= BACKOFF_CALM_SECS {
                self.level = self
                    .level
                    .saturating_sub(self.calm_secs / BACKOFF_CALM_SECS);
                self.calm_secs %= BACKOFF_CALM_SECS;
            }
            self.level = self.level.min(Self::max_level());
            self.second = second;
            self.shakes = 0;
            self.shed = 0;
        }
        self.shakes += 1;
        self.queued_us = self.queued_us.max(queued.as_micros() as u64);
    }

    /// Counts the shake just counted as shed; the wait to ask of its client (ms), drawn
    /// around `wait_ms`.
    fn shed(&mut self, rng: &mut SmallRng) -> u32 {
        self.shed += 1;
        let mean = f64::from(self.wait_ms());
        // 1 - u is in (0, 1]: the logarithm is finite.
        let u: f64 = rng.gen();
        let drawn = -mean * (1.0 - u).ln();
        (drawn as u32).clamp(1, BACKOFF_MAX_MS)
    }

    /// The mean wait to ask of a shed client (ms).
    fn wait_ms(&self) -> u32 {
        let base = self.interval_ms.clamp(BACKOFF_BASE_MS, BACKOFF_MAX_MS);
        base.saturating_mul(1 << self.level).min(BACKOFF_MAX_MS)
    }

    fn max_level() -> u32 {
        (BACKOFF_MAX_MS / BACKOFF_BASE_MS).ilog2()
    }
}

// ----- rule 3: the shake cap -------------------------------------------------------

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

/// The shake cap: once a queue of shakes past `max_queue_ms` has drained, a worker admits
/// no more shakes a second than it was just seen to serve, and answers the rest
/// `overloaded` at once, as they are read. Only in the `fifo` read order (`ready_order`):
/// the adaptive order reads the newest connections first instead (ready.rs), and against
/// clients that ignore the back-off hint a cap held workers at their least for good.
///
/// Shedding only what has waited too long acts on the queue's length, and the users it
/// sends away act on what arrives only once they have heard it and stayed away: one
/// integral behind another. The served rate swung in waves of 15–25 s, and each wave
/// ended in seconds of a queue so long that nearly all of it was shed (docs/BENCHMARKS.md,
/// issue 16). The cap acts on the rate instead: what arrives above it is shed as it
/// arrives, so no queue builds and the shedding matches the excess second by second, and
/// what is served stays at the cap.
///
/// The cap follows the machine. A queue past the limit is first shed as late (a share
/// of what waited past it, rule 1); once it has drained — a tenth of a second with no
/// shake waiting past half the limit — the worker caps its shakes at nine tenths of the
/// most it admitted in a tenth of a second over the last second (a rate it did serve, at
/// a moment it was behind). Then, each tenth of a second:
/// - the cap refused a shake and none waited past half the limit: it grows by a
///   hundredth (about a tenth a second) — or by a tenth, when none waited past a
///   twentieth of the limit: the worker reads as fast as shakes come, so the cap, not
///   the machine, is what holds it back (a cap cut while the machine was starved climbs
///   back in seconds, not minutes);
/// - a shake waited past half the limit after a tenth without such waits (a queue formed
///   under the cap): it is cut to nine tenths of the most admitted in a tenth since the
///   last cut. A queue that does not drain is the reading falling behind (the worker
///   starved of CPU), which a lower cap would not help: it is shed as late meanwhile;
/// - it refused nothing for `IDLE_TENTHS` tenths (30 s) in a row: it is dropped. The
///   overload is over, and a rise in shakes is admitted in full again. Not sooner: the
///   users sent away in the backlog come back over tens of seconds, and a cap dropped
///   meanwhile let them build a second backlog, shed as late, that sent them away again
///   (docs/BENCHMARKS.md); a cap kept refuses them as they come instead, and while the
///   worker keeps up it grows by a tenth a tenth, out of the way within a second or two.
#[derive(Default)]
struct Cap {
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
    fn shake(&mut self, now: UnixTime, waited: Duration, max: Duration) {
        self.now_us = now.as_micros();
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
    fn admit(&mut self) -> bool {
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
    fn per_sec(&self) -> u32 {
        self.per_sec as u32
    }
}

// ----- rule 4: the server's rate --------------------------------------------------

/// Shakes admitted per wall-clock second: this worker's share of `max_shake_qps`.
#[derive(Default)]
struct Admission {
    second: u64,
    used: u32,
}

impl Admission {
    /// Takes a place in this second if one is left.
    fn admit(&mut self, now: UnixTime, per_sec: u32) -> bool {
        if now.second() != self.second {
            self.second = now.second();
            self.used = 0;
        }
        if self.used >= per_sec {
            return false;
        }
        self.used += 1;
        true
    }
}
