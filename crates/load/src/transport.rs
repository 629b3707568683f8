//! How a load client's bytes carry what a user asks: over raw TCP, protocol frames back to
//! back; over WebSocket, one frame per masked binary message (docs/protocol.md,
//! "WebSocket transport"); over HTTP, the REST API's requests and responses
//! (docs/http-api.md). No I/O: `client/` owns the sockets and buffers, this turns bytes
//! into [`Inbound`] events and asks into bytes, so the client has one read path and one
//! write path with the transport as a parameter.
//!
//! A WebSocket connection first upgrades: [`upgrade_request`] with a fresh random key,
//! then `ws::check_response` on what comes back (in `client/receive.rs`; the client holds
//! the key only until the answer is in).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use hongbao_proto::ws::{self, Incoming, Limits, Opcode, Role, Violation};
use hongbao_proto::{Frame, FrameError};
use serde::{Deserialize, Serialize};

/// The path the load asks to upgrade (the gateway upgrades any path).
pub const WS_PATH: &str = "/ws";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    #[default]
    Tcp,
    Ws,
    Http,
}

/// A name the option does not take: which option, what it takes, what it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} must be {takes}, not {given:?}")]
pub struct UnknownName {
    what: &'static str,
    takes: &'static str,
    given: String,
}

impl FromStr for Transport {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Transport, UnknownName> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "ws" => Ok(Transport::Ws),
            "http" => Ok(Transport::Http),
            other => Err(UnknownName {
                what: "transport",
                takes: "tcp, ws or http",
                given: other.to_string(),
            }),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Ws => "ws",
            Transport::Http => "http",
        })
    }
}

/// How HTTP users use connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HttpConnection {
    /// One connection per user, kept alive.
    #[default]
    KeepAlive,
    /// A new connection per request, asked with `Connection: close`: the server closes
    /// first and keeps the TIME_WAIT.
    Close,
    /// A new connection per request (no `Connection: close`), closed by the client as soon
    /// as the answer is in: the client keeps the TIME_WAIT, so its ports are the wall.
    ClientClose,
}

impl HttpConnection {
    /// A connection per request.
    pub fn per_request(self) -> bool {
        self != HttpConnection::KeepAlive
    }
}

impl FromStr for HttpConnection {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<HttpConnection, UnknownName> {
        match s {
            "keep-alive" => Ok(HttpConnection::KeepAlive),
            "close" => Ok(HttpConnection::Close),
            "client-close" => Ok(HttpConnection::ClientClose),
            other => Err(UnknownName {
                what: "the HTTP connection mode",
                takes: "keep-alive, close or client-close",
                given: other.to_string(),
            }),
        }
    }
}

impl fmt::Display for HttpConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HttpConnection::KeepAlive => "keep-alive",
            HttpConnection::Close => "close",
            HttpConnection::ClientClose => "client-close",
        })
    }
}

/// What an HTTP user asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpAsk {
    Shake,
    Open(u64),
    /// `GET /v1/notices`: HTTP clients get no pushes, they look.
    Notices,
}

