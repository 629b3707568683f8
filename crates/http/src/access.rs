//! The checks every side door makes at the door, before its handler runs: who is calling
//! (a bearer key, compared by its SHA-256, never as text), and whether a browser is being
//! used against it — a page on another site posting to a loopback address (a "simple
//! request" needs no preflight), or a DNS name rebound to this address.
//!
//! - `BrowserGuard`: the `Host` must name this door (an IP literal, `localhost` on
//!   loopback, or a configured name: a rebound name is neither), an `Origin` must be this
//!   door's own or a configured one, and a request that changes state must say
//!   `Content-Type: application/json`, which a page cannot send without a preflight.
//! - `RunKey`: one secret for a door that only its own run's processes call (the
//!   monitor's reports, the load's control endpoint), made at start and handed to them
//!   out of sight (a file, the environment), never on a command line.
//! - `new_key`, `key_hash`, `bearer`: what admin keys are made of; the server keeps their
//!   roles (`hongbao_money::access`).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::{Request, Response};

/// What a key starts with, so that one found in a log or a paste is known for what it
/// is.
pub const KEY_PREFIX: &str = "hbk_";

/// A new random key: `hbk_` and 256 bits from the operating system, in hex.
pub fn new_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{KEY_PREFIX}{}", hex(&bytes))
}

/// The SHA-256 of a key, in lowercase hex: what is kept and compared. A key is 256
/// random bits, so a fast hash is enough: there is nothing to guess from it.
pub fn key_hash(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bearer key of `Authorization: Bearer KEY`, if the request carries one.
pub fn bearer(request: &Request) -> Option<&str> {
    let value = request.header("authorization")?.trim();
    let (scheme, key) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|k| !k.is_empty())
}

/// 401: no key, or one not known; says how to authenticate.
pub fn unauthorized(message: impl Into<String>) -> Response {
    Response::error(401, message).with_header("www-authenticate", "Bearer")
}

/// Whether a method changes state (and so must be JSON and carry a CSRF token from a
/// console session).
pub fn changes_state(method: &str) -> bool {
    !matches!(method, "GET" | "HEAD" | "OPTIONS")
}

/// The browser checks of one door.
#[derive(Debug, Clone)]
pub struct BrowserGuard {
    port: u16,
    loopback: bool,
    /// More `Host` names this door answers to (a DNS name, a proxy's), with or without a
    /// port.
    hosts: Vec<String>,
    /// More origins allowed (`https://console.example`), exactly as a browser sends them.
    origins: Vec<String>,
}

impl BrowserGuard {
    /// The guard of a door bound to `addr`, answering also to `hosts` and `origins`.
    pub fn new(addr: SocketAddr, hosts: &[String], origins: &[String]) -> BrowserGuard {
        BrowserGuard {
            port: addr.port(),
            loopback: addr.ip().is_loopback(),
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            origins: origins.to_vec(),
        }
    }

    /// Whether `host` (a `Host` header's value, or an origin's host part) names this door.
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        if self.hosts.contains(&host) {
            return true;
        }
        let (name, port) = split_host(&host);
        if port.is_some_and(|p| p != self.port) {
            return false;
        }
        if self.hosts.iter().any(|h| h == name) {
            return true;
        }
        // A DNS rebinding attack needs a name: an address literal is never rebound.
        name.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok()
            || (self.loopback && name == "localhost")
    }

    /// Refuses what a browser could be made to send here: a `Host` that does not name
    /// this door (403), an `Origin` that is not this door's or a configured one (403), a
    /// change that is not `application/json` (415).
    pub fn check(&self, request: &Request) -> Result<(), Response> {
        if let Some(host) = request.header("host") {
            if !self.host_allowed(host) {
                return Err(Response::error(
                    403,
                    format!("Host {host:?} does not name this address; add it to the allowed hosts if it should"),
                )
                .refusing("host"));
            }
        }
        if let Some(origin) = request.header("origin") {
            let own = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|host| self.host_allowed(host));
            if !own && !self.origins.iter().any(|o| o == origin) {
                return Err(
                    Response::error(403, format!("Origin {origin:?} is not allowed here"))
                        .refusing("origin"),
                );
            }
        }
        // A POST always, another change when it carries a body (a DELETE without one
        // is no simple request: a browser preflights it, and no preflight is granted).
        let body_or_post = request.method == "POST" || !request.body.is_empty();
        if changes_state(&request.method) && body_or_post {
            let json = request.header("content-type").is_some_and(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
            if !json {
                return Err(Response::error(
                    415,
                    "a request that changes something must be Content-Type: application/json",
                )
                .refusing("content-type"));
            }
        }
        Ok(())
    }
}

