//! Once a second, just after each whole wall-clock second: the worker's report to the
//! supervisor (counters, levels, shake latency), accepts resumed after a pause, claims
//! never answered forgotten, and the sweep that closes connections past their deadline.

use std::os::fd::AsRawFd;
use std::time::Duration;

use hongbao_proto::KickReason;
use hongbao_sys::{net, usage};

use super::codec::Idle;
use super::conn::{State, CLOSING_GRACE_SECS};
use super::{unix_now, Worker};
use crate::link::ToCore;

/// A claim unanswered this long is forgotten (its connection closed).
const CLAIM_FORGET_SECS: u64 = 30;

/// Time until 20 ms past the next whole Unix second.
pub(super) fn until_next_second() -> Duration {
    let into = unix_now().subsec_millis() as u64;
    Duration::from_millis((1000 - into) + 20)
}

impl Worker {
    /// The once-a-second turn; the loop also runs it once more on the way out, so the
    /// counts of a partial last second are reported.
    pub(super) fn tick(&mut self) {
        if self.accept_paused {
            self.accept_paused = false;
            for i in 0..self.listeners.len() {
                self.accept(i);
            }
        }
        self.sweep();
        let unix = unix_now();
        self.unix_at_start = unix.saturating_sub(self.started.elapsed());
        self.stats.unix_second = unix.as_secs();
        self.stats.levels.connections = self.conns.len() as u64;
        self.stats.levels.pool_packets = self.pool.len() as u64;
        self.stats.levels.shake_cap = self.cap.per_sec().into();
        let (rss, cpu) = usage::self_usage();
        self.stats.levels.rss_bytes = rss;
        self.stats.cpu_ms = cpu;
        self.stats.shake_latency_us = hongbao_telemetry::sample::sparse(&self.latency);
        self.latency.reset();
        // A claim whose connection went away is never answered.
        self.claims
            .retain(|_, read_at| read_at.elapsed() < Duration::from_secs(CLAIM_FORGET_SECS));
        let stats = ToCore::Stats(Box::new(self.stats.clone()));
        self.tell_core(&stats);
    }

    /// A logged-in session has no deadline while no idle timeout is set: the sweep need not
    /// look at it again (until it is kicked or its peer half-closes, which watch it anew).
    pub(super) fn unwatch_if_timeless(&mut self, key: usize) {
        let session = self
            .conns
            .get(key)
            .is_some_and(|c| c.user.is_some() && c.codec.idle() == Idle::Session);
        if session && self.cfg.idle_timeout_secs == 0 {
            self.watched.remove(&key);
        }
    }

    /// Closes connections that never logged in, went silent, took too long with an HTTP
    /// request, or were kicked and linger. It looks only at the connections `watched`:
    /// every one from its accept, less the logged-in sessions while no idle timeout is
    /// set (`unwatch_if_timeless`) — at a million connections (56 workers) walking every
    /// one each second was about 1% of the server's CPU (docs/BENCHMARKS.md).
    fn sweep(&mut self) {
        let now = self.now_s();
        let login_timeout = self.cfg.login_timeout_secs;
        let idle_timeout = self.cfg.idle_timeout_secs;
        let keepalive = self.cfg.http_keepalive_secs;
        let mut expired = Vec::new();
        for &key in &self.watched {
            let Some(c) = self.conns.get(key) else {
                continue;
            };
            let quiet = now.saturating_sub(c.last_seen);
            if c.state == State::Closing {
                if quiet >= CLOSING_GRACE_SECS {
                    expired.push((key, None));
                }
                continue;
            }
            if c.state == State::Draining {
                // Answers owed to a half-closed client that never came.
                if quiet as u64 >= CLAIM_FORGET_SECS {
                    expired.push((key, None));
                }
                continue;
            }
            // A request already waiting in the socket is not the client's delay but ours
            // (a starved worker during a connect storm): it will be read next turn.
            let unread = || net::has_input(c.stream.as_raw_fd());
            let why = match c.codec.idle() {
                // Counted from the connect: a request waiting unread may be ours to read,
                // but not for long.
                Idle::Session if c.user.is_none() => (quiet >= login_timeout
                    && (quiet >= 2 * login_timeout || !unread()))
                .then_some("no login"),
                Idle::Session => (idle_timeout > 0 && quiet >= idle_timeout).then_some("idle"),
                Idle::Http {
                    request_since: Some(since),
                    ..
                } => (now.saturating_sub(since) >= login_timeout && !unread())
                    .then_some("request not complete in time"),
                Idle::Http {
                    request_since: None,
                    answers_due,
                } => (!answers_due && keepalive > 0 && quiet >= keepalive).then_some("idle"),
            };
            if let Some(why) = why {
                expired.push((key, Some(why)));
            }
        }
        for (key, why) in expired {
            match why {
                Some(text) => {
                    self.stats.counters.kicks_idle += 1;
                    self.kick(key, KickReason::Idle, text);
                }
                None => self.close(key),
            }
        }
    }
}
