//! `hongbao bench`: the seed experiment on one machine. Starts a server and a load, runs
//! the phases (connect everyone; then for each QPS step a shake campaign and a send
//! campaign under that load), audits the money after every phase and at the end, stops
//! everything it started, and writes `summary.json` and `series.csv` (docs/bench.md).
//!
//! The audit holds three witnesses against each other: the campaigns' own counts, the
//! clients' counts of what they were told, and the ledger's balances user by user.
//!
//! With `--broadcast-every S` it also broadcasts every S seconds of each steady phase and
//! checks that every connection the server handed a broadcast to received it, timing the
//! deliveries (`broadcast.rs`; `broadcasts.json`).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};

use hongbao_money::seam::Balances;
use hongbao_monitor::Monitor;

use crate::broadcast::{self, Sent};
use crate::coordinator::{progress, Load, LoadOptions, Row};
use crate::report::{self, Counters};
use crate::transport::Transport;

pub const SECRET: &str = "hongbao-bench-secret";

/// The bench's server sheds shakes that waited longer than this (`max_queue_ms`).
pub const DEFAULT_BENCH_MAX_QUEUE_MS: u32 = 200;

/// The bench's server runs this much nicer than the load (see `server_nice`).
pub const DEFAULT_SERVER_NICE: i32 = 5;

/// How long a simulated user told "overloaded" stops shaking.
pub const DEFAULT_OVERLOAD_BACKOFF_SECS: u32 = 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Quick,
    Seed,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub connections: u64,
    pub out: PathBuf,
    /// Server worker processes ("auto" or a number).
    pub workers: String,
    /// Load client processes; 0 = auto.
    pub procs: u32,
    /// One steady phase per entry, in order.
    pub phase_qps: Vec<u64>,
    pub shake_packets: u32,
    pub send_packets: u32,
    pub campaign_rate: u32,
    pub recipients: u32,
    pub max_shake_qps: u32,
    pub connect_rate: u64,
    /// Where the bench's own monitor (dashboard, /metrics) listens.
    pub monitor_listen: SocketAddr,
    /// How the clients connect: raw TCP, or WebSocket to the server's `--ws-listen`.
    pub transport: Transport,
    /// Seconds between operator broadcasts during each steady phase; 0 = none.
    pub broadcast_every_secs: f64,
    /// The server's `max_queue_ms`.
    pub max_queue_ms: u32,
    /// The server runs at this nice value (its workers inherit it). The load stands in
    /// for a million phones that bring their own CPUs: sharing two cores with the server
    /// at equal priority it fell behind its own schedule when the machine was saturated
    /// (at 1M/60K, by 70 s), and the backlog built up in the clients, out of the server's
    /// sight. Ahead of the server, it sends on time, and overload shows where it would in
    /// the field: as requests waiting at the server, which `max_queue_ms` sheds.
    pub server_nice: i32,
    /// The caller moved the bench into a network namespace of its own
    /// (`doctor::enter_network_namespace`): recorded in the summary.
    pub netns: bool,
}

