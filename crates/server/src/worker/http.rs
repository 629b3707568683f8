//! HTTP on a gateway listener: the REST API (docs/http-api.md), the browser client at
//! `GET /` and its demo log-in at `GET /token`, and WebSocket upgrades (the connection's
//! codec then becomes WebSocket).
//!
//! Requests are read by `hongbao_proto::http` (httparse underneath), a whole request at a
//! time, and become the same transport-free `Request`s the other codecs make, each acting
//! for the user its bearer token names. Answers leave in request order, as HTTP/1.1
//! pipelining requires: a reply that comes back from the supervisor before an earlier one
//! waits in `held` (boxed only while there is any). A request the codec refuses itself
//! (400, 401, 404, 405, 413, 431, 501) is answered in its turn the same way; a malformed
//! one ends the connection after its answer, since the stream can no longer be cut into
//! requests.
//!
//! Deadlines (`idle`): a request must be whole within the header timeout of its first
//! byte (of the connect, for the first), else 408 and close — a client trickling its
//! headers holds nothing for long; between requests the keep-alive timeout applies.

use std::collections::BTreeMap;

use hongbao_money::{Reply, Request};
use hongbao_proto::api;
use hongbao_proto::http;
use hongbao_proto::message::{valid_idempotency_key, MAX_RECIPIENTS, MAX_TEXT_LEN, MAX_TOKEN_LEN};
use hongbao_proto::ws::{self, Handshake};
use hongbao_proto::{KickReason, ResultCode};
use hongbao_sys::clock::{UnixTime, UptimeSecs};
use serde::Deserialize;

#[cfg(test)]
use super::answer::status_of;
use super::answer::{error_body, reply_json, retry_after_secs};
use super::wire::{Auth, Cx, Inbound, Step, Then};

/// The browser client, served at `GET /`.
const PAGE: &str = include_str!("../page.html");
/// Largest request body (a send to `MAX_RECIPIENTS` users is about 21 KB of JSON).
pub(super) const MAX_BODY: usize = 64 * 1024;

/// A connection's HTTP state: requests are numbered as they are read, answers leave in
/// that order.
pub(super) struct HttpCodec {
    /// The id the next request gets, and the id whose answer is due next.
    next_id: u32,
    next_answer: u32,
    /// When the request being read began; `None`
    /// between requests.
    request_since: Option<UptimeSecs>,
    /// Some bytes of that request have arrived (a connection that never said anything is
    /// closed without a word).
    request_begun: bool,
    /// The connection closes once this request is answered (`Connection: close`,
    /// HTTP/1.0, or a request that could not be read).
    close_after: Option<u32>,
    /// Answers that came before their turn, by id. Boxed while there are any, so an
    /// idle connection pays 8 bytes for it rather than an empty map's 24.
    #[allow(clippy::box_collection)]
    held: Option<Box<BTreeMap<u32, Vec<u8>>>>,
}

/// What became of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    /// Written now or held for its turn; the connection goes on.
    Queued,
    /// The last answer before the connection closes has been written.
    ThenClose,
}

impl HttpCodec {
    /// A new connection at `now`: its first request
    /// must arrive within the header timeout.
    pub(super) fn new(now: UptimeSecs) -> HttpCodec {
        HttpCodec {
            next_id: 1,
            next_answer: 1,
            request_since: Some(now),
            request_begun: false,
            close_after: None,
            held: None,
        }
    }

    /// The connection's TLS handshake is done at `now`: its first request's deadline
    /// counts from here, not from the accept.
    pub(super) fn handshake_done(&mut self, now: UptimeSecs) {
        if !self.request_begun && self.next_id == 1 {
            self.request_since = Some(now);
        }
    }

    /// When the request being read began; `None` between requests.
    pub(super) fn request_since(&self) -> Option<UptimeSecs> {
        self.request_since
    }

    /// Whether answers are still due.
    pub(super) fn answers_due(&self) -> bool {
        self.next_answer != self.next_id
    }