/// Appends the HTTP request for `ask`, authenticated by `bearer` (the user's JWT);
/// `Connection: close` when the server is to close after its answer.
pub fn http_request(ask: HttpAsk, bearer: &str, server_closes: bool, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = match ask {
        HttpAsk::Shake => write!(out, "POST /v1/shake HTTP/1.1\r\n"),
        HttpAsk::Open(packet) => write!(out, "POST /v1/packets/{packet}/open HTTP/1.1\r\n"),
        HttpAsk::Notices => write!(out, "GET /v1/notices HTTP/1.1\r\n"),
    };
    let _ = write!(
        out,
        "Host: hongbao\r\nAuthorization: Bearer {bearer}\r\nContent-Length: 0\r\n"
    );
    if server_closes {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A request of the user's own, sent for each firing instead of `POST /v1/shake`: how
/// `hongbao capacity` loads nginx's static answer or an external HTTP target with the
/// load's schedule and intended-time latency. `{user}` (the user id) and `{bearer}`
/// (the user's JWT) are replaced in the path, the header values and the body. An
/// answer 2xx or 3xx counts as a reply (`nothing`), 429 or 503 as `overloaded`, any other
/// status as an error reply. Answers must be `Content-Length` framed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTemplate {
    pub method: String,
    /// Path and query, from `/`.
    pub path: String,
    /// The `Host` header.
    pub host: String,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub body: String,
}

/// Why a request template cannot make a valid request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadTemplate {
    #[error("method {0:?} is not an HTTP method")]
    Method(String),
    #[error("path {0:?} must start with / and hold no spaces or control characters")]
    Path(String),
    #[error("header name {0:?} is not a token")]
    HeaderName(String),
    #[error("header {0} is set by the load itself")]
    LoadsOwn(String),
    #[error("header {0}'s value holds a line break")]
    LineBreak(String),
    #[error("host {0:?} holds spaces or control characters")]
    Host(String),
}

impl RequestTemplate {
    /// Why the template cannot make a valid request, if it cannot.
    pub fn check(&self) -> Result<(), BadTemplate> {
        let token = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        if !token(&self.method) {
            return Err(BadTemplate::Method(self.method.clone()));
        }
        if !self.path.starts_with('/') || self.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(BadTemplate::Path(self.path.clone()));
        }
        for (name, value) in &self.headers {
            if !token(name) {
                return Err(BadTemplate::HeaderName(name.clone()));
            }
            if ["content-length", "host", "connection", "transfer-encoding"]
                .contains(&name.to_ascii_lowercase().as_str())
            {
                return Err(BadTemplate::LoadsOwn(name.clone()));
            }
            if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(BadTemplate::LineBreak(name.clone()));
            }
        }
        if self.host.bytes().any(|b| b <= b' ') {
            return Err(BadTemplate::Host(self.host.clone()));
        }
        Ok(())
    }

    /// Appends the request for `user`.
    pub fn write(&self, user: u64, bearer: &str, server_closes: bool, out: &mut Vec<u8>) {
        use std::io::Write;
        let fill = |s: &str| {
            s.replace("{user}", &user.to_string())
                .replace("{bearer}", bearer)
        };
        let body = fill(&self.body);
        let _ = write!(
            out,
            "{} {} HTTP/1.1\r\nHost: {}\r\n",
            self.method,
            fill(&self.path),
            self.host
        );
        for (name, value) in &self.headers {
            let _ = write!(out, "{name}: {}\r\n", fill(value));
        }
        let _ = write!(out, "Content-Length: {}\r\n", body.len());
        if server_closes {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body.as_bytes());
    }
}

/// Largest HTTP response head the load reads.
const MAX_RESPONSE_HEAD: usize = 8192;
/// Largest HTTP response body the load reads (a notices list).
const MAX_RESPONSE_BODY: usize = 1 << 20;

/// What arrived, in order.
#[derive(Debug, PartialEq)]
pub enum Inbound<'a> {
    Frame(Frame),
    /// A whole frame whose payload does not decode: counted as an error reply; the
    /// connection carries on, as the server does with ours.
    BadFrame,
    /// WebSocket ping: answer with [`pong`].
    Ping(&'a [u8]),
    /// WebSocket text message: we only ever send binary, so the server never should.
    Text,
    /// WebSocket close: nothing after it is read.
    Close,
    /// An HTTP response: its status and JSON body (answers come in request order).
    Response {
        status: u16,
        body: &'a [u8],
    },
}

/// Why the stream cannot be read any further: drop the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// A frame header with a bad length or version.
    Frame(FrameError),
    /// WebSocket rules broken by the server.
    Ws(Violation),
    /// A binary WebSocket message that holds less or more than one whole frame.
    NotOneFrame { len: usize },
    /// An HTTP response that cannot be read.
    Http(&'static str),
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::Frame(e) => write!(f, "while reading a frame from the server: {e}"),
            Broken::Ws(v) => write!(f, "while reading WebSocket frames from the server: {v}"),
            Broken::NotOneFrame { len } => write!(
                f,
                "a {len}-byte binary WebSocket message from the server is not one frame"
            ),
            Broken::Http(why) => write!(f, "while reading an HTTP response: {why}"),
        }
    }
}

