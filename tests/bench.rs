//! `hongbao bench` at the scale CI can afford, end to end: a real server (3 worker
//! processes), a real load (3 client processes) holding 30,000 connections, both
//! campaigns in two phases, and the money audit — the smoke test of the multi-process path.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

mod common;
use common::run_bench;

#[test]
fn small_bench_balances_every_cent_and_matches_the_campaigns() {
    let out = tempfile::tempdir().unwrap();
    let (shake_packets, send_packets, recipients) = (150u64, 60u64, 3u64);
    let summary = run_bench(
        out.path(),
        &format!(
            "--connections 30000 --workers 3 --procs 3 --phase-qps 1500,3000 \
             --campaign-rate 200 --shake-packets {shake_packets} --send-packets {send_packets}"
        ),
    );
    let phases = summary["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 2);
    for phase in phases {
        assert_eq!(phase["audit_ok"], true, "phase audit: {phase}");
        // Every shake sent was timed against its intended send time (at least 1 µs late).
        let lag = &phase["send_lag_ms"];
        assert!(lag["p50"].as_f64().unwrap() > 0.0, "send lag: {lag}");
        assert!(lag["max"].as_f64().unwrap() >= lag["p99"].as_f64().unwrap());
    }

    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    assert_eq!(
        summary["audit"]["discrepancies"].as_array().unwrap().len(),
        0
    );
    assert_eq!(summary["connections"]["peak"], 30000);
    // Op by op: every win and open told is the ledger's, and the ledger holds no other.
    let h = &summary["history"];
    assert_eq!(h["wins_told"], 2 * shake_packets, "{h}");
    assert_eq!(h["opens_told"], 2 * send_packets * recipients, "{h}");
    assert_eq!(
        h["confirmed"].as_u64(),
        Some(2 * (shake_packets + send_packets * recipients)),
        "{h}"
    );
    assert_eq!(h["ledger_only"]["count"], 0, "{h}");

    // The counts match the campaigns exactly: every packet released was won and seen won,
    // every share created was opened and seen opened, to the cent.
    let s = &summary["shake"];
    assert_eq!(s["packets"], 2 * shake_packets);
    assert_eq!(s["won_server"], s["packets"]);
    assert_eq!(s["won_clients"], s["packets"]);
    assert_eq!(s["amount_won_server"], s["amount_minted"]);
    assert_eq!(s["amount_won_clients"], s["amount_minted"]);
    let d = &summary["send"];
    assert_eq!(d["packets"], 2 * send_packets);
    assert_eq!(d["shares"], 2 * send_packets * recipients);
    assert_eq!(d["opened_server"], d["shares"]);
    assert_eq!(d["opened_clients"], d["shares"]);
    assert_eq!(d["amount_opened_server"], d["amount_sent"]);
    assert_eq!(d["amount_opened_clients"], d["amount_sent"]);

    let server_audit = &summary["audit"]["server"];
    assert_eq!(server_audit["ok"], true);
    assert_eq!(server_audit["unclaimed_cents"], 0);
    assert_eq!(server_audit["unopened_cents"], 0);
    assert_eq!(
        server_audit["user_balances_cents"].as_u64().unwrap(),
        s["amount_minted"].as_u64().unwrap() + d["amount_sent"].as_u64().unwrap()
    );

    check_series(out.path(), &summary, &["connect", "qps-1500", "qps-3000"]);
    check_report(out.path());
}

/// `--netns`: the bench runs in a network namespace of its own whose established-socket
/// hash is sized for its connections, and the host's setting is left as it was.
#[test]
fn a_bench_in_its_own_network_namespace_balances_and_leaves_the_host_as_it_was() {
    let child_ehash = "/proc/sys/net/ipv4/tcp_child_ehash_entries";
    if std::fs::OpenOptions::new()
        .write(true)
        .open(child_ehash)
        .is_err()
    {
        eprintln!("skipped: --netns needs root and a kernel with {child_ehash}");
        return;
    }
    let host_before = std::fs::read_to_string(child_ehash).unwrap();
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(
        out.path(),
        "--netns --connections 3000 --workers 2 --procs 2 --phase-qps 1000 \
         --shake-packets 100 --send-packets 40",
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    assert_eq!(summary["network"]["own_namespace"], true);
    assert_eq!(
        summary["network"]["ehash_buckets"],
        hongbao_sys::doctor::ehash_buckets_wanted(3000)
    );
    assert_eq!(std::fs::read_to_string(child_ehash).unwrap(), host_before);
}

/// Over WebSocket, with broadcasts during the phases: every connection receives every
/// broadcast, and the series, the summary and broadcasts.json agree.
#[test]
fn small_websocket_bench_delivers_every_broadcast() {
    let out = tempfile::tempdir().unwrap();
    let connections = 3000u64;
    let summary = run_bench(
        out.path(),
        &format!(
            "--transport ws --connections {connections} --workers 2 --procs 2 \
             --phase-qps 1000 --shake-packets 100 --send-packets 50 --broadcast-every 2"
        ),
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    let b = &summary["broadcast"];
    let sent = b["sent"].as_u64().unwrap();
    assert!(sent >= 1, "{b}");
    assert_eq!(b["connections"], sent * connections, "{b}");
    assert_eq!(b["delivered"], b["connections"], "{b}");
    for k in [
        "min", "mean", "stddev", "p50", "p75", "p95", "p98", "p99", "p999", "max",
    ] {
        assert!(b["latency_ms"][k].is_number(), "broadcast.latency_ms.{k}");
    }
    assert!(b["complete_ms"].as_f64().unwrap() > 0.0);
    let list: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("broadcasts.json")).unwrap())
            .unwrap();
    assert_eq!(list.len() as u64, sent);
    for one in &list {
        assert_eq!(one["delivered"], connections, "{one}");
        let id = one["id"].as_u64().unwrap();
        assert!(out.path().join(format!("broadcast_{id}.png")).exists());
    }
    check_series(out.path(), &summary, &["connect", "qps-1000"]);
    let series = std::fs::read_to_string(out.path().join("series.csv")).unwrap();
    let header: Vec<&str> = series.lines().next().unwrap().split(',').collect();
    let col = header
        .iter()
        .position(|c| *c == "broadcast_delivered")
        .unwrap();
    let delivered: u64 = series
        .lines()
        .skip(1)
        .filter(|l| l.contains(",load,"))
        .map(|l| l.split(',').nth(col).unwrap().parse::<u64>().unwrap_or(0))
        .sum();
    assert_eq!(delivered, sent * connections);
}

/// The bench over the HTTP API: keep-alive connections, then a connection per request.
/// HTTP users get no pushes and find their packets by polling `GET /v1/notices`; the
/// audit is the same three-way audit to the cent.
#[test]
fn small_http_benches_balance_every_cent() {
    for (connection, users) in [("keep-alive", 3000), ("close", 1000), ("client-close", 500)] {
        let out = tempfile::tempdir().unwrap();
        let summary = run_bench(
            out.path(),
            &format!(
                "--transport http --http-connection {connection} --connections {users} \
                 --workers 2 --procs 2 --phase-qps 1000 --campaign-rate 200 \
                 --shake-packets 60 --send-packets 30"
            ),
        );
        assert_eq!(
            summary["audit"]["ok"], true,
            "{connection}: {}",
            summary["audit"]
        );
        assert_eq!(
            summary["history"]["ok"], true,
            "{connection}: {}",
            summary["history"]
        );
        assert_eq!(summary["options"]["http_connection"], connection);
        let totals = &summary["load"]["totals"];
        assert_eq!(summary["shake"]["won_clients"], 60, "{connection}");
        assert_eq!(summary["send"]["opened_clients"], 90, "{connection}");
        assert!(totals["notice_polls"].as_u64().unwrap() > 0);
        if connection != "keep-alive" {
            // A connection for every request: more connects than users, no logins.
            assert!(totals["connects"].as_u64().unwrap() > totals["shakes_sent"].as_u64().unwrap());
            assert_eq!(totals["disconnects"], 0);
        }
    }
}

/// Options a bench could not finish with are refused before anything starts.
#[test]
fn a_bench_that_could_not_finish_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (args, why) in [
        ("--phase-qps 0", "--phase-qps must be"),
        ("--phase-qps 3000,0", "--phase-qps must be"),
        ("--broadcast-every nan", "--broadcast-every must be"),
        ("--chaos 1 --chaos-faults worker-kill,nope", "not \"nope\""),
        ("--chaos 1 --chaos-faults postgres", "needs --hosts"),
        ("--chaos 1 --chaos-every 0", "--chaos-every must be"),
        ("--chaos-faults worker-kill", "goes with --chaos"),
        ("--hosts 2 --fault supervisor-kill", "no --hosts"),
        (
            "--hosts 2 --chaos 1 --chaos-faults disk-full",
            "one local server only",
        ),
        (
            "--hosts 2 --chaos 1 --chaos-faults upgrade",
            "give it alone, as --upgrade-at",
        ),
        ("--upgrade-from /bin/true", "--upgrade-at"),
    ] {
        let out = dir.path().join("out");
        let output = Command::new(env!("CARGO_BIN_EXE_hongbao"))
            .arg("bench")
            .args(args.split_whitespace())
            .arg("--out")
            .arg(&out)
            .output()
            .expect("running hongbao bench");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args}");
        assert!(stderr.contains(why), "{args}: {stderr}");
        assert!(!out.exists(), "{args} started something");
    }
}