    /// Reads at most one request; returns the step and whether the connection upgraded to
    /// WebSocket.
    pub(super) fn decode(&mut self, data: &mut [u8], cx: &mut Cx<'_>) -> (Step, bool) {
        let step = |used, inbound, then| Step {
            used,
            inbound,
            then,
        };
        if self.close_after.is_some() {
            // Nothing after a closing request is read.
            return (step(data.len(), None, Then::Read), false);
        }
        let request = match http::parse(data, MAX_BODY) {
            Ok(None) => {
                self.request_since.get_or_insert(cx.now);
                self.request_begun = true;
                return (step(0, None, Then::Read), false);
            }
            Ok(Some(request)) => request,
            Err(e) => {
                cx.stats.http_requests += 1;
                cx.stats.bad_requests += 1;
                let id = self.take_id(false);
                let then = self.refuse(id, e.status(), &e.message(MAX_BODY), cx);
                return (step(data.len(), None, then), false);
            }
        };
        self.request_since = None;
        self.request_begun = false;
        cx.stats.http_requests += 1;
        if request.websocket && !self.answers_due() {
            if cx.trusted_peer {
                cx.client = request.real_ip.and_then(|ip| ip.parse().ok());
            }
            return self.upgrade(data, cx);
        }
        let used = request.len;
        let id = self.take_id(request.keep_alive);
        // A HEAD is answered as its GET would be, less the body (RFC 9110 §9.3.2): its
        // client reads no body, so one sent would be read as the next answer. Answered
        // here: the API's reads go through the supervisor and answer later, and HEAD is not
        // worth a second path there — a ping is answered at once, `route` refuses the rest.
        let head = request.method == "HEAD";
        let route = match route(&request, cx) {
            Route::Request(Request::Ping { .. }, None) if head => {
                let server_time_us = hongbao_sys::clock::unix_us();
                let pong = Reply::Pong {
                    client_time_us: 0,
                    server_time_us,
                };
                let (status, body) = reply_json(&pong);
                Route::Answer(status, "application/json", body.into_bytes())
            }
            other => other,
        };
        let without_body = |answer: Vec<u8>, body: &[u8]| match head {
            true => head_only(answer, body),
            false => answer,
        };
        match route {
            Route::Request(inner, bearer) => {
                let inbound = Inbound::Request {
                    id,
                    request: inner,
                    auth: bearer.map_or(Auth::Connection, Auth::Bearer),
                };
                (step(used, Some(inbound), Then::Read), false)
            }
            Route::Answer(status, content_type, body) => {
                let answer = answer_bytes(status, content_type, &[], &body, self.closes(id));
                let then = self.queue(id, without_body(answer, &body), cx);
                (step(used, None, then), false)
            }
            Route::RefuseAfterBearer(text, token) => {
                let inbound = Inbound::Refused {
                    id,
                    result: ResultCode::BadRequest,
                    text,
                    bearer: Some(token),
                };
                (step(used, Some(inbound), Then::Read), false)
            }
            Route::Refuse(status, result, text, extra) => {
                cx.stats.bad_requests += 1;
                let body = error_body(result, &text);
                let answer =
                    answer_bytes(status, "application/json", &extra, &body, self.closes(id));
                let then = self.queue(id, without_body(answer, &body), cx);
                (step(used, None, then), false)
            }
        }
    }

    fn upgrade(&mut self, data: &mut [u8], cx: &mut Cx<'_>) -> (Step, bool) {
        if !cx.may_upgrade {
            // As many connections not yet logged in as this worker may hold (from this
            // source): a WebSocket would be one more.
            cx.stats.rejected_unauthenticated += 1;
            let body = error_body(
                ResultCode::Unavailable,
                "too many connections not yet logged in; try again later",
            );
            let bytes = answer_bytes(
                503,
                "application/json",
                &[("Retry-After", "1")],
                &body,
                true,
            );
            cx.out.extend_from_slice(&bytes);
            let step = Step {
                used: data.len(),
                inbound: None,
                then: Then::HangUp,
            };
            return (step, false);
        }
        match ws::accept(data) {
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
            Handshake::Reject { response, .. } => {
                cx.stats.ws_rejected += 1;
                cx.out.extend_from_slice(&response);
                let step = Step {
                    used: data.len(),
                    inbound: None,
                    then: Then::HangUp,
                };
                (step, false)
            }
            // `parse` found a whole request asking for an upgrade.
            Handshake::Partial | Handshake::NotWebSocket { .. } => unreachable!("a whole upgrade"),
        }
    }

