//! What a worker does with a request, whatever transport carried it: answers pings,
//! checks logins, passes shakes through the overload gate (`overload.rs`) and answers
//! losing ones from its own pool at memory speed, and hands everything that moves money
//! (a winning shake's claim, a send, an open) or concerns other users (chat) to the
//! supervisor.

use std::time::Duration;

use hongbao_money::seam::Op;
use hongbao_money::{Reply, Request, UserId};
use hongbao_proto::{KickReason, ResultCode};
use hongbao_sys::clock::{UnixTime, Uptime};

use super::codec::Sent;
use super::conn::{conn_id, Session};
use super::event_loop::Worker;
use super::overload::{Limits, Shed, Verdict};
use super::wire::{Auth, Inbound};
use crate::config::ReadyOrder;
use crate::link::ToSupervisor;

impl Worker {
    pub(super) fn dispatch(&mut self, key: usize, inbound: Inbound) {
        match inbound {
            Inbound::Request { id, request, auth } => self.handle(key, id, request, auth),
            Inbound::Refused {
                id,
                result,
                text,
                bearer,
            } => {
                if let Some(token) = bearer {
                    if self.bearer_user(key, id, &token).is_none() {
                        return;
                    }
                }
                self.stats.counters.bad_requests += 1;
                self.reply(key, id, &Reply::Error { result, text });
            }
        }
    }

