//! End-to-end tests of the WebSocket gateway (`hongbao serve --ws-listen`): the real
//! binary with two gateway workers, real sockets on `127.0.0.1:0`, the admin API over
//! HTTP, and a ledger in a temporary directory. Each test starts its own server (they run
//! in parallel) and a `Server` guard SIGKILLs it when the test ends.
//!
//! The WebSocket client (`common::WsClient`) is deliberately small and blocking, built on
//! the codec in `hongbao_proto::ws`, so what is under test is the gateway, not a
//! third-party client. Malformed input (unmasked frames, fragments, oversized headers)
//! goes out as raw bytes built by `raw_frame`.
//!
//! The server runs with the development secret (on loopback, where it may); the test of
//! plain HTTP turns the demo log-in (`GET /token`) on.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{fresh_key, is_closed, wait_until, Serve, WsClient, WsEvent, IO_TIMEOUT};
use hongbao_proto::client::Client;
use hongbao_proto::ws::{self, Opcode};
use hongbao_proto::{decode, encode_to_vec};
use hongbao_proto::{Frame, KickReason, Message, ResultCode};
use serde_json::{json, Value};

/// First-byte bits and opcodes of a WebSocket frame (RFC 6455 §5.2).
const FIN: u8 = 0x80;
const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
/// The mask of every raw client frame; the value does not matter, only that there is one.
const MASK: [u8; 4] = [0x5a, 0x1c, 0xe7, 0x03];

/// The RFC 6455 §1.3 sample key and the accept it must get.
const RFC_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const RFC_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A raw frame: first byte (FIN, RSV, opcode) as given, payload masked with `mask` if
/// there is one. Any length; nothing is checked.
fn raw_frame(first: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n < 65536 => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let body = out.len();
    out.extend_from_slice(payload);
    if let Some(mask) = mask {
        out.extend_from_slice(&mask);
        // The mask goes before the payload: rotate it in place.
        out[body..].rotate_right(4);
        for (i, b) in out[body + 4..].iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    out
}

/// A masked client frame, as a well-behaved client sends it.
fn masked(first: u8, payload: &[u8]) -> Vec<u8> {
    raw_frame(first, Some(MASK), payload)
}

/// A masked frame header announcing `len` payload bytes, with no payload.
fn header_only(first: u8, len: u64) -> Vec<u8> {
    let mut out = vec![first];
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if len < 65536 {
        out.push(0x80 | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&len.to_be_bytes());
    }
    out.extend_from_slice(&MASK);
    out
}

/// A close frame's payload: code, then reason.
fn close_payload(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    payload
}

// ----- plain HTTP on the WebSocket port ----------------------------------------------

/// An HTTP response read to the end of the connection.
struct HttpReply {
    status: u16,
    head: String,
    body: String,
}

impl HttpReply {
    fn header(&self, name: &str) -> Option<&str> {
        common::header(&self.head, name)
    }
}

/// Sends `request` to the WebSocket port and reads the answer until the server closes
/// the connection; a server that answers but keeps the connection open fails the test.
fn http_on_ws_port(addr: SocketAddr, request: &str) -> HttpReply {
    let mut stream = TcpStream::connect(addr).expect("connecting to the WebSocket port");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut all = Vec::new();
    if let Err(e) = stream.read_to_end(&mut all) {
        panic!(
            "the server did not close the connection after answering {request:?}: {e}; \
             read so far {:?}",
            String::from_utf8_lossy(&all)
        );
    }
    let text = String::from_utf8(all).expect("an HTTP response in UTF-8");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let reply = HttpReply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    };
    if let Some(len) = reply.header("Content-Length") {
        assert_eq!(len.parse::<usize>().unwrap(), reply.body.len(), "{text}");
    }
    reply
}

/// Reads an HTTP response head (up to and including the blank line), byte by byte so
/// nothing after it is consumed.
fn read_http_head(stream: &mut TcpStream) -> HttpReply {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if let Err(e) = stream.read_exact(&mut byte) {
            panic!(
                "reading a response head: {e}; got {:?}",
                String::from_utf8_lossy(&head)
            );
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).expect("a response head in UTF-8");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    HttpReply {
        status,
        head,
        body: String::new(),
    }
}

/// Pings over an upgraded raw socket and reads the (unmasked, short) pong.
fn expect_raw_pong(stream: &mut TcpStream, payload: &[u8]) {
    stream.write_all(&masked(FIN | PING, payload)).unwrap();
    let mut pong = vec![0u8; 2 + payload.len()];
    stream.read_exact(&mut pong).expect("reading the pong");
    assert_eq!(&pong[..2], &[FIN | 0xa, payload.len() as u8]);
    assert_eq!(&pong[2..], payload);
}

/// An upgrade request with the given key and version headers (`None`: left out).
fn upgrade_request(key: Option<&str>, version: Option<&str>) -> String {
    let mut request = "GET /ws HTTP/1.1\r\nHost: server.example.com\r\n\
                       Upgrade: websocket\r\nConnection: Upgrade\r\n"
        .to_string();
    if let Some(key) = key {
        request.push_str(&format!("Sec-WebSocket-Key: {key}\r\n"));
    }
    if let Some(version) = version {
        request.push_str(&format!("Sec-WebSocket-Version: {version}\r\n"));
    }
    request.push_str("\r\n");
    request
}

// ----- shared steps ------------------------------------------------------------------

