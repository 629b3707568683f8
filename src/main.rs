//! The `hongbao` binary: parses arguments and hands them to the library that does the work.
//!
//! Each subcommand's flags, and the few lines that turn them into the library's options,
//! live in a file named for it; this file only names the subcommands and dispatches.
//!
//! - `serve`: `serve` and the hidden `worker` it starts
//! - `load`: `load` (and `--procs`, shared with `bench`)
//! - `bench`: `bench`
//! - `capacity`: `capacity`
//! - `monitor`: `monitor`
//! - `report`: `report`
//! - `nginx`: `nginx-conf`
//! - `lab`: `lab up` and `lab down`
//! - `doctor`: `doctor`
//! - `admin_key`: `admin-key add|list|remove`

mod admin_key;
mod bench;
mod capacity;
mod doctor;
mod lab;
mod ledger_bench;
mod ledger_cmd;
mod load;
mod monitor;
mod nginx;
mod report;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};

use admin_key::AdminKeyCommand;
use bench::BenchArgs;
use capacity::CapacityArgs;
use doctor::DoctorArgs;
use lab::LabCommand;
use ledger_bench::LedgerBenchArgs;
use ledger_cmd::{BackupArgs, LedgerCommand, RestoreArgs};
use load::{LoadAgentArgs, LoadArgs};
use monitor::MonitorArgs;
use nginx::NginxArgs;
use report::ReportArgs;
use serve::{ServeArgs, WorkerArgs};

#[derive(Parser)]
#[command(
    name = "hongbao",
    version,
    about = "Red packets for festival-night peaks, and the load lab that proves it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines on stderr: human, or json (one object a line); HONGBAO_LOG sets the
    /// levels (info by default). Processes started by this one inherit both.
    #[arg(long, global = true, env = hongbao_telemetry::log::FORMAT_ENV, default_value = "human")]
    log_format: hongbao_telemetry::log::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: supervisor + core + ledger + admin API, and gateway worker processes.
    /// A flag given twice takes its last value (a command line rendered by the bench or
    /// the scripts, with a setting of its own after it).
    #[command(args_override_self = true)]
    Serve(ServeArgs),
    /// One gateway worker process (started by `serve`, not by hand).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Simulate many users against a server at an exact, coordinated shake QPS.
    Load(LoadArgs),
    /// One load client process (started by `load`, not by hand): its options as JSON on
    /// the first line of stdin, the coordinator's commands after.
    #[command(hide = true)]
    LoadClient,
    /// A load client on this machine for a coordinator elsewhere (`bench --agents N`): it
    /// joins over TLS with the run's key and runs its slice (docs/agents.md).
    LoadAgent(LoadAgentArgs),
    /// Start a server and a load, run the seed experiment's phases, audit every cent.
    Bench(BenchArgs),
    /// The layered capacity test: each stage of PLAN.toml loaded in rising steps up to its
    /// knee; summary.json, report.html and charts (docs/capacity.md).
    Capacity(CapacityArgs),
    /// Collect per-second reports from serve and load instances; dashboard, series, /metrics.
    Monitor(MonitorArgs),
    /// Write DIR/report.html and a PNG of every chart from DIR/series.csv (and summary.json),
    /// or, for a capacity run's directory, its report and charts from its summary.json.
    Report(ReportArgs),
    /// Write an nginx configuration that puts nginx in front of gateways (HTTP with
    /// upstream keep-alive, WebSocket, the binary protocol through the stream module).
    NginxConf(NginxArgs),
    /// The lab: test hosts in network namespaces with a Redis Cluster, PostgreSQL, gateways
    /// in cluster mode and nginx (root; docs/scale-out.md).
    #[command(subcommand)]
    Lab(LabCommand),
    /// Check this machine's limits for N connections (server and load co-located).
    Doctor(DoctorArgs),
    /// Admin keys: make one (printed once), list them, remove one (docs/security.md).
    #[command(subcommand)]
    AdminKey(AdminKeyCommand),
    /// What a win's commit costs on this disk: wins at an even rate through the server's
    /// own group-committing ledger writer; latency percentiles and CPU per win.
    LedgerBench(LedgerBenchArgs),
    /// Copy the embedded ledger while it serves (a consistent snapshot) into a new
    /// directory, and check the copy (docs/ledger.md)
    Backup(BackupArgs),
    /// Put a checked backup into a data directory (no server running on it)
    Restore(RestoreArgs),
    /// The embedded ledger: `verify` checks one without a server
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Make a throwaway CA and a certificate it signed (ECDSA P-256), for trying TLS out
    /// and for tests: OUT/ca.pem, OUT/cert.pem, OUT/key.pem. Real deployments bring their own.
    DevCert(DevCertArgs),
}

#[derive(clap::Args)]
struct DevCertArgs {
    /// The directory to write them into
    #[arg(long, default_value = "hongbao-tls")]
    out: std::path::PathBuf,
    /// Names the certificate is for (IP addresses or DNS names)
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1,localhost")]
    names: Vec<String>,
}

fn dev_cert(args: DevCertArgs) -> Result<()> {
    let names: Vec<&str> = args.names.iter().map(String::as_str).collect();
    let certs = hongbao_http::tls::DevCerts::make(&names)?;
    let files = certs.write(&args.out)?;
    println!(
        "hongbao dev-cert: CA {} certificate {} key {} for {}",
        args.out.join("ca.pem").display(),
        files.cert.display(),
        files.key.display(),
        args.names.join(",")
    );
    Ok(())
}

/// Exit codes a script can trust: 0 done; 1 failed (the error says why: a bench whose
/// audit failed, a ledger with problems, a server that could not start); 2 a usage error
/// (clap's); 3 a load that reached no one, or most of whose users never logged in.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One message, its causes after colons: never a backtrace (RUST_BACKTRACE is
            // for panics, not for what the command tells its user).
            eprintln!("hongbao: {}", one_line(&e));
            let code = match e.downcast_ref::<hongbao_load::Error>() {
                Some(hongbao_load::Error::Unreached(_)) => {
                    hongbao_load::error::Unreached::EXIT_CODE
                }
                _ => 1,
            };
            std::process::ExitCode::from(code)
        }
    }
}

/// An error and its causes in one line, `what: why: why`, a cause left out where the
/// message before it already says it (errors that print their source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    hongbao_telemetry::log::init(cli.log_format);
    // Every TLS of ours is rustls on aws-lc-rs, the libraries' too (Redis's).
    hongbao_http::tls::install_provider();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Worker(args) => serve::run_worker(args),
        Command::Load(args) => load::run(args),
        Command::LoadClient => {
            let mut options = String::new();
            std::io::stdin().read_line(&mut options)?;
            Ok(hongbao_load::client::run(serde_json::from_str(&options)?)?)
        }
        Command::LoadAgent(args) => load::run_agent(args),
        Command::Bench(args) => bench::run(args),
        Command::Capacity(args) => capacity::run(args),
        Command::Monitor(args) => monitor::run(args),
        Command::Report(args) => report::run(args),
        Command::NginxConf(args) => nginx::run(args),
        Command::DevCert(args) => dev_cert(args),
        Command::Lab(command) => lab::run(command),
        Command::Doctor(args) => doctor::run(args),
        Command::AdminKey(command) => admin_key::run(command),
        Command::LedgerBench(args) => ledger_bench::run(args),
        Command::Backup(args) => ledger_cmd::backup(args),
        Command::Restore(args) => ledger_cmd::restore(args),
        Command::Ledger(command) => ledger_cmd::run(command),
    }
}
