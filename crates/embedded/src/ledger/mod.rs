//! The durable ledger: append-only events plus derived balances, in SQLite (bundled,
//! WAL mode, synchronous=FULL).
//!
//! The core never waits on SQLite: it hands new events to the `LedgerWriter` thread,
//! which group-commits them — a commit begins as soon as there is an event to commit, but
//! no sooner than `commit_interval` after the previous commit began, and takes everything
//! that arrived meanwhile (up to `max_batch` events) in one transaction — then publishes
//! the highest committed sequence number (and how long the commit took, for `/metrics`)
//! and wakes the core, which only then releases the replies that depended on those events. So a lone event after a quiet spell is committed
//! at once, and at any rate of events the disk sees at most one durable commit (fsync) per
//! `commit_interval`: at 200 wins a second, one commit carries four of them, not one.
//!
//! Every event carries a hash chaining it to the one before (`chain.rs`): reading the
//! ledger back walks the chain, so an edited, removed or inserted event is named, and the
//! newest hash (the head) is published for operators to keep elsewhere.
//!
//! - this file: the tables, appending, reading back;
//! - `writer`: the group-commit thread; `reader`: look-ups beside it (the admin API's);
//! - `chain`: the hash chain; `verify`: a ledger checked without a server (and backups).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hongbao_money::event::{Account, Event, Record};
use rusqlite::{params, Connection, OptionalExtension};

use crate::error::{Error, Result};

pub mod chain;
mod reader;
pub mod verify;
mod writer;

pub use chain::Head;
pub use reader::Reader;
pub use writer::{GroupCommit, LedgerWriter};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    seq   INTEGER PRIMARY KEY,
    ts_ms INTEGER NOT NULL,
    kind  TEXT NOT NULL,
    user  INTEGER,
    body  TEXT NOT NULL,
    hash  BLOB
);
CREATE INDEX IF NOT EXISTS events_by_user ON events(user, seq) WHERE user IS NOT NULL;
CREATE TABLE IF NOT EXISTS balances (
    account TEXT PRIMARY KEY,
    cents   INTEGER NOT NULL
);
";

pub struct Ledger {
    conn: Connection,
    path: PathBuf,
    /// The newest committed event's number and hash.
    head: Head,
}

/// Keeps the write-ahead log and its shared memory when `conn` closes (SQLite's
/// `SQLITE_FCNTL_PERSIST_WAL`), every connection of ours: SQLite's last connection to close
/// otherwise removes both, and in an upgrade the old server's last close came while the new
/// server's connections were open on the same files — removing the files they write to
/// (a commit into a removed write-ahead log is lost with it). `tidy_wal` removes them at a
/// clean stop instead, once no connection is left.
pub(crate) fn keep_wal(conn: &Connection) {
    let mut on: std::os::raw::c_int = 1;
    // SAFETY: the handle is this live connection's, used for this one call on this thread;
    // PERSIST_WAL reads and writes the one int it is given.
    unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL,
            &mut on as *mut std::os::raw::c_int as *mut std::os::raw::c_void,
        );
    }
}

/// At a clean stop, once every connection is closed and the write-ahead log folded in
/// (`wal_checkpoint(TRUNCATE)`, empty): its two files removed, so the ledger is one file.
/// A log with anything in it is left for the next open to apply.
pub fn tidy_wal(dir: &Path) {
    let path = dir.join("ledger.sqlite");
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    if std::fs::metadata(&wal).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(&wal);
        let _ = std::fs::remove_file(format!("{}-shm", path.display()));
    }
}

