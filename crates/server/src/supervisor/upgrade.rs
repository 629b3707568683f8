//! An upgrade, the old server's side (`successor.rs` is the new one's): a new binary
//! started with `hongbao serve --upgrade` (or by SIGUSR2 here) connects to
//! `DIR/upgrade.sock` and is handed, over that one Unix stream, everything that makes
//! this server this server:
//!
//! 1. **The sockets** (SCM_RIGHTS): every listening socket with its accept queue, the
//!    admin socket, and the data directory's lock. The new server's workers accept from
//!    the same sockets, so no connection attempt finds the port closed.
//! 2. **The money, lent**: until the ledger is its, the new server's operations come here
//!    and are applied by this core (its workers are ours under `SUCCESSOR_WORKERS + w`),
//!    and what they became goes back: one ledger writer at every moment.
//! 3. **The drain**: once the new server says it is ready, this one stops accepting (its
//!    admin server stops, its copies of the sockets close) and lets its connections go
//!    over the drain window, each told to come back — to the new server, which holds the
//!    same sockets.
//! 4. **The ledger**: once this one holds no connection (or its window is over) it says
//!    `Finishing`; the new one stops sending and says `Quiet`; this one commits what it
//!    was given, stops ticking, sends the last answers, closes the ledger and says
//!    `LedgerYours`. The new one opens it (the pause in commits is this step) and serves
//!    on alone.
//!
//! The socket is a file in the data directory (mode 0700, the socket 0600) and the peer
//! must be this user (SO_PEERCRED): only who may read the ledger may take it.

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hongbao_sys::clock::Uptime;

use hongbao_money::seam::{AdminRequest, Op, Origin, Output};
use hongbao_money::WorkerId;
use hongbao_sys::fdpass;
use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Token};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::listen::GroupShape;
use super::Supervisor;
use crate::error::{Error, Result};
use crate::link::{self, ToWorker};

/// The upgrade socket's file in a data directory.
pub const SOCKET_FILE: &str = "upgrade.sock";

/// The new server's workers, as this core knows them: `SUCCESSOR_WORKERS + w`.
pub const SUCCESSOR_WORKERS: WorkerId = 0x8000;

pub(super) const UPGRADE_LISTENER: Token = Token(usize::MAX - 3);
pub(super) const UPGRADE_LINK: Token = Token(usize::MAX - 4);

/// When a client drained by an upgrade is told to come back: at once, nearly (a client
/// takes ½ to 1½ of it) — the new server holds the same sockets and is ready, and the
/// kicks are spread over the window, so the time a client is away is its reconnect.
pub const UPGRADE_RETRY_AFTER_MS: u32 = 100;

/// How long the old server waits for the new one's `Quiet` before it hands the ledger
/// over regardless (what the new one sends later is not applied, and was never answered).
const QUIET_WAIT: Duration = Duration::from_secs(10);

/// The old server to the new.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToNew {
    /// The first message, with the descriptors beside it in this order: every group's
    /// sockets, then the admin socket, then the data directory's lock.
    Handover {
        groups: Vec<GroupShape>,
        admin: SocketAddr,
        pid: u32,
        /// The key TLS 1.3 tickets are sealed with: a client let go resumes its session at
        /// the new server (an abbreviated handshake) instead of making a new one.
        ticket_key: Option<[u8; 32]>,
    },
    /// What this core made of the new server's operations (its own worker ids).
    Out(Output),
    /// The drain began: this many connections, let go over this window.
    Draining { connections: u64, window_ms: u64 },
    /// This server holds no connections now (its drain took `drain_ms`): send nothing
    /// more, say `Quiet`.
    Finishing { drain_ms: u64 },
    /// The ledger is closed, everything acknowledged in it: open it.
    LedgerYours { seq: u64 },
    /// The upgrade is refused (another is under way, this server is stopping).
    Refused(String),
}

/// The new server to the old.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToOld {
    Hello {
        pid: u32,
    },
    /// Every worker of the new server is up on the sockets: drain.
    Ready,
    WorkerUp(WorkerId),
    WorkerDown(WorkerId),
    Submit {
        origin: Origin,
        op: Op,
    },
    Admin {
        ticket: u64,
        request: AdminRequest,
    },
    /// Nothing more will come: everything sent is in.
    Quiet,
}

