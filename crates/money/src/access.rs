//! Who may speak for the server, as the ledger keeps it: admin keys (a name, a role, and
//! only the hash of the key itself) and the admin log (every admin change, every read of
//! a user's data and every refused attempt, with who, from where, what and the result).
//! Both live beside the money — the embedded ledger's SQLite, or PostgreSQL in cluster
//! mode — behind `AccessStore`, which each backend implements; the admin door itself
//! (checking keys, the console's sessions) is the server's.

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// What a key may do. Each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `/metrics` and `/v1/stats`: what a Prometheus scraper holds.
    Metrics,
    /// Every read: users, balances, ledger operations, campaigns, the audit.
    Viewer,
    /// Everything: campaigns, broadcasts, revocations, the keys and the admin log.
    Operator,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Metrics, Role::Viewer, Role::Operator];

    pub fn name(self) -> &'static str {
        match self {
            Role::Metrics => "metrics",
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    /// Whether a key of this role may do what needs `need`.
    pub fn allows(self, need: Role) -> bool {
        self >= need
    }
}

/// A role's name that is none of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownRole(pub String);

impl std::fmt::Display for UnknownRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "role must be metrics, viewer or operator, not {:?}",
            self.0
        )
    }
}

impl std::error::Error for UnknownRole {}

impl std::str::FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownRole(s.to_string()))
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An admin key as the ledger keeps it: never the key, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Unique; what the admin log and minted money name.
    pub name: String,
    pub role: Role,
    /// Lowercase hex of SHA-256 of the key.
    pub hash: String,
    pub created_ms: u64,
    /// Who made it: a key's name, or `cli` (`hongbao admin-key`), or `serve` (the first
    /// operator key a fresh server makes).
    pub created_by: String,
}

/// One line of the admin log.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LogEntry {
    /// Given by the store, in the order written.
    pub id: u64,
    pub at_ms: u64,
    /// The key's name, when a key was shown and known.
    pub key: Option<String>,
    pub role: Option<Role>,
    /// The caller's address (`ip:port`).
    pub source: String,
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The request's body as sent (a key in a console log-in is never kept), cut to
    /// `MAX_LOGGED_BODY` bytes.
    pub body: String,
    pub status: u16,
    /// What came of it, in words: an error message, or what was made.
    pub result: String,
}

/// The most of a request's body the log keeps.
pub const MAX_LOGGED_BODY: usize = 2048;

/// A request's body as the log keeps it: cut to `MAX_LOGGED_BODY` bytes, on a character
/// boundary.
pub fn logged_body(text: &str) -> &str {
    let mut end = MAX_LOGGED_BODY.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Refused attempts kept at most: older ones are dropped as new ones come, so a flood of
/// bad keys cannot fill the disk.
pub const MAX_REFUSED_KEPT: u64 = 10_000;

/// A user's login tokens revoked: every one issued before `at` is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Given by the store, in the order written: how hosts read on from where they were.
    pub id: u64,
    pub user: u64,
    /// Unix seconds: tokens whose `iat` is before it are refused.
    pub at: u64,
    /// The key that revoked them.
    pub by: String,
}

/// Where admin keys and the admin log are kept: the ledger's database.
pub trait AccessStore: Send + Sync {
    /// Every key (the door caches them, and reads again at least every second).
    fn keys(&self) -> Result<Vec<KeyRecord>>;
    /// Adds a key; a name already taken is refused.
    fn add_key(&self, key: &KeyRecord) -> Result<()>;
    /// Removes the key of that name; whether there was one.
    fn remove_key(&self, name: &str) -> Result<bool>;
    /// Writes `entry` durably (its id is given by the store) before returning; a refused
    /// attempt (status 401, 403, 415, 421) also drops the oldest refused entries beyond
    /// `MAX_REFUSED_KEPT`.
    fn record(&self, entry: &LogEntry) -> Result<u64>;
    /// Up to `limit` entries, newest first, older than id `before` when given.
    fn log(&self, before: Option<u64>, limit: usize) -> Result<Vec<LogEntry>>;
    /// Writes a revocation durably (its id is given by the store) before returning.
    fn revoke(&self, revocation: &Revocation) -> Result<u64>;
    /// The revocations written after id `after` whose instant is at or after `since`
    /// (older ones refuse no token alive), oldest first: every host reads on from the
    /// last it saw.
    fn revocations(&self, after: u64, since: u64) -> Result<Vec<Revocation>>;
}

/// Whether an entry records a refused attempt (kept only up to `MAX_REFUSED_KEPT`).
pub fn is_refusal(status: u16) -> bool {
    matches!(status, 401 | 403 | 415 | 421)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_read_back_by_name() {
        assert!(Role::Operator.allows(Role::Viewer));
        assert!(Role::Viewer.allows(Role::Metrics));
        assert!(!Role::Metrics.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Operator));
        for r in Role::ALL {
            assert_eq!(r.name().parse::<Role>(), Ok(r));
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", r.name())
            );
        }
        assert!("root".parse::<Role>().is_err());
    }
}
