//! The admin door: who may call the admin API, what each may do, and the record of it.
//!
//! Every request meets the door before its handler: first the browser checks
//! (`hongbao_http::access::BrowserGuard`: `Host`, `Origin`, JSON for changes), then the
//! key — `Authorization: Bearer KEY`, or the console's session cookie with its CSRF token
//! on every change (`console.rs`) — then the role the endpoint needs (`Role`: metrics,
//! viewer, operator). A missing or unknown key is 401 with `WWW-Authenticate: Bearer`; a
//! role too low, 403. Nothing the handler would start is started.
//!
//! Keys are kept as SHA-256 hashes in the ledger's database (`AccessStore`: SQLite, or
//! PostgreSQL in cluster mode) and cached here, read again at least every
//! `KEY_REFRESH`: a key added or removed — here, on another host, or by `hongbao
//! admin-key` — works or stops working within that, without a restart.
//!
//! The record: each change, each read of a user's data and each refused attempt is
//! written to the admin log, durably, before the answer goes out, naming the key, its
//! role, the source address, the request and the result. Refused attempts are recorded
//! one by one up to `REFUSALS_PER_SEC` a second; the rest of that second are never
//! dropped but folded: one entry per (source address, key, method, path, status) with its
//! count and the first one's error, written when the second is over (`Refusals`). So a
//! flood first and a probe after leaves the probe on the record, at most
//! `MAX_FOLDED_PER_SEC` + 1 entries a second (beyond that many distinct kinds, the rest
//! fold into one entry per status). Every refusal is counted in `/metrics` by status and
//! reason (`hongbao_admin_refusals_total`), and the store keeps the newest
//! `MAX_REFUSED_KEPT`: a flood of bad keys cannot fill the disk.

pub mod console;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hongbao_http::access::{bearer, key_hash, new_key, unauthorized, BrowserGuard};
use hongbao_http::{Request, Response};
use hongbao_money::access::{is_refusal, AccessStore, KeyRecord, LogEntry, Role};
use hongbao_money::error as money;
use hongbao_sys::clock::unix_ms;

use console::Sessions;

/// The cached keys are read again at least this often...
pub const KEY_REFRESH: Duration = Duration::from_secs(1);
/// ...and on an unknown key, if they are older than this (a key just added works at
/// once; a flood of bad keys costs a read this often at most).
const KEY_MISS_REFRESH: Duration = Duration::from_millis(100);
/// While the keys cannot be read (the ledger's database restarting), the last keys read
/// are used this long: no key can be added or removed meanwhile either, and a moment's
/// outage should not turn every operator away. After it, requests are answered 503.
const KEY_STALE_OK: Duration = Duration::from_secs(30);
/// Refused attempts recorded one by one a second at most; the rest are folded.
const REFUSALS_PER_SEC: u32 = 10;
/// Folded entries a second at most (distinct source, method, path and status); beyond,
/// one entry per status.
const MAX_FOLDED_PER_SEC: usize = 64;
/// How often folded refusals of a second that is over are written, when no refusal comes
/// to write them.
pub const FOLD_FLUSH_EVERY: Duration = Duration::from_millis(250);

/// The file a fresh server writes its first operator key to, in its data directory.
pub const FIRST_KEY_FILE: &str = "admin.key";

/// Who is calling, once the door let them in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The key's name.
    pub key: String,
    pub role: Role,
}

/// The door of one admin listener.
pub struct Door {
    store: Arc<dyn AccessStore>,
    guard: BrowserGuard,
    keys: Mutex<KeyCache>,
    pub(crate) sessions: Sessions,
    refusals: Arc<Refusals>,
}

#[derive(Default)]
struct KeyCache {
    by_hash: HashMap<String, Caller>,
    read_at: Option<Instant>,
}

