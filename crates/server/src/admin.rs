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

use std::net::SocketAddr;
use std::sync::mpsc::{channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_http::access::changes_state;
use hongbao_http::{json_object, Request, Response, Server};
use hongbao_money::access::{AccessStore, Revocation, Role};
use hongbao_money::error as money;
use hongbao_money::seam::{AdminRequest as MoneyRequest, LedgerRead, OpsCursor};
use mio::Waker;

use crate::access::{self, console, error_text, Caller, Door};
use crate::health::{self, Health};

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
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BroadcastRequest {
    pub text: String,
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
    to_core: SyncSender<AdminCommand>,
    waker: Arc<Waker>,
) -> crate::error::Result<AdminServer> {
    let bound = listener
        .local_addr()
        .map_err(|e| crate::error::Error::io("reading the admin address", e))?;
    let door = Arc::new(door(bound));
    let reader = Mutex::new(reader);
    let to_core = Mutex::new(to_core);
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
        let ask = |r: AdminRequest| ask_core(r, &to_core, &waker);
        handle(&request, &serving, &health, &reader, ask)
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

/// What the admin log records of an endpoint's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// A change: campaigns, broadcasts, keys.
    Change,
    /// A read of a user's data.
    UserRead,
    /// The audit: recorded with the ledger's hash-chain head it published, so the admin
    /// log keeps a trail of heads (docs/ledger.md).
    Audit,
    No,
}

/// The role an endpoint needs and what is recorded of its use; `None`: no such endpoint
/// (404 or 405, answered without a key: nothing is there to guard).
fn needs(method: &str, segments: &[&str]) -> Option<(Role, Record)> {
    use Record::*;
    use Role::*;
    Some(match (method, segments) {
        ("GET", ["metrics"] | ["v1", "stats"]) => (Metrics, No),
        ("GET", ["v1", "campaigns"] | ["v1", "campaigns", _]) => (Viewer, No),
        ("GET", ["v1", "audit"]) => (Viewer, Audit),
        ("GET", ["v1", "users", _] | ["v1", "balances"] | ["v1", "ledger", "ops"]) => {
            (Viewer, UserRead)
        }
        ("POST", ["v1", "campaigns", "shake" | "send"] | ["v1", "broadcast"]) => (Operator, Change),
        ("GET", ["v1", "admin-keys"] | ["v1", "admin-log"]) => (Operator, No),
        ("POST", ["v1", "admin-keys"]) | ("DELETE", ["v1", "admin-keys", _]) => (Operator, Change),
        ("POST", ["v1", "users", _, "revoke"]) => (Operator, Change),
        _ => return None,
    })
}

/// The admin API behind its door: the probes and the console's page and sessions; then,
/// for every endpoint, the browser checks, the key and its role, the endpoint, and the
/// record of it before the answer.
fn handle(
    request: &Request,
    door: &Door,
    health: &Health,
    reader: &Mutex<Option<Box<dyn LedgerRead>>>,
    ask: impl Fn(AdminRequest) -> Response,
) -> Response {
    let segments = request.segments();
    match (request.method.as_str(), segments.as_slice()) {
        // A probe has no key to give, and is told nothing a key would guard.
        ("GET", ["healthz"]) => {
            return door
                .guard(request)
                .map_or_else(|refused| refused, |()| health::healthz())
        }
        ("GET", ["readyz"]) => {
            return door
                .guard(request)
                .map_or_else(|refused| refused, |()| health::readyz(health))
        }
        ("GET", []) => {
            return match door.guard(request) {
                Ok(()) => Response::new(200, "text/html; charset=utf-8", console::PAGE)
                    .with_header("cache-control", "no-store"),
                Err(refused) => refused,
            }
        }
        ("POST", ["console", "login"]) => {
            if let Err(refused) = door.guard(request) {
                return refused;
            }
            let (answer, caller) = door.sessions.login(request, door);
            if answer.status != 200 {
                door.refused(request, None, &answer);
                return answer;
            }
            return recorded(door, request, caller.as_ref(), answer, "console log-in");
        }
        ("POST", ["console", "logout"]) => {
            return match door.guard(request) {
                Ok(()) => door.sessions.logout(request),
                Err(refused) => refused,
            }
        }
        ("GET", ["console", "session"]) => {
            return match door.admit(request, Role::Metrics) {
                Ok(caller) => door.sessions.describe(request, &caller),
                Err(refused) => refused,
            }
        }
        _ => {}
    }
    let Some((role, record)) = needs(&request.method, &segments) else {
        return serve(request, "", door, reader, &ask);
    };
    let caller = match door.admit(request, role) {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let answer = serve(request, &caller.key, door, reader, &ask);
    match record {
        Record::No => answer,
        Record::Change | Record::UserRead | Record::Audit => {
            let result = if answer.status < 300 {
                summary(request, &answer)
            } else {
                error_text(&answer)
            };
            recorded(door, request, Some(&caller), answer, &result)
        }
    }
}

/// `answer`, once the admin log holds its record; if it cannot be written, the answer is
/// withheld (a 503 that says whether a change was made all the same).
fn recorded(
    door: &Door,
    request: &Request,
    caller: Option<&Caller>,
    answer: Response,
    result: &str,
) -> Response {
    match door.record(request, caller, &answer, result) {
        Ok(_) => answer,
        Err(e) => {
            tracing::error!(error = %e, path = %request.path, "writing the admin log failed");
            let done = if changes_state(&request.method) && answer.status < 300 {
                " (the change was made: look before trying again)"
            } else {
                ""
            };
            Response::error(
                503,
                format!("the admin log could not be written{done}: {e}"),
            )
        }
    }
}

/// What an accepted request made, in a few words, for the admin log.
fn summary(request: &Request, answer: &Response) -> String {
    let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    match request.segments().as_slice() {
        ["v1", "campaigns", kind] => format!(
            "{kind} campaign {} started by {}",
            body["id"],
            body["created_by"].as_str().unwrap_or("?")
        ),
        ["v1", "broadcast"] => format!("broadcast to {} connections", body["connections"]),
        ["v1", "audit"] => {
            // Embedded: one head; cluster mode: one a gateway host.
            let heads = match body["ledger_head"].as_str() {
                Some(head) => format!("ledger head {head}"),
                None => format!("ledger heads {}", body["ledger_heads"]),
            };
            format!(
                "audit ok={} ledger_seq={} {heads}",
                body["ok"], body["ledger_seq"]
            )
        }
        ["v1", "admin-keys"] => format!("key {} made, role {}", body["name"], body["role"]),
        ["v1", "admin-keys", name] => format!("key {name:?} removed"),
        ["v1", "users", user, "revoke"] => format!(
            "user {user}'s tokens issued before {} revoked; {} connection(s) kicked here",
            body["revoked_before"], body["kicked"]
        ),
        _ => format!("answered {}", answer.status),
    }
}

/// An endpoint's answer, for `caller` (a key's name; empty for the 404 and 405 answers
/// of paths that need no key).
fn serve(
    request: &Request,
    caller: &str,
    door: &Door,
    reader: &Mutex<Option<Box<dyn LedgerRead>>>,
    ask: &dyn Fn(AdminRequest) -> Response,
) -> Response {
    let failed = |e: money::Error| Response::error(e.kind().http_status(), e.to_string());
    match (request.method.as_str(), request.segments().as_slice()) {
        ("GET", ["v1", "admin-keys"]) => match door.store().keys() {
            Ok(keys) => {
                let keys: Vec<_> = keys
                    .into_iter()
                    .map(|k| {
                        serde_json::json!({
                            "name": k.name, "role": k.role,
                            "created_ms": k.created_ms, "created_by": k.created_by,
                        })
                    })
                    .collect();
                Response::json(200, &keys)
            }
            Err(e) => failed(e),
        },
        ("POST", ["v1", "admin-keys"]) => match json_object::<NewKey>(&request.body) {
            Ok(new) => match access::make_key(door.store().as_ref(), &new.name, new.role, caller) {
                Ok(key) => {
                    door.keys_changed();
                    let made =
                        serde_json::json!({ "name": new.name, "role": new.role, "key": key });
                    Response::json(201, &made)
                }
                Err(e) => failed(e),
            },
            Err(bad) => bad,
        },
        ("DELETE", ["v1", "admin-keys", name]) => remove_key(door, name),
        ("POST", ["v1", "users", user, "revoke"]) => revoke(door, user, caller, ask),
        ("GET", ["v1", "admin-log"]) => match log_query(&request.query) {
            Ok((before, limit)) => match door.store().log(before, limit) {
                Ok(entries) => {
                    let next = entries
                        .last()
                        .filter(|_| entries.len() == limit)
                        .map(|e| e.id);
                    Response::json(
                        200,
                        &serde_json::json!({ "entries": entries, "next": next }),
                    )
                }
                Err(e) => failed(e),
            },
            Err(e) => Response::error(400, e),
        },
        _ => route(request, caller, reader, ask),
    }
}

/// `DELETE /v1/admin-keys/NAME`: the last operator key stays (no one would be left who
/// may change anything).
fn remove_key(door: &Door, name: &str) -> Response {
    let keys = match door.store().keys() {
        Ok(keys) => keys,
        Err(e) => return Response::error(e.kind().http_status(), e.to_string()),
    };
    let Some(key) = keys.iter().find(|k| k.name == name) else {
        return Response::error(404, format!("no key named {name:?}"));
    };
    let operators = keys.iter().filter(|k| k.role == Role::Operator).count();
    if key.role == Role::Operator && operators == 1 {
        return Response::error(
            409,
            "the last operator key cannot be removed; add another first",
        );
    }
    match door.store().remove_key(name) {
        Ok(_) => {
            door.keys_changed();
            Response::json(200, &serde_json::json!({ "removed": name }))
        }
        Err(e) => Response::error(e.kind().http_status(), e.to_string()),
    }
}

/// `POST /v1/users/ID/revoke`: every token of the user issued before now is refused,
/// on every host, from now on. Written to the store first (it outlives a restart, and
/// the other hosts read it from there within a second), then the core here is told.
fn revoke(
    door: &Door,
    user: &str,
    caller: &str,
    ask: &dyn Fn(AdminRequest) -> Response,
) -> Response {
    let Some(user) = user.parse::<u64>().ok().filter(|&u| u > 0) else {
        return Response::error(400, format!("user id {user:?} is not a positive integer"));
    };
    // Tokens carry whole seconds: one issued in this second counts as before it.
    let at = hongbao_sys::clock::unix_ms().div_ceil(1000);
    let revocation = Revocation {
        id: 0,
        user,
        at,
        by: caller.to_string(),
    };
    if let Err(e) = door.store().revoke(&revocation) {
        return Response::error(e.kind().http_status(), e.to_string());
    }
    ask(AdminRequest::Revoked { user, at })
}

/// Reads the revocations other hosts (and `hongbao` tools) wrote, once a second, and
/// hands each to the core: a revocation on one host reaches every host within about a
/// second. Starts from the revocations still in force (`horizon` seconds: the longest a
/// token lives), so a restarted server refuses what was revoked before.
pub fn watch_revocations(
    store: Arc<dyn AccessStore>,
    horizon: u64,
    to_core: SyncSender<AdminCommand>,
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
                            if to_core.send(AdminCommand { request, reply }).is_err() {
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

/// `GET /v1/admin-log`'s query: `before` (a page's `next`) and `limit` (1..=1000, 100).
fn log_query(query: &str) -> Result<(Option<u64>, usize), String> {
    let (mut before, mut limit) = (None, 100);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("before", v)) => {
                let id = v
                    .parse()
                    .map_err(|_| format!("before {v:?} is not an entry id"))?;
                before = Some(id);
            }
            Some(("limit", v)) => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or("limit must be 1..=1000")?;
            }
            _ => {
                return Err(format!(
                    "unknown query parameter {pair:?}: only before and limit"
                ))
            }
        }
    }
    Ok((before, limit))
}

