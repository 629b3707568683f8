//! Limits per user: one bot must not take what a crowd shares.
//!
//! Each user has a bucket per action that holds up to `burst` actions and refills at
//! `per_sec`; an action takes one (a send takes one of its sender's notices for each
//! recipient), or is refused `rate-limited` with the wait until there is one. Each bucket
//! is kept as the generic cell rate algorithm keeps it — one number, the time at which it
//! would be full again (its "theoretical arrival time") — so a bucket is eight bytes, and
//! a shake's, kept on its connection, four.
//!
//! Where each is counted: a shake in the gateway worker (on the session's connection; a
//! user has one session per host, a new one replacing the old), a send, an open, a chat, a
//! send's notices and a login in the core, which sees them all (`Users`). A login's bucket
//! is what keeps a bot from refilling its shake bucket by reconnecting. In cluster mode
//! each host counts its own users' (a user is on one host at a time).

use std::collections::HashMap;

use hongbao_money::UserId;
use serde::{Deserialize, Serialize};

/// `per_sec` actions a second on average, `burst` at once; `per_sec` 0: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub per_sec: f64,
    pub burst: u32,
}

impl Rate {
    pub const UNLIMITED: Rate = Rate {
        per_sec: 0.0,
        burst: 0,
    };

    pub fn is_unlimited(&self) -> bool {
        self.per_sec <= 0.0
    }

    /// Microseconds between two actions at the rate.
    fn interval_us(&self) -> f64 {
        1e6 / self.per_sec
    }

    /// How far ahead of now a bucket's time can be: its whole burst.
    fn span_us(&self) -> u64 {
        (self.interval_us() * f64::from(self.burst.max(1))).ceil() as u64
    }

    /// Takes `cost` actions at `now` (µs) from the bucket full again at `tat`: its new
    /// time, or the wait (ms, at least 1) until they would be allowed. A cost over the
    /// burst is never allowed: its wait is `u32::MAX`.
    pub fn take(&self, tat: u64, now: u64, cost: u32) -> Result<u64, u32> {
        if self.is_unlimited() {
            return Ok(tat);
        }
        if cost > self.burst.max(1) {
            return Err(u32::MAX);
        }
        let next = tat.max(now) + (self.interval_us() * f64::from(cost)).ceil() as u64;
        let over = next.saturating_sub(now).saturating_sub(self.span_us());
        if over == 0 {
            Ok(next)
        } else {
            Err(over.div_ceil(1000).clamp(1, u64::from(u32::MAX)) as u32)
        }
    }

    /// `take` of one action for a bucket kept in four bytes: its time as milliseconds of
    /// some clock, modulo 2^32 (49 days). A time further ahead than a bucket can be is one
    /// from long ago, wrapped: the bucket is full.
    pub fn take_compact(&self, tat: u32, now_ms: u64) -> Result<u32, u32> {
        let ahead = u64::from(tat.wrapping_sub(now_ms as u32));
        let ahead = if ahead * 1000 > self.span_us() + 1000 {
            0
        } else {
            ahead
        };
        let tat_us = (now_ms + ahead) * 1000;
        self.take(tat_us, now_ms * 1000, 1)
            .map(|t| t.div_ceil(1000) as u32)
    }
}

/// The limits of `[user_limits]`; the defaults are what a person never meets and a bot
/// does (docs/security.md, Limits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserLimits {
    /// A person shakes a phone a few times a second at most.
    pub shake: Rate,
    /// Sends: a person sends a packet every few seconds at the busiest.
    pub send: Rate,
    /// Opens: a group's packets arrive together and are opened together.
    pub open: Rate,
    pub chat: Rate,
    /// Notices one sender's sends may cause a minute (a send to N users causes N): a
    /// 1-cent send must not notify the world. 0: no limit.
    pub notices_per_minute: u32,
    /// Logins (each new session) of one user: what keeps a bot from refilling its shake
    /// bucket by reconnecting.
    pub login: Rate,
}

