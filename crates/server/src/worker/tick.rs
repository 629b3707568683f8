//! Once a second, just after each whole wall-clock second: the worker's report to the
//! supervisor (counters, levels, shake latency), accepts resumed after a pause, claims
//! never answered forgotten, and the connections whose deadline came (`timers.rs`):
//! closed, kicked, or filed again under the deadline their state gives now.

use std::os::fd::AsRawFd;
use std::time::Duration;

use hongbao_money::{ConnId, Push};
use hongbao_proto::KickReason;
use hongbao_sys::clock::{UnixTime, UptimeSecs};
use hongbao_sys::{net, usage};

use super::codec::Idle;
use super::conn::{conn_id, Conn, Phase, CLOSING_GRACE_SECS};
use super::Worker;
use crate::link::ToSupervisor;

/// A claim unanswered this long is forgotten (its connection closed).
pub(super) const CLAIM_FORGET: Duration = Duration::from_secs(30);

/// What a connection's deadlines say when it is visited.
#[derive(Debug, PartialEq, Eq)]
enum Visit {
    /// Nothing is due: visit it again in this second.
    Again(UptimeSecs),
    /// No deadline applies (a logged-in session with no idle timeout).
    Never,
    /// Past its deadline: close it (a kicked or half-closed connection).
    Close,
    /// Its TLS handshake took longer than `tls_handshake_timeout_secs`: close it.
    HandshakeTimedOut,
    /// Past its deadline: kick it, saying why.
    Kick(KickReason, &'static str),
    /// Its session's token ends soon: ask for a fresh one.
    Refresh,
}

impl Worker {
    /// The once-a-second turn at Unix time `unix`; the loop also runs it once more on the
    /// way out, so the counts of a partial last second are reported.
    pub(super) fn tick(&mut self, unix: UnixTime) {
        if self.listeners.resume() {
            self.accept_all();
        }
        self.visit_due();
        self.sessions.forget_old_revocations(unix);
        self.stats.unix_second = unix.second();
        self.stats.levels.connections = self.conns.len() as u64;
        self.stats.levels.pool_packets = self.shakes.pooled() as u64;
        self.stats.levels.shake_cap = self.shakes.cap_per_sec().into();
        self.size_accept_queues();
        self.stats.levels.tls_handshaking = self.handshaking().into();
        let (rss, cpu) = usage::self_usage();
        self.stats.levels.rss_bytes = rss;
        self.stats.cpu_ms = cpu;
        self.stats.shake_latency_us = hongbao_telemetry::sample::sparse(&self.latency);
        self.latency.reset();
        // A claim whose connection went away is never answered.
        self.shakes.forget_claims(self.time.polled, CLAIM_FORGET);
        self.shakes.forget_full_bearers(self.time.polled);
        let stats = ToSupervisor::Stats(Box::new(self.stats.clone()));
        self.tell_supervisor(&stats);
    }

    /// When a new connection is first visited: at its login deadline (a session), or in a
    /// second (HTTP: its request's and keep-alive deadlines are looked at every second,
    /// as its codec moves them).
    pub(super) fn first_visit(&self, http: bool, now: UptimeSecs) -> UptimeSecs {
        if http {
            now.after(1)
        } else {
            now.after(self.cfg.login_timeout_secs.max(1))
        }
    }

    /// Files connection `key` to be visited at once (next tick): its state changed in a
    /// way that brings a deadline (kicked, half-closed, an idle timeout set).
    pub(super) fn visit_soon(&mut self, key: usize) {
        if let Some(c) = self.conns.get(key) {
            let now = self.time.polled.secs();
            self.timers.file(now, conn_id(key, c.generation));
        }
    }

    /// Visits the connections whose second has come: each is closed, kicked, or filed
    /// again under the deadline its state gives now.
    fn visit_due(&mut self) {
        let now = self.time.polled.secs();
        let unix = self.time.clock.unix(self.time.polled).second();
        for id in self.timers.due(now) {
            let Some(key) = self.live(id) else {
                continue; // closed meanwhile; its slot may hold another
            };
            match self.visit(&self.conns[key], now, unix) {
                Visit::Again(at) => self.timers.file(at, id),
                Visit::Never => {}
                Visit::Close => self.close(key),
                Visit::HandshakeTimedOut => {
                    self.stats.counters.tls_handshake_timeouts += 1;
                    self.close(key);
                }
                Visit::Kick(reason, text) => {
                    let counters = &mut self.stats.counters;
                    match reason {
                        KickReason::Expired => counters.kicks_expired += 1,
                        _ => counters.kicks_idle += 1,
                    }
                    self.kick(key, reason, text);
                }
                Visit::Refresh => {
                    let conn = &mut self.conns[key];
                    conn.state.session.asked = true;
                    let ends = u64::from(conn.state.session.ends);
                    self.stats.counters.refresh_asked += 1;
                    let push = Push::Refresh {
                        expires_at_ms: ends * 1000,
                    };
                    self.push(key, &push);
                    self.timers.file(now.after(secs_until(unix, ends)), id);
                }
            }
        }
    }