/// Refused attempts: counted by status and reason for `/metrics`, and the current
/// second's budget of entries with what is folded past it. Shared by the door and the
/// supervisor, which renders the counts.
#[derive(Default)]
pub struct Refusals {
    counts: Mutex<std::collections::BTreeMap<(u16, &'static str), u64>>,
    budget: Mutex<Budget>,
}

/// What folded refusals have in common: source address, key (if one was known), method,
/// path and status.
type FoldKind = (String, Option<String>, String, String, u16);

#[derive(Default)]
struct Budget {
    second: u64,
    recorded: u32,
    /// Past the budget: (source address, key, method, path, status) → the count and the
    /// first one's entry.
    folded: std::collections::BTreeMap<FoldKind, (u64, LogEntry)>,
}

impl Refusals {
    /// Every refusal so far, by status and reason.
    pub fn counts(&self) -> Vec<((u16, &'static str), u64)> {
        let counts = self.counts.lock().expect("the refusal counts");
        counts.iter().map(|(k, n)| (*k, *n)).collect()
    }
}

impl Door {
    pub fn new(
        store: Arc<dyn AccessStore>,
        guard: BrowserGuard,
        secure_cookies: bool,
        refusals: Arc<Refusals>,
    ) -> Door {
        Door {
            store,
            guard,
            keys: Mutex::new(KeyCache::default()),
            sessions: Sessions::new(secure_cookies),
            refusals,
        }
    }

    pub fn store(&self) -> &Arc<dyn AccessStore> {
        &self.store
    }

    /// The browser checks alone (the console's page and log-in pass them too).
    pub fn guard(&self, request: &Request) -> Result<(), Response> {
        self.guard.check(request).inspect_err(|refused| {
            self.record_refusal(request, None, refused);
        })
    }

    /// Lets `request` in if it may do what needs `need`: the browser checks, a key, the
    /// role. A refusal is recorded, and is the answer to give.
    pub fn admit(&self, request: &Request, need: Role) -> Result<Caller, Response> {
        self.guard(request)?;
        let caller = match bearer(request) {
            Some(key) => match self.caller_of(&key_hash(key)) {
                Ok(Some(caller)) => Ok(caller),
                Ok(None) => Err(unauthorized("unknown admin key (it may have been removed)")
                    .refusing("unknown-key")),
                // Not a refusal to record: the keys cannot be read (nor the log written).
                Err(unreadable) => return Err(unreadable),
            },
            None => self.sessions.caller(request, self),
        };
        let caller = caller.inspect_err(|refused| self.record_refusal(request, None, refused))?;
        if !caller.role.allows(need) {
            let refused = Response::error(
                403,
                format!(
                    "key {:?} has the {} role; this needs {}",
                    caller.key, caller.role, need
                ),
            )
            .refusing("role");
            self.record_refusal(request, Some(&caller), &refused);
            return Err(refused);
        }
        Ok(caller)
    }

    /// The caller a key's hash names now (`None`: no such key), reading the keys again
    /// when the cache is old. Keys that cannot be read are a 503 to answer, once the last
    /// ones read are older than `KEY_STALE_OK`.
    pub(crate) fn caller_of(&self, hash: &str) -> Result<Option<Caller>, Response> {
        let mut cache = self.keys.lock().expect("the key cache");
        let age = cache.read_at.map(|t| t.elapsed());
        let stale = age.is_none_or(|a| a >= KEY_REFRESH);
        let missing = !cache.by_hash.contains_key(hash);
        if stale || (missing && age.is_none_or(|a| a >= KEY_MISS_REFRESH)) {
            match self.store.keys() {
                Ok(keys) => {
                    cache.by_hash = keys
                        .into_iter()
                        .map(|k| {
                            let caller = Caller {
                                key: k.name,
                                role: k.role,
                            };
                            (k.hash, caller)
                        })
                        .collect();
                    cache.read_at = Some(Instant::now());
                }
                Err(e) if age.is_some_and(|a| a < KEY_STALE_OK) => {
                    tracing::warn!(error = %e, "reading the admin keys failed; the last read stand");
                }
                // Fail closed: no keys known recently enough admit no one.
                Err(e) => {
                    tracing::error!(error = %e, "reading the admin keys failed");
                    cache.by_hash.clear();
                    cache.read_at = None;
                    return Err(Response::error(
                        503,
                        format!("the admin keys cannot be read now; try again: {e}"),
                    ));
                }
            }
        }
        Ok(cache.by_hash.get(hash).cloned())
    }

