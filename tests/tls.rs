//! TLS on every listener of `serve` (issue 44), with real handshakes: the binary protocol,
//! WebSocket and the HTTP API over TLS, the admin API too; a plain client on a TLS port
//! refused (and on the record) without disturbing anyone; a client trusting another CA
//! refused; a certificate reloaded (SIGHUP) with connections open.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{fresh_key, pings, signal, token, wait_until, Serve, Server, IO_TIMEOUT, SECRET};
use hongbao_http::tls::{client_config, DevCerts, ALPN_FRAMES, ALPN_HTTP};
use hongbao_proto::client::Client;
use hongbao_proto::{Message, ResultCode};

/// A TLS server with fresh dev certificates for 127.0.0.1 in `dir`.
fn tls_serve(dir: &Path) -> (Server, DevCerts) {
    let certs = DevCerts::make(&["127.0.0.1", "localhost"]).unwrap();
    let files = certs.write(dir).unwrap();
    let server = Serve::new().ws().http().tls(&files).start();
    (server, certs)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS client of `addr` trusting `ca_pem`, saying it speaks either protocol (each
/// listener takes the one it speaks).
fn tls_connect(addr: SocketAddr, ca_pem: &str) -> std::io::Result<Tls> {
    let config = client_config(ca_pem.as_bytes(), &[ALPN_FRAMES, ALPN_HTTP]).unwrap();
    tls_with(addr, config)
}

fn tls_with(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(IO_TIMEOUT))?;
    let conn = rustls::ClientConnection::new(config, "127.0.0.1".try_into().unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// One HTTP/1.1 request over TLS, `Connection: close`: the status and body.
fn https(addr: SocketAddr, ca_pem: &str, request: &str) -> (u16, String) {
    let mut tls = tls_connect(addr, ca_pem).expect("a TLS handshake");
    tls.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn login_tls(server: &Server, ca_pem: &str, user: u64) -> Client {
    let mut client = Client::connect_tls(server.listen, "127.0.0.1", ca_pem.as_bytes()).unwrap();
    client.set_timeout(IO_TIMEOUT).unwrap();
    assert_eq!(client.login(&token(SECRET, user)).unwrap(), ResultCode::Ok);
    client
}

/// Whether a plain client's bytes on a TLS port get a protocol answer: they must not.
fn plain_gets_no_answer(addr: SocketAddr, bytes: &[u8]) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    tcp.write_all(bytes).unwrap();
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got);
    // At most a TLS alert record (content type 21), never a frame or an HTTP answer.
    assert!(
        got.is_empty() || got[0] == 21,
        "a plain client on a TLS port got {:?}",
        String::from_utf8_lossy(&got)
    );
}

#[test]
fn every_listener_speaks_tls_and_a_plain_client_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (server, certs) = tls_serve(dir.path());
    let ca = certs.ca_pem.as_str();
    // The binary protocol: login, shake, a chat between two TLS sessions.
    let mut alice = login_tls(&server, ca, 1);
    let mut bob = login_tls(&server, ca, 2);
    assert!(matches!(
        alice.shake().unwrap(),
        Message::ShakeReply {
            result: ResultCode::Nothing,
            ..
        }
    ));
    assert!(matches!(
        alice.chat(2, "over TLS").unwrap(),
        Message::ChatReply {
            result: ResultCode::Delivered
        }
    ));
    assert!(matches!(
        bob.next_push().unwrap().message,
        Message::ChatMessage { .. }
    ));

    // Plain clients on each TLS port: a login frame, an HTTP request, a WebSocket upgrade.
    let frame = hongbao_proto::encode_to_vec(&hongbao_proto::Frame {
        request_id: 1,
        message: Message::Login {
            user_id: 0,
            token: token(SECRET, 3).into_bytes(),
        },
    });
    plain_gets_no_answer(server.listen, &frame);
    plain_gets_no_answer(
        server.http_addr(),
        b"GET /v1/ping HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    plain_gets_no_answer(server.ws_addr(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    // A client trusting another CA gives up in its own handshake.
    let stranger = DevCerts::make(&["127.0.0.1"]).unwrap();
    assert!(tls_connect(server.listen, &stranger.ca_pem).is_err());
    // Nobody else noticed.
    assert!(pings(&mut alice) && pings(&mut bob));

    // The HTTP API and the browser page over TLS.
    let bearer = token(SECRET, 4);
    let (status, body) = https(
        server.http_addr(),
        ca,
        &format!("POST /v1/shake HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {bearer}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!((status, body.contains("nothing")), (200, true), "{body}");
    let (status, page) = https(
        server.ws_addr(),
        ca,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(status == 200 && page.contains("<html"), "{status}");

    // A WebSocket over TLS (wss): the upgrade, then a JSON login and a ping.
    let mut wss = tls_connect(server.ws_addr(), ca).unwrap();
    wss.write_all(&hongbao_proto::ws::client_request(
        "127.0.0.1",
        "/ws",
        &fresh_key(),
    ))
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        wss.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let login = format!(
        r#"{{"type":"login","id":1,"token":"{}"}}"#,
        token(SECRET, 5)
    );
    let mut frame = Vec::new();
    hongbao_proto::ws::encode(
        hongbao_proto::ws::Role::Client,
        hongbao_proto::ws::Opcode::Text,
        login.as_bytes(),
        &mut frame,
    );
    wss.write_all(&frame).unwrap();
    let mut reply = [0u8; 256];
    let n = wss.read(&mut reply).unwrap();
    let text = String::from_utf8_lossy(&reply[..n]);
    assert!(text.contains(r#""result":"ok""#), "{text}");

    // Each refused handshake counted, by every worker together: the three plain clients
    // refused; the stranger's, which sends its alert and closes at once, refused or (its
    // close seen with its alert) let go as abandoned — on the record either way.
    let key = server.admin.key();
    let stats = format!(
        "GET /v1/stats HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n",
        server.admin.addr
    );
    wait_until("tls_refused counted", Duration::from_secs(5), || {
        let (_, body) = https(server.admin.addr, ca, &stats);
        let stats: serde_json::Value = serde_json::from_str(&body).ok()?;
        let totals = &stats["totals"];
        let (refused, abandoned) = (
            totals["tls_refused"].as_u64()?,
            totals["tls_abandoned"].as_u64()?,
        );
        (refused >= 3 && refused + abandoned >= 4).then_some(())
    });
}

#[test]
fn the_admin_api_speaks_tls_and_records_a_plain_client() {
    let dir = tempfile::tempdir().unwrap();
    let (server, certs) = tls_serve(dir.path());
    let ca = certs.ca_pem.as_str();
    let key = server.admin.key();
    let addr = server.admin.addr;
    let request = |method: &str, path: &str| {
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n")
    };
    let (status, body) = https(addr, ca, &request("GET", "/v1/stats"));
    assert_eq!(status, 200, "{body}");
    // The console's session cookie over https is Secure: a browser never sends it in
    // clear.
    let login = format!("{{\"key\":\"{key}\"}}");
    let mut tls = tls_connect(addr, ca).expect("a TLS handshake");
    write!(
        tls,
        "POST /console/login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{login}",
        login.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer);
    let cookie = answer
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {answer}"));
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(cookie.trim_end().ends_with("; Secure"), "{cookie}");
    // A plain client: refused in its handshake, and on the admin log (method TLS, 421).
    plain_gets_no_answer(addr, b"GET /v1/stats HTTP/1.1\r\nHost: x\r\n\r\n");
    wait_until(
        "the refused handshake on the admin log",
        Duration::from_secs(5),
        || {
            let (_, log) = https(addr, ca, &request("GET", "/v1/admin-log"));
            let log: serde_json::Value = serde_json::from_str(&log).ok()?;
            log["entries"]
                .as_array()?
                .iter()
                .any(|e| e["method"] == "TLS" && e["status"] == 421)
                .then_some(())
        },
    );
}

#[test]
fn a_new_certificate_takes_over_on_sighup_and_open_connections_stay() {
    let dir = tempfile::tempdir().unwrap();
    let (server, old) = tls_serve(dir.path());
    let mut open = login_tls(&server, &old.ca_pem, 11);
    // A new CA's certificate in the same files, then SIGHUP.
    let new = DevCerts::make(&["127.0.0.1"]).unwrap();
    new.write(dir.path()).unwrap();
    signal(server.pid(), "-HUP");
    wait_until(
        "new connections to take the new certificate",
        Duration::from_secs(10),
        || match tls_connect(server.listen, &new.ca_pem) {
            Ok(_) => Some(()),
            Err(_) => None,
        },
    );
    assert!(
        tls_connect(server.listen, &old.ca_pem).is_err(),
        "the old one is gone"
    );
    assert!(
        pings(&mut open),
        "a connection of the old certificate stays"
    );
    let mut fresh = login_tls(&server, &new.ca_pem, 12);
    assert!(pings(&mut fresh));
    // The admin address too.
    wait_until(
        "the admin address's new certificate",
        Duration::from_secs(10),
        || tls_connect(server.admin.addr, &new.ca_pem).ok().map(|_| ()),
    );
}

#[test]
fn a_tls_monitor_takes_reports_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let certs = DevCerts::make(&["127.0.0.1"]).unwrap();
    let files = certs.write(&dir.path().join("tls")).unwrap();
    let out = dir.path().join("out");
    let key_file = out.join("monitor.key");
    std::fs::create_dir_all(&out).unwrap();
    let monitor = common::Hongbao::spawn(
        "monitor",
        &[
            "monitor",
            "--listen",
            "127.0.0.1:0",
            "--out",
            out.to_str().unwrap(),
            "--key-file",
            key_file.to_str().unwrap(),
            "--tls-cert",
            files.cert.to_str().unwrap(),
            "--tls-key",
            files.key.to_str().unwrap(),
        ],
    );
    let ready = monitor.ready_line("hongbao monitor ready: ");
    assert!(ready.contains("(dashboard https://"), "{ready}");
    let addr: SocketAddr = common::field(&ready, "listen").parse().unwrap();
    // A serve reporting to it over TLS, trusting its CA.
    let _serve = Serve::new()
        .env(
            "HONGBAO_TLS_CA",
            dir.path().join("tls/ca.pem").to_str().unwrap(),
        )
        .args([
            "--monitor".to_string(),
            format!("https://{addr}"),
            "--monitor-key-file".to_string(),
            key_file.display().to_string(),
        ])
        .start();
    let ca = certs.ca_pem.as_str();
    wait_until(
        "serve's reports in the monitor's series",
        Duration::from_secs(10),
        || {
            let (status, csv) = https(
                addr,
                ca,
                &format!(
                    "GET /v1/series.csv HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
                ),
            );
            (status == 200 && csv.lines().count() > 1).then_some(())
        },
    );
    // A plain client is refused in its handshake.
    plain_gets_no_answer(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
}

/// Clients that send their ClientHello and go (a reset, before the server's answer is
/// written) cost the server nothing: no worker falls over (a worker once did, writing
/// the handshake's answer to a connection that closed under it), and everyone else is
/// served.
#[test]
fn clients_leaving_mid_handshake_do_not_disturb_a_worker() {
    let dir = tempfile::tempdir().unwrap();
    let (server, certs) = tls_serve(dir.path());
    let config = client_config(certs.ca_pem.as_bytes(), &[ALPN_FRAMES]).unwrap();
    for _ in 0..300 {
        let mut session =
            rustls::ClientConnection::new(config.clone(), "127.0.0.1".try_into().unwrap()).unwrap();
        let mut hello = Vec::new();
        session.write_tls(&mut hello).unwrap();
        let tcp = TcpStream::connect(server.listen).unwrap();
        socket2::SockRef::from(&tcp)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        (&tcp).write_all(&hello).unwrap();
        drop(tcp); // a reset
    }
    let mut client = login_tls(&server, &certs.ca_pem, 21);
    assert!(pings(&mut client));
    // No worker restarted (each reports its restarts; give them a report's time).
    std::thread::sleep(Duration::from_millis(1500));
    let key = server.admin.key();
    let (_, body) = https(
        server.admin.addr,
        &certs.ca_pem,
        &format!(
            "GET /v1/stats HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n",
            server.admin.addr
        ),
    );
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    for worker in stats["workers"].as_array().unwrap() {
        assert_eq!(worker["restarts"], 0, "{worker}");
    }
}

/// A one-worker TLS server admitting `bound` handshakes at a time, its login deadline
/// `login_secs`.
fn bounded_tls_serve(dir: &Path, bound: u32, login_secs: u32) -> (Server, DevCerts) {
    let certs = DevCerts::make(&["127.0.0.1"]).unwrap();
    let files = certs.write(dir).unwrap();
    let server = Serve::new()
        .workers(1)
        .tls(&files)
        .config(&format!(
            "max_tls_handshakes = {bound}\nlogin_timeout_secs = {login_secs}\ntls_handshake_timeout_secs = 60"
        ))
        .start();
    (server, certs)
}

/// The worker's stats (counters and levels), over the TLS admin address.
fn worker_stats(server: &Server, ca: &str) -> serde_json::Value {
    let key = server.admin.key();
    let addr = server.admin.addr;
    let (_, body) = https(
        addr,
        ca,
        &format!("GET /v1/stats HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"),
    );
    serde_json::from_str(&body).unwrap()
}

/// A storm of many times the handshake bound, all at once, into a one-worker server: the
/// worker takes in only as many as it admits and leaves the rest in the kernel's queue,
/// so every client logs in and none is kicked idle once its handshake is done — though
/// most waited in the queue longer than the login deadline.
#[test]
fn a_storm_of_many_times_the_bound_all_log_in_and_none_is_kicked_after_its_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (server, certs) = bounded_tls_serve(dir.path(), 4, 1);
    let clients = 120;
    let start = std::sync::Arc::new(std::sync::Barrier::new(clients));
    let handles: Vec<_> = (0..clients as u64)
        .map(|i| {
            let (addr, ca, start) = (server.listen, certs.ca_pem.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut client = Client::connect_tls(addr, "127.0.0.1", ca.as_bytes())
                    .map_err(|e| format!("user {}: {e}", 1000 + i))?;
                client.set_timeout(Duration::from_secs(60)).unwrap();
                match client.login(&token(SECRET, 1000 + i)) {
                    Ok(ResultCode::Ok) => Ok(client),
                    other => Err(format!("user {}: {other:?}", 1000 + i)),
                }
            })
        })
        .collect();
    let mut held = Vec::new();
    for h in handles {
        held.push(h.join().unwrap().unwrap_or_else(|e| panic!("{e}")));
    }
    for client in &mut held {
        assert!(pings(client), "a session was kicked after it logged in");
    }
    let stats = common::wait_until("the worker's report", Duration::from_secs(5), || {
        let s = worker_stats(&server, &certs.ca_pem);
        (s["totals"]["logins"].as_u64()? >= clients as u64).then_some(s)
    });
    let totals = &stats["totals"];
    assert_eq!(
        totals["tls_handshakes"].as_u64(),
        Some(clients as u64),
        "{totals}"
    );
    assert_eq!(totals["kicks_idle"].as_u64(), Some(0), "{totals}");
    assert_eq!(
        totals["tls_handshake_timeouts"].as_u64(),
        Some(0),
        "{totals}"
    );
    assert!(totals["accept_paused"].as_u64() >= Some(1), "{totals}");
}

/// Clients that gave up while they waited in the accept queue (the worker at its bound)
/// are let go when the worker reaches them, before any handshake work: counted
/// abandoned, never handshaken.
#[test]
fn clients_that_gave_up_in_the_queue_cost_no_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (server, certs) = bounded_tls_serve(dir.path(), 2, 10);
    let config = client_config(certs.ca_pem.as_bytes(), &[ALPN_FRAMES]).unwrap();
    let hello = || {
        let mut session =
            rustls::ClientConnection::new(config.clone(), "127.0.0.1".try_into().unwrap()).unwrap();
        let mut hello = Vec::new();
        session.write_tls(&mut hello).unwrap();
        hello
    };
    // Two handshakes begun and left hanging: the worker is at its bound.
    let stalled: Vec<TcpStream> = (0..2)
        .map(|_| {
            let tcp = TcpStream::connect(server.listen).unwrap();
            (&tcp).write_all(&hello()).unwrap();
            tcp
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Ten more send their ClientHello and give up: they wait in the kernel's queue.
    for _ in 0..10 {
        let tcp = TcpStream::connect(server.listen).unwrap();
        (&tcp).write_all(&hello()).unwrap();
        drop(tcp);
    }
    std::thread::sleep(Duration::from_millis(300));
    // The worker reports once a second, just after each whole second: its first report
    // may come after these 600 ms.
    let before = common::wait_until("the worker's first report", Duration::from_secs(5), || {
        let s = worker_stats(&server, &certs.ca_pem);
        s["workers"][0]["tls_handshaking"]
            .as_u64()
            .is_some()
            .then_some(s)
    });
    assert_eq!(
        before["workers"][0]["tls_handshaking"].as_u64(),
        Some(2),
        "{before}"
    );
    drop(stalled); // the two go too: the worker reaches the queue
    let mut client = login_tls(&server, &certs.ca_pem, 31);
    assert!(pings(&mut client));
    let totals = common::wait_until("the worker's report", Duration::from_secs(5), || {
        let s = worker_stats(&server, &certs.ca_pem);
        (s["totals"]["logins"].as_u64()? >= 1).then(|| s["totals"].clone())
    });
    assert_eq!(
        totals["tls_handshakes"].as_u64(),
        Some(1),
        "only the one that stayed: {totals}"
    );
    assert_eq!(totals["tls_abandoned"].as_u64(), Some(12), "{totals}");
}
