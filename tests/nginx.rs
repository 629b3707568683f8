//! nginx in front (docs/nginx.md): `hongbao nginx-conf` writes the configuration, the
//! real nginx (Debian's, with its stream module) runs it, and money moves through all three
//! of its doors — the HTTP API over upstream keep-alive, WebSocket through the upgrade,
//! the binary protocol through the stream proxy — and adds up in the audit. Where nginx
//! answers before any gateway (a malformed or oversized request, a timeout, no gateway
//! up), raw requests check that it answers as the gateway would, or as docs/nginx.md says.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{token, wait_until, Admin, Hongbao, Serve, WsClient, IO_TIMEOUT, SECRET};
use hongbao_lab::nginx::OWN_ANSWERS;
use hongbao_proto::{Message, ResultCode};
use serde_json::{json, Value};

/// A free loopback port (bound and let go: nginx binds it next).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The nginx binary: on PATH, or where Debian puts it.
fn nginx_binary() -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let candidate = Path::new(dir).join("nginx");
        if candidate.exists() {
            return candidate;
        }
    }
    let debian = PathBuf::from("/usr/sbin/nginx");
    assert!(
        debian.exists(),
        "nginx is not installed (.ci/run installs nginx and libnginx-mod-stream)"
    );
    debian
}

/// A running `nginx -g 'daemon off;'`: on drop, SIGQUIT-free fast shutdown (SIGTERM),
/// then SIGKILL for the master and any worker it left behind.
struct Nginx {
    master: Child,
    stderr_log: PathBuf,
}

