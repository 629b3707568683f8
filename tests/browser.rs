//! The browser-facing parts in a real headless Chromium: the gateway's client page
//! (`crates/server/src/page.html`, served at `GET /` of `serve --ws-listen`) and the
//! monitor's live dashboard. Chromium is driven over the DevTools protocol (a WebSocket
//! from `--remote-debugging-port`): `Runtime.evaluate` types and clicks as a person
//! would, `Page.captureScreenshot` takes the pictures.
//!
//! Chromium is required, not optional: if it is missing these tests fail with a message
//! saying so (CI installs it), because a skipped browser test looks the same as a passing
//! one. Set `CHROMIUM` to use a binary other than `/usr/bin/chromium` or `chromium` on
//! the PATH.
//!
//! Every process a test starts is held by a guard that kills it when the test ends;
//! Chromium runs in a process group of its own so its helpers die with it. Screenshots
//! are written under `CARGO_TARGET_TMPDIR/browser/`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::{monitor_key_file, start_monitor, wait_until, Serve, Server, SECRET, START_TIMEOUT};
use hongbao_proto::client::Client;
use hongbao_proto::{Message, ResultCode};
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::WebSocket;

/// How long one DevTools command may take to be answered.
const CDP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the page may take to show the effect of a click or a push.
const UI_TIMEOUT: Duration = Duration::from_secs(20);
/// The phone-sized viewport the client page must fit.
const PHONE: (u32, u32) = (360, 640);
/// The user logged in on the page, and the one on TCP who sends it a packet.
const PAGE_USER: u64 = 1001;
const TCP_USER: u64 = 2002;

// ----- HTTP ------------------------------------------------------------------------------

fn http() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(15))
        .build()
}

fn get_json(url: &str) -> Value {
    let response = http()
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    response
        .into_json()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

// ----- Chromium and the DevTools protocol ------------------------------------------------

/// The Chromium binary: `$CHROMIUM`, `/usr/bin/chromium`, or `chromium` on the PATH. Its
/// absence fails the test: it is a requirement, like the Rust toolchain.
fn chromium_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("chromium"));
    std::iter::once(PathBuf::from("/usr/bin/chromium"))
        .chain(on_path)
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "tests/browser.rs needs headless Chromium and found none (looked for $CHROMIUM, \
                 /usr/bin/chromium and `chromium` on the PATH). Install it (Debian/Ubuntu: \
                 `apt-get install chromium`) or point $CHROMIUM at a Chrome/Chromium binary."
            )
        })
}

/// A headless Chromium with a throw-away profile. Dropping it kills its whole process
/// group (the browser and its renderer, GPU and zygote helpers), by the group's id.
struct Chromium {
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// `ws://127.0.0.1:PORT/devtools/browser/ID`
    devtools_url: String,
    _profile: tempfile::TempDir,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.stderr.lock().map(|s| s.clone()).unwrap_or_default();
            eprintln!("----- chromium stderr -----\n{log}-----");
        }
    }
}

impl Chromium {
    fn launch() -> Chromium {
        Chromium::launch_with(&[])
    }

    /// A Chromium given `extra` arguments too.
    fn launch_with(extra: &[String]) -> Chromium {
        let binary = chromium_binary();
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(&binary)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .args(extra)
            .args(["--no-first-run", "--no-default-browser-check"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--remote-debugging-port=0")
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        // Chromium says where DevTools listens on stderr; keep reading it afterwards so
        // it never blocks on a full pipe.
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = channel();
        let pipe = child.stderr.take().unwrap();
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(at) = line.find("ws://") {
                    if line.contains("DevTools listening on") {
                        let _ = tx.send(line[at..].trim().to_string());
                    }
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut chromium = Chromium {
            child,
            stderr,
            devtools_url: String::new(),
            _profile: profile,
        };
        chromium.devtools_url = rx.recv_timeout(START_TIMEOUT).unwrap_or_else(|_| {
            let log = chromium.stderr.lock().unwrap().clone();
            panic!(
                "{} printed no `DevTools listening on ws://...` line within {:?}; stderr:\n{log}",
                binary.display(),
                START_TIMEOUT
            )
        });
        chromium
    }

    /// A new tab, attached with a flat DevTools session, at the given viewport size.
    fn new_page(&self, width: u32, height: u32, mobile: bool) -> Page {
        let (socket, _) = tungstenite::connect(self.devtools_url.as_str())
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.devtools_url));
        if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
            // Short reads so a call can check its deadline between messages.
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
        }
        let mut page = Page {
            socket,
            next_id: 1,
            session: None,
            console: Vec::new(),
            in_flight: BTreeMap::new(),
        };
        let target = page.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = page.call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        page.session = Some(attached["sessionId"].as_str().unwrap().to_string());
        for domain in [
            "Page.enable",
            "Runtime.enable",
            "Log.enable",
            "Network.enable",
        ] {
            page.call(domain, json!({}));
        }
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        );
        page
    }
}

