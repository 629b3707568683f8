//! `hongbao serve`: the supervisor process. It hosts the core, its ledger writer and the
//! admin API, and spawns the gateway workers (this same binary, `hongbao worker`), each
//! holding its own SO_REUSEPORT listener on the client port and one link back here.
//!
//! Its loop is the core's loop: it reads the links, feeds the core, ticks the core's
//! clock, hands new events to the ledger writer, and routes whatever the core says once
//! the ledger has committed it. It also watches the worker processes: a worker that dies
//! has its pool returned to the campaigns (when its link closes) and is started again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{sync_channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hongbao_telemetry::prom::Page;
use hongbao_telemetry::sample::{self, RoleSample, Sample};
use hongbao_telemetry::Reporter;
use mio::net::{UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Token, Waker};
use serde_json::{json, Map, Value};
use slab::Slab;

use crate::admin::{self, AdminCommand, AdminRequest, AdminResponse};
use crate::config::{ServeConfig, DEV_SECRET};
use crate::core::{Core, CoreConfig, Out, WorkerId};
use crate::ledger::{GroupCommit, Ledger, LedgerWriter};
use crate::link::{self, ToCore, ToWorker, WorkerConfig, WorkerStats};
use crate::metrics;
use hongbao_sys::{limits, net, usage, Stop};

const LINK_LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
/// A worker whose link output backs up past this is treated as dead.
const MAX_LINK_BACKLOG: usize = 256 << 20;

struct Link {
    stream: UnixStream,
    worker: Option<WorkerId>,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
}

struct WorkerProc {
    child: Option<Child>,
    restarts: u32,
    respawn_at: Option<Instant>,
    /// Stats reports: latest and the one a second before, for per-second rates.
    latest: Option<WorkerStats>,
    previous: Option<WorkerStats>,
}

struct Supervisor {
    cfg: ServeConfig,
    core: Core,
    poll: Poll,
    link_listener: UnixListener,
    link_name: String,
    links: Slab<Link>,
    worker_links: HashMap<WorkerId, usize>,
    workers: BTreeMap<WorkerId, WorkerProc>,
    worker_cfg: WorkerConfig,
    client_addr: SocketAddr,
    ledger: LedgerWriter,
    admin_rx: Receiver<AdminCommand>,
    deferred_admin: VecDeque<(u64, Sender<AdminResponse>, AdminResponse)>,
    /// Counters of workers that have exited, so totals never go backwards.
    retired: Map<String, Value>,
    core_counters_previous: BTreeMap<(&'static str, &'static str), u64>,
    core_rates: BTreeMap<(&'static str, &'static str), u64>,
    /// Workers' shake latency not yet reported to the monitor, and since the start.
    latency_pending: Histogram<u64>,
    latency_total: Histogram<u64>,
    monitor: Option<Reporter>,
    net_interface: String,
    ws_addr: Option<SocketAddr>,
    next_broadcast: u64,
    broadcasts: BTreeMap<u64, PendingBroadcast>,
    shutting_down: bool,
    stop: Stop,
}

/// A broadcast handed to the workers, answered once each has said how many connections
/// it is writing it to.
struct PendingBroadcast {
    reply: Sender<AdminResponse>,
    server_time_us: u64,
    waiting: Vec<WorkerId>,
    workers: usize,
    connections: u64,
    deadline: Instant,
}

/// How long a broadcast's admin answer waits for the workers' counts.
const BROADCAST_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// How long after a whole second the supervisor reports it: the workers report theirs
/// about 20 ms after the second.
const SECOND_REPORT_DELAY: Duration = Duration::from_millis(150);