impl Nginx {
    fn start(prefix: &Path, conf: &Path) -> Nginx {
        let stderr_log = prefix.join("stderr.log");
        let master = Command::new(nginx_binary())
            .arg("-p")
            .arg(prefix)
            .arg("-c")
            .arg(conf)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_log).unwrap())
            .spawn()
            .expect("starting nginx");
        Nginx { master, stderr_log }
    }

    /// The master's children (its workers), from /proc.
    fn workers(&self) -> Vec<u32> {
        let master = self.master.id();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid ...: the comm may hold spaces, so split after ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(master) {
                found.push(pid);
            }
        }
        found
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// Waits until every address accepts a connection (nginx has bound them).
    fn wait_listening(&mut self, addrs: &[SocketAddr]) {
        for addr in addrs {
            wait_until(
                &format!("nginx to listen on {addr}"),
                Duration::from_secs(15),
                || {
                    if let Ok(Some(status)) = self.master.try_wait() {
                        panic!("nginx exited with {status}: {}", self.log());
                    }
                    TcpStream::connect(addr).ok().map(|_| ())
                },
            );
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let workers = self.workers();
        common::signal(self.master.id(), "-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.master.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.master.kill();
        let _ = self.master.wait();
        for pid in workers {
            // Gone already, normally; a worker whose master was killed would linger.
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        if std::thread::panicking() {
            eprintln!("----- nginx stderr -----\n{}-----", self.log());
        }
    }
}

/// `hongbao nginx-conf ARGS` for one nginx worker with its files under `prefix`: the
/// configuration file it wrote.
fn write_conf(prefix: &Path, args: &[&str]) -> PathBuf {
    let conf = prefix.join("nginx.conf");
    let mut all = vec!["nginx-conf"];
    all.extend(args);
    all.extend(["--worker-processes", "1"]);
    all.extend(["--prefix", prefix.to_str().unwrap()]);
    all.extend(["--out", conf.to_str().unwrap()]);
    let mut generate = Hongbao::spawn("nginx-conf", &all);
    assert!(generate.wait_exit(Duration::from_secs(10)).success());
    conf
}

/// An HTTP call through nginx on `agent` (keep-alive): (status, JSON body).
fn call(
    agent: &ureq::Agent,
    base: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = agent.request(method, &format!("http://{base}{path}"));
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let result = match body {
        Some(body) => request.send_string(&body.to_string()),
        None => request.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path} through nginx: {e}"),
    };
    let status = response.status();
    let text = response.into_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The sum of one counter over every worker, from the admin API.
fn accepted(admin: &Admin) -> u64 {
    admin.get("/v1/stats")["totals"]["accepted"]
        .as_u64()
        .unwrap()
}

#[test]
fn money_moves_through_every_door_of_nginx_and_adds_up() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::new().ws().http().start();
    let admin = &serve.admin;
    let (gw_tcp, gw_ws, gw_http) = (
        serve.listen.to_string(),
        serve.ws_addr().to_string(),
        serve.http_addr().to_string(),
    );

    // The configuration, written by the real subcommand.
    let prefix = dir.path().join("nginx");
    let (http, wsock, tcp, static_200) = (free_port(), free_port(), free_port(), free_port());
    let conf = write_conf(
        &prefix,
        &[
            "--http-listen",
            &http.to_string(),
            "--http-upstream",
            &gw_http,
            "--ws-listen",
            &wsock.to_string(),
            "--ws-upstream",
            &gw_ws,
            "--tcp-listen",
            &tcp.to_string(),
            "--tcp-upstream",
            &gw_tcp,
            "--static-listen",
            &static_200.to_string(),
        ],
    );
    let mut nginx = Nginx::start(&prefix, &conf);
    nginx.wait_listening(&[http, wsock, tcp, static_200]);
    let agent = ureq::AgentBuilder::new().timeout(IO_TIMEOUT).build();

    // nginx's own 200, the baseline the benchmarks hold the API against.
    let (status, body) = call(&agent, static_200, "GET", "/anything", &[], None);
    assert_eq!((status, &body["result"]), (200, &json!("ok")));

    // Statuses pass through unchanged: no token is 401, a forged one too.
    let (status, body) = call(&agent, http, "POST", "/v1/shake", &[], None);
    assert_eq!(
        (status, body["result"].as_str()),
        (401, Some("bad-token")),
        "{body}"
    );
    let forged = vec![("Authorization", "Bearer 1.00".to_string())];
    assert_eq!(
        call(&agent, http, "POST", "/v1/shake", &forged, None).0,
        401
    );

    // User 1 wins two 100-cent packets over HTTP, each shake its own request on one
    // client connection; nginx keeps its upstream connections, so the gateways accept
    // few connections for many requests.
    let (status, reply) = admin.http(
        "POST",
        "/v1/campaigns/shake",
        Some(
            &json!({"packets": 10, "rate_per_sec": 1000, "amount_min": 100, "amount_max": 100})
                .to_string(),
        ),
    );
    assert_eq!(status, 201, "{reply}");
    let auth1 = vec![("Authorization", serve.bearer(1))];
    let before = accepted(admin);
    let (mut won, mut shakes) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while won < 200 {
        assert!(Instant::now() < deadline, "two wins took over 20 s");
        let (status, body) = call(&agent, http, "POST", "/v1/shake", &auth1, None);
        assert_eq!(status, 200, "{body}");
        shakes += 1;
        match body["result"].as_str() {
            Some("won") => won += body["amount_cents"].as_u64().unwrap(),
            Some("nothing") => std::thread::sleep(Duration::from_millis(5)),
            other => panic!("shake through nginx: {other:?} in {body}"),
        }
    }
    for _ in shakes..50 {
        assert_eq!(call(&agent, http, "GET", "/v1/ping", &[], None).0, 200);
    }
    let new_upstream = accepted(admin) - before;
    assert!(
        new_upstream <= 2,
        "{new_upstream} gateway connections for {} requests: upstream keep-alive is off",
        shakes.max(50)
    );
    assert_eq!(admin.balance(1), 200);

    // A send through nginx with an Idempotency-Key; the retry moves nothing.
    let mut send_headers = auth1.clone();
    send_headers.push(("Idempotency-Key", "through-nginx-1".to_string()));
    let send = json!({"amount_cents": 150, "shares": 3, "recipients": [2, 3, 4]});
    let (status, first) = call(
        &agent,
        http,
        "POST",
        "/v1/packets",
        &send_headers,
        Some(send.clone()),
    );
    assert_eq!(
        (status, first["result"].as_str()),
        (201, Some("ok")),
        "{first}"
    );
    let (status, again) = call(
        &agent,
        http,
        "POST",
        "/v1/packets",
        &send_headers,
        Some(send),
    );
    assert_eq!(status, 201);
    assert_eq!(again, first, "a retried send gets the first answer");
    let packet = first["packet_id"].as_u64().unwrap();
    assert_eq!(admin.balance(1), 50);

    // User 2 opens over WebSocket through nginx.
    let mut ws_user = WsClient::connect(wsock, SECRET);
    let login =
        ws_user.request_json(json!({"type": "login", "user_id": 2, "token": token(SECRET, 2)}));
    assert_eq!(login["result"], "ok", "{login}");
    let opened = ws_user.request_json(json!({"type": "open", "packet_id": packet}));
    assert_eq!(opened["result"], "opened", "{opened}");
    let ws_share = opened["amount_cents"].as_u64().unwrap();

    // User 3 over the binary protocol through the stream proxy.
    let mut tcp_user = common::login(tcp, 3, SECRET);
    let tcp_share = match tcp_user.open(packet).unwrap() {
        Message::OpenReply {
            result: ResultCode::Opened,
            amount_cents,
            ..
        } => amount_cents,
        other => panic!("open over TCP through nginx: {other:?}"),
    };

    // User 4 over HTTP; then the packet is empty.
    let auth4 = vec![("Authorization", serve.bearer(4))];
    let path = format!("/v1/packets/{packet}/open");
    let (status, body) = call(&agent, http, "POST", &path, &auth4, None);
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("opened")),
        "{body}"
    );
    let http_share = body["amount_cents"].as_u64().unwrap();
    assert_eq!(ws_share + tcp_share + http_share, 150);
    let auth5 = vec![("Authorization", serve.bearer(5))];
    let (_, body) = call(&agent, http, "POST", &path, &auth5, None);
    assert_eq!(body["result"], "not-a-recipient");

    // What each user sees is what the ledger holds, and every cent is accounted for.
    for (user, share) in [(2, ws_share), (3, tcp_share), (4, http_share), (1, 50)] {
        let auth = vec![("Authorization", serve.bearer(user))];
        let (status, me) = call(&agent, http, "GET", "/v1/me", &auth, None);
        assert_eq!(
            (status, me["balance_cents"].as_u64()),
            (200, Some(share)),
            "{me}"
        );
        assert_eq!(admin.balance(user), share);
    }
    admin.audit();
    drop(nginx);
    drop(serve);
}

