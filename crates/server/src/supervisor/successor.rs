//! An upgrade, the new server's side (`upgrade.rs` is the old one's and says the steps):
//! `take_over` connects to the old server's upgrade socket and receives its sockets, its
//! admin socket and its data directory's lock; `Handover` is the money until the ledger
//! is this server's — every call sent to the old core and its outputs read back — and
//! then the embedded backend, opened over the ledger the old one closed.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use hongbao_embedded::{Embedded, EmbeddedConfig, Wake};
use hongbao_money::seam::{AdminRequest, MoneySnapshot, Op, Origin, Output};
use hongbao_money::{Audit, Money, WorkerId};
use hongbao_sys::clock::{unix_ms, Clock, Uptime};
use hongbao_sys::dirlock::DirLock;
use hongbao_sys::fdpass;

use super::listen::GroupShape;
use super::upgrade::{decode_all, encode, socket_path, ToNew, ToOld};
use crate::error::{Error, Result};

/// How long the new server waits for the old one's handover.
const HANDOVER_WAIT: Duration = Duration::from_secs(10);

/// What the old server handed over.
pub(super) struct Inherited {
    pub groups: Vec<GroupShape>,
    pub sockets: Vec<OwnedFd>,
    pub admin: Option<std::net::TcpListener>,
    pub lock: Option<DirLock>,
    pub link: Option<UnixStream>,
    pub old_pid: u32,
    /// What came after the handover message in the same reads.
    pub rest: Vec<u8>,
    /// The old server's TLS ticket key, kept (its clients resume here).
    pub ticket_key: Option<[u8; 32]>,
}

/// Connects to the server serving `data_dir` and takes its sockets and its lock.
pub(super) fn take_over(data_dir: &Path) -> Result<Inherited> {
    let path = socket_path(data_dir);
    let link = UnixStream::connect(&path).map_err(|e| {
        Error::io(
            format!(
                "connecting to {} (is a `hongbao serve` running on this data directory?)",
                path.display()
            ),
            e,
        )
    })?;
    let io = |e| Error::io("the upgrade link", e);
    if fdpass::peer_uid(&link).map_err(io)? != fdpass::my_uid() {
        return Err(Error::config(format!(
            "{} belongs to another user: refused",
            path.display()
        )));
    }
    link.set_read_timeout(Some(HANDOVER_WAIT)).map_err(io)?;
    let mut hello = Vec::new();
    encode(
        &ToOld::Hello {
            pid: std::process::id(),
        },
        &mut hello,
    );
    (&link).write_all(&hello).map_err(io)?;
    let mut buf = Vec::new();
    let mut fds = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let first = loop {
        let (n, got) = fdpass::recv_with_fds(&link, &mut chunk).map_err(|e| {
            Error::io(
                "waiting for the old server's sockets (it did not answer)",
                e,
            )
        })?;
        if n == 0 {
            return Err(Error::Link(
                "the old server closed the upgrade link before handing anything over".into(),
            ));
        }
        fds.extend(got);
        buf.extend_from_slice(&chunk[..n]);
        let mut msgs = Vec::new();
        decode_all::<ToNew>(&mut buf, |m| msgs.push(m))?;
        if let Some(first) = msgs.into_iter().next() {
            break first;
        }
    };
    let (groups, old_pid, ticket_key) = match first {
        ToNew::Handover {
            groups,
            pid,
            ticket_key,
            ..
        } => (groups, pid, ticket_key),
        ToNew::Refused(why) => {
            return Err(Error::config(format!("the upgrade was refused: {why}")))
        }
        other => return Err(Error::Link(format!("the upgrade began with {other:?}"))),
    };
    let sockets: usize = groups.iter().map(|g| g.sockets as usize).sum();
    if fds.len() != sockets + 2 {
        return Err(Error::Link(format!(
            "the old server handed over {} descriptors, not {}",
            fds.len(),
            sockets + 2
        )));
    }
    let lock = DirLock::adopt(
        data_dir,
        fds.pop().expect("counted"),
        "hongbao serve --upgrade",
    )
    .map_err(|e| Error::config(e.to_string()))?;
    let admin = std::net::TcpListener::from(fds.pop().expect("counted"));
    link.set_read_timeout(None).map_err(io)?;
    Ok(Inherited {
        groups,
        sockets: fds,
        admin: Some(admin),
        lock: Some(lock),
        link: Some(link),
        old_pid,
        rest: buf,
        ticket_key,
    })
}