    /// Numbers the next request; a request that does not keep the connection alive is the
    /// last one read.
    fn take_id(&mut self, keep_alive: bool) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        if !keep_alive {
            self.close_after = Some(id);
        }
        id
    }

    fn closes(&self, id: u32) -> bool {
        self.close_after == Some(id)
    }

    /// Answers request `id` with an error and closes after it: the stream cannot be read
    /// on.
    fn refuse(&mut self, id: u32, status: u16, message: &str, cx: &mut Cx<'_>) -> Then {
        self.close_after = Some(id);
        let body = error_body(ResultCode::BadRequest, message);
        let bytes = answer_bytes(status, "application/json", &[], &body, true);
        self.queue(id, bytes, cx)
    }

    /// Queues an answer made while decoding: what is due goes to `cx.out`.
    fn queue(&mut self, id: u32, bytes: Vec<u8>, cx: &mut Cx<'_>) -> Then {
        match self.answer(id, bytes, cx.out, cx.cfg.max_output_bytes as usize) {
            Answered::Queued => Then::Read,
            Answered::ThenClose => Then::HangUp,
        }
    }

    /// Puts the answer to `id` in its place: appends to `out` every answer now due, in
    /// order. More held than `max_held` bytes (a client pipelining far ahead of a slow
    /// answer) closes the connection.
    fn answer(&mut self, id: u32, bytes: Vec<u8>, out: &mut Vec<u8>, max_held: usize) -> Answered {
        if id != self.next_answer {
            let held = self.held.get_or_insert_with(Box::default);
            held.insert(id, bytes);
            if held.values().map(Vec::len).sum::<usize>() > max_held {
                return Answered::ThenClose;
            }
            return Answered::Queued;
        }
        out.extend_from_slice(&bytes);
        let mut last = id;
        self.next_answer = self.next_answer.wrapping_add(1);
        if let Some(held) = self.held.as_mut() {
            while let Some(bytes) = held.remove(&self.next_answer) {
                out.extend_from_slice(&bytes);
                last = self.next_answer;
                self.next_answer = self.next_answer.wrapping_add(1);
            }
            if held.is_empty() {
                self.held = None;
            }
        }
        match self.close_after {
            Some(c) if c == last => Answered::ThenClose,
            _ => Answered::Queued,
        }
    }

    /// The reply to request `id` as an HTTP response, in its turn.
    pub(super) fn reply(
        &mut self,
        id: u32,
        reply: &Reply,
        out: &mut Vec<u8>,
        max_held: usize,
    ) -> Answered {
        let (status, body) = reply_json(reply);
        let retry_after = retry_after_secs(reply);
        let extra: &[(&str, &str)] = match &retry_after {
            Some(secs) => &[("Retry-After", secs)],
            None if status == 401 => &[("WWW-Authenticate", "Bearer")],
            None => &[],
        };
        let bytes = answer_bytes(
            status,
            "application/json",
            extra,
            body.as_bytes(),
            self.closes(id),
        );
        self.answer(id, bytes, out, max_held)
    }

    /// The goodbye of a connection closed for taking too long with a request it began:
    /// 408, when it is its turn to speak.
    pub(super) fn close(&mut self, reason: KickReason, out: &mut Vec<u8>) {
        if reason == KickReason::Idle && self.request_begun && !self.answers_due() {
            let body = error_body(
                ResultCode::BadRequest,
                "the request was not complete in time",
            );
            out.extend_from_slice(&answer_bytes(408, "application/json", &[], &body, true));
        }
    }
}

fn answer_bytes(
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    close: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + body.len());
    http::response(status, content_type, extra, body, close, &mut out);
    out
}

/// The answer to a HEAD: the head of `answer` (its `Content-Length` included), less
/// its `body`.
fn head_only(mut answer: Vec<u8>, body: &[u8]) -> Vec<u8> {
    answer.truncate(answer.len() - body.len());
    answer
}

/// What a request is.
enum Route {
    /// For the handlers, acting for the user the bearer token names (`None`: needs no
    /// user); the worker checks the token (`session.rs`).
    Request(Request, Option<Box<[u8]>>),
    /// Answered here: status, content type, body.
    Answer(u16, &'static str, Vec<u8>),
    /// Refused here: status, result, why, extra headers.
    Refuse(u16, ResultCode, String, Vec<(&'static str, &'static str)>),
    /// A bad request (400) of a caller with a bearer token: refused once the worker has
    /// checked the token, so a stranger hears 401, not the API's rules.
    RefuseAfterBearer(String, Box<[u8]>),
}

fn refuse(status: u16, text: impl Into<String>) -> Route {
    Route::Refuse(status, ResultCode::BadRequest, text.into(), Vec::new())
}

/// `POST /v1/packets`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    amount_cents: u64,
    shares: u32,
    recipients: Vec<u64>,
}

