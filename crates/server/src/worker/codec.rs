//! The wire seam: how one connection speaks. Every connection holds a `Codec`, and the
//! worker's one read/dispatch/write path goes through it:
//!
//! - `decode` reads a request at a time from the bytes a client sent (`Step`): a
//!   transport-free `Request`, or a refusal to answer, and whether the connection goes on;
//!   bytes the transport answers by itself (a WebSocket pong, an HTTP page) go to `Cx::out`;
//! - `reply` and `push` encode typed outcomes as this connection reads them — or say the
//!   connection cannot carry them ("not pushable");
//! - `close` writes the transport's goodbye after a kick;
//! - `idle` says which deadline applies while the connection is quiet.
//!
//! The codecs: binary frames over TCP, WebSocket (frames in binary messages or JSON in
//! text ones), and HTTP (`http.rs`; on the WebSocket listener until a connection upgrades).
//! An enum, not a boxed trait: a million connections each hold one, so it stays a few
//! bytes, and what a codec needs beyond that (a fragmented message) is boxed only while
//! it exists.
//!
//! What a decode step is made of (`Step`, `Inbound`, `Auth`, `Then`, `Cx`) lives in
//! `wire.rs`, which both codec files use: this file imports `http.rs`, never the reverse.

use std::ops::ControlFlow;

use hongbao_money::{Push, Reply, Request, UserId};
use hongbao_proto::ws::{self, Incoming, Limits, Opcode, Role};
use hongbao_proto::{json, Frame, FrameError, KickReason, Message, ResultCode, VERSION};
use hongbao_sys::clock::UptimeSecs;

use super::http::{Answered, HttpCodec};
use super::wire::{Auth, Cx, Inbound, Step, Then};

pub(super) enum Codec {
    /// Binary frames over raw TCP.
    Frames,
    WebSocket(WsCodec),
    /// Boxed: the request-order state is a few words that TCP and WebSocket connections
    /// should not pay for.
    Http(Box<HttpCodec>),
}

/// Which of a broadcast's encodings a connection reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    Frame,
    WsBinary,
    WsText,
}

/// A WebSocket connection: the form of its latest message (replies and pushes follow
/// it), and a fragmented message being assembled.
pub(super) struct WsCodec {
    form: Option<Form>,
    partial: Option<Box<ws::Partial>>,
}

/// What became of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    /// The connection cannot carry it.
    No,
    /// Written (or queued for its turn).
    Yes,
    /// Written, and it was the last: close once it is out.
    ThenClose,
}

/// Which deadline applies to a quiet connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Idle {
    /// Binary frames and WebSocket: log in within `login_timeout_secs`, then the idle
    /// timeout.
    Session,
    /// HTTP: a request begun at `request_since` (the connect, before the first) must be whole within the header timeout
    /// (`login_timeout_secs`); between requests, with no answer due, the keep-alive
    /// timeout applies.
    Http {
        request_since: Option<UptimeSecs>,
        answers_due: bool,
    },
}

impl Codec {
    pub(super) fn websocket() -> Codec {
        Codec::WebSocket(WsCodec {
            form: None,
            partial: None,
        })
    }

    /// Reads at most one request from the front of `data`.
    pub(super) fn decode(&mut self, data: &mut [u8], cx: &mut Cx<'_>) -> Step {
        match self {
            Codec::Frames => decode_frame(data, cx),
            Codec::WebSocket(ws) => ws.decode(data, cx),
            Codec::Http(http) => {
                let (step, upgraded) = http.decode(data, cx);
                if upgraded {
                    *self = Codec::websocket();
                }
                step
            }
        }
    }

    /// Appends the reply to request `id` as this connection reads it (HTTP: in request
    /// order, so perhaps later, with the replies before it).
    pub(super) fn reply(
        &mut self,
        id: u32,
        reply: &Reply,
        out: &mut Vec<u8>,
        max_held: usize,
    ) -> Sent {
        match self {
            Codec::Http(http) => match http.reply(id, reply, out, max_held) {
                Answered::Queued => Sent::Yes,
                Answered::ThenClose => Sent::ThenClose,
            },
            _ => match self.form() {
                Some(form) => {
                    encode(form, &frame(id, reply_message(reply)), out);
                    Sent::Yes
                }
                None => Sent::No,
            },
        }
    }

    /// Appends a push as this connection reads it; false when it is not pushable (a
    /// WebSocket before its first message, whose form is not known; HTTP).
    pub(super) fn push(&self, push: &Push, out: &mut Vec<u8>) -> bool {
        match self.form() {
            Some(form) => {
                encode(form, &frame(0, push_message(push)), out);
                true
            }
            None => false,
        }
    }