#[test]
fn nginx_conf_refuses_a_plan_with_nothing_in_it() {
    for (args, complaint) in [
        (&["--worker-processes", "2"][..], "nothing to proxy"),
        (
            &[
                "--static-listen",
                "127.0.0.1:1",
                "--worker-processes",
                "many",
            ][..],
            "--worker-processes must be a number or auto",
        ),
    ] {
        let mut all = vec!["nginx-conf"];
        all.extend(args);
        let mut run = Hongbao::spawn("nginx-conf", &all);
        assert!(!run.wait_exit(Duration::from_secs(10)).success());
        wait_until(complaint, Duration::from_secs(5), || {
            run.stderr.lock().unwrap().contains(complaint).then_some(())
        });
    }
}

/// What came back on one connection for a request written as raw bytes.
#[derive(Debug)]
struct RawAnswer {
    /// The status; `None` for an answer without a head (HTTP/0.9's).
    status: Option<u16>,
    head: String,
    /// The body as JSON (`Null` when it is not JSON).
    body: Value,
    /// The connection ended after the answer (closed or reset).
    closed: bool,
}

impl RawAnswer {
    /// An error answer in the gateway's form: JSON with `result` and an `error` text,
    /// sent as JSON.
    fn assert_gateway_form(&self, what: &str, status: Option<u16>, result: &str) {
        assert_eq!(self.status, status, "{what}: {self:?}");
        assert_eq!(self.body["result"], result, "{what}: {self:?}");
        assert!(
            self.body["error"].is_string(),
            "{what}: no error text in {self:?}"
        );
        if self.status.is_some() {
            assert!(
                self.head
                    .to_ascii_lowercase()
                    .contains("content-type: application/json"),
                "{what}: {self:?}"
            );
        }
    }
}

