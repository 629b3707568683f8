//! The monitor: takes per-second reports from any number of `serve` and `load` instances
//! (here or on other hosts), merges them by wall-clock second into `series.csv`, serves a
//! live dashboard and `/metrics`. `hongbao monitor` runs it alone; `bench` runs it in its
//! own process. See docs/monitoring.md.
//!
//! Modules (the HTTP side, dashboard and `/metrics`, is here in lib.rs):
//! - `collector`: merges samples by wall-clock second into one row per second per role, and
//!   writes each row once its second is closed;
//! - `error`: the crate's error: what failed, and what we were doing.

pub mod collector;
pub mod error;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_sys::clock::unix_ms;

use hongbao_http::access::{changes_state, run_key, BrowserGuard, RunKey};
use hongbao_http::{json_object, Request, Response, Server};
use hongbao_telemetry::reporter::{MONITOR_KEY_ENV, MONITOR_KEY_FILE};
use serde_json::{json, Value};

pub use collector::Collector;
pub use error::{Error, Result};
use hongbao_telemetry::Sample;

/// Largest request body accepted.
const MAX_BODY: usize = 1 << 20;

/// A running monitor: its HTTP server, and a thread that closes seconds as they age.
pub struct Monitor {
    addr: SocketAddr,
    /// The key reports and marks must carry.
    key: String,
    dir: Option<PathBuf>,
    collector: Arc<Mutex<Collector>>,
    server: Server,
    stop: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    collector: Arc<Mutex<Collector>>,
    dir: Option<PathBuf>,
    title: String,
    /// Reports and marks need this run's key; every request passes the browser checks.
    key: RunKey,
    guard: BrowserGuard,
}

impl Monitor {
    /// Listens on `listen` and writes `dir/series.csv` (and reads `dir/broadcasts.json` for
    /// the dashboard) when `dir` is given. Reports and marks must carry a key made for
    /// this run (`key`: hand it to the processes that report, out of sight).
    pub fn start(listen: SocketAddr, dir: Option<&Path>, title: &str) -> Result<Monitor> {
        Monitor::start_with_key(listen, dir, title, &hongbao_http::access::new_key())
    }

    /// As `start`, with the key given.
    pub fn start_with_key(
        listen: SocketAddr,
        dir: Option<&Path>,
        title: &str,
        key: &str,
    ) -> Result<Monitor> {
        Monitor::start_tls(listen, dir, title, key, None)
    }