/// Shakes over binary WebSocket messages until one wins; returns (packet, amount).
fn ws_binary_shake_until_won(client: &mut WsClient) -> (u64, u64) {
    let deadline = Instant::now() + secs(20);
    loop {
        assert!(Instant::now() < deadline, "no shake won in time");
        match client.request_binary(&Message::Shake) {
            Message::ShakeReply {
                result: ResultCode::Won,
                packet_id,
                amount_cents,
                ..
            } => return (packet_id, amount_cents),
            Message::ShakeReply {
                result: ResultCode::Nothing,
                ..
            } => std::thread::sleep(Duration::from_millis(10)),
            other => panic!("unexpected shake reply {other:?}"),
        }
    }
}

/// Shakes over raw TCP until one wins; returns (packet, amount).
fn tcp_shake_until_won(client: &mut Client) -> (u64, u64) {
    let deadline = Instant::now() + secs(20);
    loop {
        assert!(Instant::now() < deadline, "no shake won in time");
        match client.shake().expect("shake over TCP") {
            Message::ShakeReply {
                result: ResultCode::Won,
                packet_id,
                amount_cents,
                ..
            } => return (packet_id, amount_cents),
            Message::ShakeReply {
                result: ResultCode::Nothing,
                ..
            } => std::thread::sleep(Duration::from_millis(10)),
            other => panic!("unexpected shake reply {other:?}"),
        }
    }
}

fn nothing() -> Message {
    Message::ShakeReply {
        result: ResultCode::Nothing,
        packet_id: 0,
        amount_cents: 0,
        retry_after_ms: 0,
    }
}

/// A protocol ping over binary: the pong echoes our time and adds the server's.
fn binary_ping(client: &mut WsClient, client_time_us: u64) {
    match client.request_binary(&Message::Ping { client_time_us }) {
        Message::Pong {
            client_time_us: echoed,
            server_time_us,
        } => {
            assert_eq!(echoed, client_time_us);
            assert!(server_time_us > 0);
        }
        other => panic!("expected a pong, got {other:?}"),
    }
}

// ----- the tests -------------------------------------------------------------------------