    /// The goodbye after a kick's push: a WebSocket close frame (1001 for a shutdown,
    /// 1008 otherwise, with the reason's name).
    pub(super) fn close(&mut self, reason: KickReason, out: &mut Vec<u8>) {
        match self {
            Codec::WebSocket(ws) => {
                ws.partial = None;
                let code = match reason {
                    KickReason::Shutdown => ws::close_code::GOING_AWAY,
                    _ => ws::close_code::POLICY,
                };
                ws::close_frame(Role::Server, code, reason.name(), out);
            }
            Codec::Http(http) => http.close(reason, out),
            Codec::Frames => {}
        }
    }

    /// Which of a broadcast's encodings this connection reads; `None`: not pushable.
    pub(super) fn form(&self) -> Option<Form> {
        match self {
            Codec::Frames => Some(Form::Frame),
            Codec::WebSocket(ws) => ws.form,
            Codec::Http(_) => None,
        }
    }

    pub(super) fn idle(&self) -> Idle {
        match self {
            Codec::Frames | Codec::WebSocket(_) => Idle::Session,
            Codec::Http(http) => Idle::Http {
                request_since: http.request_since(),
                answers_due: http.answers_due(),
            },
        }
    }
}

/// One binary frame from the front of `data`.
fn decode_frame(data: &[u8], cx: &mut Cx<'_>) -> Step {
    match hongbao_proto::check(data) {
        Ok(None) => Step::read(0, None),
        Ok(Some(len)) => {
            let frame = hongbao_proto::decode(&data[..len]);
            Step::read(len, Some(inbound_of(frame, version_of(data))))
        }
        Err(e) => {
            cx.stats.bad_frames += 1;
            Step {
                used: data.len(),
                inbound: None,
                then: Then::Kick(KickReason::BadFrame, e.to_string()),
            }
        }
    }
}

impl WsCodec {
    /// Control frames are answered here; decoding stops after each data message, whose
    /// form the reply follows.
    fn decode(&mut self, data: &mut [u8], cx: &mut Cx<'_>) -> Step {
        let mut inbound = None;
        let mut then = Then::Read;
        let mut form = self.form;
        let decoded = ws::decode_each(
            Role::Server,
            data,
            &mut self.partial,
            Limits::HONGBAO,
            |m| {
                match m {
                    Incoming::Binary(bytes) => match hongbao_proto::decode(bytes) {
                        Err(e) if e.is_fatal() => {
                            cx.stats.bad_frames += 1;
                            form = Some(Form::WsBinary);
                            then = Then::Kick(KickReason::BadFrame, e.to_string());
                        }
                        frame => {
                            form = Some(Form::WsBinary);
                            inbound = Some(inbound_of(frame, version_of(bytes)));
                        }
                    },
                    Incoming::Text(text) => {
                        form = Some(Form::WsText);
                        inbound = Some(match json::from_json(text) {
                            Ok(frame) => inbound_of(Ok(frame), VERSION),
                            Err(e) => Inbound::Refused {
                                id: e.request_id.unwrap_or(0),
                                result: e.result_code(),
                                text: e.to_string(),
                                bearer: None,
                            },
                        });
                    }
                    Incoming::Ping(payload) => {
                        ws::encode(Role::Server, Opcode::Pong, payload, cx.out);
                        return ControlFlow::Continue(());
                    }
                    Incoming::Pong(_) => return ControlFlow::Continue(()),
                    Incoming::Close { code, .. } => {
                        match code {
                            Some(code) => ws::close_frame(Role::Server, code, "", cx.out),
                            None => ws::encode(Role::Server, Opcode::Close, &[], cx.out),
                        }
                        then = Then::HangUp;
                    }
                }
                ControlFlow::Break(())
            },
        );
        self.form = form;
        match decoded {
            Ok(used) if then == Then::Read => Step::read(used, inbound),
            Ok(used) => Step {
                used,
                inbound: None,
                then,
            },
            Err(violation) => {
                cx.stats.bad_frames += 1;
                ws::close_frame(Role::Server, violation.code, violation.reason, cx.out);
                Step {
                    used: data.len(),
                    inbound: None,
                    then: Then::HangUp,
                }
            }
        }
    }
}

/// The version byte of a whole frame (`check` has read it: 1 or 2).
fn version_of(frame: &[u8]) -> u8 {
    frame.get(4).copied().unwrap_or(VERSION)
}

/// A decoded frame of protocol `version` as a request, or the refusal a well-delimited
/// bad frame gets.
fn inbound_of(frame: Result<Frame, FrameError>, version: u8) -> Inbound {
    match frame {
        Ok(frame) => match request_of(frame.message, version) {
            Ok(request) => Inbound::Request {
                id: frame.request_id,
                request,
                auth: Auth::Connection,
            },
            Err(e) => Inbound::Refused {
                id: frame.request_id,
                result: ResultCode::BadRequest,
                text: e.to_string(),
                bearer: None,
            },
        },
        Err(e) => Inbound::Refused {
            id: e.request_id().unwrap_or(0),
            result: e.result_code().unwrap_or(ResultCode::BadRequest),
            text: e.to_string(),
            bearer: None,
        },
    }
}

