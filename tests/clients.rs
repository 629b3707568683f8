//! The client libraries' own suites — `clients/typescript` (node's test runner: golden
//! vectors, live-server flows, headless Chromium) and `clients/python` (unittest: golden
//! vectors, live-server flows) — run against this checkout's `hongbao` binary, so that
//! `cargo test` runs every test of the project. Each suite starts and stops its own
//! servers. They need Node (with npm) and Python 3; `.ci/run` installs them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// One suite at a time: each loads the machine with servers of its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn client_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clients")
        .join(name)
}

/// Runs `program args` in `dir` with the checkout's binary named in `HONGBAO_BIN`; it
/// must succeed (its output is shown when it does not).
fn run(dir: &Path, program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("HONGBAO_BIN", env!("CARGO_BIN_EXE_hongbao"))
        .output()
        .unwrap_or_else(|e| panic!("running {program} (is it installed?): {e}"));
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    print!("{said}");
    let tail: Vec<&str> = said.lines().rev().take(60).collect();
    assert!(
        output.status.success(),
        "{program} {} in {} failed ({}):\n{}",
        args.join(" "),
        dir.display(),
        output.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_typescript_client_passes_its_suite() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = client_dir("typescript");
    run(&dir, "npm", &["ci", "--no-audit", "--no-fund"]);
    run(&dir, "npm", &["test"]);
}

#[test]
fn the_python_client_passes_its_suite() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = client_dir("python");
    run(
        &dir,
        "python3",
        &["-m", "unittest", "discover", "-s", "tests", "-v"],
    );
}
