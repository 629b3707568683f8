//! `hongbao serve`: the supervisor process. It hosts the money backend (the embedded
//! core and its ledger), presence, and the admin API, and spawns the gateway workers
//! (this same binary, `hongbao worker`), each holding its own SO_REUSEPORT listeners and
//! one link back here.
//!
//! Its loop reads the links, hands operations to the money side and logins and chat to
//! presence, ticks the money side's clock, and routes whatever comes out of the money
//! side — which it only releases once durable — to the workers. It also watches the
//! worker processes (`workers.rs`): a worker that dies has its pool returned (when its
//! link closes) and is started again. `report.rs` turns what it knows into stats,
//! samples for the monitor and Prometheus text.
//!
//! - `workers`: worker processes and their links;
//! - `report`: `/v1/stats`, monitor samples, `/metrics`;
//! - `reload`: SIGHUP; `broadcast`: an operator's broadcast and its answer;
//! - `drain`: SIGTERM's drain; `upgrade`, `successor`, `listen`: an upgrade in place.

mod broadcast;
mod drain;
mod listen;
mod reload;
mod report;
mod successor;
pub mod upgrade;
mod workers;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::sync::mpsc::{sync_channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hongbao_sys::clock::{unix_ms, unix_us, UnixTime};

use hongbao_money::seam::{AdminAnswer, AdminRequest as MoneyRequest, Op, Origin, Output};
use hongbao_money::{error as money, ConnId, Money, UserId, WorkerId};
use hongbao_sys::notify::Notifier;
use hongbao_sys::{limits, net, Reload, Stop};
use hongbao_telemetry::sample;
use hongbao_telemetry::Reporter;
use mio::{Events, Poll, Token, Waker};
use serde_json::json;
use slab::Slab;

use hongbao_http::Response;
use hongbao_money::seam::LedgerRead;

use crate::access::{self, Door};
use crate::admin::{self, AdminCommand, AdminRequest};
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::limits::{Action, Users};
use crate::link::{self, ToCore, ToWorker, WorkerConfig};
use hongbao_cluster::PgAccess;
use hongbao_embedded::access::SqliteAccess;
use hongbao_embedded::core::CoreConfig;
use hongbao_embedded::ledger::{GroupCommit, Reader};
use hongbao_embedded::{Embedded, EmbeddedConfig};
use hongbao_http::access::BrowserGuard;
use hongbao_money::access::AccessStore;
use hongbao_money::presence::{Delivery, Presence};

use broadcast::PendingBroadcast;
use listen::Kind;
use reload::{login_setup, revocation_horizon};
use workers::{Link, WorkerProc};

const WAKER: Token = Token(usize::MAX - 2);

/// How long after a whole second the supervisor reports it: the workers report theirs
/// about 20 ms after the second.
const SECOND_REPORT_DELAY: Duration = Duration::from_millis(150);

struct Supervisor {
    cfg: ServeConfig,
    money: Box<dyn Money>,
    tick_interval: Duration,
    presence: Presence,
    /// Each user's sends, opens, chats, notices and logins (`limits.rs`).
    users: Users,
    poll: Poll,
    links: Slab<Link>,
    worker_links: HashMap<WorkerId, usize>,
    workers: BTreeMap<WorkerId, WorkerProc>,
    worker_cfg: WorkerConfig,
    /// The listening sockets the workers inherit (`listen.rs`).
    sockets: listen::Sockets,
    /// How many workers this server runs.
    workers_wanted: usize,
    client_addr: SocketAddr,
    ws_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    admin_rx: Receiver<AdminCommand>,
    /// Admin answers held until the ledger has committed what they saw.
    deferred_admin: VecDeque<(u64, Sender<Response>, Response)>,
    /// Admin requests handed to the money side, by ticket: where the answer goes, and
    /// whether it creates (201) or reads (200).
    tickets: HashMap<u64, (Sender<Response>, bool)>,
    next_ticket: u64,
    report: report::Report,
    monitor: Option<Reporter>,
    next_broadcast: u64,
    broadcasts: BTreeMap<u64, PendingBroadcast>,
    shutting_down: bool,
    /// Draining (SIGTERM): when it began, and when it is given up on.
    draining: Option<(Instant, Instant)>,
    stop: Stop,
    reload: Reload,
    /// The admin address's TLS config, replaced on reload.
    admin_tls: Option<hongbao_http::tls::Reloadable>,
    /// What the probes on the admin address are told, kept by the loop.
    health: Arc<Health>,
    /// systemd's notify socket, when it started us (`Type=notify`).
    notifier: Option<Notifier>,
    /// The workers linked when systemd was last told, once ready.
    told_linked: Option<usize>,
    /// The admin door's refusals, counted for `/metrics`.
    admin_refusals: Arc<access::Refusals>,
    /// The admin server, until an upgrade's successor answers on its socket.
    admin: Option<admin::AdminServer>,
    /// A copy of the admin socket, to hand over in an upgrade.
    admin_socket: Option<std::net::TcpListener>,
    /// A copy of the data directory's lock, to hand over in an upgrade.
    lock_fd: std::os::fd::OwnedFd,
    /// `DIR/upgrade.sock`, where `serve --upgrade` asks for this server (`upgrade.rs`).
    upgrade_listener: Option<mio::net::UnixListener>,
    /// The server taking this one over, once it has connected.
    successor: Option<upgrade::Successor>,
    /// The server this one is taking over, until the ledger is here (`successor.rs`).
    predecessor: Option<successor::Predecessor>,
    /// SIGUSR2: start this binary (the file as it is now) with `--upgrade`.
    upgrade_signal: Reload,
    exe: Option<std::path::PathBuf>,
    /// The upgrade SIGUSR2 started, waited for if it ends first.
    spawned: Option<std::process::Child>,
    /// Whether the server being taken over was told this one is ready.
    told_predecessor: bool,
}

/// Runs `hongbao serve` until `stop`. Prints one "ready" line on stdout with the bound
/// addresses once every worker has connected.
///
/// `upgrade`: take over the server running on the same data directory instead
/// (`upgrade.rs`): its sockets, then its ledger, once it has drained.
pub fn run(cfg: ServeConfig, stop: Stop, upgrade: bool) -> Result<()> {
    // systemd is told when this serves and when it stops (`health.rs`); a variable that
    // names nothing reachable is logged, not fatal.
    let notifier = Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET cannot be used; systemd will not be told");
        None
    });
    // Before anything is made: a port another server holds is refused, saying which
    // process holds it (`placeholder`), and so is a data directory another process is
    // using (its lock is held until this process ends).
    cfg.check_exposure()?;
    if upgrade && cfg.cluster()? {
        return Err(Error::config(
            "serve --upgrade takes over an embedded server; in cluster mode, upgrade one \
             gateway at a time behind nginx (SIGTERM drains it)"
                .to_string(),
        ));
    }
    // An upgrade is handed the sockets and the lock of the server it replaces.
    let mut inherited = upgrade
        .then(|| successor::take_over(&cfg.data_dir))
        .transpose()?;
    for (addr, what) in [
        (&cfg.listen, "client"),
        (&cfg.ws_listen, "WebSocket"),
        (&cfg.http_listen, "HTTP"),
        (&cfg.admin, "admin"),
    ] {
        if let (Ok(addr), None) = (addr.parse::<SocketAddr>(), &inherited) {
            net::ensure_free(addr).map_err(|e| Error::io(format!("the {what} address"), e))?;
        }
    }
    let data_dir_lock = match inherited.as_mut() {
        Some(inherited) => inherited.lock.take().expect("taken once"),
        None => hongbao_sys::dirlock::DirLock::acquire(&cfg.data_dir, "hongbao serve")
            .map_err(|e| Error::config(e.to_string()))?,
    };
    let lock_fd = data_dir_lock
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("the data directory's lock", e))?;
    let login = login_setup(&cfg)?;
    let mut tls = cfg.tls_pem()?;
    // An upgrade keeps the old server's ticket key: its clients resume their sessions.
    if let (Some(pem), Some(key)) = (tls.as_mut(), inherited.as_ref().and_then(|i| i.ticket_key)) {
        pem.ticket_key = key;
    }
    // The admin address speaks TLS with the same certificate, reloaded with it.
    let admin_tls = match &tls {
        Some(pem) => Some(hongbao_http::tls::Reloadable::new(
            hongbao_http::tls::server_config(&pem.cert, &pem.key, &[hongbao_http::tls::ALPN_HTTP])
                .map_err(Error::config)?,
        )),
        None => None,
    };
    let nofile = limits::raise_nofile_limit();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let worker_count = cfg.worker_count(nofile, cores)?;
    if cfg.dev_secret_in_use() {
        tracing::warn!(
            "login tokens are signed with the built-in development secret: listening on \
             loopback only; give a secret (HONGBAO_SECRET or secret_file) or [[login_keys]] \
             for real use"
        );
    }

    let poll = Poll::new().map_err(|e| Error::io("creating the event loop", e))?;
    let waker =
        Arc::new(Waker::new(poll.registry(), WAKER).map_err(|e| Error::io("creating a waker", e))?);
    let wake = waker.clone();
    let wake_money: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
        let _ = wake.wake();
    });
    let embedded_cfg = || EmbeddedConfig {
        data_dir: cfg.data_dir.clone(),
        core: CoreConfig {
            packet_ttl_ms: cfg.packet_ttl_secs * 1000,
            rng_seed: None,
        },
        group: GroupCommit {
            commit_interval: Duration::from_millis(cfg.commit_interval_ms),
            max_batch: cfg.commit_max_batch.max(1),
        },
    };
    let mut predecessor = None;
    let (money, reader, replayed, tick_interval): (Box<dyn Money>, _, u64, Duration) =
        if let Some(inherited) = inherited.as_mut() {
            let link = inherited.link.take().expect("taken once");
            let rest = std::mem::take(&mut inherited.rest);
            let (money, handle) = successor::Handover::start(
                link,
                rest,
                inherited.old_pid,
                embedded_cfg(),
                wake_money,
            )?;
            let reader = successor::ReaderAcross::new(&cfg.data_dir.join("ledger.sqlite"), &handle);
            let reader = Some(Box::new(reader) as Box<dyn LedgerRead>);
            predecessor = Some(handle);
            let tick = Duration::from_millis(hongbao_embedded::core::TICK_INTERVAL_MS);
            (Box::new(money), reader, 0, tick)
        } else if cfg.cluster()? {
            let host = if cfg.host_name.is_empty() {
                format!("{}:{}", hostname(), cfg.listen)
            } else {
                cfg.host_name.clone()
            };
            let cluster = hongbao_cluster::Cluster::open(
                hongbao_cluster::ClusterConfig {
                    redis: cfg.redis.split(',').map(|s| s.trim().to_string()).collect(),
                    redis_password: cfg.redis_password.clone(),
                    postgres: pg_target(&cfg),
                    host,
                    packet_ttl_ms: cfg.packet_ttl_secs * 1000,
                    commit_window: Duration::from_millis(cfg.commit_window_ms),
                    max_batch: cfg.commit_max_batch.max(1),
                },
                wake_money,
            )
            .map_err(|e| e.context("cluster mode"))?;
            let reader = Some(cluster.reader());
            (Box::new(cluster), reader, 0, Duration::from_millis(10))
        } else {
            let (money, replayed) = Embedded::open(embedded_cfg(), unix_ms(), wake_money)?;
            let reader = Reader::open(money.ledger_path())
                .map(|r| Box::new(r) as Box<dyn LedgerRead>)
                .map_err(|e| tracing::error!(error = %e, "no ledger reader for the admin API"))
                .ok();
            let tick = Duration::from_millis(money.tick_interval_ms());
            (Box::new(money), reader, replayed, tick)
        };

    // Who may speak for the server: keys and their log beside the money.
    let access: Arc<dyn AccessStore> = if cfg.cluster()? {
        Arc::new(PgAccess::connect(&pg_target(&cfg)).map_err(|e| e.context("cluster mode"))?)
    } else {
        Arc::new(SqliteAccess::open(&cfg.data_dir)?)
    };
    if let Some(path) = access::ensure_first_key(access.as_ref(), &cfg.data_dir)? {
        tracing::warn!(
            file = %path.display(),
            "no admin key existed: made an operator key; the admin API and console take it \
             (Authorization: Bearer $(cat FILE)); hongbao admin-key makes more"
        );
    }

    let sockets = match inherited.as_mut() {
        Some(inherited) => listen::Sockets::adopt(
            &inherited.groups,
            std::mem::take(&mut inherited.sockets),
            worker_count,
        )?,
        None => listen::Sockets::bind(
            &[
                (Kind::Client, &cfg.listen),
                (Kind::WebSocket, &cfg.ws_listen),
                (Kind::Http, &cfg.http_listen),
            ],
            worker_count,
        )?,
    };
    let client_addr = sockets
        .addr(Kind::Client)
        .expect("a client address is required");
    let ws_addr = sockets.addr(Kind::WebSocket);
    let http_addr = sockets.addr(Kind::Http);

    let (admin_tx, admin_rx) = sync_channel(256);
    let (hosts, origins) = (cfg.admin_hosts.clone(), cfg.admin_origins.clone());
    let horizon = revocation_horizon(&cfg);
    // Its own stop: it watches on through a drain, and ends with the server.
    let watching = Stop::new();
    let revocations = admin::watch_revocations(
        access.clone(),
        horizon,
        admin_tx.clone(),
        waker.clone(),
        watching.clone(),
    );
    // Over https the console's cookie is `Secure`: a browser never sends it in clear.
    let secure_cookies = admin_tls.is_some();
    let refusals = Arc::new(access::Refusals::default());
    let door_refusals = refusals.clone();
    let door = move |bound| {
        let guard = BrowserGuard::new(bound, &hosts, &origins);
        Door::new(access, guard, secure_cookies, door_refusals)
    };
    let health = Arc::new(Health::new());
    let admin_listener = match inherited.as_mut() {
        Some(inherited) => inherited.admin.take().expect("taken once"),
        None => admin::bind(&cfg.admin)?,
    };
    let admin_socket = admin_listener
        .try_clone()
        .map_err(|e| Error::io("the admin socket", e))?;
    let admin = admin::start(
        admin_listener,
        door,
        health.clone(),
        admin_tls.clone(),
        reader,
        admin_tx,
        waker.clone(),
    )?;
    let admin_addr = admin.addr();

    let worker_cfg = WorkerConfig {
        login,
        tls,
        shake_limit: cfg.user_limits.shake,
        trusted_proxies: cfg.trusted_proxies.clone(),
        max_shakes_per_sec: cfg.max_shake_qps.div_ceil(worker_count as u32),
        max_connections: limits::sockets_per_process(nofile) as u32,
        max_unauthenticated: cfg.max_unauthenticated,
        max_unauthenticated_per_source: cfg.max_unauthenticated_per_source,
        max_tls_handshakes: cfg.tls_handshakes_per_worker(worker_count, cores),
        tls_handshake_timeout_secs: cfg.tls_handshake_timeout_secs.max(1),
        tls_accept_queue_secs: cfg.tls_accept_queue_secs.max(1),
        login_timeout_secs: cfg.login_timeout_secs,
        idle_timeout_secs: cfg.idle_timeout_secs,
        http_keepalive_secs: cfg.http_keepalive_secs,
        max_output_bytes: cfg.max_output_bytes,
        max_queue_ms: cfg.max_queue_ms,
        ready_order: cfg.ready_order,
        broadcast_yield_ms: cfg.broadcast_yield_ms,
    };
    let monitor = (!cfg.monitor.is_empty()).then(|| {
        Reporter::start(
            &cfg.monitor,
            Reporter::key_from(cfg.monitor_key_file.clone()),
        )
    });
    let users = Users::new(cfg.user_limits.clone());
    let mut sup = Supervisor {
        cfg,
        money,
        tick_interval,
        presence: Presence::default(),
        users,
        poll,
        links: Slab::new(),
        worker_links: HashMap::new(),
        workers: BTreeMap::new(),
        worker_cfg,
        sockets,
        workers_wanted: worker_count,
        client_addr,
        ws_addr,
        http_addr,
        admin_rx,
        deferred_admin: VecDeque::new(),
        tickets: HashMap::new(),
        next_ticket: 1,
        report: report::Report::new(sample::interface_for(client_addr.ip())),
        monitor,
        next_broadcast: 1,
        broadcasts: BTreeMap::new(),
        shutting_down: false,
        draining: None,
        stop,
        reload: Reload::on_sighup().map_err(|e| Error::io("handling SIGHUP", e))?,
        admin_tls,
        health,
        notifier,
        told_linked: None,
        admin_refusals: refusals,
        admin: Some(admin),
        admin_socket: Some(admin_socket),
        lock_fd,
        upgrade_listener: None,
        successor: None,
        predecessor,
        upgrade_signal: Reload::on_signal(hongbao_sys::stop::SIGUSR2)
            .map_err(|e| Error::io("handling SIGUSR2", e))?,
        exe: std::env::current_exe().ok(),
        spawned: None,
        told_predecessor: false,
    };
    if sup.predecessor.is_none() {
        sup.listen_for_upgrades();
    }
    for w in 0..worker_count as WorkerId {
        let child = sup.spawn_worker(w)?;
        sup.workers.insert(w, WorkerProc::new(child));
    }
    let result = sup.event_loop(admin_addr, replayed);
    sup.health.stopping(result.is_err());
    sup.tell_systemd(|n| n.stopping("stopping"));
    // An upgrade's last step comes first, for the commits paused meanwhile.
    let handed_over = sup.successor.is_some().then(|| sup.hand_over_last());
    sup.stop_workers();
    if let Some(monitor) = sup.monitor.clone() {
        // The last second's counts, so the monitor's series adds up to the totals.
        monitor.send_final(&sup.sample(unix_ms() / 1000));
    }
    drop(sup.admin.take());
    watching.request();
    let _ = revocations.join();
    let flushed = match handed_over {
        Some(flushed) => flushed,
        None => {
            let flushed = sup.money.finish();
            // Every connection closed: the ledger left as one file (`keep_wal`).
            hongbao_embedded::ledger::tidy_wal(&sup.cfg.data_dir);
            if sup.upgrade_listener.take().is_some() {
                let _ = std::fs::remove_file(upgrade::socket_path(&sup.cfg.data_dir));
            }
            flushed
        }
    };
    drop(data_dir_lock);
    result?;
    flushed?;
    tracing::info!(ledger_seq = sup.money.snapshot().ledger_seq, "stopped");
    Ok(())
}

