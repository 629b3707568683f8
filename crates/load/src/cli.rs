//! `hongbao load` on the command line: the control endpoint (`POST /qps`, `GET /stats`),
//! a progress line a second, and the final totals as JSON; `--set-qps` for a running one.
//!
//! The control endpoint takes commands only with the load's key: `HONGBAO_LOAD_KEY`, else
//! its key file (`hongbao-load.key` unless told), which the load makes if it is not
//! there and `--set-qps` reads. Every request passes the browser checks.

use std::sync::Arc;
use std::time::Duration;

use hongbao_sys::clock::UnixTime;

use hongbao_http::access::{changes_state, run_key, BrowserGuard, RunKey};
use hongbao_http::{json_object, Request, Response, Server};
use hongbao_sys::Stop;
use serde::Serialize;
use serde_json::json;

use crate::broadcast::LatencyDistMs;
use crate::coordinator::{Load, LoadOptions};
use crate::error::{Error, Result, Unreached};
use crate::report::{self, Counters};

/// The fastest a load may be asked to fire.
const MAX_QPS: u64 = 10_000_000;

/// The environment variable of the control endpoint's key...
pub const CONTROL_KEY_ENV: &str = "HONGBAO_LOAD_KEY";
/// ...and its file, unless told.
pub const CONTROL_KEY_FILE: &str = "hongbao-load.key";

/// Serves `POST /qps {"qps": N}` (with the key) and `GET /stats` for a running load.
pub fn serve_control(addr: &str, load: Arc<Load>, key: &str) -> Result<Server> {
    let binding = |e| Error::io(format!("binding control address {addr}"), e);
    let listener = std::net::TcpListener::bind(addr).map_err(binding)?;
    let guard = BrowserGuard::new(listener.local_addr().map_err(binding)?, &[], &[]);
    let key = RunKey::of(key);
    Server::serve(listener, "load-control", 4096, move |r| {
        let checked = guard.check(&r).and_then(|()| {
            if changes_state(&r.method) {
                key.check(&r)
            } else {
                Ok(())
            }
        });
        match checked {
            Ok(()) => control(&r, &load),
            Err(refused) => refused,
        }
    })
    .map_err(|e| Error::io(format!("serving control address {addr}"), e))
}

/// `POST /qps`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SetQps {
    qps: u64,
}

fn control(request: &Request, load: &Load) -> Response {
    match (request.method.as_str(), request.path.as_str()) {
        ("POST", "/qps") => match json_object::<SetQps>(&request.body) {
            Ok(SetQps { qps }) if qps <= MAX_QPS => match load.set_qps(qps) {
                Ok(from_second) => {
                    Response::json(200, &json!({ "qps": qps, "from_second": from_second }))
                }
                Err(e) => Response::error(500, e.to_string()),
            },
            Ok(_) => Response::error(400, format!("qps must be 0..={MAX_QPS}")),
            Err(refused) => refused,
        },
        ("GET", "/stats") => match load.progress() {
            Some(p) => Response::json(200, &p),
            None => Response::json(200, &json!({ "second": null, "totals": load.totals() })),
        },
        _ => Response::error(404, "endpoints: POST /qps, GET /stats"),
    }
}

/// `hongbao load`: runs until `duration` seconds of firing have passed (or SIGINT), with
/// one progress line a second; prints the final totals as JSON.
pub fn run_cli(
    opts: LoadOptions,
    control: Option<String>,
    key_file: &std::path::Path,
    duration: Option<u64>,
    stop: &Stop,
) -> Result<()> {
    let users = opts.users;
    let (server, tls) = (opts.server, opts.tls_ca.is_some());
    let load = Arc::new(Load::start(opts)?);
    println!(
        "hongbao load: {} users over {} client processes; firing starts at second 0 (epoch {} ms)",
        users,
        load.procs(),
        load.epoch_ms()
    );
    let control = match control {
        Some(addr) => {
            let key = run_key(CONTROL_KEY_ENV, key_file, true)
                .map_err(|e| Error::io(format!("the control key file {}", key_file.display()), e))?
                .expect("made when missing");
            let server = serve_control(&addr, load.clone(), &key)?;
            let bound = server.addr();
            println!(
                "hongbao load: control on http://{bound} (POST /qps {{\"qps\": N}} with the key in {}, GET /stats)",
                key_file.display()
            );
            Some(server)
        }
        None => None,
    };
    // The run's end, when it has a duration: that long after the schedule's second 0.
    let end = duration.map(|d| UnixTime::from_millis(load.epoch_ms()) + Duration::from_secs(d));
    let mut last = None;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(p) = load.progress() {
            if last != Some(p.second) {
                last = Some(p.second);
                println!("{}", p.line());
            }
        }
        let done = end.is_some_and(|end| UnixTime::now() >= end);
        if done || stop.requested() {
            break;
        }
    }
    drop(control);
    let finished = load.stop()?;
    // The whole run's shake latency (all, and served alone) and send lag, every second of
    // every process merged.
    let (mut shake, mut served, mut lag) = (
        report::new_histogram(),
        report::new_histogram(),
        report::new_histogram(),
    );
    for row in load.rows() {
        report::merge_sparse(&mut shake, &row.shake_latency);
        report::merge_sparse(&mut served, &row.served_latency);
        report::merge_sparse(&mut lag, &row.send_lag);
    }
    let broadcasts = load
        .broadcasts()
        .iter()
        .map(|b| {
            let l = LatencyDistMs::of(&b.latency_us);
            BroadcastLine {
                server_time_us: b.server_time_us,
                delivered: b.delivered,
                complete_ms: b.complete_ms(),
                p50_ms: l.p50,
                p99_ms: l.p99,
                max_ms: l.max,
            }
        })
        .collect();
    let summary = Totals {
        totals: finished.totals,
        latency_ms: LatencyDistMs::of(&shake),
        served_latency_ms: LatencyDistMs::of(&served),
        send_lag_ms: LatencyDistMs::of(&lag),
        broadcasts,
        users_with_money: finished.users.len(),
        peak_rss_bytes: finished.peak_rss_bytes,
        cpu_seconds: finished.cpu_ms as f64 / 1000.0,
    };
    println!("{}", serde_json::to_string_pretty(&summary)?);
    match unreached(&summary.totals, users, server, tls) {
        Some(why) => Err(Error::Unreached(Unreached(why))),
        None => Ok(()),
    }
}