/// A length-prefixed JSON message (the API types skip empty fields, which only a
/// self-describing format reads back).
pub fn encode<T: Serialize>(msg: &T, out: &mut Vec<u8>) {
    let body = serde_json::to_vec(msg).expect("upgrade messages serialize");
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
}

/// Every whole message at the front of `buf`, removed from it.
pub fn decode_all<T: DeserializeOwned>(buf: &mut Vec<u8>, mut f: impl FnMut(T)) -> Result<()> {
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len > link::MAX_LINK_MSG {
            return Err(Error::Link(format!("an upgrade message of {len} bytes")));
        }
        if buf.len() - at - 4 < len {
            break;
        }
        let msg = serde_json::from_slice(&buf[at + 4..at + 4 + len])
            .map_err(|e| Error::Link(format!("an upgrade message: {e}")))?;
        f(msg);
        at += 4 + len;
    }
    buf.drain(..at);
    Ok(())
}

/// Where a data directory's upgrade socket is.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_FILE)
}

/// The upgrade socket, listening; `None` (said in the log) where it cannot be made: this
/// server then cannot be upgraded in place, and serves on.
pub(super) fn listen(data_dir: &Path) -> Option<UnixListener> {
    let path = socket_path(data_dir);
    // The data directory's lock is ours: a file left here is a dead server's.
    let _ = std::fs::remove_file(&path);
    let made = std::os::unix::net::UnixListener::bind(&path).and_then(|l| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        l.set_nonblocking(true)?;
        Ok(l)
    });
    match made {
        Ok(l) => Some(UnixListener::from_std(l)),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no upgrade socket: `serve --upgrade` cannot take this server over");
            None
        }
    }
}

/// The new server, as the old one sees it.
pub(super) struct Successor {
    stream: UnixStream,
    inbuf: Vec<u8>,
    pub(super) outbuf: Vec<u8>,
    pid: Option<u32>,
    /// Its workers up here (their ids in this core).
    workers: Vec<WorkerId>,
    /// Its admin tickets, by ours.
    tickets: HashMap<u64, u64>,
    ready: bool,
    /// When `Finishing` was sent.
    finishing: Option<Uptime>,
    quiet: bool,
    /// Logins at the new server since it was ready (its `LoggedIn` operations, applied here).
    admitted: u64,
    /// The drain's credit: the connections held at its start by worker, all of them, and
    /// how many were let go ahead of the window so far (`grant_drain`).
    held: Vec<(WorkerId, u64)>,
    held_total: u64,
    granted: u64,
    granted_at: Option<Uptime>,
    /// When the drain began, and the fastest it lets connections go (a second).
    drain_from: Option<Uptime>,
    admit_rate: u64,
    /// When the workers still up at the window's end were told to stop.
    stopping_workers: Option<Uptime>,
}

/// How many of the old server's clients may be on their way to the new one at once (let
/// go, not yet logged in again there): a hundredth of them, at least `MIN_IN_FLIGHT`.
/// While fewer are, more are let go ahead of the window; the window is the ceiling.
pub(super) fn in_flight_bound(held: u64) -> u64 {
    (held / 100).max(MIN_IN_FLIGHT)
}

/// How many of `held` may have been let go `elapsed` into the drain, `admitted` of them
/// logged in again at the new server: never more than `in_flight_bound` ahead of those
/// logins, nor more than that bound and `rate` a second since the drain began.
pub(super) fn drain_credit(held: u64, admitted: u64, rate: u64, elapsed: Duration) -> u64 {
    let bound = in_flight_bound(held);
    let paced = bound.saturating_add(rate.saturating_mul(elapsed.as_millis() as u64) / 1000);
    admitted.saturating_add(bound).min(paced).min(held)
}

const MIN_IN_FLIGHT: u64 = 100;

/// How often the drain's credit is looked at.
const GRANT_EVERY: Duration = Duration::from_millis(20);

/// How long workers still up at the drain's end are given to stop before the ledger is
/// handed over regardless.
const WORKERS_STOP_WAIT: Duration = Duration::from_secs(5);

