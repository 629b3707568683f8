//! The admin API's routes, in one table: each route's method and path beside what it
//! needs (the door's browser checks only, or a key of a role) and what the admin log
//! keeps of its use, and the endpoint that answers it. `handle` reads the table: a path
//! no route has is 404, a path one has with another method 405, both without a key
//! (nothing is there to guard).

use std::sync::Mutex;

use hongbao_http::access::changes_state;
use hongbao_http::{json_object, Request, Response};
use hongbao_money::access::{Revocation, Role};
use hongbao_money::error as money;
use hongbao_money::seam::{AdminRequest as MoneyRequest, BadCursor, LedgerRead, OpsCursor};

use super::{AdminRequest, BroadcastRequest, NewKey, MAX_OPS_PAGE, OPS_PAGE};
use crate::access::{self, console, error_text, Caller, Door};
use crate::health::{self, Health};

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

/// Who may use a route.
#[derive(Debug, Clone, Copy)]
enum Needs {
    /// The door's browser checks only: the probes (a probe has no key to give, and is
    /// told nothing a key would guard), the console's page, its log-in and log-out.
    Door,
    /// A key, or a console session, of at least this role; and what is recorded of it.
    Key(Role, Record),
}

/// What an endpoint is given.
struct Call<'a> {
    request: &'a Request,
    /// The path's segments that vary (`*`), in order.
    args: Vec<&'a str>,
    /// Who was admitted (none on a `Needs::Door` route).
    caller: Option<&'a Caller>,
    door: &'a Door,
    health: &'a Health,
    reader: &'a Mutex<Option<Box<dyn LedgerRead>>>,
    ask: &'a dyn Fn(AdminRequest) -> Response,
}

impl Call<'_> {
    /// The admitted key's name: who a campaign, a key or a revocation names as its maker.
    fn by(&self) -> &str {
        self.caller.map_or("", |c| c.key.as_str())
    }

    fn ask(&self, request: AdminRequest) -> Response {
        (self.ask)(request)
    }

    fn money(&self, request: MoneyRequest) -> Response {
        self.ask(AdminRequest::Money(request))
    }

    /// What a read of the ledger answers. Its failure decides the status: a refusal 400,
    /// a ledger out of reach 503 (try again), ours 500.
    fn read(&self, f: &dyn Fn(&dyn LedgerRead) -> money::Result<Response>) -> Response {
        match self.reader.lock().expect("the reader lock").as_deref() {
            Some(reader) => f(reader).unwrap_or_else(|e| failed(&e)),
            None => Response::error(503, "the ledger reader is unavailable"),
        }
    }
}

struct Route {
    method: &'static str,
    path: &'static str,
    needs: Needs,
    answer: fn(&Call) -> Response,
}

use Needs::{Door as DoorOnly, Key};
use Record::{Audit, Change, No, UserRead};
use Role::{Metrics, Operator, Viewer};

/// Every route of the admin address, `*` a segment that varies (docs/admin-api.md says
/// the same, by role).
#[rustfmt::skip]
const ROUTES: &[Route] = &[
    // The probes and the console's own.
    route("GET",    "/healthz",            DoorOnly,              |_| health::healthz()),
    route("GET",    "/readyz",             DoorOnly,              |c| health::readyz(c.health)),
    route("GET",    "/",                   DoorOnly,              |_| console_page()),
    route("POST",   "/console/login",      DoorOnly,              console_login),
    route("POST",   "/console/logout",     DoorOnly,              console_logout),
    route("GET",    "/console/session",    Key(Metrics, No),      console_session),
    route("GET",    "/metrics",            Key(Metrics, No),      |c| c.ask(AdminRequest::Metrics)),
    route("GET",    "/v1/stats",           Key(Metrics, No),      |c| c.ask(AdminRequest::Stats)),
    route("GET",    "/v1/campaigns",       Key(Viewer, No),       campaigns),
    route("GET",    "/v1/campaigns/*",     Key(Viewer, No),       campaign),
    route("GET",    "/v1/audit",           Key(Viewer, Audit),    |c| c.money(MoneyRequest::Audit)),
    route("GET",    "/v1/users/*",         Key(Viewer, UserRead), user),
    route("GET",    "/v1/balances",        Key(Viewer, UserRead), balances),
    route("GET",    "/v1/ledger/ops",      Key(Viewer, UserRead), ops),
    route("POST",   "/v1/campaigns/shake", Key(Operator, Change), create_shake),
    route("POST",   "/v1/campaigns/send",  Key(Operator, Change), create_send),
    route("POST",   "/v1/broadcast",       Key(Operator, Change), broadcast),
    route("POST",   "/v1/users/*/revoke",  Key(Operator, Change), revoke),
    route("GET",    "/v1/admin-keys",      Key(Operator, No),     keys),
    route("POST",   "/v1/admin-keys",      Key(Operator, Change), make_key),
    route("DELETE", "/v1/admin-keys/*",    Key(Operator, Change), remove_key),
    route("GET",    "/v1/admin-log",       Key(Operator, No),     admin_log),
];

