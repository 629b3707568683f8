//! `hongbao capacity`: read a plan and run the layered capacity test it describes.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct CapacityArgs {
    /// The plan (TOML): SLO, load, stages, target
    plan: PathBuf,
    /// Where summary.json, report.html, the charts and each stage's files go
    #[arg(long, default_value = "capacity-out")]
    out: PathBuf,
    /// The monitor's address (live dashboard)
    #[arg(long, default_value = "127.0.0.1:0")]
    monitor: std::net::SocketAddr,
}

pub fn run(args: CapacityArgs) -> Result<()> {
    let CapacityArgs { plan, out, monitor } = args;
    let text =
        std::fs::read_to_string(&plan).with_context(|| format!("reading {}", plan.display()))?;
    let plan = hongbao_bench::capacity::plan::Plan::from_toml(&text)
        .with_context(|| format!("{}", plan.display()))?;
    hongbao_bench::capacity::run(hongbao_bench::capacity::CapacityOptions {
        plan,
        out,
        monitor_listen: monitor,
    })?;
    Ok(())
}
