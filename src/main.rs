//! The `hongbao` binary: parses arguments and hands them to the library that does the work.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use hongbao_server::ServeConfig;
use hongbao_sys::Stop;

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
    /// Simulate many users against a server at an exact, coordinated shake QPS.
    Load(LoadArgs),
    /// One load client process (started by `load`, not by hand).
    #[command(hide = true)]
    LoadClient {
        /// The client's options as JSON.
        options: String,
    },
    /// Start a server and a load, run the seed experiment's phases, audit every cent.
    Bench(BenchArgs),
    /// The layered capacity test: each stage of PLAN.toml loaded in rising steps up to its
    /// knee; summary.json, report.html and charts (docs/capacity.md).
    Capacity {
        /// The plan (TOML): SLO, load, stages, target
        plan: PathBuf,
        /// Where summary.json, report.html, the charts and each stage's files go
        #[arg(long, default_value = "capacity-out")]
        out: PathBuf,
        /// The monitor's address (live dashboard)
        #[arg(long, default_value = "127.0.0.1:0")]
        monitor: std::net::SocketAddr,
    },
    /// Collect per-second reports from serve and load instances; dashboard, series, /metrics.
    Monitor {
        /// Address for reports, the dashboard (/) and /metrics
        #[arg(long, default_value = "127.0.0.1:7200")]
        listen: std::net::SocketAddr,
        /// Where series.csv (and, at the end, report.html and the charts) go
        #[arg(long, default_value = "monitor-out")]
        out: PathBuf,
    },
    /// Write DIR/report.html and a PNG of every chart from DIR/series.csv (and summary.json),
    /// or, for a capacity run's directory, its report and charts from its summary.json.
    Report {
        /// A bench's, monitor's or capacity run's --out
        dir: PathBuf,
    },
    /// Write an nginx configuration that puts nginx in front of gateways (HTTP with
    /// upstream keep-alive, WebSocket, the binary protocol through the stream module).
    NginxConf(NginxArgs),
    /// The lab: test hosts in network namespaces with a Redis Cluster, PostgreSQL, gateways
    /// in cluster mode and nginx (root; docs/scale-out.md).
    #[command(subcommand)]
    Lab(LabCommand),
    /// Check this machine's limits for N connections (server and load co-located).
    Doctor {
        /// Connections to plan for
        #[arg(long, default_value_t = 1_000_000)]
        connections: u64,
        /// Write the sysctls that need changing (as root)
        #[arg(long)]
        apply: bool,
    },
}

#[derive(Args)]
struct LoadArgs {
    /// The server's client address: its --listen for tcp, its --ws-listen for ws
    #[arg(long, required_unless_present = "set_qps")]
    server: Option<std::net::SocketAddr>,
    /// tcp (binary frames), ws (the same frames in WebSocket binary messages) or http (the REST API)
    #[arg(long, default_value = "tcp")]
    transport: hongbao_load::transport::Transport,
    /// http: keep-alive (a connection per user), close (a new connection per request, closed by the server: `Connection: close`) or client-close (a new connection per request, closed by the client after the answer)
    #[arg(long, default_value = "keep-alive")]
    http_connection: hongbao_load::transport::HttpConnection,
    /// http: each user looks for packets to open every this many seconds; 0 never
    #[arg(long, default_value_t = hongbao_load::bench::DEFAULT_NOTICE_POLL_SECS)]
    notice_poll_secs: u32,
    /// Simulated users, one connection each
    #[arg(long, default_value_t = 20_000)]
    users: u64,
    /// User id of the first simulated user
    #[arg(long, default_value_t = 1)]
    first_user: u64,
    /// Shakes per second, all users together
    #[arg(long, default_value_t = 1000)]
    qps: u64,
    /// Serve POST /qps and GET /stats here; with --set-qps, the running load to change
    #[arg(long)]
    control: Option<String>,
    /// Change the QPS of the load running at --control, and exit
    #[arg(long, requires = "control")]
    set_qps: Option<u64>,
    /// Client processes: N or auto
    #[arg(long, default_value = "auto")]
    procs: String,
    /// Source addresses FIRST-LAST, e.g. 127.0.100.1-127.0.100.40 [default: enough from 127.0.100.1 for the port range]
    #[arg(long)]
    source_ips: Option<String>,
    /// Seconds of firing before stopping [default: until interrupted]
    #[arg(long)]
    duration: Option<u64>,
    /// New connections per second, all processes together
    #[arg(long, default_value_t = 20_000)]
    connect_rate: u64,
    /// Secret for login tokens (must match the server's)
    #[arg(long, env = "HONGBAO_SECRET", default_value = hongbao_proto::token::DEV_SECRET)]
    secret: String,
    /// Report per-second counters to the hongbao monitor at this address
    #[arg(long)]
    monitor: Option<String>,
    /// A user answered "overloaded" skips its shakes for the wait the answer names, or for
    /// this many seconds when it names none (±50%); 0 keeps shaking
    #[arg(long, default_value_t = hongbao_load::bench::DEFAULT_OVERLOAD_BACKOFF_SECS)]
    overload_backoff_secs: u32,
}

