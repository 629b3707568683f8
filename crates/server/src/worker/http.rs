//! HTTP on a gateway listener: a WebSocket upgrade (the codec then becomes WebSocket),
//! or plain HTTP the worker answers itself — the browser client at `GET /` and, for the
//! demo, its log-in at `GET /token?user=N` — and closes.

use hongbao_money::Reply;
use hongbao_proto::ws::{self, Handshake};

use super::codec::{Cx, Step, Then};

/// The browser client, served at `GET /`.
const PAGE: &str = include_str!("../page.html");

pub(super) struct HttpCodec;

impl HttpCodec {
    /// Reads a request head; returns the step, and whether the connection upgraded.
    pub(super) fn decode(&mut self, data: &mut [u8], cx: &mut Cx<'_>) -> (Step, bool) {
        let hang_up = |used| Step {
            used,
            inbound: None,
            then: Then::HangUp,
        };
        match ws::accept(data) {
            Handshake::Partial => (
                Step {
                    used: 0,
                    inbound: None,
                    then: Then::Read,
                },
                false,
            ),
            Handshake::Upgrade { consumed, response } => {
                cx.stats.ws_upgrades += 1;
                cx.out.extend_from_slice(&response);
                let step = Step {
                    used: consumed,
                    inbound: None,
                    then: Then::Read,
                };
                (step, true)
            }
            Handshake::NotWebSocket { method, path, .. } => {
                cx.stats.http_requests += 1;
                cx.out.extend_from_slice(&answer(cx, &method, &path));
                (hang_up(data.len()), false)
            }
            Handshake::Reject { response, .. } => {
                cx.stats.ws_rejected += 1;
                cx.out.extend_from_slice(&response);
                (hang_up(data.len()), false)
            }
        }
    }

    /// Requests on this connection are answered by `decode` itself.
    pub(super) fn reply(&mut self, _id: u32, _reply: &Reply, _out: &mut Vec<u8>) -> bool {
        false
    }
}

/// Plain HTTP: the browser client and its demo log-in.
fn answer(cx: &Cx<'_>, method: &str, path: &str) -> Vec<u8> {
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    match (method, route) {
        ("GET", "/") | ("GET", "/index.html") => {
            ws::http_response("200 OK", "text/html; charset=utf-8", PAGE.as_bytes())
        }
        ("GET", "/token") if cx.cfg.demo_login => {
            let user = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("user="))
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&u| u > 0);
            match user {
                Some(user) => {
                    let token = hongbao_proto::token::token_hex(&cx.cfg.secret, user);
                    let body = format!("{{\"user_id\":{user},\"token\":\"{token}\"}}");
                    ws::http_response("200 OK", "application/json", body.as_bytes())
                }
                None => ws::http_response(
                    "400 Bad Request",
                    "text/plain",
                    b"user must be a positive integer\n",
                ),
            }
        }
        ("GET", _) => ws::http_response("404 Not Found", "text/plain", b"not found\n"),
        _ => ws::http_response(
            "405 Method Not Allowed",
            "text/plain",
            b"only GET, or a WebSocket upgrade\n",
        ),
    }
}