impl Default for UserLimits {
    fn default() -> UserLimits {
        UserLimits {
            shake: Rate {
                per_sec: 10.0,
                burst: 20,
            },
            send: Rate {
                per_sec: 1.0,
                burst: 10,
            },
            open: Rate {
                per_sec: 10.0,
                burst: 50,
            },
            chat: Rate {
                per_sec: 5.0,
                burst: 20,
            },
            notices_per_minute: 2000,
            login: Rate {
                per_sec: 1.0 / 6.0,
                burst: 10,
            },
        }
    }
}

impl UserLimits {
    /// No limits at all (a load test of the server's own capacity).
    pub fn none() -> UserLimits {
        UserLimits {
            shake: Rate::UNLIMITED,
            send: Rate::UNLIMITED,
            open: Rate::UNLIMITED,
            chat: Rate::UNLIMITED,
            notices_per_minute: 0,
            login: Rate::UNLIMITED,
        }
    }

    fn notices(&self) -> Rate {
        match self.notices_per_minute {
            0 => Rate::UNLIMITED,
            n => Rate {
                per_sec: f64::from(n) / 60.0,
                burst: n,
            },
        }
    }
}

/// What the core counts per user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Send { recipients: u32 },
    Open,
    Chat,
    Login,
}

impl Action {
    /// Its label in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Action::Send { .. } => "send",
            Action::Open => "open",
            Action::Chat => "chat",
            Action::Login => "login",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Buckets {
    send: u64,
    open: u64,
    chat: u64,
    notices: u64,
    login: u64,
}

impl Buckets {
    fn latest(&self) -> u64 {
        self.send
            .max(self.open)
            .max(self.chat)
            .max(self.notices)
            .max(self.login)
    }
}

/// The core's buckets: users who acted lately (a user whose every bucket is full again
/// is forgotten by `forget_full`).
pub struct Users {
    limits: UserLimits,
    buckets: HashMap<UserId, Buckets>,
    /// Actions refused, by action (`Action::name`).
    pub refused: std::collections::BTreeMap<&'static str, u64>,
}

/// Why an action was refused: the wait, and a sentence for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub retry_after_ms: u32,
    pub text: String,
}

impl Users {
    pub fn new(limits: UserLimits) -> Users {
        Users {
            limits,
            buckets: HashMap::new(),
            refused: Default::default(),
        }
    }

    /// New limits (a reload): the buckets so far are kept.
    pub fn set_limits(&mut self, limits: UserLimits) {
        self.limits = limits;
    }

    /// `user` does `action` at `now` (µs): allowed (and counted), or refused with the
    /// wait.
    pub fn take(&mut self, user: UserId, action: Action, now: u64) -> Result<(), Refused> {
        let taken = self.try_take(user, action, now);
        if taken.is_err() {
            *self.refused.entry(action.name()).or_default() += 1;
        }
        taken
    }

    fn try_take(&mut self, user: UserId, action: Action, now: u64) -> Result<(), Refused> {
        let limits = &self.limits;
        let b = self.buckets.entry(user).or_default();
        let refused = |wait: u32, what: &str| Refused {
            retry_after_ms: wait,
            text: format!("over this user's limit of {what}: try again in {wait} ms"),
        };
        match action {
            Action::Send { recipients } => {
                let send = limits
                    .send
                    .take(b.send, now, 1)
                    .map_err(|w| refused(w, "sends"))?;
                let notices = limits
                    .notices()
                    .take(b.notices, now, recipients)
                    .map_err(|w| refused(w, "notices a minute"))?;
                b.send = send;
                b.notices = notices;
            }
            Action::Open => {
                b.open = limits
                    .open
                    .take(b.open, now, 1)
                    .map_err(|w| refused(w, "opens"))?;
            }
            Action::Chat => {
                b.chat = limits
                    .chat
                    .take(b.chat, now, 1)
                    .map_err(|w| refused(w, "chats"))?;
            }
            Action::Login => {
                b.login = limits
                    .login
                    .take(b.login, now, 1)
                    .map_err(|w| refused(w, "logins"))?;
            }
        }
        Ok(())
    }