/// Writes `request` on a new connection to `addr` and reads the one answer, waiting at
/// most `wait` for it; then whether the connection ends (half a second).
fn exchange(addr: SocketAddr, request: &[u8], wait: Duration) -> RawAnswer {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    // nginx may answer and close before it has read everything: the answer is what counts.
    let _ = stream.write_all(request);
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut closed = false;
    let mut wanted = None;
    loop {
        if wanted.is_none() && got.starts_with(b"HTTP/") {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                wanted = Some(end + 4 + length);
            }
        }
        if wanted.is_some_and(|n| got.len() >= n) {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Err(e) => panic!("no answer from {addr} in {wait:?}: {e}; got {got:?}"),
        }
    }
    if !closed {
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        closed = match stream.read(&mut chunk) {
            Ok(0) => true,
            Ok(n) => panic!("more than one answer: {:?}", &chunk[..n]),
            Err(e) => e.kind() == ErrorKind::ConnectionReset,
        };
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let (status, head, body) = match text.split_once("\r\n\r\n") {
        Some((head, body)) if text.starts_with("HTTP/") => (
            head.split_whitespace().nth(1).and_then(|s| s.parse().ok()),
            head.to_string(),
            body.to_string(),
        ),
        _ => (None, String::new(), text),
    };
    RawAnswer {
        status,
        head,
        body: serde_json::from_str(&body).unwrap_or(Value::Null),
        closed,
    }
}

/// A head trickled a byte a second never becomes a request: nginx closes the connection
/// without an answer (it has none for a timeout) `client_header_timeout` after the
/// connect. How long that took.
fn trickle_head(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    stream
        .write_all(b"GET /v1/ping HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        .unwrap();
    let mut chunk = [0u8; 1024];
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(14),
            "nginx still reads a trickled head after 14 s"
        );
        match stream.read(&mut chunk) {
            Ok(0) => return start.elapsed(),
            Ok(n) => panic!(
                "nginx answered a trickled head: {}",
                String::from_utf8_lossy(&chunk[..n])
            ),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return start.elapsed(),
        }
        if stream.write_all(b"x").is_err() {
            return start.elapsed();
        }
    }
}

/// Who answers a raw request sent through nginx.
#[derive(Clone, Copy)]
enum By {
    /// nginx itself: its answer for the status in `OWN_ANSWERS`, word for word (an
    /// HTTP/0.9 request gets the 400's body, without a head).
    Nginx,
    /// The gateway, with this `result`.
    Gateway(&'static str),
}

/// One raw request and what comes back through nginx.
struct Case {
    what: &'static str,
    request: Vec<u8>,
    status: Option<u16>,
    by: By,
    /// Whether the connection ends after the answer.
    closes: bool,
}

impl Case {
    fn check(&self, answer: &RawAnswer) {
        let what = self.what;
        let result = match self.by {
            By::Nginx => {
                let status = self.status.unwrap_or(400);
                let own = OWN_ANSWERS
                    .iter()
                    .find(|a| a.status == status)
                    .unwrap_or_else(|| panic!("{what}: nginx has no answer for {status}"));
                let expected: Value = serde_json::from_str(&own.body()).unwrap();
                assert_eq!(answer.body, expected, "{what}: {answer:?}");
                own.result.name()
            }
            By::Gateway(result) => result,
        };
        answer.assert_gateway_form(what, self.status, result);
        assert_eq!(answer.closed, self.closes, "{what}: {answer:?}");
    }
}

#[test]
fn nginx_answers_as_the_gateway_where_it_answers_first() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::new().http().workers(1).start();
    let gw_http = serve.http_addr().to_string();
    // The prefix lies in a directory only its owner may enter: run as root, nginx's workers
    // (nobody) could not write a temp file there, so a body nginx tried to spool would be
    // a 500, as it once was.
    let prefix = dir.path().join("nginx");
    let http = free_port();
    let conf = write_conf(
        &prefix,
        &[
            "--http-listen",
            &http.to_string(),
            "--http-upstream",
            &gw_http,
        ],
    );
    let mut nginx = Nginx::start(&prefix, &conf);
    nginx.wait_listening(&[http]);

