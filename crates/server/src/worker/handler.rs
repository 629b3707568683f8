//! What a worker does with a request, whatever transport carried it: answers pings,
//! checks logins, admits shakes and answers losing ones from its own pool at memory
//! speed, and hands everything that moves money (a winning shake's claim, a send, an
//! open) or concerns other users (chat) to the supervisor.

use std::time::{Duration, Instant};

use hongbao_money::seam::Op;
use hongbao_money::{Reply, Request, UserId};
use hongbao_proto::{KickReason, ResultCode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::codec::Sent;
use super::conn::conn_id;
use super::wire::{Auth, Inbound};
use super::{unix_now, Worker};
use crate::config::ReadyOrder;
use crate::link::ToCore;

/// Shakes admitted per wall-clock second: this worker's share of `max_shake_qps`.
#[derive(Default)]
pub(super) struct Admission {
    second: u64,
    used: u32,
}

impl Admission {
    /// Takes a place in this second if one is left.
    fn admit(&mut self, now: Duration, per_sec: u32) -> bool {
        if now.as_secs() != self.second {
            self.second = now.as_secs();
            self.used = 0;
        }
        if self.used >= per_sec {
            return false;
        }
        self.used += 1;
        true
    }
}

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
pub(super) struct Backoff {
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
    rng: SmallRng,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            second: 0,
            shakes: 0,
            shed: 0,
            level: 0,
            calm_secs: 0,
            queued_us: 0,
            queued_before_us: 0,
            interval_ms: 0,
            raised_until: 0,
            rng: SmallRng::from_entropy(),
        }
    }
}

pub(super) const BACKOFF_BASE_MS: u32 = 1000;
pub(super) const BACKOFF_MAX_MS: u32 = 64_000;
pub(super) const BACKOFF_CALM_SECS: u32 = 5;

/// A second counts as shedding when at least 1 in this many of its shakes was shed.
const SHEDDING_ONE_IN: u32 = 100;

