//! `hongbao serve` and its hidden `worker`: the flags (the config's own, `ServeFlags`),
//! laid over the config file into a `ServeConfig`, and the worker process's own arguments.

use anyhow::Result;
use clap::Args;
use hongbao_server::config::ServeFlags;
use hongbao_server::ServeConfig;
use hongbao_sys::Stop;

/// The flags are the config's own (`ServeFlags`): one spelling per option.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    flags: ServeFlags,
    /// Take over the server running on the same data directory: its listening sockets
    /// now, its ledger once it has drained (docs/deploy.md, "Upgrading in place").
    /// SIGUSR2 to a running server starts this from its binary's path.
    #[arg(long)]
    upgrade: bool,
}

#[derive(Args)]
pub struct WorkerArgs {
    /// The descriptor of the worker's link, inherited from `serve`.
    #[arg(long)]
    link_fd: i32,
    #[arg(long)]
    index: u16,
    /// A client listening socket inherited from `serve` (its descriptor), repeated.
    #[arg(long = "listener")]
    listeners: Vec<i32>,
    /// A listening socket that speaks HTTP (WebSocket, the HTTP API), repeated.
    #[arg(long = "http-listener")]
    http_listeners: Vec<i32>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let upgrade = args.upgrade;
    Ok(hongbao_server::supervisor::run(
        serve_config(args)?,
        Stop::on_signals()?,
        upgrade,
    )?)
}

pub fn run_worker(args: WorkerArgs) -> Result<()> {
    Ok(hongbao_server::worker::run(
        hongbao_server::worker::WorkerOptions {
            index: args.index,
            link_fd: args.link_fd,
            listeners: args.listeners,
            http_listeners: args.http_listeners,
        },
    )?)
}

fn serve_config(args: ServeArgs) -> Result<ServeConfig> {
    Ok(ServeConfig::load(&args.flags)?)
}
