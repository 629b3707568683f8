//! The monitor: takes per-second reports from any number of `serve` and `load` instances
//! (here or on other hosts), merges them by wall-clock second into `series.csv`, serves a
//! live dashboard and `/metrics`. `hongbao monitor` runs it alone; `bench` runs it in its
//! own process. See docs/monitoring.md.

pub mod collector;
pub mod prom;
pub mod reporter;
pub mod sample;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{json, Value};
use tiny_http::{Header, Method, Request, Response, Server};

pub use collector::Collector;
pub use reporter::Reporter;
pub use sample::{RoleSample, Sample};

/// Largest report body accepted.
const MAX_BODY: u64 = 1 << 20;
/// Threads answering HTTP.
const HTTP_THREADS: usize = 2;

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// A running monitor: its HTTP server, and a thread that closes seconds as they age.
pub struct Monitor {
    addr: SocketAddr,
    dir: Option<PathBuf>,
    collector: Arc<Mutex<Collector>>,
    server: Arc<Server>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

struct Shared {
    collector: Arc<Mutex<Collector>>,
    dir: Option<PathBuf>,
    title: String,
}

impl Monitor {
    /// Listens on `listen` and writes `dir/series.csv` (and reads `dir/broadcasts.json` for
    /// the dashboard) when `dir` is given.
    pub fn start(listen: SocketAddr, dir: Option<&Path>, title: &str) -> anyhow::Result<Monitor> {
        let collector = Arc::new(Mutex::new(Collector::new(dir)?));
        let server = Arc::new(
            Server::http(listen)
                .map_err(|e| anyhow::anyhow!("monitor cannot listen on {listen}: {e}"))?,
        );
        let addr = server
            .server_addr()
            .to_ip()
            .context("monitor listens on an IP address")?;
        let shared = Arc::new(Shared {
            collector: collector.clone(),
            dir: dir.map(Path::to_path_buf),
            title: title.to_string(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for i in 0..HTTP_THREADS {
            let (server, shared) = (server.clone(), shared.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("monitor-http-{i}"))
                    .spawn(move || {
                        for request in server.incoming_requests() {
                            handle(&shared, request);
                        }
                    })?,
            );
        }
        let (ticker_collector, ticker_stop) = (collector.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name("monitor-close".into())
                .spawn(move || {
                    while !ticker_stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(250));
                        let now = unix_ms() / 1000;
                        if let Err(e) = ticker_collector.lock().unwrap().close_before(now) {
                            eprintln!("monitor: writing series: {e}");
                        }
                    }
                })?,
        );
        Ok(Monitor {
            addr,
            dir: dir.map(Path::to_path_buf),
            collector,
            server,
            stop,
            threads,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
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

    /// Takes a sample directly (an in-process reporter).
    pub fn add(&self, sample: &Sample) {
        self.collector.lock().unwrap().add(sample);
    }

    pub fn csv(&self) -> String {
        self.collector.lock().unwrap().csv().to_string()
    }

    /// Writes every second reported so far and stops serving.
    pub fn finish(mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.server.unblock();
        for _ in 1..HTTP_THREADS {
            self.server.unblock();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.collector.lock().unwrap().finish()
    }
}

fn respond(request: Request, status: u16, content_type: &str, body: impl Into<Vec<u8>>) {
    let header = Header::from_bytes("Content-Type", content_type).expect("valid header");
    let cache = Header::from_bytes("Cache-Control", "no-store").expect("valid header");
    let response = Response::from_data(body.into())
        .with_status_code(status)
        .with_header(header)
        .with_header(cache);
    let _ = request.respond(response);
}

fn respond_json(request: Request, status: u16, value: &Value) {
    respond(request, status, "application/json", value.to_string());
}

fn read_body(request: &mut Request) -> Result<String, String> {
    let mut body = String::new();
    request
        .as_reader()
        .take(MAX_BODY + 1)
        .read_to_string(&mut body)
        .map_err(|e| format!("unreadable body: {e}"))?;
    if body.len() as u64 > MAX_BODY {
        return Err(format!("body over {MAX_BODY} bytes"));
    }
    Ok(body)
}

fn broadcasts(dir: Option<&Path>) -> Vec<hongbao_report::Broadcast> {
    dir.and_then(|d| std::fs::read_to_string(d.join("broadcasts.json")).ok())
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

fn handle(shared: &Shared, mut request: Request) {
    let url = request.url().to_string();
    let path = url.split('?').next().unwrap_or("").to_string();
    match (request.method(), path.as_str()) {
        (Method::Post, "/v1/report") => {
            let sample = read_body(&mut request)
                .and_then(|b| serde_json::from_str::<Sample>(&b).map_err(|e| e.to_string()));
            match sample {
                Ok(sample) => {
                    shared.collector.lock().unwrap().add(&sample);
                    respond_json(request, 200, &json!({"ok": true}));
                }
                Err(e) => respond_json(request, 400, &json!({ "error": e })),
            }
        }
        (Method::Post, "/v1/mark") => {
            let phase = read_body(&mut request).and_then(|b| {
                let v: Value = serde_json::from_str(&b).map_err(|e| e.to_string())?;
                v.get("phase")
                    .and_then(Value::as_str)
                    .filter(|p| !p.is_empty() && p.len() <= 64)
                    .map(str::to_string)
                    .ok_or_else(|| "expected {\"phase\": \"name\"} (1–64 characters)".to_string())
            });
            match phase {
                Ok(phase) => {
                    let at = unix_ms();
                    shared.collector.lock().unwrap().mark(at, &phase);
                    respond_json(request, 200, &json!({"phase": phase, "unix_ms": at}));
                }
                Err(e) => respond_json(request, 400, &json!({ "error": e })),
            }
        }
        (Method::Get, "/") => {
            let page = hongbao_report::dashboard_html(&shared.title);
            respond(request, 200, "text/html; charset=utf-8", page);
        }
        (Method::Get, "/v1/charts") => {
            let mut charts: Vec<Value> = hongbao_report::CHARTS
                .iter()
                .map(|c| json!({"name": c.name, "title": c.title}))
                .collect();
            for b in broadcasts(shared.dir.as_deref()) {
                charts.push(json!({"name": format!("broadcast_{}", b.id), "title": format!("Broadcast {} delivery", b.id)}));
            }
            respond_json(request, 200, &Value::Array(charts));
        }
        (Method::Get, "/v1/latest") => {
            let csv = shared.collector.lock().unwrap().csv().to_string();
            let latest = hongbao_report::Series::from_csv(&csv)
                .map(|series| series.latest())
                .unwrap_or_else(|e| json!({ "error": e.to_string() }));
            respond_json(request, 200, &latest);
        }
        (Method::Get, "/v1/rows") => {
            let rows = shared.collector.lock().unwrap().latest();
            respond_json(request, 200, &rows);
        }
        (Method::Get, "/v1/series.csv") => {
            let csv = shared.collector.lock().unwrap().csv().to_string();
            respond(request, 200, "text/csv", csv);
        }
        (Method::Get, "/metrics") => {
            let text = shared.collector.lock().unwrap().metrics();
            respond(request, 200, "text/plain; version=0.0.4", text);
        }
        (Method::Get, p) if p.starts_with("/charts/") && p.ends_with(".svg") => {
            let name = &p["/charts/".len()..p.len() - ".svg".len()];
            let csv = shared.collector.lock().unwrap().csv().to_string();
            let svg = hongbao_report::Series::from_csv(&csv)
                .ok()
                .and_then(|series| {
                    hongbao_report::render_svg(&series, &broadcasts(shared.dir.as_deref()), name)
                });
            match svg {
                Some(svg) => respond(request, 200, "image/svg+xml", svg),
                None => respond_json(request, 404, &json!({"error": format!("no chart {name}")})),
            }
        }
        _ => respond_json(request, 404, &json!({"error": format!("no route {path}")})),
    }
}

/// `hongbao monitor --listen ADDR --out DIR`: runs until SIGINT/SIGTERM, then writes the
/// last rows and the report.
pub fn run_cli(
    listen: SocketAddr,
    out: &Path,
    stop_requested: impl Fn() -> bool,
) -> anyhow::Result<()> {
    let monitor = Monitor::start(listen, Some(out), "hongbao monitor")?;
    println!(
        "hongbao monitor ready: listen={} out={} (dashboard http://{}/)",
        monitor.addr(),
        out.display(),
        monitor.addr()
    );
    while !stop_requested() {
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
            Err(e) => eprintln!("report: {e:#}"),
        }
    }
    Ok(())
}
