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
}

#[derive(Args)]
pub struct WorkerArgs {
    /// The descriptor of the worker's link, inherited from `serve`.
    #[arg(long)]
    link_fd: i32,
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
    Ok(hongbao_server::supervisor::run(
        serve_config(args)?,
        Stop::on_signals()?,
    )?)
}

pub fn run_worker(args: WorkerArgs) -> Result<()> {
    hongbao_server::worker::run(hongbao_server::worker::WorkerOptions {
        index: args.index,
        link_fd: args.link_fd,
        listen: args.listen,
        ws_listen: args.ws_listen,
        http_listen: args.http_listen,
    })
}

fn serve_config(args: ServeArgs) -> Result<ServeConfig> {
    Ok(ServeConfig::load(&args.flags)?)
}