/// A message of a kind only servers send, come from a client: its kind.
#[derive(Debug, thiserror::Error)]
#[error("message type {0:#04x} is sent by servers only")]
struct ServerOnly(u8);

/// A client message as a request; server-only kinds are refused. A version-1 login is
/// the old HMAC token's, whatever its bytes.
fn request_of(message: Message, version: u8) -> Result<Request, ServerOnly> {
    Ok(match message {
        Message::Login { user_id, token } => Request::Login {
            user_id,
            token,
            legacy: version == 1,
        },
        Message::Ping { client_time_us } => Request::Ping { client_time_us },
        Message::Shake => Request::Shake,
        Message::Send {
            amount_cents,
            shares,
            recipients,
            idempotency_key,
        } => Request::Send {
            amount_cents,
            shares,
            recipients,
            idempotency_key,
        },
        Message::Open { packet_id } => Request::Open { packet_id },
        Message::Chat { to_user, text } => Request::Chat { to_user, text },
        other => return Err(ServerOnly(other.kind())),
    })
}

fn frame(request_id: u32, message: Message) -> Frame {
    Frame {
        request_id,
        message,
    }
}

/// A reply as a protocol message.
pub(super) fn reply_message(reply: &Reply) -> Message {
    match reply.clone() {
        Reply::Login { result, user_id } => Message::LoginReply { result, user_id },
        Reply::Pong {
            client_time_us,
            server_time_us,
        } => Message::Pong {
            client_time_us,
            server_time_us,
        },
        Reply::Shake {
            result,
            packet_id,
            amount_cents,
            retry_after_ms,
        } => Message::ShakeReply {
            result,
            packet_id,
            amount_cents,
            retry_after_ms,
        },
        Reply::Send {
            result,
            packet_id,
            balance_cents,
        } => Message::SendReply {
            result,
            packet_id,
            balance_cents,
        },
        Reply::Open {
            result,
            packet_id,
            amount_cents,
        } => Message::OpenReply {
            result,
            packet_id,
            amount_cents,
        },
        Reply::Chat { result } => Message::ChatReply { result },
        Reply::Error { result, text } => Message::Error {
            result,
            text,
            retry_after_ms: 0,
        },
        Reply::RateLimited {
            retry_after_ms,
            text,
        } => Message::Error {
            result: ResultCode::RateLimited,
            text,
            retry_after_ms,
        },
        // The binary protocol has no way to ask for these.
        Reply::Me(_) | Reply::Notices(_) => Message::Error {
            result: ResultCode::BadRequest,
            text: "not available over this transport".into(),
            retry_after_ms: 0,
        },
    }
}

/// A push as a protocol message (`from_user` 0: a system campaign's packet).
pub(super) fn push_message(push: &Push) -> Message {
    match push.clone() {
        Push::Notice(n) => Message::PacketNotice {
            packet_id: n.packet_id,
            from_user: n.from_user.map_or(0, UserId::get),
            amount_cents: n.amount_cents,
            shares: n.shares,
            expires_at_ms: n.expires_at_ms,
        },
        Push::Chat { from_user, text } => Message::ChatMessage {
            from_user: from_user.get(),
            text,
        },
        Push::Broadcast {
            server_time_us,
            text,
        } => Message::Broadcast {
            server_time_us,
            text,
        },
        Push::Kick {
            reason,
            text,
            retry_after_ms,
        } => Message::Kick {
            reason,
            text,
            retry_after_ms,
        },
        Push::Refresh { expires_at_ms } => Message::Refresh { expires_at_ms },
    }
}