/// What each worker of `held` may let go for `target` in all: its share, rounded up.
pub(super) fn shares(held: &[(WorkerId, u64)], total: u64, target: u64) -> Vec<(WorkerId, u64)> {
    held.iter()
        .map(|&(w, n)| (w, (target * n).div_ceil(total.max(1)).min(n)))
        .collect()
}

/// Where the upgrade stands, for the loop.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// No upgrade, or one under way that does not end this loop yet.
    Serving,
    /// Everything was handed over but the ledger: leave the loop, close it, say so.
    HandOver,
}

impl Supervisor {
    /// An upgrade's last step, once the event loop is over: any worker still linked let
    /// go (its clients are the new server's to take), the ledger closed, the answers it
    /// released last sent, then the ledger handed over. What closing it said.
    pub(super) fn hand_over_last(&mut self) -> hongbao_money::error::Result<()> {
        let linked: Vec<usize> = self.links.iter().map(|(key, _)| key).collect();
        for key in linked {
            self.drop_link(key);
        }
        let flushed = self.money.finish();
        let mut outs = Vec::new();
        self.route_outputs(&mut outs);
        self.hand_over_ledger(self.money.snapshot().committed_seq);
        flushed
    }

    /// A process connected to the upgrade socket: kept if it is this user and no other
    /// upgrade is under way.
    pub(super) fn accept_successor(&mut self) {
        let Some(listener) = &self.upgrade_listener else {
            return;
        };
        loop {
            let (mut stream, _) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting on the upgrade socket");
                    return;
                }
            };
            let uid = fdpass::peer_uid(&stream);
            if uid.as_ref().ok() != Some(&fdpass::my_uid()) {
                tracing::warn!(peer_uid = ?uid, "upgrade refused: another user");
                continue;
            }
            if self.successor.is_some() || self.stop.requested() {
                let mut out = Vec::new();
                let why = if self.stop.requested() {
                    "this server is stopping"
                } else {
                    "another upgrade is under way"
                };
                encode(&ToNew::Refused(why.into()), &mut out);
                let _ = hongbao_sys::net::write_nonblocking(&mut stream, &out);
                tracing::warn!(why, "upgrade refused");
                continue;
            }
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                UPGRADE_LINK,
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(error = %e, "watching the upgrade link");
                continue;
            }
            self.successor = Some(Successor {
                stream,
                inbuf: Vec::new(),
                outbuf: Vec::new(),
                pid: None,
                workers: Vec::new(),
                tickets: HashMap::new(),
                ready: false,
                finishing: None,
                quiet: false,
                admitted: 0,
                held: Vec::new(),
                held_total: 0,
                granted: 0,
                granted_at: None,
                drain_from: None,
                admit_rate: 0,
                stopping_workers: None,
            });
        }
    }

    /// Reads what the new server sent.
    pub(super) fn read_successor(&mut self, now_ms: u64) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        let mut chunk = [0u8; 64 * 1024];
        let mut closed = false;
        loop {
            match s.stream.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => s.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut msgs = Vec::new();
        if let Err(e) = decode_all::<ToOld>(&mut s.inbuf, |m| msgs.push(m)) {
            tracing::warn!(error = %e, "the upgrade link");
            closed = true;
        }
        for msg in msgs {
            self.on_successor_message(msg, now_ms);
        }
        if closed {
            self.successor_gone();
        }
    }

    fn on_successor_message(&mut self, msg: ToOld, now_ms: u64) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        match msg {
            ToOld::Hello { pid } => {
                s.pid = Some(pid);
                self.hand_over_sockets(pid);
            }
            ToOld::Ready => {
                s.ready = true;
                self.begin_upgrade_drain(self.time.now);
            }
            ToOld::WorkerUp(w) => {
                let ours = SUCCESSOR_WORKERS + w;
                s.workers.push(ours);
                self.money.worker_up(ours);
            }
            ToOld::WorkerDown(w) => {
                let ours = SUCCESSOR_WORKERS + w;
                s.workers.retain(|&x| x != ours);
                self.money.worker_down(ours);
            }
            ToOld::Submit { mut origin, op } => {
                if s.quiet {
                    return; // past its word: never applied, never answered
                }
                origin.worker += SUCCESSOR_WORKERS;
                if op == Op::LoggedIn && s.ready {
                    s.admitted += 1;
                }
                self.money.submit(now_ms, origin, op);
            }
            ToOld::Admin { ticket, request } => {
                let ours = self.next_ticket;
                self.next_ticket += 1;
                s.tickets.insert(ours, ticket);
                self.money.admin(now_ms, ours, request);
            }
            ToOld::Quiet => s.quiet = true,
        }
    }

    /// The first answer: the sockets, the admin socket and the lock, beside a message that
    /// says what they are.
    fn hand_over_sockets(&mut self, pid: u32) {
        let (groups, mut fds) = self.sockets.handover();
        let Some(admin) = &self.admin_socket else {
            return self.refuse_successor("this server's admin socket cannot be handed over");
        };
        let admin_addr = match admin.local_addr() {
            Ok(a) => a,
            Err(e) => return self.refuse_successor(&format!("the admin socket: {e}")),
        };
        fds.push(admin.as_raw_fd());
        fds.push(self.lock_fd.as_raw_fd());
        let mut msg = Vec::new();
        encode(
            &ToNew::Handover {
                groups,
                admin: admin_addr,
                pid: std::process::id(),
                ticket_key: self.worker_cfg.tls.as_ref().map(|t| t.ticket_key),
            },
            &mut msg,
        );
        let s = self.successor.as_mut().expect("connected");
        // A few hundred bytes on a fresh socket: it goes whole.
        if let Err(e) = send_blocking(&s.stream, &msg, &fds) {
            tracing::warn!(error = %e, "handing the sockets over");
            return self.successor_gone();
        }
        tracing::info!(
            new_pid = pid,
            sockets = fds.len() - 2,
            "upgrade: the sockets handed over; the new server's operations are applied here until it has the ledger"
        );
    }

    fn refuse_successor(&mut self, why: &str) {
        if let Some(s) = self.successor.as_mut() {
            encode(&ToNew::Refused(why.into()), &mut s.outbuf);
            let _ = hongbao_sys::net::write_nonblocking(&mut s.stream, &s.outbuf);
        }
        tracing::warn!(why, "upgrade refused");
        self.successor_gone();
    }

    /// The new server's link closed: before it was ready, this one serves on as before;
    /// after, the drain goes on and it is said plainly.
    fn successor_gone(&mut self) {
        let Some(mut s) = self.successor.take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut s.stream);
        for w in s.workers {
            self.money.worker_down(w);
        }
        if s.ready {
            tracing::error!(
                new_pid = s.pid,
                "upgrade: the new server went away after taking the sockets; this one drains on and stops"
            );
        } else {
            tracing::warn!(
                new_pid = s.pid,
                "upgrade: the new server went away before it was ready; serving on"
            );
        }
    }

    /// The new server serves: stop accepting and drain, as SIGTERM does, over a window
    /// sized from the connections held and the rate the new server admits.
    fn begin_upgrade_drain(&mut self, now: Uptime) {
        let by_worker: Vec<(WorkerId, u64)> = self
            .workers
            .iter()
            .filter_map(|(&w, p)| Some((w, p.latest.as_ref()?.levels.connections)))
            .collect();
        let held: u64 = by_worker.iter().map(|&(_, n)| n).sum();
        let tls = self.worker_cfg.tls.is_some();
        if let Some(s) = self.successor.as_mut() {
            s.held = by_worker;
            s.held_total = held;
            s.drain_from = Some(now);
            s.admit_rate = self.cfg.processes.upgrade_admit_rate(tls);
        }
        let window = self.cfg.processes.upgrade_drain_window(held, tls);
        self.shutting_down = true;
        self.sockets.close_all();
        // The new server answers on the admin address now: ours closes its copy, off the
        // loop (its threads take a moment to end, and the new server's operations are
        // still applied here).
        if let Some(admin) = self.admin.take() {
            let _ = std::thread::Builder::new()
                .name("admin-stop".into())
                .spawn(move || drop(admin));
        }
        self.admin_socket.take();
        self.health.stopping(false);
        self.draining = Some((now, now + window + super::drain::DRAIN_LAST_WRITES));
        tracing::info!(
            connections = held,
            window_ms = window.as_millis() as u64,
            "upgrade: the new server is ready; draining here, the clients told to come back"
        );
        if let Some(s) = self.successor.as_mut() {
            let window_ms = window.as_millis() as u64;
            encode(
                &ToNew::Draining {
                    connections: held,
                    window_ms,
                },
                &mut s.outbuf,
            );
        }
        let window_ms = window.as_millis().min(u32::MAX.into()) as u32;
        let drain = ToWorker::Drain {
            window_ms,
            retry_after_ms: UPGRADE_RETRY_AFTER_MS,
        };
        for link in self.links.iter_mut().map(|(_, l)| l) {
            link::encode(&drain, &mut link.outbuf);
        }
    }

    /// An upgrade's turn of the loop: the drain over, the new server told to finish; once
    /// it is quiet and everything it sent is committed, the loop ends (`Stage::HandOver`).
    pub(super) fn upgrade_turn(&mut self, now: Uptime) -> Stage {
        let Some(s) = self.successor.as_ref() else {
            return Stage::Serving;
        };
        if !s.ready {
            return Stage::Serving;
        }
        let Some((_, until)) = self.draining else {
            return Stage::Serving;
        };
        self.grant_drain(now);
        let s = self.successor.as_mut().expect("looked");
        // Past the window, the workers still up are told to stop, and given a moment: the
        // ledger passes over once none is left, so that their ends are not in its pause.
        let drained = match s.stopping_workers {
            _ if self.worker_links.is_empty() => true,
            None if now >= until => {
                s.stopping_workers = Some(now);
                for link in self.links.iter_mut().map(|(_, l)| l) {
                    link::encode(&ToWorker::Shutdown, &mut link.outbuf);
                }
                false
            }
            Some(since) => now.since(since) >= WORKERS_STOP_WAIT,
            None => false,
        };
        let s = self.successor.as_ref().expect("looked");
        let began = self.draining.map(|(began, _)| began).unwrap_or(now);
        match s.finishing {
            None if drained => {
                let s = self.successor.as_mut().expect("looked");
                s.finishing = Some(now);
                let drain_ms = now.since(began).as_millis() as u64;
                encode(&ToNew::Finishing { drain_ms }, &mut s.outbuf);
                tracing::info!("upgrade: drained; asking the new server to stop sending");
                Stage::Serving
            }
            Some(since) if s.quiet || now.since(since) >= QUIET_WAIT => {
                let snap = self.money.snapshot();
                if snap.committed_seq >= snap.ledger_seq || now.since(since) >= QUIET_WAIT {
                    Stage::HandOver
                } else {
                    Stage::Serving
                }
            }
            _ => Stage::Serving,
        }
    }

    /// The drain's credit: while fewer than `in_flight_bound` of the clients let go have
    /// not logged in again at the new server, more are let go now, ahead of the window,
    /// each worker its share (`ToWorker::DrainTo`).
    fn grant_drain(&mut self, now: Uptime) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        if s.held_total == 0 || s.granted >= s.held_total {
            return;
        }
        if s.granted_at.is_some_and(|t| now.since(t) < GRANT_EVERY) {
            return;
        }
        let elapsed = s.drain_from.map_or(Duration::ZERO, |t| now.since(t));
        let target = drain_credit(s.held_total, s.admitted, s.admit_rate, elapsed);
        if target <= s.granted {
            return;
        }
        s.granted = target;
        s.granted_at = Some(now);
        for (w, count) in shares(&s.held, s.held_total, target) {
            if let Some(link) = self
                .worker_links
                .get(&w)
                .and_then(|&k| self.links.get_mut(k))
            {
                let count = count.min(u32::MAX.into()) as u32;
                link::encode(&ToWorker::DrainTo { count }, &mut link.outbuf);
            }
        }
    }

    /// Whether the core's clock stops: once the new server is quiet, nothing new is made
    /// here (its releases resume there, from the ledger).
    pub(super) fn ticking(&self) -> bool {
        !self.successor.as_ref().is_some_and(|s| s.quiet)
    }

    /// An output for the new server, taken (`None`), or left for this one.
    pub(super) fn for_successor(&mut self, out: Output) -> Option<Output> {
        let Some(s) = self.successor.as_mut() else {
            return Some(out);
        };
        let theirs = match out {
            Output::Reply { mut to, reply } if to.worker >= SUCCESSOR_WORKERS => {
                to.worker -= SUCCESSOR_WORKERS;
                Output::Reply { to, reply }
            }
            Output::Deal { worker, packets } if worker >= SUCCESSOR_WORKERS => Output::Deal {
                worker: worker - SUCCESSOR_WORKERS,
                packets,
            },
            Output::Admin { ticket, answer } if s.tickets.contains_key(&ticket) => Output::Admin {
                ticket: s.tickets.remove(&ticket).expect("looked"),
                answer,
            },
            // A notice for a user not connected here may be there (or offline: it waits in
            // the ledger for the next login either way).
            Output::Notice { user, notice } if self.presence.route(user).is_none() => {
                Output::Notice { user, notice }
            }
            other => return Some(other),
        };
        encode(&ToNew::Out(theirs), &mut s.outbuf);
        None
    }

    pub(super) fn flush_successor(&mut self) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        match hongbao_sys::net::write_nonblocking(&mut s.stream, &s.outbuf) {
            Ok(n) => link::consumed(&mut s.outbuf, n),
            Err(_) => self.successor_gone(),
        }
    }

    /// After the loop, with the ledger closed: the last answers and `LedgerYours`, written
    /// whole before this process goes.
    pub(super) fn hand_over_ledger(&mut self, seq: u64) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        // The new server makes its own upgrade socket once the ledger is its.
        let _ = std::fs::remove_file(socket_path(&self.cfg.ledger.data_dir));
        encode(&ToNew::LedgerYours { seq }, &mut s.outbuf);
        let out = std::mem::take(&mut s.outbuf);
        match send_blocking(&s.stream, &out, &[]) {
            Ok(()) => tracing::info!(
                ledger_seq = seq,
                "upgrade: the ledger handed over; this server stops"
            ),
            Err(e) => {
                tracing::error!(error = %e, "upgrade: telling the new server the ledger is its")
            }
        }
    }
}