/// The endpoints of money and the workers, for `caller` (who a campaign names as its
/// maker).
fn route(
    request: &Request,
    caller: &str,
    reader: &Mutex<Option<Box<dyn LedgerRead>>>,
    ask: &dyn Fn(AdminRequest) -> Response,
) -> Response {
    // What a read's failure says decides its answer: a refusal 400, a ledger out of
    // reach 503 (try again), ours 500.
    let read = |f: &dyn Fn(&dyn LedgerRead) -> money::Result<Response>| match reader
        .lock()
        .expect("the reader lock")
        .as_deref()
    {
        Some(reader) => {
            f(reader).unwrap_or_else(|e| Response::error(e.kind().http_status(), e.to_string()))
        }
        None => Response::error(503, "the ledger reader is unavailable"),
    };
    let money = |r: MoneyRequest| ask(AdminRequest::Money(r));
    let by = caller.to_string();
    match (request.method.as_str(), request.segments().as_slice()) {
        ("POST", ["v1", "campaigns", "shake"]) => match json_object(&request.body) {
            Ok(request) => money(MoneyRequest::CreateShake { request, by }),
            Err(e) => e,
        },
        ("POST", ["v1", "campaigns", "send"]) => match json_object(&request.body) {
            Ok(request) => money(MoneyRequest::CreateSend { request, by }),
            Err(e) => e,
        },
        ("POST", ["v1", "broadcast"]) => match json_object::<BroadcastRequest>(&request.body) {
            Ok(req) if req.text.len() > hongbao_proto::message::MAX_TEXT_LEN => Response::error(
                400,
                format!(
                    "text is {} bytes; at most {}",
                    req.text.len(),
                    hongbao_proto::message::MAX_TEXT_LEN
                ),
            ),
            Ok(req) => ask(AdminRequest::Broadcast(req)),
            Err(e) => e,
        },
        ("GET", ["v1", "campaigns"]) => money(MoneyRequest::Campaigns),
        ("GET", ["v1", "campaigns", id]) => match id.parse() {
            Ok(id) => money(MoneyRequest::Campaign(id)),
            Err(_) => Response::error(400, format!("campaign id {id:?} is not a number")),
        },
        ("GET", ["v1", "users", id]) => match id.parse::<u64>() {
            Ok(user) => read(&|r| Ok(Response::json(200, &r.user(user, 20)?))),
            Err(_) => Response::error(400, format!("user id {id:?} is not a number")),
        },
        ("GET", ["v1", "balances"]) => read(&|r| Ok(Response::json(200, &r.balances()?))),
        ("GET", ["v1", "ledger", "ops"]) => match ops_query(&request.query) {
            Ok((after, limit)) => read(&|r| Ok(Response::json(200, &r.ops(after, limit)?))),
            Err(e) => Response::error(400, e),
        },
        ("GET", ["v1", "stats"]) => ask(AdminRequest::Stats),
        ("GET", ["v1", "audit"]) => money(MoneyRequest::Audit),
        ("GET", ["metrics"]) => ask(AdminRequest::Metrics),
        (
            method,
            ["v1", "campaigns"]
            | ["v1", "campaigns", ..]
            | ["v1", "users", _]
            | ["v1", "stats" | "audit" | "broadcast" | "balances"]
            | ["v1", "ledger", "ops"]
            | ["v1", "admin-keys" | "admin-log"]
            | ["v1", "admin-keys", _]
            | ["console", ..]
            | ["metrics" | "healthz" | "readyz"],
        ) => Response::error(405, format!("{method} is not allowed on {}", request.path)),
        _ => Response::error(404, format!("no such endpoint: {}", request.path)),
    }
}