    let post = |headers: &str, body: &[u8]| {
        let mut request =
            format!("POST /v1/chat HTTP/1.1\r\nHost: a\r\n{headers}\r\n").into_bytes();
        request.extend_from_slice(body);
        request
    };
    let get =
        |line: &str, headers: &str| format!("{line}\r\nHost: a\r\n{headers}\r\n").into_bytes();
    let long = "x".repeat(9000);
    let seventy_kb = vec![b'x'; 70_000];
    let mut chunked_70kb = Vec::new();
    for _ in 0..7 {
        chunked_70kb.extend_from_slice(b"2710\r\n");
        chunked_70kb.extend_from_slice(&[b'x'; 10_000]);
        chunked_70kb.extend_from_slice(b"\r\n");
    }
    chunked_70kb.extend_from_slice(b"0\r\n\r\n");
    // 60 KB in chunks of a byte: 360 KB on the wire, more than any buffer nginx holds.
    let mut tiny_chunks = b"1\r\nx\r\n".repeat(60_000);
    tiny_chunks.extend_from_slice(b"0\r\n\r\n");
    let many_headers: String = (0..70).map(|i| format!("X-H{i}: v\r\n")).collect();
    let case = |what, request, status, by, closes| Case {
        what,
        request,
        status,
        by,
        closes,
    };
    let cases = [
        // Refused by nginx before any gateway, as the gateway refuses them.
        case(
            "two different Content-Lengths",
            post("Content-Length: 2\r\nContent-Length: 3\r\n", b"{}"),
            Some(400),
            By::Nginx,
            true,
        ),
        case(
            "Content-Length with chunked",
            post(
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                b"0\r\n\r\n",
            ),
            Some(400),
            By::Nginx,
            true,
        ),
        case(
            "a malformed request line",
            get("G@T /v1/ping HTTP/1.1", ""),
            Some(400),
            By::Nginx,
            true,
        ),
        case(
            "an HTTP version other than 1.x",
            get("GET /v1/ping HTTP/2.0", ""),
            Some(400),
            By::Nginx,
            true,
        ),
        case(
            "a bad chunk size",
            post("Transfer-Encoding: chunked\r\n", b"zz\r\n"),
            Some(400),
            By::Nginx,
            true,
        ),
        case(
            "an unsupported transfer coding",
            post("Transfer-Encoding: gzip\r\n", b""),
            Some(501),
            By::Nginx,
            true,
        ),
        case(
            "a 9,000-byte header",
            get("GET /v1/ping HTTP/1.1", &format!("X-Big: {long}\r\n")),
            Some(431),
            By::Nginx,
            true,
        ),
        case(
            "a 9,000-byte URL",
            get(&format!("GET /v1/ping?{long} HTTP/1.1"), ""),
            Some(431),
            By::Nginx,
            true,
        ),
        case(
            "a 70 KB body",
            post("Content-Length: 70000\r\n", &seventy_kb),
            Some(413),
            By::Nginx,
            true,
        ),
        case(
            "a 70 KB chunked body",
            post("Transfer-Encoding: chunked\r\n", &chunked_70kb),
            Some(413),
            By::Nginx,
            true,
        ),
        // Where nginx differs from the gateway (docs/nginx.md).
        case(
            "two equal Content-Lengths",
            post("Content-Length: 2\r\nContent-Length: 2\r\n", b"{}"),
            Some(400),
            By::Nginx,
            true,
        ),
        case(
            "TRACE",
            get("TRACE / HTTP/1.1", ""),
            Some(405),
            By::Nginx,
            true,
        ),
        case(
            "HTTP/0.9 (no version)",
            b"GET /v1/ping\r\n".to_vec(),
            None,
            By::Nginx,
            true,
        ),
        case(
            "nginx's own answer paths",
            get("GET /.nginx-answer/400 HTTP/1.1", ""),
            Some(404),
            By::Nginx,
            false,
        ),
        case(
            "70 headers: the gateway's 431, and nginx keeps the connection",
            get("GET /v1/ping HTTP/1.1", &many_headers),
            Some(431),
            By::Gateway("bad-request"),
            false,
        ),
        // Passed on whole, from memory: a 500 here would be a body nginx tried to spool.
        case(
            "60 KB in 1-byte chunks",
            post("Transfer-Encoding: chunked\r\n", &tiny_chunks),
            Some(401),
            By::Gateway("bad-token"),
            false,
        ),
    ];

