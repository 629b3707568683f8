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
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hongbao_money::seam::{AdminRequest, Op, Origin, Output};
use hongbao_money::WorkerId;
use hongbao_sys::clock::Uptime;
use hongbao_sys::fdpass;
use mio::net::{UnixListener, UnixStream};
use mio::Token;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::listen::GroupShape;
use crate::error::{Error, Result};
use crate::link::{self};

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
pub(super) const QUIET_WAIT: Duration = Duration::from_secs(10);

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
    pub(super) stream: UnixStream,
    pub(super) inbuf: Vec<u8>,
    pub(super) outbuf: Vec<u8>,
    pub(super) pid: Option<u32>,
    /// Its workers up here (their ids in this core).
    pub(super) workers: Vec<WorkerId>,
    /// Its admin tickets, by ours.
    pub(super) tickets: HashMap<u64, u64>,
    pub(super) ready: bool,
    /// When `Finishing` was sent.
    pub(super) finishing: Option<Uptime>,
    pub(super) quiet: bool,
    /// Logins at the new server since it was ready (its `LoggedIn` operations, applied here).
    pub(super) admitted: u64,
    /// The drain's credit: the connections held at its start by worker, all of them, and
    /// how many were let go ahead of the window so far (`grant_drain`).
    pub(super) held: Vec<(WorkerId, u64)>,
    pub(super) held_total: u64,
    pub(super) granted: u64,
    pub(super) granted_at: Option<Uptime>,
    /// When the drain began, and the fastest it lets connections go (a second).
    pub(super) drain_from: Option<Uptime>,
    pub(super) admit_rate: u64,
    /// When the workers still up at the window's end were told to stop.
    pub(super) stopping_workers: Option<Uptime>,
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

pub(super) const MIN_IN_FLIGHT: u64 = 100;

/// How often the drain's credit is looked at.
pub(super) const GRANT_EVERY: Duration = Duration::from_millis(20);

/// How long workers still up at the drain's end are given to stop before the ledger is
/// handed over regardless.
pub(super) const WORKERS_STOP_WAIT: Duration = Duration::from_secs(5);

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

/// Writes `bytes` whole (with `fds` on the first byte) on a non-blocking stream, waiting
/// while it is full.
pub(super) fn send_blocking(
    stream: &UnixStream,
    bytes: &[u8],
    fds: &[RawFd],
) -> std::io::Result<()> {
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
