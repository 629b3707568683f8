//! `hongbao bench`: the flags laid over a preset into `BenchOptions`, checked for
//! combinations that cannot run, then the bench itself and its audit verdict.

use anyhow::{Context, Result};
use clap::Args;

use crate::load::procs;

#[derive(Args)]
pub struct BenchArgs {
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
    /// With --hosts: the lab's ledger is a PostgreSQL primary with a synchronous standby,
    /// failed over by pg_auto_failover (docs/scale-out.md); implied by primary-lost,
    /// primary-freeze and primary-isolate
    #[arg(long, requires = "hosts")]
    standby: bool,
    /// With --hosts: the lab's ledger over this many shards (docs/scale-out.md,
    /// "Shards"): shard 0 the lab's PostgreSQL (or its formation, with a standby, which
    /// the primary faults then aim at), each other one a PostgreSQL of its own
    #[arg(long, requires = "hosts", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    shards: u16,
    /// With --hosts: the release of campaign packets split over this many Redis hash tags
    /// (`serve --release-tags`, docs/scale-out.md "The release over several slots")
    #[arg(long, requires = "hosts", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    release_tags: u32,
    /// Inject a failure into the first phase: worker-stall, worker-kill, supervisor-kill
    /// (or core-kill: the core is in the supervisor's process) or disk-full (root: the
    /// ledger goes on a tmpfs of its own) on one local server, or with --hosts gateway,
    /// redis-master, redis-freeze (":rel": the master holding the release of campaign
    /// packets), redis-wipe, postgres or partition-redis|postgres, and with a standby
    /// primary-lost (its disk too), primary-freeze or primary-isolate (docs/bench.md)
    #[arg(long)]
    fault: Option<String>,
    /// Seconds into the first phase for --fault
    #[arg(long, default_value_t = 5.0)]
    fault_at: f64,
    /// Upgrade the local server in place this many seconds into the first phase
    /// (`--fault upgrade --fault-at SECS`: `serve --upgrade`, docs/deploy.md); with
    /// --hosts, every gateway one after another (SIGTERM drains it, then it starts again
    /// on the new binary)
    #[arg(long, value_name = "SECS", conflicts_with_all = ["fault", "fault_at"])]
    upgrade_at: Option<f64>,
    /// The binary --upgrade-at starts [default: this one]
    #[arg(long, value_name = "BINARY", requires = "upgrade_at")]
    upgrade_to: Option<std::path::PathBuf>,
    /// The binary the server (or every gateway) starts on, for --upgrade-at to upgrade
    /// from [default: this one]
    #[arg(long, value_name = "BINARY", requires = "upgrade_at")]
    upgrade_from: Option<std::path::PathBuf>,
    /// Faults at random moments through every steady phase, drawn with this seed (the
    /// same seed, the same faults in the same order; docs/bench.md)
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// With --chaos: the mean quiet gap, in seconds, between one fault's heal and the next
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    chaos_every: f64,
    /// With --chaos: the faults to draw from, comma-separated [default: worker-kill,
    /// worker-stall; on one local server also supervisor-kill (core-kill) and, as root,
    /// disk-full; with --hosts also gateway-kill, redis-master-kill,
    /// redis-master-kill:rel, redis-freeze:rel, redis-wipe, postgres-restart,
    /// partition-redis, partition-postgres; with --standby primary-lost, primary-freeze
    /// and primary-isolate instead of postgres-restart and postgres-disk-full]
    #[arg(long, value_name = "LIST")]
    chaos_faults: Option<String>,
    /// Print the `hongbao serve` flags of the bench's server settings (workers,
    /// connections, limits), one a line, and run nothing: how the sitting scripts start a
    /// server as the bench would (scripts/lib.sh)
    #[arg(long)]
    print_serve_args: bool,
    /// Run the load on N load agents (`hongbao load-agent` on any machine) instead of
    /// local client processes; each takes one slice of the users and the rate (docs/agents.md)
    #[arg(long, value_name = "N")]
    agents: Option<u32>,
    /// Where the agents dial in [default: 127.0.0.1, any port; with --hosts the lab's
    /// bridge address]
    #[arg(long, requires = "agents")]
    agent_listen: Option<std::net::SocketAddr>,
    /// The agent link's key (agent.key) and TLS files (ca.pem, cert.pem, key.pem): used
    /// when there, made when not [default: OUT/agents]
    #[arg(long, requires = "agents")]
    agent_dir: Option<std::path::PathBuf>,
    /// More names for the certificate the coordinator makes (the names the agents dial)
    #[arg(long, value_delimiter = ',', requires = "agents")]
    agent_names: Vec<String>,
    /// Seconds to wait for every agent to join
    #[arg(long, default_value_t = 120, requires = "agents")]
    agent_join_secs: u64,
    /// Start the agents here (on the lab's load hosts with --hosts), instead of waiting for
    /// agents started elsewhere
    #[arg(long, requires = "agents")]
    spawn_agents: bool,
    /// Load a running deployment instead of starting a server: the address its clients
    /// connect to, HOST:PORT (a gateway or nginx; for the transport asked for; a name is
    /// resolved once, at the start)
    #[arg(long, requires_all = ["target_admin", "target_admin_key_file"])]
    target_clients: Option<String>,
    /// The deployment's admin API: http://HOST:PORT or https://HOST:PORT
    #[arg(long, requires = "target_clients")]
    target_admin: Option<String>,
    /// A file holding an operator key of the deployment's admin API
    #[arg(long, requires = "target_clients")]
    target_admin_key_file: Option<std::path::PathBuf>,
    /// The login secret the deployment's tokens are signed with (HS256)
    #[arg(long, env = "HONGBAO_SECRET", default_value = hongbao_proto::token::DEV_SECRET, hide_env_values = true)]
    target_secret: String,
    /// The CA (PEM) the deployment's certificates are signed by: trusted for an https
    /// admin API, and by the clients with --target-client-tls
    #[arg(long, requires = "target_clients")]
    target_ca: Option<std::path::PathBuf>,
    /// The clients speak TLS to --target-clients (binary frames), trusting --target-ca
    #[arg(long, requires = "target_ca")]
    target_client_tls: bool,
    /// Every transport over TLS (frames, wss, https) and the admin address too, with a
    /// throwaway CA and certificate made for the run (OUT/tls); `--preset seed --tls` is
    /// the festival night
    #[arg(long)]
    tls: bool,
    /// paced: connect at --connect-rate; storm: every user at once, each that fails coming
    /// back on its own full-jitter back-off (docs/bench.md)
    #[arg(long, default_value = "paced")]
    connect_mode: crate::load::ConnectMode,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let print_serve_args = args.print_serve_args;
    let opts = bench_options(args)?;
    if print_serve_args {
        for arg in opts.serve_settings().to_args() {
            println!("{arg}");
        }
        return Ok(());
    }
    if opts.netns {
        // Before the bench starts any thread: only the calling thread moves.
        for line in hongbao_sys::doctor::enter_network_namespace(opts.connections)? {
            println!("bench: {line}");
        }
    }
    let ca = match (&opts.tls_dir, &opts.target) {
        (Some(dir), _) => Some(dir.join("ca.pem")),
        (None, Some(t)) => t.ca.clone(),
        _ => None,
    };
    if let Some(ca) = ca {
        // The bench's admin calls trust it for an https:// admin API (before any thread).
        if std::env::var_os(hongbao_http::tls::CA_ENV).is_none() {
            std::env::set_var(hongbao_http::tls::CA_ENV, ca);
        }
    }
    let summary = hongbao_bench::bench::run(opts)?;
    if !summary.audit.ok {
        anyhow::bail!("the money audit failed: see summary.json");
    }
    Ok(())
}

