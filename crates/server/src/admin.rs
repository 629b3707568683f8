//! The admin HTTP API (JSON; see docs/admin-api.md), on hongbao's HTTP server stack.
//!
//! Requests that touch money state or the workers are handed to the supervisor's loop as
//! `AdminRequest`s and answered from there (campaign creation only after its event is
//! committed). User look-ups and balances read the ledger beside the writer through the
//! money seam's `LedgerRead`, so they show exactly what is durable.

use std::sync::mpsc::{channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_http::{json_object, Request, Response, Server};
use hongbao_money::seam::{AdminRequest as MoneyRequest, LedgerRead};
use mio::Waker;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// How long a request waits for the supervisor.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

pub enum AdminRequest {
    /// Campaigns and the audit: the money side's.
    Money(MoneyRequest),
    Stats,
    Metrics,
    Broadcast(BroadcastRequest),
}

/// `POST /v1/broadcast`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BroadcastRequest {
    pub text: String,
}

pub struct AdminCommand {
    pub request: AdminRequest,
    pub reply: Sender<Response>,
}

/// Binds the admin address and serves it until the returned server is dropped.
pub fn start(
    addr: &str,
    reader: Option<Box<dyn LedgerRead>>,
    to_core: SyncSender<AdminCommand>,
    waker: Arc<Waker>,
) -> anyhow::Result<Server> {
    let reader = Mutex::new(reader);
    let to_core = Mutex::new(to_core);
    Server::start(addr, "admin", MAX_BODY, move |request| {
        let ask = |r: AdminRequest| ask_core(r, &to_core, &waker);
        route(&request, &reader, ask)
    })
    .map_err(|e| anyhow::anyhow!("binding the admin address {addr}: {e}"))
}

fn route(
    request: &Request,
    reader: &Mutex<Option<Box<dyn LedgerRead>>>,
    ask: impl Fn(AdminRequest) -> Response,
) -> Response {
    let read = |f: &dyn Fn(&dyn LedgerRead) -> Result<Response, String>| match reader
        .lock()
        .expect("the reader lock")
        .as_deref()
    {
        Some(reader) => f(reader).unwrap_or_else(|e| Response::error(500, e)),
        None => Response::error(503, "the ledger reader is unavailable"),
    };
    let money = |r: MoneyRequest| ask(AdminRequest::Money(r));
    match (request.method.as_str(), request.segments().as_slice()) {
        ("POST", ["v1", "campaigns", "shake"]) => match json_object(&request.body) {
            Ok(req) => money(MoneyRequest::CreateShake(req)),
            Err(e) => e,
        },
        ("POST", ["v1", "campaigns", "send"]) => match json_object(&request.body) {
            Ok(req) => money(MoneyRequest::CreateSend(req)),
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
        ("GET", ["v1", "stats"]) => ask(AdminRequest::Stats),
        ("GET", ["v1", "audit"]) => money(MoneyRequest::Audit),
        ("GET", ["metrics"]) => ask(AdminRequest::Metrics),
        (
            method,
            ["v1", "campaigns"]
            | ["v1", "campaigns", ..]
            | ["v1", "users", _]
            | ["v1", "stats" | "audit" | "broadcast" | "balances"]
            | ["metrics"],
        ) => Response::error(405, format!("{method} is not allowed on {}", request.path)),
        _ => Response::error(404, format!("no such endpoint: {}", request.path)),
    }
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
