//! `hongbao load`: the flags, turned into the coordinator's `LoadOptions`, or a QPS change
//! sent to a load already running.

use anyhow::Result;
use clap::Args;
use hongbao_sys::Stop;

#[derive(Args)]
pub struct LoadArgs {
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
    #[arg(long, default_value_t = hongbao_load::client::DEFAULT_NOTICE_POLL_SECS)]
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
    /// The control endpoint's key: made here by the load if missing, read by --set-qps
    /// (HONGBAO_LOAD_KEY overrides)
    #[arg(long, default_value = hongbao_load::cli::CONTROL_KEY_FILE)]
    control_key_file: std::path::PathBuf,
    /// Client processes: N or auto
    #[arg(long, default_value = "auto")]
    procs: String,
    /// Source addresses FIRST-LAST, e.g. 127.0.100.1-127.0.100.40 [default: enough from 127.0.100.1 for the port range]
    #[arg(long)]
    source_ips: Option<String>,
    /// Seconds of firing before stopping [default: until interrupted]
    #[arg(long)]
    duration: Option<u64>,
    /// New connections per second, all processes together (paced)
    #[arg(long, default_value_t = 20_000)]
    connect_rate: u64,
    /// paced: connect at --connect-rate; storm: every user at once, each that fails coming
    /// back on its own full-jitter back-off, as a crowd of apps does at midnight
    #[arg(long, default_value = "paced")]
    connect_mode: ConnectMode,
    /// Seconds a user waits for its connection (TCP connect, TLS handshake, WebSocket
    /// upgrade together) before it gives up and comes back on its back-off
    #[arg(long, default_value_t = hongbao_load::client::DEFAULT_CONNECT_TIMEOUT_MS / 1000)]
    connect_timeout_secs: u64,
    /// Secret for login tokens (must match the server's): HONGBAO_SECRET, or this flag
    /// for development only (a command line is seen by every local user)
    #[arg(long, env = "HONGBAO_SECRET", default_value = hongbao_proto::token::DEV_SECRET, hide_env_values = true)]
    secret: String,
    /// The kid the users' tokens name (the server's key for it must verify them)
    #[arg(long, default_value = hongbao_proto::token::DEFAULT_KID)]
    login_kid: String,
    /// The tokens' algorithm: HS256 (signed with the secret), ES256 or EdDSA (signed
    /// with --login-key-file)
    #[arg(long, default_value = "HS256")]
    login_alg: hongbao_proto::token::Alg,
    /// ES256 or EdDSA: the private key (PEM, PKCS#8) the users' tokens are signed with
    #[arg(long)]
    login_key_file: Option<std::path::PathBuf>,
    /// How long each user's token lives; the server asks for a fresh one before it ends
    #[arg(long, default_value_t = 3600)]
    token_ttl_secs: u64,
    /// Speak TLS to the server (every transport: frames, wss, https), trusting this CA (PEM)
    #[arg(long)]
    tls_ca: Option<std::path::PathBuf>,
    /// Report per-second counters to the hongbao monitor at this address
    #[arg(long)]
    monitor: Option<String>,
    /// The monitor's key file (HONGBAO_MONITOR_KEY overrides) [default: hongbao-monitor.key]
    #[arg(long)]
    monitor_key_file: Option<std::path::PathBuf>,
    /// A user answered "overloaded" skips its shakes for the wait the answer names, or for
    /// this many seconds when it names none (±50%); 0 keeps shaking
    #[arg(long, default_value_t = hongbao_load::client::DEFAULT_OVERLOAD_BACKOFF_SECS)]
    overload_backoff_secs: u32,
}

/// How the users connect (`--connect-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConnectMode {
    Paced,
    Storm,
}

pub fn run(args: LoadArgs) -> Result<()> {
    match (args.set_qps, &args.control) {
        (Some(qps), Some(control)) => {
            hongbao_load::cli::set_remote_qps(control, qps, &args.control_key_file)?
        }
        _ => hongbao_load::cli::run_cli(
            load_options(&args)?,
            args.control.clone(),
            &args.control_key_file,
            args.duration,
            &Stop::on_signals()?,
        )?,
    }
    Ok(())
}