/// series.csv: the documented header, one row per second per role from the role's first
/// second to the end with no gaps, and per-second counts that add up to the summary's.
fn check_series(dir: &std::path::Path, summary: &Value, phases: &[&str]) {
    let series = std::fs::read_to_string(dir.join("series.csv")).unwrap();
    let mut lines = series.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header, hongbao_monitor::collector::COLUMNS);
    let rows: Vec<BTreeMap<&str, &str>> = lines
        .map(|l| header.iter().copied().zip(l.split(',')).collect())
        .collect();
    let mut seconds: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for r in &rows {
        seconds
            .entry(r["role"])
            .or_default()
            .push(r["unix_second"].parse().unwrap());
    }
    assert_eq!(
        seconds.keys().copied().collect::<Vec<_>>(),
        ["core", "host", "load", "server"]
    );
    let last = seconds.values().map(|s| *s.last().unwrap()).max().unwrap();
    for (role, s) in &seconds {
        assert!(s.len() >= 4, "{role}: {s:?}");
        assert!(
            s.windows(2).all(|w| w[1] == w[0] + 1),
            "{role}: gaps in {s:?}"
        );
        assert_eq!(*s.last().unwrap(), last, "{role} stops early");
    }
    let sum = |role: &str, column: &str| -> u64 {
        rows.iter()
            .filter(|r| r["role"] == role)
            .map(|r| r[column].parse::<u64>().unwrap_or(0))
            .sum()
    };
    let totals = &summary["load"]["totals"];
    assert_eq!(sum("load", "shakes"), totals["shakes_sent"]);
    assert_eq!(sum("load", "won"), summary["shake"]["won_clients"]);
    assert_eq!(sum("load", "opened"), summary["send"]["opened_clients"]);
    assert_eq!(
        sum("core", "packets_released"),
        summary["shake"]["released"]
    );
    assert_eq!(sum("core", "packets_won"), summary["shake"]["won_server"]);
    assert_eq!(sum("core", "send_packets"), summary["send"]["packets"]);
    assert_eq!(
        sum("core", "shares_opened"),
        summary["send"]["opened_server"]
    );
    // Every shake the clients sent reached a worker and was counted there.
    assert_eq!(sum("server", "shakes"), totals["shakes_sent"]);
    assert!(sum("host", "net_rx_packets") > sum("load", "shakes"));
    let seen: Vec<&str> = rows.iter().map(|r| r["phase"]).collect();
    for phase in phases {
        assert!(seen.contains(phase), "no rows in phase {phase}");
    }
}