impl BenchOptions {
    pub fn preset(preset: Preset) -> BenchOptions {
        let base = BenchOptions {
            connections: 20_000,
            out: PathBuf::from("bench-out"),
            workers: "auto".into(),
            procs: 0,
            phase_qps: vec![30_000, 60_000],
            shake_packets: 2_000,
            send_packets: 1_000,
            campaign_rate: 200,
            recipients: 3,
            max_shake_qps: 100_000,
            connect_rate: 20_000,
            monitor_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            transport: Transport::Tcp,
            broadcast_every_secs: 0.0,
            max_queue_ms: DEFAULT_BENCH_MAX_QUEUE_MS,
            server_nice: DEFAULT_SERVER_NICE,
            netns: false,
        };
        match preset {
            Preset::Quick => base,
            Preset::Seed => BenchOptions {
                connections: 1_000_000,
                shake_packets: 40_000,
                send_packets: 20_000,
                connect_rate: 50_000,
                ..base
            },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PhaseSummary {
    pub name: String,
    pub target_qps: u64,
    pub seconds: u64,
    pub client_qps_median: f64,
    pub server_qps_median: f64,
    pub latency_ms: LatencyMs,
    pub open_latency_ms: LatencyMs,
    /// How late the load sent its shakes against their intended time (included in
    /// `latency_ms`): the load generator's own lag, e.g. when it shares the machine.
    pub send_lag_ms: LatencyMs,
    pub overloaded: u64,
    /// Shakes the schedule asked for that users skipped while backing off after an
    /// "overloaded" (not sent, not errors).
    pub backed_off: u64,
    pub errors: u64,
    /// |client median − target| / target ≤ 2% (meaningful when nothing was overloaded).
    pub qps_within_2pct: bool,
    pub shake_release_rate_per_sec: f64,
    pub send_create_rate_per_sec: f64,
    /// Both campaigns within 1% of their configured rate.
    pub campaign_rates_within_1pct: bool,
    pub shake: ShakeAudit,
    pub send: SendAudit,
    pub audit_ok: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ShakeAudit {
    pub packets: u64,
    pub released: u64,
    pub won_server: u64,
    pub won_clients: u64,
    pub amount_minted: u64,
    pub amount_won_server: u64,
    pub amount_won_clients: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SendAudit {
    pub packets: u64,
    pub shares: u64,
    pub opened_server: u64,
    pub opened_clients: u64,
    pub amount_sent: u64,
    pub amount_opened_server: u64,
    pub amount_opened_clients: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Discrepancy {
    pub kind: String,
    pub user: Option<u64>,
    pub phase: Option<String>,
    pub server: u64,
    pub clients: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// A `hongbao serve` child: killed if still running when dropped.
struct Server {
    child: Child,
    admin: SocketAddr,
    listen: SocketAddr,
    /// The WebSocket listener, when asked for.
    ws: Option<SocketAddr>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    fn start(opts: &BenchOptions, data_dir: &Path, monitor: SocketAddr) -> anyhow::Result<Server> {
        let mut command = Command::new(std::env::current_exe()?);
        let server_nice = opts.server_nice;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // setpriority(2), which is async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                if server_nice != 0 {
                    libc::setpriority(libc::PRIO_PROCESS, 0, server_nice);
                }
                Ok(())
            });
        }
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(["--monitor", &monitor.to_string()])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--workers", &opts.workers])
            .args(["--connections", &opts.connections.to_string()])
            .args(["--max-shake-qps", &opts.max_shake_qps.to_string()])
            .args(["--max-queue-ms", &opts.max_queue_ms.to_string()])
            .args(["--secret", SECRET])
            .args(match opts.transport {
                Transport::Tcp => &[][..],
                Transport::Ws => &["--ws-listen", "127.0.0.1:0"][..],
            })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting hongbao serve")?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut server = Server {
            child,
            admin: "0.0.0.0:0".parse()?,
            listen: "0.0.0.0:0".parse()?,
            ws: None,
        };
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .context("hongbao serve did not become ready")?;
        let field = |name: &str| -> anyhow::Result<SocketAddr> {
            let v = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .with_context(|| format!("no {name}= in {line:?}"))?;
            Ok(v.parse()?)
        };
        server.listen = field("listen")?;
        server.admin = field("admin")?;
        if opts.transport == Transport::Ws {
            server.ws = Some(field("ws")?);
        }
        Ok(server)
    }

    fn get(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("http://{}{path}", self.admin);
        Ok(ureq::get(&url)
            .timeout(Duration::from_secs(15))
            .call()?
            .into_json()?)
    }

    fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let url = format!("http://{}{path}", self.admin);
        match ureq::post(&url)
            .timeout(Duration::from_secs(15))
            .send_json(body)
        {
            Ok(r) => Ok(r.into_json()?),
            Err(ureq::Error::Status(code, r)) => bail!("POST {path}: {code} {}", r.into_string()?),
            Err(e) => Err(e.into()),
        }
    }

    /// Asks the server to stop (SIGINT) and waits for it.
    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("hongbao serve did not stop within 30 s")
    }
}

