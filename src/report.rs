//! `hongbao report`: redraw a run directory's report.html and charts, from series.csv for a
//! bench or monitor, from summary.json for a capacity run.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct ReportArgs {
    /// A bench's, monitor's or capacity run's --out
    dir: PathBuf,
}

pub fn run(args: ReportArgs) -> Result<()> {
    let dir = args.dir;
    let charts = if hongbao_bench::capacity::is_capacity_dir(&dir) {
        hongbao_bench::capacity::redraw(&dir)?.charts
    } else {
        hongbao_report::write_report(&dir)?
    };
    println!(
        "{} ({} charts: {})",
        dir.join("report.html").display(),
        charts.len(),
        charts.join(", ")
    );
    Ok(())
}