impl std::error::Error for Broken {}

/// Reads every complete message at the start of `data`, calling `on` for each; returns
/// how many bytes it used (the rest is part of one message, to keep for the next read).
/// WebSocket frames are unmasked in place; `fragment` carries a fragmented WebSocket
/// message across calls (the gateway never fragments, so it stays `None`).
pub fn decode(
    transport: Transport,
    data: &mut [u8],
    fragment: &mut Option<Box<ws::Partial>>,
    mut on: impl FnMut(Inbound<'_>),
) -> Result<usize, Broken> {
    match transport {
        Transport::Tcp => {
            let mut at = 0;
            while at < data.len() {
                match hongbao_proto::check(&data[at..]) {
                    Ok(Some(len)) => {
                        on(frame(&data[at..at + len]));
                        at += len;
                    }
                    Ok(None) => break,
                    Err(e) => return Err(Broken::Frame(e)),
                }
            }
            Ok(at)
        }
        Transport::Ws => {
            let mut broken = None;
            let used = ws::decode(Role::Client, data, fragment, Limits::HONGBAO, |m| {
                if broken.is_some() {
                    return;
                }
                match m {
                    Incoming::Binary(bytes) => match hongbao_proto::check(bytes) {
                        Ok(Some(len)) if len == bytes.len() => on(frame(bytes)),
                        Ok(_) => broken = Some(Broken::NotOneFrame { len: bytes.len() }),
                        Err(e) => broken = Some(Broken::Frame(e)),
                    },
                    Incoming::Text(_) => on(Inbound::Text),
                    Incoming::Ping(payload) => on(Inbound::Ping(payload)),
                    Incoming::Pong(_) => {}
                    Incoming::Close { .. } => on(Inbound::Close),
                }
            })
            .map_err(Broken::Ws)?;
            match broken {
                Some(b) => Err(b),
                None => Ok(used),
            }
        }
        Transport::Http => {
            let mut at = 0;
            while let Some((status, body, len)) = http_response(&data[at..])? {
                on(Inbound::Response { status, body });
                at += len;
            }
            Ok(at)
        }
    }
}

/// An HTTP response read off the front of a buffer: status, body, bytes used.
type Response<'a> = (u16, &'a [u8], usize);

/// One whole HTTP response from the front of `data`; `None` while incomplete. Heads are
/// read by httparse; bodies are `Content-Length` framed (the gateway's always are).
fn http_response(data: &[u8]) -> Result<Option<Response<'_>>, Broken> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(data) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if data.len() > MAX_RESPONSE_HEAD => {
            return Err(Broken::Http("head too long"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Broken::Http("malformed head")),
    };
    let length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        })
        .ok_or(Broken::Http("no Content-Length"))?;
    if length > MAX_RESPONSE_BODY {
        return Err(Broken::Http("body too long"));
    }
    if data.len() < head + length {
        return Ok(None);
    }
    let status = response.code.unwrap_or(0);
    Ok(Some((status, &data[head..head + length], head + length)))
}

fn frame(bytes: &[u8]) -> Inbound<'static> {
    match hongbao_proto::decode(bytes) {
        Ok(frame) => Inbound::Frame(frame),
        Err(_) => Inbound::BadFrame,
    }
}

/// Appends `frame` as the transport carries it (binary frames or WebSocket; HTTP asks go
/// through [`http_request`]).
pub fn encode(transport: Transport, frame: &Frame, out: &mut Vec<u8>) {
    match transport {
        Transport::Tcp => hongbao_proto::encode(frame, out),
        Transport::Ws => {
            let payload = hongbao_proto::encode_to_vec(frame);
            ws::encode(Role::Client, Opcode::Binary, &payload, out);
        }
        Transport::Http => unreachable!("HTTP carries no frames"),
    }
}

