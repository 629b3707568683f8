//! The bench's second step, its first phase: the load started (on agents, where asked)
//! and every user connected and logged in, with what the later steps measure against
//! read first — the load's baseline memory, and against a running deployment its
//! ledger's balances and operations before the run.

use std::time::Duration;

use hongbao_load::client::DEFAULT_OVERLOAD_BACKOFF_SECS;
use hongbao_load::coordinator::{AgentPlan, Load, LoadOptions};
use hongbao_load::report::Counters;
use hongbao_load::transport::Transport;
use hongbao_money::seam::Balances;
use hongbao_sys::clock::UnixTime;

use super::agents;
use super::history;
use super::options::SECRET;
use super::say::say;
use super::seconds::RunSeconds;
use super::setup::Bench;
use crate::{Error, Result};

/// How long before the load's epoch (when its clients start connecting) its baseline
/// memory is read: time to read every client process's usage while none has connected.
const BASELINE_BEFORE_EPOCH: Duration = Duration::from_millis(300);

/// The load, its users logged in, and what was read as the phases begin.
pub(super) struct Connected {
    pub load: Load,
    pub seconds: RunSeconds,
    pub start: AtStart,
}

/// What the later steps measure against, read before the steady phases.
pub(super) struct AtStart {
    /// Every user logged in within the connect timeout, and how long it took.
    pub all_connected: bool,
    pub connect_seconds: f64,
    /// The load's memory before its clients connected.
    pub load_rss_baseline_bytes: u64,
    /// The clients' totals and (with `--hosts`) the engines' counters as the phases
    /// begin: the engines' work is counted from here to the end.
    pub totals: Counters,
    pub engines: Option<hongbao_lab::EngineCounters>,
    /// Against a running deployment (`--target`): its balances before, so the check is
    /// of this run's; and what its ledger held, so the history check judges this run's
    /// operations.
    pub balances: Option<Balances>,
    pub history_scope: Option<history::Scope>,
}

impl Bench<'_> {
    /// Starts the load and waits for every user to log in (for a while).
    pub fn connect(&self) -> Result<Connected> {
        let (opts, server, monitor) = (self.opts, &self.server, &self.monitor);
        let agents = agents::plan(opts, server)?;
        if let Some(plan) = &agents {
            say(&format!(
                "bench: waiting for {} agents at {} (key {}, CA {}){}",
                plan.count,
                plan.listen,
                plan.dir.join(hongbao_load::agent::link::KEY_FILE).display(),
                plan.dir.join(hongbao_load::agent::link::CA_FILE).display(),
                if plan.spawn {
                    "; starting them here"
                } else {
                    ""
                }
            ));
        }
        let history_scope = match &opts.target {
            Some(_) => Some(history::Scope::before(server)?),
            None => None,
        };
        let balances_before: Option<Balances> = match &opts.target {
            Some(_) => Some(server.get("/v1/balances")?),
            None => None,
        };
        let load = Load::start(self.load_options(agents)?)?;
        let seconds = RunSeconds::of(&load);
        monitor.mark_at(seconds.epoch().as_millis(), "connect");
        say(&format!(
            "bench: {} load client processes; connecting {} users",
            load.procs(),
            opts.connections
        ));
        let to_epoch = seconds.epoch().since(UnixTime::now());
        std::thread::sleep(to_epoch.saturating_sub(BASELINE_BEFORE_EPOCH));
        let load_rss_baseline_bytes: u64 = load
            .pids()
            .iter()
            .map(|p| hongbao_sys::usage::usage_of(&p.to_string()).0)
            .sum();

        let connect_timeout = Duration::from_secs(60 + opts.connections / 1000);
        let all_connected = load.wait_logged_in(connect_timeout);
        let connect_seconds = UnixTime::now().since(seconds.epoch()).as_millis() as f64 / 1000.0;
        if !all_connected {
            say(&format!(
                "bench: only {} of {} logged in after {connect_seconds:.1} s",
                load.logged_in(),
                opts.connections
            ));
        } else {
            say(&format!(
                "bench: {} connected and logged in after {connect_seconds:.1} s",
                opts.connections
            ));
        }
        let engines_before = server.engine_counters();
        let totals_before = load.totals();
        Ok(Connected {
            load,
            seconds,
            start: AtStart {
                all_connected,
                connect_seconds,
                load_rss_baseline_bytes,
                totals: totals_before,
                engines: engines_before,
                balances: balances_before,
                history_scope,
            },
        })
    }

    /// The load the bench asks for: every user at QPS 0 until the first steady phase.
    fn load_options(&self, agents: Option<AgentPlan>) -> Result<LoadOptions> {
        let (opts, server, monitor) = (self.opts, &self.server, &self.monitor);
        Ok(LoadOptions {
            server: match opts.transport {
                Transport::Tcp => server.listen,
                Transport::Ws => server
                    .ws
                    .ok_or_else(|| Error::Failed("the server has no WebSocket listener".into()))?,
                Transport::Http => server
                    .http
                    .ok_or_else(|| Error::Failed("the server has no HTTP listener".into()))?,
            },
            transport: opts.transport,
            users: opts.connections,
            first_user: 1,
            qps: 0,
            procs: opts.procs,
            source_ips: None,
            connect_rate: opts.connect_rate,
            connect_storm: opts.connect_storm,
            connect_timeout_ms: hongbao_load::client::DEFAULT_CONNECT_TIMEOUT_MS,
            secret: opts
                .target
                .as_ref()
                .map_or(SECRET.to_string(), |t| t.secret.clone()),
            signer: Default::default(),
            tls_ca: opts.client_ca()?,
            connect_at_epoch: true,
            monitor: Some(monitor.addr().to_string()),
            monitor_key: Some(monitor.key().to_string()),
            monitor_key_file: None,
            overload_backoff_secs: DEFAULT_OVERLOAD_BACKOFF_SECS,
            http_connection: opts.http_connection,
            notice_poll_secs: opts.notice_poll_secs,
            hosts: server.load_hosts.clone(),
            request: None,
            agents,
        })
    }
}