#[derive(Args)]
struct BenchArgs {
    /// quick (20,000 connections, ~1 minute) or seed (1,000,000 connections, the original's scale)
    #[arg(long, default_value = "quick")]
    preset: String,
    /// Connections (overrides the preset)
    #[arg(long)]
    connections: Option<u64>,
    /// Where summary.json, series.csv and the ledger go
    #[arg(long, default_value = "bench-out")]
    out: std::path::PathBuf,
    /// Server worker processes: N or auto
    #[arg(long)]
    workers: Option<String>,
    /// Load client processes: N or auto
    #[arg(long)]
    procs: Option<String>,
    /// QPS of each steady phase, comma-separated [preset: 30000,60000]
    #[arg(long, value_delimiter = ',')]
    phase_qps: Option<Vec<u64>>,
    /// Shake packets per phase [quick: 2000, seed: 40000]
    #[arg(long)]
    shake_packets: Option<u32>,
    /// Send packets per phase [quick: 1000, seed: 20000]
    #[arg(long)]
    send_packets: Option<u32>,
    /// Packets per second of both campaigns
    #[arg(long)]
    campaign_rate: Option<u32>,
    /// The server's max_shake_qps [default: 100000]
    #[arg(long)]
    max_shake_qps: Option<u32>,
    /// New connections per second
    #[arg(long)]
    connect_rate: Option<u64>,
    /// Where the bench's monitor (live dashboard, /metrics) listens [default: 127.0.0.1, any port]
    #[arg(long)]
    monitor_listen: Option<std::net::SocketAddr>,
    /// tcp, ws or http (the server also listens for WebSocket or HTTP and the clients connect there)
    #[arg(long, default_value = "tcp")]
    transport: hongbao_load::transport::Transport,
    /// http: keep-alive (a connection per user), close (a new connection per request, closed by the server: `Connection: close`) or client-close (a new connection per request, closed by the client after the answer)
    #[arg(long, default_value = "keep-alive")]
    http_connection: hongbao_load::transport::HttpConnection,
    /// Seconds between operator broadcasts in each steady phase; 0 = none
    #[arg(long, default_value_t = 0.0)]
    broadcast_every: f64,
    /// The server answers "overloaded" to shakes that waited in its kernel queue longer than this (a share, all past twice it); 0 never [default: 200]
    #[arg(long)]
    max_queue_ms: Option<u32>,
    /// The server paces broadcasts while shakes wait in its kernel queue longer than this; 0 never [default: 3]
    #[arg(long)]
    broadcast_yield_ms: Option<u32>,
    /// The server's nice value, so the co-located load keeps its schedule [default: 5]
    #[arg(long, allow_negative_numbers = true)]
    server_nice: Option<i32>,
    /// Run in a network namespace of its own, with an established-socket hash sized for
    /// the connections and doctor's sysctls applied there (root; the dashboard is then
    /// reachable only from inside it)
    #[arg(long)]
    netns: bool,
    /// Run across N gateway hosts in cluster mode on a lab (network namespaces, a Redis
    /// Cluster, PostgreSQL, nginx in front; root; docs/scale-out.md); 0: one local server
    #[arg(long, default_value_t = 0)]
    hosts: usize,
    /// Inject a failure into the first phase: worker-stall (one local server), or with
    /// --hosts gateway, redis-master, redis-freeze or postgres (docs/bench.md)
    #[arg(long)]
    fault: Option<String>,
    /// Seconds into the first phase for --fault
    #[arg(long, default_value_t = 5.0)]
    fault_at: f64,
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

#[derive(Subcommand)]
enum LabCommand {
    /// Bring a lab up and hold it until Ctrl-C (or SIGTERM), then take it down.
    Up(LabUpArgs),
    /// Take down a lab left behind (its owner was killed): the processes it recorded in
    /// DIR/lab.json, its hosts and its bridge.
    Down {
        /// The lab's --dir
        #[arg(long, default_value = "lab")]
        dir: PathBuf,
    },
}

#[derive(Args)]
struct LabUpArgs {
    /// The lab's number n: its hosts are on 198.18.n.0/24
    #[arg(long, default_value_t = 1)]
    lab: u8,
    /// Logs, data and the state file
    #[arg(long, default_value = "lab")]
    dir: PathBuf,
    /// Gateway hosts (hongbao serve in cluster mode)
    #[arg(long, default_value_t = 2)]
    gateways: usize,
    /// Hosts for load generators (run them with `ip netns exec hbN-loadK hongbao load …`)
    #[arg(long, default_value_t = 1)]
    loads: usize,
    /// Worker processes per gateway
    #[arg(long, default_value = "2")]
    workers: String,
    /// No nginx in front of the gateways
    #[arg(long)]
    no_nginx: bool,
    /// The login secret of every gateway
    #[arg(long, env = "HONGBAO_SECRET", default_value = hongbao_server::config::DEV_SECRET)]
    secret: String,
}

fn lab_up(args: LabUpArgs) -> Result<()> {
    let stop = Stop::on_signals()?;
    let lab = hongbao_lab::Lab::up(hongbao_lab::LabPlan {
        lab: args.lab,
        dir: std::path::absolute(&args.dir)?,
        gateways: args.gateways,
        loads: args.loads,
        nginx: !args.no_nginx,
        hongbao: std::env::current_exe()?,
        gateway_workers: args.workers,
        secret: args.secret,
        serve_args: Vec::new(),
    })?;
    println!("hongbao lab {} up: dir={}", args.lab, args.dir.display());
    for host in lab.hosts() {
        println!("  {:<8} {:<15} netns {}", host.name, host.addr, host.netns);
    }
    println!("  redis    {}", lab.redis_urls());
    println!("  postgres {}", lab.postgres_url());
    for gw in &lab.gateways {
        println!(
            "  gateway  {}: tcp {} ws {} http {} admin {}",
            gw.host.name,
            gw.tcp(),
            gw.ws(),
            gw.http(),
            gw.admin()
        );
    }
    if let Some((tcp, http, ws)) = lab.nginx_addrs() {
        println!("  nginx    tcp {tcp} http {http} ws {ws}");
    }
    println!("Ctrl-C takes it down.");
    while !stop.requested() {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(lab);
    println!("hongbao lab {} down", args.lab);
    Ok(())
}

#[derive(Args)]
struct NginxArgs {
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
    /// Write the configuration here [default: standard output]
    #[arg(long)]
    out: Option<PathBuf>,
}

fn nginx_conf(args: NginxArgs) -> Result<()> {
    use hongbao_server::nginx::{render, Plan, DEBIAN_STREAM_MODULE};
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
    };
    let conf = render(&plan);
    match args.out {
        Some(path) => std::fs::write(&path, conf)?,
        None => print!("{conf}"),
    }
    Ok(())
}

#[derive(Args)]
struct WorkerArgs {
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
    if let Some(v) = args.broadcast_yield_ms {
        cfg.broadcast_yield_ms = v;
    }
    Ok(cfg)
}

fn procs(value: &str) -> Result<u32> {
    match value {
        "auto" => Ok(0),
        n => n
            .parse()
            .map_err(|_| anyhow::anyhow!("--procs must be a number or auto, not {n:?}")),
    }
}

fn load_options(args: &LoadArgs) -> Result<hongbao_load::coordinator::LoadOptions> {
    let source_ips = match &args.source_ips {
        None => None,
        Some(range) => {
            let (a, b) = range
                .split_once('-')
                .ok_or_else(|| anyhow::anyhow!("--source-ips wants FIRST-LAST"))?;
            Some((a.parse()?, b.parse()?))
        }
    };
    Ok(hongbao_load::coordinator::LoadOptions {
        server: args.server.expect("clap requires --server"),
        transport: args.transport,
        users: args.users,
        first_user: args.first_user,
        qps: args.qps,
        procs: procs(&args.procs)?,
        source_ips,
        connect_rate: args.connect_rate,
        secret: args.secret.clone(),
        connect_at_epoch: false,
        monitor: args.monitor.clone(),
        overload_backoff_secs: args.overload_backoff_secs,
        http_connection: args.http_connection,
        notice_poll_secs: args.notice_poll_secs,
        hosts: Vec::new(),
        request: None,
    })
}

fn bench_options(args: BenchArgs) -> Result<hongbao_load::bench::BenchOptions> {
    use hongbao_load::bench::{BenchOptions, Preset};
    let preset = match args.preset.as_str() {
        "quick" => Preset::Quick,
        "seed" => Preset::Seed,
        other => anyhow::bail!("--preset must be quick or seed, not {other:?}"),
    };
    let mut opts = BenchOptions::preset(preset);
    opts.out = args.out;
    if let Some(v) = args.connections {
        opts.connections = v;
    }
    if let Some(v) = args.workers {
        opts.workers = v;
    }
    if let Some(v) = args.procs {
        opts.procs = procs(&v)?;
    }
    if let Some(v) = args.phase_qps {
        if v.is_empty() || v.contains(&0) {
            // A phase's shake campaign is won by its shakes: at 0 it would never finish.
            anyhow::bail!("--phase-qps must be one or more rates above 0, like 30000,60000");
        }
        opts.phase_qps = v;
    }
    if let Some(v) = args.shake_packets {
        opts.shake_packets = v;
    }
    if let Some(v) = args.send_packets {
        opts.send_packets = v;
    }
    if let Some(v) = args.campaign_rate {
        opts.campaign_rate = v;
    }
    if let Some(v) = args.max_shake_qps {
        opts.max_shake_qps = v;
    }
    if let Some(v) = args.connect_rate {
        opts.connect_rate = v;
    }
    if let Some(v) = args.monitor_listen {
        opts.monitor_listen = v;
    }
    opts.transport = args.transport;
    opts.http_connection = args.http_connection;
    if !(args.broadcast_every >= 0.0 && args.broadcast_every.is_finite()) {
        anyhow::bail!("--broadcast-every must be 0 (off) or a number of seconds");
    }
    opts.broadcast_every_secs = args.broadcast_every;
    if let Some(v) = args.max_queue_ms {
        opts.max_queue_ms = v;
    }
    if let Some(v) = args.broadcast_yield_ms {
        opts.broadcast_yield_ms = v;
    }
    if let Some(v) = args.server_nice {
        opts.server_nice = v;
    }
    opts.netns = args.netns;
    opts.hosts = args.hosts;
    opts.fault = args
        .fault
        .as_deref()
        .map(hongbao_load::bench::Fault::parse)
        .transpose()?;
    opts.fault_at_secs = args.fault_at;
    match opts.fault {
        Some(hongbao_load::bench::Fault::WorkerStall) if opts.hosts > 0 => {
            anyhow::bail!("--fault worker-stall stops a worker of one local server: no --hosts")
        }
        Some(hongbao_load::bench::Fault::WorkerStall) | None => {}
        Some(_) if opts.hosts == 0 => {
            anyhow::bail!("--fault needs --hosts: the failures are injected into a lab")
        }
        Some(_) => {}
    }
    if opts.fault == Some(hongbao_load::bench::Fault::Gateway) && opts.hosts < 2 {
        anyhow::bail!("--fault gateway needs --hosts 2 or more: one host must carry on");
    }
    if opts.hosts > 0 && opts.netns {
        anyhow::bail!("--hosts runs on lab hosts of their own; it does not take --netns");
    }
    Ok(opts)
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => {
            hongbao_server::supervisor::run(serve_config(args)?, Stop::on_signals()?)
        }
        Command::Worker(args) => {
            hongbao_server::worker::run(hongbao_server::worker::WorkerOptions {
                index: args.index,
                link: args.link,
                listen: args.listen,
                ws_listen: args.ws_listen,
                http_listen: args.http_listen,
            })
        }
        Command::Load(args) => match (args.set_qps, &args.control) {
            (Some(qps), Some(control)) => hongbao_load::cli::set_remote_qps(control, qps),
            _ => hongbao_load::cli::run_cli(
                load_options(&args)?,
                args.control.clone(),
                args.duration,
                &Stop::on_signals()?,
            ),
        },
        Command::Doctor { connections, apply } => {
            use hongbao_sys::doctor;
            let limits = doctor::Limits::read();
            print!("{}", doctor::report(&limits, connections));
            if apply {
                for line in doctor::apply(&limits, connections) {
                    println!("{line}");
                }
                print!("{}", doctor::report(&doctor::Limits::read(), connections));
            }
            Ok(())
        }
        Command::NginxConf(args) => nginx_conf(args),
        Command::Lab(LabCommand::Up(args)) => lab_up(args),
        Command::Lab(LabCommand::Down { dir }) => {
            let state = hongbao_lab::down(&dir)?;
            println!(
                "hongbao lab {} down: {} processes, {} hosts",
                state.lab,
                state.procs.len(),
                state.netns.len()
            );
            Ok(())
        }
        Command::Monitor { listen, out } => {
            hongbao_monitor::run_cli(listen, &out, &Stop::on_signals()?)
        }
        Command::Report { dir } if hongbao_load::capacity::is_capacity_dir(&dir) => {
            let summary = hongbao_load::capacity::redraw(&dir)?;
            println!(
                "{} ({} charts: {})",
                dir.join("report.html").display(),
                summary.charts.len(),
                summary.charts.join(", ")
            );
            Ok(())
        }
        Command::Report { dir } => {
            let charts = hongbao_report::write_report(&dir)?;
            println!(
                "{} ({} charts: {})",
                dir.join("report.html").display(),
                charts.len(),
                charts.join(", ")
            );
            Ok(())
        }
        Command::LoadClient { options } => {
            hongbao_load::client::run(serde_json::from_str(&options)?)
        }
        Command::Capacity { plan, out, monitor } => {
            let text = std::fs::read_to_string(&plan)
                .with_context(|| format!("reading {}", plan.display()))?;
            let plan = hongbao_load::capacity::plan::Plan::from_toml(&text)
                .with_context(|| format!("{}", plan.display()))?;
            hongbao_load::capacity::run(hongbao_load::capacity::CapacityOptions {
                plan,
                out,
                monitor_listen: monitor,
            })?;
            Ok(())
        }
        Command::Bench(args) => {
            let opts = bench_options(args)?;
            if opts.netns {
                // Before the bench starts any thread: only the calling thread moves.
                for line in hongbao_sys::doctor::enter_network_namespace(opts.connections)? {
                    println!("bench: {line}");
                }
            }
            let summary = hongbao_load::bench::run(opts)?;
            if !summary.audit.ok {
                anyhow::bail!("the money audit failed: see summary.json");
            }
            Ok(())
        }
    }
}
