//! A ledger checked without a server (`hongbao ledger verify`), and the backups that are
//! checked the same way before they count (`hongbao backup`, `hongbao restore`;
//! docs/ledger.md).
//!
//! The check reads a ledger file read-only and holds three things against each other:
//! the hash chain (every event's hash recomputed from the one before: the first event
//! that does not match is named), the money (every event replayed through the core's own
//! `apply`, the audit of the state it builds), and the balances table (each account
//! against the replay). With a head kept from earlier (`--head SEQ:HEX`), it also proves
//! the ledger still holds that event with that hash: what a chain alone cannot show is its
//! newest events cut off.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hongbao_money::event::{Event, Record};
use hongbao_money::Audit;
use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use super::chain::{Head, Walk};
use crate::core::{Core, CoreConfig};
use crate::error::{Error, Result};

/// The ledger file in a data directory or a backup (or the file itself).
pub fn ledger_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("ledger.sqlite")
    } else {
        path.to_path_buf()
    }
}

/// What a check found. `problems` empty: the ledger is whole.
#[derive(Debug, Clone, Serialize)]
pub struct Verified {
    pub file: PathBuf,
    pub bytes: u64,
    /// Events in the file...
    pub events: u64,
    /// ...and those checked before the first that could not be (all of them when the
    /// ledger is whole).
    pub checked: u64,
    /// `SEQ:HEX` of the last event that matched the chain.
    pub head: String,
    pub audit: Audit,
    /// Everything wrong, the chain's first break first.
    pub problems: Vec<String>,
    pub millis: u64,
}

impl Verified {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the ledger at `path` (a data directory, a backup, or the file), and with
/// `expect` that it still holds that head.
pub fn verify(path: &Path, expect: Option<Head>) -> Result<Verified> {
    let started = Instant::now();
    let file = ledger_file(path);
    if !file.is_file() {
        return Err(Error::config(format!("no ledger at {}", file.display())));
    }
    let reading = |e| Error::ledger("reading the ledger to verify it", e);
    let conn = Connection::open_with_flags(
        &file,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(reading)?;
    let events: i64 = conn
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .map_err(reading)?;
    let mut problems = Vec::new();
    let mut walk = Walk::default();
    let mut core = Core::new(CoreConfig::default());
    let mut checked = 0u64;
    let mut expect_seen = false;
    // A replay that failed leaves the core's state half-built: its balances and audit
    // say nothing then.
    let mut replay_failed = false;
    {
        let mut stmt = conn
            .prepare("SELECT seq, ts_ms, kind, user, body, hash FROM events ORDER BY seq")
            .map_err(reading)?;
        let mut rows = stmt.query([]).map_err(reading)?;
        while let Some(row) = rows.next().map_err(reading)? {
            let seq = row.get::<_, i64>(0).map_err(reading)? as u64;
            let ts_ms = row.get::<_, i64>(1).map_err(reading)? as u64;
            let kind: String = row.get(2).map_err(reading)?;
            let user: Option<i64> = row.get(3).map_err(reading)?;
            let body: String = row.get(4).map_err(reading)?;
            let hash: Option<Vec<u8>> = row.get(5).map_err(reading)?;
            if !walk.step(seq, ts_ms, &body, hash.as_deref()) {
                break;
            }
            if let Some(head) = expect.filter(|h| h.seq == seq) {
                expect_seen = true;
                if walk.head().hash != head.hash {
                    problems.push(format!(
                        "the head kept, {}, is not this ledger's event {seq} ({})",
                        head.text(),
                        walk.head().text()
                    ));
                }
            }
            let event: Event = match serde_json::from_str(&body) {
                Ok(event) => event,
                Err(e) => {
                    problems.push(format!("event {seq} does not parse: {e}"));
                    break;
                }
            };
            if kind != event.kind() || user.map(|u| u as u64) != event.user() {
                problems.push(format!(
                    "event {seq}: its kind and user columns ({kind}, {user:?}) are not its body's ({}, {:?})",
                    event.kind(),
                    event.user()
                ));
            }
            let record = Record { seq, ts_ms, event };
            let replayed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.replay(&record)));
            if let Err(panic) = replayed {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                problems.push(format!("event {seq} cannot be replayed: {why}"));
                replay_failed = true;
                break;
            }
            checked += 1;
        }
    }
    if let Some((_, why)) = &walk.broken {
        problems.insert(0, format!("the hash chain breaks: {why}"));
    }
    if let Some(head) = expect {
        if !expect_seen && walk.broken.is_none() {
            problems.push(format!(
                "the head kept, {}, is past this ledger's end (event {}): events were cut off",
                head.text(),
                walk.head().seq
            ));
        }
    }
    // The balances table against the replay, account by account.
    let stored = super::read_balances(&conn)?;
    let rebuilt = core.balances_by_key();
    let mut accounts: Vec<&String> = stored.keys().chain(rebuilt.keys()).collect();
    accounts.sort();
    accounts.dedup();
    let differing: Vec<String> = accounts
        .into_iter()
        .filter(|a| stored.get(*a) != rebuilt.get(*a))
        .map(|a| {
            format!(
                "balance {a}: the table holds {} cents, the events {}",
                stored.get(a).copied().unwrap_or(0),
                rebuilt.get(a).copied().unwrap_or(0)
            )
        })
        .collect();
    if walk.broken.is_none() && !replay_failed {
        problems.extend(differing.iter().take(10).cloned());
        if differing.len() > 10 {
            problems.push(format!("… {} balances differ in all", differing.len()));
        }
    }
    let audit = Audit {
        ledger_head: Some(walk.head().text()),
        ..core.audit()
    };
    if !audit.ok && !replay_failed {
        problems.push("the money does not balance (audit.ok false)".into());
    }
    Ok(Verified {
        bytes: std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0),
        file,
        events: events as u64,
        checked,
        head: walk.head().text(),
        audit,
        problems,
        millis: started.elapsed().as_millis() as u64,
    })
}

