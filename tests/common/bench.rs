//! `hongbao bench` run to its end from a test, its summary read and checked against the
//! typed summary's schema.

use std::process::{Command, Output};

use serde_json::Value;

/// Runs `hongbao bench ARGS --out OUT` (ARGS split at whitespace), which must succeed,
/// and returns its summary.json.
pub fn run_bench(out: &std::path::Path, args: &str) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .arg("bench")
        .args(args.split_whitespace())
        .arg("--out")
        .arg(out)
        .output()
        .expect("running hongbao bench");
    bench_summary(out, args, output)
}

/// A finished bench's summary.json, which it must have written and succeeded with; its
/// output printed (and, on a failure, its tail and the audit last, where a CI log shows
/// them).
pub fn bench_summary(out: &std::path::Path, args: &str, output: Output) -> Value {
    let said = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let (stdout, stderr) = (said(&output.stdout), said(&output.stderr));
    print!("{stdout}");
    eprint!("{stderr}");
    if !output.status.success() {
        // Repeated last, where a CI log's tail shows it, why the bench failed.
        let tail = |text: &str| {
            text.lines()
                .rev()
                .take(25)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        };
        let audit = std::fs::read_to_string(out.join("summary.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .map_or(Value::Null, |s| s["audit"].clone());
        // Printed, not a panic message: a backtrace would bury it.
        println!(
            "bench {args} exited with {}\n--- stdout (tail)\n{}\n--- stderr (tail)\n{}\n--- audit\n{audit}",
            output.status,
            tail(&stdout),
            tail(&stderr)
        );
        std::panic::resume_unwind(Box::new("bench failed"));
    }
    let text = std::fs::read_to_string(out.join("summary.json")).unwrap();
    // The schema: every field of the typed summary, and no other.
    let typed: hongbao_bench::bench::Summary =
        serde_json::from_str(&text).expect("summary.json has exactly the documented fields");
    assert_eq!(typed.phases.len(), typed.options.phase_qps.len());
    serde_json::from_str(&text).unwrap()
}

/// After a bench of faults on a lab (`--chaos`): every shake packet won and every share
/// opened by the server all the same, and the lab taken down.
pub fn assert_faults_cost_nothing(summary: &Value, out: &std::path::Path) {
    assert_eq!(
        summary["shake"]["won_server"], summary["shake"]["packets"],
        "{}",
        summary["shake"]
    );
    assert_eq!(
        summary["send"]["opened_server"], summary["send"]["shares"],
        "{}",
        summary["send"]
    );
    assert!(!out.join("lab/lab.json").exists(), "the lab is gone");
}