/// Appends `frame` in `form`.
pub(super) fn encode(form: Form, frame: &Frame, out: &mut Vec<u8>) {
    match form {
        Form::Frame => hongbao_proto::encode(frame, out),
        Form::WsBinary => {
            let inner = hongbao_proto::encode_to_vec(frame);
            ws::encode(Role::Server, Opcode::Binary, &inner, out);
        }
        Form::WsText => ws::encode(
            Role::Server,
            Opcode::Text,
            json::to_json(frame).as_bytes(),
            out,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::WorkerConfig;
    use crate::stats::WorkerCounters;
    use crate::worker::session::Sessions;

    /// A million connections each hold one: it must stay a few words.
    #[test]
    fn a_codec_is_small() {
        assert!(
            std::mem::size_of::<Codec>() <= 16,
            "{}",
            std::mem::size_of::<Codec>()
        );
    }

    fn cfg() -> WorkerConfig {
        WorkerConfig {
            login: crate::link::LoginSetup {
                keys: Vec::new(),
                rules: Default::default(),
                refresh_before_secs: 60,
                hmac_secret: None,
                demo_key: None,
                revoked: Vec::new(),
            },
            shake_limit: crate::limits::Rate::UNLIMITED,
            tls: None,
            trusted_proxies: Vec::new(),
            max_shakes_per_sec: 10,
            max_connections: 10,
            max_unauthenticated: 10,
            max_unauthenticated_per_source: 10,
            max_tls_handshakes: 10,
            tls_handshake_timeout_secs: 10,
            tls_accept_queue_secs: 10,
            login_timeout_secs: 10,
            idle_timeout_secs: 0,
            http_keepalive_secs: 75,
            max_output_bytes: 1 << 16,
            max_queue_ms: 0,
            ready_order: crate::config::ReadyOrder::Adaptive,
            broadcast_yield_ms: 0,
        }
    }

    /// Everything a codec makes of `stream` fed whole, then cut at every offset.
    fn requests(codec: impl Fn() -> Codec, stream: &[u8]) -> Vec<String> {
        let mut seen: Option<Vec<String>> = None;
        for cut in 0..=stream.len() {
            let mut codec = codec();
            let mut got = Vec::new();
            let mut buf = Vec::new();
            let (mut stats, cfg, mut out) = (WorkerCounters::default(), cfg(), Vec::new());
            let sessions = Sessions::new(cfg.login.clone()).unwrap();
            for piece in [&stream[..cut], &stream[cut..]] {
                buf.extend_from_slice(piece);
                loop {
                    let mut cx = Cx {
                        out: &mut out,
                        stats: &mut stats,
                        cfg: &cfg,
                        sessions: &sessions,
                        now: UptimeSecs(0),
                        may_upgrade: true,
                        trusted_peer: false,
                        client: None,
                    };
                    let step = codec.decode(&mut buf, &mut cx);
                    buf.drain(..step.used);
                    if step.then != Then::Read {
                        got.push(format!("{:?}", step.then));
                        break;
                    }
                    match step.inbound {
                        Some(Inbound::Request { id, request, .. }) => {
                            got.push(format!("{id} {request:?}"))
                        }
                        Some(Inbound::Refused { id, result, .. }) => {
                            got.push(format!("{id} refused {}", result.name()))
                        }
                        None if step.used == 0 || buf.is_empty() => break,
                        None => {}
                    }
                }
            }
            match &seen {
                Some(first) => assert_eq!(first, &got, "cut at {cut}"),
                None => seen = Some(got),
            }
        }
        seen.unwrap()
    }

    #[test]
    fn frames_split_anywhere_give_the_same_requests() {
        let mut stream = Vec::new();
        for (id, message) in [
            (1, Message::Shake),
            (2, Message::Open { packet_id: 9 }),
            (
                3,
                Message::ShakeReply {
                    result: ResultCode::Won,
                    packet_id: 1,
                    amount_cents: 1,
                    retry_after_ms: 0,
                },
            ),
        ] {
            hongbao_proto::encode(&frame(id, message), &mut stream);
        }
        stream.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        let got = requests(|| Codec::Frames, &stream);
        assert_eq!(got[0], "1 Shake");
        assert_eq!(got[1], "2 Open { packet_id: 9 }");
        assert_eq!(got[2], "3 refused bad-request");
        assert!(got[3].starts_with("Kick(BadFrame"), "{got:?}");
    }

    #[test]
    fn websocket_messages_set_the_form_of_what_follows() {
        let mut ws = Codec::websocket();
        let mut out = Vec::new();
        assert!(!ws.push(
            &Push::Broadcast {
                server_time_us: 1,
                text: "x".into()
            },
            &mut out
        ));
        let mut stream = Vec::new();
        ws::encode(Role::Client, Opcode::Ping, b"p", &mut stream);
        ws::encode(
            Role::Client,
            Opcode::Text,
            br#"{"type":"shake","id":4}"#,
            &mut stream,
        );
        let (mut stats, cfg) = (WorkerCounters::default(), cfg());
        let sessions = Sessions::new(cfg.login.clone()).unwrap();
        let mut cx = Cx {
            out: &mut out,
            stats: &mut stats,
            cfg: &cfg,
            sessions: &sessions,
            now: UptimeSecs(0),
            may_upgrade: true,
            trusted_peer: false,
            client: None,
        };
        let step = ws.decode(&mut stream, &mut cx);
        assert!(matches!(
            step.inbound,
            Some(Inbound::Request {
                id: 4,
                request: Request::Shake,
                ..
            })
        ));
        assert_eq!(out[0], 0x8a, "the ping was answered");
        assert_eq!(ws.form(), Some(Form::WsText));
    }
}