fn pg_target(cfg: &ServeConfig) -> hongbao_cluster::PgTarget {
    hongbao_cluster::PgTarget {
        url: cfg.postgres.clone(),
        password: cfg.postgres_password.clone(),
        ca: cfg.engines_ca_pem.clone(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}

fn origin(worker: WorkerId, conn: ConnId, request: u32, user: UserId) -> Origin {
    Origin {
        worker,
        conn,
        request,
        user,
    }
}

impl Supervisor {
    fn event_loop(&mut self, admin_addr: SocketAddr, replayed: u64) -> Result<()> {
        let mut events = Events::with_capacity(256);
        let mut next_tick = Instant::now();
        // Just after each whole wall-clock second, once the workers' reports are in.
        let mut next_second =
            Instant::now() + UnixTime::now().until_next_second() + SECOND_REPORT_DELAY;
        let mut next_check = Instant::now();
        let mut ready_said = false;
        let mut outs = Vec::new();
        loop {
            let timeout = next_tick.saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(Error::io("waiting for events", e));
                }
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    upgrade::UPGRADE_LISTENER => self.accept_successor(),
                    upgrade::UPGRADE_LINK => self.read_successor(unix_ms()),
                    Token(key) => self.read_link(key),
                }
            }
            while let Ok(cmd) = self.admin_rx.try_recv() {
                self.admin(cmd);
            }
            if self.reload.take() {
                self.tell_systemd(|n| n.reloading());
                self.reload_config();
                let status = self.status_line();
                self.tell_systemd(|n| n.ready(&status));
            }
            let now = Instant::now();
            if now >= next_tick {
                if self.ticking() {
                    self.money.tick(unix_ms());
                }
                next_tick = now + self.tick_interval;
            }
            if now >= next_second {
                next_second = now + UnixTime::now().until_next_second() + SECOND_REPORT_DELAY;
                self.report.roll_rates(&self.replies());
                self.log_token_refusals();
                let horizon = revocation_horizon(&self.cfg);
                self.presence.forget_revocations(unix_ms() / 1000, horizon);
                self.users.forget_full(unix_us());
                if let Some(monitor) = self.monitor.clone() {
                    let second = (unix_ms() / 1000).saturating_sub(1);
                    monitor.send(self.sample(second));
                }
                self.answer_broadcasts(true);
            }
            if now >= next_check {
                next_check = now + Duration::from_millis(100);
                self.check_workers()?;
            }
            self.health
                .turn(now, self.worker_links.len(), self.workers.len());
            self.health
                .ledger_failing(self.money.commits_failing().is_some());
            if !ready_said && self.worker_links.len() == self.workers.len() {
                ready_said = true;
                self.health.serving();
                let ws = self.ws_addr.map_or(String::new(), |a| format!(" ws={a}"));
                let http = self
                    .http_addr
                    .map_or(String::new(), |a| format!(" http={a}"));
                println!(
                    "hongbao serve ready: listen={} admin={}{ws}{http} workers={} data_dir={} replayed_events={}",
                    self.client_addr,
                    admin_addr,
                    self.workers.len(),
                    self.cfg.data_dir.display(),
                    replayed
                );
                let _ = std::io::stdout().flush();
                // Every worker has bound its listeners and was welcomed: systemd may start
                // what is ordered after us.
                let status = self.status_line();
                self.tell_systemd(|n| n.ready(&status));
                self.told_linked = Some(self.worker_links.len());
            } else if self
                .told_linked
                .is_some_and(|told| told != self.worker_links.len())
            {
                self.told_linked = Some(self.worker_links.len());
                let status = self.status_line();
                self.tell_systemd(|n| n.status(&status));
            }
            self.route_outputs(&mut outs);
            self.flush_links();
            self.flush_successor();
            if let Some(why) = self.money.failure() {
                return Err(money::Error::unavailable("the ledger", why).into());
            }
            if self.stop.requested() && !self.draining(now) {
                return Ok(());
            }
            if self.upgrade_signal.take() {
                self.start_successor();
            }
            self.upgrade_progress(ready_said);
            if self.upgrade_turn(now) == upgrade::Stage::HandOver {
                return Ok(());
            }
        }
    }

    /// What `systemctl status` shows while serving: where, and the workers up.
    fn status_line(&self) -> String {
        format!(
            "serving: listen={} workers {} of {} up",
            self.client_addr,
            self.worker_links.len(),
            self.workers.len()
        )
    }

    /// Sends systemd what `say` says, when it is listening; a failure is logged (a
    /// manager that cannot be told is no reason to stop serving).
    fn tell_systemd(&self, say: impl FnOnce(&Notifier) -> std::io::Result<()>) {
        if let Some(notifier) = &self.notifier {
            if let Err(e) = say(notifier) {
                tracing::warn!(socket = notifier.address(), error = %e, "telling systemd failed");
            }
        }
    }

    /// Whatever the money side has made durable goes out: replies and deals to their
    /// workers, notices through presence, answers to the operators who asked.
    fn route_outputs(&mut self, outs: &mut Vec<Output>) {
        self.money.drain(outs);
        for out in outs.drain(..) {
            let Some(out) = self.for_successor(out) else {
                continue;
            };
            match out {
                Output::Reply { to, reply } => {
                    let msg = ToWorker::Reply {
                        conn: to.conn,
                        req: to.request,
                        reply,
                    };
                    self.tell_worker(to.worker, &msg);
                }
                Output::Notice { user, notice } => {
                    if let Some(delivery) = self.presence.notice(user, notice) {
                        self.deliver(delivery);
                    }
                }
                Output::Deal { worker, packets } => {
                    self.tell_worker(worker, &ToWorker::Deal { packets });
                }
                Output::Admin { ticket, answer } => {
                    if let Some((reply, creates)) = self.tickets.remove(&ticket) {
                        let _ = reply.send(admin_answer(answer, creates));
                    }
                }
                Output::Push { user, push } => {
                    if let Some(to) = self.presence.route(user) {
                        self.deliver(Delivery::Push {
                            to,
                            push,
                            close: false,
                        });
                    }
                }
                Output::Broadcast {
                    server_time_us,
                    text,
                } => {
                    // From another host: every worker here sends it; nobody waits for a count.
                    let msg = ToWorker::Broadcast {
                        id: 0,
                        server_time_us,
                        text,
                    };
                    for &key in self.worker_links.values() {
                        link::encode(&msg, &mut self.links[key].outbuf);
                    }
                }
            }
        }
        let committed = self.money.snapshot().committed_seq;
        while let Some((tag, _, _)) = self.deferred_admin.front() {
            if *tag > committed {
                break;
            }
            let (_, reply, response) = self.deferred_admin.pop_front().expect("looked at");
            let _ = reply.send(response);
        }
    }

    fn tell_worker(&mut self, worker: WorkerId, msg: &ToWorker) {
        if let Some(link) = self
            .worker_links
            .get(&worker)
            .and_then(|k| self.links.get_mut(*k))
        {
            link::encode(msg, &mut link.outbuf);
        }
    }

    fn deliver(&mut self, delivery: Delivery) {
        let (worker, msg) = match delivery {
            Delivery::Reply { to, request, reply } => (
                to.worker,
                ToWorker::Reply {
                    conn: to.conn,
                    req: request,
                    reply,
                },
            ),
            Delivery::Push { to, push, close } => (
                to.worker,
                ToWorker::Push {
                    conn: to.conn,
                    push,
                    close,
                },
            ),
        };
        self.tell_worker(worker, &msg);
    }

    fn on_worker_message(&mut self, w: WorkerId, msg: ToCore, now: u64) {
        match msg {
            ToCore::Hello { .. } => {}
            ToCore::Online {
                conn,
                req,
                user,
                issued,
            } => {
                let origin = origin(w, conn, req, user);
                if let Err(refused) = self.users.take(user, Action::Login, unix_us()) {
                    // Its worker let it in: it is not logged in after all.
                    self.refuse(origin, refused);
                    self.tell_worker(w, &ToWorker::LoginRefused { conn });
                    return;
                }
                match self.presence.login(origin, issued) {
                    Ok(deliveries) => {
                        for delivery in deliveries {
                            self.deliver(delivery);
                        }
                        self.money.online(user);
                        self.money.submit(now, origin, Op::LoggedIn);
                    }
                    Err(refused) => {
                        for delivery in refused {
                            self.deliver(delivery);
                        }
                    }
                }
            }
            ToCore::Refreshed { conn, user, issued } => {
                self.presence.refreshed(w, conn, user, issued);
            }
            ToCore::Offline { conn, user } => {
                self.presence.offline(w, conn, user);
                if self.presence.route(user).is_none() {
                    self.money.offline(user);
                }
            }
            ToCore::Op {
                conn,
                req,
                user,
                op,
            } => {
                let origin = origin(w, conn, req, user);
                let action = match &op {
                    Op::Send { recipients, .. } => Some(Action::Send {
                        recipients: recipients.len() as u32,
                    }),
                    Op::Open { .. } => Some(Action::Open),
                    _ => None,
                };
                if let Some(action) = action {
                    if let Err(refused) = self.users.take(user, action, unix_us()) {
                        return self.refuse(origin, refused);
                    }
                }
                self.money.submit(now, origin, op);
            }
            ToCore::Chat {
                conn,
                req,
                user,
                to_user,
                text,
            } => {
                let from = origin(w, conn, req, user);
                if let Err(refused) = self.users.take(user, Action::Chat, unix_us()) {
                    return self.refuse(from, refused);
                }
                let here = UserId::new(to_user).and_then(|u| self.presence.route(u));
                if here.is_none() && self.money.chat_elsewhere(from, to_user, text.clone()) {
                    return; // answered through the money side's outputs
                }
                for delivery in self.presence.chat(from, to_user, text) {
                    self.deliver(delivery);
                }
            }
            ToCore::BroadcastTaken { id, connections } => {
                if let Some(b) = self.broadcasts.get_mut(&id) {
                    b.waiting.retain(|&x| x != w);
                    b.connections += connections;
                }
                self.answer_broadcasts(false);
            }
            ToCore::Stats(stats) => {
                self.report.worker_latency(&stats.shake_latency_us);
                if let Some(proc_) = self.workers.get_mut(&w) {
                    proc_.previous = proc_.latest.take();
                    proc_.latest = Some(*stats);
                }
            }
        }
    }

    // ----- admin -------------------------------------------------------------------------

    fn admin(&mut self, cmd: AdminCommand) {
        let response = match cmd.request {
            AdminRequest::Money(request) => {
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                let creates = matches!(
                    request,
                    MoneyRequest::CreateShake { .. } | MoneyRequest::CreateSend { .. }
                );
                self.tickets.insert(ticket, (cmd.reply, creates));
                self.money.admin(unix_ms(), ticket, request);
                return;
            }
            AdminRequest::Broadcast(req) => return self.broadcast(req.text, cmd.reply),
            AdminRequest::Revoked { user, at } => self.revoked(user, at),
            AdminRequest::Stats => Response::json(200, &self.stats()),
            AdminRequest::Metrics => {
                Response::new(200, hongbao_telemetry::prom::CONTENT_TYPE, self.metrics())
            }
        };
        // Reads are answered once what they saw is durable, like everything else.
        let seq = self.money.snapshot().ledger_seq;
        self.deferred_admin.push_back((seq, cmd.reply, response));
    }

    /// Tokens of `user` issued before `at` are refused from now on: presence refuses
    /// them at login and kicks the user's connection here; every worker refuses them
    /// (logins, bearers) from its next read of the link. Applied twice (the API, then
    /// the store's watcher), it kicks once.
    fn revoked(&mut self, user: u64, at: u64) -> Response {
        let Some(user_id) = UserId::new(user) else {
            return Response::error(400, "user 0 has no tokens");
        };
        let mut kicked = 0;
        if let Some(kick) = self.presence.revoke(user_id, at) {
            kicked += 1;
            self.deliver(kick);
            self.money.offline(user_id);
        }
        let msg = ToWorker::Revoke { user: user_id, at };
        for &key in self.worker_links.values() {
            link::encode(&msg, &mut self.links[key].outbuf);
        }
        tracing::info!(user, revoked_before = at, kicked, "tokens revoked");
        Response::json(
            200,
            &json!({"user": user, "revoked_before": at, "kicked": kicked}),
        )
    }

    /// Answers `origin`'s request `rate-limited`: over one of its user's limits.
    fn refuse(&mut self, origin: Origin, refused: crate::limits::Refused) {
        let reply = ToWorker::Reply {
            conn: origin.conn,
            req: origin.request,
            reply: hongbao_money::Reply::RateLimited {
                retry_after_ms: refused.retry_after_ms,
                text: refused.text,
            },
        };
        self.tell_worker(origin.worker, &reply);
    }

    /// The welcome a worker gets: the configuration, with the revocations in force.
    fn welcome(&self) -> WorkerConfig {
        let mut cfg = self.worker_cfg.clone();
        cfg.login.revoked = self.presence.revocations();
        cfg
    }
}

/// The HTTP answer to what the money side said.
fn admin_answer(answer: AdminAnswer, creates: bool) -> Response {
    match answer {
        AdminAnswer::Campaign(status) => Response::json(if creates { 201 } else { 200 }, &status),
        AdminAnswer::NoCampaign(id) => Response::error(404, format!("no campaign {id}")),
        AdminAnswer::Campaigns(all) => Response::json(200, &all),
        AdminAnswer::Audit(audit) => Response::json(200, &audit),
        AdminAnswer::Refused(why) => Response::error(400, why),
        AdminAnswer::Unavailable(why) => Response::error(503, why),
    }
}