/// report.html names every chart and the audit; each chart's PNG decodes to a real image.
fn check_report(dir: &std::path::Path) {
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("Audit"), "report.html lacks the audit");
    for chart in hongbao_report::CHARTS {
        assert!(
            html.contains(chart.title),
            "report.html lacks {}",
            chart.title
        );
        let file = std::fs::File::open(dir.join(format!("{}.png", chart.name))).unwrap();
        let mut reader = png::Decoder::new(file).read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert!(
            info.width >= 800 && info.height >= 400,
            "{}: {}x{}",
            chart.name,
            info.width,
            info.height
        );
        let first = &pixels[..3];
        assert!(
            pixels.chunks(3).any(|p| p != first),
            "{}.png is one flat colour",
            chart.name
        );
    }
}

/// summary.json's fields are held to docs/bench.md by a unit test of its types
/// (`bench::summary`); the series' columns are held to docs/monitoring.md here.
#[test]
fn docs_describe_every_series_column() {
    let monitoring =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/monitoring.md"))
            .unwrap();
    for column in hongbao_monitor::collector::COLUMNS {
        assert!(
            monitoring.contains(&format!("`{column}`")),
            "docs/monitoring.md does not describe column `{column}`"
        );
    }
}

/// The bench across two gateway hosts of a lab in cluster mode (Redis Cluster,
/// PostgreSQL, nginx in front; root): the same campaigns and the same three-way audit to
/// the cent, over the binary protocol through nginx.
#[test]
fn a_bench_across_lab_hosts_balances_every_cent() {
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(
        out.path(),
        "--hosts 2 --connections 2000 --workers 1 --procs 2 --phase-qps 500 \
         --campaign-rate 200 --shake-packets 60 --send-packets 30",
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    assert_eq!(summary["options"]["hosts"], 2);
    assert_eq!(summary["shake"]["won_clients"], 60);
    assert_eq!(summary["send"]["opened_clients"], 90);
    // The gateways reported through the lab's relay: server rows summed over both, and
    // each host's own, whose shakes add up to the sum and whose interface carried them.
    let series = std::fs::read_to_string(out.path().join("series.csv")).unwrap();
    let header: Vec<&str> = series.lines().next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let total = |role: &str, column: &str| -> u64 {
        series
            .lines()
            .skip(1)
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|cells| cells[at("role")] == role)
            .map(|cells| cells[at(column)].parse::<u64>().unwrap_or(0))
            .sum()
    };
    let (gw1, gw2) = (total("server@gw1", "shakes"), total("server@gw2", "shakes"));
    assert!(gw1 > 0 && gw2 > 0, "shakes per host: {gw1}, {gw2}");
    assert_eq!(gw1 + gw2, total("server", "shakes"));
    assert!(total("server@gw1", "net_rx_packets") > 0);
    // The lab is gone with the bench.
    assert!(!out.path().join("lab/lab.json").exists());
}

