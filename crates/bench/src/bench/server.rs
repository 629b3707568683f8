//! The bench's server: one local `hongbao serve` (`local.rs`), a lab of gateways, or a
//! running deployment it did not start (`--target-*`), talked to through its admin API, and sampled once a second for the server side of the
//! series and the per-connection memory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::admin::{admin_request, stats};
use super::inject::Injector;
use super::local::{this_binary, Local};
use super::options::{BenchOptions, Fault, SECRET};
use super::rolling::RolledGateway;
use hongbao_server::config::ServeFlags;
use hongbao_server::stats::Stats;
use hongbao_sys::clock::UnixTime;

use crate::{Error, Result};

/// A `hongbao serve` child (killed if still running when dropped), or with `--hosts N` a
/// lab of N gateways in cluster mode behind nginx (taken down when dropped).
pub(crate) struct Server {
    local: Option<Arc<Local>>,
    lab: Option<Arc<Mutex<hongbao_lab::Lab>>>,
    /// The lab's directory (its lab.json), read without the lab's lock.
    lab_dir: Option<PathBuf>,
    /// Where operators' requests go (the first gateway of a lab), as a URL's start:
    /// `http://HOST:PORT`, or a target's `https://…`.
    pub admin: String,
    /// Every gateway's admin URL, for the server side of the series.
    pub admins: Vec<String>,
    /// The operator key the server made (`DATA_DIR/admin.key`) or the lab did.
    pub key: String,
    pub listen: SocketAddr,
    /// The WebSocket listener, when asked for.
    pub ws: Option<SocketAddr>,
    /// The HTTP listener, when asked for.
    pub http: Option<SocketAddr>,
    /// With a lab: the hosts the load client processes run on.
    pub load_hosts: Vec<hongbao_lab::Host>,
    /// With a lab: the monitor, reachable from its hosts at the bridge's address.
    _monitor_relay: Option<hongbao_lab::Relay>,
    /// With a lab: the binary a rolling upgrade starts (`--upgrade-to`, else this one),
    /// and what each gateway's step of the last one did.
    upgrade_to: PathBuf,
    rolled: Arc<Mutex<Vec<RolledGateway>>>,
}

/// A lab's load hosts: as many as client processes, up to two — the load, like the
/// gateways, reaches nginx over the lab's network from hosts of its own.
const LOAD_HOSTS: usize = 2;

/// With agents started by the bench: up to this many load hosts, one agent on each (more
/// agents, round robin).
const AGENT_HOSTS: usize = 4;

/// The room of the lab PostgreSQL's tmpfs when `postgres-disk-full` may fill it: its
/// cluster (about 40 MiB), a WAL kept to 64 MiB, and room to spare for a run's rows.
const POSTGRES_DISK_BYTES: u64 = 512 << 20;

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(local) = &self.local {
            local.kill_for_good();
        }
        // A bench that fails while a fault's thread still holds the lab: taken down from
        // its lab.json all the same (by the last holder it already is, lab.json gone).
        drop(self.lab.take());
        if let Some(dir) = &self.lab_dir {
            if dir.join("lab.json").exists() {
                if let Err(e) = hongbao_lab::down(dir) {
                    tracing::error!(error = format!("{e:#}"), "taking the lab down failed");
                }
            }
        }
    }
}

impl Server {
    pub fn start(
        opts: &BenchOptions,
        data_dir: &Path,
        monitor: SocketAddr,
        monitor_key: &str,
    ) -> Result<Server> {
        if let Some(target) = &opts.target {
            return Ok(Server::target(target));
        }
        if opts.hosts > 0 {
            return Server::start_lab(opts, monitor, monitor_key);
        }
        let local = Local::start(opts, data_dir, monitor, monitor_key)?;
        let a = local.addrs.clone();
        let key_file = data_dir.join(hongbao_server::access::FIRST_KEY_FILE);
        let key = hongbao_server::access::read_secret_file(&key_file).map_err(|e| {
            Error::io(
                format!("reading the server's admin key {}", key_file.display()),
                e,
            )
        })?;
        // Over TLS the admin address speaks it too (trusted through `CA_ENV`).
        let scheme = if opts.tls_dir.is_some() {
            "https"
        } else {
            "http"
        };
        Ok(Server {
            key,
            local: Some(Arc::new(local)),
            lab: None,
            lab_dir: None,
            load_hosts: Vec::new(),
            _monitor_relay: None,
            upgrade_to: PathBuf::new(),
            rolled: Arc::default(),
            admins: vec![format!("{scheme}://{}", a.admin)],
            admin: format!("{scheme}://{}", a.admin),
            listen: a.listen,
            ws: a.ws,
            http: a.http,
        })
    }

