//! End-to-end tests of the HTTP API (docs/http-api.md): the real `hongbao serve` with two
//! workers and `--http-listen`, raw sockets for what a library would smooth over
//! (pipelining, trickled heads, HTTP/1.0, oversized input), and the admin API and the
//! binary protocol beside it to check the money.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

mod common;

use common::{token, Serve, Server, IO_TIMEOUT, SECRET};
use hongbao_proto::Message;
use serde_json::{json, Value};

/// `Authorization: Bearer …` for `user` (every server here runs with `SECRET`).
fn bearer(user: u64) -> String {
    common::bearer(SECRET, user)
}

/// A raw connection to the server's HTTP API.
fn http_conn(server: &Server) -> Conn {
    Conn::open(server.http_addr())
}

/// One HTTP response as read off the wire.
#[derive(Debug)]
struct Response {
    status: u16,
    head: String,
    body: Value,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        common::header(&self.head, name)
    }

    fn result(&self) -> &str {
        self.body["result"].as_str().unwrap_or_default()
    }
}

/// A raw HTTP/1.1 connection: requests are written as given, responses read one by one.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// A request with a JSON body (when given) and these extra header lines.
    fn send(&mut self, method: &str, path: &str, headers: &[String], body: Option<&str>) {
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: hongbao\r\n");
        for h in headers {
            request.push_str(h);
            request.push_str("\r\n");
        }
        if let Some(body) = body {
            request.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        request.push_str(body.unwrap_or(""));
        self.write(request.as_bytes());
    }

    fn call(
        &mut self,
        method: &str,
        path: &str,
        user: Option<u64>,
        body: Option<&str>,
    ) -> Response {
        let headers: Vec<String> = user
            .map(|u| format!("Authorization: {}", bearer(u)))
            .into_iter()
            .collect();
        self.send(method, path, &headers, body);
        self.read()
    }

    fn read(&mut self) -> Response {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(self.buf[..end].to_vec()).unwrap();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (n, v) = l.split_once(':')?;
                        n.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().unwrap())
                    })
                    .expect("a Content-Length");
                if self.buf.len() >= end + 4 + length {
                    let body = self.buf[end + 4..end + 4 + length].to_vec();
                    self.buf.drain(..end + 4 + length);
                    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    return Response { status, head, body };
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).expect("a response");
            assert!(
                n > 0,
                "closed before a whole response: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The head of an answer to a HEAD request (no body follows it, whatever its
    /// `Content-Length` says): the status line and headers.
    fn read_head(&mut self) -> String {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(self.buf[..end].to_vec()).unwrap();
                self.buf.drain(..end + 4);
                return head;
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).expect("a response");
            assert!(n > 0, "closed before a whole head");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// True once the server has closed the connection (after what it had to say).
    fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 256];
        match self.stream.read(&mut chunk) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
            Err(e) => panic!("waiting for the close: {e}"),
        }
    }
}