/// Whether a fault's `what` says it was healed, by what each kind says once it was.
fn healed(kind: &str, what: &str) -> bool {
    let said = match kind {
        "worker-kill" => "its replacement was up after",
        "worker-stall" => "then SIGCONT",
        "supervisor-kill" => "up again on the same addresses after",
        "upgrade" => "upgraded to ",
        "disk-full" => "the ledger committed again",
        other => panic!("no heal known for {other}"),
    };
    what.contains(said)
}

/// Whether anything is mounted on or under `dir`.
fn mounted_under(dir: &std::path::Path) -> bool {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|m| m.starts_with(&dir))
        })
}

/// `--chaos` on one server with its default faults: workers killed and stalled, the
/// supervisor killed and, as root, the ledger's disk filled, at random moments through
/// both phases while the clients work; every cent still balances, every fault is in the
/// summary with its cost, and each was healed before the next.
#[test]
fn a_chaos_bench_on_one_server_balances_every_cent() {
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(
        out.path(),
        "--connections 2000 --workers 2 --procs 2 --phase-qps 1000,2000 \
         --shake-packets 600 --send-packets 300 --campaign-rate 100 \
         --chaos 11 --chaos-every 2",
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    let chaos = &summary["chaos"];
    assert_eq!(chaos["seed"], 11);
    let mut kinds = vec!["worker-kill", "worker-stall", "supervisor-kill"];
    if common::is_root() {
        kinds.push("disk-full");
    }
    assert_eq!(chaos["kinds"], serde_json::json!(kinds));
    let faults = chaos["faults"].as_array().expect("faults");
    assert!(faults.len() >= 2, "{chaos}");
    for kind in ["worker-kill", "worker-stall"] {
        assert!(
            faults.iter().any(|f| f["kind"] == kind),
            "no {kind}: {chaos}"
        );
    }
    for f in faults {
        assert!(
            f["start_second"].as_u64() <= f["end_second"].as_u64(),
            "{f}"
        );
        let (kind, what) = (f["kind"].as_str().unwrap(), f["what"].as_str().unwrap());
        assert!(healed(kind, what), "not healed: {f}");
    }
    assert!(!mounted_under(out.path()), "a tmpfs left mounted");
    // Each fault is marked on the series as it happened (a phase `chaos:KIND`), so the
    // report shades it on the charts, and listed in report.html.
    let series = std::fs::read_to_string(out.path().join("series.csv")).unwrap();
    let report = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    for kind in ["worker-kill", "worker-stall"] {
        assert!(
            series.contains(&format!(",chaos:{kind},")),
            "{kind} not on the series"
        );
    }
    assert!(report.contains(&format!("Chaos: {} faults (seed 11)", faults.len())));
    // Every share opened: a killed worker's users log in again and hear of it then
    // (an open whose reply died with its worker is the ledger's, not the client's).
    assert_eq!(
        summary["send"]["opened_server"], summary["send"]["shares"],
        "{}",
        summary["send"]
    );
}

/// `supervisor-kill` by chaos, over and over: the supervisor (the core and its ledger
/// writer with it) SIGKILLed, its workers gone with their links, the server started again
/// on the same addresses over the same ledger, the clients back; nothing acknowledged is
/// lost, and every share is opened in the end (recipients are told again at login).
#[test]
fn a_killed_supervisor_is_started_again_over_its_ledger_and_every_cent_balances() {
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(
        out.path(),
        "--connections 1000 --workers 2 --procs 1 --phase-qps 500 \
         --shake-packets 300 --send-packets 100 --campaign-rate 100 \
         --chaos 21 --chaos-every 1 --chaos-faults supervisor-kill",
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    let history = &summary["history"];
    assert_eq!(history["ok"], true, "{history}");
    assert_eq!(history["missing"]["count"], 0, "{history}");
    let chaos = &summary["chaos"];
    assert_eq!(chaos["kinds"], serde_json::json!(["supervisor-kill"]));
    let faults = chaos["faults"].as_array().expect("faults");
    assert!(!faults.is_empty(), "{chaos}");
    for f in faults {
        assert_eq!(f["kind"], "supervisor-kill", "{f}");
        assert!(
            healed("supervisor-kill", f["what"].as_str().unwrap()),
            "not healed: {f}"
        );
        // Every connection went with the workers — as the series saw it: a kill in the
        // run's last seconds ends before its drop and return are counted.
        if !f["whole_after_secs"].is_null() {
            assert!(f["dropped"].as_u64().unwrap() >= 1000, "{f}");
        }
    }
    assert!(
        faults.iter().any(|f| f["dropped"].as_u64() >= Some(1000)),
        "{chaos}"
    );
    assert_eq!(
        summary["send"]["opened_server"], summary["send"]["shares"],
        "{}",
        summary["send"]
    );
    assert_eq!(summary["shake"]["won_server"], 300, "{}", summary["shake"]);
}

/// `--fault core-kill`: the core lives in the supervisor's process, so its kill is the
/// supervisor's, healed the same way; the clients all log in again.
#[test]
fn core_kill_is_the_supervisors_kill_and_healed_as_it() {
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(
        out.path(),
        "--connections 1000 --workers 2 --procs 1 --phase-qps 500 \
         --shake-packets 200 --send-packets 60 --campaign-rate 100 \
         --fault core-kill --fault-at 1",
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    assert_eq!(summary["options"]["fault"], "supervisor-kill");
    let fault = &summary["fault"];
    assert!(
        healed("supervisor-kill", fault["what"].as_str().unwrap()),
        "{fault}"
    );
    // Every connection went with the workers (some twice: a client reconnecting while
    // the server was coming up was dropped again). That they all log in again is the
    // chaos test's (every share opened in the end): within this short phase the load's
    // reconnect back-off, on a busy machine, is not always over.
    assert!(fault["dropped"].as_u64().unwrap() >= 1000, "{fault}");
}

/// `--upgrade-at`: the local server upgraded in place mid-phase (`serve --upgrade`, the
/// same binary): no connection attempt refused, every user drained to the new process
/// and logged in again, the ledger passed over with nothing acknowledged lost (the
/// history exact), and the summary says what the upgrade did.
#[test]
fn an_upgrade_mid_run_refuses_no_one_and_loses_nothing() {
    let out = tempfile::tempdir().unwrap();
    // Started on a copy (`--upgrade-from`), upgraded to this binary.
    let from = out.path().join("hongbao-before");
    std::fs::copy(env!("CARGO_BIN_EXE_hongbao"), &from).unwrap();
    let summary = run_bench(
        out.path(),
        &format!(
            "--connections 1000 --workers 2 --procs 1 --phase-qps 500 \
             --shake-packets 300 --send-packets 60 --campaign-rate 100 --upgrade-at 1 \
             --upgrade-from {}",
            from.display()
        ),
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    let history = &summary["history"];
    assert_eq!(history["ok"], true, "{history}");
    assert_eq!(history["missing"]["count"], 0, "{history}");
    assert_eq!(summary["options"]["fault"], "upgrade");
    let fault = &summary["fault"];
    let this = std::fs::canonicalize(env!("CARGO_BIN_EXE_hongbao")).unwrap();
    assert!(
        fault["what"]
            .as_str()
            .unwrap()
            .starts_with(&format!("upgraded to {} ", this.display())),
        "{fault}"
    );
    assert_eq!(fault["refused_connects"], 0, "{fault}");
    assert!(fault["reconnected_secs"].as_u64().is_some(), "{fault}");
    let upgrade = &fault["upgrade"];
    assert_eq!(upgrade["drained_connections"], 1000, "{upgrade}");
    assert!(
        upgrade["commits_paused_ms"].as_f64().unwrap() > 0.0,
        "{upgrade}"
    );
    assert!(
        upgrade["replayed_events"].as_u64().unwrap() > 0,
        "{upgrade}"
    );
    assert_eq!(summary["shake"]["won_server"], 300, "{}", summary["shake"]);
    assert_eq!(summary["send"]["opened_server"], summary["send"]["shares"]);
}

/// `--upgrade-at` with `--hosts`: a rolling upgrade of the lab's gateways under load
/// through nginx, to the binary of `--upgrade-to` — each in turn drained by SIGTERM
/// (its clients back at the others) and started again on the new binary: no connection
/// attempt refused, each gateway out within its drain window and up again, every user
/// back, and every cent where it belongs (cluster mode; root).
#[test]
fn a_rolling_upgrade_of_the_lab_refuses_no_one_and_loses_nothing() {
    let out = tempfile::tempdir().unwrap();
    let next = out.path().join("hongbao-next");
    std::fs::copy(env!("CARGO_BIN_EXE_hongbao"), &next).unwrap();
    let summary = run_bench(
        out.path(),
        &format!(
            "--hosts 2 --connections 2000 --workers 1 --procs 2 --phase-qps 500 \
             --campaign-rate 200 --shake-packets 2000 --send-packets 60 \
             --upgrade-at 1 --upgrade-to {}",
            next.display()
        ),
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    assert_eq!(summary["history"]["missing"]["count"], 0);
    let fault = &summary["fault"];
    let what = fault["what"].as_str().unwrap();
    assert!(
        what.starts_with(&format!(
            "rolling upgrade: 2 gateways upgraded to {} one at a time",
            next.display()
        )),
        "{fault}"
    );
    assert_eq!(fault["refused_connects"], 0, "{fault}");
    assert_eq!(fault["error_replies"], 0, "{fault}");
    assert!(fault["reconnected_secs"].as_u64().is_some(), "{fault}");
    let rolled = fault["rolled"].as_array().unwrap();
    let hosts: Vec<&str> = rolled.iter().map(|s| s["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["gw1", "gw2"], "{fault}");
    for step in rolled {
        assert_eq!(step["drained_in_window"], true, "{step}");
        assert!(step["connections"].as_u64().unwrap() > 0, "{step}");
        assert!(step["start_ms"].as_u64().is_some(), "{step}");
    }
    // The first gateway's clients went to the second, which let them go in its turn:
    // every user but those still on their way back when the second was asked.
    let moved: u64 = rolled
        .iter()
        .map(|s| s["connections"].as_u64().unwrap())
        .sum();
    assert!(moved >= 1800, "{fault}");
    assert_eq!(summary["shake"]["won_server"], 2000, "{}", summary["shake"]);
    assert_eq!(summary["send"]["opened_server"], summary["send"]["shares"]);
}

/// `disk-full` by chaos (root): the ledger on a tmpfs of its own, filled until ENOSPC and
/// held full for 5 s at a time while the clients work, then given its room back; nothing
/// acknowledged is lost, the tmpfs is gone at the end and the ledger kept where it always
/// is — and a bench that fails after mounting it unmounts it too.
#[test]
fn a_full_ledger_disk_is_given_room_again_and_every_cent_balances() {
    if !common::is_root() {
        eprintln!("skipped: disk-full mounts a tmpfs, which needs root");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(
        out.path(),
        "--connections 1000 --workers 2 --procs 1 --phase-qps 500 \
         --shake-packets 600 --send-packets 100 --campaign-rate 100 \
         --chaos 5 --chaos-every 1 --chaos-faults disk-full",
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    let history = &summary["history"];
    assert_eq!(history["ok"], true, "{history}");
    assert_eq!(history["missing"]["count"], 0, "{history}");
    let faults = summary["chaos"]["faults"].as_array().expect("faults");
    assert!(!faults.is_empty(), "{}", summary["chaos"]);
    for f in faults {
        assert_eq!(f["kind"], "disk-full", "{f}");
        assert!(
            healed("disk-full", f["what"].as_str().unwrap()),
            "not healed: {f}"
        );
    }
    assert_eq!(summary["shake"]["won_server"], 600, "{}", summary["shake"]);
    assert!(!mounted_under(out.path()), "the tmpfs is still mounted");
    assert!(
        out.path().join("data/ledger.sqlite").exists(),
        "the ledger was not kept"
    );

    // The server cannot start: the bench fails, and takes its tmpfs down with it.
    let failed = out.path().join("failed");
    let output = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args(["bench", "--connections", "10", "--workers", "nope"])
        .args(["--fault", "disk-full", "--out"])
        .arg(&failed)
        .output()
        .expect("running hongbao bench");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("tmpfs of its own"),
        "no tmpfs was mounted"
    );
    assert!(!mounted_under(&failed), "the tmpfs outlived a failed bench");
}

#[test]
fn ledger_bench_times_every_win_and_refuses_bad_input_without_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ledger");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hongbao"))
            .arg("ledger-bench")
            .args(args)
            .output()
            .expect("running hongbao ledger-bench")
    };
    let out = run(&[
        "--rate",
        "100",
        "--secs",
        "1",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fields: BTreeMap<&str, f64> = stdout
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .chunks(2)
        .map(|kv| (kv[0], kv[1].parse().unwrap()))
        .collect();
    assert_eq!(fields["wins"], 100.0, "{stdout}");
    assert_eq!(fields["interval_ms"], 20.0, "serve's default: {stdout}");
    assert!(
        fields["commits"] >= 1.0 && fields["commits"] <= 100.0,
        "{stdout}"
    );
    assert!(fields["p50_ms"] <= fields["p99_ms"], "{stdout}");
    assert!(fields["cpu_us_per_win"] > 0.0, "{stdout}");
    assert!(!dir.exists(), "its ledger is removed");

    // A directory that exists is refused, and left as it was.
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("keep"), "mine").unwrap();
    let out = run(&["--secs", "1", "--dir", dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
    assert_eq!(std::fs::read_to_string(dir.join("keep")).unwrap(), "mine");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let out = run(&["--rate", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rate"));
}

/// The bench over TLS on every transport (issue 51): a throwaway CA and certificate made
/// for the run, the server's listeners and admin address speaking TLS, the clients
/// trusting that CA; every connection a full handshake, counted on both sides, and the
/// audit to the cent. The binary frames' run connects in a storm (everyone at once).
#[test]
fn small_tls_benches_on_every_transport_balance_every_cent() {
    for (transport, extra) in [
        ("tcp", "--connect-mode storm"),
        ("ws", ""),
        ("http", "--http-connection keep-alive"),
    ] {
        let out = tempfile::tempdir().unwrap();
        let users = 1500;
        let summary = run_bench(
            out.path(),
            &format!(
                "--tls --transport {transport} {extra} --connections {users} --workers 2 \
                 --procs 2 --phase-qps 1000 --campaign-rate 200 --shake-packets 60 \
                 --send-packets 30"
            ),
        );
        assert_eq!(
            summary["audit"]["ok"], true,
            "{transport}: {}",
            summary["audit"]
        );
        assert_eq!(
            summary["history"]["ok"], true,
            "{transport}: {}",
            summary["history"]
        );
        assert_eq!(summary["shake"]["won_clients"], 60, "{transport}");
        let tls = &summary["tls"];
        assert!(
            tls["handshakes_full"].as_u64().unwrap() + tls["handshakes_resumed"].as_u64().unwrap()
                >= users,
            "{transport}: every connection a handshake: {tls}"
        );
        assert_eq!(tls["refused"], 0, "{transport}: {tls}");
        assert!(out.path().join("tls/ca.pem").exists());
        // The admin address spoke TLS too: a plain request to it gets no answer.
    }
}