/// What `hongbao backup` did.
#[derive(Debug, Clone, Serialize)]
pub struct BackedUp {
    pub from: PathBuf,
    pub millis: u64,
    pub verified: Verified,
}

/// A consistent copy of the ledger in `data_dir` (a server may be writing it) into
/// `out_dir/ledger.sqlite`, then checked: SQLite's `VACUUM INTO` reads one snapshot in a
/// read transaction, which the writer never waits for (WAL).
pub fn backup(data_dir: &Path, out_dir: &Path) -> Result<BackedUp> {
    let started = Instant::now();
    let from = ledger_file(data_dir);
    if !from.is_file() {
        return Err(Error::config(format!("no ledger at {}", from.display())));
    }
    // The copy is the ledger's: its owner's only, and one backup at a time into it.
    let _lock = hongbao_sys::dirlock::DirLock::acquire(out_dir, "hongbao backup")
        .map_err(|e| Error::config(e.to_string()))?;
    let to = out_dir.join("ledger.sqlite");
    if to.exists() {
        return Err(Error::config(format!(
            "{} exists: a backup goes into a directory of its own",
            to.display()
        )));
    }
    let conn = Connection::open_with_flags(
        &from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| Error::ledger("opening the ledger to back it up", e))?;
    conn.execute("VACUUM INTO ?1", [to.to_string_lossy().as_ref()])
        .map_err(|e| Error::ledger("copying the ledger (VACUUM INTO)", e))?;
    drop(conn);
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::config(format!("making {} its owner's only: {e}", to.display())))?;
    }
    let millis = started.elapsed().as_millis() as u64;
    let verified = verify(&to, None)?;
    Ok(BackedUp {
        from,
        millis,
        verified,
    })
}

/// A ledger left with its write-ahead log (a server that crashed: what it committed is in
/// the log) has the log folded in, so the file moved aside holds all of it. No server is
/// on it: the caller holds the directory's lock.
fn fold_write_ahead_log(ledger: &Path) -> Result<()> {
    let wal = PathBuf::from(format!("{}-wal", ledger.display()));
    if !wal.exists() {
        return Ok(());
    }
    let conn = Connection::open(ledger)
        .map_err(|e| Error::ledger("opening the ledger to fold in its write-ahead log", e))?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(|e| Error::ledger("folding in the ledger's write-ahead log", e))?;
    drop(conn);
    tracing::info!(ledger = %ledger.display(), "a write-ahead log left by a server that did not stop cleanly was folded in");
    Ok(())
}

/// What `hongbao restore` did.
#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub to: PathBuf,
    /// Where the ledger it replaced was put (`--force`).
    pub replaced: Option<PathBuf>,
    pub verified: Verified,
}

/// Puts the backup at `backup` into `data_dir` once it checks out whole: copied beside
/// and renamed into place. A ledger already there is refused unless `force`, and then
/// moved aside, never deleted (a write-ahead log a crashed server left folded in first);
/// a data directory a server is running on is always refused, naming it.
pub fn restore(backup: &Path, data_dir: &Path, force: bool) -> Result<Restored> {
    let verified = verify(backup, None)?;
    if !verified.ok() {
        return Err(Error::Corrupt(format!(
            "the backup {} does not check out: {}",
            verified.file.display(),
            verified.problems.join("; ")
        )));
    }
    // No server on it while this runs (it holds the same lock), and none starts.
    let _lock = hongbao_sys::dirlock::DirLock::acquire(data_dir, "hongbao restore")
        .map_err(|e| Error::config(e.to_string()))?;
    let to = data_dir.join("ledger.sqlite");
    if to.exists() {
        fold_write_ahead_log(&to)?;
    }
    let mut replaced = None;
    if to.exists() {
        if !force {
            return Err(Error::config(format!(
                "{} holds a ledger: --force moves it aside and puts the backup in its place",
                data_dir.display()
            )));
        }
        let aside = data_dir.join(format!(
            "ledger.sqlite.replaced-{}",
            hongbao_sys::clock::unix_ms()
        ));
        std::fs::rename(&to, &aside)
            .map_err(|e| Error::config(format!("moving {} aside: {e}", to.display())))?;
        replaced = Some(aside);
    }
    let partial = data_dir.join("ledger.sqlite.restoring");
    let copy = || -> std::io::Result<()> {
        std::fs::copy(&verified.file, &partial)?;
        std::fs::File::open(&partial)?.sync_all()?;
        std::fs::rename(&partial, &to)?;
        std::fs::File::open(data_dir)?.sync_all()
    };
    copy().map_err(|e| Error::config(format!("putting the backup in place: {e}")))?;
    Ok(Restored {
        to,
        replaced,
        verified,
    })
}