    /// `opts.hosts` gateways in cluster mode on a lab's hosts, nginx in front: the load
    /// goes to nginx; the audit and campaigns to the first gateway. The gateways report
    /// to the bench's `monitor` through a relay on the lab's bridge.
    fn start_lab(opts: &BenchOptions, monitor: SocketAddr, monitor_key: &str) -> Result<Server> {
        let number = hongbao_lab::free_lab_number(std::process::id());
        let monitor_there =
            SocketAddr::from((hongbao_lab::netns::bridge_addr(number), monitor.port()));
        let lab_dir = opts.out.join("lab");
        let lab = hongbao_lab::Lab::up(hongbao_lab::LabPlan {
            lab: number,
            dir: std::path::absolute(&lab_dir)
                .map_err(|e| Error::io(format!("resolving {}", lab_dir.display()), e))?,
            gateways: opts.hosts,
            loads: match (&opts.agents, opts.procs) {
                // Agents started here: one load host each, up to four.
                (Some(a), _) if a.spawn => (a.count as usize).clamp(1, AGENT_HOSTS),
                (_, 0) => LOAD_HOSTS,
                (_, procs) => LOAD_HOSTS.min(procs as usize),
            },
            nginx: true,
            hongbao: match &opts.upgrade_from {
                Some(from) => from.clone(),
                None => this_binary()?,
            },
            serve: ServeFlags {
                secret: Some(SECRET.into()),
                monitor: Some(monitor_there.to_string()),
                ..opts.serve_settings()
            },
            monitor_key: Some(monitor_key.to_string()),
            postgres_disk: opts
                .faults()
                .any(Fault::needs_postgres_disk)
                .then_some(POSTGRES_DISK_BYTES),
            standby: opts.lab_standby(),
            shards: opts.shards,
        })
        .map_err(|e| Error::from(e).within("bringing the lab up"))?;
        // Interrupted (Ctrl-C, SIGTERM), the bench takes the lab down before it goes.
        let stop = hongbao_sys::Stop::on_signals()
            .map_err(|e| Error::io("watching for SIGINT and SIGTERM", e))?;
        let lab_dir = lab.plan.dir.clone();
        std::thread::spawn(move || loop {
            if stop.requested() {
                match hongbao_lab::down(&lab_dir) {
                    Ok(state) => tracing::warn!(lab = state.lab, "interrupted; the lab taken down"),
                    Err(e) => tracing::error!(
                        error = format!("{e:#}"),
                        "interrupted; taking the lab down failed"
                    ),
                }
                std::process::exit(130);
            }
            std::thread::sleep(Duration::from_millis(100));
        });
        let (tcp, http, ws) = lab
            .nginx_addrs()
            .ok_or_else(|| Error::Failed("the lab has no nginx".into()))?;
        let admins: Vec<String> = lab
            .gateways
            .iter()
            .map(|g| format!("http://{}", g.admin()))
            .collect();
        let load_hosts = lab.loads.clone();
        let relay = hongbao_lab::Relay::start(monitor_there, monitor)?;
        Ok(Server {
            key: lab.admin_key.clone(),
            load_hosts,
            _monitor_relay: Some(relay),
            upgrade_to: match &opts.upgrade_to {
                Some(to) => to.clone(),
                None => this_binary()?,
            },
            rolled: Arc::default(),
            local: None,
            admin: admins[0].clone(),
            admins,
            listen: tcp,
            ws: Some(ws),
            http: Some(http),
            lab_dir: Some(lab.plan.dir.clone()),
            lab: Some(Arc::new(Mutex::new(lab))),
        })
    }

