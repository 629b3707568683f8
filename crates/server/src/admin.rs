//! The admin HTTP API (JSON; see docs/admin-api.md) on a couple of threads of its own.
//!
//! Requests that touch money state are handed to the supervisor's loop as `AdminRequest`s
//! and answered from there (campaign creation only after its event is committed). User
//! look-ups read the ledger directly through a read-only SQLite connection (WAL lets them
//! run beside the writer), so they show exactly what is durable.

use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use mio::Waker;
use serde::Serialize;
use tiny_http::{Header, Method, Request, Response, Server};

use hongbao_money::seam::{AdminRequest as MoneyRequest, LedgerRead};

use crate::embedded::ledger::Reader;

const MAX_BODY: u64 = 64 * 1024;

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

pub struct AdminResponse {
    pub status: u16,
    pub body: String,
    pub content_type: &'static str,
}

impl AdminResponse {
    pub fn json<T: Serialize>(status: u16, value: &T) -> AdminResponse {
        let body = serde_json::to_string_pretty(value).expect("admin responses serialize");
        AdminResponse {
            status,
            body,
            content_type: "application/json",
        }
    }

    pub fn error(status: u16, message: impl Into<String>) -> AdminResponse {
        AdminResponse::json(status, &serde_json::json!({ "error": message.into() }))
    }
}

pub struct AdminCommand {
    pub request: AdminRequest,
    pub reply: Sender<AdminResponse>,
}

/// Binds the admin address; returns the bound address.
pub fn start(
    addr: &str,
    ledger_path: PathBuf,
    to_core: SyncSender<AdminCommand>,
    waker: Arc<Waker>,
) -> anyhow::Result<std::net::SocketAddr> {
    let server =
        Server::http(addr).map_err(|e| anyhow::anyhow!("binding admin address {addr}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow::anyhow!("admin address {addr} is not an IP address"))?;
    let server = Arc::new(server);
    for i in 0..2 {
        let (server, to_core, waker, path) = (
            server.clone(),
            to_core.clone(),
            waker.clone(),
            ledger_path.clone(),
        );
        std::thread::Builder::new()
            .name(format!("admin-{i}"))
            .spawn(move || {
                let reader = Reader::open(&path).ok();
                for mut request in server.incoming_requests() {
                    let reader = reader.as_ref().map(|r| r as &dyn LedgerRead);
                    let response = route(&mut request, reader, &to_core, &waker);
                    respond(request, response);
                }
            })?;
    }
    Ok(bound)
}

fn respond(request: Request, response: AdminResponse) {
    let header = Header::from_bytes("Content-Type", response.content_type).expect("static header");
    let reply = Response::from_string(response.body)
        .with_status_code(response.status)
        .with_header(header);
    let _ = request.respond(reply);
}

fn route(
    request: &mut Request,
    reader: Option<&dyn LedgerRead>,
    to_core: &SyncSender<AdminCommand>,
    waker: &Waker,
) -> AdminResponse {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = request.method().clone();
    let ask = |request: AdminRequest| ask_core(request, to_core, waker);
    match (method, segments.as_slice()) {
        (Method::Post, ["v1", "campaigns", "shake"]) => match body_json(request) {
            Ok(req) => ask(AdminRequest::Money(MoneyRequest::CreateShake(req))),
            Err(e) => e,
        },
        (Method::Post, ["v1", "campaigns", "send"]) => match body_json(request) {
            Ok(req) => ask(AdminRequest::Money(MoneyRequest::CreateSend(req))),
            Err(e) => e,
        },
        (Method::Post, ["v1", "broadcast"]) => match body_json::<BroadcastRequest>(request) {
            Ok(req) if req.text.len() > hongbao_proto::message::MAX_TEXT_LEN => {
                AdminResponse::error(
                    400,
                    format!(
                        "text is {} bytes; at most {}",
                        req.text.len(),
                        hongbao_proto::message::MAX_TEXT_LEN
                    ),
                )
            }
            Ok(req) => ask(AdminRequest::Broadcast(req)),
            Err(e) => e,
        },
        (Method::Get, ["v1", "campaigns"]) => ask(AdminRequest::Money(MoneyRequest::Campaigns)),
        (Method::Get, ["v1", "campaigns", id]) => match id.parse() {
            Ok(id) => ask(AdminRequest::Money(MoneyRequest::Campaign(id))),
            Err(_) => AdminResponse::error(400, format!("campaign id {id:?} is not a number")),
        },
        (Method::Get, ["v1", "users", id]) => match (id.parse::<u64>(), reader) {
            (Ok(user), Some(reader)) => match LedgerRead::user(reader, user, 20) {
                Ok(view) => AdminResponse::json(200, &view),
                Err(e) => AdminResponse::error(500, e),
            },
            (Ok(_), None) => AdminResponse::error(503, "the ledger reader is unavailable"),
            (Err(_), _) => AdminResponse::error(400, format!("user id {id:?} is not a number")),
        },
        (Method::Get, ["v1", "stats"]) => ask(AdminRequest::Stats),
        (Method::Get, ["v1", "audit"]) => ask(AdminRequest::Money(MoneyRequest::Audit)),
        (Method::Get, ["v1", "balances"]) => match reader {
            Some(reader) => match reader.balances() {
                Ok(balances) => AdminResponse::json(200, &balances),
                Err(e) => AdminResponse::error(500, e),
            },
            None => AdminResponse::error(503, "the ledger reader is unavailable"),
        },
        (Method::Get, ["metrics"]) => ask(AdminRequest::Metrics),
        (
            _,
            ["v1", "campaigns"]
            | ["v1", "campaigns", "shake" | "send"]
            | ["v1", "users", _]
            | ["v1", "stats" | "audit" | "broadcast" | "balances"]
            | ["metrics"],
        ) => AdminResponse::error(
            405,
            format!("{} is not allowed on {path}", request.method()),
        ),
        _ => AdminResponse::error(404, format!("no such endpoint: {path}")),
    }
}

fn body_json<T: serde::de::DeserializeOwned>(request: &mut Request) -> Result<T, AdminResponse> {
    let mut body = String::new();
    request
        .as_reader()
        .take(MAX_BODY + 1)
        .read_to_string(&mut body)
        .map_err(|e| AdminResponse::error(400, format!("reading the body: {e}")))?;
    if body.len() as u64 > MAX_BODY {
        return Err(AdminResponse::error(
            413,
            format!("body over {MAX_BODY} bytes"),
        ));
    }
    serde_json::from_str(&body).map_err(|e| AdminResponse::error(400, format!("bad JSON: {e}")))
}

fn ask_core(
    request: AdminRequest,
    to_core: &SyncSender<AdminCommand>,
    waker: &Waker,
) -> AdminResponse {
    let (reply, answer) = channel();
    if to_core.send(AdminCommand { request, reply }).is_err() {
        return AdminResponse::error(503, "the core is shutting down");
    }
    let _ = waker.wake();
    answer
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| AdminResponse::error(503, "the core did not answer in time"))
}