/// `POST /v1/chat`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatBody {
    to_user: u64,
    text: String,
}

fn route(request: &http::Request<'_>, cx: &Cx<'_>) -> Route {
    let segments: Vec<&str> = request.path.split('/').filter(|s| !s.is_empty()).collect();
    // HEAD goes where GET goes; `decode` drops the body of its answer.
    let method = match request.method {
        "HEAD" => "GET",
        other => other,
    };
    // Path → the methods it takes; what is done with it.
    let allowed: &'static str = match segments.as_slice() {
        [] | ["index.html"] | ["token"] | ["v1", "ping"] | ["v1", "me"] | ["v1", "notices"] => {
            "GET"
        }
        ["v1", "shake"] | ["v1", "packets"] | ["v1", "chat"] | ["v1", "packets", _, "open"] => {
            "POST"
        }
        _ => return refuse(404, format!("no such endpoint: {}", request.path)),
    };
    if method != allowed {
        return Route::Refuse(
            405,
            ResultCode::BadRequest,
            format!("{} is not allowed on {}", request.method, request.path),
            vec![("Allow", allowed)],
        );
    }
    match segments.as_slice() {
        [] | ["index.html"] => {
            Route::Answer(200, "text/html; charset=utf-8", PAGE.as_bytes().to_vec())
        }
        ["token"] => demo_token(request.query, cx),
        ["v1", "ping"] => Route::Request(Request::Ping { client_time_us: 0 }, None),
        // HEAD on the API's other reads (`/v1/me`, `/v1/notices`) is refused for its form,
        // before the bearer is looked at, as a POST path's wrong method is above: the
        // same 405 with or without a token.
        _ if request.method == "HEAD" => Route::Refuse(
            405,
            ResultCode::BadRequest,
            format!("HEAD is not allowed on {}", request.path),
            vec![("Allow", allowed)],
        ),
        _ => match bearer(request.authorization) {
            Ok(token) => match api(&segments, request) {
                Ok(inner) => Route::Request(inner, Some(token.as_bytes().into())),
                Err(Route::Refuse(400, ResultCode::BadRequest, text, extra))
                    if extra.is_empty() =>
                {
                    Route::RefuseAfterBearer(text, token.as_bytes().into())
                }
                Err(route) => route,
            },
            Err(why) => Route::Refuse(
                401,
                ResultCode::BadToken,
                why.into(),
                vec![("WWW-Authenticate", "Bearer")],
            ),
        },
    }
}

/// The API request a path and body make, for an authenticated user.
fn api(segments: &[&str], request: &http::Request<'_>) -> Result<Request, Route> {
    Ok(match segments {
        ["v1", "shake"] => Request::Shake,
        ["v1", "me"] => Request::Me,
        ["v1", "notices"] => Request::Notices,
        ["v1", "packets", id, "open"] => match id.parse() {
            Ok(packet_id) => Request::Open { packet_id },
            Err(_) => return Err(refuse(400, format!("packet id {id:?} is not a number"))),
        },
        ["v1", "packets"] => {
            let body: SendBody = json_object(&request.body)?;
            if body.recipients.len() > MAX_RECIPIENTS {
                return Err(refuse(400, format!("at most {MAX_RECIPIENTS} recipients")));
            }
            let idempotency_key = match request.idempotency_key {
                Some(key) if valid_idempotency_key(key) => Some(key.to_string()),
                Some(_) => {
                    return Err(refuse(
                        400,
                        "Idempotency-Key must be 1 to 64 characters of printable ASCII",
                    ))
                }
                None => None,
            };
            // Refused here with its reason: the send-reply a malformed send gets from
            // the money side has no words for the `error` field.
            if let Some(why) =
                hongbao_money::rules::send_refusal(body.amount_cents, body.shares, &body.recipients)
            {
                return Err(refuse(400, why));
            }
            Request::Send {
                amount_cents: body.amount_cents,
                shares: body.shares,
                recipients: body.recipients,
                idempotency_key,
            }
        }
        ["v1", "chat"] => {
            let body: ChatBody = json_object(&request.body)?;
            if body.text.len() > MAX_TEXT_LEN {
                return Err(refuse(400, format!("text over {MAX_TEXT_LEN} bytes")));
            }
            Request::Chat {
                to_user: body.to_user,
                text: body.text,
            }
        }
        _ => unreachable!("routed above"),
    })
}

