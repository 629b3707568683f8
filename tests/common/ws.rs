//! One small blocking WebSocket client for the tests, built on the codec in
//! `hongbao_proto::ws` (the handshake, masked client frames, decoding the server's
//! frames), so that what is under test is the gateway (or nginx in front of it), not a
//! third-party client.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hongbao_proto::ws::{self, Incoming, Limits, Opcode, Role};
use hongbao_proto::{decode, encode_to_vec, json};
use hongbao_proto::{Frame, Message, ResultCode};
use serde_json::{json, Value};

use super::{is_closed, IO_TIMEOUT};

/// What the server sent: a whole message or a control frame, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsEvent {
    Binary(Vec<u8>),
    Text(String),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>, String),
}

impl From<Incoming<'_>> for WsEvent {
    fn from(m: Incoming<'_>) -> WsEvent {
        match m {
            Incoming::Binary(b) => WsEvent::Binary(b.to_vec()),
            Incoming::Text(t) => WsEvent::Text(t.to_owned()),
            Incoming::Ping(b) => WsEvent::Ping(b.to_vec()),
            Incoming::Pong(b) => WsEvent::Pong(b.to_vec()),
            Incoming::Close { code, reason } => WsEvent::Close(code, reason.to_owned()),
        }
    }
}

/// A WebSocket client over a blocking `TcpStream`. Like `hongbao_proto::client::Client`,
/// it keeps what arrived while it waited for something else (`skipped`), and hands that
/// out first; nothing received is dropped. It logs in with tokens of `secret`.
pub struct WsClient {
    stream: TcpStream,
    /// Bytes read that do not make a whole frame yet.
    inbuf: Vec<u8>,
    /// A fragmented message from the server (it never sends one; the codec allows it).
    partial: Option<Box<ws::Partial>>,
    /// Decoded from the wire, not yet looked at.
    decoded: VecDeque<WsEvent>,
    /// Looked at by `wait_for` and passed over, oldest first.
    skipped: VecDeque<WsEvent>,
    /// The request id `fresh_id` gives next (a test that numbered requests itself moves
    /// it on).
    pub next_request_id: u32,
    secret: String,
}

/// A fresh 16-byte handshake nonce; unique per call, which is all a test needs.
pub fn fresh_key() -> [u8; 16] {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&n.to_be_bytes());
    key[8..].copy_from_slice(&t.to_be_bytes());
    key
}