    /// Forgets the users whose buckets are all full again at `now` (µs).
    pub fn forget_full(&mut self, now: u64) {
        self.buckets.retain(|_, b| b.latest() > now);
        // A storm's logins, forgotten: their room let go too (a map never shrinks by
        // itself, and a million sessions would keep the storm's peak for good).
        if self.buckets.capacity() > 4 * self.buckets.len().max(1024) {
            self.buckets.shrink_to(2 * self.buckets.len());
        }
    }

    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let rate = Rate {
            per_sec: 10.0,
            burst: 20,
        };
        let mut tat = 0;
        let now = 1000 * S;
        for i in 0..20 {
            tat = rate
                .take(tat, now, 1)
                .unwrap_or_else(|w| panic!("action {i}: {w}"));
        }
        // The 21st waits a tenth of a second.
        assert_eq!(rate.take(tat, now, 1), Err(100));
        assert_eq!(rate.take(tat, now + S / 20, 1), Err(50));
        tat = rate.take(tat, now + S / 10, 1).unwrap();
        // Ten a second from then on, evenly.
        let mut allowed = 0;
        for ms in (110..=10_100).step_by(10) {
            if let Ok(t) = rate.take(tat, now + ms * 1000, 1) {
                tat = t;
                allowed += 1;
            }
        }
        assert_eq!(allowed, 100, "ten a second over ten seconds");
        // Idle long enough, it is full again.
        let later = now + 100 * S;
        for _ in 0..20 {
            tat = rate.take(tat, later, 1).unwrap();
        }
        assert!(rate.take(tat, later, 1).is_err());
        assert_eq!(Rate::UNLIMITED.take(5, 0, 1_000_000), Ok(5));
    }

    #[test]
    fn a_cost_takes_that_many_and_over_the_burst_never() {
        let notices = UserLimits::default().notices();
        let now = 50 * S;
        let tat = notices.take(0, now, 1000).unwrap();
        let tat = notices.take(tat, now, 1000).unwrap();
        // 2000 a minute: the next thousand in half a minute.
        assert_eq!(notices.take(tat, now, 1000), Err(30_000));
        assert_eq!(notices.take(0, now, 2001), Err(u32::MAX));
    }

    #[test]
    fn a_compact_bucket_survives_its_clock_wrapping() {
        let rate = Rate {
            per_sec: 10.0,
            burst: 2,
        };
        let near_wrap = u64::from(u32::MAX) - 50;
        let tat = rate.take_compact(near_wrap as u32, near_wrap).unwrap();
        let tat = rate.take_compact(tat, near_wrap).unwrap();
        // Across the wrap, the bucket is still as empty as it was.
        assert_eq!(rate.take_compact(tat, near_wrap + 60), Err(40));
        assert!(rate.take_compact(tat, near_wrap + 160).is_ok());
        // A time from long ago reads as a full bucket.
        assert!(rate.take_compact(tat, near_wrap + 3_000_000_000).is_ok());
    }

    #[test]
    fn the_core_counts_each_action_and_forgets_the_quiet() {
        let mut users = Users::new(UserLimits::default());
        let alice = UserId::new(1).unwrap();
        let bob = UserId::new(2).unwrap();
        let now = 7 * S;
        for _ in 0..10 {
            users
                .take(alice, Action::Send { recipients: 3 }, now)
                .unwrap();
        }
        let over = users
            .take(alice, Action::Send { recipients: 3 }, now)
            .unwrap_err();
        assert_eq!(over.retry_after_ms, 1000);
        assert!(over.text.contains("sends"), "{}", over.text);
        // Bob's buckets are his own; an open is not a send.
        users
            .take(bob, Action::Send { recipients: 3 }, now)
            .unwrap();
        users.take(alice, Action::Open, now).unwrap();
        for _ in 0..10 {
            users.take(bob, Action::Login, now).unwrap();
        }
        assert!(users.take(bob, Action::Login, now).is_err());
        users.forget_full(now + 10 * S);
        assert_eq!(
            users.tracked(),
            1,
            "bob's logins take a minute to come back"
        );
        users.forget_full(now + 61 * S);
        assert_eq!(users.tracked(), 0);
    }
}