/// A body that must be a JSON object of `T`'s fields, and nothing else.
fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Route> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| refuse(400, format!("bad JSON: {e}")))?;
    if !value.is_object() {
        return Err(refuse(400, "bad JSON: the body must be a JSON object"));
    }
    serde_json::from_value(value).map_err(|e| refuse(400, format!("bad JSON: {e}")))
}

/// The token of an `Authorization: Bearer <JWT>` header (checked by the worker). The
/// scheme is matched without regard to case (RFC 9110 §11.1).
fn bearer(header: Option<&str>) -> Result<&str, &'static str> {
    let header = header.ok_or("no Authorization header: send `Authorization: Bearer <token>`")?;
    let token = header
        .trim()
        .split_once([' ', '\t'])
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .ok_or("the Authorization header is not a Bearer token")?
        .1
        .trim();
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err("the bearer token is empty or too long");
    }
    Ok(token)
}

/// `GET /token?user=N`: a demo token, when the server hands them out.
fn demo_token(query: &str, cx: &Cx<'_>) -> Route {
    if cx.cfg.login.demo_key.is_none() {
        return refuse(404, "no such endpoint: /token (demo tokens are off)");
    }
    let user = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("user="))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&u| u > 0);
    match user {
        Some(user) => match cx.sessions.demo_token(user, UnixTime::now()) {
            Some(token) => {
                let body = api::to_body(&api::DemoToken {
                    token,
                    user_id: user,
                });
                Route::Answer(200, "application/json", body.into_bytes())
            }
            None => Route::Refuse(
                503,
                ResultCode::Unavailable,
                "the demo key cannot sign".into(),
                Vec::new(),
            ),
        },
        None => refuse(400, "user must be a positive integer"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle keep-alive connection holds this beside its record: a few words.
    #[test]
    fn an_idle_http_connection_is_small() {
        assert!(
            std::mem::size_of::<HttpCodec>() <= 40,
            "{}",
            std::mem::size_of::<HttpCodec>()
        );
    }

    /// Answers leave in request order whatever order they come in; the one that closes
    /// says so when it leaves.
    #[test]
    fn answers_leave_in_request_order() {
        let mut http = HttpCodec::new(UptimeSecs(0));
        let ids: Vec<u32> = (0..4).map(|i| http.take_id(i != 3)).collect();
        let mut out = Vec::new();
        assert_eq!(
            http.answer(ids[2], b"c".to_vec(), &mut out, 1000),
            Answered::Queued
        );
        assert_eq!(
            http.answer(ids[1], b"b".to_vec(), &mut out, 1000),
            Answered::Queued
        );
        assert!(out.is_empty());
        assert_eq!(
            http.answer(ids[0], b"a".to_vec(), &mut out, 1000),
            Answered::Queued
        );
        assert_eq!(out, b"abc");
        assert!(http.answers_due());
        assert_eq!(
            http.answer(ids[3], b"d".to_vec(), &mut out, 1000),
            Answered::ThenClose
        );
        assert_eq!(out, b"abcd");
        assert!(!http.answers_due() && http.held.is_none());
        // Too much held behind a slow answer: the connection goes.
        let mut http = HttpCodec::new(UptimeSecs(0));
        let (slow, next) = (http.take_id(true), http.take_id(true));
        let _ = slow;
        assert_eq!(
            http.answer(next, vec![0; 2000], &mut out, 1000),
            Answered::ThenClose
        );
    }

    #[test]
    fn every_result_has_a_status() {
        for result in ResultCode::ALL {
            let status = status_of(result);
            assert!((200..600).contains(&status), "{result:?}");
        }
        assert_eq!(status_of(ResultCode::Overloaded), 429);
        assert_eq!(status_of(ResultCode::InsufficientFunds), 402);
    }
}
