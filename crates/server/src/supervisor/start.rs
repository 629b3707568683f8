//! The start of `hongbao serve`: the configuration checked, the money backend opened
//! (the embedded ledger, cluster mode's engines, or the old server's in an upgrade), the
//! listening sockets bound, the admin address served, and the supervisor made and run.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Duration;

use hongbao_cluster::PgAccess;
use hongbao_embedded::access::SqliteAccess;
use hongbao_embedded::core::CoreConfig;
use hongbao_embedded::ledger::{GroupCommit, Reader};
use hongbao_embedded::{Embedded, EmbeddedConfig};
use hongbao_http::access::BrowserGuard;
use hongbao_money::access::AccessStore;
use hongbao_money::presence::Presence;
use hongbao_money::seam::LedgerRead;
use hongbao_money::{Money, WorkerId};
use hongbao_sys::clock::{unix_ms, Clock, UnixTime, Uptime};
use hongbao_sys::notify::Notifier;
use hongbao_sys::{limits, net, Reload, Stop};
use hongbao_telemetry::sample;
use hongbao_telemetry::Reporter;
use mio::{Poll, Waker};
use slab::Slab;

use super::event_loop::{Supervisor, TurnClock, WAKER};
use super::listen::Kind;
use super::procs::WorkerProc;
use super::reload::login_setup;
use super::timers::Timers;
use super::{listen, successor, tallies, upgrade};
use crate::access::{self, Door};
use crate::admin;
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::limits::Users;
use crate::link::WorkerConfig;

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
    if upgrade && cfg.cluster.on()? {
        return Err(Error::config(
            "serve --upgrade takes over an embedded server; in cluster mode, upgrade one \
             gateway at a time behind nginx (SIGTERM drains it)"
                .to_string(),
        ));
    }
    // An upgrade is handed the sockets and the lock of the server it replaces.
    let mut inherited = upgrade
        .then(|| successor::take_over(&cfg.ledger.data_dir))
        .transpose()?;
    for (addr, what) in [
        (&cfg.listeners.listen, "client"),
        (&cfg.listeners.ws_listen, "WebSocket"),
        (&cfg.listeners.http_listen, "HTTP"),
        (&cfg.listeners.admin, "admin"),
    ] {
        if let (Ok(addr), None) = (addr.parse::<SocketAddr>(), &inherited) {
            net::ensure_free(addr).map_err(|e| Error::io(format!("the {what} address"), e))?;
        }
    }
    let data_dir_lock = match inherited.as_mut() {
        Some(inherited) => inherited.lock.take().expect("taken once"),
        None => hongbao_sys::dirlock::DirLock::acquire(&cfg.ledger.data_dir, "hongbao serve")
            .map_err(|e| Error::config(e.to_string()))?,
    };
    let lock_fd = data_dir_lock
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::io("the data directory's lock", e))?;
    let login = login_setup(&cfg)?;
    let mut tls = cfg.tls.tls_pem()?;
    // An upgrade keeps the old server's ticket key: its clients resume their sessions.
    if let (Some(pem), Some(key)) = (tls.as_mut(), inherited.as_ref().and_then(|i| i.ticket_key)) {
        pem.ticket_key = key;
    }
    // The admin address speaks TLS with the same certificate, reloaded with it.
    let admin_tls = match &tls {
        Some(pem) => Some(hongbao_http::tls::Reloadable::new(
            hongbao_http::tls::server_config(&pem.cert, &pem.key, &[hongbao_http::tls::ALPN_HTTP])?,
        )),
        None => None,
    };
    let nofile = limits::raise_nofile_limit();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let worker_count = cfg.processes.worker_count(nofile, cores)?;
    if cfg.tokens.dev_secret_in_use() {
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
        data_dir: cfg.ledger.data_dir.clone(),
        core: CoreConfig {
            packet_ttl_ms: cfg.ledger.packet_ttl_secs * 1000,
            rng_seed: None,
        },
        group: GroupCommit {
            commit_interval: Duration::from_millis(cfg.ledger.commit_interval_ms),
            max_batch: cfg.ledger.commit_max_batch.max(1),
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
            let reader =
                successor::ReaderAcross::new(&cfg.ledger.data_dir.join("ledger.sqlite"), &handle);
            let reader = Some(Box::new(reader) as Box<dyn LedgerRead>);
            predecessor = Some(handle);
            let tick = Duration::from_millis(hongbao_embedded::core::TICK_INTERVAL_MS);
            (Box::new(money), reader, 0, tick)
        } else if cfg.cluster.on()? {
            let host = if cfg.cluster.host_name.is_empty() {
                format!("{}:{}", hostname(), cfg.listeners.listen)
            } else {
                cfg.cluster.host_name.clone()
            };
            let cluster = hongbao_cluster::Cluster::open(
                hongbao_cluster::ClusterConfig {
                    redis: cfg
                        .cluster
                        .redis
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .collect(),
                    redis_password: cfg.cluster.redis_password.clone(),
                    postgres: pg_targets(&cfg),
                    shard_map_version: cfg.cluster.shard_map_version,
                    host,
                    packet_ttl_ms: cfg.ledger.packet_ttl_secs * 1000,
                    commit_window: Duration::from_millis(cfg.ledger.commit_window_ms),
                    max_batch: cfg.ledger.commit_max_batch.max(1),
                    release_tags: cfg.cluster.release_tags,
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
    let access: Arc<dyn AccessStore> = if cfg.cluster.on()? {
        Arc::new(PgAccess::connect(&pg_targets(&cfg)[0]).map_err(|e| e.context("cluster mode"))?)
    } else {
        Arc::new(SqliteAccess::open(&cfg.ledger.data_dir)?)
    };
    if let Some(path) = access::ensure_first_key(access.as_ref(), &cfg.ledger.data_dir)? {
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
                (Kind::Client, &cfg.listeners.listen),
                (Kind::WebSocket, &cfg.listeners.ws_listen),
                (Kind::Http, &cfg.listeners.http_listen),
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
    let (hosts, origins) = (
        cfg.listeners.admin_hosts.clone(),
        cfg.listeners.admin_origins.clone(),
    );
    let horizon = cfg.tokens.revocation_horizon();
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
        None => admin::bind(&cfg.listeners.admin)?,
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
        shake_limit: cfg.limits.user_limits.shake,
        trusted_proxies: cfg.listeners.trusted_proxies.clone(),
        max_shakes_per_sec: cfg.overload.max_shake_qps.div_ceil(worker_count as u32),
        max_connections: limits::sockets_per_process(nofile) as u32,
        max_unauthenticated: cfg.admission.max_unauthenticated,
        max_unauthenticated_per_source: cfg.admission.max_unauthenticated_per_source,
        max_tls_handshakes: cfg.admission.tls_handshakes_per_worker(worker_count, cores),
        tls_handshake_timeout_secs: cfg.admission.tls_handshake_timeout_secs.max(1),
        tls_accept_queue_secs: cfg.admission.tls_accept_queue_secs.max(1),
        login_timeout_secs: cfg.admission.login_timeout_secs,
        idle_timeout_secs: cfg.limits.idle_timeout_secs,
        http_keepalive_secs: cfg.admission.http_keepalive_secs,
        max_output_bytes: cfg.admission.max_output_bytes,
        max_queue_ms: cfg.overload.max_queue_ms,
        ready_order: cfg.processes.ready_order,
        broadcast_yield_ms: cfg.overload.broadcast_yield_ms,
    };
    let monitor = (!cfg.telemetry.monitor.is_empty()).then(|| {
        Reporter::start(
            &cfg.telemetry.monitor,
            Reporter::key_from(cfg.telemetry.monitor_key_file.clone()),
        )
    });
    let users = Users::new(cfg.limits.user_limits.clone());
    let clock = Clock::start();
    let mut sup = Supervisor {
        cfg,
        money,
        time: TurnClock {
            clock,
            now: Uptime::ZERO,
        },
        timers: Timers::new(Uptime::ZERO, clock.unix(Uptime::ZERO), tick_interval),
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
        report: tallies::Report::new(sample::interface_for(client_addr.ip())),
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
        monitor.send_final(&sup.sample(UnixTime::now().second()));
    }
    drop(sup.admin.take());
    watching.request();
    let _ = revocations.join();
    let flushed = match handed_over {
        Some(flushed) => flushed,
        None => {
            let flushed = sup.money.finish();
            // Every connection closed: the ledger left as one file (`keep_wal`).
            hongbao_embedded::ledger::tidy_wal(&sup.cfg.ledger.data_dir);
            if sup.upgrade_listener.take().is_some() {
                let _ = std::fs::remove_file(upgrade::socket_path(&sup.cfg.ledger.data_dir));
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

/// The ledger's formations, shard 0 first, each with the one password and CA.
fn pg_targets(cfg: &ServeConfig) -> Vec<hongbao_cluster::PgTarget> {
    cfg.cluster
        .formations()
        .into_iter()
        .map(|url| hongbao_cluster::PgTarget {
            url,
            password: cfg.cluster.postgres_password.clone(),
            ca: cfg.cluster.engines_ca_pem.clone(),
        })
        .collect()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}