/// One tab, driven over the browser's DevTools WebSocket with a flat session.
struct Page {
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    session: Option<String>,
    /// Console messages, uncaught exceptions, browser log entries and failed requests,
    /// for diagnostics.
    console: Vec<String>,
    /// HTTP requests sent and not finished yet (DevTools request id → method and URL).
    in_flight: BTreeMap<String, String>,
}

impl Page {
    /// One DevTools command; its `result`. Events that arrive meanwhile are noted in
    /// `console` when they are console output, exceptions or log entries.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            command["sessionId"] = json!(session);
        }
        self.socket
            .send(tungstenite::Message::text(command.to_string()))
            .unwrap_or_else(|e| panic!("DevTools {method}: {e}"));
        let deadline = Instant::now() + CDP_TIMEOUT;
        loop {
            assert!(
                Instant::now() < deadline,
                "DevTools {method}: no answer within {CDP_TIMEOUT:?}"
            );
            let message = match self.socket.read() {
                Ok(tungstenite::Message::Text(text)) => text,
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => panic!("DevTools {method}: {e}"),
            };
            let message: Value = serde_json::from_str(message.as_str()).unwrap();
            if message["id"] == id {
                if let Some(error) = message.get("error") {
                    panic!("DevTools {method} failed: {error}");
                }
                return message["result"].clone();
            }
            self.note_event(&message);
        }
    }

    fn note_event(&mut self, event: &Value) {
        let params = &event["params"];
        let line = match event["method"].as_str() {
            Some("Runtime.consoleAPICalled") => {
                let args: Vec<String> = params["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| a.get("value").unwrap_or(&a["description"]).to_string())
                    .collect();
                format!("console.{}: {}", params["type"], args.join(" "))
            }
            Some("Runtime.exceptionThrown") => format!(
                "exception: {}",
                params["exceptionDetails"]["exception"]["description"]
            ),
            Some("Log.entryAdded") => format!(
                "log {}: {} {}",
                params["entry"]["level"], params["entry"]["text"], params["entry"]["url"]
            ),
            Some("Network.requestWillBeSent") => {
                let request = &params["request"];
                let what = format!("{} {}", request["method"], request["url"]);
                self.in_flight.insert(params["requestId"].to_string(), what);
                return;
            }
            Some("Network.loadingFinished") => {
                self.in_flight.remove(&params["requestId"].to_string());
                return;
            }
            Some("Network.loadingFailed") => {
                let what = self.in_flight.remove(&params["requestId"].to_string());
                format!(
                    "request failed: {} {}",
                    what.unwrap_or_default(),
                    params["errorText"]
                )
            }
            _ => return,
        };
        self.console.push(line);
    }

    fn navigate(&mut self, url: &str) {
        let navigated = self.call("Page.navigate", json!({"url": url}));
        if let Some(error) = navigated.get("errorText") {
            panic!("navigating to {url}: {error}");
        }
        self.wait_for(
            &format!("{url} to load"),
            "document.readyState === 'complete'",
        );
    }

    /// The value of a JavaScript expression (JSON-serialisable); fails on an exception.
    fn eval(&mut self, expression: &str) -> Value {
        let reply = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(details) = reply.get("exceptionDetails") {
            panic!(
                "evaluating {expression}: {}\n{}",
                details["exception"]["description"],
                self.diagnostics()
            );
        }
        reply["result"]["value"].clone()
    }

    /// Polls `expression` until it is truthy (not false, null, 0 or ""); returns its value.
    fn wait_for(&mut self, what: &str, expression: &str) -> Value {
        let deadline = Instant::now() + UI_TIMEOUT;
        loop {
            let value = self.eval(expression);
            let truthy = match &value {
                Value::Null | Value::Bool(false) => false,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {UI_TIMEOUT:?} waiting for {what} ({expression})\n{}",
                    self.diagnostics()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn text(&mut self, selector: &str) -> String {
        let expression =
            format!("(document.querySelector({selector:?}) || {{textContent: ''}}).textContent");
        self.eval(&expression)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn click(&mut self, selector: &str) {
        let clicked = self.eval(&format!(
            "(() => {{ const el = document.querySelector({selector:?}); \
             if (!el || el.disabled) return false; el.click(); return true; }})()"
        ));
        assert_eq!(
            clicked,
            json!(true),
            "{selector} is missing or disabled\n{}",
            self.diagnostics()
        );
    }

    /// Types into an input as a person would: sets the value and fires `input`.
    fn type_into(&mut self, selector: &str, text: &str) {
        let typed = self.eval(&format!(
            "(() => {{ const el = document.querySelector({selector:?}); if (!el) return false; \
             el.focus(); el.value = {text:?}; \
             el.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})()"
        ));
        assert_eq!(typed, json!(true), "no {selector} to type into");
    }

    /// What the page shows (its text, the client page's log included), what the console
    /// said, and the requests still in flight: printed on failures.
    fn diagnostics(&mut self) -> String {
        let page = self
            .call(
                "Runtime.evaluate",
                json!({
                    "expression": "document.body ? document.body.innerText.slice(-4000) : ''",
                    "returnByValue": true,
                }),
            )
            .get("result")
            .and_then(|r| r.get("value"))
            .and_then(Value::as_str)
            .unwrap_or("(page not readable)")
            .to_string();
        let in_flight: Vec<&str> = self.in_flight.values().map(String::as_str).collect();
        format!(
            "----- page text -----\n{page}\n----- console -----\n{}\n\
             ----- requests in flight -----\n{}\n-----",
            self.console.join("\n"),
            in_flight.join("\n")
        )
    }

    /// A PNG of the whole page (beyond the viewport), at the viewport's width.
    fn screenshot(&mut self, width: u32) -> Vec<u8> {
        let height = self
            .eval("Math.ceil(document.documentElement.scrollHeight)")
            .as_u64()
            .unwrap();
        let shot = self.call(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            }),
        );
        let data = shot["data"].as_str().expect("screenshot data");
        data_encoding::BASE64
            .decode(data.as_bytes())
            .expect("screenshot is base64")
    }
}

/// Checks that `png` is a PNG of the given width and over 10 KB (a blank page is far
/// smaller), and writes it under the target directory; returns its path.
fn save_screenshot(png: &[u8], width: u32, name: &str) -> PathBuf {
    assert!(
        png.len() > 10 * 1024,
        "{name}: {} bytes is too small for a rendered page",
        png.len()
    );
    let decoder = png::Decoder::new(png);
    let reader = decoder
        .read_info()
        .unwrap_or_else(|e| panic!("{name} is not a PNG: {e}"));
    assert_eq!(reader.info().width, width, "{name} width");
    assert!(reader.info().height > 0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
    path
}

/// "¥12.34" (anywhere in `text`) → 1234 cents.
fn cents_in(text: &str) -> u64 {
    let at = text
        .find('¥')
        .unwrap_or_else(|| panic!("no ¥ amount in {text:?}"));
    let amount: String = text[at + '¥'.len_utf8()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let (yuan, fen) = amount
        .split_once('.')
        .unwrap_or_else(|| panic!("{text:?}: amount without 2 decimals"));
    assert_eq!(fen.len(), 2, "{text:?}: amount without 2 decimals");
    yuan.parse::<u64>().unwrap() * 100 + fen.parse::<u64>().unwrap()
}

// ----- the client page -------------------------------------------------------------------

/// Shakes until a win (bounded); returns the amount won.
fn tcp_shake_until_won(client: &mut Client) -> u64 {
    wait_until("the TCP user to win a shake", UI_TIMEOUT, || {
        match client.shake().expect("shake") {
            Message::ShakeReply {
                result: ResultCode::Won,
                amount_cents,
                ..
            } => Some(amount_cents),
            Message::ShakeReply { .. } => None,
            other => panic!("unexpected shake reply {other:?}"),
        }
    })
}

/// The next push that is not a broadcast (broadcasts go to every connection).
fn next_non_broadcast_push(client: &mut Client) -> Message {
    loop {
        let push = client.next_push().expect("waiting for a push");
        if !matches!(push.message, Message::Broadcast { .. }) {
            return push.message;
        }
    }
}

fn ledger_balance(serve: &Server, user: u64) -> u64 {
    let view = serve.get(&format!("/v1/users/{user}"));
    view["balance_cents"]
        .as_u64()
        .unwrap_or_else(|| panic!("no balance_cents in {view}"))
}

#[test]
fn browser_client_logs_in_shakes_wins_and_opens_a_packet() {
    let started = Instant::now();
    let mut serve = Serve::new().dev_secret().demo_login().ws().start();
    // Slow enough that the first shakes may find nothing, quick enough to win soon.
    serve.shake_campaign(50, 20, 100, 500);

    let chromium = Chromium::launch();
    let mut page = chromium.new_page(PHONE.0, PHONE.1, true);
    page.navigate(&format!("http://{}/", serve.ws_addr()));
    assert_eq!(page.eval("document.title"), json!("hongbao"));

    // Log in: the page fetches a token from /token and sends `login`.
    page.type_into("#user", &PAGE_USER.to_string());
    page.click("#login");
    let logged_in = format!("logged in as {PAGE_USER}");
    page.wait_for(
        "the page to log in",
        &format!("document.querySelector('#status').textContent.includes({logged_in:?})"),
    );
    assert_eq!(page.text("#balance"), "¥0.00");

    // Shake until the page says "won".
    let deadline = Instant::now() + UI_TIMEOUT;
    while !page.text("#last-result").contains("won") {
        assert!(
            Instant::now() < deadline,
            "the page never won a shake\n{}",
            page.diagnostics()
        );
        page.click("#shake");
        std::thread::sleep(Duration::from_millis(150));
    }
    // Let a shake still in flight land before reading the balance.
    std::thread::sleep(Duration::from_millis(300));
    let won_on_page: u64 = page
        .eval("Array.from(document.querySelectorAll('#wins li:not(.empty)')).map(li => li.textContent)")
        .as_array()
        .unwrap()
        .iter()
        .map(|text| cents_in(text.as_str().unwrap()))
        .sum();
    assert!(won_on_page >= 100, "won {won_on_page} cents");
    assert_eq!(cents_in(&page.text("#balance")), won_on_page);

    // A TCP user wins money and sends the page's user a packet of two shares.
    let mut sender = serve.login(TCP_USER);
    let sender_won = tcp_shake_until_won(&mut sender);
    let packet_id = match sender
        .send_packet(sender_won, 2, &[PAGE_USER, 3003])
        .expect("send")
    {
        Message::SendReply {
            result: ResultCode::Ok,
            packet_id,
            ..
        } => packet_id,
        other => panic!("send from the TCP user: {other:?}"),
    };

    // The notice shows up; open it.
    let notice = format!("#notices li[data-packet='{packet_id}']");
    page.wait_for(
        "the packet notice",
        &format!("!!document.querySelector({notice:?})"),
    );
    let notice_text = page.text(&notice);
    assert!(
        notice_text.contains(&format!("user {TCP_USER}")),
        "{notice_text}"
    );
    assert_eq!(cents_in(&notice_text), sender_won, "{notice_text}");
    // Its expiry with the date: a packet lives a day, so a time alone would not say which.
    let expires: String = notice_text
        .split("expires ")
        .nth(1)
        .unwrap_or_default()
        .chars()
        .take(16)
        .map(|c| if c.is_ascii_digit() { 'N' } else { c })
        .collect();
    assert_eq!(expires, "NNNN-NN-NN NN:NN", "{notice_text}");
    page.click(&format!("{notice} button.open"));
    page.wait_for(
        "the packet to be opened",
        &format!("document.querySelector({notice:?}).dataset.state === 'opened'"),
    );
    let opened = cents_in(&page.text(&format!("{notice} .outcome")));
    assert!(
        (1..=sender_won).contains(&opened),
        "opened {opened} of {sender_won}"
    );
    let balance = cents_in(&page.text("#balance"));
    assert_eq!(balance, won_on_page + opened);
    assert_eq!(
        ledger_balance(&serve, PAGE_USER),
        balance,
        "the ledger and the page disagree"
    );

    // The page sends 0.50 to the TCP user; the balance follows the send reply.
    page.type_into("#send-amount", "0.50");
    page.type_into("#send-shares", "1");
    page.type_into("#send-to", &TCP_USER.to_string());
    page.click("#send");
    page.wait_for(
        "the send to succeed",
        "document.querySelector('#send-result').textContent.startsWith('sent')",
    );
    match next_non_broadcast_push(&mut sender) {
        Message::PacketNotice {
            from_user,
            amount_cents,
            shares,
            ..
        } => {
            assert_eq!((from_user, amount_cents, shares), (PAGE_USER, 50, 1));
        }
        other => panic!("expected a packet notice for the TCP user, got {other:?}"),
    }
    let balance = cents_in(&page.text("#balance"));
    assert_eq!(balance, won_on_page + opened - 50);
    assert_eq!(ledger_balance(&serve, PAGE_USER), balance);

    // A broadcast arrives with its delay.
    let text = "新年快乐 from the browser test";
    serve.post("/v1/broadcast", &json!({"text": text}));
    let shown = page.wait_for(
        "the broadcast",
        &format!(
            "(Array.from(document.querySelectorAll('#broadcasts li'))\
             .find(li => li.textContent.includes({text:?})) || {{}}).textContent"
        ),
    );
    assert!(
        shown.as_str().unwrap().contains("delay"),
        "{shown}\n{}",
        page.diagnostics()
    );

    // Logging in as the page's user elsewhere kicks the page; it says why and reconnects.
    let _elsewhere = serve.login(PAGE_USER);
    page.wait_for(
        "the page to show the kick",
        "document.querySelector('#status').textContent.includes('replaced')",
    );
    assert_eq!(
        page.eval("document.querySelector('#shake').disabled"),
        json!(true)
    );
    page.click("#login");
    page.wait_for(
        "the page to log in again",
        &format!("document.querySelector('#status').textContent.includes({logged_in:?})"),
    );
    assert_eq!(
        cents_in(&page.text("#balance")),
        balance,
        "the balance is kept across a reconnect"
    );

    // Fits a phone: no horizontal scroll at 360 px.
    let scroll_width = page
        .eval("document.documentElement.scrollWidth")
        .as_u64()
        .unwrap();
    assert!(
        scroll_width <= u64::from(PHONE.0),
        "the page scrolls sideways at {} px: scrollWidth {scroll_width}",
        PHONE.0
    );
    let png = page.screenshot(PHONE.0);
    save_screenshot(&png, PHONE.0, "hongbao-page.png");

    assert_eq!(
        serve.get("/v1/audit")["ok"],
        true,
        "the money does not add up"
    );
    drop(page);
    drop(chromium);
    serve.process.interrupt();
    eprintln!("browser client test took {:?}", started.elapsed());
}

#[test]
fn browser_client_asks_for_a_token_when_the_server_hands_none_out() {
    // With a secret of its own the server has no `/token` (404): the page must ask for
    // the token instead, and log in with what is pasted.
    let mut serve = Serve::new().ws().start();
    let chromium = Chromium::launch();
    let mut page = chromium.new_page(PHONE.0, PHONE.1, true);
    page.navigate(&format!("http://{}/", serve.ws_addr()));
    assert_eq!(
        page.eval("document.querySelector('#token-box').hidden"),
        json!(true),
        "the token field shows before it is needed"
    );

    page.type_into("#user", "42");
    page.click("#login");
    page.wait_for(
        "the page to ask for a token",
        "!document.querySelector('#token-box').hidden && \
         document.querySelector('#status').textContent.includes('token')",
    );
    // A wrong token: the server refuses it and closes; the page says so.
    page.type_into("#token", &"00".repeat(32));
    page.click("#login");
    page.wait_for(
        "the page to show the refused login",
        "document.querySelector('#status').textContent.includes('bad-token')",
    );
    let token = common::token(SECRET, 42);
    page.type_into("#token", &token);
    page.click("#login");
    page.wait_for(
        "the page to log in with the pasted token",
        "document.querySelector('#status').textContent.includes('logged in as 42')",
    );
    page.click("#shake");
    page.wait_for(
        "a shake result (no campaign: nothing)",
        "document.querySelector('#last-result').textContent.includes('nothing')",
    );
    drop(page);
    drop(chromium);
    serve.process.interrupt();
}

// ----- the monitor's dashboard -----------------------------------------------------------

#[test]
fn dashboard_renders_charts_in_chromium() {
    let started = Instant::now();
    let out = tempfile::tempdir().unwrap();
    let (mut monitor, monitor_addr) = start_monitor(out.path());
    let monitor_arg = monitor_addr.to_string();
    let key_file = monitor_key_file(out.path());
    let mut serve = Serve::new()
        .dev_secret()
        .ws()
        .args([
            "--monitor",
            &monitor_arg,
            "--monitor-key-file",
            key_file.to_str().unwrap(),
        ])
        .start();
    let base = format!("http://{monitor_addr}");

    // Rows are written a few seconds after their second ends: wait for a few of the
    // server's, so the charts have lines to draw.
    wait_until(
        "the monitor to write 3 server rows",
        Duration::from_secs(30),
        || {
            let csv = http()
                .get(&format!("{base}/v1/series.csv"))
                .call()
                .ok()?
                .into_string()
                .ok()?;
            let server_rows = csv.lines().filter(|l| l.contains(",server,")).count();
            (server_rows >= 3).then_some(())
        },
    );
    let charts = get_json(&format!("{base}/v1/charts"));
    let charts = charts.as_array().expect("/v1/charts is a list").len();
    assert!(charts >= 8, "only {charts} charts");

    let chromium = Chromium::launch();
    let mut page = chromium.new_page(1280, 900, false);
    page.navigate(&format!("{base}/"));
    let drawn = page.wait_for(
        "every chart to be drawn",
        &format!(
            "(() => {{ const svgs = Array.from(document.querySelectorAll('[id^=chart-] svg')); \
             const drawn = svgs.filter(s => s.querySelector('path, polyline')).length; \
             return svgs.length === {charts} && drawn === {charts} && drawn; }})()"
        ),
    );
    assert_eq!(drawn, json!(charts));
    let png = page.screenshot(1280);
    save_screenshot(&png, 1280, "hongbao-dashboard.png");

    drop(page);
    drop(chromium);
    serve.process.interrupt();
    monitor.interrupt();
    eprintln!("dashboard test took {:?}", started.elapsed());
}

/// The operator console at the admin address, in Chromium: a wrong key refused; the
/// operator logs in (an HttpOnly cookie the page cannot read), sees the live stats,
/// starts a campaign, broadcasts, looks a user up, audits, reads the admin log; a change
/// without the session's CSRF token is refused, and so is one from another origin that
/// carries the cookie; a viewer is offered nothing that changes anything; a key removed
/// ends its session.
#[test]
fn operator_console_in_chromium() {
    let serve = Serve::new().ws().start();
    let admin = format!("http://{}", serve.admin.addr);
    let viewer_key = serve.admin.make_key("watcher", "viewer");
    let chromium = Chromium::launch();
    let mut page = chromium.new_page(1280, 900, false);
    page.navigate(&format!("{admin}/"));
    assert_eq!(page.eval("document.title"), json!("hongbao console"));
    page.wait_for(
        "the log-in form",
        "!document.querySelector('#login').hidden",
    );

    page.type_into("#key", "hbk_not-a-key");
    page.click("#login-form button");
    page.wait_for(
        "the wrong key to be refused",
        "document.querySelector('#login-error').textContent.includes('unknown')",
    );
    page.type_into("#key", &serve.admin.key());
    page.click("#login-form button");
    page.wait_for("the console", "!document.querySelector('#console').hidden");
    assert!(
        page.text("#who").contains("operator"),
        "{}",
        page.text("#who")
    );
    assert_eq!(
        page.eval("document.cookie"),
        json!(""),
        "the session cookie is HttpOnly"
    );
    page.wait_for(
        "the live stats",
        "document.querySelector('#stats').textContent.includes('connections')",
    );

    // A campaign from the form, a broadcast, a user, the audit, the log.
    page.click("#shake-form button");
    page.wait_for(
        "the campaign to start",
        "document.querySelector('#campaign-result').textContent.includes('started campaign')",
    );
    page.wait_for(
        "the campaign in the list, named for its key",
        "document.querySelector('#campaigns').textContent.includes('operator')",
    );
    page.type_into("#broadcast-form input[name=text]", "新年快乐");
    page.click("#broadcast-form button");
    page.wait_for(
        "the broadcast",
        "document.querySelector('#broadcast-result').textContent.includes('sent to')",
    );
    page.click("#user-form button");
    page.wait_for(
        "a user's balance",
        "document.querySelector('#user-balance')",
    );
    page.click("#audit-button");
    page.wait_for(
        "the audit",
        "document.querySelector('#audit').textContent.includes('\"ok\": true')",
    );
    page.click("#log-button");
    page.wait_for(
        "the admin log",
        "document.querySelector('#log').textContent.includes('/v1/campaigns/shake')",
    );

    // Forged: the same origin without the CSRF token, and another origin (the gateway's
    // page, another port: its requests carry the cookie) with a simple POST.
    let body = r#"{"packets":1,"rate_per_sec":1,"amount_min":1,"amount_max":1}"#;
    let forged = page.eval(&format!(
        "fetch('/v1/campaigns/shake', {{method: 'POST', credentials: 'same-origin', \
         headers: {{'Content-Type': 'application/json'}}, body: {body:?}}}).then(r => r.status)"
    ));
    assert_eq!(forged, json!(403), "a change without the CSRF token");
    let mut elsewhere = chromium.new_page(800, 600, false);
    elsewhere.navigate(&format!("http://{}/", serve.ws_addr()));
    elsewhere.eval(&format!(
        "fetch('{admin}/v1/campaigns/shake', {{method: 'POST', mode: 'no-cors', \
         credentials: 'include', headers: {{'Content-Type': 'text/plain'}}, body: {body:?}}})\
         .then(() => true, () => true)"
    ));
    assert_eq!(
        serve.get("/v1/campaigns").as_array().unwrap().len(),
        1,
        "one campaign: the form's"
    );
    let log = serve.get("/v1/admin-log?limit=50");
    let refused = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["path"] == "/v1/campaigns/shake" && e["status"] == 403)
        .count();
    assert!(refused >= 2, "both forgeries on the record: {log:#}");

    // A viewer: nothing that changes is offered, and what it might send is refused.
    page.click("#logout");
    page.wait_for(
        "the log-in form again",
        "!document.querySelector('#login').hidden",
    );
    page.type_into("#key", &viewer_key);
    page.click("#login-form button");
    page.wait_for(
        "the viewer's console",
        "!document.querySelector('#console').hidden",
    );
    let offered = page.eval(
        "Array.from(document.querySelectorAll('button')).filter(b => b.offsetParent !== null)\
         .map(b => b.textContent).sort()",
    );
    assert_eq!(
        offered,
        json!(["audit now", "log out", "look up"]),
        "a viewer's buttons"
    );
    assert_eq!(
        page.eval(
            "document.querySelector('#shake-form input, #send-form input, #broadcast-form input')"
        ),
        Value::Null,
        "no form that changes anything is in the page"
    );
    let as_viewer = page.eval(
        "fetch('/v1/broadcast', {method: 'POST', headers: {'Content-Type': 'application/json', \
         'X-CSRF-Token': session.csrf}, body: '{\"text\":\"x\"}'}).then(r => r.status)",
    );
    assert_eq!(as_viewer, json!(403), "the viewer's role");

    // The viewer's key removed: its session ends at its next request.
    let removed = serve.admin.http("DELETE", "/v1/admin-keys/watcher", None);
    assert_eq!(removed.0, 200, "{removed:?}");
    page.wait_for(
        "the session to end",
        "!document.querySelector('#login').hidden",
    );
}

/// The page over https and wss (issue 44): served by a TLS gateway with a certificate of
/// its own CA, which this Chromium is told to take (by its public key), it fetches a demo
/// token, logs in over wss and shakes.
#[test]
fn browser_client_works_over_https_and_wss() {
    let dir = tempfile::tempdir().unwrap();
    let certs = hongbao_http::tls::DevCerts::make(&["127.0.0.1"]).unwrap();
    let files = certs.write(dir.path()).unwrap();
    let mut serve = Serve::new()
        .dev_secret()
        .demo_login()
        .ws()
        .tls(&files)
        .start();
    let chromium = Chromium::launch_with(&[format!(
        "--ignore-certificate-errors-spki-list={}",
        certs.spki_sha256
    )]);
    let mut page = chromium.new_page(PHONE.0, PHONE.1, true);
    page.navigate(&format!("https://{}/", serve.ws_addr()));
    assert_eq!(page.eval("document.title"), json!("hongbao"));
    assert_eq!(page.eval("location.protocol"), json!("https:"));
    page.type_into("#user", "77");
    page.click("#login");
    page.wait_for(
        "the page to log in over wss",
        "document.querySelector('#status').textContent.includes('logged in as 77')",
    );
    page.click("#shake");
    page.wait_for(
        "a shake result over wss (no campaign: nothing)",
        "document.querySelector('#last-result').textContent.includes('nothing')",
    );
    drop(page);
    drop(chromium);
    serve.process.interrupt();
}
