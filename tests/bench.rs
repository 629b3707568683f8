//! `hongbao bench` at the scale CI can afford, end to end: a real server (3 worker
//! processes), a real load (3 client processes) holding 30,000 connections, both
//! campaigns in two phases, and the money audit — the smoke test of the multi-process path.

use std::process::Command;

use serde_json::Value;

/// Every field docs/bench.md promises in summary.json (dotted paths; `phases[]` fields
/// are checked on each phase).
const SUMMARY_FIELDS: &[&str] = &[
    "connections.target",
    "connections.peak",
    "connections.connect_seconds",
    "shake.packets",
    "shake.won_server",
    "shake.won_clients",
    "shake.amount_minted",
    "shake.amount_won_server",
    "shake.amount_won_clients",
    "send.packets",
    "send.shares",
    "send.opened_server",
    "send.opened_clients",
    "send.amount_sent",
    "send.amount_opened_server",
    "send.amount_opened_clients",
    "audit.ok",
    "audit.discrepancies",
    "resources.server_rss_bytes",
    "resources.server_rss_per_connection_bytes",
    "resources.server_cpu_seconds",
    "resources.load_rss_bytes",
    "resources.load_rss_per_connection_bytes",
    "resources.load_cpu_seconds",
];

const PHASE_FIELDS: &[&str] = &[
    "name",
    "target_qps",
    "seconds",
    "client_qps_median",
    "server_qps_median",
    "latency_ms.p50",
    "latency_ms.p99",
    "latency_ms.p999",
    "latency_ms.max",
    "overloaded",
    "errors",
];

fn field<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| &v[k])
}

#[test]
fn small_bench_balances_every_cent_and_matches_the_campaigns() {
    let out = tempfile::tempdir().unwrap();
    let (shake_packets, send_packets, recipients) = (150u64, 60u64, 3u64);
    let status = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args([
            "bench",
            "--connections",
            "30000",
            "--workers",
            "3",
            "--procs",
            "3",
        ])
        .args(["--phase-qps", "1500,3000", "--campaign-rate", "200"])
        .args([
            "--shake-packets",
            &shake_packets.to_string(),
            "--send-packets",
            &send_packets.to_string(),
        ])
        .arg("--out")
        .arg(out.path())
        .status()
        .expect("running hongbao bench");
    assert!(status.success(), "bench exited with {status}");

    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap())
            .unwrap();
    for path in SUMMARY_FIELDS {
        assert!(
            !field(&summary, path).is_null(),
            "summary.json lacks {path}"
        );
    }
    let phases = summary["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 2);
    for phase in phases {
        for path in PHASE_FIELDS {
            assert!(!field(phase, path).is_null(), "phase lacks {path}");
        }
        assert_eq!(phase["audit_ok"], true, "phase audit: {phase}");
    }

    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(
        summary["audit"]["discrepancies"].as_array().unwrap().len(),
        0
    );
    assert_eq!(summary["connections"]["peak"], 30000);

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

    // The series has a header naming the documented columns and one row per second.
    let series = std::fs::read_to_string(out.path().join("series.csv")).unwrap();
    let mut lines = series.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header, hongbao_load::bench::SERIES_COLUMNS);
    let seconds: Vec<u64> = lines
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert!(seconds.len() >= 4);
    assert!(
        seconds.windows(2).all(|w| w[1] == w[0] + 1),
        "gaps in {seconds:?}"
    );
}

#[test]
fn docs_describe_every_summary_field_and_series_column() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/bench.md")).unwrap();
    for path in SUMMARY_FIELDS.iter().chain(PHASE_FIELDS) {
        let leaf = path.rsplit('.').next().unwrap();
        assert!(
            doc.contains(&format!("`{leaf}`")),
            "docs/bench.md does not describe `{leaf}` ({path})"
        );
    }
    for column in hongbao_load::bench::SERIES_COLUMNS {
        assert!(
            doc.contains(&format!("`{column}`")),
            "docs/bench.md does not describe column `{column}`"
        );
    }
}