    /// A running deployment: nothing started, nothing to stop; its clients' address for
    /// every transport (the one asked for is the one it has).
    fn target(target: &super::options::Target) -> Server {
        let admin = target.admin.trim_end_matches('/').to_string();
        Server {
            key: target.admin_key.clone(),
            local: None,
            lab: None,
            lab_dir: None,
            admins: vec![admin.clone()],
            admin,
            listen: target.clients,
            ws: Some(target.clients),
            http: Some(target.clients),
            load_hosts: Vec::new(),
            _monitor_relay: None,
            upgrade_to: PathBuf::new(),
            rolled: Arc::default(),
        }
    }

    /// Injects `fault` `after` from now, on a thread of its own; what it did comes back
    /// on the handle. `None` for a lab's fault without a lab.
    pub fn inject_later(
        &self,
        fault: Fault,
        after: Duration,
    ) -> Option<std::thread::JoinHandle<String>> {
        if fault.needs_lab() && self.lab.is_none() {
            return None;
        }
        let injector = self.injector();
        Some(std::thread::spawn(move || {
            std::thread::sleep(after);
            injector.inject(fault, 0, false).what
        }))
    }

    /// What can do faults to this server, for a thread of its own.
    pub fn injector(&self) -> Injector {
        Injector {
            key: self.key.clone(),
            lab: self.lab.clone(),
            local: self.local.clone(),
            admin: self.admin.clone(),
            upgrade_to: self.upgrade_to.clone(),
            rolled: self.rolled.clone(),
        }
    }

    /// Where agents started for this server dial in unless told: with a lab, its bridge's
    /// address (its hosts reach it); else loopback. Any port.
    pub fn agent_listen(&self) -> SocketAddr {
        match &self.lab {
            Some(lab) => {
                let number = lab.lock().unwrap().plan.lab;
                SocketAddr::from((hongbao_lab::netns::bridge_addr(number), 0))
            }
            None => SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }

    /// What each gateway's step of the last rolling upgrade did (a lab).
    pub fn rolled(&self) -> Vec<RolledGateway> {
        self.rolled.lock().unwrap().clone()
    }

    /// What the last `upgrade` did (one local server).
    pub fn last_upgrade(&self) -> Option<super::local::Upgraded> {
        self.local
            .as_ref()
            .and_then(|l| l.last_upgrade.lock().unwrap().clone())
    }

    /// The `hongbao serve` child's id (without a lab).
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.pid())
    }

    /// The lab (with `--hosts`).
    pub fn lab(&self) -> Option<Arc<Mutex<hongbao_lab::Lab>>> {
        self.lab.clone()
    }

    /// The lab's engine counters (with `--hosts`), `None` without a lab or if they cannot
    /// be read.
    /// A sharded lab's shake wins by shard, each by the Unix second its batch was formed
    /// in (none with one shard).
    pub fn wins_by_shard(&self) -> Option<Vec<std::collections::BTreeMap<u64, u64>>> {
        let lab = self.lab.as_ref()?.lock().unwrap();
        if lab.shard_count() < 2 {
            return None;
        }
        (0..lab.shard_count())
            .map(|k| lab.wins_by_second(k))
            .collect::<hongbao_lab::Result<Vec<_>>>()
            .map_err(|e| {
                tracing::warn!(error = format!("{e:#}"), "reading the shards' wins failed")
            })
            .ok()
    }

    /// A sharded lab's credits relayed between shards so far (none with one shard).
    pub fn outbox(&self) -> Option<super::summary::OutboxSummary> {
        let lab = self.lab.as_ref()?.lock().unwrap();
        if lab.shard_count() < 2 {
            return None;
        }
        let (lags, waiting) = lab
            .outbox_lags()
            .map_err(|e| tracing::warn!(error = format!("{e:#}"), "reading the outboxes failed"))
            .ok()?;
        let at = |q: f64| {
            lags.get(((lags.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or(0)
        };
        Some(super::summary::OutboxSummary {
            shards: lab.shard_count() as u32,
            credits: lags.len() as u64,
            lag_p50_ms: at(0.5),
            lag_p99_ms: at(0.99),
            lag_max_ms: lags.last().copied().unwrap_or(0),
            waiting,
        })
    }

    pub fn engine_counters(&self) -> Option<hongbao_lab::EngineCounters> {
        let lab = self.lab.as_ref()?.lock().unwrap();
        lab.engine_counters()
            .map_err(|e| {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "reading the engines' counters failed"
                )
            })
            .ok()
    }

    /// One sample over every gateway: rates, memory and CPU summed.
    pub fn sample(&self) -> Result<ServerSample> {
        sample_all(&self.admins, &self.key)
            .ok_or_else(|| Error::Failed("no /v1/stats from the gateways".into()))
    }

    /// `GET path` of the admin API. Asked again for up to 30 s while the answer is 503
    /// or no answer (a lab's ledger restarting).
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let url = format!("{}{path}", self.admin);
        self.retrying(path, || {
            admin_request("GET", &url, &self.key)
                .timeout(Duration::from_secs(15))
                .call()
                .map_err(Box::new)
        })
    }

    pub fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        let url = format!("{}{path}", self.admin);
        let body = serde_json::to_value(body).map_err(|e| Error::json(path, e))?;
        self.retrying(path, || {
            admin_request("POST", &url, &self.key)
                .timeout(Duration::from_secs(15))
                .send_json(body.clone())
                .map_err(Box::new)
        })
    }

    fn retrying<T: DeserializeOwned>(
        &self,
        path: &str,
        mut ask: impl FnMut() -> Result<ureq::Response, Box<ureq::Error>>,
    ) -> Result<T> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let error = match ask() {
                Ok(r) => return r.into_json().map_err(|e| Error::io(path, e)),
                Err(e) => *e,
            };
            match error {
                ureq::Error::Status(503, _) | ureq::Error::Transport(_)
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                ureq::Error::Status(code, r) => {
                    let body = r.into_string().map_err(|e| Error::io(path, e))?;
                    return Err(Error::Answer(format!("{path}: {code} {body}")));
                }
                e => return Err(e.into()),
            }
        }
    }

    /// Asks the server to stop (SIGINT) and waits for it; a lab is taken down.
    pub fn stop(mut self) -> Result<()> {
        // The last holder: the fault thread, if any, was joined.
        drop(self.lab.take());
        match &self.local {
            Some(local) => local.stop(),
            None => Ok(()),
        }
    }
}

