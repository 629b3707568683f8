//! `hongbao nginx-conf`: the flags, checked and turned into an nginx `Plan`, rendered to a
//! file or standard output.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct NginxArgs {
    /// nginx's HTTP API address
    #[arg(long, requires = "http_upstream")]
    http_listen: Option<std::net::SocketAddr>,
    /// The gateways' --http-listen addresses behind it
    #[arg(long, value_delimiter = ',')]
    http_upstream: Vec<std::net::SocketAddr>,
    /// nginx's WebSocket address
    #[arg(long, requires = "ws_upstream")]
    ws_listen: Option<std::net::SocketAddr>,
    /// The gateways' --ws-listen (or --http-listen) addresses behind it
    #[arg(long, value_delimiter = ',')]
    ws_upstream: Vec<std::net::SocketAddr>,
    /// nginx's binary-protocol address (stream module)
    #[arg(long, requires = "tcp_upstream")]
    tcp_listen: Option<std::net::SocketAddr>,
    /// The gateways' --listen addresses behind it
    #[arg(long, value_delimiter = ',')]
    tcp_upstream: Vec<std::net::SocketAddr>,
    /// An address where nginx answers 200 itself (a baseline for benchmarks)
    #[arg(long)]
    static_listen: Option<std::net::SocketAddr>,
    /// Idle keep-alive connections per nginx worker to the HTTP gateways
    #[arg(long, default_value_t = 256)]
    keepalive: u32,
    /// nginx worker processes: N or auto
    #[arg(long, default_value = "auto")]
    worker_processes: String,
    /// Directory for nginx's pid file, logs and temp files
    #[arg(long, default_value = "nginx")]
    prefix: PathBuf,
    /// The stream module to load [default: Debian's, when it is there]
    #[arg(long)]
    stream_module: Option<PathBuf>,
    /// The user nginx's workers run as when it starts as root
    #[arg(long)]
    user: Option<String>,
    /// Terminate TLS on every address but --static-listen: the certificate chain (PEM)
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// ...and its private key (PEM)
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Pass each binary-protocol client's address to the gateways in a PROXY protocol
    /// header (the gateways must list nginx's address in trusted_proxies)
    #[arg(long)]
    proxy_protocol: bool,
    /// The addresses nginx's connections to the gateways leave from, spread evenly by
    /// connection (one address holds ~64,000 ports to a gateway): FIRST-LAST, a
    /// comma-separated list, none, or auto (127.0.200.1-127.0.200.8 when every gateway
    /// is on loopback, else none). The gateways' trusted_proxies must name them
    #[arg(long, default_value = "auto")]
    upstream_sources: String,
    /// Write the configuration here [default: standard output]
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: NginxArgs) -> Result<()> {
    use hongbao_lab::nginx::{render, Plan, DEBIAN_STREAM_MODULE};
    let pair = |listen: Option<std::net::SocketAddr>, upstream: Vec<std::net::SocketAddr>| {
        listen.map(|l| (l, upstream))
    };
    if args.http_listen.is_none()
        && args.ws_listen.is_none()
        && args.tcp_listen.is_none()
        && args.static_listen.is_none()
    {
        anyhow::bail!(
            "nothing to proxy: give --http-listen, --ws-listen, --tcp-listen or --static-listen"
        );
    }
    if !["auto"].contains(&args.worker_processes.as_str())
        && args.worker_processes.parse::<u32>().is_err()
    {
        anyhow::bail!("--worker-processes must be a number or auto");
    }
    let prefix = std::path::absolute(&args.prefix)?;
    std::fs::create_dir_all(&prefix)
        .with_context(|| format!("creating the prefix directory {}", prefix.display()))?;
    let plan = Plan {
        http: pair(args.http_listen, args.http_upstream),
        ws: pair(args.ws_listen, args.ws_upstream),
        tcp: pair(args.tcp_listen, args.tcp_upstream),
        static_200: args.static_listen,
        keepalive: args.keepalive.max(1),
        worker_processes: args.worker_processes,
        prefix,
        stream_module: args.stream_module.or_else(|| {
            let debian = PathBuf::from(DEBIAN_STREAM_MODULE);
            debian.exists().then_some(debian)
        }),
        user: args.user,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => {
                Some((std::path::absolute(cert)?, std::path::absolute(key)?))
            }
            _ => None,
        },
        proxy_protocol: args.proxy_protocol,
        upstream_sources: Vec::new(),
    };
    let loopback = [&plan.http, &plan.ws, &plan.tcp]
        .into_iter()
        .flatten()
        .flat_map(|(_, servers)| servers)
        .all(|s| s.ip().is_loopback());
    let plan = Plan {
        upstream_sources: upstream_sources(&args.upstream_sources, loopback)?,
        ..plan
    };
    let conf = render(&plan);
    match args.out {
        Some(path) => std::fs::write(&path, conf)?,
        None => print!("{conf}"),
    }
    Ok(())
}

/// `--upstream-sources`: FIRST-LAST (IPv4, the last octet counting), a list, `none`, or
/// `auto` (the loopback eight when every gateway is on loopback).
fn upstream_sources(text: &str, loopback: bool) -> Result<Vec<std::net::IpAddr>> {
    use std::net::{IpAddr, Ipv4Addr};
    match text {
        "auto" if loopback => Ok(hongbao_lab::nginx::loopback_upstream_sources()),
        "auto" | "none" | "" => Ok(Vec::new()),
        range if range.contains('-') => {
            let (a, b) = range.split_once('-').expect("a dash");
            let bad =
                || anyhow::anyhow!("--upstream-sources {range:?}: not FIRST-LAST IPv4 addresses");
            let (a, b): (Ipv4Addr, Ipv4Addr) =
                (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            let (a, b) = (u32::from(a), u32::from(b));
            if b < a || b - a >= 256 {
                anyhow::bail!(
                    "--upstream-sources {range:?}: from 1 to 256 addresses, the first first"
                );
            }
            Ok((a..=b).map(|n| IpAddr::V4(Ipv4Addr::from(n))).collect())
        }
        list => list
            .split(',')
            .map(|a| {
                a.trim()
                    .parse()
                    .with_context(|| format!("--upstream-sources: {a:?} is not an address"))
            })
            .collect(),
    }
}
