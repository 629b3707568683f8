//! A load client's receiving side: reading what the server sent, the WebSocket upgrade's
//! answer, and what each reply means for the counts (and for the user's next move: an
//! open after a notice, a back-off after "overloaded").

use std::io::{ErrorKind, Read};
use std::time::Duration;

use hongbao_proto::api;
use hongbao_proto::tls::session::Opened;
use hongbao_proto::{ws, Frame, Message, ResultCode};
use rand::Rng;

use hongbao_sys::clock::UnixTime;

use super::{micros_since, Client, Inflight, Kind, State, UnixMs};
use crate::backoff::Ended;
use crate::report::Acked;
use crate::transport::{self, HttpConnection, Inbound};

impl Client {
    /// Reads what arrived for user `i` by `now`. `closing`: the event said the server closed (or
    /// the socket failed), so read on to the end however short a read was.
    pub(super) fn on_readable(&mut self, i: usize, buf: &mut [u8], closing: bool, now: UnixTime) {
        if self.users[i].state == State::Connecting {
            // An error (refused, reset) shows up as readable too.
            let err = self.users[i]
                .stream
                .as_ref()
                .and_then(|s| s.take_error().ok().flatten());
            if let Some(e) = err {
                self.connect_failed(i, &e, now);
            }
            return;
        }
        loop {
            let Some(stream) = self.users[i].stream.as_mut() else {
                return;
            };
            let n = match stream.read(buf) {
                Ok(0) if self.users[i].state == State::Draining => {
                    return self.next_connection(i, now)
                }
                Ok(0) => return self.lost(i, now),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return self.lost(i, now),
            };
            let mut data = std::mem::take(&mut self.users[i].partial);
            if self.users[i].tls.is_some() {
                if self.tls_read(i, &buf[..n], &mut data, now).is_none() {
                    return;
                }
                if self.users[i].state == State::Handshaking {
                    self.users[i].partial = data;
                    if n < buf.len() && !closing {
                        return;
                    }
                    continue;
                }
            } else {
                data.extend_from_slice(&buf[..n]);
            }
            let mut at = 0;
            if self.users[i].state == State::Upgrading {
                match self.on_upgrade_answer(i, &data, now) {
                    Some(head) => at = head,
                    None => {
                        if self.users[i].stream.is_some() {
                            self.users[i].partial = data; // the answer so far
                        }
                        continue;
                    }
                }
            }
            let t = self.opts.transport;
            let mut fragment = self.users[i].fragment.take();
            let decoded = transport::decode(t, &mut data[at..], &mut fragment, |m| {
                self.on_inbound(i, m, now)
            });
            match decoded {
                Ok(used) => at += used,
                Err(_) => {
                    self.counters.error_replies += 1;
                    return self.disconnect(i, now);
                }
            }
            let user = &mut self.users[i];
            if user.stream.is_none() {
                return; // dropped while handling what arrived
            }
            user.fragment = fragment;
            if at < data.len() {
                data.drain(..at);
                user.partial = data;
            }
            if n < buf.len() && !closing {
                // A short read emptied the socket; epoll (edge-triggered) says when more
                // arrives. Reading again only to hear "would block" costs a system call
                // per answer.
                return;
            }
        }
    }

    /// Reads `cipher` through user `i`'s TLS session, appending the plaintext to `plain`
    /// and sending what the session has to send; the handshake done, the user is
    /// established (for WebSocket: its upgrade request goes out). `None`: the session
    /// failed or the server said goodbye (the user is dropped, to retry).
    fn tls_read(
        &mut self,
        i: usize,
        cipher: &[u8],
        plain: &mut Vec<u8>,
        now: UnixTime,
    ) -> Option<()> {
        let session = self.users[i].tls.as_mut()?;
        let mut out = Vec::new();
        let opened = session.open(cipher, plain, &mut out);
        let handshaking = session.is_handshaking();
        if !out.is_empty() {
            self.write_raw(i, &out, now);
        }
        match opened {
            Ok(Opened::Data) => {}
            Ok(Opened::PeerClosed) if !plain.is_empty() => {}
            Ok(Opened::PeerClosed) => {
                self.lost(i, now);
                return None;
            }
            Err(_) => {
                self.handshake_failed(i, now);
                return None;
            }
        }
        if !handshaking && self.users[i].state == State::Handshaking {
            self.tls_established(i, now);
        }
        Some(())
    }

