//! Monitoring as an operator sets it up (docs/monitoring.md): the shipped Prometheus
//! configuration, alert rules and Grafana dashboard (`deploy/prometheus`, `deploy/grafana`)
//! against the real parts — `hongbao serve` (plain, and TLS on its admin address), the
//! monitor, a `metrics`-role key made by `hongbao admin-key add`, and a real `prometheus`
//! scraping them with the shipped configuration's own jobs.
//!
//! What it shows: the key opens the door and no key is refused 401; promtool passes the
//! files and the rules' own unit tests; every rule evaluates on real series, names only
//! metrics that exist, and one goes pending on real refusals; every query of every
//! dashboard panel returns data, but the cluster-only ones, which must return none here.
//!
//! Prometheus and promtool come from Debian's `prometheus`. Missing, the tests say so
//! on stderr (`SKIPPED prometheus::…`) and return, unless `HONGBAO_REQUIRE_DEPLOY_TOOLS=1`
//! (`.ci/run` installs them and sets it), which turns a missing tool into a failure.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hongbao_http::tls::DevCerts;
use hongbao_proto::{Message, ResultCode};
use serde_json::Value;

mod common;
use common::{free_port, start_monitor, token, wait_until, Serve, Server};

/// Dashboard panels whose series exist only in cluster mode: here, in embedded mode,
/// their queries must return nothing (the gauge is absent, not 0).
const CLUSTER_ONLY_PANELS: &[&str] = &["Ledger standby"];
/// Metrics the rules use that exist only in cluster mode.
const CLUSTER_ONLY_METRICS: &[&str] = &["hongbao_ledger_standby_sync"];
/// What the dashboard's variables of time stand for in its queries here.
const RATE_INTERVAL: &str = "30s";
/// How long Prometheus may take to scrape, evaluate, or hold what the test did.
const PROMETHEUS_WAIT: Duration = Duration::from_secs(45);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// `name` on the PATH, or, where it is missing, `None` after saying so on the real stderr
/// (the harness captures `eprintln!`, and a skip must be seen) — a failure instead when
/// `HONGBAO_REQUIRE_DEPLOY_TOOLS=1`.
fn tool(name: &str, test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let install = "apt-get install prometheus";
        if std::env::var_os("HONGBAO_REQUIRE_DEPLOY_TOOLS").is_some_and(|v| v == "1") {
            panic!("{name} is required here (HONGBAO_REQUIRE_DEPLOY_TOOLS=1) and is not installed: {install}");
        }
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED prometheus::{test}: {name} is not installed ({install})"
        );
    }
    found
}

/// Runs promtool with `args` (in `dir`): it must succeed.
fn promtool(promtool: &Path, dir: &Path, args: &[&str]) {
    let out = Command::new(promtool)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running promtool {args:?}: {e}"));
    assert!(
        out.status.success(),
        "promtool {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The alert names of the shipped rules file, in order.
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_shipped_files_pass_promtool_and_the_docs_name_every_alert() {
    let test = "the_shipped_files_pass_promtool_and_the_docs_name_every_alert";
    let Some(promtool_bin) = tool("promtool", test) else {
        return;
    };
    let dir = repo().join("deploy/prometheus");
    // The credentials and CA files it names are the operator's, under /etc: their
    // presence is checked on the configuration the other test generates from this one.
    promtool(
        &promtool_bin,
        &dir,
        &["check", "config", "--syntax-only", "prometheus.yml"],
    );
    promtool(
        &promtool_bin,
        &dir,
        &["check", "rules", "hongbao-rules.yml"],
    );
    promtool(
        &promtool_bin,
        &dir,
        &["test", "rules", "hongbao-rules.test.yml"],
    );

    let alerts = alert_names(&read("deploy/prometheus/hongbao-rules.yml"));
    assert!(alerts.len() >= 10, "{alerts:?}");
    let tests = read("deploy/prometheus/hongbao-rules.test.yml");
    let doc = read("docs/monitoring.md");
    let table: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `Hongbao"))
        .filter_map(|l| l.split('`').next())
        .map(|name| format!("Hongbao{name}"))
        .collect();
    for alert in &alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "hongbao-rules.test.yml does not test {alert}"
        );
    }
    assert_eq!(
        table,
        alerts.iter().cloned().collect::<BTreeSet<_>>(),
        "docs/monitoring.md's table of alerts"
    );
}

