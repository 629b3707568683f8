//! The admin HTTP API (JSON; see docs/admin-api.md), on hongbao's HTTP server stack.
//!
//! Requests that touch money state or the workers are handed to the supervisor's loop as
//! `AdminRequest`s and answered from there (campaign creation only after its event is
//! committed). User look-ups, balances and the ledger's wins and opens read the ledger
//! beside the writer through the money seam's `LedgerRead`, so they show exactly what is
//! durable.

use std::sync::mpsc::{channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_http::{json_object, Request, Response, Server};
use hongbao_money::error as money;
use hongbao_money::seam::{AdminRequest as MoneyRequest, LedgerRead, OpsCursor};
use mio::Waker;

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
) -> crate::error::Result<Server> {
    let reader = Mutex::new(reader);
    let to_core = Mutex::new(to_core);
    Server::start(addr, "admin", MAX_BODY, move |request| {
        let ask = |r: AdminRequest| ask_core(r, &to_core, &waker);
        route(&request, &reader, ask)
    })
    .map_err(|e| crate::error::Error::io(format!("binding the admin address {addr}"), e))
}

fn route(
    request: &Request,
    reader: &Mutex<Option<Box<dyn LedgerRead>>>,
    ask: impl Fn(AdminRequest) -> Response,
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
            | ["metrics"],
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
        };
        let reader: Mutex<Option<Box<dyn LedgerRead>>> = Mutex::new(Some(Box::new(Wins(ledger))));
        let response = route(&request, &reader, |_| Response::error(500, "no core here"));
        let body = serde_json::from_slice(&response.body).unwrap();
        (response.status, body)
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