/// `host[:port]` or `[v6][:port]` into the name and the port.
fn split_host(host: &str) -> (&str, Option<u16>) {
    if let Some(rest) = host.strip_prefix('[') {
        if let Some((v6, after)) = rest.split_once(']') {
            let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
            return (&host[..v6.len() + 2], port);
        }
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, port.parse().ok()),
        _ => (host, None),
    }
}

/// Writes `secret` (and a newline) to `path`, readable by its owner only, whole or not
/// at all (written aside, then renamed).
pub fn write_secret_file(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(format!("{secret}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The first line of a secret file, trimmed.
pub fn read_secret_file(path: &Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// The key of a door only its own run's processes call (the monitor's reports, the
/// load's control): environment variable `env` if set; else `file`'s; else, with
/// `make`, a new key written to `file` (mode 0600) — the door makes it, its callers read
/// it. `None`: none yet (a caller started before its door).
pub fn run_key(env: &str, file: &Path, make: bool) -> std::io::Result<Option<String>> {
    if let Some(key) = std::env::var(env).ok().filter(|k| !k.is_empty()) {
        return Ok(Some(key));
    }
    match read_secret_file(file) {
        Ok(key) if !key.is_empty() => Ok(Some(key)),
        Ok(_) | Err(_) if !make => Ok(None),
        _ => {
            let key = new_key();
            write_secret_file(file, &key)?;
            Ok(Some(key))
        }
    }
}

/// One run's key for a door only that run's processes call.
#[derive(Clone)]
pub struct RunKey {
    hash: String,
}

impl std::fmt::Debug for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunKey(..)")
    }
}

impl RunKey {
    /// A new key, and the key itself to hand to the run's processes.
    pub fn generate() -> (RunKey, String) {
        let key = new_key();
        (RunKey::of(&key), key)
    }

    /// The door of an existing key.
    pub fn of(key: &str) -> RunKey {
        RunKey {
            hash: key_hash(key),
        }
    }

    /// Refuses a request without this key (401). Compared by hash: the time it takes
    /// says nothing of how much of the key was right.
    pub fn check(&self, request: &Request) -> Result<(), Response> {
        match bearer(request) {
            Some(key) if key_hash(key) == self.hash => Ok(()),
            Some(_) => Err(unauthorized("unknown key").refusing("unknown-key")),
            None => Err(unauthorized(
                "this endpoint needs the run's key: Authorization: Bearer KEY",
            )
            .refusing("no-key")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, headers: &[(&str, &str)], body: &str) -> Request {
        Request {
            method: method.into(),
            path: "/v1/campaigns/send".into(),
            query: String::new(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec().into(),
            peer: "127.0.0.1:5555".parse().unwrap(),
        }
    }

    fn guard() -> BrowserGuard {
        BrowserGuard::new(
            "127.0.0.1:7001".parse().unwrap(),
            &["admin.example".to_string()],
            &["https://console.example".to_string()],
        )
    }

    #[test]
    fn the_cross_site_simple_post_is_refused() {
        // The measurement the access issue opens with: text/plain, a foreign Origin.
        let forged = request(
            "POST",
            &[
                ("Host", "127.0.0.1:7001"),
                ("Origin", "http://evil.example"),
                ("Content-Type", "text/plain"),
            ],
            r#"{"packets":1}"#,
        );
        assert_eq!(guard().check(&forged).unwrap_err().status, 403);
        // Without the Origin (a browser that hides it): still not JSON.
        let hidden = request(
            "POST",
            &[("Host", "127.0.0.1:7001"), ("Content-Type", "text/plain")],
            "{}",
        );
        assert_eq!(guard().check(&hidden).unwrap_err().status, 415);
        let no_type = request("POST", &[("Host", "127.0.0.1:7001")], "");
        assert_eq!(guard().check(&no_type).unwrap_err().status, 415);
        let json = request(
            "POST",
            &[
                ("Host", "127.0.0.1:7001"),
                ("Content-Type", "application/json; charset=utf-8"),
            ],
            "{}",
        );
        assert!(guard().check(&json).is_ok());
    }

    #[test]
    fn only_names_of_this_door_pass_as_host_and_origin() {
        let g = guard();
        for host in [
            "127.0.0.1:7001",
            "localhost:7001",
            "LOCALHOST:7001",
            "127.0.0.1",
            "[::1]:7001",
            "admin.example",
            "admin.example:7001",
            "10.0.0.5:7001",
        ] {
            let r = request("GET", &[("Host", host)], "");
            assert!(g.check(&r).is_ok(), "{host}");
        }
        // A rebound name, another port.
        for host in [
            "evil.example:7001",
            "attacker.test",
            "127.0.0.1:8000",
            "admin.example:8000",
        ] {
            let r = request("GET", &[("Host", host)], "");
            assert_eq!(g.check(&r).unwrap_err().status, 403, "{host}");
        }
        for origin in [
            "http://127.0.0.1:7001",
            "http://localhost:7001",
            "https://console.example",
        ] {
            let r = request("GET", &[("Host", "127.0.0.1:7001"), ("Origin", origin)], "");
            assert!(g.check(&r).is_ok(), "{origin}");
        }
        for origin in [
            "null",
            "http://evil.example",
            "https://console.example.evil",
            "http://127.0.0.1:9",
        ] {
            let r = request("GET", &[("Host", "127.0.0.1:7001"), ("Origin", origin)], "");
            assert_eq!(g.check(&r).unwrap_err().status, 403, "{origin}");
        }
        // Not on loopback: `localhost` is not this door.
        let wide = BrowserGuard::new("0.0.0.0:7001".parse().unwrap(), &[], &[]);
        let r = request("GET", &[("Host", "localhost:7001")], "");
        assert_eq!(wide.check(&r).unwrap_err().status, 403);
    }

    #[test]
    fn keys_are_random_and_compared_by_hash() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        assert!(a.starts_with(KEY_PREFIX) && a.len() == KEY_PREFIX.len() + 64);
        assert_eq!(key_hash(&a), key_hash(&a));
        assert_eq!(key_hash(&a).len(), 64);
        let (door, key) = RunKey::generate();
        let with = |auth: &str| request("POST", &[("Authorization", auth)], "");
        assert!(door.check(&with(&format!("Bearer {key}"))).is_ok());
        assert!(door.check(&with(&format!("bearer  {key} "))).is_ok());
        let wrong = door.check(&with(&format!("Bearer {a}"))).unwrap_err();
        assert_eq!(wrong.status, 401);
        assert!(wrong
            .headers
            .iter()
            .any(|(n, v)| *n == "www-authenticate" && v == "Bearer"));
        assert_eq!(door.check(&with("Basic abc")).unwrap_err().status, 401);
        assert_eq!(
            door.check(&request("POST", &[], "")).unwrap_err().status,
            401
        );
        assert!(!format!("{door:?}").contains(&key_hash(&key)));
    }
}