/// `GET /v1/ledger/ops`'s query: `after` (a page's `next`) and `limit`, each at most
/// once; nothing else.
fn ops_query(query: &str) -> Result<(Option<OpsCursor>, usize), String> {
    let (mut after, mut limit) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("after", v)) if after.is_none() => after = Some(v.parse::<OpsCursor>()?),
            Some(("limit", v)) if limit.is_none() => {
                limit = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_OPS_PAGE).contains(n))
                        .ok_or_else(|| format!("limit must be 1..={MAX_OPS_PAGE}"))?,
                )
            }
            _ => {
                return Err(format!(
                    "unknown or repeated query parameter {pair:?}: only after and limit"
                ))
            }
        }
    }
    Ok((after, limit.unwrap_or(OPS_PAGE)))
}

fn ask_core(
    request: AdminRequest,
    to_core: &Mutex<SyncSender<AdminCommand>>,
    waker: &Waker,
) -> Response {
    let (reply, answer) = channel();
    let sender = to_core.lock().expect("the channel lock").clone();
    if sender.send(AdminCommand { request, reply }).is_err() {
        return Response::error(503, "the core is shutting down");
    }
    let _ = waker.wake();
    answer
        .recv_timeout(ANSWER_WAIT)
        .unwrap_or_else(|_| Response::error(503, "the core did not answer in time"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hongbao_money::seam::{Balances, LedgerOp, OpsPage};
    use hongbao_money::UserView;

    /// A ledger of `n` wins to user 7 (packet = amount = index), paged by index.
    struct Wins(u64);

    impl LedgerRead for Wins {
        fn user(&self, _: u64, _: usize) -> money::Result<UserView> {
            Err(money::Error::bug("not here"))
        }
        fn balances(&self) -> money::Result<Balances> {
            Err(money::Error::bug("not here"))
        }
        fn ops(&self, after: Option<OpsCursor>, limit: usize) -> money::Result<OpsPage> {
            let from = match after {
                None => 0,
                Some(OpsCursor::Seq(seq)) => seq,
                Some(other) => {
                    return Err(money::Error::refused(format!(
                        "cursor {other} is not this ledger's"
                    )))
                }
            };
            let to = (from + limit as u64).min(self.0);
            Ok(OpsPage {
                wins: (from..to)
                    .map(|i| LedgerOp {
                        packet: i + 1,
                        user: 7,
                        amount_cents: i + 1,
                    })
                    .collect(),
                opens: Vec::new(),
                next: (to - from == limit as u64).then_some(OpsCursor::Seq(to)),
            })
        }
    }

    fn get(path_and_query: &str, ledger: u64) -> (u16, serde_json::Value) {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let request = Request {
            method: "GET".into(),
            path: path.into(),
            query: query.into(),
            headers: Vec::new(),
            body: Default::default(),
            peer: "127.0.0.1:9".parse().unwrap(),
        };
        let reader: Mutex<Option<Box<dyn LedgerRead>>> = Mutex::new(Some(Box::new(Wins(ledger))));
        let no_core = |_| Response::error(500, "no core here");
        let response = route(&request, "viewer", &reader, &no_core);
        let body = serde_json::from_slice(&response.body).unwrap();
        (response.status, body)
    }

    /// A request to the whole admin door (`handle`) of a server whose admin address is
    /// 127.0.0.1:7001, with `headers`; no core behind it.
    fn ask_door(
        door: &Door,
        health: &Health,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Response {
        let request = Request {
            method: method.into(),
            path: path.into(),
            query: String::new(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: Default::default(),
            peer: "127.0.0.1:9".parse().unwrap(),
        };
        let reader: Mutex<Option<Box<dyn LedgerRead>>> = Mutex::new(None);
        let no_core = |_| Response::error(500, "no core here");
        handle(&request, door, health, &reader, no_core)
    }

    #[test]
    fn the_probes_need_no_key_pass_the_browser_checks_and_are_not_logged() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn AccessStore> =
            Arc::new(hongbao_embedded::access::SqliteAccess::open(dir.path()).unwrap());
        let bound = "127.0.0.1:7001".parse().unwrap();
        let door = Door::new(
            store.clone(),
            hongbao_http::access::BrowserGuard::new(bound, &[], &[]),
            false,
            Default::default(),
        );
        let health = Health::new();
        // A kubelet's probe names the pod's address and port.
        let probe = [
            ("host", "127.0.0.1:7001"),
            ("user-agent", "kube-probe/1.31"),
        ];

        let live = ask_door(&door, &health, "GET", "/healthz", &probe);
        assert_eq!((live.status, live.body.as_slice()), (200, &b"ok\n"[..]));
        let starting = ask_door(&door, &health, "GET", "/readyz", &probe);
        assert_eq!(starting.status, 503);
        assert!(starting.body.starts_with(b"not ready: starting"));
        health.turn(std::time::Instant::now(), 2, 2);
        health.serving();
        let ready = ask_door(&door, &health, "GET", "/readyz/", &probe);
        assert_eq!(
            (ready.status, ready.body.as_slice()),
            (200, &b"ready\n"[..])
        );
        assert!(
            store.log(None, 100).unwrap().is_empty(),
            "a probe is not recorded"
        );

        // The browser checks stand: a rebound name, a foreign page.
        let rebound = [("host", "evil.example:7001")];
        assert_eq!(
            ask_door(&door, &health, "GET", "/readyz", &rebound).status,
            403
        );
        let foreign = [
            ("host", "127.0.0.1:7001"),
            ("origin", "https://evil.example"),
        ];
        assert_eq!(
            ask_door(&door, &health, "GET", "/healthz", &foreign).status,
            403
        );
        // GET only (another method is 405, as on every known path); everything else
        // still needs its key.
        assert_eq!(
            ask_door(&door, &health, "POST", "/healthz", &probe).status,
            405
        );
        assert_eq!(
            ask_door(&door, &health, "PUT", "/readyz", &probe).status,
            405
        );
        assert_eq!(
            ask_door(&door, &health, "DELETE", "/healthz", &probe).status,
            405
        );
        assert_eq!(
            ask_door(&door, &health, "GET", "/v1/stats", &probe).status,
            401
        );
        assert_eq!(
            ask_door(&door, &health, "GET", "/healthz/x", &probe).status,
            404
        );
    }

    #[test]
    fn ledger_ops_are_paged_by_the_cursor_each_page_gives() {
        let (status, page) = get("/v1/ledger/ops", 3);
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["wins"].as_array().unwrap().len(), 3);
        assert_eq!(
            page["wins"][2],
            serde_json::json!({"packet": 3, "user": 7, "amount_cents": 3})
        );
        assert_eq!(page["next"], serde_json::Value::Null);

        let (_, first) = get("/v1/ledger/ops?limit=2", 5);
        assert_eq!(first["next"], "seq.2");
        let (_, second) = get("/v1/ledger/ops?after=seq.2&limit=2", 5);
        assert_eq!(second["wins"][0]["packet"], 3);
        let (_, last) = get("/v1/ledger/ops?limit=2&after=seq.4", 5);
        assert_eq!(last["wins"].as_array().unwrap().len(), 1);
        assert_eq!(last["next"], serde_json::Value::Null);
    }

    #[test]
    fn a_bad_ledger_ops_query_is_refused() {
        for query in [
            "limit=0",
            "limit=100001",
            "limit=x",
            "after=7",
            "after=seq.x",
            "after=seq.1&after=seq.2",
            "limit=1&limit=2",
            "since=1",
            "after",
        ] {
            let (status, body) = get(&format!("/v1/ledger/ops?{query}"), 3);
            assert_eq!(status, 400, "{query}: {body}");
            assert!(body["error"].is_string(), "{query}: {body}");
        }
        // A cursor of another kind of ledger: the ledger refuses it (a refusal is 400; a
        // ledger out of reach would be 503, and only our own failure 500).
        let (status, body) = get("/v1/ledger/ops?after=win.1", 3);
        assert_eq!(status, 400, "{body}");
        assert_eq!(get("/v1/ledger/ops?limit=100000", 3).0, 200);
    }
}