impl Ledger {
    /// Opens (creating if needed) `DIR/ledger.sqlite`.
    pub fn open(dir: &Path) -> Result<Ledger> {
        hongbao_sys::dirlock::make_private_dir(dir)
            .map_err(|e| Error::config(format!("creating data dir {}: {e}", dir.display())))?;
        let path = dir.join("ledger.sqlite");
        make_private_files(&path).map_err(|e| {
            Error::config(format!("making {} its owner's only: {e}", path.display()))
        })?;
        let conn = Connection::open(&path).map_err(|e| Error::ledger("opening", e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| Error::ledger("WAL", e))?;
        keep_wal(&conn);
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| Error::ledger("sync", e))?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| Error::ledger("creating the schema", e))?;
        let mut ledger = Ledger {
            conn,
            path,
            head: Head::default(),
        };
        ledger.chain_unchained()?;
        ledger.head = ledger.stored_head()?;
        Ok(ledger)
    }

    /// A ledger of a version before the chain: its column added, and its events chained
    /// in order, once (at the first start of this version).
    fn chain_unchained(&mut self) -> Result<()> {
        let chaining = |e| Error::ledger("chaining the ledger's events", e);
        let has_column = self.conn.prepare("SELECT hash FROM events LIMIT 0").is_ok();
        if !has_column {
            self.conn
                .execute_batch("ALTER TABLE events ADD COLUMN hash BLOB")
                .map_err(chaining)?;
        }
        let unchained: i64 = self
            .conn
            .query_row("SELECT count(*) FROM events WHERE hash IS NULL", [], |r| {
                r.get(0)
            })
            .map_err(chaining)?;
        if unchained == 0 {
            return Ok(());
        }
        let tx = self.conn.transaction().map_err(chaining)?;
        let mut head = Head::default();
        {
            let mut read = tx
                .prepare("SELECT seq, ts_ms, body, hash FROM events ORDER BY seq")
                .map_err(chaining)?;
            let mut update = tx
                .prepare("UPDATE events SET hash = ?2 WHERE seq = ?1")
                .map_err(chaining)?;
            let mut rows = read.query([]).map_err(chaining)?;
            while let Some(row) = rows.next().map_err(chaining)? {
                let (seq, ts_ms, body): (i64, i64, String) = (
                    row.get(0).map_err(chaining)?,
                    row.get(1).map_err(chaining)?,
                    row.get(2).map_err(chaining)?,
                );
                head = head.next(seq as u64, ts_ms as u64, &body);
                let stored: Option<Vec<u8>> = row.get(3).map_err(chaining)?;
                if stored.is_none() {
                    update
                        .execute(params![seq, head.hash.to_vec()])
                        .map_err(chaining)?;
                }
            }
        }
        tx.commit().map_err(chaining)?;
        tracing::info!(
            events = unchained,
            head = head.text(),
            "the ledger's events chained"
        );
        Ok(())
    }

    /// The newest event's number and stored hash.
    fn stored_head(&self) -> Result<Head> {
        let row: Option<(i64, Vec<u8>)> = self
            .conn
            .query_row(
                "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| Error::ledger("reading the head", e))?;
        match row {
            None => Ok(Head::default()),
            Some((seq, hash)) => Ok(Head {
                seq: seq as u64,
                hash: hash
                    .try_into()
                    .map_err(|_| Error::Corrupt(format!("event {seq}'s hash is not 32 bytes")))?,
            }),
        }
    }

    /// The newest committed event's number and hash.
    pub fn head(&self) -> Head {
        self.head
    }

    /// A read-only connection to the same database, for admin look-ups.
    pub fn reader(&self) -> Result<Reader> {
        Reader::open(&self.path)
    }

    /// Every event in ledger order, the hash chain walked as they come: an event that
    /// does not match it is an error naming it (nothing after it is read).
    pub fn for_each(&self, mut f: impl FnMut(Record)) -> Result<u64> {
        let mut walk = chain::Walk::default();
        let mut stmt = self
            .conn
            .prepare("SELECT seq, ts_ms, body, hash FROM events ORDER BY seq")
            .map_err(|e| Error::ledger("reading events", e))?;
        let mut rows = stmt
            .query([])
            .map_err(|e| Error::ledger("reading events", e))?;
        let mut count = 0;
        while let Some(row) = rows
            .next()
            .map_err(|e| Error::ledger("reading events", e))?
        {
            let seq: i64 = row.get(0).map_err(|e| Error::ledger("reading seq", e))?;
            let ts_ms: i64 = row.get(1).map_err(|e| Error::ledger("reading ts", e))?;
            let body: String = row.get(2).map_err(|e| Error::ledger("reading body", e))?;
            let hash: Option<Vec<u8>> = row.get(3).map_err(|e| Error::ledger("reading hash", e))?;
            if !walk.step(seq as u64, ts_ms as u64, &body, hash.as_deref()) {
                let (_, why) = walk.broken.expect("a break says why");
                return Err(Error::Corrupt(format!(
                    "the ledger's hash chain breaks: {why}"
                )));
            }
            let event: Event = serde_json::from_str(&body)
                .map_err(|e| Error::Corrupt(format!("event {seq} does not parse: {e}: {body}")))?;
            f(Record {
                seq: seq as u64,
                ts_ms: ts_ms as u64,
                event,
            });
            count += 1;
        }
        Ok(count)
    }

    /// The derived balances table, for checking against a replay.
    pub fn balances(&self) -> Result<HashMap<String, u64>> {
        read_balances(&self.conn)
    }

    /// Appends `records` and updates balances, in one transaction; the head moves once it
    /// is committed.
    pub fn append(&mut self, records: &[Record]) -> Result<()> {
        let mut head = self.head;
        let tx = self
            .conn
            .transaction()
            .map_err(|e| Error::ledger("beginning", e))?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO events (seq, ts_ms, kind, user, body, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(|e| Error::ledger("preparing insert", e))?;
            let mut balance = tx
                .prepare_cached(
                    "INSERT INTO balances (account, cents) VALUES (?1, ?2)
                     ON CONFLICT(account) DO UPDATE SET cents = cents + excluded.cents",
                )
                .map_err(|e| Error::ledger("preparing balance", e))?;
            let mut deltas: HashMap<Account, i64> = HashMap::new();
            for r in records {
                let body = serde_json::to_string(&r.event).expect("events serialize");
                let user = r.event.user().map(|u| u as i64);
                head = head.next(r.seq, r.ts_ms, &body);
                insert
                    .execute(params![
                        r.seq as i64,
                        r.ts_ms as i64,
                        r.event.kind(),
                        user,
                        body,
                        head.hash.to_vec()
                    ])
                    .map_err(|e| Error::ledger("inserting an event", e))?;
                for (account, delta) in r.event.balance_deltas() {
                    *deltas.entry(account).or_default() += delta;
                }
            }
            for (account, delta) in deltas {
                balance
                    .execute(params![account.key(), delta])
                    .map_err(|e| Error::ledger("updating a balance", e))?;
            }
        }
        tx.commit().map_err(|e| Error::ledger("committing", e))?;
        self.head = head;
        Ok(())
    }
}

/// Every non-zero balance of the balances table, by account key.
pub(crate) fn read_balances(conn: &Connection) -> Result<HashMap<String, u64>> {
    let mut stmt = conn
        .prepare("SELECT account, cents FROM balances WHERE cents != 0")
        .map_err(|e| Error::ledger("reading balances", e))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
        })
        .map_err(|e| Error::ledger("reading balances", e))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(|e| Error::ledger("reading balances", e))
}

/// The ledger's file made (empty) with mode 0600 before SQLite opens it, so its
/// write-ahead log and shared memory, which SQLite makes with the file's mode, are its
/// owner's only too; an older ledger's files are narrowed to 0600.
fn make_private_files(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    for side in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{side}", path.display()));
        match std::fs::metadata(&file) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
