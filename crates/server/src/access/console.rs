//! The operator console's sessions: a page at the admin address (`console.html`) logs in
//! with an admin key once (`POST /console/login`, JSON), and from then on is known by a
//! session cookie — `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's
//! page sends it), `Secure` once the admin listener speaks TLS — and proves each change
//! with the session's CSRF token in `X-CSRF-Token`, which only the page was told. A
//! session lasts `SESSION_TTL` and ends at once when its key is removed or `POST
//! /console/logout` is called; at most `MAX_SESSIONS` are held (the oldest go first).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hongbao_http::access::{changes_state, key_hash, new_key, unauthorized};
use hongbao_http::{json_object, Request, Response};
use serde::Deserialize;
use serde_json::json;

use super::{Caller, Door};

/// The session cookie's name.
pub const COOKIE: &str = "hb_console";
/// The header the page sends its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a console session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Sessions held at most.
const MAX_SESSIONS: usize = 1024;

/// The console page, served at `GET /` of the admin address.
pub const PAGE: &str = include_str!("console.html");

struct Session {
    /// The hash of the key it logged in with: the key's role is read again on every use,
    /// and a removed key ends it.
    key_hash: String,
    csrf: String,
    started: Instant,
}

pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
    secure: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    key: String,
}

impl Sessions {
    pub fn new(secure: bool) -> Sessions {
        Sessions {
            by_id: Mutex::new(HashMap::new()),
            secure,
        }
    }

    /// The caller of a request that carries no bearer key: its session, if it has a live
    /// one and, for a change, the session's CSRF token.
    pub fn caller(&self, request: &Request, door: &Door) -> Result<Caller, Response> {
        let Some(id) = cookie(request, COOKIE) else {
            return Err(unauthorized(
                "an admin key is needed: Authorization: Bearer KEY (or log in to the console)",
            )
            .refusing("no-key"));
        };
        let (hash, csrf) = {
            let mut sessions = self.by_id.lock().expect("the sessions");
            let live = sessions
                .get(id)
                .filter(|s| s.started.elapsed() < SESSION_TTL)
                .map(|s| (s.key_hash.clone(), s.csrf.clone()));
            if live.is_none() {
                sessions.remove(id);
            }
            live.ok_or_else(|| {
                unauthorized("the console session has ended; log in again").refusing("session")
            })?
        };
        if changes_state(&request.method) && request.header(CSRF_HEADER) != Some(csrf.as_str()) {
            return Err(Response::error(
                403,
                "a change from the console must carry its session's CSRF token",
            )
            .refusing("csrf"));
        }
        match door.caller_of(&hash)? {
            Some(caller) => Ok(caller),
            None => {
                self.by_id.lock().expect("the sessions").remove(id);
                Err(
                    unauthorized("the key this console session logged in with was removed")
                        .refusing("unknown-key"),
                )
            }
        }
    }

    /// `POST /console/login` `{"key": KEY}`: a session for a known key. Returns the
    /// answer (with its cookie) and the caller it is for, if any.
    pub fn login(&self, request: &Request, door: &Door) -> (Response, Option<Caller>) {
        let login: Login = match json_object(&request.body) {
            Ok(l) => l,
            Err(bad) => return (bad, None),
        };
        let hash = key_hash(login.key.trim());
        let caller = match door.caller_of(&hash) {
            Ok(Some(caller)) => caller,
            Ok(None) => {
                return (
                    unauthorized("unknown admin key").refusing("unknown-key"),
                    None,
                )
            }
            Err(unreadable) => return (unreadable, None),
        };
        let (id, csrf) = (new_key(), new_key());
        {
            let mut sessions = self.by_id.lock().expect("the sessions");
            sessions.retain(|_, s| s.started.elapsed() < SESSION_TTL);
            if sessions.len() >= MAX_SESSIONS {
                let oldest = sessions
                    .iter()
                    .min_by_key(|(_, s)| s.started)
                    .map(|(id, _)| id.clone());
                if let Some(oldest) = oldest {
                    sessions.remove(&oldest);
                }
            }
            sessions.insert(
                id.clone(),
                Session {
                    key_hash: hash,
                    csrf: csrf.clone(),
                    started: Instant::now(),
                },
            );
        }
        let answer = Response::json(
            200,
            &json!({ "key": caller.key, "role": caller.role, "csrf": csrf }),
        )
        .with_header("set-cookie", self.set_cookie(&id, SESSION_TTL.as_secs()));
        (answer, Some(caller))
    }

    /// `GET /console/session`: who the session is, and its CSRF token again (a reloaded
    /// page asks; no other site's page can read the answer, nor send the cookie).
    pub fn describe(&self, request: &Request, caller: &Caller) -> Response {
        let csrf = cookie(request, COOKIE).and_then(|id| {
            let sessions = self.by_id.lock().expect("the sessions");
            sessions.get(id).map(|s| s.csrf.clone())
        });
        match csrf {
            Some(csrf) => Response::json(
                200,
                &json!({ "key": caller.key, "role": caller.role, "csrf": csrf }),
            ),
            None => Response::error(404, "no console session: this request used a bearer key"),
        }
    }

    /// `POST /console/logout`: the session ends, its cookie is cleared.
    pub fn logout(&self, request: &Request) -> Response {
        if let Some(id) = cookie(request, COOKIE) {
            self.by_id.lock().expect("the sessions").remove(id);
        }
        Response::json(200, &json!({ "logged_out": true }))
            .with_header("set-cookie", self.set_cookie("", 0))
    }

    fn set_cookie(&self, value: &str, max_age: u64) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
    }
}

/// The value of cookie `name` in the request's `Cookie` header.
fn cookie<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request
        .header("cookie")?
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let r = Request {
            method: "GET".into(),
            path: "/".into(),
            query: String::new(),
            headers: vec![("Cookie".into(), "a=1; hb_console=xyz; b=2".into())],
            body: Default::default(),
            peer: "127.0.0.1:1".parse().unwrap(),
        };
        assert_eq!(cookie(&r, COOKIE), Some("xyz"));
        assert_eq!(cookie(&r, "c"), None);
        let s = Sessions::new(true).set_cookie("v", 10);
        assert!(s.contains("HttpOnly") && s.contains("SameSite=Strict") && s.ends_with("Secure"));
        assert!(!Sessions::new(false).set_cookie("v", 10).contains("Secure"));
    }
}