/// Writes `bytes` whole (with `fds` on the first byte) on a non-blocking stream, waiting
/// while it is full.
fn send_blocking(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let fd = stream.as_raw_fd();
    // SAFETY: a borrowed view of the stream's descriptor for these calls; it is not closed
    // here (ManuallyDrop) and the stream outlives it.
    let view = std::mem::ManuallyDrop::new(unsafe {
        <std::os::unix::net::UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd)
    });
    view.set_nonblocking(false)?;
    let sent = fdpass::send_with_fds(&*view, bytes, fds);
    view.set_nonblocking(true)?;
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hundredth_may_be_on_the_way_and_each_worker_lets_go_its_share() {
        assert_eq!(in_flight_bound(200_000), 2_000);
        assert_eq!(in_flight_bound(500), MIN_IN_FLIGHT);
        // 1,000 of 3,000 for 3 workers holding 1,000, 1,500 and 500: a third each, up.
        let held = [(0, 1_000), (1, 1_500), (2, 500)];
        assert_eq!(shares(&held, 3_000, 1_000), [(0, 334), (1, 500), (2, 167)]);
        // All, and no more than each holds.
        assert_eq!(
            shares(&held, 3_000, 5_000),
            [(0, 1_000), (1, 1_500), (2, 500)]
        );
        assert_eq!(shares(&[], 0, 10), []);
    }

    /// On a simulated clock: 200,000 held, let go at most 1,000 a second after a first
    /// 2,000, and never more than 2,000 ahead of the new server's logins.
    #[test]
    fn the_drain_goes_no_faster_than_the_rate_nor_ahead_of_the_logins() {
        let at = |ms| Duration::from_millis(ms);
        // At the start: the bound, whatever the logins.
        assert_eq!(drain_credit(200_000, 0, 1_000, at(0)), 2_000);
        // The new server keeps up: the rate decides.
        assert_eq!(drain_credit(200_000, 11_000, 1_000, at(10_000)), 12_000);
        // It lags: the logins decide.
        assert_eq!(drain_credit(200_000, 3_000, 1_000, at(10_000)), 5_000);
        // Never past what is held.
        assert_eq!(drain_credit(200_000, 199_000, 1_000, at(900_000)), 200_000);
        assert_eq!(drain_credit(50, 0, 1_000, at(0)), 50);
    }
}
