//! The `hongbao` binary: parses arguments and hands them to the library that does the work.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use hongbao_server::ServeConfig;

#[derive(Parser)]
#[command(
    name = "hongbao",
    version,
    about = "Red packets for festival-night peaks, and the load lab that proves it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: supervisor + core + ledger + admin API, and gateway worker processes.
    Serve(ServeArgs),
    /// One gateway worker process (started by `serve`, not by hand).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// Flags win over the config file, which wins over the defaults.
#[derive(Args)]
struct ServeArgs {
    /// Client address (TCP, binary frames) [default: 127.0.0.1:7000]
    #[arg(long)]
    listen: Option<String>,
    /// Admin HTTP address [default: 127.0.0.1:7001]
    #[arg(long)]
    admin: Option<String>,
    /// Directory of the ledger [default: hongbao-data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Gateway worker processes: N or auto [default: auto]
    #[arg(long)]
    workers: Option<String>,
    /// Connections to size `--workers auto` for [default: 20000]
    #[arg(long)]
    connections: Option<u64>,
    /// Shakes per second the server admits before answering "overloaded"
    #[arg(long)]
    max_shake_qps: Option<u32>,
    /// Time-to-live of sent packets, seconds
    #[arg(long)]
    packet_ttl_secs: Option<u64>,
    /// Secret for login tokens (HMAC-SHA256(secret, user id))
    #[arg(long, env = "HONGBAO_SECRET")]
    secret: Option<String>,
    /// TOML file giving any of the options above (and the rest: see docs/admin-api.md)
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct WorkerArgs {
    #[arg(long)]
    link: String,
    #[arg(long)]
    index: u16,
    #[arg(long)]
    listen: std::net::SocketAddr,
}

fn serve_config(args: ServeArgs) -> Result<ServeConfig> {
    let mut cfg = ServeConfig::load(args.config.as_deref())?;
    if let Some(v) = args.listen {
        cfg.listen = v;
    }
    if let Some(v) = args.admin {
        cfg.admin = v;
    }
    if let Some(v) = args.data_dir {
        cfg.data_dir = v;
    }
    if let Some(v) = args.workers {
        cfg.workers = v;
    }
    if let Some(v) = args.connections {
        cfg.connections = v;
    }
    if let Some(v) = args.max_shake_qps {
        cfg.max_shake_qps = v;
    }
    if let Some(v) = args.packet_ttl_secs {
        cfg.packet_ttl_secs = v;
    }
    if let Some(v) = args.secret {
        cfg.secret = v;
    }
    Ok(cfg)
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => hongbao_server::supervisor::run(serve_config(args)?),
        Command::Worker(args) => {
            hongbao_server::worker::run(hongbao_server::worker::WorkerOptions {
                index: args.index,
                link: args.link,
                listen: args.listen,
            })
        }
    }
}