/// The answer to a WebSocket ping.
pub fn pong(payload: &[u8], out: &mut Vec<u8>) {
    ws::encode(Role::Client, Opcode::Pong, payload, out);
}

/// The answer to a WebSocket close, sent on the way out.
pub fn close_reply(out: &mut Vec<u8>) {
    ws::close_frame(Role::Client, ws::close_code::NORMAL, "", out);
}

/// The opening handshake for `server` with `key` (16 random bytes, fresh per connection).
pub fn upgrade_request(server: SocketAddr, key: &[u8; 16]) -> Vec<u8> {
    ws::client_request(&server.to_string(), WS_PATH, key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hongbao_proto::Message;

    fn frames() -> Vec<Frame> {
        vec![
            Frame {
                request_id: 1,
                message: Message::LoginReply {
                    result: hongbao_proto::ResultCode::Ok,
                    user_id: 42,
                },
            },
            Frame {
                request_id: 0,
                message: Message::Broadcast {
                    server_time_us: 1_700_000_000_000_000,
                    text: "新年快乐".into(),
                },
            },
            Frame {
                request_id: 2,
                message: Message::ShakeReply {
                    result: hongbao_proto::ResultCode::Nothing,
                    packet_id: 0,
                    amount_cents: 0,
                    retry_after_ms: 0,
                },
            },
        ]
    }

    /// What the server would send: the frames, with a ping in the middle and (for WS) a
    /// close at the end.
    fn server_stream(transport: Transport) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, f) in frames().iter().enumerate() {
            let bytes = hongbao_proto::encode_to_vec(f);
            match transport {
                Transport::Tcp => out.extend_from_slice(&bytes),
                Transport::Ws => {
                    ws::encode(Role::Server, Opcode::Binary, &bytes, &mut out);
                    if n == 1 {
                        ws::encode(Role::Server, Opcode::Ping, b"hi", &mut out);
                    }
                }
                Transport::Http => unreachable!("HTTP answers are not frames"),
            }
        }
        if transport == Transport::Ws {
            ws::close_frame(Role::Server, ws::close_code::GOING_AWAY, "bye", &mut out);
        }
        out
    }

    #[derive(Debug, PartialEq)]
    enum Got {
        Frame(Frame),
        BadFrame,
        Ping(Vec<u8>),
        Text,
        Close,
    }

    /// Feeds `stream` in two reads cut at `cut`, keeping the unused tail as the client
    /// does.
    fn feed(transport: Transport, stream: &[u8], cut: usize) -> Result<Vec<Got>, Broken> {
        let mut got = Vec::new();
        let mut tail: Vec<u8> = Vec::new();
        let mut fragment = None;
        for read in [&stream[..cut], &stream[cut..]] {
            tail.extend_from_slice(read);
            let used = decode(transport, &mut tail, &mut fragment, |m| {
                got.push(match m {
                    Inbound::Frame(f) => Got::Frame(f),
                    Inbound::BadFrame => Got::BadFrame,
                    Inbound::Ping(p) => Got::Ping(p.to_vec()),
                    Inbound::Text => Got::Text,
                    Inbound::Close => Got::Close,
                    Inbound::Response { .. } => unreachable!("frames only"),
                })
            })?;
            tail.drain(..used);
            if got.last() == Some(&Got::Close) {
                break;
            }
        }
        assert!(tail.is_empty(), "left over: {tail:?}");
        Ok(got)
    }

    #[test]
    fn both_transports_split_at_every_offset() {
        let want_tcp: Vec<Got> = frames().into_iter().map(Got::Frame).collect();
        let mut want_ws: Vec<Got> = frames().into_iter().map(Got::Frame).collect();
        want_ws.insert(2, Got::Ping(b"hi".to_vec()));
        want_ws.push(Got::Close);
        for (transport, want) in [(Transport::Tcp, want_tcp), (Transport::Ws, want_ws)] {
            let stream = server_stream(transport);
            for cut in 0..=stream.len() {
                let got = feed(transport, &stream, cut);
                assert_eq!(got.as_ref(), Ok(&want), "{transport} cut {cut}");
            }
        }
    }

    #[test]
    fn what_we_send_is_what_the_gateway_reads() {
        for f in frames() {
            let mut tcp = Vec::new();
            encode(Transport::Tcp, &f, &mut tcp);
            assert_eq!(tcp, hongbao_proto::encode_to_vec(&f));
            let mut wire = Vec::new();
            encode(Transport::Ws, &f, &mut wire);
            assert_eq!(wire[0], 0x82, "final binary frame");
            assert_ne!(wire[1] & 0x80, 0, "masked");
            let mut got = Vec::new();
            let used = ws::decode(Role::Server, &mut wire, &mut None, Limits::HONGBAO, |m| {
                if let Incoming::Binary(b) = m {
                    got.push(b.to_vec())
                }
            });
            assert_eq!(used, Ok(wire.len()));
            assert_eq!(got, [tcp]);
        }
        let mut p = Vec::new();
        pong(b"hi", &mut p);
        assert_eq!((p[0], p[1] & 0x7f), (0x8a, 2));
        let mut c = Vec::new();
        close_reply(&mut c);
        assert_eq!((c[0], c[1] & 0x7f), (0x88, 2));
    }

    #[test]
    fn broken_streams() {
        // A WS binary message holding a frame and a half, or half a frame.
        let bytes = hongbao_proto::encode_to_vec(&frames()[0]);
        for payload in [
            [&bytes[..], &bytes[..3]].concat(),
            bytes[..bytes.len() - 1].to_vec(),
        ] {
            let mut out = Vec::new();
            ws::encode(Role::Server, Opcode::Binary, &payload, &mut out);
            assert_eq!(
                feed(Transport::Ws, &out, 0),
                Err(Broken::NotOneFrame { len: payload.len() })
            );
        }
        // A masked server frame.
        let mut masked = Vec::new();
        ws::encode(Role::Client, Opcode::Binary, &bytes, &mut masked);
        assert!(matches!(
            feed(Transport::Ws, &masked, 0),
            Err(Broken::Ws(_))
        ));
        // A bad length prefix over TCP, after a good frame that is still delivered.
        let mut tcp = bytes.clone();
        tcp.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 1]);
        let mut got = 0;
        let r = decode(Transport::Tcp, &mut tcp, &mut None, |_| got += 1);
        assert!(matches!(r, Err(Broken::Frame(FrameError::TooLong { .. }))));
        assert_eq!(got, 1);
        // A whole frame of an unknown kind: counted, not fatal.
        let mut odd = vec![0, 0, 0, 6, hongbao_proto::VERSION, 0xee, 0, 0, 0, 9];
        let mut events = Vec::new();
        let used = decode(Transport::Tcp, &mut odd, &mut None, |m| {
            events.push(m == Inbound::BadFrame)
        });
        assert_eq!((used, events), (Ok(10), vec![true]));
        // Text from the gateway is surfaced, not fatal.
        let mut text = Vec::new();
        ws::encode(Role::Server, Opcode::Text, b"{}", &mut text);
        assert_eq!(feed(Transport::Ws, &text, 1), Ok(vec![Got::Text]));
    }

    /// A template's request is what an HTTP parser reads, placeholders filled; a template
    /// that could not make one is refused.
    #[test]
    fn request_templates_fill_and_check() {
        let t = RequestTemplate {
            method: "POST".into(),
            path: "/api/{user}?x=1".into(),
            host: "example.test:8080".into(),
            headers: vec![
                ("Authorization".into(), "Bearer {bearer}".into()),
                ("Content-Type".into(), "application/json".into()),
            ],
            body: r#"{"user":{user}}"#.into(),
        };
        assert_eq!(t.check(), Ok(()));
        let mut out = Vec::new();
        t.write(42, "42.ff", false, &mut out);
        let parsed = hongbao_proto::http::parse(&out, 1024).unwrap().unwrap();
        assert_eq!((parsed.method, parsed.path), ("POST", "/api/42"));
        assert_eq!(parsed.authorization, Some("Bearer 42.ff"));
        assert_eq!(&*parsed.body, br#"{"user":42}"#);
        for bad in [
            RequestTemplate {
                method: "GE T".into(),
                ..t.clone()
            },
            RequestTemplate {
                path: "api".into(),
                ..t.clone()
            },
            RequestTemplate {
                path: "/a b".into(),
                ..t.clone()
            },
            RequestTemplate {
                headers: vec![("X".into(), "a\r\nb".into())],
                ..t.clone()
            },
            RequestTemplate {
                headers: vec![("Content-Length".into(), "3".into())],
                ..t.clone()
            },
            RequestTemplate {
                headers: vec![("a b".into(), "1".into())],
                ..t.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    /// What the load asks over HTTP is what the gateway's parser reads, and responses split
    /// anywhere come out whole, in order.
    #[test]
    fn http_requests_and_responses() {
        let mut req = Vec::new();
        http_request(HttpAsk::Open(9), "7.ab", true, &mut req);
        let parsed = hongbao_proto::http::parse(&req, 1024).unwrap().unwrap();
        assert_eq!((parsed.method, parsed.path), ("POST", "/v1/packets/9/open"));
        assert_eq!(parsed.authorization, Some("Bearer 7.ab"));
        assert!(!parsed.keep_alive);
        let mut kept = Vec::new();
        http_request(HttpAsk::Shake, "7.ab", false, &mut kept);
        assert!(
            hongbao_proto::http::parse(&kept, 1024)
                .unwrap()
                .unwrap()
                .keep_alive
        );
        for mode in [
            HttpConnection::KeepAlive,
            HttpConnection::Close,
            HttpConnection::ClientClose,
        ] {
            assert_eq!(mode.to_string().parse(), Ok(mode));
        }
        assert!("short".parse::<HttpConnection>().is_err());
        let mut stream = Vec::new();
        for body in [&br#"{"result":"won"}"#[..], br#"{"result":"nothing"}"#] {
            hongbao_proto::http::response(200, "application/json", &[], body, false, &mut stream);
        }
        for cut in 0..=stream.len() {
            let mut got = Vec::new();
            let mut tail = Vec::new();
            for piece in [&stream[..cut], &stream[cut..]] {
                tail.extend_from_slice(piece);
                let used = decode(Transport::Http, &mut tail, &mut None, |m| {
                    if let Inbound::Response { status, body } = m {
                        got.push((status, body.to_vec()));
                    }
                })
                .unwrap();
                tail.drain(..used);
            }
            assert_eq!(got.len(), 2, "cut {cut}");
            assert_eq!(got[1].1, br#"{"result":"nothing"}"#);
        }
        assert!(decode(
            Transport::Http,
            &mut b"HTTP/1.1 200 OK\r\n\r\n".to_vec(),
            &mut None,
            |_| {}
        )
        .is_err());
    }

    #[test]
    fn upgrade_request_is_accepted() {
        let key = [7u8; 16];
        let req = upgrade_request("127.0.0.1:7002".parse().unwrap(), &key);
        let ws::Handshake::Upgrade { consumed, response } = ws::accept(&req) else {
            panic!("not an upgrade");
        };
        assert_eq!(consumed, req.len());
        assert_eq!(
            ws::check_response(&response, &key),
            Ok(Some(response.len()))
        );
        assert_eq!("ws".parse(), Ok(Transport::Ws));
        assert_eq!("http".parse(), Ok(Transport::Http));
        assert_eq!(Transport::default().to_string(), "tcp");
        assert!("udp".parse::<Transport>().is_err());
    }
}
