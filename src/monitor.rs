//! `hongbao monitor`: collect the per-second reports of serve and load instances until a
//! signal.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use hongbao_sys::Stop;

#[derive(Args)]
pub struct MonitorArgs {
    /// Address for reports, the dashboard (/) and /metrics
    #[arg(long, default_value = "127.0.0.1:7200")]
    listen: std::net::SocketAddr,
    /// Where series.csv (and, at the end, report.html and the charts) go
    #[arg(long, default_value = "monitor-out")]
    out: PathBuf,
    /// The key reports must carry: read from this file, made there if it does not exist
    /// (HONGBAO_MONITOR_KEY overrides) [default: hongbao-monitor.key]
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Speak TLS: the certificate chain (PEM); its reporters then name the monitor
    /// https://HOST:PORT and trust its CA through HONGBAO_TLS_CA
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// ...and its private key (PEM)
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

pub fn run(args: MonitorArgs) -> Result<()> {
    let key_file = args.key_file.as_deref();
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(hongbao_http::tls::TlsFiles { cert, key }),
        _ => None,
    };
    hongbao_monitor::run_cli(
        args.listen,
        &args.out,
        key_file,
        tls.as_ref(),
        &Stop::on_signals()?,
    )?;
    Ok(())
}
