//! What a worker does with a request, whatever transport carried it: answers pings,
//! checks logins, admits shakes and answers losing ones from its own pool at memory
//! speed, and hands everything that moves money (a winning shake's claim, a send, an
//! open) or concerns other users (chat) to the supervisor.

use std::time::{Duration, Instant};

use hongbao_money::seam::Op;
use hongbao_money::{Reply, Request, UserId};
use hongbao_proto::{KickReason, ResultCode};

use super::codec::{Auth, Inbound, Sent};
use super::conn::conn_id;
use super::{unix_now, Worker};
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
        let read_at = Instant::now();
        self.stats.counters.shakes += 1;
        let now = unix_now();
        // A shake that waited in the kernel longer than `max_queue_ms` means the machine
        // is not keeping up: shed it (and the clients back off) rather than let every
        // queue behind it grow.
        let waited = self
            .received
            .map_or(Duration::ZERO, |r| now.saturating_sub(r));
        let late = self.cfg.max_queue_ms > 0
            && waited > Duration::from_millis(self.cfg.max_queue_ms.into());
        if late {
            self.stats.counters.shakes_shed_late += 1;
        }
        if late || !self.admission.admit(now, self.cfg.max_shakes_per_sec) {
            self.stats.counters.shakes_overloaded += 1;
            return self.answer_shake(key, id, ResultCode::Overloaded, read_at);
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
                self.answer_shake(key, id, ResultCode::Nothing, read_at);
            }
        }
    }

    fn answer_shake(&mut self, key: usize, id: u32, result: ResultCode, read_at: Instant) {
        let reply = Reply::Shake {
            result,
            packet_id: 0,
            amount_cents: 0,
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
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let mut bytes = Vec::with_capacity(64);
        let max_held = self.cfg.max_output_bytes as usize;
        let sent = conn.codec.reply(id, reply, &mut bytes, max_held);
        if !bytes.is_empty() {
            self.write(key, &bytes);
        }
        if sent == Sent::ThenClose {
            self.hang_up(key);
        }
    }

    /// Pushes to `key` if it can carry pushes.
    pub(super) fn push(&mut self, key: usize, push: &hongbao_money::Push) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let mut bytes = Vec::with_capacity(64);
        if conn.codec.push(push, &mut bytes) {
            self.write(key, &bytes);
        }
    }
}