    /// Forgets the cached keys: the next request reads them again (after a change made
    /// through this door).
    pub(crate) fn keys_changed(&self) {
        self.keys.lock().expect("the key cache").read_at = None;
    }

    /// Writes the record of a request and its answer, durably, before the answer goes
    /// out. `result` says what came of it in words; the body of a console log-in (a key)
    /// is never kept.
    pub fn record(
        &self,
        request: &Request,
        caller: Option<&Caller>,
        answer: &Response,
        result: &str,
    ) -> money::Result<u64> {
        self.store
            .record(&self.entry(request, caller, answer, result))
    }

    /// The log's entry of a request and its answer.
    fn entry(
        &self,
        request: &Request,
        caller: Option<&Caller>,
        answer: &Response,
        result: &str,
    ) -> LogEntry {
        let body = if request.path.starts_with("/console/login") {
            "(a key: not kept)".to_string()
        } else {
            String::from_utf8_lossy(&request.body).into_owned()
        };
        let path = match request.query.as_str() {
            "" => request.path.clone(),
            q => format!("{}?{q}", request.path),
        };
        LogEntry {
            id: 0,
            at_ms: unix_ms(),
            key: caller.map(|c| c.key.clone()),
            role: caller.map(|c| c.role),
            source: request.peer.to_string(),
            method: request.method.clone(),
            path,
            body,
            status: answer.status,
            result: result.to_string(),
        }
    }

    /// Records a refused attempt (`answer`: 401, 403, 415), at most `REFUSALS_PER_SEC` a
    /// second.
    pub fn refused(&self, request: &Request, caller: Option<&Caller>, answer: &Response) {
        self.record_refusal(request, caller, answer);
    }

    /// Records a client refused in its TLS handshake (a plain client on the TLS admin
    /// address, a stranger to the certificate): method `TLS`, status 421, like any
    /// refusal (at most `REFUSALS_PER_SEC` a second).
    pub fn refused_handshake(&self, peer: std::net::SocketAddr, why: String) {
        let request = Request {
            method: "TLS".into(),
            path: "(handshake)".into(),
            query: String::new(),
            headers: Vec::new(),
            body: Default::default(),
            peer,
        };
        let refused = Response::error(421, why).refusing("tls-handshake");
        self.record_refusal(&request, None, &refused);
    }

    fn record_refusal(&self, request: &Request, caller: Option<&Caller>, answer: &Response) {
        if answer.status >= 500 {
            return; // the keys (and the log) cannot be read or written now
        }
        if !is_refusal(answer.status) {
            // A malformed log-in (400) is not an attempt on a key: recorded in full.
            if let Err(e) = self.record(request, caller, answer, &error_text(answer)) {
                tracing::error!(error = %e, "recording a refused admin request failed");
            }
            return;
        }
        {
            let reason = answer.refusal.unwrap_or("other");
            let mut counts = self.refusals.counts.lock().expect("the refusal counts");
            *counts.entry((answer.status, reason)).or_default() += 1;
        }
        let second = unix_ms() / 1000;
        self.flush_refusals_before(second);
        {
            let mut budget = self.refusals.budget.lock().expect("the refusal budget");
            if budget.recorded >= REFUSALS_PER_SEC {
                let entry = self.entry(request, caller, answer, &error_text(answer));
                let source = request.peer.ip().to_string();
                let (method, path) = (entry.method.clone(), entry.path.clone());
                let mut kind = (source, entry.key.clone(), method, path, answer.status);
                if budget.folded.len() >= MAX_FOLDED_PER_SEC && !budget.folded.contains_key(&kind) {
                    kind = ("*".into(), None, "*".into(), "*".into(), answer.status);
                }
                budget.folded.entry(kind).or_insert((0, entry)).0 += 1;
                return;
            }
            budget.recorded += 1;
        }
        if let Err(e) = self.record(request, caller, answer, &error_text(answer)) {
            tracing::error!(error = %e, "recording a refused admin request failed");
        }
    }