    /// The connection `id` names, if it is still the one it named.
    fn live(&self, id: ConnId) -> Option<usize> {
        let key = id.key as usize;
        self.conns
            .get(key)
            .is_some_and(|c| c.generation == id.generation)
            .then_some(key)
    }

    /// What `c`'s deadlines say at `now`: a connection that never logged in, went silent,
    /// took too long with an HTTP request, or was kicked and lingers, is past its
    /// deadline; else, when to look again.
    fn visit(&self, c: &Conn, now: UptimeSecs, unix: u64) -> Visit {
        let cfg = &self.cfg;
        let quiet = now.since(c.last_seen);
        let past = |secs: u32| {
            if quiet >= secs {
                None
            } else {
                Some(Visit::Again(c.last_seen.after(secs)))
            }
        };
        match c.state.phase {
            Phase::Closing => return past(CLOSING_GRACE_SECS).unwrap_or(Visit::Close),
            // Answers owed to a half-closed client that never came.
            Phase::Draining => {
                return past(CLAIM_FORGET.as_secs() as u32).unwrap_or(Visit::Close);
            }
            Phase::Open => {}
        }
        // A request already waiting in the socket is not the client's delay but ours (a
        // starved worker during a connect storm): it will be read next turn.
        let unread = || net::has_input(c.stream.as_raw_fd());
        // Not decided this second: look again in the next.
        let next = Visit::Again(now.after(1));
        // A TLS handshake has a deadline of its own from the accept; the login's counts
        // from the handshake's end (`handshake_over`).
        if c.tls.as_ref().is_some_and(|t| t.admitting()) {
            return past(cfg.tls_handshake_timeout_secs).unwrap_or(Visit::HandshakeTimedOut);
        }
        match c.codec.idle() {
            // Counted from the connect: a request waiting unread may be ours to read,
            // but not for long.
            Idle::Session if c.state.user.is_none() => {
                let timeout = cfg.login_timeout_secs;
                match past(timeout) {
                    Some(again) => again,
                    None if quiet >= 2 * timeout || !unread() => {
                        Visit::Kick(KickReason::Idle, "no login")
                    }
                    None => next,
                }
            }
            Idle::Session => self.session_visit(c, now, unix),
            Idle::Http {
                request_since: Some(since),
                ..
            } => {
                if now.since(since) >= cfg.login_timeout_secs && !unread() {
                    Visit::Kick(KickReason::Idle, "request not complete in time")
                } else {
                    next
                }
            }
            Idle::Http {
                request_since: None,
                answers_due,
            } => {
                let keepalive = cfg.http_keepalive_secs;
                if !answers_due && keepalive > 0 && quiet >= keepalive {
                    Visit::Kick(KickReason::Idle, "idle")
                } else {
                    next
                }
            }
        }
    }

    /// A logged-in session's deadlines at `now` (Unix second `unix`): its token's end,
    /// the refresh asked for before it, and the idle timeout if any; none of them, never.
    fn session_visit(&self, c: &Conn, now: UptimeSecs, unix: u64) -> Visit {
        let mut next: Option<UptimeSecs> = None;
        let session = c.state.session;
        if session.ends != 0 {
            let ends = u64::from(session.ends);
            if unix >= ends {
                return Visit::Kick(KickReason::Expired, "the session's token expired");
            }
            let refresh_at = ends.saturating_sub(self.sessions.refresh_before_secs().into());
            if !session.asked && unix >= refresh_at {
                return Visit::Refresh;
            }
            let due = if session.asked { ends } else { refresh_at };
            next = Some(now.after(secs_until(unix, due)));
        }
        let idle = self.cfg.idle_timeout_secs;
        if idle > 0 {
            if now.since(c.last_seen) >= idle {
                return Visit::Kick(KickReason::Idle, "idle");
            }
            let at = c.last_seen.after(idle);
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        next.map_or(Visit::Never, Visit::Again)
    }
}

/// Whole seconds from Unix second `unix` to `at` (at least 1: a visit is never filed
/// for the second being visited).
fn secs_until(unix: u64, at: u64) -> u32 {
    at.saturating_sub(unix).clamp(1, u64::from(u32::MAX)) as u32
}