/// One sample of the server's `/v1/stats`, taken once a second.
#[derive(Debug, Clone)]
struct ServerSample {
    unix_ms: u64,
    shakes_per_sec: u64,
    rss_bytes: u64,
    cpu_ms: u64,
}

fn sample(stats: &Value) -> ServerSample {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let workers = stats["workers"].as_array().cloned().unwrap_or_default();
    let rss =
        workers.iter().map(|w| n(&w["rss_bytes"])).sum::<u64>() + n(&stats["core"]["rss_bytes"]);
    let cpu = workers.iter().map(|w| n(&w["cpu_ms"])).sum::<u64>() + n(&stats["core"]["cpu_ms"]);
    ServerSample {
        unix_ms: n(&stats["unix_ms"]),
        shakes_per_sec: n(&stats["per_sec"]["shakes"]),
        rss_bytes: rss,
        cpu_ms: cpu,
    }
}

struct Phase {
    name: String,
    start_second: u64,
    end_second: u64,
}

/// Runs the bench; returns the summary (also written to `out/summary.json`). The caller
/// exits non-zero when `summary["audit"]["ok"]` is false.
pub fn run(opts: BenchOptions) -> anyhow::Result<Value> {
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let data_dir = opts.out.join("data");
    if data_dir.exists() {
        std::fs::remove_dir_all(&data_dir).context("clearing the previous bench's ledger")?;
    }
    let monitor = Monitor::start(opts.monitor_listen, Some(&opts.out), "hongbao bench")?;
    say(&format!(
        "bench: dashboard at http://{}/ ; series in {}",
        monitor.addr(),
        opts.out.join("series.csv").display()
    ));
    monitor.mark("start");
    say(&format!(
        "bench: starting hongbao serve (workers {}), ledger in {}",
        opts.workers,
        data_dir.display()
    ));
    let server = Server::start(&opts, &data_dir, monitor.addr())?;
    std::thread::sleep(Duration::from_millis(1500));
    let server_baseline = sample(&server.get("/v1/stats")?);

    // Once-a-second server samples, for the series and the server-side QPS.
    let samples: Arc<Mutex<Vec<ServerSample>>> = Arc::default();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (samples, sampling, admin) = (samples.clone(), sampling.clone(), server.admin);
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                let url = format!("http://{admin}/v1/stats");
                if let Ok(Ok(v)) = ureq::get(&url)
                    .timeout(Duration::from_secs(5))
                    .call()
                    .map(|r| r.into_json::<Value>())
                {
                    samples.lock().unwrap().push(sample(&v));
                }
                let ms = unix_ms() % 1000;
                // Sample in the middle of each second, away from the workers' report instants.
                std::thread::sleep(Duration::from_millis(((1500 - ms) % 1000).max(10)));
            }
        })
    };

    let load = Load::start(LoadOptions {
        server: match opts.transport {
            Transport::Tcp => server.listen,
            Transport::Ws => server.ws.context("the server has no WebSocket listener")?,
        },
        transport: opts.transport,
        users: opts.connections,
        first_user: 1,
        qps: 0,
        procs: opts.procs,
        source_ips: None,
        connect_rate: opts.connect_rate,
        secret: SECRET.into(),
        connect_at_epoch: true,
        monitor: Some(monitor.addr().to_string()),
        overload_backoff_secs: DEFAULT_OVERLOAD_BACKOFF_SECS,
    })?;
    monitor.mark_at(load.epoch_ms(), "connect");
    say(&format!(
        "bench: {} load client processes; connecting {} users",
        load.procs(),
        opts.connections
    ));
    std::thread::sleep(Duration::from_millis(
        load.epoch_ms()
            .saturating_sub(unix_ms())
            .saturating_sub(300),
    ));
    let load_baseline: u64 = load
        .pids()
        .iter()
        .map(|p| hongbao_sys::usage::usage_of(&p.to_string()).0)
        .sum();

    // Phase 1: connect everyone.
    let connect_timeout = Duration::from_secs(60 + opts.connections / 1000);
    let connected = load.wait_logged_in(connect_timeout);
    let connect_seconds = unix_ms().saturating_sub(load.epoch_ms()) as f64 / 1000.0;
    if !connected {
        say(&format!(
            "bench: only {} of {} logged in after {connect_seconds:.1} s",
            load.logged_in(),
            opts.connections
        ));
    } else {
        say(&format!(
            "bench: {} connected and logged in after {connect_seconds:.1} s",
            opts.connections
        ));
    }
    let mut summaries = Vec::new();
    let mut discrepancies: Vec<Discrepancy> = Vec::new();
    let mut shake_total = ShakeAudit::default();
    let mut send_total = SendAudit::default();
    let mut broadcaster = Broadcaster::new(opts.broadcast_every_secs);

    for (n, &qps) in opts.phase_qps.iter().enumerate() {
        let name = format!("qps-{qps}");
        let from = load.set_qps(qps)?;
        monitor.mark_at(load.epoch_ms() + from * 1000, &name);
        say(&format!(
            "bench: phase {} at {qps} QPS from second {from}",
            n + 2
        ));
        wait_until_second(&load, from + 1);
        broadcaster.start_phase(&name);
        let before = load.totals();
        let shake = server.post(
            "/v1/campaigns/shake",
            json!({"packets": opts.shake_packets, "rate_per_sec": opts.campaign_rate, "amount_min": 100, "amount_max": 10_000}),
        )?;
        let shake_id = shake["id"].as_u64().context("campaign id")?;
        let shake_done = wait_campaign(
            &server,
            &load,
            &mut broadcaster,
            shake_id,
            opts.shake_packets,
            opts.campaign_rate,
            |c| c["won"].as_u64() == c["packets"].as_u64(),
        )?;
        let send = server.post(
            "/v1/campaigns/send",
            json!({"packets": opts.send_packets, "rate_per_sec": opts.campaign_rate, "recipients": opts.recipients,
                   "user_min": 1, "user_max": opts.connections, "amount_min": 100 * opts.recipients as u64, "amount_max": 20_000}),
        )?;
        let send_id = send["id"].as_u64().context("campaign id")?;
        let send_done = wait_campaign(
            &server,
            &load,
            &mut broadcaster,
            send_id,
            opts.send_packets,
            opts.campaign_rate,
            |c| c["state"] == "done" && c["shares_opened"] == c["shares"],
        )?;
        // Let the clients' reports catch up with what the server has said.
        let settle = Instant::now() + Duration::from_secs(5);
        let (won, opened) = (
            shake_done["won"].as_u64().unwrap_or(0),
            send_done["shares_opened"].as_u64().unwrap_or(0),
        );
        while Instant::now() < settle {
            let t = load.totals();
            if t.won - before.won >= won && t.opened - before.opened >= opened {
                break;
            }
            broadcaster.sleep(Duration::from_millis(100), &server, &load)?;
        }
        broadcaster.sleep(Duration::from_millis(1100), &server, &load)?;
        broadcaster.end_phase();
        let after = load.totals();
        let end_second = load.current_second().saturating_sub(1);
        let phase = Phase {
            name: name.clone(),
            start_second: from,
            end_second,
        };
        let rows: Vec<Row> = load
            .rows()
            .into_iter()
            .filter(|r| r.second >= phase.start_second && r.second <= phase.end_second)
            .collect();
        let summary = phase_summary(
            &phase,
            qps,
            &rows,
            &samples.lock().unwrap(),
            load.epoch_ms(),
            &shake_done,
            &send_done,
            &before,
            &after,
            opts.campaign_rate,
            &mut discrepancies,
        );
        let audit = server.get("/v1/audit")?;
        if audit["ok"] != true {
            discrepancies.push(Discrepancy {
                kind: "conservation".into(),
                user: None,
                phase: Some(name.clone()),
                server: 0,
                clients: 0,
            });
        }
        say(&format!(
            "bench: {name}: client median {:.0}/s server median {:.0}/s p50 {:.2} ms p99 {:.2} ms (load's send lag p99 {:.2} ms) overloaded {} errors {} audit {}",
            summary.client_qps_median, summary.server_qps_median, summary.latency_ms.p50, summary.latency_ms.p99,
            summary.send_lag_ms.p99, summary.overloaded, summary.errors, if summary.audit_ok && audit["ok"] == true { "ok" } else { "FAILED" }
        ));
        add_shake(&mut shake_total, &summary.shake);
        add_send(&mut send_total, &summary.send);
        summaries.push(summary);
    }

    // Every connection should get every broadcast: give the last ones time to arrive.
    let sent = broadcaster.sent;
    if !sent.is_empty() && !wait_deliveries(&load, &sent) {
        say("bench: some broadcasts were not delivered to every connection in time");
    }
    let drops_after = {
        let t = load.totals();
        t.disconnects + t.connect_failures()
    };

    let rows = load.rows();
    let peak_connections = rows.iter().map(|r| r.logged_in).max().unwrap_or(0);
    let load_pids = load.pids();
    let load_peak_rss = load_peak_rss(&rows, &load_pids);
    load.set_qps(0)?;
    monitor.mark("stop");
    let finished = load.stop()?;
    let deliveries = load.broadcasts();
    drop(load);
    let broadcast_entries = broadcast::entries(&sent, &deliveries);
    let broadcast_summary = broadcast::summary(&sent, &deliveries);
    // Written before the monitor finishes, so its last report draws the curves.
    std::fs::write(
        opts.out.join("broadcasts.json"),
        serde_json::to_string_pretty(&broadcast_entries)?,
    )?;
    for (s, e) in sent.iter().zip(&broadcast_entries) {
        if !broadcast::delivery_ok(s, e.delivered, drops_after) {
            discrepancies.push(Discrepancy {
                kind: "broadcast_delivery".into(),
                user: None,
                phase: Some(s.phase.clone()),
                server: s.connections,
                clients: e.delivered,
            });
        }
    }
    if !sent.is_empty() {
        let b = &broadcast_summary;
        say(&format!(
            "bench: {} broadcasts to {} connections: {} delivered; slowest complete in {:.1} ms; delivery p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
            b.sent, b.connections, b.delivered, b.complete_ms, b.latency_ms.p50, b.latency_ms.p99, b.latency_ms.max
        ));
    }
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.join();
    let final_audit = server.get("/v1/audit")?;
    // Witness three: every balance the ledger holds, read through the server.
    let balances: Balances =
        serde_json::from_value(server.get("/v1/balances")?).context("reading GET /v1/balances")?;
    let samples = samples.lock().unwrap().clone();
    server.stop()?;
    // Both sent their last second on the way out: the series is complete.
    monitor.finish()?;

    // The ledger, user by user, against what each user's client was told.
    let mut users_checked = 0u64;
    for (user, seen) in &finished.users {
        users_checked += 1;
        let server_cents = balances.users.get(user).copied().unwrap_or(0);
        let client_cents = seen.won_cents + seen.opened_cents;
        if server_cents != client_cents {
            discrepancies.push(Discrepancy {
                kind: "user_balance".into(),
                user: Some(*user),
                phase: None,
                server: server_cents,
                clients: client_cents,
            });
        }
    }
    for (user, cents) in &balances.users {
        if !finished.users.contains_key(user) {
            discrepancies.push(Discrepancy {
                kind: "user_balance".into(),
                user: Some(*user),
                phase: None,
                server: *cents,
                clients: 0,
            });
        }
    }
    if final_audit["ok"] != true {
        discrepancies.push(Discrepancy {
            kind: "conservation".into(),
            user: None,
            phase: None,
            server: 0,
            clients: 0,
        });
    }

    let server_peak = samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    let server_cpu = samples
        .last()
        .map_or(0, |s| s.cpu_ms)
        .saturating_sub(server_baseline.cpu_ms);
    let per_conn = |peak: u64, base: u64| {
        peak.saturating_sub(base)
            .checked_div(peak_connections)
            .unwrap_or(0)
    };
    let audit_ok = discrepancies.is_empty() && summaries.iter().all(|s| s.audit_ok);
    let summary = json!({
        "preset_connections": opts.connections,
        "connections": { "target": opts.connections, "peak": peak_connections, "connect_seconds": connect_seconds, "all_connected": connected },
        "phases": summaries,
        "shake": shake_total,
        "send": send_total,
        "broadcast": broadcast_summary,
        "audit": {
            "ok": audit_ok,
            "discrepancies": discrepancies,
            "users_checked": users_checked,
            "server": final_audit,
        },
        "resources": {
            "server_rss_bytes": server_peak,
            "server_rss_baseline_bytes": server_baseline.rss_bytes,
            "server_rss_per_connection_bytes": per_conn(server_peak, server_baseline.rss_bytes),
            "server_cpu_seconds": server_cpu as f64 / 1000.0,
            "load_rss_bytes": load_peak_rss,
            "load_rss_baseline_bytes": load_baseline,
            "load_rss_per_connection_bytes": per_conn(load_peak_rss, load_baseline),
            "load_cpu_seconds": finished.cpu_ms as f64 / 1000.0,
        },
        "load": { "procs": load_pids.len(), "totals": finished.totals },
        "options": {
            "workers": opts.workers, "phase_qps": opts.phase_qps, "shake_packets": opts.shake_packets,
            "send_packets": opts.send_packets, "campaign_rate": opts.campaign_rate, "recipients": opts.recipients,
            "max_shake_qps": opts.max_shake_qps, "connect_rate": opts.connect_rate,
            "transport": opts.transport.to_string(), "broadcast_every": opts.broadcast_every_secs,
            "max_queue_ms": opts.max_queue_ms, "server_nice": opts.server_nice,
        },
        "network": {
            "own_namespace": opts.netns,
            "ehash_buckets": hongbao_sys::doctor::ehash_buckets(),
        },
    });
    std::fs::write(
        opts.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    let charts = hongbao_report::write_report(&opts.out).context("writing the report")?;
    say(&format!(
        "bench: report {} ({} charts)",
        opts.out.join("report.html").display(),
        charts.len()
    ));
    say(&format!(
        "bench: audit {}; summary in {}",
        if audit_ok { "ok" } else { "FAILED" },
        opts.out.join("summary.json").display()
    ));
    Ok(summary)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn wait_until_second(load: &Load, second: u64) {
    while load.current_second() < second {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a steady phase's broadcasts on time while the bench waits for other things: the
/// first when the phase's QPS holds, then every `every` (on an absolute schedule, so a
/// slow answer does not push the next one later).
struct Broadcaster {
    every: Option<Duration>,
    /// When the next one is due; `None` outside a steady phase.
    next_at: Option<Instant>,
    phase: String,
    sent: Vec<Sent>,
}

impl Broadcaster {
    fn new(every_secs: f64) -> Broadcaster {
        Broadcaster {
            every: (every_secs > 0.0).then(|| Duration::from_secs_f64(every_secs)),
            next_at: None,
            phase: String::new(),
            sent: Vec::new(),
        }
    }

    fn start_phase(&mut self, name: &str) {
        if self.every.is_some() {
            self.next_at = Some(Instant::now());
            self.phase = name.to_string();
        }
    }

    fn end_phase(&mut self) {
        self.next_at = None;
    }

    /// Sends a broadcast if one is due.
    fn tick(&mut self, server: &Server, load: &Load) -> anyhow::Result<()> {
        let (Some(every), Some(due)) = (self.every, self.next_at) else {
            return Ok(());
        };
        let now = Instant::now();
        if now < due {
            return Ok(());
        }
        let mut next = due + every;
        while next <= now {
            next += every; // fell behind (a stall): skip, do not burst
        }
        self.next_at = Some(next);
        // Drops before the send, as the clients last reported: a drop between that report
        // and the send only loosens the check (`broadcast::delivery_ok`).
        let t = load.totals();
        let text = format!("bench broadcast {}", self.sent.len() + 1);
        let r = server.post("/v1/broadcast", json!({ "text": text }))?;
        let field = |k: &str| {
            r[k].as_u64()
                .with_context(|| format!("POST /v1/broadcast answered without {k}: {r}"))
        };
        self.sent.push(Sent {
            id: field("id")?,
            server_time_us: field("server_time_us")?,
            connections: field("connections")?,
            phase: self.phase.clone(),
            drops_before: t.disconnects + t.connect_failures(),
        });
        Ok(())
    }

    /// Sleeps for `d`, sending what falls due meanwhile.
    fn sleep(&mut self, d: Duration, server: &Server, load: &Load) -> anyhow::Result<()> {
        let end = Instant::now() + d;
        loop {
            self.tick(server, load)?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    }
}

/// Waits until every broadcast in `sent` has reached as many clients as the server handed
/// it to, for at most max(5 s, twice the slowest delivery seen so far); false on timeout.
/// Clients report once a second, so the 5 s also covers their reports catching up.
fn wait_deliveries(load: &Load, sent: &[Sent]) -> bool {
    let slowest_ms = load
        .broadcasts()
        .iter()
        .map(|b| b.complete_ms())
        .fold(0.0, f64::max);
    let deadline = Instant::now() + Duration::from_secs_f64((2.0 * slowest_ms / 1000.0).max(5.0));
    loop {
        let delivered = load.broadcasts_delivered();
        let done = sent.iter().all(|s| {
            delivered
                .get(&s.server_time_us)
                .is_some_and(|&d| d >= s.connections)
        });
        if done {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls a campaign until `done`, printing the load's progress line each second.
fn wait_campaign(
    server: &Server,
    load: &Load,
    broadcaster: &mut Broadcaster,
    id: u64,
    packets: u32,
    rate: u32,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30 + (packets / rate.max(1)) as u64 * 2);
    let mut last_line = 0;
    loop {
        let c = server.get(&format!("/v1/campaigns/{id}"))?;
        if done(&c) {
            return Ok(c);
        }
        if Instant::now() > deadline {
            say(&format!("bench: campaign {id} did not finish in time: {c}"));
            return Ok(c);
        }
        if let Some(p) = load.progress() {
            if p.second != last_line {
                last_line = p.second;
                say(&format!("  {}", p.line()));
            }
        }
        broadcaster.sleep(Duration::from_millis(100), server, load)?;
    }
}

fn latency(h: &Histogram<u64>) -> LatencyMs {
    let ms = |q: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1000.0
        }
    };
    LatencyMs {
        p50: ms(0.5),
        p99: ms(0.99),
        p999: ms(0.999),
        max: if h.is_empty() {
            0.0
        } else {
            h.max() as f64 / 1000.0
        },
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[allow(clippy::too_many_arguments)]
fn phase_summary(
    phase: &Phase,
    qps: u64,
    rows: &[Row],
    samples: &[ServerSample],
    epoch_ms: u64,
    shake: &Value,
    send: &Value,
    before: &Counters,
    after: &Counters,
    rate: u32,
    discrepancies: &mut Vec<Discrepancy>,
) -> PhaseSummary {
    let mut shake_h = report::new_histogram();
    let mut open_h = report::new_histogram();
    let mut lag_h = report::new_histogram();
    let mut client_rates = Vec::new();
    let mut previous: Option<&Row> = None;
    for row in rows {
        report::merge_sparse(&mut shake_h, &row.shake_latency);
        report::merge_sparse(&mut open_h, &row.open_latency);
        report::merge_sparse(&mut lag_h, &row.send_lag);
        if let Some(prev) = previous {
            client_rates.push(progress(row, &prev.counters, 0).sent_per_sec as f64);
        }
        previous = Some(row);
    }
    let (start_ms, end_ms) = (
        epoch_ms + phase.start_second * 1000,
        epoch_ms + (phase.end_second + 1) * 1000,
    );
    let server_rates: Vec<f64> = samples
        .iter()
        .filter(|s| s.unix_ms >= start_ms + 1000 && s.unix_ms < end_ms)
        .map(|s| s.shakes_per_sec as f64)
        .collect();
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let shake_audit = ShakeAudit {
        packets: n(&shake["packets"]),
        released: n(&shake["released"]),
        won_server: n(&shake["won"]),
        won_clients: after.won - before.won,
        amount_minted: n(&shake["minted_cents"]),
        amount_won_server: n(&shake["won_cents"]),
        amount_won_clients: after.won_cents - before.won_cents,
    };
    let send_audit = SendAudit {
        packets: n(&send["released"]),
        shares: n(&send["shares"]),
        opened_server: n(&send["shares_opened"]),
        opened_clients: after.opened - before.opened,
        amount_sent: n(&send["minted_cents"]),
        amount_opened_server: n(&send["amount_opened_cents"]),
        amount_opened_clients: after.opened_cents - before.opened_cents,
    };
    let mut ok = true;
    let mut check = |kind: &str, server: u64, clients: u64| {
        if server != clients {
            ok = false;
            discrepancies.push(Discrepancy {
                kind: kind.into(),
                user: None,
                phase: Some(phase.name.clone()),
                server,
                clients,
            });
        }
    };
    check(
        "shake_packets_released_vs_won",
        shake_audit.released,
        shake_audit.won_server,
    );
    check(
        "shake_packets_minted_vs_released",
        shake_audit.packets,
        shake_audit.released,
    );
    check("shake_won", shake_audit.won_server, shake_audit.won_clients);
    check(
        "shake_amount_minted_vs_won",
        shake_audit.amount_minted,
        shake_audit.amount_won_server,
    );
    check(
        "shake_amount_won",
        shake_audit.amount_won_server,
        shake_audit.amount_won_clients,
    );
    check(
        "send_shares_created_vs_opened",
        send_audit.shares,
        send_audit.opened_server,
    );
    check(
        "send_shares_opened",
        send_audit.opened_server,
        send_audit.opened_clients,
    );
    check(
        "send_amount_sent_vs_opened",
        send_audit.amount_sent,
        send_audit.amount_opened_server,
    );
    check(
        "send_amount_opened",
        send_audit.amount_opened_server,
        send_audit.amount_opened_clients,
    );
    let measured_rate = |c: &Value| {
        let (start, end) = (n(&c["started_ms"]), n(&c["released_all_ms"]));
        if end > start {
            n(&c["released"]) as f64 * 1000.0 / (end - start) as f64
        } else {
            0.0
        }
    };
    let shake_rate = measured_rate(shake);
    let send_rate = measured_rate(send);
    let within = |r: f64, target: f64| (r - target).abs() <= target * 0.01;
    let client_qps_median = median(client_rates);
    let overloaded = after.overloaded - before.overloaded;
    PhaseSummary {
        name: phase.name.clone(),
        target_qps: qps,
        seconds: phase.end_second + 1 - phase.start_second,
        client_qps_median,
        server_qps_median: median(server_rates),
        latency_ms: latency(&shake_h),
        open_latency_ms: latency(&open_h),
        send_lag_ms: latency(&lag_h),
        overloaded,
        backed_off: after.backed_off - before.backed_off,
        errors: after.errors() - before.errors(),
        qps_within_2pct: (client_qps_median - qps as f64).abs() <= qps as f64 * 0.02,
        shake_release_rate_per_sec: shake_rate,
        send_create_rate_per_sec: send_rate,
        campaign_rates_within_1pct: within(shake_rate, rate as f64)
            && within(send_rate, rate as f64),
        shake: shake_audit,
        send: send_audit,
        audit_ok: ok,
    }
}

fn add_shake(t: &mut ShakeAudit, s: &ShakeAudit) {
    t.packets += s.packets;
    t.released += s.released;
    t.won_server += s.won_server;
    t.won_clients += s.won_clients;
    t.amount_minted += s.amount_minted;
    t.amount_won_server += s.amount_won_server;
    t.amount_won_clients += s.amount_won_clients;
}

fn add_send(t: &mut SendAudit, s: &SendAudit) {
    t.packets += s.packets;
    t.shares += s.shares;
    t.opened_server += s.opened_server;
    t.opened_clients += s.opened_clients;
    t.amount_sent += s.amount_sent;
    t.amount_opened_server += s.amount_opened_server;
    t.amount_opened_clients += s.amount_opened_clients;
}

fn load_peak_rss(rows: &[Row], pids: &[u32]) -> u64 {
    let from_rows = rows.iter().map(|r| r.rss_bytes).max().unwrap_or(0);
    let now: u64 = pids
        .iter()
        .map(|p| hongbao_sys::usage::usage_of(&p.to_string()).0)
        .sum();
    from_rows.max(now)
}
