//! The admin HTTP API (JSON; see docs/admin-api.md), on hongbao's HTTP server stack,
//! behind its door (`access.rs`: keys with roles, the browser checks, the admin log) —
//! and the operator console, a page at `/` that logs in with a key. `GET /healthz` and
//! `GET /readyz` answer an orchestrator's probes without a key (`health.rs`): they pass
//! the browser checks and say nothing but whether the server lives and takes shakes.
//!
//! Requests that touch money state or the workers are handed to the supervisor's loop as
//! `AdminRequest`s and answered from there (campaign creation only after its event is
//! committed). User look-ups, balances and the ledger's wins and opens read the ledger
//! beside the writer through the money seam's `LedgerRead`, so they show exactly what is
//! durable.

mod routes;

use std::net::SocketAddr;
use std::sync::mpsc::{channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_http::{Response, Server};
use hongbao_money::access::{AccessStore, Role};
use hongbao_money::seam::{AdminRequest as MoneyRequest, LedgerRead};
use mio::Waker;

use crate::access::Door;
use crate::health::Health;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// How long a request waits for the supervisor.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// Wins and opens in a page of `GET /v1/ledger/ops`, unless asked otherwise, and at most:
/// a bench at the seed scale holds some 280,000, a few megabytes of JSON at most a page.
pub const OPS_PAGE: usize = 10_000;
pub const MAX_OPS_PAGE: usize = 100_000;

pub enum AdminRequest {
    /// Campaigns and the audit: the money side's.
    Money(MoneyRequest),
    Stats,
    Metrics,
    Broadcast(BroadcastRequest),
    /// A revocation, durable already: the core refuses the user's older tokens from now
    /// on and kicks its connection here (from the API, or read from the store, where
    /// another host wrote it).
    Revoked {
        user: u64,
        at: u64,
    },
}

/// `POST /v1/broadcast`.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BroadcastRequest {
    pub text: String,
}

/// `POST /v1/broadcast`'s answer: its id and time, and how many connections the workers
/// that answered in time are writing it to (the bench reads it through this type).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Broadcasted {
    pub connections: u64,
    pub id: u64,
    pub server_time_us: u64,
    pub workers: usize,
}

/// `POST /v1/admin-keys`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    name: String,
    role: Role,
}

pub struct AdminCommand {
    pub request: AdminRequest,
    pub reply: Sender<Response>,
}

/// The admin address being served, and the thread that writes the refusals its door
/// folded once their second is over; both stop when this is dropped.
pub struct AdminServer {
    server: Option<Server>,
    door: Arc<Door>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    flusher: Option<std::thread::JoinHandle<()>>,
}

impl AdminServer {
    pub fn addr(&self) -> SocketAddr {
        self.server.as_ref().expect("serving").addr()
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        drop(self.server.take());
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        // What the last second folded, before the ledger closes.
        self.door.flush_refusals();
    }
}

/// Binds the admin address and serves it until the returned server is dropped. `door`
/// is made for the address bound (its browser checks name it); `health` is what the
/// probes are told.
/// The admin address, bound (given to `start`, or handed over in an upgrade).
pub fn bind(addr: &str) -> crate::error::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr)
        .map_err(|e| crate::error::Error::io(format!("binding the admin address {addr}"), e))
}

pub fn start(
    listener: std::net::TcpListener,
    door: impl FnOnce(SocketAddr) -> Door,
    health: Arc<Health>,
    tls: Option<hongbao_http::tls::Reloadable>,
    reader: Option<Box<dyn LedgerRead>>,
    to_supervisor: SyncSender<AdminCommand>,
    waker: Arc<Waker>,
) -> crate::error::Result<AdminServer> {
    let bound = listener
        .local_addr()
        .map_err(|e| crate::error::Error::io("reading the admin address", e))?;
    let door = Arc::new(door(bound));
    let reader = Mutex::new(reader);
    let to_supervisor = Mutex::new(to_supervisor);
    // Over TLS, a client refused in its handshake is on the admin log too.
    let tls = tls.map(|config| {
        let door = door.clone();
        hongbao_http::ServeTls {
            config,
            on_refused: Arc::new(move |peer, why| door.refused_handshake(peer, why)),
        }
    });
    let serving = door.clone();
    let server = Server::serve_tls(listener, "admin", MAX_BODY, tls, move |request| {
        let ask = |r: AdminRequest| ask_supervisor(r, &to_supervisor, &waker);
        routes::handle(&request, &serving, &health, &reader, ask)
    })
    .map_err(|e| crate::error::Error::io(format!("serving the admin address {bound}"), e))?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (door, stop) = (door.clone(), stop.clone());
        std::thread::Builder::new()
            .name("admin-log".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(crate::access::FOLD_FLUSH_EVERY);
                    door.flush_refusals();
                }
            })
            .map_err(|e| crate::error::Error::io("starting the admin log's writer", e))?
    };
    Ok(AdminServer {
        server: Some(server),
        door,
        stop,
        flusher: Some(flusher),
    })
}

/// Reads the revocations other hosts (and `hongbao` tools) wrote, once a second, and
/// hands each to the core: a revocation on one host reaches every host within about a
/// second. Starts from the revocations still in force (`horizon` seconds: the longest a
/// token lives), so a restarted server refuses what was revoked before.
pub fn watch_revocations(
    store: Arc<dyn AccessStore>,
    horizon: u64,
    to_supervisor: SyncSender<AdminCommand>,
    waker: Arc<Waker>,
    stop: hongbao_sys::Stop,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("revocations".into())
        .spawn(move || {
            let mut after = 0;
            while !stop.requested() {
                let since = (hongbao_sys::clock::unix_ms() / 1000).saturating_sub(horizon);
                match store.revocations(after, since) {
                    Ok(found) => {
                        for r in found {
                            after = after.max(r.id);
                            let (reply, _) = std::sync::mpsc::channel();
                            let request = AdminRequest::Revoked {
                                user: r.user,
                                at: r.at,
                            };
                            if to_supervisor.send(AdminCommand { request, reply }).is_err() {
                                return;
                            }
                            let _ = waker.wake();
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading revocations failed; trying again")
                    }
                }
                // A second between reads, looking at the stop every 100 ms.
                for _ in 0..10 {
                    if stop.requested() {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        })
        .expect("starting the revocations thread")
}

fn ask_supervisor(
    request: AdminRequest,
    to_supervisor: &Mutex<SyncSender<AdminCommand>>,
    waker: &Waker,
) -> Response {
    let (reply, answer) = channel();
    let sender = to_supervisor.lock().expect("the channel lock").clone();
    if sender.send(AdminCommand { request, reply }).is_err() {
        return Response::error(503, "the core is shutting down");
    }
    let _ = waker.wake();
    answer
        .recv_timeout(ANSWER_WAIT)
        .unwrap_or_else(|_| Response::error(503, "the core did not answer in time"))
}
