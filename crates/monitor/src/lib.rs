//! The monitor: takes per-second reports from any number of `serve` and `load` instances
//! (here or on other hosts), merges them by wall-clock second into `series.csv`, serves a
//! live dashboard and `/metrics`. `hongbao monitor` runs it alone; `bench` runs it in its
//! own process. See docs/monitoring.md.

pub mod collector;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

pub use collector::Collector;
use hongbao_telemetry::Sample;

/// Largest request body accepted.
const MAX_BODY: usize = 1 << 20;
/// Largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// A client this slow to send its request is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

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
        let listener = TcpListener::bind(listen)
            .with_context(|| format!("monitor cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            collector: collector.clone(),
            dir: dir.map(Path::to_path_buf),
            title: title.to_string(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        // One short-lived thread per connection, one request each (`Connection: close`):
        // a handful of reporters and dashboards, so no pool to starve.
        let accept_stop = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name("monitor-accept".into())
                .spawn(move || {
                    for stream in listener.incoming() {
                        if accept_stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let Ok(stream) = stream else { continue };
                        let shared = shared.clone();
                        let _ = std::thread::Builder::new()
                            .name("monitor-http".into())
                            .spawn(move || serve_connection(&shared, stream));
                    }
                })?,
        );
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
        // Wake the accepting thread so it sees the stop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.collector.lock().unwrap().finish()
    }
}

/// An answer: status, content type, body.
type Answer = (u16, &'static str, Vec<u8>);

fn respond(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Answer {
    (status, content_type, body.into())
}

fn respond_json(status: u16, value: &Value) -> Answer {
    respond(status, "application/json", value.to_string())
}

/// Reads one HTTP/1.1 request, answers it and closes.
fn serve_connection(shared: &Shared, stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let answer = match read_request(BufReader::new(stream)) {
        Ok((method, url, body)) => route(shared, &method, &url, &body),
        Err(e) => respond_json(400, &json!({ "error": e })),
    };
    let (status, content_type, body) = answer;
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut out = write_half;
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(&body);
}

/// Method, target and body (UTF-8) of one request.
fn read_request(mut reader: BufReader<TcpStream>) -> Result<(String, String, String), String> {
    let mut line = String::new();
    let mut head_len = 0;
    let mut read_line = |reader: &mut BufReader<TcpStream>, line: &mut String| {
        line.clear();
        let n = reader
            .read_line(line)
            .map_err(|e| format!("reading the request: {e}"))?;
        head_len += n;
        if n == 0 || head_len > MAX_HEAD {
            return Err("incomplete or oversized request head".to_string());
        }
        Ok(())
    };
    read_line(&mut reader, &mut line)?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(url)) = (parts.next(), parts.next()) else {
        return Err("not an HTTP request".into());
    };
    let (method, url) = (method.to_string(), url.to_string());
    let mut length = 0usize;
    loop {
        read_line(&mut reader, &mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value
                    .trim()
                    .parse()
                    .map_err(|_| "bad Content-Length".to_string())?;
            }
        }
    }
    if length > MAX_BODY {
        return Err(format!("body over {MAX_BODY} bytes"));
    }
    let mut body = vec![0; length];
    reader
        .read_exact(&mut body)
        .map_err(|e| format!("reading the body: {e}"))?;
    let body = String::from_utf8(body).map_err(|_| "body is not UTF-8".to_string())?;
    Ok((method, url, body))
}

fn broadcasts(dir: Option<&Path>) -> Vec<hongbao_report::Broadcast> {
    dir.and_then(|d| std::fs::read_to_string(d.join("broadcasts.json")).ok())
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

fn route(shared: &Shared, method: &str, url: &str, body: &str) -> Answer {
    let path = url.split('?').next().unwrap_or("").to_string();
    match (method, path.as_str()) {
        ("POST", "/v1/report") => {
            let sample = serde_json::from_str::<Sample>(body).map_err(|e| e.to_string());
            match sample {
                Ok(sample) => {
                    shared.collector.lock().unwrap().add(&sample);
                    respond_json(200, &json!({"ok": true}))
                }
                Err(e) => respond_json(400, &json!({ "error": e })),
            }
        }
        ("POST", "/v1/mark") => {
            let phase = {
                let parsed: Result<Value, String> =
                    serde_json::from_str(body).map_err(|e| e.to_string());
                parsed.and_then(|v| {
                    v.get("phase")
                        .and_then(Value::as_str)
                        .filter(|p| !p.is_empty() && p.len() <= 64)
                        .map(str::to_string)
                        .ok_or_else(|| {
                            "expected {\"phase\": \"name\"} (1–64 characters)".to_string()
                        })
                })
            };
            match phase {
                Ok(phase) => {
                    let at = unix_ms();
                    shared.collector.lock().unwrap().mark(at, &phase);
                    respond_json(200, &json!({"phase": phase, "unix_ms": at}))
                }
                Err(e) => respond_json(400, &json!({ "error": e })),
            }
        }
        ("GET", "/") => {
            let page = hongbao_report::dashboard_html(&shared.title);
            respond(200, "text/html; charset=utf-8", page)
        }
        ("GET", "/v1/charts") => {
            let mut charts: Vec<Value> = hongbao_report::CHARTS
                .iter()
                .map(|c| json!({"name": c.name, "title": c.title}))
                .collect();
            for b in broadcasts(shared.dir.as_deref()) {
                charts.push(json!({"name": format!("broadcast_{}", b.id), "title": format!("Broadcast {} delivery", b.id)}));
            }
            respond_json(200, &Value::Array(charts))
        }
        ("GET", "/v1/latest") => {
            let csv = shared.collector.lock().unwrap().csv().to_string();
            let latest = hongbao_report::Series::from_csv(&csv)
                .map(|series| series.latest())
                .unwrap_or_else(|e| json!({ "error": e.to_string() }));
            respond_json(200, &latest)
        }
        ("GET", "/v1/rows") => {
            let rows = shared.collector.lock().unwrap().latest();
            respond_json(200, &rows)
        }
        ("GET", "/v1/series.csv") => {
            let csv = shared.collector.lock().unwrap().csv().to_string();
            respond(200, "text/csv", csv)
        }
        ("GET", "/metrics") => {
            let text = shared.collector.lock().unwrap().metrics();
            respond(200, "text/plain; version=0.0.4", text)
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
                Some(svg) => respond(200, "image/svg+xml", svg),
                None => respond_json(404, &json!({"error": format!("no chart {name}")})),
            }
        }
        _ => respond_json(404, &json!({"error": format!("no route {path}")})),
    }
}

/// `hongbao monitor --listen ADDR --out DIR`: runs until SIGINT/SIGTERM, then writes the
/// last rows and the report.
pub fn run_cli(listen: SocketAddr, out: &Path, stop: &hongbao_sys::Stop) -> anyhow::Result<()> {
    let monitor = Monitor::start(listen, Some(out), "hongbao monitor")?;
    println!(
        "hongbao monitor ready: listen={} out={} (dashboard http://{}/)",
        monitor.addr(),
        out.display(),
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
            Err(e) => eprintln!("report: {e:#}"),
        }
    }
    Ok(())
}