/// `/v1/stats` of every gateway in `admins` that answers, summed into one sample.
pub(super) fn sample_all(admins: &[String], key: &str) -> Option<ServerSample> {
    let mut total: Option<ServerSample> = None;
    for admin in admins {
        // A gateway that does not answer (killed on purpose) is left out.
        let Some(v) = stats(admin, key) else {
            continue;
        };
        let s = sample(&v);
        total = Some(match total {
            None => s,
            Some(t) => ServerSample {
                at: t.at,
                shakes_per_sec: t.shakes_per_sec + s.shakes_per_sec,
                rss_bytes: t.rss_bytes + s.rss_bytes,
                cpu_ms: t.cpu_ms + s.cpu_ms,
                tls_handshaking: t.tls_handshaking + s.tls_handshaking,
            },
        });
    }
    total
}

/// One sample of the server's `/v1/stats`, taken once a second.
#[derive(Debug, Clone)]
pub(crate) struct ServerSample {
    /// When the server took it (its `unix_ms`).
    pub at: UnixTime,
    pub shakes_per_sec: u64,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
    /// TLS handshakes under way, every worker's.
    pub tls_handshaking: u64,
}

pub(super) fn sample(stats: &Stats) -> ServerSample {
    let workers = &stats.workers;
    let rss = workers.iter().map(|w| w.levels.rss_bytes).sum::<u64>() + stats.core.rss_bytes;
    let cpu = workers.iter().map(|w| w.cpu_ms).sum::<u64>() + stats.core.cpu_ms;
    ServerSample {
        at: UnixTime::from_millis(stats.unix_ms),
        shakes_per_sec: stats.per_sec.shakes,
        rss_bytes: rss,
        cpu_ms: cpu,
        tls_handshaking: stats.totals.levels.tls_handshaking,
    }
}