// ----- a real Prometheus -----------------------------------------------------------------

/// A `prometheus` process with its data in a temporary directory: SIGKILLed when dropped,
/// its log printed if the test fails.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    agent: ureq::Agent,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("----- prometheus log -----\n{log}-----");
        }
    }
}

impl Prometheus {
    fn start(bin: &Path, config: &Path) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = dir.path().join("prometheus.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting prometheus");
        let prometheus = Prometheus {
            child,
            addr,
            log,
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(10))
                .build(),
            _dir: dir,
        };
        wait_until("prometheus to be ready", PROMETHEUS_WAIT, || {
            let ready = prometheus
                .agent
                .get(&format!("http://{addr}/-/ready"))
                .call();
            ready.is_ok_and(|r| r.status() == 200).then_some(())
        });
        prometheus
    }

    /// `GET /api/v1/PATH` with `query`: its `data`, which must be there (status success).
    fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let mut request = self
            .agent
            .get(&format!("http://{}/api/v1/{path}", self.addr));
        for (name, value) in query {
            request = request.query(name, value);
        }
        let body: Value = match request.call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r.into_json().expect("JSON from the API"),
            Err(e) => panic!("GET /api/v1/{path}: {e}"),
        };
        assert_eq!(
            body["status"], "success",
            "/api/v1/{path} {query:?}: {body}"
        );
        body["data"].clone()
    }

    /// An instant query's result: its series.
    fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api("query", &[("query", expr)]);
        data["result"].as_array().expect("a vector").clone()
    }

    /// The active targets: (job, health, last error, scrape URL).
    fn targets(&self) -> Vec<(String, String, String, String)> {
        let data = self.api("targets", &[("state", "active")]);
        data["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    s(&t["labels"]["job"]),
                    s(&t["health"]),
                    s(&t["lastError"]),
                    s(&t["scrapeUrl"]),
                )
            })
            .collect()
    }
}

// ----- the configuration, from the shipped one --------------------------------------------

/// `text` with `from` replaced by `to`, which must be there: a shipped file that no longer
/// has what the test substitutes fails the test rather than being tested as something else.
fn substitute(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "no {from:?} in:\n{text}");
    text.replace(from, to)
}

/// The configuration with the job `job`'s part (from its `- job_name:` line to the next)
/// changed by `change`.
fn in_job(config: &str, job: &str, change: impl Fn(&str) -> String) -> String {
    let start = config
        .find(&format!("- job_name: {job}\n"))
        .unwrap_or_else(|| panic!("no job {job} in:\n{config}"));
    let end = config[start + 1..]
        .find("- job_name: ")
        .map_or(config.len(), |e| start + 1 + e);
    format!(
        "{}{}{}",
        &config[..start],
        change(&config[start..end]),
        &config[end..]
    )
}