/// Shakes over HTTP as `user` until one wins; returns (packet, amount). Each try is a
/// new connection, so the kernel spreads them over the workers and their pools.
fn shake_until_won(server: &Server, user: u64) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = http_conn(server).call("POST", "/v1/shake", Some(user), None);
        assert_eq!(r.status, 200, "{r:?}");
        if r.result() == "won" {
            return (
                r.body["packet_id"].as_u64().unwrap(),
                r.body["amount_cents"].as_u64().unwrap(),
            );
        }
        assert_eq!(r.result(), "nothing");
        assert!(Instant::now() < deadline, "no win in 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn every_endpoint_and_every_result() {
    let server = Serve::new().http().args(["--packet-ttl-secs", "2"]).start();
    let mut alice = http_conn(&server);

    // Ping needs no token; shaking with nothing released is `nothing`.
    let pong = alice.call("GET", "/v1/ping", None, None);
    assert_eq!((pong.status, pong.result()), (200, "ok"));
    assert!(pong.body["server_time_us"].as_u64().unwrap() > 0);
    let r = alice.call("POST", "/v1/shake", Some(1), None);
    assert_eq!((r.status, r.result()), (200, "nothing"));

    // Win 1,000 cents in ten packets; the win is in the ledger before the answer.
    server.shake_campaign(10, 1000, 100, 100);
    let mut won = 0;
    for _ in 0..10 {
        let (packet, amount) = shake_until_won(&server, 1);
        assert!(packet > 0);
        won += amount;
        assert_eq!(server.balance(1), won, "acknowledged means durable");
    }
    let me = alice.call("GET", "/v1/me", Some(1), None);
    assert_eq!((me.status, me.result()), (200, "ok"));
    assert_eq!(me.body["balance_cents"], 1000);
    assert_eq!(me.body["recent_events"][0]["kind"], "shake_won");

    // Sends: created (201), unaffordable (402), malformed (400).
    let send = |conn: &mut Conn, body: Value, key: Option<&str>| {
        let mut headers = vec![format!("Authorization: {}", bearer(1))];
        headers.extend(key.map(|k| format!("Idempotency-Key: {k}")));
        conn.send("POST", "/v1/packets", &headers, Some(&body.to_string()));
        conn.read()
    };
    let r = send(
        &mut alice,
        json!({"amount_cents": 300, "shares": 2, "recipients": [2, 3]}),
        Some("pay-1"),
    );
    assert_eq!((r.status, r.result()), (201, "ok"), "{r:?}");
    let packet = r.body["packet_id"].as_u64().unwrap();
    assert_eq!(r.body["balance_cents"], 700);
    // The same key again: the first answer, no money moved; another body: refused.
    let again = send(
        &mut alice,
        json!({"amount_cents": 300, "shares": 2, "recipients": [2, 3]}),
        Some("pay-1"),
    );
    assert_eq!((again.status, &again.body), (201, &r.body));
    assert_eq!(server.balance(1), 700);
    let clash = send(
        &mut alice,
        json!({"amount_cents": 5, "shares": 1, "recipients": [2]}),
        Some("pay-1"),
    );
    assert_eq!(
        (clash.status, clash.result()),
        (400, "bad-request"),
        "{clash:?}"
    );
    assert!(clash.body["error"]
        .as_str()
        .unwrap()
        .contains("idempotency"));
    let r = send(
        &mut alice,
        json!({"amount_cents": 10_000, "shares": 1, "recipients": [2]}),
        None,
    );
    assert_eq!((r.status, r.result()), (402, "insufficient-funds"));
    assert_eq!(r.body["balance_cents"], 700);
    let r = send(
        &mut alice,
        json!({"amount_cents": 10, "shares": 3, "recipients": [2]}),
        None,
    );
    assert_eq!((r.status, r.result()), (400, "bad-request"));

    // Notices and opens: opened, already opened, not a recipient, no such packet, empty.
    let mut bob = http_conn(&server);
    let notices = bob.call("GET", "/v1/notices", Some(2), None);
    assert_eq!(
        notices.body["notices"][0]["packet_id"], packet,
        "{notices:?}"
    );
    assert_eq!(notices.body["notices"][0]["from_user"], 1);
    let open = |conn: &mut Conn, user, packet: u64| {
        conn.call(
            "POST",
            &format!("/v1/packets/{packet}/open"),
            Some(user),
            None,
        )
    };
    let r = open(&mut bob, 2, packet);
    assert_eq!((r.status, r.result()), (200, "opened"));
    let share = r.body["amount_cents"].as_u64().unwrap();
    let r = open(&mut bob, 2, packet);
    assert_eq!(
        (r.status, r.result(), r.body["amount_cents"].as_u64()),
        (200, "already-opened", Some(share))
    );
    assert_eq!(open(&mut bob, 9, packet).status, 403);
    assert_eq!(open(&mut bob, 9, packet).result(), "not-a-recipient");
    let r = open(&mut bob, 2, 1 << 40);
    assert_eq!((r.status, r.result()), (404, "no-such-packet"));
    assert!(
        bob.call("GET", "/v1/notices", Some(2), None).body["notices"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // One share for one recipient: the second recipient finds it empty.
    let r = send(
        &mut alice,
        json!({"amount_cents": 50, "shares": 1, "recipients": [2, 3]}),
        None,
    );
    let single = r.body["packet_id"].as_u64().unwrap();
    assert_eq!(open(&mut bob, 2, single).result(), "opened");
    let r = open(&mut bob, 3, single);
    assert_eq!((r.status, r.result()), (409, "empty"));
    // Expired: the packet lives 2 s.
    let r = send(
        &mut alice,
        json!({"amount_cents": 20, "shares": 1, "recipients": [3]}),
        None,
    );
    let late = r.body["packet_id"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(2300));
    let r = open(&mut bob, 3, late);
    assert_eq!((r.status, r.result()), (410, "expired"));

    // Chat: to a user on the binary protocol, and to nobody.
    let mut carol = server.login(4);
    let r = alice.call(
        "POST",
        "/v1/chat",
        Some(1),
        Some(r#"{"to_user": 4, "text": "新年快乐"}"#),
    );
    assert_eq!((r.status, r.result()), (200, "delivered"));
    match carol.recv().unwrap().message {
        Message::ChatMessage { from_user, text } => {
            assert_eq!((from_user, text.as_str()), (1, "新年快乐"))
        }
        other => panic!("{other:?}"),
    }
    let r = alice.call(
        "POST",
        "/v1/chat",
        Some(1),
        Some(r#"{"to_user": 5, "text": "hi"}"#),
    );
    assert_eq!((r.status, r.result()), (200, "offline"));
    server.audit();
}

#[test]
fn overloaded_shakes_are_429_with_a_retry_after() {
    let server = Serve::new().http().args(["--max-shake-qps", "2"]).start();
    let mut conn = http_conn(&server);
    let mut overloaded = None;
    for _ in 0..10 {
        let r = conn.call("POST", "/v1/shake", Some(7), None);
        if r.status == 429 {
            overloaded = Some(r);
            break;
        }
    }
    let r = overloaded.expect("a 429 within ten shakes at 2/s");
    assert_eq!(r.result(), "overloaded");
    // A wait drawn around the base (1 s for a calm worker), and the header says it in
    // whole seconds, rounded up, at least 1.
    let ms = r.body["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!((1..=64_000).contains(&ms), "{:?}", r.body);
    let secs = ms.div_ceil(1000).max(1).to_string();
    assert_eq!(r.header("Retry-After"), Some(secs.as_str()));
}

/// Requests written back to back are answered in order, though a winning shake waits for
/// the ledger and the requests after it do not.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let server = Serve::new().http().start();
    server.shake_campaign(1, 1000, 100, 100);
    // Wait until the packet is in a pool: one shake on each connection until one wins.
    shake_until_won(&server, 8);
    server.shake_campaign(2, 1000, 100, 100);
    std::thread::sleep(Duration::from_millis(100));
    let mut conn = http_conn(&server);
    let auth = format!("Authorization: {}", bearer(9));
    let mut batch = Vec::new();
    for (method, path) in [
        ("POST", "/v1/shake"),
        ("GET", "/v1/nothing-here"),
        ("POST", "/v1/shake"),
        ("GET", "/v1/ping"),
        ("DELETE", "/v1/me"),
        ("GET", "/v1/me"),
    ] {
        batch.extend_from_slice(
            format!("{method} {path} HTTP/1.1\r\nHost: h\r\n{auth}\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
        );
    }
    conn.write(&batch);
    let statuses: Vec<(u16, String)> = (0..6)
        .map(|_| {
            let r = conn.read();
            (r.status, r.result().to_string())
        })
        .collect();
    assert_eq!(statuses[1], (404, "bad-request".into()));
    assert_eq!(statuses[3], (200, "ok".into()));
    assert_eq!(statuses[4].0, 405);
    assert_eq!(statuses[5], (200, "ok".into()));
    for i in [0, 2] {
        assert_eq!(statuses[i].0, 200);
        assert!(
            statuses[i].1 == "won" || statuses[i].1 == "nothing",
            "{statuses:?}"
        );
    }
}

/// Each bad request costs its own connection at most and says why; a well-behaved
/// request on another connection goes on being served.
#[test]
fn bad_requests_are_refused_with_their_status() {
    let server = Serve::new()
        .http()
        .config("login_timeout_secs = 2\n")
        .start();
    let well_behaved = |server: &Server| {
        let mut conn = http_conn(server);
        let r = conn.call("POST", "/v1/shake", Some(3), None);
        assert_eq!(r.status, 200, "a good request after a bad one: {r:?}");
    };
    let refused = |raw: &[u8], status: u16| {
        let mut conn = http_conn(&server);
        conn.write(raw);
        let r = conn.read();
        assert_eq!(
            r.status,
            status,
            "{:?}: {r:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(60)])
        );
        r
    };
    // Malformed request line and header: 400, then the connection closes.
    for raw in [
        &b"GET /v1/me HTTP/1.1 extra\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nNo-Colon\r\n\r\n",
    ] {
        let mut conn = http_conn(&server);
        conn.write(raw);
        assert_eq!(conn.read().status, 400);
        assert!(conn.closed());
        well_behaved(&server);
    }
    // Headers over the limit: 431.
    let mut big = b"GET /v1/me HTTP/1.1\r\nX-Pad: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 10_000));
    big.extend_from_slice(b"\r\n\r\n");
    refused(&big, 431);
    well_behaved(&server);
    // A body over the limit: 413.
    let huge = format!(
        "POST /v1/packets HTTP/1.1\r\nAuthorization: {}\r\nContent-Length: 100000\r\n\r\n",
        bearer(3)
    );
    refused(huge.as_bytes(), 413);
    well_behaved(&server);
    // Bad JSON and bad values: 400 with a message; the connection stays.
    let mut conn = http_conn(&server);
    for body in [
        "{",
        "[300, 1, [2]]",
        r#"{"amount_cents": -1, "shares": 1, "recipients": [2]}"#,
        r#"{"amount_cents": 1}"#,
    ] {
        let r = conn.call("POST", "/v1/packets", Some(3), Some(body));
        assert_eq!(
            (r.status, r.result()),
            (400, "bad-request"),
            "{body}: {r:?}"
        );
        assert!(!r.body["error"].as_str().unwrap().is_empty());
    }
    let r = conn.call("POST", "/v1/packets/x/open", Some(3), None);
    assert_eq!(r.status, 400);
    // Missing and forged tokens: 401.
    let r = conn.call("POST", "/v1/shake", None, None);
    assert_eq!((r.status, r.result()), (401, "bad-token"));
    assert_eq!(r.header("WWW-Authenticate"), Some("Bearer"));
    // The old `<user>.<hmac hex>` form, a token signed with another secret, user 0's.
    let forged = [
        format!("3.{}", "00".repeat(32)),
        token("not the secret", 3),
        token(SECRET, 0),
    ];
    for bearer in forged {
        conn.send(
            "POST",
            "/v1/shake",
            &[format!("Authorization: Bearer {bearer}")],
            None,
        );
        let r = conn.read();
        assert_eq!((r.status, r.result()), (401, "bad-token"), "{bearer}");
        assert_eq!(r.header("WWW-Authenticate"), Some("Bearer"));
    }
    // A forged or expired bearer is judged before the body: 401, never the JSON error
    // and the send rules a stranger would learn from a 400.
    let expired = {
        let now = hongbao_sys::clock::unix_ms() / 1000;
        hongbao_proto::token::Minter::hs256(hongbao_proto::token::DEFAULT_KID, SECRET.as_bytes())
            .mint_for(3, now - 7200, 60)
    };
    for bearer in ["1.deadbeef".to_string(), expired] {
        for body in [
            "{not json",
            r#"{"amount_cents": 0, "shares": 1, "recipients": [2]}"#,
        ] {
            conn.send(
                "POST",
                "/v1/packets",
                &[format!("Authorization: Bearer {bearer}")],
                Some(body),
            );
            let r = conn.read();
            assert_eq!(
                (r.status, r.result()),
                (401, "bad-token"),
                "{bearer} {body}: {r:?}"
            );
            let said = r.body["error"].as_str().unwrap();
            assert!(!said.contains("JSON") && !said.contains("cent"), "{said}");
        }
    }
    // The scheme in any case (RFC 9110: schemes are case-insensitive).
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        conn.send(
            "POST",
            "/v1/shake",
            &[format!("Authorization: {scheme} {}", token(SECRET, 3))],
            None,
        );
        let r = conn.read();
        assert_eq!(r.status, 200, "{scheme}: {r:?}");
    }
    // The wrong method: 405 with Allow.
    let r = conn.call("GET", "/v1/shake", Some(3), None);
    assert_eq!((r.status, r.header("Allow")), (405, Some("POST")));
    well_behaved(&server);
    // A malformed send says which rule it broke.
    for (body, why) in [
        (
            json!({"amount_cents": 0, "shares": 1, "recipients": [2]}),
            "at least 1",
        ),
        (
            json!({"amount_cents": 5, "shares": 0, "recipients": [2]}),
            "shares",
        ),
        (
            json!({"amount_cents": 1, "shares": 2, "recipients": [2, 4]}),
            "cent",
        ),
        (
            json!({"amount_cents": 5, "shares": 2, "recipients": [2]}),
            "recipients",
        ),
        (
            json!({"amount_cents": 5, "shares": 1, "recipients": []}),
            "no recipients",
        ),
        (
            json!({"amount_cents": 5, "shares": 1, "recipients": [2, 2]}),
            "twice",
        ),
        (
            json!({"amount_cents": 5, "shares": 1, "recipients": [0]}),
            "user 0",
        ),
        (
            json!({"amount_cents": 1_000_000_001u64, "shares": 1, "recipients": [2]}),
            "over",
        ),
    ] {
        let r = conn.call("POST", "/v1/packets", Some(3), Some(&body.to_string()));
        assert_eq!(
            (r.status, r.result()),
            (400, "bad-request"),
            "{body}: {r:?}"
        );
        let said = r.body["error"].as_str().unwrap_or_default();
        assert!(said.contains(why), "{body}: {said:?}");
    }
    // HEAD: the head of the GET's answer and no body, so the next answer on the
    // connection reads whole; on a path HEAD is not for, a 405 without a body.
    for path in ["/v1/ping", "/", "/v1/shake", "/v1/me"] {
        conn.send(
            "HEAD",
            path,
            &[format!("Authorization: {}", bearer(3))],
            None,
        );
        let head = conn.read_head();
        let status = if path == "/v1/ping" || path == "/" {
            "200"
        } else {
            "405"
        };
        assert_eq!(
            head.split_whitespace().nth(1),
            Some(status),
            "HEAD {path}: {head}"
        );
        let r = conn.call("GET", "/v1/ping", None, None);
        assert_eq!((r.status, r.result()), (200, "ok"), "after HEAD {path}");
    }
    // Without a token too: the method is refused for its form before the bearer is
    // looked at, on the API's reads as on its POST paths (http-api.md).
    for path in ["/v1/me", "/v1/notices", "/v1/shake"] {
        conn.send("HEAD", path, &[], None);
        let head = conn.read_head();
        assert_eq!(
            head.split_whitespace().nth(1),
            Some("405"),
            "HEAD {path} without a token: {head}"
        );
        let r = conn.call("GET", "/v1/ping", None, None);
        assert_eq!((r.status, r.result()), (200, "ok"), "after HEAD {path}");
    }

    // A client that trickles its head: 408 after the header timeout (2 s here), then the
    // connection closes; others are served meanwhile.
    let mut slow = http_conn(&server);
    let mut writer = slow.stream.try_clone().unwrap();
    let started = Instant::now();
    let trickle = std::thread::spawn(move || {
        for byte in b"GET /v1/me HTTP/1.1\r\nHost: a-slow-client" {
            if writer.write_all(&[*byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    well_behaved(&server);
    let r = slow.read();
    let waited = started.elapsed();
    assert_eq!(r.status, 408, "{r:?}");
    assert!(waited < Duration::from_millis(4500), "408 after {waited:?}");
    assert!(slow.closed());
    well_behaved(&server);
    trickle.join().unwrap();
}

#[test]
fn connection_close_and_http_1_0_are_honoured() {
    let server = Serve::new().http().start();
    let mut conn = http_conn(&server);
    conn.send("GET", "/v1/ping", &["Connection: close".into()], None);
    let r = conn.read();
    assert_eq!((r.status, r.header("Connection")), (200, Some("close")));
    assert!(conn.closed());
    let mut old = http_conn(&server);
    old.write(b"GET /v1/ping HTTP/1.0\r\n\r\n");
    assert_eq!(old.read().status, 200);
    assert!(old.closed());
    // HTTP/1.0 asking to stay open stays open.
    let mut kept = http_conn(&server);
    for _ in 0..3 {
        kept.write(b"GET /v1/ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert_eq!(kept.read().status, 200);
    }
    // Chunked bodies are read too.
    let body = r#"{"to_user": 5, "text": "hi"}"#;
    let chunked = format!(
        "POST /v1/chat HTTP/1.1\r\nAuthorization: {}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        bearer(6),
        body.len()
    );
    kept.write(chunked.as_bytes());
    assert_eq!(kept.read().result(), "offline");
}

/// Every `sh` example in docs/http-api.md, run as written with bash and curl against a
/// real server (one worker, so the one shake packet is in its pool), must print JSON with
/// the `result` and the top-level fields of the `json` example after it.
#[test]
fn the_documented_curl_examples_run_as_written() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/http-api.md")).unwrap();
    let mut examples = Vec::new();
    let mut blocks = doc.split("```").skip(1).step_by(2);
    while let Some(block) = blocks.next() {
        if let Some(script) = block.strip_prefix("sh\n") {
            let expected = blocks
                .next()
                .and_then(|b| b.strip_prefix("json\n"))
                .expect("a json block after each sh block");
            examples.push((script.to_string(), expected.trim().to_string()));
        }
    }
    assert!(examples.len() >= 9, "{} examples", examples.len());

    let server = Serve::new().http().workers(1).start();
    let (http, admin) = (server.http_addr(), server.admin.addr);
    server.shake_campaign(1, 1000, 1000, 1000);
    std::thread::sleep(Duration::from_millis(200));
    let bearer = bearer(42);
    let token = bearer.strip_prefix("Bearer ").unwrap();
    for (script, expected) in examples {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .env("HONGBAO", format!("http://{http}"))
            .env("ADMIN", format!("http://{admin}"))
            .env("TOKEN", token)
            .output()
            .expect("bash and curl");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{script} printed no JSON ({e}): {:?}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        let want: Value = serde_json::from_str(&expected).unwrap();
        assert_eq!(got["result"], want["result"], "{script}: {got}");
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&got), keys(&want), "{script}: {got}");
    }
}