    fn handle(&mut self, key: usize, id: u32, request: Request, auth: Auth) {
        let request = match request {
            Request::Ping { client_time_us } => {
                self.stats.counters.pings += 1;
                let server_time_us = UnixTime::now().as_micros();
                let pong = Reply::Pong {
                    client_time_us,
                    server_time_us,
                };
                return self.reply(key, id, &pong);
            }
            Request::Login {
                user_id,
                token,
                legacy,
            } => return self.login(key, id, user_id, &token, legacy),
            request => request,
        };
        let bearer = matches!(auth, Auth::Bearer(_));
        let user = match auth {
            Auth::Bearer(token) => match self.bearer_user(key, id, &token) {
                Some(user) => Some(user),
                None => return,
            },
            Auth::Connection => self.conns[key].state.user,
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
            Request::Shake => return self.shake(key, id, user, bearer),
            Request::Chat { to_user, text } => {
                self.stats.counters.chats += 1;
                let chat = ToSupervisor::Chat {
                    conn,
                    req: id,
                    user,
                    to_user,
                    text,
                };
                return self.ask_supervisor(key, &chat);
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
        self.ask_supervisor(
            key,
            &ToSupervisor::Op {
                conn,
                req: id,
                user,
                op,
            },
        );
    }

    /// Hands request-bearing `msg` of connection `key` to the supervisor, which answers it
    /// (`ToWorker::Reply`); a connection half-closed by its peer stays until it has.
    fn ask_supervisor(&mut self, key: usize, msg: &ToSupervisor) {
        let conn = &mut self.conns[key];
        conn.state.awaiting = conn.state.awaiting.saturating_add(1);
        self.tell_supervisor(msg);
    }

    /// A login: the first of a connection takes the user's route (the supervisor answers it);
    /// another on a logged-in connection, for the same user, refreshes its session (its
    /// end moves to the new token's) and is answered here.
    /// The user an HTTP request's bearer token names, or `None` once its refusal is
    /// answered (401) and counted.
    fn bearer_user(&mut self, key: usize, id: u32, token: &[u8]) -> Option<UserId> {
        match self.sessions.bearer(token, self.time.read_unix()) {
            Ok(user) => Some(user),
            Err(refusal) => {
                self.stats.counters.login_failures += 1;
                self.stats.count_refusal(refusal);
                let error = Reply::Error {
                    result: ResultCode::BadToken,
                    text: format!("the bearer token is refused ({})", refusal.name()),
                };
                self.reply(key, id, &error);
                None
            }
        }
    }

    fn login(&mut self, key: usize, id: u32, user_id: u64, token: &[u8], legacy: bool) {
        let now = self.time.read_unix();
        let checked = match self.sessions.check(user_id, token, legacy, now) {
            Ok(checked) => checked,
            Err(refusal) => {
                self.stats.counters.login_failures += 1;
                self.stats.count_refusal(refusal);
                let reply = Reply::Login {
                    result: ResultCode::BadToken,
                    user_id,
                };
                self.reply(key, id, &reply);
                // A session keeps its token until that ends: a bad refresh ends nothing.
                if self.conns.get(key).is_some_and(|c| c.state.user.is_none()) {
                    let why = format!("bad token: {}", refusal.name());
                    self.kick(key, KickReason::BadToken, &why);
                }
                return;
            }
        };
        let user = checked.user;
        let conn = &mut self.conns[key];
        match conn.state.user {
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
            Some(_) => {
                let shakes = conn.state.session.shakes;
                conn.state.session = Session {
                    shakes,
                    ..Session::of(&checked)
                };
                let refreshed = ToSupervisor::Refreshed {
                    conn: conn_id(key, conn.generation),
                    user,
                    issued: checked.issued,
                };
                self.tell_supervisor(&refreshed);
                self.stats.counters.refreshes += 1;
                let ok = Reply::Login {
                    result: ResultCode::Ok,
                    user_id: user.get(),
                };
                return self.reply(key, id, &ok);
            }
            None => {
                conn.state.user = Some(user);
                conn.state.session = Session::of(&checked);
                let now = self.time.clock.now().secs();
                conn.last_seen = now;
                self.stats.levels.logged_in += 1;
                self.authenticated(key);
                // From now on its deadlines are the session's: the token's, the idle
                // timeout's.
                self.visit_soon(key);
            }
        }
        self.stats.counters.logins += 1;
        let conn = conn_id(key, self.conns[key].generation);
        // Presence answers: it must own the route before the client hears "ok", or a
        // second login elsewhere could reach it first and be the one replaced.
        self.ask_supervisor(
            key,
            &ToSupervisor::Online {
                conn,
                req: id,
                user,
                issued: checked.issued,
            },
        );
    }

    fn shake(&mut self, key: usize, id: u32, user: UserId, bearer: bool) {
        // The read's clock, not another reading of it.
        let read_at = self.time.read;
        self.stats.counters.shakes += 1;
        if let Err(wait) = self.take_shake(key, user, bearer) {
            self.stats.counters.rate_limited += 1;
            return self.answer_shake(key, id, ResultCode::RateLimited, wait, read_at);
        }
        let now = self.time.read_unix();
        let waited = self.time.received.map_or(Duration::ZERO, |r| now.since(r));
        self.broadcasts.shake_waited(waited);
        let limits = Limits {
            max_queue: Duration::from_millis(self.cfg.max_queue_ms.into()),
            per_sec: self.cfg.max_shakes_per_sec,
            // In the FIFO order only: in the adaptive order the ready queue reads the
            // newest first instead, and a cap would only throw away work the worker
            // could do (overload.rs).
            cap: self.cfg.ready_order == ReadyOrder::Fifo,
        };
        let users = self.stats.levels.logged_in;
        if let Verdict::Shed {
            why,
            retry_after_ms,
        } = self.shakes.gate(now, waited, users, limits)
        {
            let counters = &mut self.stats.counters;
            match why {
                Shed::Late => counters.shakes_shed_late += 1,
                Shed::Capped => counters.shakes_shed_capped += 1,
                Shed::Rate => {}
            }
            counters.shakes_overloaded += 1;
            return self.answer_shake(key, id, ResultCode::Overloaded, retry_after_ms, read_at);
        }
        let conn = conn_id(key, self.conns[key].generation);
        match self.shakes.claim(conn, id, read_at) {
            Some(packet) => {
                // Only the money side may say "won": it commits the win to the ledger first.
                self.stats.counters.shakes_won_claimed += 1;
                let claim = ToSupervisor::Op {
                    conn,
                    req: id,
                    user,
                    op: Op::Claim { packet },
                };
                self.ask_supervisor(key, &claim);
            }
            None => {
                self.stats.counters.shakes_nothing += 1;
                self.answer_shake(key, id, ResultCode::Nothing, 0, read_at);
            }
        }
    }

    /// Takes one shake from `user`'s bucket (`limits.rs`): its session's, or over HTTP
    /// the worker's bucket for its bearer; the wait (ms) when it is empty.
    fn take_shake(&mut self, key: usize, user: UserId, bearer: bool) -> Result<(), u32> {
        let limit = self.cfg.shake_limit;
        if limit.is_unlimited() {
            return Ok(());
        }
        let now_ms = self.time.read.as_micros() / 1000;
        let bucket = if bearer {
            self.shakes.bearer_bucket(user, now_ms)
        } else {
            &mut self.conns[key].state.session.shakes
        };
        *bucket = limit.take_compact(*bucket, now_ms)?;
        Ok(())
    }

    fn answer_shake(
        &mut self,
        key: usize,
        id: u32,
        result: ResultCode,
        retry_after_ms: u32,
        read_at: Uptime,
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

    /// Records a shake's latency, from its read at `since` to now (a clock read: the
    /// answer is being written).
    pub(super) fn record_latency(&mut self, since: Uptime) {
        let us = self.now().since(since).as_micros().max(1) as u64;
        self.latency.saturating_record(us);
    }

    /// Answers request `id` on `key` in the connection's form.
    pub(super) fn reply(&mut self, key: usize, id: u32, reply: &Reply) {
        if !self.conns.contains(key) {
            return;
        }
        let mut bytes = self.output.take_scratch();
        let conn = &mut self.conns[key];
        let max_held = self.cfg.max_output_bytes as usize;
        let sent = conn.codec.reply(id, reply, &mut bytes, max_held);
        if !bytes.is_empty() {
            self.write(key, &bytes);
        }
        self.output.give_scratch(bytes);
        if sent == Sent::ThenClose {
            self.hang_up(key);
        }
    }

    /// Pushes to `key` if it can carry pushes.
    pub(super) fn push(&mut self, key: usize, push: &hongbao_money::Push) {
        if !self.conns.contains(key) {
            return;
        }
        let mut bytes = self.output.take_scratch();
        if self.conns[key].codec.push(push, &mut bytes) {
            self.write(key, &bytes);
        }
        self.output.give_scratch(bytes);
    }
}