impl Backoff {
    /// Counts a shake read at `now` after waiting `queued` in the kernel, among `users`
    /// logged-in users, closing the seconds that have ended.
    fn shake(&mut self, now: Duration, queued: Duration, users: u64) {
        let second = now.as_secs();
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
    fn shed(&mut self) -> u32 {
        self.shed += 1;
        let mean = f64::from(self.wait_ms());
        // 1 - u is in (0, 1]: the logarithm is finite.
        let u: f64 = self.rng.gen();
        let drawn = -mean * (1.0 - u).ln();
        (drawn as u32).clamp(1, BACKOFF_MAX_MS)
    }

    /// Whether a shake that waited `waited` is shed: none under `max`, all over twice
    /// it, and in between a share rising with the excess.
    fn late(&mut self, waited: Duration, max: Duration) -> bool {
        if waited <= max {
            return false;
        }
        let excess = (waited - max).as_secs_f64() / max.as_secs_f64();
        excess >= 1.0 || self.rng.gen::<f64>() < excess
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

impl Worker {
    pub(super) fn dispatch(&mut self, key: usize, inbound: Inbound) {
        match inbound {
            Inbound::Request { id, request, auth } => self.handle(key, id, request, auth),
            Inbound::Refused { id, result, text } => {
                self.stats.counters.bad_requests += 1;
                self.reply(key, id, &Reply::Error { result, text });
            }
        }
    }

    fn handle(&mut self, key: usize, id: u32, request: Request, auth: Auth) {
        let request = match request {
            Request::Ping { client_time_us } => {
                self.stats.counters.pings += 1;
                let server_time_us = unix_now().as_micros() as u64;
                let pong = Reply::Pong {
                    client_time_us,
                    server_time_us,
                };
                return self.reply(key, id, &pong);
            }
            Request::Login { user_id, token } => return self.login(key, id, user_id, &token),
            request => request,
        };
        let user = match auth {
            Auth::Bearer(user) => Some(user),
            Auth::Connection => self.conns[key].user,
        };
        let Some(user) = user else {
            self.stats.counters.not_logged_in += 1;
            let error = Reply::Error {
                result: ResultCode::NotLoggedIn,
                text: "log in first".into(),
            };
            return self.reply(key, id, &error);
        };
        let conn = conn_id(key, self.conns[key].generation);
        let op = match request {
            Request::Shake => return self.shake(key, id, user),
            Request::Chat { to_user, text } => {
                self.stats.counters.chats += 1;
                let chat = ToCore::Chat {
                    conn,
                    req: id,
                    user,
                    to_user,
                    text,
                };
                return self.ask_core(key, &chat);
            }
            Request::Send {
                amount_cents,
                shares,
                recipients,
                idempotency_key,
            } => {
                self.stats.counters.sends += 1;
                Op::Send {
                    amount_cents,
                    shares,
                    recipients,
                    idempotency_key,
                }
            }
            Request::Open { packet_id } => {
                self.stats.counters.opens += 1;
                Op::Open { packet: packet_id }
            }
            Request::Me => Op::Me,
            Request::Notices => Op::Notices,
            Request::Ping { .. } | Request::Login { .. } => unreachable!("answered above"),
        };
        self.ask_core(
            key,
            &ToCore::Op {
                conn,
                req: id,
                user,
                op,
            },
        );
    }

    /// Hands request-bearing `msg` of connection `key` to the core, which answers it
    /// (`ToWorker::Reply`); a connection half-closed by its peer stays until it has.
    fn ask_core(&mut self, key: usize, msg: &ToCore) {
        let conn = &mut self.conns[key];
        conn.awaiting = conn.awaiting.saturating_add(1);
        self.tell_core(msg);
    }

    fn login(&mut self, key: usize, id: u32, user_id: u64, token: &[u8]) {
        let user = UserId::new(user_id)
            .filter(|_| hongbao_proto::token::verify(&self.cfg.secret, user_id, token));
        let Some(user) = user else {
            self.stats.counters.login_failures += 1;
            let reply = Reply::Login {
                result: ResultCode::BadToken,
                user_id,
            };
            self.reply(key, id, &reply);
            return self.kick(key, KickReason::BadToken, "bad token");
        };
        let conn = &mut self.conns[key];
        match conn.user {
            // One user per connection: logging in as another is refused, and the
            // connection stays its first user's.
            Some(other) if other != user => {
                self.stats.counters.bad_requests += 1;
                let refused = Reply::Login {
                    result: ResultCode::BadRequest,
                    user_id,
                };
                return self.reply(key, id, &refused);
            }
            Some(_) => {}
            None => {
                conn.user = Some(user);
                conn.last_seen = self.started.elapsed().as_secs() as u32;
                self.stats.levels.logged_in += 1;
                self.authenticated(key);
                self.unwatch_if_timeless(key);
            }
        }
        self.stats.counters.logins += 1;
        let conn = conn_id(key, self.conns[key].generation);
        // Presence answers: it must own the route before the client hears "ok", or a
        // second login elsewhere could reach it first and be the one replaced.
        self.ask_core(
            key,
            &ToCore::Online {
                conn,
                req: id,
                user,
            },
        );
    }

    fn shake(&mut self, key: usize, id: u32, user: UserId) {
        // The read's clock, not another reading of it.
        let read_at = self.started + self.read_now;
        self.stats.counters.shakes += 1;
        let now = self.unix_at_start + self.read_now;
        // A shake that waited in the kernel longer than `max_queue_ms` means the machine
        // is not keeping up: shed it (and the clients back off) rather than let every
        // queue behind it grow — a share of those just past the limit, all past twice it,
        // so that a queue just over it sheds what it must and not everything behind it.
        let waited = self
            .received
            .map_or(Duration::ZERO, |r| now.saturating_sub(r));
        let max = Duration::from_millis(self.cfg.max_queue_ms.into());
        let late = self.cfg.max_queue_ms > 0 && self.backoff.late(waited, max);
        if late {
            self.stats.counters.shakes_shed_late += 1;
        }
        let users = self.stats.levels.logged_in;
        self.backoff.shake(now, waited, users);
        self.pacer.shake_waited(waited);
        // In the FIFO order only: once such a queue has drained, what arrives above what
        // the worker was seen to serve is shed as it is read (cap.rs). In the adaptive
        // order the ready queue reads the newest first instead, and a cap would only
        // throw away work the worker could do: answering `overloaded` costs what serving
        // does, and clients that ignore the hint held a capped worker at its least for
        // good (docs/BENCHMARKS.md).
        let fifo = self.cfg.ready_order == ReadyOrder::Fifo;
        if fifo {
            self.cap.shake(now, waited, max);
        }
        let capped = fifo && !late && !self.cap.admit();
        if capped {
            self.stats.counters.shakes_shed_capped += 1;
        }
        if late || capped || !self.admission.admit(now, self.cfg.max_shakes_per_sec) {
            self.stats.counters.shakes_overloaded += 1;
            let wait = self.backoff.shed();
            return self.answer_shake(key, id, ResultCode::Overloaded, wait, read_at);
        }
        match self.pool.pop_front() {
            Some((packet, _amount)) => {
                // Only the core may say "won": it commits the win to the ledger first.
                self.stats.counters.shakes_won_claimed += 1;
                let conn = conn_id(key, self.conns[key].generation);
                self.claims.insert((conn, id), read_at);
                let claim = ToCore::Op {
                    conn,
                    req: id,
                    user,
                    op: Op::Claim { packet },
                };
                self.ask_core(key, &claim);
            }
            None => {
                self.stats.counters.shakes_nothing += 1;
                self.answer_shake(key, id, ResultCode::Nothing, 0, read_at);
            }
        }
    }

    fn answer_shake(
        &mut self,
        key: usize,
        id: u32,
        result: ResultCode,
        retry_after_ms: u32,
        read_at: Instant,
    ) {
        let reply = Reply::Shake {
            result,
            packet_id: 0,
            amount_cents: 0,
            retry_after_ms,
        };
        self.reply(key, id, &reply);
        self.record_latency(read_at);
    }

    pub(super) fn record_latency(&mut self, since: Instant) {
        let us = since.elapsed().as_micros().max(1) as u64;
        self.latency.saturating_record(us);
    }

    /// Answers request `id` on `key` in the connection's form.
    pub(super) fn reply(&mut self, key: usize, id: u32, reply: &Reply) {
        if !self.conns.contains(key) {
            return;
        }
        let mut bytes = self.take_scratch();
        let conn = &mut self.conns[key];
        let max_held = self.cfg.max_output_bytes as usize;
        let sent = conn.codec.reply(id, reply, &mut bytes, max_held);
        if !bytes.is_empty() {
            self.write(key, &bytes);
        }
        self.give_scratch(bytes);
        if sent == Sent::ThenClose {
            self.hang_up(key);
        }
    }

    /// Pushes to `key` if it can carry pushes.
    pub(super) fn push(&mut self, key: usize, push: &hongbao_money::Push) {
        if !self.conns.contains(key) {
            return;
        }
        let mut bytes = self.take_scratch();
        if self.conns[key].codec.push(push, &mut bytes) {
            self.write(key, &bytes);
        }
        self.give_scratch(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, ms: u64) -> Duration {
        Duration::from_millis(secs * 1000 + ms)
    }

    /// `n` shakes in second `s` from 100 users (an interval under the base wait), `shed`
    /// of them shed, each having waited `queued_ms` longer than the second before's;
    /// the mean waits asked.
    fn second(b: &mut Backoff, s: u64, n: u32, shed: u32) -> Vec<u32> {
        let queued = Duration::from_millis(s % 1000);
        let mut waits = Vec::new();
        for i in 0..n {
            b.shake(at(s, u64::from(i) * 999 / u64::from(n)), queued, 100);
            if i < shed {
                b.shed();
                waits.push(b.wait_ms());
            }
        }
        waits
    }

    #[test]
    fn a_moments_shedding_asks_for_the_base_wait() {
        let mut b = Backoff::default();
        second(&mut b, 100, 1000, 0);
        let waits = second(&mut b, 101, 1000, 300);
        assert!(waits.iter().all(|&w| w == BACKOFF_BASE_MS), "{waits:?}");
        // Calm again: a later moment's shedding still asks for about a second.
        for s in 102..102 + u64::from(BACKOFF_CALM_SECS) {
            second(&mut b, s, 1000, 0);
        }
        let waits = second(&mut b, 110, 1000, 10);
        assert!(waits.iter().all(|&w| w == BACKOFF_BASE_MS), "{waits:?}");
    }

    #[test]
    fn lasting_shedding_doubles_the_wait_up_to_the_limit() {
        let mut b = Backoff::default();
        let mut asked = Vec::new();
        for s in 0..10 {
            asked.push(second(&mut b, 1000 + s, 1000, 500)[0]);
        }
        assert_eq!(
            asked,
            [1000, 2000, 4000, 8000, 16000, 32000, 64000, 64000, 64000, 64000]
        );
    }

    /// 100 shakes in second `s`, each having waited `queued_ms`, half of them shed.
    fn at_queue(b: &mut Backoff, s: u64, queued_ms: u64) {
        for i in 0..100 {
            b.shake(at(s, i * 9), Duration::from_millis(queued_ms), 100);
            if i < 50 {
                b.shed();
            }
        }
    }

    #[test]
    fn the_wait_is_raised_again_only_once_the_last_could_be_heard() {
        let mut b = Backoff::default();
        // Second 10 closes with a queue of 2.5 s: raised once, then held through 11 and
        // 12 though the queue still grows; 13 closes past the hold and raises again.
        at_queue(&mut b, 10, 2500);
        at_queue(&mut b, 11, 2600);
        assert_eq!(b.wait_ms(), 2000);
        at_queue(&mut b, 12, 2700);
        at_queue(&mut b, 13, 2800);
        assert_eq!(b.wait_ms(), 2000, "held for 3 s after second 10");
        at_queue(&mut b, 14, 2900);
        assert_eq!(b.wait_ms(), 4000);
    }

    #[test]
    fn late_shakes_are_shed_by_a_share_rising_to_all_at_twice_the_limit() {
        let mut b = Backoff::default();
        let max = Duration::from_millis(200);
        let shed = |b: &mut Backoff, ms: u64| {
            (0..10_000)
                .filter(|_| b.late(Duration::from_millis(ms), max))
                .count()
        };
        assert_eq!(shed(&mut b, 0), 0);
        assert_eq!(shed(&mut b, 200), 0);
        assert_eq!(shed(&mut b, 400), 10_000);
        assert_eq!(shed(&mut b, 5000), 10_000);
        // A quarter of the limit over it: about a quarter shed.
        let quarter = shed(&mut b, 250);
        assert!((2_200..2_800).contains(&quarter), "{quarter}");
    }

    #[test]
    fn the_wait_comes_down_one_step_per_calm_spell() {
        let mut b = Backoff::default();
        for s in 0..4 {
            second(&mut b, 1000 + s, 1000, 500);
        }
        assert_eq!(b.wait_ms(), 8000);
        // The fourth second in a row with shedding is over; a few shed shakes (under 1
        // in 100) do not make a shedding second.
        second(&mut b, 1004, 1000, 5);
        assert_eq!(b.wait_ms(), 16000);
        for s in 5..9 {
            second(&mut b, 1000 + s, 1000, 5);
        }
        assert_eq!(b.wait_ms(), 16000, "four calm seconds are not a spell");
        second(&mut b, 1009, 1000, 0);
        assert_eq!(b.wait_ms(), 8000);
        // Seconds with no shakes at all are calm too: 1009 and 1010..=1019.
        second(&mut b, 1020, 1000, 0);
        assert_eq!(b.wait_ms(), 2000);
        for s in 21..25 {
            second(&mut b, 1000 + s, 1000, 0);
        }
        assert_eq!(b.wait_ms(), BACKOFF_BASE_MS);
    }

    #[test]
    fn the_wait_holds_while_the_queue_drains() {
        let mut b = Backoff::default();
        at_queue(&mut b, 10, 300);
        at_queue(&mut b, 11, 600);
        at_queue(&mut b, 12, 900);
        assert_eq!(b.wait_ms(), 4000, "the queue grew: doubled twice");
        at_queue(&mut b, 13, 500);
        at_queue(&mut b, 14, 250);
        assert_eq!(b.wait_ms(), 8000, "one more for second 12; then it drains");
        at_queue(&mut b, 15, 300);
        assert_eq!(b.wait_ms(), 8000, "second 14 drained too");
        at_queue(&mut b, 16, 0);
        assert_eq!(b.wait_ms(), 16000, "second 15 grew again");
    }

    #[test]
    fn the_base_wait_is_a_users_shake_interval() {
        let mut b = Backoff::default();
        // 10,000 users, 2,000 shakes a second: each shakes every 5 s.
        for s in 0..2 {
            for i in 0..2000 {
                b.shake(at(s, i / 2), Duration::ZERO, 10_000);
            }
        }
        assert_eq!(b.wait_ms(), 5000);
        // 100 users shaking 2,000 times a second: the base is the floor, 1 s.
        let mut b = Backoff::default();
        for s in 0..2 {
            for i in 0..2000 {
                b.shake(at(s, i / 2), Duration::ZERO, 100);
            }
        }
        assert_eq!(b.wait_ms(), BACKOFF_BASE_MS);
    }

    #[test]
    fn shed_clients_are_asked_for_waits_spread_around_the_mean() {
        let mut b = Backoff::default();
        for s in 0..3 {
            second(&mut b, 1000 + s, 1000, 500);
        }
        let mean = b.wait_ms();
        assert_eq!(mean, 4000);
        let waits: Vec<u32> = (0..20_000).map(|_| b.shed()).collect();
        assert!(waits.iter().all(|&w| (1..=BACKOFF_MAX_MS).contains(&w)));
        let average = waits.iter().map(|&w| f64::from(w)).sum::<f64>() / waits.len() as f64;
        assert!((average / f64::from(mean) - 1.0).abs() < 0.05, "{average}");
        // Exponential: about 39% under half the mean, 14% over twice it.
        let share = |f: &dyn Fn(u32) -> bool| {
            waits.iter().filter(|&&w| f(w)).count() as f64 / waits.len() as f64
        };
        let under_half = share(&|w| w < mean / 2);
        let over_twice = share(&|w| w > mean * 2);
        assert!((0.35..0.43).contains(&under_half), "{under_half}");
        assert!((0.11..0.17).contains(&over_twice), "{over_twice}");
    }
}