/// The supervisor's hold on the upgrade: to say it is ready, and to know when the
/// ledger is its.
#[derive(Clone)]
pub(super) struct Predecessor {
    tx: Sender<Vec<u8>>,
    local: Arc<AtomicBool>,
    record: Arc<std::sync::Mutex<Upgraded>>,
}

/// What an upgrade did, as the new server saw it (its stdout line once it is over).
#[derive(Debug, Clone, Default)]
pub(super) struct Upgraded {
    pub old_pid: u32,
    /// The old server's drain: the connections it let go, its window, how long it took.
    pub drained_connections: u64,
    pub drain_window_ms: u64,
    pub drain_ms: u64,
    /// From `Finishing` to the ledger open here with what was held applied.
    pub commits_paused_ms: f64,
    pub replayed_events: u64,
    /// The old server went away without handing the ledger over.
    pub after_crash: bool,
}

impl Upgraded {
    /// The line `serve` prints on stdout once the ledger is its.
    pub(super) fn line(&self) -> String {
        format!(
            "hongbao serve upgraded: old_pid={} drained_connections={} drain_window_ms={} drain_ms={} commits_paused_ms={:.1} replayed_events={} after_crash={}",
            self.old_pid,
            self.drained_connections,
            self.drain_window_ms,
            self.drain_ms,
            self.commits_paused_ms,
            self.replayed_events,
            self.after_crash
        )
    }
}

impl Predecessor {
    /// Every worker is up: the old server may drain.
    pub(super) fn ready(&self) {
        let mut msg = Vec::new();
        encode(&ToOld::Ready, &mut msg);
        let _ = self.tx.send(msg);
    }

    /// Whether the ledger is this server's now.
    pub(super) fn done(&self) -> bool {
        self.local.load(Ordering::Acquire)
    }

    /// What the upgrade did (complete once `done`).
    pub(super) fn record(&self) -> Upgraded {
        self.record.lock().unwrap().clone()
    }
}

/// A call made while the ledger is passing over, applied once it is here.
enum Held {
    Submit(u64, Origin, Op),
    Admin(u64, u64, AdminRequest),
    Up(WorkerId),
    Down(WorkerId),
}

enum State {
    /// The old core applies what this server's clients ask.
    Lent,
    /// The old server is finishing: calls are held.
    Switching {
        since: Uptime,
    },
    Local(Box<Embedded>),
    /// The old server went away while it still runs, or the ledger did not open.
    Lost(String),
}

/// The money of a server taking over: the old core's until `LedgerYours`, then its own.
pub(super) struct Handover {
    state: State,
    open: Option<EmbeddedConfig>,
    wake: Wake,
    tx: Sender<Vec<u8>>,
    rx: Receiver<ToNew>,
    up: BTreeSet<WorkerId>,
    held: Vec<Held>,
    old_pid: u32,
    local: Arc<AtomicBool>,
    record: Arc<std::sync::Mutex<Upgraded>>,
    /// What the pause while the ledger passes over is timed with.
    clock: Clock,
}

impl Handover {
    /// Over the link the old server handed the sockets on (`rest`: bytes already read).
    pub(super) fn start(
        link: UnixStream,
        rest: Vec<u8>,
        old_pid: u32,
        open: EmbeddedConfig,
        wake: Wake,
    ) -> Result<(Handover, Predecessor)> {
        let io = |e| Error::io("the upgrade link", e);
        let (tx, to_old) = channel::<Vec<u8>>();
        let (from_old, rx) = channel::<ToNew>();
        let mut writer = link.try_clone().map_err(io)?;
        std::thread::Builder::new()
            .name("upgrade-out".into())
            .spawn(move || {
                for bytes in to_old {
                    if writer.write_all(&bytes).is_err() {
                        return;
                    }
                }
            })
            .map_err(io)?;
        let reader_wake = wake.clone();
        let mut reader = link;
        std::thread::Builder::new()
            .name("upgrade-in".into())
            .spawn(move || {
                let mut buf = rest;
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    let mut msgs = Vec::new();
                    if decode_all::<ToNew>(&mut buf, |m| msgs.push(m)).is_err() {
                        break;
                    }
                    for m in msgs {
                        if from_old.send(m).is_err() {
                            return;
                        }
                    }
                    reader_wake();
                    match reader.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                drop(from_old);
                reader_wake();
            })
            .map_err(io)?;
        let local = Arc::new(AtomicBool::new(false));
        let record = Arc::new(std::sync::Mutex::new(Upgraded {
            old_pid,
            ..Upgraded::default()
        }));
        let predecessor = Predecessor {
            tx: tx.clone(),
            local: local.clone(),
            record: record.clone(),
        };
        Ok((
            Handover {
                state: State::Lent,
                open: Some(open),
                wake,
                tx,
                rx,
                up: BTreeSet::new(),
                held: Vec::new(),
                old_pid,
                local,
                record,
                clock: Clock::start(),
            },
            predecessor,
        ))
    }