    std::thread::scope(|s| {
        // The two timeouts take about 10 s each: they run alongside the rest.
        let head = s.spawn(|| trickle_head(http));
        let body = s.spawn(|| {
            let start = Instant::now();
            let answer = exchange(
                http,
                &post("Content-Length: 10\r\n", b"{\""),
                Duration::from_secs(14),
            );
            (start.elapsed(), answer)
        });

        for case in &cases {
            case.check(&exchange(http, &case.request, IO_TIMEOUT));
        }

        let took = head.join().unwrap();
        assert!(
            (Duration::from_secs(9)..Duration::from_secs(12)).contains(&took),
            "a trickled head was cut after {took:?}, not client_header_timeout (10 s)"
        );
        // The stalled body: nginx passed the head on as it came, so the gateway's deadline
        // runs, and its 408 reaches the client before nginx's own (silent) body timeout.
        let (took, answer) = body.join().unwrap();
        answer.assert_gateway_form("a stalled body", Some(408), "bad-request");
        assert!(answer.closed, "{answer:?}");
        assert!(
            took < Duration::from_secs(12),
            "a stalled body took {took:?} to refuse"
        );
    });

    // No gateway: nginx's 502, in the gateway's form ("try again later").
    drop(serve);
    wait_until(
        "nginx's 502 without a gateway",
        Duration::from_secs(15),
        || {
            let answer = exchange(http, &get("GET /v1/ping HTTP/1.1", ""), IO_TIMEOUT);
            (answer.status == Some(502)).then_some(answer)
        },
    )
    .assert_gateway_form("no gateway", Some(502), "unavailable");
    drop(nginx);
}

#[test]
fn nginx_md_lists_every_answer_nginx_gives_itself() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/nginx.md")).unwrap();
    for answer in OWN_ANSWERS {
        assert!(
            doc.contains(answer.error),
            "docs/nginx.md does not give nginx's {} answer {:?}",
            answer.status,
            answer.error
        );
    }
}