#[test]
fn handshakes_refusals_and_plain_http() {
    let server = Serve::new().dev_secret().demo_login().ws().start();

    // The RFC's sample key gets the RFC's sample accept, and the socket then speaks
    // WebSocket: a ping is answered.
    let mut raw = TcpStream::connect(server.ws_addr()).unwrap();
    raw.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    raw.write_all(upgrade_request(Some(RFC_KEY), Some("13")).as_bytes())
        .unwrap();
    let reply = read_http_head(&mut raw);
    assert_eq!(reply.status, 101, "{}", reply.head);
    assert!(
        reply
            .head
            .starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{}",
        reply.head
    );
    assert_eq!(reply.header("Sec-WebSocket-Accept"), Some(RFC_ACCEPT));
    assert!(reply
        .header("Upgrade")
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket")));
    assert!(reply
        .header("Connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("upgrade")));
    // No subprotocol or extension is ever agreed.
    assert_eq!(reply.header("Sec-WebSocket-Extensions"), None);
    assert_eq!(reply.header("Sec-WebSocket-Protocol"), None);
    expect_raw_pong(&mut raw, b"are you there");

    // A request that arrives in pieces, asking for compression the server ignores.
    let mut raw = TcpStream::connect(server.ws_addr()).unwrap();
    raw.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let request = upgrade_request(Some(RFC_KEY), Some("13")).replace(
        "\r\n\r\n",
        "\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n",
    );
    for piece in request.as_bytes().chunks(40) {
        raw.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let reply = read_http_head(&mut raw);
    assert_eq!(reply.status, 101, "{}", reply.head);
    assert_eq!(reply.header("Sec-WebSocket-Accept"), Some(RFC_ACCEPT));
    assert_eq!(reply.header("Sec-WebSocket-Extensions"), None);
    expect_raw_pong(&mut raw, b"in pieces");

    // Frames right behind the request, in the same write, are read too.
    let mut raw = TcpStream::connect(server.ws_addr()).unwrap();
    raw.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut bytes = upgrade_request(Some(RFC_KEY), Some("13")).into_bytes();
    bytes.extend(masked(FIN | PING, b"eager"));
    raw.write_all(&bytes).unwrap();
    assert_eq!(read_http_head(&mut raw).status, 101);
    let mut pong = [0u8; 7];
    raw.read_exact(&mut pong).expect("reading the pong");
    assert_eq!(&pong, b"\x8a\x05eager");

    // Our client's own key, checked by `check_response`; then a ping over it.
    let mut client = server.ws_connect();
    client.send(Opcode::Ping, b"hello").unwrap();
    assert_eq!(
        client.expect_event("a pong"),
        WsEvent::Pong(b"hello".to_vec())
    );

    // Refusals: a status, a one-line body, `Connection: close`, and the end.
    let old = http_on_ws_port(
        server.ws_addr(),
        &upgrade_request(Some(RFC_KEY), Some("12")),
    );
    assert_eq!(old.status, 426, "{}", old.head);
    assert_eq!(old.header("Sec-WebSocket-Version"), Some("13"));
    assert_eq!(old.header("Connection"), Some("close"));
    let keyless = http_on_ws_port(server.ws_addr(), &upgrade_request(None, Some("13")));
    assert_eq!(keyless.status, 400, "{}", keyless.head);
    assert_eq!(keyless.header("Connection"), Some("close"));
    assert_eq!(keyless.body, "no Sec-WebSocket-Key\n");

    // Plain HTTP: the browser page, the demo token, and nothing else (the WebSocket port
    // speaks HTTP/1.1 with keep-alive: these ask it to close).
    let page = http_on_ws_port(
        server.ws_addr(),
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(page.status, 200, "{}", page.head);
    assert!(
        page.header("Content-Type")
            .is_some_and(|t| t.starts_with("text/html")),
        "{}",
        page.head
    );
    assert!(page.body.contains("<"), "not HTML: {}", page.body);

    let token = http_on_ws_port(
        server.ws_addr(),
        "GET /token?user=7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(token.status, 200, "{}", token.head);
    assert_eq!(token.header("Content-Type"), Some("application/json"));
    let body: Value = serde_json::from_str(&token.body).unwrap();
    assert_eq!(body["user_id"], 7);
    let jwt = body["token"].as_str().expect("a token string");
    assert_eq!(jwt.split('.').count(), 3, "a JWT: {jwt}");
    // It is user 7's: it logs in as 7.
    let mut client = server.ws_connect();
    let mut login = client.login_request(7);
    login["token"] = json!(jwt);
    let reply = client.request_json(login);
    assert_eq!(
        (reply["result"].as_str(), reply["user_id"].as_u64()),
        (Some("ok"), Some(7))
    );

    let missing = http_on_ws_port(server.ws_addr(), "GET /nope HTTP/1.0\r\nHost: x\r\n\r\n");
    assert_eq!(missing.status, 404, "{}", missing.head);

    // Header tokens are case-insensitive lists.
    let mut raw = TcpStream::connect(server.ws_addr()).unwrap();
    raw.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let request = format!(
        "GET /anything HTTP/1.1\r\nhost: x\r\nupgrade: WebSocket\r\n\
         connection: keep-alive, upgrade\r\nsec-websocket-key: {RFC_KEY}\r\n\
         sec-websocket-version: 13\r\n\r\n"
    );
    raw.write_all(request.as_bytes()).unwrap();
    let reply = read_http_head(&mut raw);
    assert_eq!(reply.status, 101, "{}", reply.head);
    expect_raw_pong(&mut raw, b"lists");
    let versionless = http_on_ws_port(server.ws_addr(), &upgrade_request(Some(RFC_KEY), None));
    assert_eq!(versionless.status, 426, "{}", versionless.head);

    // More refusals: a head over 8192 bytes, an upgrade that is not a GET, a bad key;
    // plain HTTP that is not a GET, and a demo token for no user.
    let padded = upgrade_request(Some(RFC_KEY), Some("13")).replace(
        "\r\n\r\n",
        &format!("\r\nX-Pad: {}\r\n\r\n", "a".repeat(9000)),
    );
    let huge = http_on_ws_port(server.ws_addr(), &padded);
    assert_eq!(huge.status, 431, "{}", huge.head);
    let post = upgrade_request(Some(RFC_KEY), Some("13")).replacen("GET", "POST", 1);
    assert_eq!(http_on_ws_port(server.ws_addr(), &post).status, 400);
    let short_key = upgrade_request(Some("dGhlIHNhbXBsZQ=="), Some("13"));
    assert_eq!(http_on_ws_port(server.ws_addr(), &short_key).status, 400);
    let post = http_on_ws_port(
        server.ws_addr(),
        "POST / HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(post.status, 405, "{}", post.head);
    let nobody = http_on_ws_port(server.ws_addr(), "GET /token?user=0 HTTP/1.0\r\n\r\n");
    assert_eq!(nobody.status, 400, "{}", nobody.head);

    // The upgraded connections were not disturbed by any of it.
    client.send(Opcode::Ping, b"still").unwrap();
    assert_eq!(
        client.expect_event("a pong"),
        WsEvent::Pong(b"still".to_vec())
    );
}

#[test]
fn binary_messages_carry_protocol_frames() {
    let server = Serve::new().dev_secret().ws().start();
    let mut client = server.ws_connect();

    // Before login, as over TCP: ping works, shake is refused, the connection stays.
    binary_ping(&mut client, 4242);
    match client.request_binary(&Message::Shake) {
        Message::Error { result, .. } => assert_eq!(result, ResultCode::NotLoggedIn),
        other => panic!("shake before login got {other:?}"),
    }
    client.login_binary(11);
    assert_eq!(client.request_binary(&Message::Shake), nothing());
    binary_ping(&mut client, 4243);

    // WebSocket pings are answered with the same payload, empty or not.
    let payload = b"\x00\x01hongbao\xff".to_vec();
    client.send(Opcode::Ping, &payload).unwrap();
    assert_eq!(client.expect_event("a pong"), WsEvent::Pong(payload));
    client.send(Opcode::Ping, b"").unwrap();
    assert_eq!(client.expect_event("a pong"), WsEvent::Pong(vec![]));
    // ... and a 125-byte one, the largest a control frame may carry.
    let long = vec![0xa5; 125];
    client.send(Opcode::Ping, &long).unwrap();
    assert_eq!(client.expect_event("a pong"), WsEvent::Pong(long));
    // Pongs from the client are ignored.
    client.send(Opcode::Pong, b"unasked").unwrap();
    assert_eq!(client.request_binary(&Message::Shake), nothing());

    // Client frames must be masked: an unmasked one is a protocol error, 1002, closed.
    let shake = encode_to_vec(&Frame {
        request_id: 99,
        message: Message::Shake,
    });
    client
        .send_raw(&raw_frame(FIN | BINARY, None, &shake))
        .unwrap();
    client.expect_close(1002);
    client.expect_eof();
}

#[test]
fn text_messages_carry_json() {
    let server = Serve::new().dev_secret().ws().start();
    let mut client = server.ws_connect();

    client.login_json(21);
    let shake = client.request_json(json!({"type": "shake"}));
    assert_eq!(shake["type"], "shake_reply", "{shake}");
    assert_eq!(shake["result"], "nothing", "{shake}");
    assert_eq!(shake["packet_id"], 0, "{shake}");
    let pong = client.request_json(json!({"type": "ping", "client_time_us": 77}));
    assert_eq!(pong["type"], "pong", "{pong}");
    assert_eq!(pong["client_time_us"], 77, "{pong}");
    assert!(pong["server_time_us"].as_u64().unwrap() > 0, "{pong}");

    // Messages that are not valid get an error reply, and the connection stays.
    client.send_text(r#"{"type":"open","id":9}"#);
    let error = client.wait_json("the error for a missing field", 9);
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["result"], "bad-request", "{error}");
    let text = error["text"].as_str().unwrap();
    assert!(text.contains("packet_id"), "{error}");
    client.send_text("this is not JSON");
    let error = client.wait_json("the error for text that is not JSON", 0);
    assert_eq!(
        (&error["type"], &error["result"]),
        (&json!("error"), &json!("bad-request")),
        "{error}"
    );
    client.send_text(r#"{"type":"dance","id":10}"#);
    let error = client.wait_json("the error for an unknown type", 10);
    assert_eq!(error["result"], "unknown-type", "{error}");
    let shake = client.request_json(json!({"type": "shake"}));
    assert_eq!(shake["result"], "nothing", "{shake}");

    // A binary message that is not one whole frame: kick{bad-frame} (binary, the form of
    // the latest message), then close 1008.
    client.send(Opcode::Binary, &[0, 0, 0, 6, 1]).unwrap();
    match client.expect_event("a kick") {
        WsEvent::Binary(bytes) => {
            let frame = decode(&bytes).expect("a kick frame");
            assert_eq!(frame.request_id, 0);
            match frame.message {
                Message::Kick { reason, .. } => assert_eq!(reason, KickReason::BadFrame),
                other => panic!("expected a kick, got {other:?}"),
            }
        }
        other => panic!("expected a binary kick, got {other:?}"),
    }
    assert_eq!(client.expect_close(1008), "bad-frame");
    client.expect_eof();

    // A whole frame and more in one binary message is as bad.
    let mut client = server.ws_connect();
    client.login_json(22);
    let mut bytes = encode_to_vec(&Frame {
        request_id: 5,
        message: Message::Shake,
    });
    bytes.extend_from_slice(&[0, 0, 0]);
    client.send(Opcode::Binary, &bytes).unwrap();
    match client.expect_event("a kick") {
        WsEvent::Binary(bytes) => assert!(matches!(
            decode(&bytes).map(|f| f.message),
            Ok(Message::Kick {
                reason: KickReason::BadFrame,
                ..
            })
        )),
        other => panic!("expected a binary kick, got {other:?}"),
    }
    assert_eq!(client.expect_close(1008), "bad-frame");
    client.expect_eof();

    // A wrong token over JSON: login_reply{bad-token}, a JSON kick, close 1008.
    let mut client = server.ws_connect();
    let mut login = client.login_request(23);
    login["token"] = json!(common::token("not the secret", 23));
    let reply = client.request_json(login);
    assert_eq!(reply["type"], "login_reply", "{reply}");
    assert_eq!(reply["result"], "bad-token", "{reply}");
    let kick = client.next_push_json();
    assert_eq!(kick["type"], "kick", "{kick}");
    assert_eq!(kick["reason"], "bad-token", "{kick}");
    assert_eq!(client.expect_close(1008), "bad-token");
    client.expect_eof();
}

#[test]
fn fragmented_messages_are_assembled_around_pings() {
    let server = Serve::new().dev_secret().ws().start();
    let mut client = server.ws_connect();

    // A JSON login in three fragments, each in its own write, with a ping between the
    // second and the last: the ping is answered at once, then the login.
    let mut login = client.login_request(31);
    login["id"] = json!(1);
    let text = login.to_string();
    let (a, rest) = text.split_at(10);
    let (b, c) = rest.split_at(rest.len() / 2);
    for frame in [
        masked(TEXT, a.as_bytes()),
        masked(CONTINUATION, b.as_bytes()),
        masked(FIN | PING, b"mid-message"),
        masked(FIN | CONTINUATION, c.as_bytes()),
    ] {
        client.send_raw(&frame).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(
        client.expect_event("the pong"),
        WsEvent::Pong(b"mid-message".to_vec())
    );
    let reply = client.wait_json("the login reply", 1);
    assert_eq!(
        (&reply["type"], &reply["result"]),
        (&json!("login_reply"), &json!("ok")),
        "{reply}"
    );
    client.next_request_id = 2;

    // UTF-8 is checked after assembly: a character split across fragments is fine.
    let chat = json!({"type": "chat", "id": 2, "to_user": 999, "text": "新年快乐 🧧"}).to_string();
    let cut = chat.find('年').unwrap() + 1; // inside 年
    let mut bytes = masked(TEXT, &chat.as_bytes()[..cut]);
    bytes.extend(masked(FIN | CONTINUATION, &chat.as_bytes()[cut..]));
    client.send_raw(&bytes).unwrap();
    let reply = client.wait_json("the chat reply", 2);
    assert_eq!(reply["type"], "chat_reply", "{reply}");
    assert_eq!(reply["result"], "offline", "{reply}");

    // A binary shake in three fragments with a ping between, all in one write.
    let frame = encode_to_vec(&Frame {
        request_id: 77,
        message: Message::Shake,
    });
    let mut bytes = masked(BINARY, &frame[..3]);
    bytes.extend(masked(CONTINUATION, &frame[3..7]));
    bytes.extend(masked(FIN | PING, b"again"));
    bytes.extend(masked(FIN | CONTINUATION, &frame[7..]));
    client.send_raw(&bytes).unwrap();
    assert_eq!(
        client.expect_event("the pong"),
        WsEvent::Pong(b"again".to_vec())
    );
    match client.expect_event("the shake reply") {
        WsEvent::Binary(bytes) => assert_eq!(
            decode(&bytes).unwrap(),
            Frame {
                request_id: 77,
                message: nothing()
            }
        ),
        other => panic!("expected a binary shake reply, got {other:?}"),
    }

    // The same, each fragment in its own write.
    let frame = encode_to_vec(&Frame {
        request_id: 78,
        message: Message::Shake,
    });
    for bytes in [
        masked(BINARY, &frame[..1]),
        masked(FIN | PING, b""),
        masked(CONTINUATION, &frame[1..9]),
        masked(FIN | CONTINUATION, &frame[9..]),
    ] {
        client.send_raw(&bytes).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(client.expect_event("the pong"), WsEvent::Pong(vec![]));
    match client.expect_event("the shake reply") {
        WsEvent::Binary(bytes) => assert_eq!(decode(&bytes).unwrap().request_id, 78),
        other => panic!("expected a binary shake reply, got {other:?}"),
    }
}

#[test]
fn size_utf8_and_close_rules() {
    let server = Serve::new().dev_secret().ws().start();

    // A text message announcing 40,000 bytes is refused from its header alone: 1009.
    let mut client = server.ws_connect();
    client.login_json(41);
    client.send_raw(&header_only(FIN | TEXT, 40_000)).unwrap();
    client.expect_close(1009);
    client.expect_eof();

    // So is a binary message one byte over a whole maximal frame, even as a fragment.
    let mut client = server.ws_connect();
    client.login_binary(42);
    client
        .send_raw(&header_only(BINARY, 4 + 16 * 1024 + 1))
        .unwrap();
    client.expect_close(1009);
    client.expect_eof();

    // Right at the limits is fine: a 32,768-byte text message (a shake padded with
    // spaces), and a 16,388-byte binary one (a maximal frame of an unknown type, which
    // gets an error reply and leaves the connection open).
    let mut client = server.ws_connect();
    client.login_json(47);
    let mut text = r#"{"type":"shake","id":5}"#.to_string();
    text.push_str(&" ".repeat(32 * 1024 - text.len()));
    client.send_text(&text);
    let shake = client.wait_json("the reply to a maximal text message", 5);
    assert_eq!(shake["result"], "nothing", "{shake}");
    let mut frame = (16 * 1024u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&[1, 0x7f, 0, 0, 0, 6]);
    frame.resize(4 + 16 * 1024, 0);
    client.send(Opcode::Binary, &frame).unwrap();
    match client
        .wait_binary("the reply to a maximal binary message", 6)
        .message
    {
        Message::Error { result, .. } => assert_eq!(result, ResultCode::UnknownType),
        other => panic!("expected an error reply, got {other:?}"),
    }
    client.next_request_id = 7;
    assert_eq!(client.request_binary(&Message::Shake), nothing());
    // One byte over, announced in a first fragment: 1009.
    let mut over = masked(TEXT, &[b' '; 100]);
    over.extend(header_only(FIN | CONTINUATION, 32 * 1024 - 100 + 1));
    client.send_raw(&over).unwrap();
    client.expect_close(1009);
    client.expect_eof();

    // A text message that is not UTF-8: 1007.
    let mut client = server.ws_connect();
    client.login_json(43);
    client
        .send_raw(&masked(
            FIN | TEXT,
            b"{\"type\":\"chat\",\"id\":3,\"to_user\":1,\"text\":\"\xff\xfe\"}",
        ))
        .unwrap();
    client.expect_close(1007);
    client.expect_eof();

    // The client closes with 1000: the server answers with a close and closes.
    let mut client = server.ws_connect();
    client.login_json(44);
    client
        .send_raw(&masked(FIN | CLOSE, &close_payload(1000, "bye")))
        .unwrap();
    client.expect_close(1000);
    client.expect_eof();

    // An empty close gets an empty close.
    let mut client = server.ws_connect();
    client.login_binary(45);
    client.send_raw(&masked(FIN | CLOSE, b"")).unwrap();
    assert_eq!(
        client.expect_event("the close"),
        WsEvent::Close(None, String::new())
    );
    client.expect_eof();
}

#[test]
fn a_client_close_code_is_echoed() {
    // docs/protocol.md: "the gateway answers with a close frame echoing its code".
    let server = Serve::new().dev_secret().ws().start();
    let mut client = server.ws_connect();
    client.login_json(46);
    // 1001 is what browsers send when the page goes away.
    client
        .send_raw(&masked(FIN | CLOSE, &close_payload(1001, "")))
        .unwrap();
    client.expect_close(1001);
    client.expect_eof();
}

#[test]
fn money_crosses_between_tcp_and_websocket() {
    let server = Serve::new().dev_secret().ws().start();
    let mut tcp = server.login(61);
    let mut json_user = server.ws_connect();
    json_user.login_json(62);
    server.shake_campaign(40, 500, 1000, 2000);

    // TCP wins, sends to the JSON user, who is told, opens, and is credited.
    let (_, won) = tcp_shake_until_won(&mut tcp);
    assert!((1000..=2000).contains(&won), "won {won}");
    let send = tcp.send_packet(600, 1, &[62]).expect("send over TCP");
    let Message::SendReply {
        result: ResultCode::Ok,
        packet_id,
        balance_cents,
    } = send
    else {
        panic!("send over TCP got {send:?}");
    };
    assert_eq!(balance_cents, won - 600);
    let notice = json_user.next_push_json();
    assert_eq!(notice["type"], "packet_notice", "{notice}");
    assert_eq!(notice["packet_id"], packet_id, "{notice}");
    assert_eq!(notice["from_user"], 61, "{notice}");
    assert_eq!(notice["amount_cents"], 600, "{notice}");
    assert_eq!(notice["shares"], 1, "{notice}");
    let opened = json_user.request_json(json!({"type": "open", "packet_id": packet_id}));
    assert_eq!(opened["type"], "open_reply", "{opened}");
    assert_eq!(opened["result"], "opened", "{opened}");
    assert_eq!(opened["packet_id"], packet_id, "{opened}");
    assert_eq!(opened["amount_cents"], 600, "{opened}");
    assert_eq!(server.balance(62), 600);
    assert_eq!(server.balance(61), won - 600);
    let view = server.get("/v1/users/62");
    assert_eq!(view["recent_events"][0]["kind"], "share_opened", "{view:#}");
    server.audit();

    // The other way: a WebSocket-binary user wins, sends to a TCP user.
    let mut binary_user = server.ws_connect();
    binary_user.login_binary(63);
    let mut tcp_receiver = server.login(64);
    let (_, won) = ws_binary_shake_until_won(&mut binary_user);
    match binary_user.request_binary(&Message::Send {
        amount_cents: 300,
        shares: 1,
        recipients: vec![64],
        idempotency_key: None,
    }) {
        Message::SendReply {
            result: ResultCode::Ok,
            packet_id,
            balance_cents,
        } => {
            assert_eq!(balance_cents, won - 300);
            match tcp_receiver.next_push().expect("a notice over TCP").message {
                Message::PacketNotice {
                    packet_id: noticed,
                    from_user,
                    amount_cents,
                    shares,
                    ..
                } => assert_eq!(
                    (noticed, from_user, amount_cents, shares),
                    (packet_id, 63, 300, 1)
                ),
                other => panic!("expected a packet notice over TCP, got {other:?}"),
            }
            match tcp_receiver.open(packet_id).expect("open over TCP") {
                Message::OpenReply {
                    result,
                    amount_cents,
                    ..
                } => assert_eq!((result, amount_cents), (ResultCode::Opened, 300)),
                other => panic!("expected an open reply, got {other:?}"),
            }
        }
        other => panic!("send over WebSocket got {other:?}"),
    }
    assert_eq!(server.balance(64), 300);
    assert_eq!(server.balance(63), won - 300);
    let audit = server.audit();
    let campaign = server.get("/v1/campaigns/1");
    assert_eq!(audit["minted_cents"], campaign["minted_cents"]);
}

#[test]
fn broadcasts_reach_every_transport() {
    let server = Serve::new().dev_secret().ws().start();
    let mut tcp = server.login(71);
    let mut binary = server.ws_connect();
    binary.login_binary(72);
    let mut text = server.ws_connect();
    text.login_json(73);
    // Upgraded but silent: we do not know its form, so it is not pushed to.
    let mut silent = server.ws_connect();
    // Logged in over JSON, then a binary message: pushes come in binary.
    let mut mixed = server.ws_connect();
    mixed.login_json(74);
    binary_ping(&mut mixed, 1);

    let (status, body) = server.http("POST", "/v1/broadcast", Some(r#"{"text":"hi all"}"#));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let connections = answer["connections"].as_u64().unwrap();
    assert!(connections >= 4, "{answer:#}");
    assert_eq!(answer["workers"], 2, "{answer:#}");
    assert!(answer["id"].is_u64(), "{answer:#}");
    let server_time_us = answer["server_time_us"].as_u64().unwrap();

    let want = Message::Broadcast {
        server_time_us,
        text: "hi all".into(),
    };
    assert_eq!(tcp.next_push().expect("a broadcast over TCP").message, want);
    assert_eq!(binary.next_push_binary(), want);
    assert_eq!(mixed.next_push_binary(), want);
    let pushed = text.next_push_json();
    assert_eq!(pushed["type"], "broadcast", "{pushed}");
    assert_eq!(pushed["text"], "hi all", "{pushed}");
    assert_eq!(pushed["server_time_us"], server_time_us, "{pushed}");
    silent.set_read_timeout(Duration::from_millis(300));
    match silent.recv() {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("a silent WebSocket got {other:?}"),
    }

    // Bad requests.
    let (status, body) = server.http("POST", "/v1/broadcast", Some("{}"));
    assert_eq!(status, 400, "{body}");
    let long = json!({ "text": "x".repeat(5000) }).to_string();
    let (status, body) = server.http("POST", "/v1/broadcast", Some(&long));
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.http("GET", "/v1/broadcast", None);
    assert_eq!(status, 405, "{body}");
}

#[test]
fn a_websocket_that_never_upgrades_does_not_disturb_others() {
    let server = Serve::new().dev_secret().ws().start();
    // Several, so both workers almost surely hold some: silent ones, and ones stuck
    // half-way through their request head.
    let mut loiterers = Vec::new();
    for i in 0..8 {
        let mut s = TcpStream::connect(server.ws_addr()).unwrap();
        if i % 2 == 1 {
            s.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n")
                .unwrap();
        }
        loiterers.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));

    let mut clients: Vec<WsClient> = (0..4)
        .map(|i| {
            let mut c = server.ws_connect();
            c.login_json(80 + i);
            c
        })
        .collect();
    for round in 0..5 {
        for client in &mut clients {
            let start = Instant::now();
            let shake = client.request_json(json!({"type": "shake"}));
            let took = start.elapsed();
            assert_eq!(shake["result"], "nothing", "{shake}");
            assert!(
                took < Duration::from_secs(1),
                "round {round}: shake took {took:?}"
            );
        }
    }
    drop(loiterers);
}

#[test]
fn a_client_that_resets_after_a_violation_does_not_crash_a_worker() {
    let server = Serve::new().dev_secret().ws().start();
    // Bystanders, so both workers almost surely hold some.
    let mut bystanders: Vec<WsClient> = (0..6)
        .map(|i| {
            let mut c = server.ws_connect();
            c.login_binary(90 + i);
            c
        })
        .collect();

    // Errors are ignored here: once a worker has died, its connections are reset.
    for _ in 0..10 {
        let Ok(mut s) = TcpStream::connect(server.ws_addr()) else {
            continue;
        };
        let _ = s.write_all(&ws::client_request("x", "/ws", &fresh_key()));
        // Leave the 101 unread, so that closing the socket resets the connection (a
        // socket closed with unread input sends RST): the server then reads the frame
        // below, and its close frame cannot be written.
        std::thread::sleep(Duration::from_millis(100));
        let _ = s.write_all(&raw_frame(FIN | BINARY, None, b"unmasked"));
        drop(s);
    }
    std::thread::sleep(Duration::from_millis(1500));

    for (i, client) in bystanders.iter_mut().enumerate() {
        let id = client.send_binary(&Message::Shake);
        match client.read_event() {
            Ok(WsEvent::Binary(bytes)) => {
                assert_eq!(
                    decode(&bytes).unwrap(),
                    Frame {
                        request_id: id,
                        message: nothing()
                    }
                )
            }
            other => panic!("bystander {i} lost its connection (a worker died?): {other:?}"),
        }
    }
    for worker in server.workers_reported() {
        assert_eq!(worker["restarts"], 0, "worker restarted: {worker:#}");
    }
}

#[test]
fn rfc_violations_close_the_connection() {
    let server = Serve::new().dev_secret().ws().start();
    let mut top_bit = vec![FIN | BINARY, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 0];
    top_bit.extend_from_slice(&MASK);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("a reserved bit", masked(FIN | 0x40 | TEXT, b"{}"), 1002),
        ("an unknown opcode", masked(FIN | 0x3, b""), 1002),
        ("a 126-byte ping", masked(FIN | PING, &[0; 126]), 1002),
        ("a fragmented ping", masked(PING, b"x"), 1002),
        (
            "a continuation of nothing",
            masked(FIN | CONTINUATION, b"x"),
            1002,
        ),
        (
            "a new message inside another",
            [masked(TEXT, b"{"), masked(FIN | BINARY, b"x")].concat(),
            1002,
        ),
        ("a one-byte close", masked(FIN | CLOSE, &[3]), 1002),
        (
            "close code 999",
            masked(FIN | CLOSE, &close_payload(999, "")),
            1002,
        ),
        (
            "close code 1005",
            masked(FIN | CLOSE, &close_payload(1005, "")),
            1002,
        ),
        (
            "close code 2000",
            masked(FIN | CLOSE, &close_payload(2000, "")),
            1002,
        ),
        (
            "close code 5000",
            masked(FIN | CLOSE, &close_payload(5000, "")),
            1002,
        ),
        ("a 64-bit length with its top bit set", top_bit, 1002),
        (
            "a close reason that is not UTF-8",
            masked(FIN | CLOSE, &[0x03, 0xe8, 0xff]),
            1007,
        ),
    ];
    for (what, bytes, code) in cases {
        let mut client = server.ws_connect();
        client.login_binary(100);
        client.send_raw(&bytes).unwrap();
        match client.expect_event(what) {
            WsEvent::Close(Some(got), _) => assert_eq!(got, code, "{what}"),
            other => panic!("{what}: expected a close frame, got {other:?}"),
        }
        match client.recv() {
            Err(e) if is_closed(&e) => {}
            other => panic!("{what}: expected the connection closed, got {other:?}"),
        }
    }
}

#[test]
fn a_second_login_replaces_a_websocket() {
    let server = Serve::new().dev_secret().ws().start();

    // A JSON session replaced by a TCP login: a JSON kick, then close 1008 "replaced".
    let mut first = server.ws_connect();
    first.login_json(51);
    let mut second = server.login(51);
    let kick = first.next_push_json();
    assert_eq!(kick["type"], "kick", "{kick}");
    assert_eq!(kick["reason"], "replaced", "{kick}");
    assert_eq!(first.expect_close(1008), "replaced");
    first.expect_eof();
    assert_eq!(second.shake().expect("the new session shakes"), nothing());

    // A binary session replaced by a JSON one.
    let mut first = server.ws_connect();
    first.login_binary(52);
    let mut second = server.ws_connect();
    second.login_json(52);
    assert!(matches!(
        first.next_push_binary(),
        Message::Kick {
            reason: KickReason::Replaced,
            ..
        }
    ));
    assert_eq!(first.expect_close(1008), "replaced");
    first.expect_eof();
    let shake = second.request_json(json!({"type": "shake"}));
    assert_eq!(shake["result"], "nothing", "{shake}");
}

#[test]
fn idle_websockets_are_closed() {
    let server = Serve::new()
        .dev_secret()
        .ws()
        .config("login_timeout_secs = 1\n")
        .start();

    // Upgraded but silent: nothing to push in, so only the close frame.
    let mut silent = server.ws_connect();
    // Spoke JSON (a ping) but never logged in: a JSON kick, then the close.
    let mut json_user = server.ws_connect();
    let pong = json_user.request_json(json!({"type": "ping", "client_time_us": 1}));
    assert_eq!(pong["type"], "pong", "{pong}");
    // Spoke binary: a binary kick.
    let mut binary_user = server.ws_connect();
    binary_ping(&mut binary_user, 1);
    // Never upgraded: just closed.
    let mut unupgraded = TcpStream::connect(server.ws_addr()).unwrap();
    unupgraded.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    // Logged in: stays (no idle timeout by default).
    let mut logged_in = server.ws_connect();
    logged_in.login_json(53);

    assert_eq!(silent.expect_close(1008), "idle");
    silent.expect_eof();
    let kick = json_user.next_push_json();
    assert_eq!(
        (&kick["type"], &kick["reason"]),
        (&json!("kick"), &json!("idle")),
        "{kick}"
    );
    assert_eq!(json_user.expect_close(1008), "idle");
    json_user.expect_eof();
    assert!(matches!(
        binary_user.next_push_binary(),
        Message::Kick {
            reason: KickReason::Idle,
            ..
        }
    ));
    assert_eq!(binary_user.expect_close(1008), "idle");
    binary_user.expect_eof();
    let mut rest = Vec::new();
    unupgraded
        .read_to_end(&mut rest)
        .expect("the unupgraded connection closed");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));

    let shake = logged_in.request_json(json!({"type": "shake"}));
    assert_eq!(shake["result"], "nothing", "{shake}");
}

#[test]
fn shutdown_says_going_away() {
    let mut server = Serve::new().dev_secret().ws().start();
    let mut json_user = server.ws_connect();
    json_user.login_json(54);
    let mut binary_user = server.ws_connect();
    binary_user.login_binary(55);
    let mut silent = server.ws_connect();
    let mut tcp = server.login(56);

    let status = Command::new("kill")
        .args(["-INT", &server.process.child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success());

    let kick = json_user.next_push_json();
    assert_eq!(
        (&kick["type"], &kick["reason"]),
        (&json!("kick"), &json!("shutdown")),
        "{kick}"
    );
    assert_eq!(json_user.expect_close(1001), "shutdown");
    json_user.expect_eof();
    assert!(matches!(
        binary_user.next_push_binary(),
        Message::Kick {
            reason: KickReason::Shutdown,
            ..
        }
    ));
    assert_eq!(binary_user.expect_close(1001), "shutdown");
    binary_user.expect_eof();
    assert_eq!(silent.expect_close(1001), "shutdown");
    silent.expect_eof();
    match tcp.next_push().expect("a kick over TCP").message {
        Message::Kick { reason, .. } => assert_eq!(reason, KickReason::Shutdown),
        other => panic!("expected a kick over TCP, got {other:?}"),
    }

    let exit = wait_until("the server to stop after SIGINT", secs(20), || {
        server.process.child.try_wait().unwrap()
    });
    assert!(exit.success(), "hongbao serve exited with {exit}");
}

/// The login deadline counts from the upgrade: a WebSocket that keeps pinging but never
/// logs in is kicked all the same.
#[test]
fn a_websocket_that_pings_but_never_logs_in_is_kicked() {
    let server = Serve::new()
        .dev_secret()
        .ws()
        .config("login_timeout_secs = 1\n")
        .start();
    let mut pinger = server.ws_connect();
    // 1 s to log in, the sweep once a second: kicked by about 2 s; 20 × 250 ms is 5 s.
    let mut kick = None;
    for i in 0..20 {
        pinger.send_text(&json!({"type": "ping", "id": i + 1, "client_time_us": 1}).to_string());
        let reply = pinger.request_or_push_json(i + 1);
        if reply["type"] == "kick" {
            kick = Some(reply);
            break;
        }
        assert_eq!(reply["type"], "pong", "{reply}");
        std::thread::sleep(Duration::from_millis(250));
    }
    let kick = kick.expect("a pinging WebSocket was never kicked");
    assert_eq!(kick["reason"], "idle", "{kick}");
    assert_eq!(pinger.expect_close(1008), "idle");
}

/// Over the cap on connections not yet logged in, a WebSocket upgrade is answered 503
/// with `Retry-After`, and counted.
#[test]
fn websocket_upgrades_over_the_unauthenticated_cap_are_refused() {
    let server = Serve::new()
        .dev_secret()
        .ws()
        .config("max_unauthenticated_per_source = 1\n")
        .start();
    // Two workers, one each from this address: of three upgrades at least one is refused.
    let mut answers = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(server.ws_addr()).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        stream
            .write_all(upgrade_request(Some(key), Some("13")).as_bytes())
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream
                .read_exact(&mut byte)
                .expect("reading the answer's head");
            head.push(byte[0]);
        }
        answers.push(String::from_utf8(head).unwrap());
        streams.push(stream);
    }
    let refused: Vec<&String> = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 503"))
        .collect();
    let upgraded = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 101"))
        .count();
    assert!(!refused.is_empty() && upgraded >= 1, "{answers:?}");
    assert_eq!(refused.len() + upgraded, 3, "{answers:?}");
    assert!(refused[0].contains("Retry-After: 1"), "{}", refused[0]);
    wait_until("the refusals to be counted", secs(5), || {
        let totals = server.get("/v1/stats")["totals"].clone();
        (totals["rejected_unauthenticated"].as_u64() == Some(refused.len() as u64)).then_some(())
    });
    // A logged-in WebSocket does not count: the same address may log in more.
    drop(streams);
    std::thread::sleep(Duration::from_millis(300));
    let mut users = Vec::new();
    for user in 60..63 {
        let mut client = server.ws_connect();
        client.login_json(user);
        users.push(client);
    }
    for mut client in users {
        let shake = client.request_json(json!({"type": "shake"}));
        assert_eq!(shake["result"], "nothing", "{shake}");
    }
}