fn bench_options(args: BenchArgs) -> Result<hongbao_bench::bench::BenchOptions> {
    use hongbao_bench::bench::{BenchOptions, Preset};
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
    opts.connect_storm = args.connect_mode == crate::load::ConnectMode::Storm;
    if args.tls {
        if args.hosts > 0 || args.target_clients.is_some() {
            anyhow::bail!(
                "--tls makes a certificate for the bench's own local server: not with --hosts or --target-clients (a target's TLS: --target-ca and --target-client-tls)"
            );
        }
        // A throwaway CA and a certificate it signed, for this run only.
        let dir = opts.out.join("tls");
        let certs = hongbao_http::tls::DevCerts::make(&["127.0.0.1", "localhost"])?;
        certs
            .write(&dir)
            .with_context(|| format!("writing the run's certificate to {}", dir.display()))?;
        opts.tls_dir = Some(dir);
    }
    opts.standby = args.standby;
    opts.shards = args.shards as usize;
    opts.release_tags = args.release_tags;
    opts.fault = args
        .fault
        .as_deref()
        .map(hongbao_bench::bench::Fault::parse)
        .transpose()?;
    opts.fault_at_secs = args.fault_at;
    if let Some(at) = args.upgrade_at {
        opts.fault = Some(hongbao_bench::bench::Fault::Upgrade);
        opts.fault_at_secs = at;
    }
    opts.upgrade_to = args.upgrade_to;
    opts.upgrade_from = args.upgrade_from;
    match opts.fault {
        Some(f)
            if !f.needs_lab() && f != hongbao_bench::bench::Fault::Upgrade && opts.hosts > 0 =>
        {
            anyhow::bail!(
                "--fault {} is done to one local server: no --hosts",
                f.name()
            )
        }
        Some(f) if f.needs_lab() && opts.hosts == 0 => {
            anyhow::bail!("--fault needs --hosts: the failures are injected into a lab")
        }
        _ => {}
    }
    if let Some(seed) = args.chaos {
        if opts.fault.is_some() {
            anyhow::bail!("--chaos draws its own faults: not with --fault");
        }
        if !(args.chaos_every > 0.0 && args.chaos_every.is_finite()) {
            anyhow::bail!("--chaos-every must be a number of seconds above 0");
        }
        let faults = match args.chaos_faults.as_deref() {
            Some(list) => list
                .split(',')
                .map(|name| hongbao_bench::bench::Fault::parse(name.trim()))
                .collect::<Result<Vec<_>, _>>()?,
            None => hongbao_bench::bench::ChaosOptions::default_faults(
                opts.hosts,
                opts.lab_standby(),
                opts.shards,
            ),
        };
        if faults.is_empty() {
            anyhow::bail!("--chaos-faults names no fault");
        }
        if let Some(f) = faults.iter().find(|f| f.needs_lab() && opts.hosts == 0) {
            anyhow::bail!("--chaos-faults {}: needs --hosts (a lab)", f.name());
        }
        if let Some(f) = faults
            .iter()
            .find(|f| f.one_server_only() && opts.hosts > 0)
        {
            anyhow::bail!(
                "--chaos-faults {}: done to one local server only, not with --hosts",
                f.name()
            );
        }
        if opts.hosts > 0 && faults.contains(&hongbao_bench::bench::Fault::Upgrade) {
            anyhow::bail!(
                "--chaos-faults upgrade: with --hosts an upgrade rolls every gateway; give it alone, as --upgrade-at"
            );
        }
        if opts.hosts < 2 && faults.contains(&hongbao_bench::bench::Fault::Gateway) {
            anyhow::bail!("--chaos-faults gateway-kill needs --hosts 2 or more");
        }
        opts.chaos = Some(hongbao_bench::bench::ChaosOptions {
            seed,
            every_secs: args.chaos_every,
            faults,
        });
    } else if args.chaos_faults.is_some() {
        anyhow::bail!("--chaos-faults goes with --chaos SEED");
    }
    if let Some((f, k)) = opts
        .faults()
        .find_map(|f| f.shard().map(|k| (f, k)))
        .filter(|&(_, k)| k >= opts.shards.max(1))
    {
        anyhow::bail!(
            "{} aims at shard {k}: the lab's ledger has {} (--shards)",
            f.name(),
            opts.shards.max(1)
        );
    }
    if opts.fault == Some(hongbao_bench::bench::Fault::Gateway) && opts.hosts < 2 {
        anyhow::bail!("--fault gateway needs --hosts 2 or more: one host must carry on");
    }
    if opts.lab_standby() {
        if let Some(f) = opts.faults().find(|f| {
            matches!(
                f,
                hongbao_bench::bench::Fault::ShardFreeze(_)
                    | hongbao_bench::bench::Fault::ShardIsolate(_)
            )
        }) {
            anyhow::bail!(
                "{}: with a standby every shard is a formation, whose faults are primary-lost, primary-freeze and primary-isolate (:K for shard K)",
                f.name()
            );
        }
        if opts.shards > hongbao_lab::shards::MOST_WITH_STANDBY {
            anyhow::bail!(
                "--shards {} with a standby: a lab holds at most {} formations (three hosts each)",
                opts.shards,
                hongbao_lab::shards::MOST_WITH_STANDBY
            );
        }
        if let Some(f) = opts.faults().find(|f| f.needs_one_postgres()) {
            anyhow::bail!(
                "{} is done to the one PostgreSQL of a lab without a standby; with one, the primary's faults are primary-lost, primary-freeze and primary-isolate",
                f.name()
            );
        }
    }
    if opts.hosts > 0 && opts.netns {
        anyhow::bail!("--hosts runs on lab hosts of their own; it does not take --netns");
    }
    if let Some(count) = args.agents {
        if count == 0 {
            anyhow::bail!("--agents must be at least 1");
        }
        opts.agents = Some(hongbao_bench::bench::AgentsChoice {
            count,
            listen: args.agent_listen,
            dir: args.agent_dir,
            cert_names: args.agent_names,
            join_timeout_secs: args.agent_join_secs,
            spawn: args.spawn_agents,
        });
    }
    if let Some(clients) = args.target_clients {
        if opts.hosts > 0 || opts.fault.is_some() || opts.chaos.is_some() || opts.netns {
            anyhow::bail!(
                "--target-clients loads a deployment the bench did not start: no --hosts, --fault, --chaos or --netns"
            );
        }
        let admin = args.target_admin.expect("clap requires it");
        if !(admin.starts_with("http://") || admin.starts_with("https://")) {
            anyhow::bail!(
                "--target-admin must be http://HOST:PORT or https://HOST:PORT, not {admin:?}"
            );
        }
        let key_file = args.target_admin_key_file.expect("clap requires it");
        let admin_key = hongbao_http::access::read_secret_file(&key_file)
            .with_context(|| format!("reading the admin key {}", key_file.display()))?;
        use std::net::ToSocketAddrs;
        let clients = clients
            .to_socket_addrs()
            .with_context(|| {
                format!("--target-clients {clients}: not HOST:PORT, or the name does not resolve")
            })?
            .next()
            .with_context(|| format!("--target-clients {clients}: the name has no address"))?;
        opts.target = Some(hongbao_bench::bench::Target {
            clients,
            admin,
            admin_key,
            secret: args.target_secret,
            ca: args.target_ca,
            client_tls: args.target_client_tls,
        });
    }
    Ok(opts)
}