    /// As `start_with_key`, speaking TLS only when `tls` (a certificate and its key) is
    /// given: a client refused in its handshake is logged.
    pub fn start_tls(
        listen: SocketAddr,
        dir: Option<&Path>,
        title: &str,
        key: &str,
        tls: Option<&hongbao_http::tls::TlsFiles>,
    ) -> Result<Monitor> {
        let tls = match tls {
            Some(files) => {
                let (cert, key) = files.read()?;
                let config =
                    hongbao_http::tls::server_config(&cert, &key, &[hongbao_http::tls::ALPN_HTTP])?;
                Some(hongbao_http::ServeTls {
                    config: hongbao_http::tls::Reloadable::new(config),
                    on_refused: Arc::new(
                        |peer, why| tracing::warn!(%peer, why, "the monitor refused a client in its TLS handshake"),
                    ),
                })
            }
            None => None,
        };
        let collector = Arc::new(Mutex::new(Collector::new(dir)?));
        let cannot_listen = || format!("monitor cannot listen on {listen}");
        let listener =
            std::net::TcpListener::bind(listen).map_err(|e| Error::io(cannot_listen(), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(cannot_listen(), e))?;
        let shared = Shared {
            collector: collector.clone(),
            dir: dir.map(Path::to_path_buf),
            title: title.to_string(),
            key: RunKey::of(key),
            guard: BrowserGuard::new(addr, &[], &[]),
        };
        let server = Server::serve_tls(listener, "monitor-http", MAX_BODY, tls, move |r| {
            let answer = match shared.guard.check(&r) {
                Ok(()) => route(&shared, &r),
                Err(refused) => refused,
            };
            answer.with_header("Cache-Control", "no-store")
        })
        .map_err(|e| Error::io(cannot_listen(), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ticker_collector, ticker_stop) = (collector.clone(), stop.clone());
        let ticker = Some(
            std::thread::Builder::new()
                .name("monitor-close".into())
                .spawn(move || {
                    while !ticker_stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(250));
                        let now = unix_ms() / 1000;
                        if let Err(e) = ticker_collector.lock().unwrap().close_before(now) {
                            tracing::warn!(error = %e, "writing the series failed");
                        }
                    }
                })
                .map_err(|e| Error::io("starting the monitor's ticker", e))?,
        );
        Ok(Monitor {
            addr: server.addr(),
            key: key.to_string(),
            dir: dir.map(Path::to_path_buf),
            collector,
            server,
            stop,
            ticker,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The key reports must carry (give it to reporting processes in
    /// `HONGBAO_MONITOR_KEY`).
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// A phase starts now.
    pub fn mark(&self, phase: &str) {
        self.mark_at(unix_ms(), phase);
    }

    /// A phase starts (or started) at `unix_ms`.
    pub fn mark_at(&self, unix_ms: u64, phase: &str) {
        self.collector.lock().unwrap().mark(unix_ms, phase);
    }

    /// Something another thread can mark phases with while the monitor runs.
    pub fn marker(&self) -> Marker {
        Marker(self.collector.clone())
    }

    /// Takes a sample directly (an in-process reporter).
    pub fn add(&self, sample: &Sample) {
        self.collector.lock().unwrap().add(sample);
    }

    pub fn csv(&self) -> String {
        self.collector.lock().unwrap().csv().to_string()
    }

    /// Writes every second reported so far and stops serving.
    pub fn finish(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        self.server.stop();
        self.collector.lock().unwrap().finish()
    }
}

/// [`Monitor::mark_at`] for another thread (the bench's chaos marks each fault as it
/// starts and heals: a mark made after its second was written would be lost).
#[derive(Clone)]
pub struct Marker(Arc<Mutex<Collector>>);

impl Marker {
    pub fn mark_at(&self, unix_ms: u64, phase: &str) {
        self.0.lock().unwrap().mark(unix_ms, phase);
    }
}

fn broadcasts(dir: Option<&Path>) -> Vec<hongbao_report::Broadcast> {
    dir.and_then(|d| std::fs::read_to_string(d.join("broadcasts.json")).ok())
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

fn route(shared: &Shared, request: &Request) -> Response {
    let path = request.path.as_str();
    if changes_state(&request.method) {
        if let Err(refused) = shared.key.check(request) {
            return refused;
        }
    }
    match (request.method.as_str(), path) {
        ("POST", "/v1/report") => match json_object::<Sample>(&request.body) {
            Ok(sample) => {
                shared.collector.lock().unwrap().add(&sample);
                Response::json(200, &json!({"ok": true}))
            }
            Err(refused) => refused,
        },
        ("POST", "/v1/mark") => {
            let phase = json_object::<Value>(&request.body).and_then(|v| {
                v.get("phase")
                    .and_then(Value::as_str)
                    .filter(|p| !p.is_empty() && p.len() <= 64)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        Response::error(400, "expected {\"phase\": \"name\"} (1–64 characters)")
                    })
            });
            match phase {
                Ok(phase) => {
                    let at = unix_ms();
                    shared.collector.lock().unwrap().mark(at, &phase);
                    Response::json(200, &json!({"phase": phase, "unix_ms": at}))
                }
                Err(refused) => refused,
            }
        }
        ("GET", "/") => {
            let page = hongbao_report::dashboard_html(&shared.title);
            Response::new(200, "text/html; charset=utf-8", page)
        }
        ("GET", "/v1/charts") => {
            let mut charts: Vec<Value> = hongbao_report::CHARTS
                .iter()
                .map(|c| json!({"name": c.name, "title": c.title}))
                .collect();
            for b in broadcasts(shared.dir.as_deref()) {
                charts.push(json!({"name": format!("broadcast_{}", b.id), "title": format!("Broadcast {} delivery", b.id)}));
            }
            Response::json(200, &Value::Array(charts))
        }
        ("GET", "/v1/latest") => {
            let csv = shared.collector.lock().unwrap().csv().to_string();
            let latest = hongbao_report::Series::from_csv(&csv)
                .map(|series| series.latest())
                .unwrap_or_else(|e| json!({ "error": e.to_string() }));
            Response::json(200, &latest)
        }
        ("GET", "/v1/rows") => {
            let rows = shared.collector.lock().unwrap().latest();
            Response::json(200, &rows)
        }
        ("GET", "/v1/series.csv") => {
            let csv = shared.collector.lock().unwrap().csv().to_string();
            Response::new(200, "text/csv", csv)
        }
        ("GET", "/metrics") => {
            let text = shared.collector.lock().unwrap().metrics();
            Response::new(200, "text/plain; version=0.0.4", text)
        }
        ("GET", p) if p.starts_with("/charts/") && p.ends_with(".svg") => {
            let name = &p["/charts/".len()..p.len() - ".svg".len()];
            let csv = shared.collector.lock().unwrap().csv().to_string();
            let svg = hongbao_report::Series::from_csv(&csv)
                .ok()
                .and_then(|series| {
                    hongbao_report::render_svg(&series, &broadcasts(shared.dir.as_deref()), name)
                });
            match svg {
                Some(svg) => Response::new(200, "image/svg+xml", svg),
                None => Response::error(404, format!("no chart {name}")),
            }
        }
        _ => Response::error(404, format!("no route {path}")),
    }
}

/// `hongbao monitor --listen ADDR --out DIR`: runs until SIGINT/SIGTERM, then writes the
/// last rows and the report.
/// `hongbao monitor`: its key from `HONGBAO_MONITOR_KEY`, else `key_file` (made there if
/// absent, for the instances that report to read).
pub fn run_cli(
    listen: SocketAddr,
    out: &Path,
    key_file: Option<&Path>,
    tls: Option<&hongbao_http::tls::TlsFiles>,
    stop: &hongbao_sys::Stop,
) -> Result<()> {
    let key_file = key_file.unwrap_or(Path::new(MONITOR_KEY_FILE));
    let key = run_key(MONITOR_KEY_ENV, key_file, true)
        .map_err(|e| Error::io(format!("the monitor's key file {}", key_file.display()), e))?
        .expect("made when missing");
    let monitor = Monitor::start_tls(listen, Some(out), "hongbao monitor", &key, tls)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!(
        "hongbao monitor ready: listen={} out={} key={} (dashboard {scheme}://{}/)",
        monitor.addr(),
        out.display(),
        key_file.display(),
        monitor.addr()
    );
    while !stop.requested() {
        std::thread::sleep(Duration::from_millis(200));
    }
    monitor.finish()?;
    if std::fs::metadata(out.join("series.csv")).is_ok_and(|m| m.len() > 0) {
        match hongbao_report::write_report(out) {
            Ok(files) => println!(
                "report: {} ({} charts)",
                out.join("report.html").display(),
                files.len()
            ),
            Err(e) => tracing::warn!(error = format!("{e:#}"), "drawing the report failed"),
        }
    }
    Ok(())
}