/// `--procs` of `load` and `bench`: a count, or 0 for auto.
pub fn procs(value: &str) -> Result<u32> {
    match value {
        "auto" => Ok(0),
        n => n
            .parse()
            .map_err(|_| anyhow::anyhow!("--procs must be a number or auto, not {n:?}")),
    }
}

/// How the users' tokens are signed, from the flags.
fn signer(args: &LoadArgs) -> Result<hongbao_load::client::Signer> {
    use hongbao_proto::token::Alg;
    let private_key_pem = match (args.login_alg, &args.login_key_file) {
        (Alg::HS256, None) => String::new(),
        (Alg::HS256, Some(_)) => {
            anyhow::bail!("HS256 tokens are signed with the secret, not --login-key-file")
        }
        (_, Some(file)) => std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?,
        (alg, None) => anyhow::bail!("{} tokens need --login-key-file", alg.name()),
    };
    let signer = hongbao_load::client::Signer {
        kid: args.login_kid.clone(),
        alg: args.login_alg,
        private_key_pem,
        ttl_secs: args.token_ttl_secs,
    };
    // A key that cannot sign is said now, not in each client process.
    signer.minter(&args.secret)?;
    Ok(signer)
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
        connect_storm: args.connect_mode == ConnectMode::Storm,
        connect_timeout_ms: args.connect_timeout_secs.max(1) * 1000,
        secret: args.secret.clone(),
        signer: signer(args)?,
        tls_ca: match &args.tls_ca {
            Some(file) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?,
            ),
            None => None,
        },
        connect_at_epoch: false,
        monitor: args.monitor.clone(),
        monitor_key: None,
        monitor_key_file: args.monitor_key_file.clone(),
        overload_backoff_secs: args.overload_backoff_secs,
        http_connection: args.http_connection,
        notice_poll_secs: args.notice_poll_secs,
        hosts: Vec::new(),
        request: None,
        agents: None,
    })
}

/// `hongbao load-agent`: a load client on this machine for a coordinator elsewhere
/// (docs/agents.md).
#[derive(clap::Args)]
pub struct LoadAgentArgs {
    /// The coordinator's agent address, HOST:PORT (HOST as its certificate names it)
    #[arg(long)]
    coordinator: String,
    /// The CA file the coordinator's certificate is signed by (its agent directory's ca.pem)
    #[arg(long, default_value = hongbao_load::agent::link::CA_FILE)]
    ca: std::path::PathBuf,
    /// The run's agent key file (unless HONGBAO_AGENT_KEY is set)
    #[arg(long, default_value = hongbao_load::agent::link::KEY_FILE)]
    key_file: std::path::PathBuf,
    /// The slice to take, 0-based (a Kubernetes Indexed Job's JOB_COMPLETION_INDEX); none:
    /// any free one
    #[arg(long, env = "JOB_COMPLETION_INDEX")]
    index: Option<u32>,
    /// The agent's name in the coordinator's summary [default: the host name and pid]
    #[arg(long)]
    name: Option<String>,
    /// Seconds to keep trying to reach the coordinator
    #[arg(long, default_value_t = 120)]
    join_timeout: u64,
    /// Runs to take part in, one after another; 0: until stopped (a service's agent, or
    /// one for every stage of `hongbao capacity`)
    #[arg(long, default_value_t = 1)]
    runs: u32,
}

pub fn run_agent(args: LoadAgentArgs) -> Result<()> {
    let stop = hongbao_sys::Stop::on_signals()?;
    let name = args.name.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let options = hongbao_load::agent::AgentOptions {
        coordinator: args.coordinator,
        ca_file: args.ca,
        key_file: args.key_file,
        index: args.index,
        name,
        join_timeout: std::time::Duration::from_secs(args.join_timeout),
    };
    let mut done = 0;
    loop {
        let result = hongbao_load::agent::run(options.clone(), &stop);
        if args.runs == 1 || stop.requested() {
            return Ok(result?);
        }
        match result {
            Ok(()) => done += 1,
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "a run failed; joining the next");
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        if args.runs > 0 && done >= args.runs {
            return Ok(());
        }
    }
}