fn until_next_second() -> Duration {
    Duration::from_millis(1000 - now_ms() % 1000)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// Runs `hongbao serve` until SIGINT/SIGTERM. Prints one "ready" line on stdout with the
/// bound addresses once every worker has connected.
pub fn run(cfg: ServeConfig, stop: Stop) -> anyhow::Result<()> {
    let nofile = limits::raise_nofile_limit();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let worker_count = cfg.worker_count(nofile, cores)?;
    if cfg.secret == DEV_SECRET {
        eprintln!(
            "hongbao serve: using the built-in development secret; set `secret` for real use"
        );
    }

    // Rebuild the money state from the ledger.
    let ledger = Ledger::open(&cfg.data_dir)?;
    let ledger_path = cfg.data_dir.join("ledger.sqlite");
    let mut core = Core::new(CoreConfig {
        packet_ttl_ms: cfg.packet_ttl_secs * 1000,
        rng_seed: None,
    });
    let replayed = ledger.for_each(|record| core.replay(&record))?;
    check_balances(&core, &ledger)?;
    core.resume(now_ms());
    let audit = core.audit();
    if !audit.ok {
        anyhow::bail!(
            "the ledger in {} does not balance: {audit:?}",
            cfg.data_dir.display()
        );
    }

    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let commit_waker = waker.clone();
    let group = GroupCommit {
        commit_window: Duration::from_millis(cfg.commit_window_ms),
        max_batch: cfg.commit_max_batch.max(1),
    };
    let ledger = LedgerWriter::spawn(ledger, core.seq(), group, move || {
        let _ = commit_waker.wake();
    });

    // Reserve the client port (resolving ":0") with a bound, non-listening socket that
    // joins the workers' SO_REUSEPORT group but never receives connections.
    let requested: SocketAddr = cfg
        .listen
        .parse()
        .map_err(|e| anyhow::anyhow!("--listen {}: {e}", cfg.listen))?;
    let placeholder = net::reuseport_listener(requested, false)
        .map_err(|e| anyhow::anyhow!("binding the client address {requested}: {e}"))?;
    let client_addr = placeholder.local_addr()?;
    let ws_placeholder = if cfg.ws_listen.is_empty() {
        None
    } else {
        let requested: SocketAddr = cfg
            .ws_listen
            .parse()
            .map_err(|e| anyhow::anyhow!("--ws-listen {}: {e}", cfg.ws_listen))?;
        Some(
            net::reuseport_listener(requested, false)
                .map_err(|e| anyhow::anyhow!("binding the WebSocket address {requested}: {e}"))?,
        )
    };
    let ws_addr = match &ws_placeholder {
        Some(p) => Some(p.local_addr()?),
        None => None,
    };

    let link_name = format!("hongbao-link-{}-{}", std::process::id(), now_ms());
    let std_listener =
        std::os::unix::net::UnixListener::bind_addr(&net::abstract_addr(&link_name)?)?;
    std_listener.set_nonblocking(true)?;
    let mut link_listener = UnixListener::from_std(std_listener);
    poll.registry()
        .register(&mut link_listener, LINK_LISTENER, Interest::READABLE)?;

    let (admin_tx, admin_rx) = sync_channel(256);
    let admin_addr = admin::start(&cfg.admin, ledger_path, admin_tx, waker.clone())?;

    let per_worker_qps = cfg.max_shake_qps.div_ceil(worker_count as u32);
    let max_connections = limits::sockets_per_process(nofile) as u32;
    let worker_cfg = WorkerConfig {
        secret: cfg.secret.as_bytes().to_vec(),
        max_shakes_per_sec: per_worker_qps,
        max_connections,
        login_timeout_secs: cfg.login_timeout_secs,
        idle_timeout_secs: cfg.idle_timeout_secs,
        max_output_bytes: cfg.max_output_bytes,
        demo_login: cfg.demo_login(),
        max_queue_ms: cfg.max_queue_ms,
    };
    let mut sup = Supervisor {
        cfg,
        core,
        poll,
        link_listener,
        link_name,
        links: Slab::new(),
        worker_links: HashMap::new(),
        workers: BTreeMap::new(),
        worker_cfg,
        client_addr,
        ledger,
        admin_rx,
        deferred_admin: VecDeque::new(),
        retired: Map::new(),
        core_counters_previous: BTreeMap::new(),
        core_rates: BTreeMap::new(),
        latency_pending: sample::new_histogram(),
        latency_total: sample::new_histogram(),
        monitor: None,
        net_interface: sample::interface_for(client_addr.ip()),
        ws_addr,
        next_broadcast: 1,
        broadcasts: BTreeMap::new(),
        shutting_down: false,
        stop,
    };
    if !sup.cfg.monitor.is_empty() {
        sup.monitor = Some(Reporter::start(&sup.cfg.monitor));
    }
    for w in 0..worker_count as WorkerId {
        let child = sup.spawn_worker(w)?;
        sup.workers.insert(
            w,
            WorkerProc {
                child: Some(child),
                restarts: 0,
                respawn_at: None,
                latest: None,
                previous: None,
            },
        );
    }
    let result = sup.event_loop(admin_addr, replayed);
    sup.stop_workers();
    if let Some(monitor) = sup.monitor.clone() {
        // The last second's counts, so the monitor's series adds up to the totals.
        monitor.send_final(&sup.sample(now_ms() / 1000));
    }
    let flushed = sup.ledger.finish();
    drop(placeholder);
    drop(ws_placeholder);
    result?;
    flushed?;
    eprintln!("hongbao serve: stopped; ledger at seq {}", sup.core.seq());
    Ok(())
}

fn check_balances(core: &Core, ledger: &Ledger) -> anyhow::Result<()> {
    let stored = ledger.balances()?;
    let replayed = core.balances_by_key();
    if stored != replayed {
        anyhow::bail!(
            "the ledger's balances table disagrees with its events ({} vs {} accounts)",
            stored.len(),
            replayed.len()
        );
    }
    Ok(())
}

impl Supervisor {
    fn spawn_worker(&self, w: WorkerId) -> anyhow::Result<Child> {
        let exe = std::env::current_exe()?;
        let child = Command::new(exe)
            .arg("worker")
            .arg("--link")
            .arg(&self.link_name)
            .arg("--index")
            .arg(w.to_string())
            .arg("--listen")
            .arg(self.client_addr.to_string())
            .args(
                self.ws_addr
                    .iter()
                    .flat_map(|a| ["--ws-listen".to_string(), a.to_string()]),
            )
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting worker {w}: {e}"))?;
        Ok(child)
    }

    fn event_loop(&mut self, admin_addr: SocketAddr, replayed: u64) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(256);
        let tick = Duration::from_millis(self.core.tick_interval_ms());
        let mut next_tick = Instant::now();
        // Just after each whole wall-clock second, once the workers' reports are in.
        let mut next_second = Instant::now() + until_next_second() + SECOND_REPORT_DELAY;
        let mut next_check = Instant::now();
        let mut ready_said = false;
        let mut outs = Vec::new();
        loop {
            let timeout = next_tick.saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e.into());
                }
            }
            for event in events.iter() {
                match event.token() {
                    LINK_LISTENER => self.accept_links()?,
                    WAKER => {}
                    Token(key) => self.read_link(key),
                }
            }
            while let Ok(cmd) = self.admin_rx.try_recv() {
                self.admin(cmd);
            }
            let now = Instant::now();
            if now >= next_tick {
                self.core.tick(now_ms());
                next_tick = now + tick;
            }
            if now >= next_second {
                next_second = now + until_next_second() + SECOND_REPORT_DELAY;
                self.roll_core_rates();
                if let Some(monitor) = self.monitor.clone() {
                    let second = (now_ms() / 1000).saturating_sub(1);
                    monitor.send(self.sample(second));
                }
                self.answer_broadcasts(true);
            }
            if now >= next_check {
                next_check = now + Duration::from_millis(100);
                self.check_workers()?;
            }
            if !ready_said && self.worker_links.len() == self.workers.len() {
                ready_said = true;
                let ws = self.ws_addr.map_or(String::new(), |a| format!(" ws={a}"));
                println!(
                    "hongbao serve ready: listen={} admin={}{ws} workers={} data_dir={} replayed_events={}",
                    self.client_addr,
                    admin_addr,
                    self.workers.len(),
                    self.cfg.data_dir.display(),
                    replayed
                );
                let _ = std::io::stdout().flush();
            }
            self.ledger.submit(self.core.take_records());
            self.route_committed(&mut outs);
            self.flush_links();
            if self.ledger.is_dead() {
                anyhow::bail!("the ledger writer stopped; refusing to acknowledge anything more");
            }
            if self.stop.requested() {
                return Ok(());
            }
        }
    }

    fn route_committed(&mut self, outs: &mut Vec<Out>) {
        let committed = self.ledger.committed();
        self.core.drain_ready(committed, outs);
        for out in outs.drain(..) {
            let (worker, msg) = match out {
                Out::ToConn {
                    worker,
                    conn,
                    bytes,
                    close,
                } => (worker, ToWorker::ToConn { conn, bytes, close }),
                Out::Deal { worker, packets } => (worker, ToWorker::Deal { packets }),
            };
            if let Some(link) = self
                .worker_links
                .get(&worker)
                .and_then(|k| self.links.get_mut(*k))
            {
                link::encode(&msg, &mut link.outbuf);
            }
        }
        while let Some((tag, _, _)) = self.deferred_admin.front() {
            if *tag > committed {
                break;
            }
            let (_, reply, response) = self.deferred_admin.pop_front().unwrap();
            let _ = reply.send(response);
        }
    }

    // ----- links -------------------------------------------------------------------------

    fn accept_links(&mut self) -> anyhow::Result<()> {
        loop {
            match self.link_listener.accept() {
                Ok((mut stream, _)) => {
                    let entry = self.links.vacant_entry();
                    self.poll.registry().register(
                        &mut stream,
                        Token(entry.key()),
                        Interest::READABLE | Interest::WRITABLE,
                    )?;
                    entry.insert(Link {
                        stream,
                        worker: None,
                        inbuf: Vec::new(),
                        outbuf: Vec::new(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn read_link(&mut self, key: usize) {
        let mut chunk = [0u8; 64 * 1024];
        let mut closed = false;
        let Some(link) = self.links.get_mut(key) else {
            return;
        };
        loop {
            match link.stream.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => link.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut inbox = Vec::new();
        let mut inbuf = std::mem::take(&mut link.inbuf);
        if let Err(e) = link::decode_all::<ToCore>(&mut inbuf, |m| inbox.push(m)) {
            eprintln!("hongbao serve: dropping a worker link: {e}");
            closed = true;
        }
        link.inbuf = inbuf;
        let now = now_ms();
        for msg in inbox {
            self.on_worker_message(key, msg, now);
        }
        if closed {
            self.drop_link(key);
        }
    }

    fn on_worker_message(&mut self, key: usize, msg: ToCore, now: u64) {
        let worker = self.links[key].worker;
        let Some(w) = worker else {
            if let ToCore::Hello { worker: w, .. } = msg {
                // A worker index can have one link: an older one (a worker that was
                // replaced before its link closed) goes down first, returning its pool.
                if let Some(old) = self.worker_links.get(&w).copied() {
                    self.drop_link(old);
                }
                self.worker_links.insert(w, key);
                self.links[key].worker = Some(w);
                self.core.worker_up(w);
                link::encode(
                    &ToWorker::Welcome(self.worker_cfg.clone()),
                    &mut self.links[key].outbuf,
                );
            }
            return;
        };
        match msg {
            ToCore::Hello { .. } => {}
            ToCore::Online { conn, req, user } => self.core.login(w, conn, req, user),
            ToCore::Offline { conn, user } => self.core.offline(w, conn, user),
            ToCore::Claim {
                conn,
                req,
                user,
                packet,
            } => self.core.claim(now, w, conn, req, user, packet),
            ToCore::Send {
                conn,
                req,
                user,
                amount_cents,
                shares,
                recipients,
            } => self
                .core
                .send(now, w, conn, req, user, amount_cents, shares, recipients),
            ToCore::Open {
                conn,
                req,
                user,
                packet,
            } => self.core.open(now, w, conn, req, user, packet),
            ToCore::Chat {
                conn,
                req,
                user,
                to_user,
                text,
            } => self.core.chat(w, conn, req, user, to_user, text),
            ToCore::BroadcastTaken { id, connections } => {
                if let Some(b) = self.broadcasts.get_mut(&id) {
                    b.waiting.retain(|&x| x != w);
                    b.connections += connections;
                }
                self.answer_broadcasts(false);
            }
            ToCore::Stats(stats) => {
                sample::merge_sparse(&mut self.latency_pending, &stats.shake_latency_us);
                sample::merge_sparse(&mut self.latency_total, &stats.shake_latency_us);
                if let Some(proc_) = self.workers.get_mut(&w) {
                    proc_.previous = proc_.latest.take();
                    proc_.latest = Some(*stats);
                }
            }
        }
    }

    fn drop_link(&mut self, key: usize) {
        if !self.links.contains(key) {
            return;
        }
        let mut link = self.links.remove(key);
        let _ = self.poll.registry().deregister(&mut link.stream);
        if let Some(w) = link.worker {
            if self.worker_links.get(&w) == Some(&key) {
                self.worker_links.remove(&w);
                self.core.worker_down(w);
                self.retire_stats(w);
                for b in self.broadcasts.values_mut() {
                    b.waiting.retain(|&x| x != w);
                }
                self.answer_broadcasts(false);
            }
        }
    }

    fn flush_links(&mut self) {
        let mut dead = Vec::new();
        for (key, link) in self.links.iter_mut() {
            match net::write_nonblocking(&mut link.stream, &link.outbuf) {
                Ok(n) => {
                    link.outbuf.drain(..n);
                }
                Err(_) => dead.push(key),
            }
            if link.outbuf.len() > MAX_LINK_BACKLOG {
                eprintln!(
                    "hongbao serve: worker {:?} is not reading its link; dropping it",
                    link.worker
                );
                dead.push(key);
            }
        }
        for key in dead {
            self.drop_link(key);
        }
    }

    // ----- worker processes --------------------------------------------------------------

    fn check_workers(&mut self) -> anyhow::Result<()> {
        if self.shutting_down {
            return Ok(());
        }
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        for w in ids {
            let proc_ = self.workers.get_mut(&w).expect("listed");
            if let Some(child) = proc_.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    eprintln!(
                        "hongbao serve: worker {w} (pid {}) exited: {status}; restarting",
                        child.id()
                    );
                    proc_.child = None;
                    proc_.restarts += 1;
                    // Back off when a worker keeps dying, so a crash loop cannot spin.
                    let delay = Duration::from_millis(100 * proc_.restarts.min(50) as u64);
                    proc_.respawn_at = Some(Instant::now() + delay);
                    if let Some(key) = self.worker_links.get(&w).copied() {
                        self.drop_link(key);
                    }
                }
            }
            let proc_ = self.workers.get_mut(&w).expect("listed");
            if proc_.child.is_none() && proc_.respawn_at.is_some_and(|t| Instant::now() >= t) {
                proc_.respawn_at = None;
                let child = self.spawn_worker(w)?;
                self.workers.get_mut(&w).expect("listed").child = Some(child);
            }
        }
        Ok(())
    }

    fn stop_workers(&mut self) {
        self.shutting_down = true;
        for link in self.links.iter_mut().map(|(_, l)| l) {
            link::encode(&ToWorker::Shutdown, &mut link.outbuf);
        }
        self.flush_links();
        // Read the workers' last reports while they close their links and exit.
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut events = Events::with_capacity(64);
        while !self.worker_links.is_empty() && Instant::now() < deadline {
            let _ = self.poll.poll(&mut events, Some(Duration::from_millis(10)));
            for event in events.iter() {
                let Token(key) = event.token();
                if key != LINK_LISTENER.0 && key != WAKER.0 {
                    self.read_link(key);
                }
            }
        }
        for proc_ in self.workers.values_mut() {
            if let Some(child) = proc_.child.as_mut() {
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Whatever the core still holds for the ledger goes in before we stop.
        self.ledger.submit(self.core.take_records());
    }

    fn retire_stats(&mut self, w: WorkerId) {
        let Some(proc_) = self.workers.get_mut(&w) else {
            return;
        };
        if let Some(last) = proc_.latest.take() {
            metrics::retire(&mut self.retired, &last);
        }
        proc_.previous = None;
    }

    // ----- admin -------------------------------------------------------------------------

    /// This server's report to the monitor for `second`: the workers as role `server`,
    /// the supervisor and core as role `core`.
    fn sample(&mut self, second: u64) -> Sample {
        let mut totals = self.retired.clone();
        let mut levels = BTreeMap::new();
        let mut processes = 0;
        for (_, _, latest) in self.live_stats() {
            metrics::add_counters(&mut totals, latest);
            processes += 1;
        }
        let total = |k: &str| totals.get(k).and_then(Value::as_u64).unwrap_or(0);
        for level in ["connections", "logged_in", "rss_bytes"] {
            levels.insert(level.to_string(), total(level));
        }
        let by_result = &self.core.counters.by_result;
        let core_count = |op, result| by_result.get(&(op, result)).copied().unwrap_or(0);
        let won = core_count("shake", "won");
        let errors = [
            "bad_frames",
            "bad_requests",
            "login_failures",
            "not_logged_in",
        ]
        .iter()
        .map(|k| total(k))
        .sum::<u64>();
        let server_counters = [
            ("shakes", total("shakes")),
            ("won", won),
            ("nothing", total("shakes_nothing")),
            ("overloaded", total("shakes_overloaded")),
            ("opens", total("opens")),
            ("opened", core_count("open", "opened")),
            ("sends", total("sends")),
            ("errors", errors),
            ("broadcasts", self.next_broadcast - 1),
            ("broadcast_delivered", total("broadcast_delivered")),
        ];
        let core_counters = [
            ("packets_released", self.core.counters.packets_released),
            ("packets_won", won),
            ("send_packets", self.core.counters.send_packets),
            ("shares_opened", core_count("open", "opened")),
        ];
        let (rss, cpu) = usage::self_usage();
        let latency = sample::sparse(&self.latency_pending);
        self.latency_pending.reset();
        Sample {
            instance: format!("serve@{}:{}", sample::hostname(), std::process::id()),
            host: sample::hostname(),
            unix_second: second,
            roles: vec![
                RoleSample {
                    role: "server".into(),
                    processes,
                    cpu_ms: total("cpu_ms"),
                    counters: sample::named(&server_counters),
                    levels,
                    latency_us: latency,
                },
                RoleSample {
                    role: "core".into(),
                    processes: 1,
                    cpu_ms: cpu,
                    counters: sample::named(&core_counters),
                    levels: sample::named(&[("rss_bytes", rss)]),
                    latency_us: Vec::new(),
                },
            ]
            .into_iter()
            .chain(sample::host_role())
            .collect(),
            net: sample::read_net(&self.net_interface),
        }
    }

    fn roll_core_rates(&mut self) {
        let now = self.core.counters.by_result.clone();
        self.core_rates = now
            .iter()
            .map(|(k, v)| {
                (
                    *k,
                    v - self.core_counters_previous.get(k).copied().unwrap_or(0),
                )
            })
            .collect();
        self.core_counters_previous = now;
    }

    fn admin(&mut self, cmd: AdminCommand) {
        let now = now_ms();
        let response = match cmd.request {
            AdminRequest::CreateShake(req) => match self.core.create_shake_campaign(now, &req) {
                Ok(status) => {
                    // Answer once the campaign is durable.
                    let response = AdminResponse::json(201, &status);
                    self.deferred_admin
                        .push_back((self.core.seq(), cmd.reply, response));
                    return;
                }
                Err(e) => AdminResponse::error(400, e),
            },
            AdminRequest::CreateSend(req) => match self.core.create_send_campaign(now, &req) {
                Ok(status) => {
                    let response = AdminResponse::json(201, &status);
                    self.deferred_admin
                        .push_back((self.core.seq(), cmd.reply, response));
                    return;
                }
                Err(e) => AdminResponse::error(400, e),
            },
            AdminRequest::Campaign(id) => match self.core.campaign(id) {
                Some(status) => AdminResponse::json(200, &status),
                None => AdminResponse::error(404, format!("no campaign {id}")),
            },
            AdminRequest::Campaigns => {
                let all: Vec<_> = self
                    .core
                    .campaign_ids()
                    .into_iter()
                    .filter_map(|id| self.core.campaign(id))
                    .collect();
                AdminResponse::json(200, &all)
            }
            AdminRequest::Broadcast(req) => {
                let id = self.next_broadcast;
                self.next_broadcast += 1;
                let server_time_us = now_us();
                let msg = ToWorker::Broadcast {
                    id,
                    server_time_us,
                    text: req.text,
                };
                let mut waiting = Vec::new();
                for (&w, &key) in &self.worker_links {
                    link::encode(&msg, &mut self.links[key].outbuf);
                    waiting.push(w);
                }
                self.broadcasts.insert(
                    id,
                    PendingBroadcast {
                        reply: cmd.reply,
                        server_time_us,
                        workers: waiting.len(),
                        waiting,
                        connections: 0,
                        deadline: Instant::now() + BROADCAST_ANSWER_WAIT,
                    },
                );
                self.answer_broadcasts(false);
                return;
            }
            AdminRequest::Audit => AdminResponse::json(200, &self.core.audit()),
            AdminRequest::Stats => AdminResponse::json(200, &self.stats()),
            AdminRequest::Metrics => AdminResponse {
                status: 200,
                body: self.metrics(),
                content_type: "text/plain; version=0.0.4",
            },
        };
        // Reads are answered once what they saw is durable, like everything else.
        self.deferred_admin
            .push_back((self.core.seq(), cmd.reply, response));
    }

    /// Answers the broadcasts every worker has counted (or, with `overdue`, those whose
    /// wait is over: a worker that does not answer is left out of the count).
    fn answer_broadcasts(&mut self, overdue: bool) {
        let now = Instant::now();
        let done: Vec<u64> = self
            .broadcasts
            .iter()
            .filter(|(_, b)| b.waiting.is_empty() || (overdue && now >= b.deadline))
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let b = self.broadcasts.remove(&id).expect("listed");
            let answer = json!({
                "id": id,
                "server_time_us": b.server_time_us,
                "connections": b.connections,
                "workers": b.workers - b.waiting.len(),
            });
            let _ = b.reply.send(AdminResponse::json(200, &answer));
        }
    }

    fn live_stats(&self) -> impl Iterator<Item = (&WorkerId, &WorkerProc, &WorkerStats)> {
        self.workers
            .iter()
            .filter_map(|(w, p)| p.latest.as_ref().map(|s| (w, p, s)))
    }

    fn stats(&self) -> Value {
        let mut workers = Vec::new();
        let mut totals = self.retired.clone();
        let mut rates = Map::new();
        for (w, proc_, latest) in self.live_stats() {
            metrics::add_counters(&mut totals, latest);
            let worker_rates = metrics::rates(latest, proc_.previous.as_ref());
            for (k, v) in &worker_rates {
                let sum =
                    rates.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
                rates.insert(k.clone(), sum.into());
            }
            workers.push(json!({
                "worker": w,
                "pid": latest.pid,
                "restarts": proc_.restarts,
                "connections": latest.connections,
                "logged_in": latest.logged_in,
                "pool_packets": latest.pool_packets,
                "rss_bytes": latest.rss_bytes,
                "cpu_ms": latest.cpu_ms,
                "per_sec": worker_rates,
            }));
        }
        let core_rates: BTreeMap<String, u64> = self
            .core_rates
            .iter()
            .map(|((op, r), v)| (format!("{op}_{r}"), *v))
            .collect();
        let (rss, cpu) = usage::self_usage();
        json!({
            "unix_ms": now_ms(),
            "connections": totals.get("connections").cloned().unwrap_or(0.into()),
            "logged_in": totals.get("logged_in").cloned().unwrap_or(0.into()),
            "online_users": self.core.online_users(),
            "per_sec": rates,
            "core_per_sec": core_rates,
            "totals": totals,
            "workers": workers,
            "core": {
                "ledger_seq": self.core.seq(),
                "ledger_committed_seq": self.ledger.committed(),
                "rss_bytes": rss,
                "cpu_ms": cpu,
            },
        })
    }

    fn metrics(&self) -> String {
        let mut m = Page::default();
        let mut totals = self.retired.clone();
        for (_, _, latest) in self.live_stats() {
            metrics::add_counters(&mut totals, latest);
        }
        metrics::worker_totals(&mut m, &totals);
        for (w, proc_, latest) in self.live_stats() {
            let label = [("worker", w.to_string())];
            m.gauge(
                "hongbao_worker_connections",
                "Open client connections per worker",
                &label,
                latest.connections as f64,
            );
            m.counter(
                "hongbao_worker_restarts_total",
                "Times a worker was restarted",
                &label,
                proc_.restarts as f64,
            );
            m.gauge(
                "hongbao_worker_resident_memory_bytes",
                "Resident memory per worker",
                &label,
                latest.rss_bytes as f64,
            );
            m.counter(
                "hongbao_worker_cpu_seconds_total",
                "CPU time per worker",
                &label,
                latest.cpu_ms as f64 / 1000.0,
            );
        }
        for ((op, result), v) in &self.core.counters.by_result {
            let labels = [("op", op.to_string()), ("result", result.to_string())];
            m.counter(
                "hongbao_core_replies_total",
                "Replies from the core by operation and result",
                &labels,
                *v as f64,
            );
        }
        m.histogram(
            "hongbao_shake_latency_seconds",
            "Shake latency in the workers: from reading the shake to writing its reply",
            &[],
            &self.latency_total,
        );
        let audit = self.core.audit();
        m.gauge(
            "hongbao_money_minted_cents",
            "Money minted by campaigns",
            &[],
            audit.minted_cents as f64,
        );
        m.gauge(
            "hongbao_money_balances_cents",
            "Money held in user balances",
            &[],
            audit.user_balances_cents as f64,
        );
        m.gauge(
            "hongbao_money_campaign_balances_cents",
            "Money refunded to campaign system accounts",
            &[],
            audit.campaign_balances_cents as f64,
        );
        m.gauge(
            "hongbao_money_unopened_cents",
            "Money in unopened shares",
            &[],
            audit.unopened_cents as f64,
        );
        m.gauge(
            "hongbao_money_unclaimed_cents",
            "Money in unclaimed shake packets",
            &[],
            audit.unclaimed_cents as f64,
        );
        m.gauge(
            "hongbao_audit_ok",
            "1 when money is conserved",
            &[],
            if audit.ok { 1.0 } else { 0.0 },
        );
        m.gauge(
            "hongbao_online_users",
            "Users logged in",
            &[],
            self.core.online_users() as f64,
        );
        m.gauge(
            "hongbao_ledger_seq",
            "Newest ledger event",
            &[],
            self.core.seq() as f64,
        );
        m.gauge(
            "hongbao_ledger_committed_seq",
            "Newest committed ledger event",
            &[],
            self.ledger.committed() as f64,
        );
        let (rss, cpu) = usage::self_usage();
        m.gauge(
            "hongbao_core_resident_memory_bytes",
            "Resident memory of the supervisor and core",
            &[],
            rss as f64,
        );
        m.counter(
            "hongbao_core_cpu_seconds_total",
            "CPU time of the supervisor and core",
            &[],
            cpu as f64 / 1000.0,
        );
        m.render()
    }
}