    fn send(&self, msg: &ToOld) {
        let mut bytes = Vec::new();
        encode(msg, &mut bytes);
        let _ = self.tx.send(bytes);
    }

    /// The ledger is this server's: opened (replayed), every worker up again, what was
    /// held applied.
    fn take_ledger(&mut self, since: Uptime, after_crash: bool) {
        let Some(cfg) = self.open.take() else {
            return;
        };
        let opened = Embedded::open(cfg, unix_ms(), self.wake.clone());
        let (mut money, replayed) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                self.state = State::Lost(format!("opening the ledger handed over: {e}"));
                return;
            }
        };
        for &w in &self.up {
            money.worker_up(w);
        }
        for call in std::mem::take(&mut self.held) {
            match call {
                Held::Submit(now, origin, op) => money.submit(now, origin, op),
                Held::Admin(now, ticket, request) => money.admin(now, ticket, request),
                Held::Up(w) => money.worker_up(w),
                Held::Down(w) => money.worker_down(w),
            }
        }
        let paused = self.clock.now().since(since);
        {
            let mut record = self.record.lock().unwrap();
            record.commits_paused_ms = paused.as_secs_f64() * 1e3;
            record.replayed_events = replayed;
            record.after_crash = after_crash;
        }
        self.state = State::Local(Box::new(money));
        self.local.store(true, Ordering::Release);
        if after_crash {
            tracing::warn!(
                old_pid = self.old_pid,
                replayed,
                "upgrade: the old server is gone without handing the ledger over; opened it as after a crash"
            );
        }
        tracing::info!(
            paused_ms = paused.as_secs_f64() * 1e3,
            replayed,
            "upgrade: the ledger is this server's; commits paused while it passed over"
        );
    }

    /// The old server's link closed before `LedgerYours`: if it is gone, the ledger is
    /// as a crash left it (everything acknowledged in it); if it still runs, two writers
    /// must never be, and this server gives up.
    fn old_gone(&mut self) {
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(self.old_pid as i32, 0) } == 0;
        let since = match self.state {
            State::Switching { since } => since,
            _ => self.clock.now(),
        };
        if alive {
            // It may be on its way out: give it a moment before judging.
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: as above.
            if unsafe { libc::kill(self.old_pid as i32, 0) } == 0 {
                self.state = State::Lost(format!(
                    "the old server (pid {}) closed the upgrade link but still runs: refusing a second ledger writer",
                    self.old_pid
                ));
                return;
            }
        }
        self.take_ledger(since, true);
    }
}

impl Money for Handover {
    fn submit(&mut self, now_ms: u64, origin: Origin, op: Op) {
        match &mut self.state {
            State::Lent => self.send(&ToOld::Submit { origin, op }),
            State::Switching { .. } => self.held.push(Held::Submit(now_ms, origin, op)),
            State::Local(money) => money.submit(now_ms, origin, op),
            State::Lost(_) => {}
        }
    }

    fn admin(&mut self, now_ms: u64, ticket: u64, request: AdminRequest) {
        match &mut self.state {
            State::Lent => self.send(&ToOld::Admin { ticket, request }),
            State::Switching { .. } => self.held.push(Held::Admin(now_ms, ticket, request)),
            State::Local(money) => money.admin(now_ms, ticket, request),
            State::Lost(_) => {}
        }
    }

    fn tick(&mut self, now_ms: u64) {
        if let State::Local(money) = &mut self.state {
            money.tick(now_ms);
        }
    }

    fn worker_up(&mut self, worker: WorkerId) {
        self.up.insert(worker);
        match &mut self.state {
            State::Lent => self.send(&ToOld::WorkerUp(worker)),
            State::Switching { .. } => self.held.push(Held::Up(worker)),
            State::Local(money) => money.worker_up(worker),
            State::Lost(_) => {}
        }
    }

    fn worker_down(&mut self, worker: WorkerId) {
        self.up.remove(&worker);
        match &mut self.state {
            State::Lent => self.send(&ToOld::WorkerDown(worker)),
            State::Switching { .. } => self.held.push(Held::Down(worker)),
            State::Local(money) => money.worker_down(worker),
            State::Lost(_) => {}
        }
    }

