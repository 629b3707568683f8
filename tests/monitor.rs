//! End-to-end tests of `hongbao monitor` and of the Prometheus text that `serve` and the
//! monitor expose: the real binary, real sockets on `127.0.0.1:0`, and `/metrics` read by
//! a real Prometheus text-format parser (`prometheus-parse`), not by string matching.
//!
//! Every process a test starts is held by a `Hongbao` guard that SIGKILLs it when the
//! test ends, so nothing outlives a failing test; its stderr is printed if the test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;

use common::{
    monitor_key, monitor_key_file, start_monitor, wait_until, Hongbao, Serve, IO_TIMEOUT,
};
use hongbao_proto::{Message, ResultCode};
use hongbao_telemetry::{RoleSample, Sample};
use prometheus_parse::{HistogramCount, Scrape, Value as PromValue};
use serde_json::Value;

const LATENCY_METRIC: &str = "hongbao_shake_latency_seconds";

// ----- HTTP ------------------------------------------------------------------------------

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn http(method: &str, addr: SocketAddr, path: &str, body: Option<&str>) -> Reply {
    http_as(None, method, addr, path, body)
}

/// A request with the monitor's key (`key`) when given; a body goes as JSON.
fn http_as(
    key: Option<&str>,
    method: &str,
    addr: SocketAddr,
    path: &str,
    body: Option<&str>,
) -> Reply {
    let agent = ureq::AgentBuilder::new().timeout(IO_TIMEOUT).build();
    let mut request = agent.request(method, &format!("http://{addr}{path}"));
    if let Some(key) = key {
        request = request.set("Authorization", &format!("Bearer {key}"));
    }
    let result = match body {
        Some(body) => request
            .set("Content-Type", "application/json")
            .send_string(body),
        None => request.call(),
    };
    let response = match result {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    Reply {
        status: response.status(),
        content_type: response.header("Content-Type").unwrap_or("").to_string(),
        body: response.into_string().unwrap_or_default(),
    }
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    let reply = http("GET", addr, path, None);
    assert_eq!(reply.status, 200, "GET {path}: {}", reply.body);
    reply
}

/// A POST with the monitor's key: reports and marks need it.
fn post(addr: SocketAddr, key: &str, path: &str, body: &str) -> Reply {
    http_as(Some(key), "POST", addr, path, Some(body))
}

/// A 400 whose body is `{"error": "..."}`.
fn assert_refused(reply: &Reply, what: &str) {
    assert_eq!(reply.status, 400, "{what}: {}", reply.body);
    assert!(
        reply.content_type.starts_with("application/json"),
        "{what}: {}",
        reply.content_type
    );
    let error = reply.json();
    let message = error["error"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{what}: {error}");
}

// ----- Prometheus text -------------------------------------------------------------------

/// `/metrics` read by the parser. Fails if the parser dropped any line: it skips lines it
/// cannot read instead of failing, so every non-comment line must come back as a sample
/// (or as one bucket of a histogram).
fn scrape(addr: SocketAddr) -> Vec<prometheus_parse::Sample> {
    scrape_as(None, addr)
}

/// `scrape`, with a key: `serve`'s admin `/metrics` needs one (a scraper's `metrics`
/// key would do), the monitor's does not.
fn scrape_as(key: Option<&str>, addr: SocketAddr) -> Vec<prometheus_parse::Sample> {
    let reply = http_as(key, "GET", addr, "/metrics", None);
    assert_eq!(reply.status, 200, "GET /metrics: {}", reply.body);
    promtool_finds_nothing(&reply.body);
    assert!(
        reply.content_type.starts_with("text/plain") && reply.content_type.contains("0.0.4"),
        "content type {:?}",
        reply.content_type
    );
    let text = reply.body;
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = Scrape::parse(lines).expect("the Prometheus parser refused /metrics");
    let sample_lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    let parsed: usize = scrape
        .samples
        .iter()
        .map(|s| match &s.value {
            PromValue::Histogram(buckets) => buckets.len(),
            PromValue::Summary(quantiles) => quantiles.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(parsed, sample_lines, "the parser skipped lines of:\n{text}");
    for s in &scrape.samples {
        assert!(
            s.metric.starts_with("hongbao_"),
            "{} lacks the prefix",
            s.metric
        );
        // A histogram's `_sum` and `_count` come back as samples of their own.
        let family = [
            s.metric.as_str(),
            s.metric.trim_end_matches("_count"),
            s.metric.trim_end_matches("_sum"),
        ];
        assert!(
            family.iter().any(|f| scrape.docs.contains_key(*f)),
            "no HELP for {}",
            s.metric
        );
    }
    scrape.samples
}

/// `promtool check metrics` (Prometheus's own linter, from Debian's `prometheus`) on the
/// page: no problem reported. `.ci/run` installs it.
fn promtool_finds_nothing(text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus) checks /metrics");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn labels_are(sample: &prometheus_parse::Sample, labels: &[(&str, &str)]) -> bool {
    sample.labels.len() == labels.len()
        && labels.iter().all(|(k, v)| sample.labels.get(k) == Some(*v))
}

/// The value of a counter, gauge or untyped sample with exactly these labels.
fn value(samples: &[prometheus_parse::Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .filter(|s| s.metric == name && labels_are(s, labels))
        .find_map(|s| match s.value {
            PromValue::Counter(v) | PromValue::Gauge(v) | PromValue::Untyped(v) => Some(v),
            _ => None,
        })
}

/// A counter with exactly these labels: it must be typed `counter`.
fn counter(
    samples: &[prometheus_parse::Sample],
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    let sample = samples
        .iter()
        .find(|s| s.metric == name && labels_are(s, labels))?;
    match sample.value {
        PromValue::Counter(v) => Some(v),
        ref other => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

/// A per-worker counter summed over the workers; every sample must carry a `worker`
/// label and be typed `counter`.
fn worker_sum(samples: &[prometheus_parse::Sample], name: &str) -> Option<f64> {
    let per_worker: Vec<f64> = samples
        .iter()
        .filter(|s| s.metric == name)
        .map(|s| {
            assert!(
                s.labels.get("worker").is_some(),
                "{name} without a worker label"
            );
            match s.value {
                PromValue::Counter(v) => v,
                ref other => panic!("{name} is not a counter: {other:?}"),
            }
        })
        .collect();
    (!per_worker.is_empty()).then(|| per_worker.iter().sum())
}

/// The latency histogram with exactly these labels (besides `le`), checked: the documented
/// bounds in order, cumulative counts, and `+Inf` equal to `_count`. Returns the count.
fn latency_histogram(samples: &[prometheus_parse::Sample], labels: &[(&str, &str)]) -> u64 {
    let buckets: &[HistogramCount] = samples
        .iter()
        .filter(|s| s.metric == LATENCY_METRIC && labels_are(s, labels))
        .find_map(|s| match &s.value {
            PromValue::Histogram(b) => Some(b.as_slice()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no histogram {LATENCY_METRIC} {labels:?}"));
    let bounds: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
    let mut expected = hongbao_telemetry::prom::LATENCY_BUCKETS.to_vec();
    expected.push(f64::INFINITY);
    assert_eq!(
        bounds, expected,
        "bucket bounds of {LATENCY_METRIC} {labels:?}"
    );
    let counts: Vec<f64> = buckets.iter().map(|b| b.count).collect();
    assert!(
        counts.windows(2).all(|w| w[0] <= w[1]),
        "buckets are not cumulative: {counts:?}"
    );
    let inf = *counts.last().unwrap();
    let count = value(samples, &format!("{LATENCY_METRIC}_count"), labels)
        .unwrap_or_else(|| panic!("no {LATENCY_METRIC}_count {labels:?}"));
    assert_eq!(inf, count, "+Inf bucket against _count: {counts:?}");
    let sum = value(samples, &format!("{LATENCY_METRIC}_sum"), labels)
        .unwrap_or_else(|| panic!("no {LATENCY_METRIC}_sum {labels:?}"));
    assert!(
        sum >= 0.0 && (count == 0.0) == (sum == 0.0),
        "sum {sum} for count {count}"
    );
    count as u64
}

// ----- series.csv ------------------------------------------------------------------------

/// series.csv as rows of column → cell. Cells here hold no commas (no phase names with
/// one), so a plain split reads them.
fn series_rows(csv: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    assert_eq!(header, hongbao_monitor::collector::COLUMNS);
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            assert_eq!(cells.len(), header.len(), "row {line:?}");
            header
                .iter()
                .zip(cells)
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

fn column_sum(rows: &[BTreeMap<String, String>], role: &str, column: &str) -> u64 {
    rows.iter()
        .filter(|r| r["role"] == role)
        .map(|r| r[column].parse::<u64>().unwrap_or(0))
        .sum()
}

// ----- misc ------------------------------------------------------------------------------

fn unix_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

// ----- the tests -------------------------------------------------------------------------

/// A serve and a two-process load report to one monitor: its live endpoints answer while
/// they run, and after both stop, series.csv holds every role, second by second, with
/// counts that add up to the load's own totals.
#[test]
fn monitor_merges_serve_and_load_by_second() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("monitor-out");
    let (mut monitor, monitor_addr) = start_monitor(&out);
    let key_file = monitor_key_file(&out);
    let key_file = key_file.to_str().unwrap();
    let mut serve = Serve::new()
        .dev_secret()
        .args([
            "--monitor",
            &monitor_addr.to_string(),
            "--monitor-key-file",
            key_file,
        ])
        .start();
    serve.shake_campaign(1000, 200, 100, 500);

    let (server, monitor_arg) = (serve.listen.to_string(), monitor_addr.to_string());
    let mut load = Hongbao::spawn(
        "load",
        &[
            "load",
            "--server",
            &server,
            "--users",
            "500",
            "--qps",
            "500",
            "--duration",
            "6",
            "--procs",
            "2",
            "--monitor",
            &monitor_arg,
            "--monitor-key-file",
            key_file,
        ],
    );
    // While the load fires: both roles' counters and the load's latency show on /metrics.
    wait_until(
        "the load's shakes on the monitor's /metrics",
        Duration::from_secs(30),
        || {
            let samples = scrape(monitor_addr);
            let has_latency = samples
                .iter()
                .any(|s| s.metric == LATENCY_METRIC && labels_are(s, &[("role", "load")]));
            let load_shakes = counter(&samples, "hongbao_shakes_total", &[("role", "load")]);
            let server_shakes = counter(&samples, "hongbao_shakes_total", &[("role", "server")]);
            (has_latency && load_shakes > Some(0.0) && server_shakes > Some(0.0)).then_some(())
        },
    );
    let status = load.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "hongbao load exited with {status}");
    let stdout = load.rest_of_stdout();
    let json_start = stdout
        .iter()
        .position(|l| l == "{")
        .unwrap_or_else(|| panic!("no totals JSON in {stdout:#?}"));
    let summary: Value = serde_json::from_str(&stdout[json_start..].join("\n")).unwrap();
    let shakes_sent = summary["totals"]["shakes_sent"].as_u64().unwrap();
    assert!(
        shakes_sent >= 1000,
        "only {shakes_sent} shakes in 6 s at 500/s"
    );
    // The whole run's latency, merged from every process's seconds.
    let latency = &summary["latency_ms"];
    let ms = |q: &str| {
        latency[q]
            .as_f64()
            .unwrap_or_else(|| panic!("no {q} in {latency}"))
    };
    assert!(
        ms("p50") > 0.0 && ms("p50") <= ms("p99") && ms("p99") <= ms("max"),
        "{latency}"
    );
    assert!(
        summary["send_lag_ms"]["max"].as_f64().is_some(),
        "{summary:#}"
    );

    // Right after the load, before anything stops.
    let samples = scrape(monitor_addr);
    let load_count = latency_histogram(&samples, &[("role", "load")]);
    assert!(load_count > 0);
    assert!(
        load_count <= shakes_sent,
        "{load_count} latencies for {shakes_sent} shakes"
    );
    let server_count = latency_histogram(&samples, &[("role", "server")]);
    assert!(server_count > 0);
    let load_shakes = counter(&samples, "hongbao_shakes_total", &[("role", "load")]).unwrap();
    assert!(load_shakes > 0.0 && load_shakes <= shakes_sent as f64);
    assert!(counter(&samples, "hongbao_shakes_total", &[("role", "server")]).unwrap() > 0.0);
    assert!(counter(
        &samples,
        "hongbao_packets_released_total",
        &[("role", "core")]
    )
    .is_some());
    assert!(counter(
        &samples,
        "hongbao_network_rx_packets_total",
        &[("role", "host")]
    )
    .is_some());
    assert!(counter(&samples, "hongbao_monitor_rows_total", &[]).unwrap() > 0.0);
    assert!(value(&samples, "hongbao_connections", &[("role", "load")]).is_some());

    let rows = get(monitor_addr, "/v1/rows").json();
    for role in ["server", "core", "load", "host"] {
        assert_eq!(rows["rows"][role]["role"], role, "{rows:#}");
    }
    assert!(rows["unix_second"].as_u64().unwrap() <= unix_second());
    // The dashboard's headline: the newest second's figures.
    let latest = get(monitor_addr, "/v1/latest").json();
    assert!(latest["unix_second"].as_u64().unwrap() <= unix_second());
    assert!(latest["client_qps"].is_number(), "{latest:#}");
    assert!(latest["server_qps"].is_number(), "{latest:#}");
    let charts = get(monitor_addr, "/v1/charts").json();
    let names: Vec<&str> = charts
        .as_array()
        .expect("an array of charts")
        .iter()
        .map(|c| {
            assert!(c["title"].as_str().is_some_and(|t| !t.is_empty()), "{c}");
            c["name"].as_str().unwrap()
        })
        .collect();
    let documented: Vec<&str> = hongbao_report::CHARTS.iter().map(|c| c.name).collect();
    assert_eq!(names, documented);
    let svg = get(monitor_addr, "/charts/qps.svg");
    assert!(
        svg.content_type.starts_with("image/svg+xml"),
        "{}",
        svg.content_type
    );
    let head = svg.body.trim_start();
    assert!(
        (head.starts_with("<svg") || head.starts_with("<?xml")) && head.contains("<svg"),
        "not an SVG: {}",
        &head[..head.len().min(200)]
    );
    assert_eq!(
        http("GET", monitor_addr, "/charts/nothing.svg", None).status,
        404
    );

    serve.process.interrupt();
    monitor.interrupt();
    let monitor_stdout = monitor.rest_of_stdout();
    assert!(
        monitor_stdout.iter().any(|l| l.starts_with("report: ")),
        "{monitor_stdout:?}"
    );
    assert!(out.join("report.html").is_file());

    let csv = std::fs::read_to_string(out.join("series.csv")).unwrap();
    let rows = series_rows(&csv);
    let mut seconds: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for r in &rows {
        seconds
            .entry(r["role"].as_str())
            .or_default()
            .push(r["unix_second"].parse().unwrap());
        assert_eq!(r["phase"], "", "no marks were made: {r:?}");
    }
    assert_eq!(
        seconds.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from(["core", "host", "load", "server"])
    );
    for (role, s) in &seconds {
        assert!(s.len() >= 4, "{role}: {s:?}");
        assert!(
            s.windows(2).all(|w| w[1] == w[0] + 1),
            "{role}: gaps in {s:?}"
        );
    }
    assert_eq!(column_sum(&rows, "load", "shakes"), shakes_sent);
    // Every shake the load sent reached a worker and was counted there.
    assert_eq!(column_sum(&rows, "server", "shakes"), shakes_sent);
    assert_eq!(
        column_sum(&rows, "load", "won"),
        summary["totals"]["won"].as_u64().unwrap()
    );
}

/// `serve`'s admin `/metrics` reads as Prometheus text 0.0.4, with the shakes made and
/// their latency histogram.
#[test]
fn serve_metrics_parse_as_prometheus_text() {
    let serve = Serve::new().dev_secret().start();
    // What a Prometheus scraper holds: a key of the metrics role.
    let scraper = serve.admin.make_key("prometheus", "metrics");
    // A few packets, so some shakes win (answered via the core) and the rest get nothing.
    serve.shake_campaign(3, 1000, 100, 500);
    let mut shakes = 0u64;
    let mut won = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    for user in 1..=4 {
        let mut client = serve.login(user);
        // Three shakes each, and the last user on until one has won (the packets may
        // reach the pools after the first shakes).
        let mut tries = 0;
        while tries < 3 || (user == 4 && won == 0 && Instant::now() < deadline) {
            tries += 1;
            if tries > 3 {
                std::thread::sleep(Duration::from_millis(20));
            }
            match client.shake().expect("shake") {
                Message::ShakeReply { result, .. } => {
                    assert!(matches!(result, ResultCode::Won | ResultCode::Nothing));
                    won += u64::from(result == ResultCode::Won);
                }
                other => panic!("expected a shake reply, got {other:?}"),
            }
            shakes += 1;
        }
    }

    // Workers report once a second; wait for the reports that carry these shakes.
    let samples = wait_until("the shakes on /metrics", Duration::from_secs(10), || {
        let samples = scrape_as(Some(&scraper), serve.admin.addr);
        let counted = worker_sum(&samples, "hongbao_worker_shakes_total")?;
        let latencies = value(&samples, &format!("{LATENCY_METRIC}_count"), &[])?;
        (counted >= shakes as f64 && latencies >= shakes as f64).then_some(samples)
    });
    assert!(latency_histogram(&samples, &[]) >= shakes);
    assert_eq!(value(&samples, "hongbao_audit_ok", &[]), Some(1.0));
    assert_eq!(
        counter(
            &samples,
            "hongbao_core_replies_total",
            &[("op", "shake"), ("result", "won")]
        ),
        Some(won as f64)
    );
    assert!(worker_sum(&samples, "hongbao_worker_logins_total").unwrap() >= 4.0);
    for worker in ["0", "1"] {
        let labels = [("worker", worker)];
        assert!(value(&samples, "hongbao_worker_connections", &labels).is_some());
        assert!(value(&samples, "hongbao_worker_pool_packets", &labels).is_some());
        assert!(counter(&samples, "hongbao_worker_cpu_seconds_total", &labels).is_some());
        assert!(counter(&samples, "hongbao_worker_shakes_total", &labels).is_some());
    }
    let minted = value(&samples, "hongbao_money_minted_cents", &[]).unwrap();
    assert!((300.0..=1500.0).contains(&minted), "minted {minted}");
    let seq = value(&samples, "hongbao_ledger_seq", &[]).unwrap();
    assert!(seq >= 1.0 + won as f64);
}

/// The monitor refuses what is not a report or a mark with a 400 and a reason, takes the
/// good ones, writes rows for reports of past seconds, and stays up throughout.
#[test]
fn monitor_rejects_bad_reports_and_marks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("monitor-out");
    let (mut monitor, addr) = start_monitor(&out);
    let key = monitor_key(&out);

    let bad_reports = [
        "garbage{",
        "",
        "[]",
        r#"{"instance": 5}"#,
        r#"{"instance": "x", "host": "h", "unix_second": "soon", "roles": []}"#,
        r#"{"instance": "x", "host": "h", "unix_second": 1, "roles": [{"role": "load"}]}"#,
    ];
    for body in bad_reports {
        assert_refused(
            &post(addr, &key, "/v1/report", body),
            &format!("report {body:?}"),
        );
    }
    for body in ["{}", "garbage", r#"{"phase": ""}"#, r#"{"phase": 7}"#] {
        assert_refused(
            &post(addr, &key, "/v1/mark", body),
            &format!("mark {body:?}"),
        );
    }
    let mark = post(addr, &key, "/v1/mark", r#"{"phase": "warmup"}"#);
    assert_eq!(mark.status, 200, "{}", mark.body);
    assert_eq!(mark.json()["phase"], "warmup");
    assert_eq!(http("GET", addr, "/v1/nothing", None).status, 404);

    // Two consecutive seconds, long past: written at once, since their grace is over.
    let first = unix_second() - 100;
    let report = |second: u64, shakes: u64| Sample {
        instance: "test@here:1".into(),
        host: "here".into(),
        unix_second: second,
        roles: vec![RoleSample {
            role: "load".into(),
            processes: 1,
            cpu_ms: 10 * shakes,
            counters: BTreeMap::from([("shakes".to_string(), shakes)]),
            levels: BTreeMap::from([("connections".to_string(), 3)]),
            latency_us: vec![(250, shakes)],
        }],
        net: None,
    };
    for (second, shakes) in [(first, 10), (first + 1, 25)] {
        let body = serde_json::to_string(&report(second, shakes)).unwrap();
        let reply = post(addr, &key, "/v1/report", &body);
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    // The ticker may close the first second between the two reports; the second's counts
    // then go to the oldest second still open. Either way they are all written.
    let rows = wait_until(
        "rows for the reported seconds",
        Duration::from_secs(5),
        || {
            let rows = series_rows(&get(addr, "/v1/series.csv").body);
            (column_sum(&rows, "load", "shakes") == 25).then_some(rows)
        },
    );
    let seconds: Vec<u64> = rows
        .iter()
        .map(|r| r["unix_second"].parse().unwrap())
        .collect();
    assert_eq!(seconds[..2], [first, first + 1], "{seconds:?}");
    assert!(
        seconds.windows(2).all(|w| w[1] == w[0] + 1),
        "gaps in {seconds:?}"
    );
    assert!(rows.iter().all(|r| r["role"] == "load"));
    assert_eq!(rows[0]["shakes"], "10");
    assert_eq!(rows[0]["connections"], "3");
    assert_eq!(rows[0]["latency_p50_ms"], "0.25");
    assert_eq!(rows[0]["phase"], "", "the mark came later");
    let samples = scrape(addr);
    assert_eq!(
        counter(&samples, "hongbao_shakes_total", &[("role", "load")]),
        Some(25.0)
    );
    assert_eq!(latency_histogram(&samples, &[("role", "load")]), 35);

    let page = get(addr, "/");
    assert!(
        page.content_type.starts_with("text/html"),
        "{}",
        page.content_type
    );
    monitor.interrupt();
    let written = std::fs::read_to_string(out.join("series.csv")).unwrap();
    assert!(
        written.starts_with(&rows_prefix(&rows)),
        "series.csv lacks the rows served"
    );
    assert!(out.join("report.html").is_file());
}

/// The header and first two rows of series.csv, as the monitor wrote them.
fn rows_prefix(rows: &[BTreeMap<String, String>]) -> String {
    let columns = hongbao_monitor::collector::COLUMNS;
    let mut text = columns.join(",") + "\n";
    for row in rows.iter().take(2) {
        let cells: Vec<&str> = columns.iter().map(|c| row[*c].as_str()).collect();
        text += &(cells.join(",") + "\n");
    }
    text
}
