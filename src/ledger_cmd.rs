//! `hongbao backup`, `hongbao restore` and `hongbao ledger verify`: the embedded ledger
//! copied while it serves, put back, and checked without a server (docs/ledger.md).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use hongbao_embedded::ledger::verify::{self, Verified};
use hongbao_embedded::ledger::Head;

/// The data directory `serve` uses unless told.
const DATA_DIR: &str = "hongbao-data";

#[derive(Args)]
pub struct BackupArgs {
    /// A new directory for the copy (its ledger.sqlite)
    out: PathBuf,
    /// The server's data directory (it may be serving)
    #[arg(long, default_value = DATA_DIR)]
    data_dir: PathBuf,
    /// Run at normal priority (by default the backup is background work: nice 19 and the
    /// idle I/O class, so a server beside it keeps the machine)
    #[arg(long)]
    foreground: bool,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// The backup: its directory, or its ledger.sqlite
    backup: PathBuf,
    /// The data directory to put it in (no server running on it)
    #[arg(long, default_value = DATA_DIR)]
    data_dir: PathBuf,
    /// Replace a ledger that is there (it is moved aside, not deleted)
    #[arg(long)]
    force: bool,
}

#[derive(Subcommand)]
pub enum LedgerCommand {
    /// Check a ledger without a server (a data directory, a backup, or the file): its
    /// hash chain, its money replayed, its balances table; exits 1 on any problem
    Verify(VerifyArgs),
}

#[derive(Args)]
pub struct VerifyArgs {
    /// The data directory, backup directory or ledger.sqlite
    path: PathBuf,
    /// A head kept from earlier (SEQ:HEX, as /v1/audit's ledger_head): the ledger must
    /// still hold that event with that hash
    #[arg(long)]
    head: Option<String>,
    /// Print the result as JSON
    #[arg(long)]
    json: bool,
}

pub fn backup(args: BackupArgs) -> Result<()> {
    if !args.foreground {
        hongbao_sys::priority::background()?;
    }
    let done = verify::backup(&args.data_dir, &args.out)?;
    let v = &done.verified;
    println!(
        "hongbao backup: {} → {} in {} ms ({} bytes); verified in {} ms: {} events, head {}{}",
        done.from.display(),
        v.file.display(),
        done.millis,
        v.bytes,
        v.millis,
        v.events,
        v.head,
        if v.ok() { "" } else { "; PROBLEMS:" }
    );
    std::fs::write(
        args.out.join("backup.json"),
        serde_json::to_string_pretty(&done)?,
    )?;
    finish(v)
}

pub fn restore(args: RestoreArgs) -> Result<()> {
    let done = verify::restore(&args.backup, &args.data_dir, args.force)?;
    println!(
        "hongbao restore: {} → {} ({} events, head {}){}",
        done.verified.file.display(),
        done.to.display(),
        done.verified.events,
        done.verified.head,
        done.replaced
            .map(|p| format!("; the ledger that was there is now {}", p.display()))
            .unwrap_or_default()
    );
    Ok(())
}

pub fn run(command: LedgerCommand) -> Result<()> {
    match command {
        LedgerCommand::Verify(args) => {
            let head = match &args.head {
                Some(text) => match Head::parse(text) {
                    Some(head) => Some(head),
                    None => bail!("--head {text:?} is not SEQ:HEX (64 hex digits)"),
                },
                None => None,
            };
            let v = verify::verify(&args.path, head)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "hongbao ledger verify: {}: {}, head {}, {} bytes, {} ms: {}",
                    v.file.display(),
                    events_checked(&v),
                    v.head,
                    v.bytes,
                    v.millis,
                    if v.ok() { "ok" } else { "PROBLEMS" }
                );
            }
            finish(&v)
        }
    }
}

/// "N events", or "N events, M checked before the first problem".
fn events_checked(v: &Verified) -> String {
    if v.checked == v.events {
        format!("{} events", v.events)
    } else {
        format!(
            "{} events, {} checked before the first problem",
            v.events, v.checked
        )
    }
}

/// Each problem a line; a failure when there is one.
fn finish(v: &Verified) -> Result<()> {
    for p in &v.problems {
        println!("  {p}");
    }
    match v.problems.len() {
        0 => Ok(()),
        1 => bail!("{}: 1 problem", v.file.display()),
        n => bail!("{}: {n} problems", v.file.display()),
    }
}