    fn drain(&mut self, out: &mut Vec<Output>) {
        while matches!(self.state, State::Lent | State::Switching { .. }) {
            match self.rx.try_recv() {
                Ok(ToNew::Out(output)) => out.push(output),
                Ok(ToNew::Draining {
                    connections,
                    window_ms,
                }) => {
                    let mut record = self.record.lock().unwrap();
                    record.drained_connections = connections;
                    record.drain_window_ms = window_ms;
                }
                Ok(ToNew::Finishing { drain_ms }) => {
                    self.record.lock().unwrap().drain_ms = drain_ms;
                    self.state = State::Switching {
                        since: self.clock.now(),
                    };
                    self.send(&ToOld::Quiet);
                    tracing::info!("upgrade: the old server has drained; holding calls while the ledger passes over");
                }
                Ok(ToNew::LedgerYours { seq }) => {
                    let since = match self.state {
                        State::Switching { since } => since,
                        _ => self.clock.now(),
                    };
                    tracing::info!(
                        ledger_seq = seq,
                        "upgrade: the old server closed the ledger"
                    );
                    self.take_ledger(since, false);
                }
                Ok(ToNew::Handover { .. } | ToNew::Refused(_)) => {}
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => self.old_gone(),
            }
        }
        if let State::Local(money) = &mut self.state {
            money.drain(out);
        }
    }

    fn snapshot(&self) -> MoneySnapshot {
        match &self.state {
            State::Local(money) => money.snapshot(),
            _ => MoneySnapshot::default(),
        }
    }

    fn audit_now(&self) -> Option<Audit> {
        match &self.state {
            State::Local(money) => money.audit_now(),
            _ => None,
        }
    }

    fn failure(&self) -> Option<String> {
        match &self.state {
            State::Local(money) => money.failure(),
            State::Lost(why) => Some(why.clone()),
            _ => None,
        }
    }

    fn commits_failing(&self) -> Option<String> {
        match &self.state {
            State::Local(money) => money.commits_failing(),
            _ => None,
        }
    }

    fn commit_latency(&self) -> Option<hdrhistogram::Histogram<u64>> {
        match &self.state {
            State::Local(money) => money.commit_latency(),
            _ => None,
        }
    }

    fn finish(&mut self) -> hongbao_money::error::Result<()> {
        match &mut self.state {
            State::Local(money) => money.finish(),
            _ => Ok(()),
        }
    }
}

/// The admin API's reader of a server taking over: a read-only connection opened while
/// the old server writes, and opened again once the ledger is this server's (the old one's
/// close folds its write-ahead log away, which a read-only connection cannot make again).
pub(super) struct ReaderAcross {
    path: std::path::PathBuf,
    local: Arc<AtomicBool>,
    /// The connection, and whether the ledger was this server's when it was opened.
    reader: std::sync::Mutex<Option<(bool, hongbao_embedded::ledger::Reader)>>,
}

impl ReaderAcross {
    pub(super) fn new(path: &Path, predecessor: &Predecessor) -> ReaderAcross {
        ReaderAcross {
            path: path.to_path_buf(),
            local: predecessor.local.clone(),
            reader: std::sync::Mutex::new(None),
        }
    }

    fn with<T>(
        &self,
        read: impl Fn(&hongbao_embedded::ledger::Reader) -> hongbao_money::error::Result<T>,
    ) -> hongbao_money::error::Result<T> {
        let mut held = self.reader.lock().unwrap();
        let local = self.local.load(Ordering::Acquire);
        if held
            .as_ref()
            .is_some_and(|(opened_local, _)| *opened_local != local)
        {
            *held = None;
        }
        if held.is_none() {
            *held = Some((local, hongbao_embedded::ledger::Reader::open(&self.path)?));
        }
        read(&held.as_ref().expect("opened").1)
    }
}

impl hongbao_money::seam::LedgerRead for ReaderAcross {
    fn user(
        &self,
        user: u64,
        limit: usize,
    ) -> hongbao_money::error::Result<hongbao_money::UserView> {
        self.with(|r| hongbao_money::seam::LedgerRead::user(r, user, limit))
    }

    fn balances(&self) -> hongbao_money::error::Result<hongbao_money::seam::Balances> {
        self.with(hongbao_money::seam::LedgerRead::balances)
    }

    fn ops(
        &self,
        after: Option<hongbao_money::seam::OpsCursor>,
        limit: usize,
    ) -> hongbao_money::error::Result<hongbao_money::seam::OpsPage> {
        self.with(|r| hongbao_money::seam::LedgerRead::ops(r, after, limit))
    }
}