/// `hongbao admin-key add prometheus --role metrics --data-dir DIR`, as docs/monitoring.md
/// has it: the key it prints, written to `file` as Prometheus's credentials file.
fn metrics_key(data_dir: &Path, file: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args(["admin-key", "add", "prometheus", "--role", "metrics"])
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("running hongbao admin-key add");
    assert!(
        out.status.success(),
        "hongbao admin-key add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap();
    assert!(key.starts_with("hbk_") && key.ends_with('\n'), "{key:?}");
    std::fs::write(file, &key).unwrap();
    key.trim().to_string()
}

// ----- traffic ---------------------------------------------------------------------------

/// Logins, shakes under a shake campaign (some of them shed, over the server's shake
/// rate), a token the server did not sign and an admin request above the key's role: what
/// the dashboard's panels and the rules read. The number of shakes sent.
fn traffic(server: &Server, metrics_key: &str) -> u64 {
    server.shake_campaign(300, 200, 100, 500);
    let mut clients: Vec<_> = (1..=8).map(|user| server.login(user)).collect();
    let (mut shakes, mut won) = (0, 0);
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for client in &mut clients {
            match client.shake().expect("a shake") {
                Message::ShakeReply { result, .. } => won += u64::from(result == ResultCode::Won),
                other => panic!("expected a shake reply, got {other:?}"),
            }
            shakes += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(won > 0, "no shake won of {shakes}");

    let mut stranger = server.connect();
    let forged = token("not-the-server-secret", 99);
    assert_eq!(stranger.login(&forged).unwrap(), ResultCode::BadToken);

    let (status, body) = server.with_key(metrics_key).http("GET", "/v1/audit", None);
    assert_eq!(status, 403, "a metrics key reads no audit: {body}");
    shakes
}

/// A client that does not speak TLS on a TLS listener: refused in the handshake.
fn plain_bytes_to(addr: SocketAddr) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let _ = std::io::Read::read(&mut tcp, &mut [0u8; 64]);
}

// ----- the dashboard ---------------------------------------------------------------------

/// One query of one panel: the panel's title, the target's refId, its expression.
struct PanelQuery {
    panel: String,
    ref_id: String,
    expr: String,
}

/// Every panel's queries, with the dashboard's variables put in as concrete values
/// (`$instance` its "All" value), after checking the model's shape: the Prometheus data
/// source a variable everywhere, unique ids, panels within the grid's 24 columns.
fn dashboard_queries(dashboard: &Value) -> Vec<PanelQuery> {
    let vars = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let datasource = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a data source variable");
    assert_eq!(datasource["query"], "prometheus");
    let ds_ref = format!("${{{}}}", datasource["name"].as_str().unwrap());
    let mut values: Vec<(String, String)> = vec![
        ("$__rate_interval".into(), RATE_INTERVAL.into()),
        ("$__interval".into(), RATE_INTERVAL.into()),
        ("$__range".into(), "5m".into()),
    ];
    for var in vars.iter().filter(|v| v["type"] == "query") {
        let name = var["name"].as_str().unwrap();
        let all = var["allValue"]
            .as_str()
            .expect("an All value for a query variable");
        values.push((format!("${{{name}}}"), all.into()));
        values.push((format!("${name}"), all.into()));
    }
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut queries = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "id of {title}");
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{title} is out of the grid: {grid}");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], ds_ref.as_str(), "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], ds_ref.as_str(), "{title}");
            let mut expr = target["expr"].as_str().expect("expr").to_string();
            for (var, value) in &values {
                expr = expr.replace(var, value);
            }
            assert!(!expr.contains('$'), "{title}: a variable left in {expr}");
            queries.push(PanelQuery {
                panel: title.clone(),
                ref_id: target["refId"].as_str().unwrap().to_string(),
                expr,
            });
        }
    }
    queries
}

/// The `hongbao_…` metric names an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("hongbao_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