    /// Writes what was folded of the seconds before `second`, one entry per kind with
    /// its count, and starts that second's budget.
    fn flush_refusals_before(&self, second: u64) {
        let (over, folded) = {
            let mut budget = self.refusals.budget.lock().expect("the refusal budget");
            if budget.second == second {
                return;
            }
            let over = budget.second;
            budget.second = second;
            budget.recorded = 0;
            (over, std::mem::take(&mut budget.folded))
        };
        for ((source, key, method, path, _), (count, mut entry)) in folded {
            entry.source = source;
            if key.is_none() {
                (entry.key, entry.role) = (None, None);
            }
            entry.method = method;
            entry.path = path;
            entry.body = String::new();
            entry.result = format!(
                "{count} refused like this in the second from Unix time {over}, past the \
                 {REFUSALS_PER_SEC} a second recorded one by one; the first: {}",
                entry.result
            );
            if let Err(e) = self.store.record(&entry) {
                tracing::error!(error = %e, "recording folded admin refusals failed");
            }
        }
    }

    /// Writes folded refusals once their second is over, when no refusal came to: the
    /// admin listener calls this every `FOLD_FLUSH_EVERY`, and once at its end.
    pub fn flush_refusals(&self) {
        self.flush_refusals_before(unix_ms() / 1000);
    }
}

/// The `error` of a JSON error answer, or its status.
pub fn error_text(answer: &Response) -> String {
    serde_json::from_slice::<serde_json::Value>(&answer.body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("status {}", answer.status))
}

/// Makes a new key of `role` named `name`, stores its hash, and returns the key — the one
/// time it is seen. `by`: who made it (a key's name, `cli`, `serve`).
pub fn make_key(
    store: &dyn AccessStore,
    name: &str,
    role: Role,
    by: &str,
) -> money::Result<String> {
    check_key_name(name)?;
    let key = new_key();
    store.add_key(&KeyRecord {
        name: name.to_string(),
        role,
        hash: key_hash(&key),
        created_ms: unix_ms(),
        created_by: by.to_string(),
    })?;
    Ok(key)
}

/// A key's name: 1 to 64 of letters, digits, `-`, `_` and `.` (it appears in logs and in
/// the ledger's events).
pub fn check_key_name(name: &str) -> money::Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(money::Error::refused(format!(
            "a key's name is 1 to 64 letters, digits, '-', '_' or '.', not {name:?}"
        )))
    }
}

/// A fresh server is never open: with no key at all, makes an operator key named
/// `operator` and writes it to `DIR/admin.key` (mode 0600), for the operator, the bench
/// and the README's commands to read. Returns where, when it made one.
pub fn ensure_first_key(store: &dyn AccessStore, dir: &Path) -> money::Result<Option<PathBuf>> {
    if !store.keys()?.is_empty() {
        return Ok(None);
    }
    let path = dir.join(FIRST_KEY_FILE);
    let key = match make_key(store, "operator", Role::Operator, "serve") {
        Ok(key) => key,
        // Another gateway of the same cluster made it first.
        Err(e) if e.kind() == money::ErrorKind::Refused && !store.keys()?.is_empty() => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    write_secret_file(&path, &key)
        .map_err(|e| money::Error::unavailable(format!("writing {}", path.display()), e))?;
    Ok(Some(path))
}

pub use hongbao_http::access::{read_secret_file, write_secret_file};
