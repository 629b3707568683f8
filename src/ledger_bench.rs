//! `hongbao ledger-bench`: what a win's commit costs on this disk, alone
//! (`hongbao_bench::commit_bench`); one result line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use hongbao_bench::commit_bench::{self, Settings};
use hongbao_embedded::ledger::GroupCommit;
use hongbao_server::ServeConfig;

#[derive(Args)]
pub struct LedgerBenchArgs {
    /// Wins a second
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Seconds
    #[arg(long, default_value_t = 20)]
    secs: u64,
    /// The least time between two commits' starts, as `serve`'s `commit_interval_ms`
    /// [default: serve's]
    #[arg(long)]
    commit_interval_ms: Option<u64>,
    /// Where the ledger is created (a new directory, removed afterwards); put it on the
    /// disk the server's `--data-dir` is on [default: a new directory in /tmp]
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn run(args: LedgerBenchArgs) -> Result<()> {
    if args.rate == 0 || args.secs == 0 {
        bail!("--rate and --secs must be at least 1");
    }
    let dir = args.dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("hongbao-ledger-bench-{}", std::process::id()))
    });
    if dir.exists() {
        bail!("{} exists: give a directory that does not", dir.display());
    }
    let serve = ServeConfig::default();
    let ms = args
        .commit_interval_ms
        .unwrap_or(serve.ledger.commit_interval_ms);
    let group = GroupCommit {
        commit_interval: Duration::from_millis(ms),
        max_batch: serve.ledger.commit_max_batch,
    };
    let settings = Settings {
        rate: args.rate,
        duration: Duration::from_secs(args.secs),
        group,
    };
    // The run is silent until its one line: say what it is doing meanwhile (on stderr, so
    // that stdout stays that one line for scripts).
    eprintln!(
        "ledger-bench: committing {} wins, {} a second for {} s, through serve's ledger \
         writer (a commit at most every {ms} ms) in {}; the result line follows",
        u64::from(args.rate) * args.secs,
        args.rate,
        args.secs,
        dir.display()
    );
    let outcome = commit_bench::run(&dir, settings);
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", outcome?.line(&settings));
    Ok(())
}