    /// Reads the server's answer to the upgrade request: `Some(head length)` once it is a
    /// valid 101 (the user is then logging in), `None` while incomplete or if it failed
    /// (the user is then dropped and will retry).
    pub(super) fn on_upgrade_answer(
        &mut self,
        i: usize,
        answer: &[u8],
        now: UnixTime,
    ) -> Option<usize> {
        let key = self.handshakes.get(&(i as u32)).copied()?;
        match ws::check_response(answer, &key) {
            Ok(None) => None,
            Ok(Some(head)) => {
                self.handshakes.remove(&(i as u32));
                self.established(i, now);
                Some(head)
            }
            Err(_) => {
                // Refused with a wait to keep (a 503 over the server's limit on
                // connections not yet logged in): the next attempt waits it.
                if let Some(secs) = retry_after_secs(answer) {
                    self.users[i].ended = Some(Ended::Hinted(secs.saturating_mul(1000)));
                }
                self.handshake_failed(i, now);
                None
            }
        }
    }

    pub(super) fn on_inbound(&mut self, i: usize, m: Inbound<'_>, now: UnixTime) {
        if self.users[i].stream.is_none() {
            return; // dropped by an earlier message of the same read
        }
        match m {
            Inbound::Frame(frame) => self.on_frame(i, frame, now),
            Inbound::BadFrame | Inbound::Text => self.counters.error_replies += 1,
            Inbound::Ping(payload) => {
                let mut out = Vec::with_capacity(8 + payload.len());
                transport::pong(payload, &mut out);
                self.write(i, &out, now);
            }
            Inbound::Close => {
                let mut out = Vec::with_capacity(8);
                transport::close_reply(&mut out);
                self.write(i, &out, now);
                self.disconnect(i, now);
            }
            Inbound::Response { status, body } => self.on_http_response(i, status, body, now),
        }
    }

    /// An HTTP answer, to the oldest ask still under way (answers come in request order):
    /// read as the protocol reply it stands for, so one path counts both.
    fn on_http_response(&mut self, i: usize, status: u16, body: &[u8], now: UnixTime) {
        let Some(&asked) = self.users[i].inflight.first() else {
            self.counters.error_replies += 1;
            return;
        };
        if self.opts.request.is_some() && asked.kind == Kind::Shake {
            // A request of the user's own: only the status says how it went.
            let result = match status {
                200..=399 => Some(ResultCode::Nothing),
                429 | 503 => Some(ResultCode::Overloaded),
                _ => None,
            };
            let message = match result {
                Some(result) => Message::ShakeReply {
                    result,
                    packet_id: 0,
                    amount_cents: 0,
                    retry_after_ms: 0,
                },
                None => Message::Error {
                    result: ResultCode::BadRequest,
                    text: format!("HTTP {status}"),
                    retry_after_ms: 0,
                },
            };
            let request_id = asked.request_id;
            self.on_frame(
                i,
                Frame {
                    request_id,
                    message,
                },
                now,
            );
            return self.done_asking(i, now);
        }
        // Read through the API's own types (`hongbao_proto::api`): an answer that does
        // not read as its kind's is an error of the status.
        let refused = |result: Option<ResultCode>| Message::Error {
            result: result.unwrap_or(ResultCode::BadRequest),
            text: format!("HTTP {status}"),
            retry_after_ms: 0,
        };
        let message = match asked.kind {
            Kind::Shake | Kind::Open => match serde_json::from_slice::<api::Taken>(body) {
                Ok(t) if asked.kind == Kind::Shake => Message::ShakeReply {
                    result: t.result,
                    packet_id: t.packet_id,
                    amount_cents: t.amount_cents,
                    retry_after_ms: t.retry_after_ms,
                },
                Ok(t) => Message::OpenReply {
                    result: t.result,
                    packet_id: t.packet_id,
                    amount_cents: t.amount_cents,
                },
                Err(_) => refused(None),
            },
            Kind::Poll => match serde_json::from_slice::<api::Notices>(body) {
                Ok(answer) if answer.result == ResultCode::Ok => {
                    self.take_inflight(i, asked.request_id);
                    for notice in answer.notices {
                        let push = Message::PacketNotice {
                            packet_id: notice.packet_id,
                            from_user: notice.from_user.unwrap_or(0),
                            amount_cents: notice.amount_cents,
                            shares: notice.shares,
                            expires_at_ms: notice.expires_at_ms,
                        };
                        self.on_frame(
                            i,
                            Frame {
                                request_id: 0,
                                message: push,
                            },
                            now,
                        );
                    }
                    return self.done_asking(i, now);
                }
                Ok(answer) => refused(Some(answer.result)),
                Err(_) => refused(None),
            },
        };
        let frame = Frame {
            request_id: asked.request_id,
            message,
        };
        self.on_frame(i, frame, now);
        self.done_asking(i, now);
    }