#[test]
fn prometheus_scrapes_with_the_key_and_every_panel_has_data() {
    let test = "prometheus_scrapes_with_the_key_and_every_panel_has_data";
    let (Some(prometheus_bin), Some(promtool_bin)) =
        (tool("prometheus", test), tool("promtool", test))
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A plain gateway with a shake rate low enough that some shakes are shed, one whose
    // admin address speaks TLS (a certificate for 127.0.0.1 from a throwaway CA), and a
    // monitor that both report to.
    let (monitor, monitor_addr) = start_monitor(&dir.path().join("monitor"));
    let monitor_key_file = common::monitor_key_file(&dir.path().join("monitor"));
    let reporting = [
        "--monitor".to_string(),
        monitor_addr.to_string(),
        "--monitor-key-file".to_string(),
        monitor_key_file.display().to_string(),
    ];
    let server = Serve::new()
        .args(["--max-shake-qps", "40"])
        .args(&reporting)
        .start();
    let certs = DevCerts::make(&["127.0.0.1"]).unwrap();
    let tls_files = certs.write(&dir.path().join("tls")).unwrap();
    let tls_server = Serve::new().workers(1).tls(&tls_files).start();

    let (plain_key_file, tls_key_file) = (dir.path().join("plain.key"), dir.path().join("tls.key"));
    let key = metrics_key(&server.data_dir, &plain_key_file);
    metrics_key(&tls_server.data_dir, &tls_key_file);

    // The shipped configuration, pointed at these: each gateway's own key (in embedded
    // mode each ledger keeps its own keys; a cluster's gateways share theirs), the CA, the
    // shipped rules, scrapes every two seconds and rules every second, and a job with no
    // credentials beside it.
    let shipped = read("deploy/prometheus/prometheus.yml");
    let rules = repo().join("deploy/prometheus/hongbao-rules.yml");
    let mut config = substitute(&shipped, "scrape_interval: 15s", "scrape_interval: 1s");
    config = substitute(
        &config,
        "evaluation_interval: 15s",
        "evaluation_interval: 1s",
    );
    // Two seconds, not one: a scrape's timeout is its interval, and a debug build's
    // /metrics on a busy two-core machine may take over a second.
    config = substitute(&config, "scrape_interval: 5s", "scrape_interval: 2s");
    config = substitute(
        &config,
        "- hongbao-rules.yml",
        &format!("- {}", rules.display()),
    );
    let keys = "/etc/prometheus/hongbao-metrics.key";
    config = in_job(&config, "hongbao-serve", |job| {
        let job = substitute(job, "127.0.0.1:7001", &server.admin.addr.to_string());
        substitute(&job, keys, &plain_key_file.display().to_string())
    });
    config = in_job(&config, "hongbao-serve-tls", |job| {
        assert!(
            job.contains("scheme: https") && job.contains("tls_config:"),
            "{job}"
        );
        let job = substitute(
            job,
            "gw1.example.internal:7001",
            &tls_server.admin.addr.to_string(),
        );
        let ca = tls_files.cert.with_file_name("ca.pem");
        let job = substitute(
            &job,
            "/etc/prometheus/hongbao-ca.pem",
            &ca.display().to_string(),
        );
        substitute(&job, keys, &tls_key_file.display().to_string())
    });
    config = in_job(&config, "hongbao-monitor", |job| {
        substitute(job, "127.0.0.1:7200", &monitor_addr.to_string())
    });
    assert!(config.ends_with('\n'));
    config.push_str(&format!(
        "\n  - job_name: no-key\n    scrape_interval: 1s\n    static_configs:\n      - targets: [\"{}\"]\n",
        server.admin.addr
    ));
    let config_file = dir.path().join("prometheus.yml");
    std::fs::write(&config_file, &config).unwrap();
    // Not syntax only: the credentials, CA and rule files are there and read.
    promtool(
        &promtool_bin,
        dir.path(),
        &["check", "config", config_file.to_str().unwrap()],
    );
    let prometheus = Prometheus::start(&prometheus_bin, &config_file);

    let shakes = traffic(&server, &key);
    plain_bytes_to(tls_server.listen);

    // (a) The door: with the key every gateway is up, over TLS too; the monitor's read
    // needs none; without a key the same address is refused 401.
    wait_until("every target scraped", PROMETHEUS_WAIT, || {
        let targets = prometheus.targets();
        let health = |job: &str| {
            targets
                .iter()
                .find(|t| t.0 == job)
                .map(|t| (t.1.clone(), t.2.clone(), t.3.clone()))
        };
        let (serve, tls, mon, no_key) = (
            health("hongbao-serve")?,
            health("hongbao-serve-tls")?,
            health("hongbao-monitor")?,
            health("no-key")?,
        );
        let done = [&serve, &tls, &mon, &no_key]
            .iter()
            .all(|t| t.0 != "unknown");
        if !done {
            return None;
        }
        assert_eq!(serve.0, "up", "with the key: {serve:?}");
        assert_eq!(tls.0, "up", "with the key over TLS: {tls:?}");
        assert!(tls.2.starts_with("https://"), "{tls:?}");
        assert_eq!(mon.0, "up", "the monitor: {mon:?}");
        assert_eq!(no_key.0, "down", "without a key: {no_key:?}");
        assert!(no_key.1.contains("401"), "without a key: {no_key:?}");
        Some(())
    });

    // What the test did is in Prometheus: every shake sent counted by the workers.
    let job = r#"job="hongbao-serve""#;
    wait_until("the shakes scraped", PROMETHEUS_WAIT, || {
        let seen = prometheus.query(&format!("sum(hongbao_worker_shakes_total{{{job}}})"));
        let n: f64 = seen.first()?["value"][1].as_str()?.parse().ok()?;
        (n >= shakes as f64).then_some(())
    });
    wait_until("a refused TLS handshake scraped", PROMETHEUS_WAIT, || {
        let expr = r#"sum(hongbao_worker_tls_refused_total{job="hongbao-serve-tls"}) > 0"#;
        (!prometheus.query(expr).is_empty()).then_some(())
    });
    for (what, expr) in [
        (
            "a forged token",
            "hongbao_token_refusals_total{reason=\"bad-signature\"} > 0",
        ),
        (
            "the metrics key's 403",
            "hongbao_admin_refusals_total{status=\"403\",reason=\"role\"} > 0",
        ),
        (
            "the no-key job's 401s",
            "hongbao_admin_refusals_total{status=\"401\",reason=\"no-key\"} > 0",
        ),
        (
            "shed shakes",
            "sum(hongbao_worker_shakes_overloaded_total) > 0",
        ),
        ("the monitor's rows", "hongbao_monitor_rows_total > 0"),
    ] {
        let deadline = Instant::now() + PROMETHEUS_WAIT;
        while prometheus.query(expr).is_empty() {
            let seen =
                prometheus.query(r#"{__name__=~"hongbao_(admin|token)_refusals_total"} > 0"#);
            assert!(
                Instant::now() < deadline,
                "{what}: {expr} is empty; refusals seen: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // A rate needs two samples in its window: three scrapes of each gateway in it.
    wait_until("three scrapes of each gateway", PROMETHEUS_WAIT, || {
        let expr = format!(
            r#"count_over_time(hongbao_ledger_seq{{job=~"hongbao-serve|hongbao-serve-tls"}}[{RATE_INTERVAL}]) >= 3"#
        );
        (prometheus.query(&expr).len() == 2).then_some(())
    });

    // (d) Every panel's every query returns data; the cluster-only ones none, as
    // documented (their gauge is absent in embedded mode).
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/hongbao.json")).unwrap();
    let queries = dashboard_queries(&dashboard);
    for panel in CLUSTER_ONLY_PANELS {
        assert!(
            queries.iter().any(|q| q.panel == *panel),
            "no panel {panel}"
        );
    }
    let mut empty = Vec::new();
    for q in &queries {
        let result = prometheus.query(&q.expr);
        let cluster_only = CLUSTER_ONLY_PANELS.contains(&q.panel.as_str());
        if cluster_only {
            assert!(
                result.is_empty(),
                "{} ({}): cluster mode only, yet embedded mode has {result:?}",
                q.panel,
                q.ref_id
            );
        } else if result.is_empty() {
            empty.push(format!("{} ({}): {}", q.panel, q.ref_id, q.expr));
        }
    }
    assert!(
        empty.is_empty(),
        "panel queries with no data:\n{}",
        empty.join("\n")
    );
    eprintln!(
        "{} panel queries returned data; cluster mode only, and empty here as they must be: {CLUSTER_ONLY_PANELS:?}",
        queries.len() - queries.iter().filter(|q| CLUSTER_ONLY_PANELS.contains(&q.panel.as_str())).count()
    );

    // The rules, as Prometheus runs them: every one evaluated without error, reading only
    // metrics that exist (the cluster-only ones absent here, as they must be), and the
    // admin refusals' rule pending on the no-key job's real 401s.
    let shipped_alerts = alert_names(&read("deploy/prometheus/hongbao-rules.yml"));
    let rules_run = wait_until("every rule evaluated", PROMETHEUS_WAIT, || {
        let groups = prometheus.api("rules", &[]);
        let rules: Vec<Value> = groups["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        (rules.len() == shipped_alerts.len() && rules.iter().all(|r| r["health"] != "unknown"))
            .then_some(rules)
    });
    for rule in &rules_run {
        let name = rule["name"].as_str().unwrap();
        assert_eq!(rule["health"], "ok", "{name}: {}", rule["lastError"]);
        for metric in metric_names(rule["query"].as_str().unwrap()) {
            let exists = !prometheus.query(&format!("count({metric})")).is_empty();
            if CLUSTER_ONLY_METRICS.contains(&metric.as_str()) {
                assert!(!exists, "{name}: {metric} is cluster mode's only, yet here");
            } else {
                assert!(exists, "{name} reads {metric}, which no target has");
            }
        }
    }
    wait_until(
        "HongbaoAdminRefused pending on the 401s",
        PROMETHEUS_WAIT,
        || {
            let alerts = prometheus.api("alerts", &[]);
            alerts["alerts"].as_array()?.iter().find_map(|a| {
                let l = &a["labels"];
                (l["alertname"] == "HongbaoAdminRefused"
                    && l["instance"] == server.admin.addr.to_string().as_str()
                    && l["status"] == "401"
                    && l["reason"] == "no-key"
                    && a["state"] == "pending")
                    .then_some(())
            })
        },
    );
    drop(prometheus);
    drop(monitor);
}
