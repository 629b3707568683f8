//! `hongbao serve` and its hidden `worker`: the flags, laid over the config file into a
//! `ServeConfig`, and the worker process's own arguments.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use hongbao_server::ServeConfig;
use hongbao_sys::Stop;

/// Flags win over the config file, which wins over the defaults.
#[derive(Args)]
pub struct ServeArgs {
    /// Client address (TCP, binary frames) [default: 127.0.0.1:7000]
    #[arg(long)]
    listen: Option<String>,
    /// Admin HTTP address [default: 127.0.0.1:7001]
    #[arg(long)]
    admin: Option<String>,
    /// WebSocket address (same protocol; JSON in text messages; the browser page at /) [default: none]
    #[arg(long)]
    ws_listen: Option<String>,
    /// HTTP API address (docs/http-api.md; also upgrades WebSockets) [default: none]
    #[arg(long)]
    http_listen: Option<String>,
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
    /// Report per-second counters to the hongbao monitor at this address
    #[arg(long)]
    monitor: Option<String>,
    /// Answer "overloaded" to a shake that waited in the kernel longer than this (a share, all past twice it); 0 never [default: 0]
    #[arg(long)]
    max_queue_ms: Option<u32>,
    /// Order of reading ready connections: adaptive (newest first while a queue stands, every eighth read the oldest past 1 s) or fifo [default: adaptive]
    #[arg(long)]
    ready_order: Option<hongbao_server::config::ReadyOrder>,
    /// Pace a broadcast while shakes wait in the kernel longer than this; 0 never [default: 0]
    #[arg(long)]
    broadcast_yield_ms: Option<u32>,
    /// Cluster mode: Redis Cluster nodes, redis://HOST:PORT[,…] (docs/scale-out.md)
    #[arg(long)]
    redis: Option<String>,
    /// Cluster mode: the PostgreSQL ledger, postgres://USER@HOST:PORT/DB
    #[arg(long)]
    postgres: Option<String>,
    /// Cluster mode: this host's name, unique among the gateways
    #[arg(long)]
    host_name: Option<String>,
    /// TOML file giving any of the options above (and the rest: see docs/admin-api.md)
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long)]
    link: String,
    #[arg(long)]
    index: u16,
    #[arg(long)]
    listen: std::net::SocketAddr,
    #[arg(long)]
    ws_listen: Option<std::net::SocketAddr>,
    #[arg(long)]
    http_listen: Option<std::net::SocketAddr>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    hongbao_server::supervisor::run(serve_config(args)?, Stop::on_signals()?)
}

pub fn run_worker(args: WorkerArgs) -> Result<()> {
    hongbao_server::worker::run(hongbao_server::worker::WorkerOptions {
        index: args.index,
        link: args.link,
        listen: args.listen,
        ws_listen: args.ws_listen,
        http_listen: args.http_listen,
    })
}

fn serve_config(args: ServeArgs) -> Result<ServeConfig> {
    let mut cfg = ServeConfig::load(args.config.as_deref())?;
    if let Some(v) = args.listen {
        cfg.listen = v;
    }
    if let Some(v) = args.admin {
        cfg.admin = v;
    }
    if let Some(v) = args.ws_listen {
        cfg.ws_listen = v;
    }
    if let Some(v) = args.http_listen {
        cfg.http_listen = v;
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
    if let Some(v) = args.monitor {
        cfg.monitor = v;
    }
    if let Some(v) = args.redis {
        cfg.redis = v;
    }
    if let Some(v) = args.postgres {
        cfg.postgres = v;
    }
    if let Some(v) = args.host_name {
        cfg.host_name = v;
    }
    if let Some(v) = args.max_queue_ms {
        cfg.max_queue_ms = v;
    }
    if let Some(v) = args.ready_order {
        cfg.ready_order = v;
    }
    if let Some(v) = args.broadcast_yield_ms {
        cfg.broadcast_yield_ms = v;
    }
    Ok(cfg)
}