/// Why a run whose totals are `t` reached too few of its `users` at `server`, or `None`
/// when more than half logged in.
pub fn unreached(
    t: &Counters,
    users: u64,
    server: std::net::SocketAddr,
    tls: bool,
) -> Option<String> {
    if users == 0 || t.logins * 2 > users {
        return None;
    }
    let how_many = if t.logins == 0 {
        "reached no one".to_string()
    } else {
        format!("logged in {} of {users} users", t.logins)
    };
    let seen = format!(
        "{} connection attempts: {} connected, {} refused, {} timed out, {} reset, {} failed handshakes, {} closed by the server; {} logins refused",
        t.connect_attempts,
        t.connects,
        t.failed_refused,
        t.failed_timeout,
        t.failed_reset,
        t.failed_handshake,
        t.disconnects,
        t.login_failures
    );
    let advice = if t.connects == 0 && t.failed_refused > 0 {
        format!("nothing listens at {server}: is the server running, and is --server its client address (--listen; --ws-listen for ws, --http-listen for http)?")
    } else if t.login_failures > 0 {
        "the server refused the users' tokens: --secret (HONGBAO_SECRET), --login-kid and --login-alg must match a login key of the server's".to_string()
    } else if !tls && t.connects > 0 && t.logins == 0 {
        format!("connections to {server} were closed or went unanswered before any login: if the server speaks TLS there (serve --tls-cert), give its CA with --tls-ca")
    } else if tls && t.failed_handshake > 0 {
        "the TLS handshakes failed: --tls-ca must be the CA that signed the server's certificate, and --server an address the certificate names".to_string()
    } else {
        "the server may be overloaded or limiting logins (its log says why); try a lower --connect-rate".to_string()
    };
    Some(format!(
        "hongbao load {how_many} at {server} ({seen}): {advice}"
    ))
}

/// What `hongbao load` prints when it ends (docs/bench.md).
#[derive(Serialize)]
struct Totals {
    totals: Counters,
    /// Shake latency from each shake's intended send time, over the whole run.
    latency_ms: LatencyDistMs,
    /// The same of the shakes served (won or nothing): without those answered
    /// `overloaded`, which under overload are the ones that waited longest.
    served_latency_ms: LatencyDistMs,
    /// How late the shakes were sent against their intended times, over the whole run.
    send_lag_ms: LatencyDistMs,
    broadcasts: Vec<BroadcastLine>,
    users_with_money: usize,
    peak_rss_bytes: u64,
    cpu_seconds: f64,
}

/// One broadcast the clients received.
#[derive(Serialize)]
struct BroadcastLine {
    server_time_us: u64,
    delivered: u64,
    complete_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// `hongbao load --control ADDR --set-qps N`: changes the QPS of a running load, with
/// its key (`HONGBAO_LOAD_KEY`, else `key_file`).
pub fn set_remote_qps(control: &str, qps: u64, key_file: &std::path::Path) -> Result<()> {
    let url = format!("http://{control}/qps");
    let key = run_key(CONTROL_KEY_ENV, key_file, false)
        .map_err(|e| Error::io(format!("the control key file {}", key_file.display()), e))?;
    let Some(key) = key else {
        return Err(Error::Config(format!(
            "no control key: {CONTROL_KEY_ENV} is not set and {} does not exist (the running load makes it)",
            key_file.display()
        )));
    };
    let reading = |e| Error::io(format!("reading the answer of {url}"), e);
    match hongbao_http::tls::agent_builder()
        .build()
        .post(&url)
        .set("Authorization", &format!("Bearer {key}"))
        .timeout(Duration::from_secs(5))
        .send_json(json!({ "qps": qps }))
    {
        Ok(r) => {
            println!("{}", r.into_string().map_err(reading)?);
            Ok(())
        }
        Err(ureq::Error::Status(code, r)) => Err(Error::Refused(format!(
            "{url}: {code} {}",
            r.into_string().map_err(reading)?
        ))),
        Err(e) => Err(Box::new(e).into()),
    }
}