const fn route(
    method: &'static str,
    path: &'static str,
    needs: Needs,
    answer: fn(&Call) -> Response,
) -> Route {
    Route {
        method,
        path,
        needs,
        answer,
    }
}

/// The path's varying segments, if `segments` is `path`.
fn matches<'a>(path: &str, segments: &[&'a str]) -> Option<Vec<&'a str>> {
    let mut args = Vec::new();
    let mut words = path.split('/').filter(|w| !w.is_empty());
    for &s in segments {
        match words.next()? {
            "*" => args.push(s),
            word if word == s => {}
            _ => return None,
        }
    }
    words.next().is_none().then_some(args)
}

/// The admin API behind its door: the route the table has for the request; then, as
/// it needs, the browser checks, or the key and its role, and the record of its use
/// before the answer.
pub(super) fn handle(
    request: &Request,
    door: &Door,
    health: &Health,
    reader: &Mutex<Option<Box<dyn LedgerRead>>>,
    ask: impl Fn(AdminRequest) -> Response,
) -> Response {
    let segments = request.segments();
    let mut known_path = false;
    let found = ROUTES.iter().find_map(|route| {
        let args = matches(route.path, &segments)?;
        known_path = true;
        (route.method == request.method).then_some((route, args))
    });
    let Some((route, args)) = found else {
        return match known_path {
            true => Response::error(
                405,
                format!("{} is not allowed on {}", request.method, request.path),
            ),
            false => Response::error(404, format!("no such endpoint: {}", request.path)),
        };
    };
    let mut call = Call {
        request,
        args,
        caller: None,
        door,
        health,
        reader,
        ask: &ask,
    };
    let (role, record) = match route.needs {
        Needs::Door => {
            return match door.guard(request) {
                Ok(()) => (route.answer)(&call),
                Err(refused) => refused,
            }
        }
        Needs::Key(role, record) => (role, record),
    };
    let caller = match door.admit(request, role) {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    call.caller = Some(&caller);
    let answer = (route.answer)(&call);
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

/// A money-side failure as an answer: its kind decides the status.
fn failed(e: &money::Error) -> Response {
    Response::error(e.kind().http_status(), e.to_string())
}

fn console_page() -> Response {
    Response::new(200, "text/html; charset=utf-8", console::PAGE)
        .with_header("cache-control", "no-store")
}

/// `POST /console/login`: a key in, a session out; a refusal is on the admin log, as
/// the log-in is.
fn console_login(c: &Call) -> Response {
    let (answer, caller) = c.door.sessions.login(c.request, c.door);
    if answer.status != 200 {
        c.door.refused(c.request, None, &answer);
        return answer;
    }
    recorded(c.door, c.request, caller.as_ref(), answer, "console log-in")
}

fn console_logout(c: &Call) -> Response {
    c.door.sessions.logout(c.request)
}

/// `GET /console/session`: who the session is.
fn console_session(c: &Call) -> Response {
    c.door
        .sessions
        .describe(c.request, c.caller.expect("admitted"))
}

/// `GET /v1/campaigns`.
fn campaigns(c: &Call) -> Response {
    c.money(MoneyRequest::Campaigns)
}

/// `GET /v1/balances`.
fn balances(c: &Call) -> Response {
    c.read(&|r| Ok(Response::json(200, &r.balances()?)))
}

/// `POST /v1/campaigns/shake`.
fn create_shake(c: &Call) -> Response {
    match json_object(&c.request.body) {
        Ok(request) => c.money(MoneyRequest::CreateShake {
            request,
            by: c.by().into(),
        }),
        Err(e) => e,
    }
}

/// `POST /v1/campaigns/send`.
fn create_send(c: &Call) -> Response {
    match json_object(&c.request.body) {
        Ok(request) => c.money(MoneyRequest::CreateSend {
            request,
            by: c.by().into(),
        }),
        Err(e) => e,
    }
}

/// `GET /v1/campaigns/ID`.
fn campaign(c: &Call) -> Response {
    let id = c.args[0];
    match id.parse() {
        Ok(id) => c.money(MoneyRequest::Campaign(id)),
        Err(_) => Response::error(400, format!("campaign id {id:?} is not a number")),
    }
}

/// `GET /v1/users/ID`: the user's balance and recent events, as the ledger has them.
fn user(c: &Call) -> Response {
    let id = c.args[0];
    match id.parse::<u64>() {
        Ok(user) => c.read(&|r| Ok(Response::json(200, &r.user(user, 20)?))),
        Err(_) => Response::error(400, format!("user id {id:?} is not a number")),
    }
}

/// `GET /v1/ledger/ops`: the ledger's wins and opens, a page at a time.
fn ops(c: &Call) -> Response {
    match ops_query(&c.request.query) {
        Ok((after, limit)) => c.read(&|r| Ok(Response::json(200, &r.ops(after, limit)?))),
        Err(e) => Response::error(400, e.to_string()),
    }
}

/// `POST /v1/broadcast`.
fn broadcast(c: &Call) -> Response {
    match json_object::<BroadcastRequest>(&c.request.body) {
        Ok(req) if req.text.len() > hongbao_proto::message::MAX_TEXT_LEN => Response::error(
            400,
            format!(
                "text is {} bytes; at most {}",
                req.text.len(),
                hongbao_proto::message::MAX_TEXT_LEN
            ),
        ),
        Ok(req) => (c.ask)(AdminRequest::Broadcast(req)),
        Err(e) => e,
    }
}

/// `GET /v1/admin-keys`: the keys, without their secrets.
fn keys(c: &Call) -> Response {
    match c.door.store().keys() {
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
        Err(e) => failed(&e),
    }
}

/// `POST /v1/admin-keys`: a new key, its secret shown this once.
fn make_key(c: &Call) -> Response {
    match json_object::<NewKey>(&c.request.body) {
        Ok(new) => match access::make_key(c.door.store().as_ref(), &new.name, new.role, c.by()) {
            Ok(key) => {
                c.door.keys_changed();
                let made = serde_json::json!({ "name": new.name, "role": new.role, "key": key });
                Response::json(201, &made)
            }
            Err(e) => failed(&e),
        },
        Err(bad) => bad,
    }
}

/// `GET /v1/admin-log`, newest first, a page at a time.
fn admin_log(c: &Call) -> Response {
    match log_query(&c.request.query) {
        Ok((before, limit)) => match c.door.store().log(before, limit) {
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
            Err(e) => failed(&e),
        },
        Err(e) => Response::error(400, e.to_string()),
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

/// `DELETE /v1/admin-keys/NAME`: the last operator key stays (no one would be left who
/// may change anything).
fn remove_key(c: &Call) -> Response {
    let (door, name) = (c.door, c.args[0]);
    let keys = match door.store().keys() {
        Ok(keys) => keys,
        Err(e) => return failed(&e),
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
        Err(e) => failed(&e),
    }
}

/// `POST /v1/users/ID/revoke`: every token of the user issued before now is refused,
/// on every host, from now on. Written to the store first (it outlives a restart, and
/// the other hosts read it from there within a second), then the supervisor here is told.
fn revoke(c: &Call) -> Response {
    let user = c.args[0];
    let Some(user) = user.parse::<u64>().ok().filter(|&u| u > 0) else {
        return Response::error(400, format!("user id {user:?} is not a positive integer"));
    };
    // Tokens carry whole seconds: one issued in this second counts as before it.
    let at = hongbao_sys::clock::unix_ms().div_ceil(1000);
    let revocation = Revocation {
        id: 0,
        user,
        at,
        by: c.by().to_string(),
    };
    if let Err(e) = c.door.store().revoke(&revocation) {
        return failed(&e);
    }
    (c.ask)(AdminRequest::Revoked { user, at })
}

/// A query an admin route does not take, in the words its 400 says.
#[derive(Debug, thiserror::Error)]
enum BadQuery {
    #[error("before {0:?} is not an entry id")]
    NotAnEntry(String),
    #[error(transparent)]
    Cursor(#[from] BadCursor),
    #[error("limit must be 1..={0}")]
    Limit(usize),
    /// A parameter the route does not take (or takes once, given twice), and those it
    /// takes.
    #[error("unknown query parameter {0:?}: only {1}")]
    Unknown(String, &'static str),
    #[error("unknown or repeated query parameter {0:?}: only {1}")]
    UnknownOrRepeated(String, &'static str),
}

/// `GET /v1/admin-log`'s query: `before` (a page's `next`) and `limit` (1..=1000, 100).
fn log_query(query: &str) -> Result<(Option<u64>, usize), BadQuery> {
    let (mut before, mut limit) = (None, 100);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("before", v)) => {
                let id = v.parse().map_err(|_| BadQuery::NotAnEntry(v.into()))?;
                before = Some(id);
            }
            Some(("limit", v)) => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or(BadQuery::Limit(1000))?;
            }
            _ => return Err(BadQuery::Unknown(pair.into(), "before and limit")),
        }
    }
    Ok((before, limit))
}

/// `GET /v1/ledger/ops`'s query: `after` (a page's `next`) and `limit`, each at most
/// once; nothing else.
fn ops_query(query: &str) -> Result<(Option<OpsCursor>, usize), BadQuery> {
    let (mut after, mut limit) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("after", v)) if after.is_none() => after = Some(v.parse::<OpsCursor>()?),
            Some(("limit", v)) if limit.is_none() => {
                limit = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_OPS_PAGE).contains(n))
                        .ok_or(BadQuery::Limit(MAX_OPS_PAGE))?,
                )
            }
            _ => {
                let takes = "after and limit";
                return Err(BadQuery::UnknownOrRepeated(pair.into(), takes));
            }
        }
    }
    Ok((after, limit.unwrap_or(OPS_PAGE)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use hongbao_money::access::AccessStore;
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
        // The endpoint the table has for it, asked without the door.
        let dir = tempfile::tempdir().unwrap();
        let door = door(&dir);
        let health = Health::new();
        let segments = request.segments();
        let (route, args) = ROUTES
            .iter()
            .filter(|r| r.method == "GET")
            .find_map(|r| Some((r, matches(r.path, &segments)?)))
            .expect("a route");
        let call = Call {
            request: &request,
            args,
            caller: None,
            door: &door,
            health: &health,
            reader: &reader,
            ask: &no_core,
        };
        let response = (route.answer)(&call);
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

    /// The door of a server whose admin address is 127.0.0.1:7001, its keys and log in
    /// `dir`.
    fn door(dir: &tempfile::TempDir) -> Door {
        let store: Arc<dyn AccessStore> =
            Arc::new(hongbao_embedded::access::SqliteAccess::open(dir.path()).unwrap());
        let bound = "127.0.0.1:7001".parse().unwrap();
        Door::new(
            store,
            hongbao_http::access::BrowserGuard::new(bound, &[], &[]),
            false,
            Default::default(),
        )
    }

    #[test]
    fn the_probes_need_no_key_pass_the_browser_checks_and_are_not_logged() {
        let dir = tempfile::tempdir().unwrap();
        let door = door(&dir);
        let store = door.store().clone();
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