/// A TLS connection to `addr` from source address `source`, trusting `ca_pem`.
fn tls_from(
    source: &str,
    addr: SocketAddr,
    ca_pem: &str,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    let from: SocketAddr = format!("{source}:0").parse().unwrap();
    socket.bind(&from.into())?;
    socket.connect(&addr.into())?;
    let tcp: TcpStream = socket.into();
    tcp.set_read_timeout(Some(IO_TIMEOUT))?;
    let config =
        hongbao_http::tls::client_config(ca_pem.as_bytes(), &[hongbao_http::tls::ALPN_FRAMES])
            .unwrap();
    let session = rustls::ClientConnection::new(config, "127.0.0.1".try_into().unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(session, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// nginx terminating TLS in front, passing each binary-protocol client's address in a
/// PROXY protocol header: the gateway counts its limits per source on the clients, not
/// on nginx. Two connections not logged in from one client address are one too many
/// (`max_unauthenticated_per_source = 1`); one from another address is not.
#[test]
fn nginx_terminates_tls_and_passes_the_clients_address() {
    let dir = tempfile::tempdir().unwrap();
    let certs = hongbao_http::tls::DevCerts::make(&["127.0.0.1"]).unwrap();
    let files = certs.write(&dir.path().join("tls")).unwrap();
    // nginx's connections leave from its eight loopback sources (`--upstream-sources`
    // auto): the gateway trusts them as the proxy's.
    let sources: Vec<String> = hongbao_lab::nginx::loopback_upstream_sources()
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect();
    let serve = Serve::new()
        .workers(1)
        .config(&format!(
            "trusted_proxies = [{}]\nmax_unauthenticated_per_source = 1\n",
            sources.join(", ")
        ))
        .start();
    let prefix = dir.path().join("nginx");
    let tcp = free_port();
    let conf = write_conf(
        &prefix,
        &[
            "--tcp-listen",
            &tcp.to_string(),
            "--tcp-upstream",
            &serve.listen.to_string(),
            "--tls-cert",
            files.cert.to_str().unwrap(),
            "--tls-key",
            files.key.to_str().unwrap(),
            "--proxy-protocol",
        ],
    );
    let mut nginx = Nginx::start(&prefix, &conf);
    nginx.wait_listening(&[tcp]);
    let ca = certs.ca_pem.as_str();

    // A client through nginx's TLS logs in and shakes.
    let mut client =
        hongbao_proto::client::Client::connect_tls(tcp, "127.0.0.1", ca.as_bytes()).unwrap();
    client.set_timeout(IO_TIMEOUT).unwrap();
    assert_eq!(client.login(&token(SECRET, 1)).unwrap(), ResultCode::Ok);
    assert!(matches!(
        client.shake().unwrap(),
        Message::ShakeReply {
            result: ResultCode::Nothing,
            ..
        }
    ));

    // Per source, as the clients are: 127.0.0.2 may hold one connection not logged in,
    // not two; 127.0.0.3 one of its own.
    let _first = tls_from("127.0.0.2", tcp, ca).unwrap();
    wait_until(
        "the gateway to count the first",
        Duration::from_secs(5),
        || (serve.stats()["totals"]["accepted"].as_u64()? >= 2).then_some(()),
    );
    let mut second = tls_from("127.0.0.2", tcp, ca).unwrap();
    let mut byte = [0u8; 1];
    let closed = matches!(second.read(&mut byte), Ok(0) | Err(_));
    assert!(
        closed,
        "a second connection not logged in from one client is closed"
    );
    let mut other = tls_from("127.0.0.3", tcp, ca).unwrap();
    other
        .write_all(&hongbao_proto::encode_to_vec(&hongbao_proto::Frame {
            request_id: 1,
            message: Message::Ping { client_time_us: 1 },
        }))
        .unwrap();
    other
        .read_exact(&mut byte)
        .expect("another client's connection is served");
    wait_until("the refusal counted", Duration::from_secs(5), || {
        (serve.stats()["totals"]["rejected_unauthenticated"].as_u64()? >= 1).then_some(())
    });
    drop(nginx);
}

/// The remote addresses of the connections established to `port` on this machine, from
/// /proc/net/tcp (IPv4, little-endian hex).
fn peers_of_port(port: u16) -> Vec<std::net::Ipv4Addr> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, state) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
            let local_port = u16::from_str_radix(local.split(':').nth(1)?, 16).ok()?;
            if local_port != port || *state != "01" {
                return None;
            }
            let ip = u32::from_str_radix(remote.split(':').next()?, 16).ok()?;
            Some(std::net::Ipv4Addr::from(ip.swap_bytes()))
        })
        .collect()
}

/// nginx's connections to a gateway leave from several source addresses, spread by
/// connection (`proxy_bind` over `split_clients`): one address runs out of ports to a
/// gateway past ~32,000 clients through one nginx (issue 51). Every client gets through.
#[test]
fn nginx_spreads_its_upstream_connections_over_source_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::new().workers(1).start();
    let prefix = dir.path().join("nginx");
    let tcp = free_port();
    let conf = write_conf(
        &prefix,
        &[
            "--tcp-listen",
            &tcp.to_string(),
            "--tcp-upstream",
            &serve.listen.to_string(),
        ],
    );
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(
        text.contains("proxy_bind $hongbao_upstream_source;"),
        "{text}"
    );
    let mut nginx = Nginx::start(&prefix, &conf);
    nginx.wait_listening(&[tcp]);
    let clients: Vec<_> = (1..=40u64)
        .map(|user| {
            let mut client = hongbao_proto::client::Client::connect(tcp).unwrap();
            client.set_timeout(IO_TIMEOUT).unwrap();
            assert_eq!(client.login(&token(SECRET, user)).unwrap(), ResultCode::Ok);
            client
        })
        .collect();
    let sources: std::collections::BTreeSet<_> =
        peers_of_port(serve.listen.port()).into_iter().collect();
    let allowed: Vec<std::net::IpAddr> = hongbao_lab::nginx::loopback_upstream_sources();
    assert!(
        sources
            .iter()
            .all(|s| allowed.contains(&std::net::IpAddr::V4(*s))),
        "every upstream connection from a source of nginx's: {sources:?}"
    );
    assert!(sources.len() >= 4, "spread over several: {sources:?}");
    drop(clients);
    drop(nginx);
}