    /// With a connection per request, the connection closes with its answer: the server
    /// closes it (`close`: read on to its end) or the client does (`client-close`: at
    /// once).
    fn done_asking(&mut self, i: usize, now: UnixTime) {
        if !self.on_demand() || self.users[i].stream.is_none() {
            return;
        }
        if self.opts.http_connection == HttpConnection::Close {
            self.users[i].state = State::Draining;
            return;
        }
        self.next_connection(i, now);
    }

    /// Closes user `i`'s connection; asks made meanwhile (an open after a notice) go out
    /// on a new one.
    fn next_connection(&mut self, i: usize, now: UnixTime) {
        let waiting = std::mem::take(&mut self.users[i].inflight);
        self.drop_stream(i);
        if !waiting.is_empty() {
            self.users[i].inflight = waiting;
            self.connect(i, now);
        }
    }

    pub(super) fn take_inflight(&mut self, i: usize, request_id: u32) -> Option<Inflight> {
        let inflight = &mut self.users[i].inflight;
        let at = inflight.iter().position(|f| f.request_id == request_id)?;
        // In order: HTTP answers are matched to the oldest ask.
        let found = inflight.remove(at);
        if inflight.is_empty() {
            *inflight = Vec::new();
        }
        Some(found)
    }

    /// What `frame`, read at `now`, means for user `i` and the counts.
    pub(super) fn on_frame(&mut self, i: usize, frame: Frame, now: UnixTime) {
        let user_id = self.user_id(i);
        match frame.message {
            Message::LoginReply {
                result: ResultCode::Ok,
                ..
            } if self.users[i].state == State::Ready => self.counters.refreshes += 1,
            Message::LoginReply {
                result: ResultCode::Ok,
                ..
            } => {
                let user = &mut self.users[i];
                user.state = State::Ready;
                user.attempt = 0;
                self.logged_in += 1;
                self.counters.logins += 1;
            }
            // The session's token ends soon: a fresh one, on this connection.
            Message::Refresh { .. } => self.log_in(i, now),
            Message::LoginReply { .. } => self.counters.login_failures += 1,
            Message::ShakeReply {
                result,
                packet_id,
                amount_cents,
                retry_after_ms,
            } => {
                let Some(f) = self.take_inflight(i, frame.request_id) else {
                    return;
                };
                self.counters.shake_replies += 1;
                let latency = micros_since(now, f.intended);
                let _ = self.shake_hist.record(latency);
                if matches!(result, ResultCode::Won | ResultCode::Nothing) {
                    let _ = self.served_hist.record(latency);
                }
                match result {
                    ResultCode::Won => {
                        self.counters.won += 1;
                        self.counters.won_cents += amount_cents;
                        let t = self.totals.entry(user_id).or_default();
                        t.won += 1;
                        t.won_cents += amount_cents;
                        self.history.wins.push(Acked {
                            user: user_id,
                            packet: packet_id,
                            amount_cents,
                        });
                    }
                    ResultCode::Nothing => self.counters.nothing += 1,
                    ResultCode::Overloaded => {
                        self.counters.overloaded += 1;
                        // The wait the server asked for, or ours when it named none;
                        // ±50% jitter, so that users shed together do not all return in
                        // the same second and overload the server again in waves.
                        let wait_ms = match retry_after_ms {
                            0 => u64::from(self.opts.overload_backoff_secs) * 1000,
                            ms => u64::from(ms),
                        };
                        if wait_ms > 0 && self.opts.overload_backoff_secs > 0 {
                            let ms = rand::thread_rng().gen_range(wait_ms / 2..=wait_ms * 3 / 2);
                            self.users[i].since = UnixMs::of(now + Duration::from_millis(ms));
                        }
                    }
                    _ => self.counters.error_replies += 1,
                }
            }
            Message::PacketNotice { packet_id, .. } => {
                self.counters.notices += 1;
                if let std::collections::hash_map::Entry::Vacant(e) =
                    self.opens.entry((user_id, packet_id))
                {
                    e.insert(None);
                    self.counters.opens_sent += 1;
                    self.request(i, Kind::Open, now, packet_id, now);
                }
            }
            Message::OpenReply {
                result,
                packet_id,
                amount_cents,
            } => {
                let Some(f) = self.take_inflight(i, frame.request_id) else {
                    return;
                };
                let _ = self.open_hist.record(micros_since(now, f.intended));
                match result {
                    ResultCode::Opened | ResultCode::AlreadyOpened => {
                        let counted = self.opens.entry((user_id, packet_id)).or_insert(None);
                        let told = Acked {
                            user: user_id,
                            packet: packet_id,
                            amount_cents,
                        };
                        match *counted {
                            None => {
                                *counted = Some(amount_cents);
                                self.counters.opened += 1;
                                self.counters.opened_cents += amount_cents;
                                let t = self.totals.entry(user_id).or_default();
                                t.opened += 1;
                                t.opened_cents += amount_cents;
                                self.history.opens.push(told);
                            }
                            // The same open told again (a retry after a lost reply).
                            Some(first) if first == amount_cents => {}
                            // One share told at two amounts: the history keeps both, for
                            // the check against the ledger to flag; the counts keep one.
                            Some(_) => self.history.opens.push(told),
                        }
                    }
                    _ => self.counters.open_other += 1,
                }
            }
            Message::Error { .. } => {
                // An open that failed (the ledger unavailable: nothing was done) is made
                // again when the packet's notice comes again (after a failover the
                // server tells waiting notices again; docs/protocol.md).
                if let Some(f) = self.take_inflight(i, frame.request_id) {
                    if f.kind == Kind::Open && self.opens.get(&(user_id, f.packet)) == Some(&None) {
                        self.opens.remove(&(user_id, f.packet));
                    }
                }
                self.counters.error_replies += 1;
            }
            // What it does once the close comes: come back after the wait the server
            // names, after its own back-off, or — a terminal reason — never.
            Message::Kick {
                reason,
                retry_after_ms,
                ..
            } => {
                self.counters.kicks += 1;
                self.users[i].ended = Some(if !reason.comes_back() {
                    Ended::Terminal
                } else if retry_after_ms > 0 {
                    Ended::Hinted(retry_after_ms)
                } else {
                    Ended::Failed
                });
            }
            Message::Broadcast { server_time_us, .. } => {
                self.counters.broadcast_delivered += 1;
                self.receipts.record(server_time_us, now.as_micros());
            }
            _ => {}
        }
    }
}

/// The `Retry-After` (whole seconds) of an HTTP answer's head, if it says one.
fn retry_after_secs(answer: &[u8]) -> Option<u32> {
    let head = std::str::from_utf8(answer).ok()?;
    let head = head.split("\r\n\r\n").next()?;
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refused_upgrade_says_when_to_come_back() {
        let answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nretry-after: 1\r\n\r\n{}";
        assert_eq!(super::retry_after_secs(answer), Some(1));
        assert_eq!(
            super::retry_after_secs(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
            None
        );
    }
}