impl WsClient {
    /// Connects to `addr` and upgrades `/ws` (with `client_request` / `check_response`,
    /// which checks the `Sec-WebSocket-Accept`); logs in later with tokens of `secret`.
    pub fn connect(addr: SocketAddr, secret: &str) -> WsClient {
        let mut stream = TcpStream::connect(addr).expect("connecting to the WebSocket port");
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let key = fresh_key();
        stream
            .write_all(&ws::client_request(&addr.to_string(), "/ws", &key))
            .unwrap();
        let mut inbuf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match ws::check_response(&inbuf, &key) {
                Ok(Some(n)) => {
                    inbuf.drain(..n);
                    break;
                }
                Ok(None) => {}
                Err(e) => panic!(
                    "WebSocket handshake failed: {e}: {:?}",
                    String::from_utf8_lossy(&inbuf)
                ),
            }
            let n = stream
                .read(&mut chunk)
                .expect("reading the handshake response");
            assert!(n > 0, "the server closed during the handshake");
            inbuf.extend_from_slice(&chunk[..n]);
        }
        WsClient {
            stream,
            inbuf,
            partial: None,
            decoded: VecDeque::new(),
            skipped: VecDeque::new(),
            next_request_id: 1,
            secret: secret.into(),
        }
    }

    pub fn set_read_timeout(&self, timeout: Duration) {
        self.stream.set_read_timeout(Some(timeout)).unwrap();
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// One masked, unfragmented message or control frame.
    pub fn send(&mut self, opcode: Opcode, payload: &[u8]) -> io::Result<()> {
        let mut out = Vec::new();
        ws::encode(Role::Client, opcode, payload, &mut out);
        self.send_raw(&out)
    }

    pub fn send_text(&mut self, text: &str) {
        self.send(Opcode::Text, text.as_bytes())
            .expect("sending text");
    }

    pub fn fresh_id(&mut self) -> u32 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        id
    }

    /// The next event off the wire (not from `skipped`).
    pub fn read_event(&mut self) -> io::Result<WsEvent> {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(event) = self.decoded.pop_front() {
                return Ok(event);
            }
            let mut got = Vec::new();
            let used = ws::decode(
                Role::Client,
                &mut self.inbuf,
                &mut self.partial,
                Limits::HONGBAO,
                |m| got.push(WsEvent::from(m)),
            )
            .map_err(|v| io::Error::new(ErrorKind::InvalidData, v))?;
            self.inbuf.drain(..used);
            if !got.is_empty() {
                self.decoded.extend(got);
                continue;
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!(
                        "server closed the connection ({} bytes of a frame buffered)",
                        self.inbuf.len()
                    ),
                ));
            }
            self.inbuf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next event: one passed over earlier, or the next off the wire.
    pub fn recv(&mut self) -> io::Result<WsEvent> {
        match self.skipped.pop_front() {
            Some(event) => Ok(event),
            None => self.read_event(),
        }
    }

    pub fn expect_event(&mut self, what: &str) -> WsEvent {
        self.recv()
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}"))
    }

    /// The first event `wanted` accepts; the others stay queued. A close frame while
    /// waiting is an error (nothing more is coming).
    pub fn wait_for(&mut self, what: &str, wanted: impl Fn(&WsEvent) -> bool) -> WsEvent {
        if let Some(at) = self.skipped.iter().position(&wanted) {
            return self.skipped.remove(at).expect("position is in range");
        }
        loop {
            let event = self.read_event().unwrap_or_else(|e| {
                panic!("waiting for {what}: {e}; passed over {:?}", self.skipped)
            });
            if wanted(&event) {
                return event;
            }
            if let WsEvent::Close(..) = event {
                panic!(
                    "waiting for {what}, got {event:?}; passed over {:?}",
                    self.skipped
                );
            }
            self.skipped.push_back(event);
        }
    }

    // --- binary messages: one protocol frame each ---

    /// Sends `message` as a binary message under a fresh request id; returns the id.
    pub fn send_binary(&mut self, message: &Message) -> u32 {
        let request_id = self.fresh_id();
        let frame = Frame {
            request_id,
            message: message.clone(),
        };
        self.send(Opcode::Binary, &encode_to_vec(&frame))
            .expect("sending a binary message");
        request_id
    }

    /// Sends `message` as binary and waits for the binary reply with its request id.
    pub fn request_binary(&mut self, message: &Message) -> Message {
        let id = self.send_binary(message);
        self.wait_binary(&format!("the binary reply to {message:?}"), id)
            .message
    }

    pub fn wait_binary(&mut self, what: &str, request_id: u32) -> Frame {
        let event = self.wait_for(what, |e| match e {
            WsEvent::Binary(b) => decode(b).is_ok_and(|f| f.request_id == request_id),
            _ => false,
        });
        let WsEvent::Binary(bytes) = event else {
            unreachable!("wait_for returned what it was asked for")
        };
        decode(&bytes).expect("decoded before")
    }

    pub fn next_push_binary(&mut self) -> Message {
        self.wait_binary("a binary push", 0).message
    }

    pub fn login_binary(&mut self, user_id: u64) {
        let token = super::token(&self.secret, user_id).into_bytes();
        let reply = self.request_binary(&Message::Login { user_id, token });
        assert_eq!(
            reply,
            Message::LoginReply {
                result: ResultCode::Ok,
                user_id
            },
            "binary login of user {user_id}"
        );
    }

    // --- text messages: one JSON object each ---

    /// Sends `request` (a JSON object without `"id"`) as a text message under a fresh
    /// request id, and waits for the text reply carrying that id. The reply must also be
    /// what `json::from_json` reads.
    pub fn request_json(&mut self, mut request: Value) -> Value {
        let id = self.fresh_id();
        request["id"] = json!(id);
        self.send_text(&request.to_string());
        self.wait_json(&format!("the JSON reply to {request}"), id)
    }

    pub fn wait_json(&mut self, what: &str, id: u32) -> Value {
        let event = self.wait_for(what, |e| match e {
            WsEvent::Text(t) => serde_json::from_str::<Value>(t).is_ok_and(|v| v["id"] == id),
            _ => false,
        });
        let WsEvent::Text(text) = event else {
            unreachable!("wait_for returned what it was asked for")
        };
        if let Err(e) = json::from_json(&text) {
            panic!("the server wrote JSON its own codec refuses: {e}: {text}");
        }
        serde_json::from_str(&text).expect("parsed before")
    }

    /// The JSON reply to request `id`, or a push if one comes first.
    pub fn request_or_push_json(&mut self, id: u32) -> Value {
        let event = self.wait_for("a JSON reply or push", |e| match e {
            WsEvent::Text(t) => serde_json::from_str::<Value>(t)
                .is_ok_and(|v| v["id"] == id || v["id"] == 0 || v.get("id").is_none()),
            _ => false,
        });
        let WsEvent::Text(text) = event else {
            unreachable!("wait_for returned what it was asked for")
        };
        serde_json::from_str(&text).expect("parsed before")
    }

    pub fn next_push_json(&mut self) -> Value {
        self.wait_json("a JSON push", 0)
    }

    /// A JSON login request for `user` with the right token, without an `"id"`.
    pub fn login_request(&self, user: u64) -> Value {
        json!({
            "type": "login",
            "user_id": user,
            "token": super::token(&self.secret, user),
        })
    }

    pub fn login_json(&mut self, user_id: u64) {
        let reply = self.request_json(self.login_request(user_id));
        assert_eq!(reply["type"], "login_reply", "{reply}");
        assert_eq!(reply["result"], "ok", "{reply}");
        assert_eq!(reply["user_id"], user_id, "{reply}");
    }

    // --- the end ---

    /// The next event must be a close frame with `code`; returns its reason.
    pub fn expect_close(&mut self, code: u16) -> String {
        match self.expect_event(&format!("a close frame with code {code}")) {
            WsEvent::Close(Some(got), reason) => {
                assert_eq!(got, code, "close code (reason {reason:?})");
                reason
            }
            other => panic!("expected a close frame with code {code}, got {other:?}"),
        }
    }

    /// The server has closed the TCP connection: the next read sees its end.
    pub fn expect_eof(&mut self) {
        match self.recv() {
            Err(e) if is_closed(&e) => {}
            other => panic!("expected the server to close the connection, got {other:?}"),
        }
    }
}
