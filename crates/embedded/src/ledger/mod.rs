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
//! - this file: the tables, appending, reading back, the group-commit thread;
//! - `chain`: the hash chain; `verify`: a ledger checked without a server (and backups).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hongbao_money::event::{Account, Event, Record};
use hongbao_money::rules::shake_packet_id;
use hongbao_money::seam::{Balances, LedgerOp, LedgerRead, OpsCursor, OpsPage};
use hongbao_money::{error as money, UserView};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::error::{Error, Result};

pub mod chain;
pub mod verify;

pub use chain::Head;

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

/// Read-only look-ups (admin threads), never blocking the writer thanks to WAL.
pub struct Reader {
    conn: Connection,
}

impl Reader {
    pub fn open(path: &Path) -> Result<Reader> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|e| Error::ledger("opening a reader", e))?;
        keep_wal(&conn);
        Ok(Reader { conn })
    }

    pub fn user(&self, user: u64, limit: usize) -> Result<UserView> {
        let balance: Option<i64> = self
            .conn
            .query_row(
                "SELECT cents FROM balances WHERE account = ?1",
                [Account::User(user).key()],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| Error::ledger("reading a balance", e))?;
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, ts_ms, body FROM events WHERE user = ?1 ORDER BY seq DESC LIMIT ?2",
            )
            .map_err(|e| Error::ledger("reading user events", e))?;
        let rows = stmt
            .query_map(params![user as i64, limit as i64], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| Error::ledger("reading user events", e))?;
        let mut recent_events = Vec::new();
        for row in rows {
            let (seq, ts_ms, body) = row.map_err(|e| Error::ledger("reading user events", e))?;
            let mut event: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| Error::Corrupt(e.to_string()))?;
            event["seq"] = seq.into();
            event["ts_ms"] = ts_ms.into();
            recent_events.push(event);
        }
        Ok(UserView {
            user,
            balance_cents: balance.unwrap_or(0) as u64,
            recent_events,
        })
    }

    /// Every non-zero balance, by account.
    pub fn balances(&self) -> Result<Balances> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT account, cents FROM balances WHERE cents != 0")
            .map_err(|e| Error::ledger("reading balances", e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(|e| Error::ledger("reading balances", e))?;
        let mut balances = Balances::default();
        for row in rows {
            let (account, cents) = row.map_err(|e| Error::ledger("reading balances", e))?;
            match Account::from_key(&account) {
                Some(Account::User(u)) => {
                    balances.users.insert(u, cents as u64);
                }
                Some(Account::Campaign(c)) => {
                    balances.campaigns.insert(c, cents as u64);
                }
                None => return Err(Error::Corrupt(format!("account key {account:?}"))),
            }
        }
        Ok(balances)
    }

    /// Up to `limit` wins and opened shares after event `after_seq`, in ledger order: the
    /// events as they are stored (a win twice, were it there, shows twice).
    pub fn ops(&self, after_seq: u64, limit: usize) -> Result<OpsPage> {
        let reading = |e| Error::ledger("reading wins and opens", e);
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, body FROM events WHERE seq > ?1 \
                 AND kind IN ('shake_won', 'share_opened') ORDER BY seq LIMIT ?2",
            )
            .map_err(reading)?;
        let rows = stmt
            .query_map(params![after_seq as i64, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(reading)?;
        let mut page = OpsPage::default();
        let mut last = None;
        for row in rows {
            let (seq, body) = row.map_err(reading)?;
            let event: Event = serde_json::from_str(&body)
                .map_err(|e| Error::Corrupt(format!("event {seq} does not parse: {e}: {body}")))?;
            match event {
                Event::ShakeWon {
                    campaign,
                    index,
                    user,
                    amount_cents,
                } => page.wins.push(LedgerOp {
                    packet: shake_packet_id(campaign, index),
                    user,
                    amount_cents,
                }),
                Event::ShareOpened {
                    packet,
                    user,
                    amount_cents,
                } => page.opens.push(LedgerOp {
                    packet,
                    user,
                    amount_cents,
                }),
                other => {
                    return Err(Error::Corrupt(format!(
                        "event {seq} is stored as a win or an open but is {other:?}"
                    )))
                }
            }
            last = Some(seq as u64);
        }
        // A short page is the end of what is committed.
        if page.wins.len() + page.opens.len() == limit {
            page.next = last.map(OpsCursor::Seq);
        }
        Ok(page)
    }
}

impl LedgerRead for Reader {
    fn user(&self, user: u64, limit: usize) -> money::Result<UserView> {
        Ok(Reader::user(self, user, limit)?)
    }

    fn balances(&self) -> money::Result<Balances> {
        Ok(Reader::balances(self)?)
    }

    fn ops(&self, after: Option<OpsCursor>, limit: usize) -> money::Result<OpsPage> {
        let after = match after {
            None => 0,
            Some(OpsCursor::Seq(seq)) => seq,
            Some(other) => {
                return Err(money::Error::refused(format!(
                    "cursor {other} is not this ledger's: it pages by event (seq.N)"
                )))
            }
        };
        Ok(Reader::ops(self, after, limit)?)
    }
}

/// The group-commit thread. `submit` never blocks unless `max_pending` batches are queued
/// (then the core waits: durability is the bottleneck and must throttle everything).
pub struct LedgerWriter {
    tx: Option<SyncSender<Vec<Record>>>,
    committed: Arc<AtomicU64>,
    /// The chain's head as committed.
    head: Arc<std::sync::Mutex<Head>>,
    /// The newest commit failed and is being tried again.
    failing: Arc<AtomicBool>,
    /// `finish` was asked: a failing commit is given up after `FINISH_RETRY`.
    finishing: Arc<AtomicBool>,
    /// How long each commit took (µs), for `/metrics`.
    commit_latency: Arc<std::sync::Mutex<Histogram<u64>>>,
    thread: Option<JoinHandle<Result<()>>>,
}

#[derive(Debug, Clone, Copy)]
pub struct GroupCommit {
    /// The least time from one commit's start to the next one's.
    pub commit_interval: Duration,
    pub max_batch: usize,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            commit_interval: Duration::from_millis(20),
            max_batch: 4096,
        }
    }
}

/// How long a failed commit waits before it is tried again: a full disk may have room
/// again a moment later.
const RETRY_AFTER: Duration = Duration::from_millis(250);
/// Once `finish` is asked, how long a failing commit is still tried before its error is
/// given up (the server stops; nothing of the batch was acknowledged).
const FINISH_RETRY: Duration = Duration::from_secs(10);

impl LedgerWriter {
    /// `on_commit` runs on the writer thread after each commit (e.g. wakes the core), and
    /// when a commit starts or stops failing.
    pub fn spawn(
        mut ledger: Ledger,
        committed_seq: u64,
        group: GroupCommit,
        on_commit: impl Fn() + Send + 'static,
    ) -> LedgerWriter {
        let (tx, rx) = sync_channel::<Vec<Record>>(1024);
        let committed = Arc::new(AtomicU64::new(committed_seq));
        let head = Arc::new(std::sync::Mutex::new(ledger.head()));
        let state = WriterState {
            committed: committed.clone(),
            head: head.clone(),
            failing: Arc::default(),
            finishing: Arc::default(),
            commit_latency: Arc::new(std::sync::Mutex::new(
                hongbao_telemetry::sample::new_histogram(),
            )),
        };
        let (failing, finishing) = (state.failing.clone(), state.finishing.clone());
        let commit_latency = state.commit_latency.clone();
        let thread = std::thread::Builder::new()
            .name("ledger".into())
            .spawn(move || commit_loop(&mut ledger, rx, group, &state, on_commit))
            .expect("spawning the ledger thread");
        LedgerWriter {
            tx: Some(tx),
            committed,
            head,
            failing,
            finishing,
            commit_latency,
            thread: Some(thread),
        }
    }

    /// How long each commit took since the start (µs): from beginning its transaction
    /// until it was durable, tries again of a failing one included.
    pub fn commit_latency(&self) -> Histogram<u64> {
        self.commit_latency.lock().unwrap().clone()
    }

    /// True while the newest commit failed and is being tried again (a full disk):
    /// what needs the ledger is to be refused, not queued behind it.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    pub fn submit(&self, records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        // A send fails only if the writer thread died; `committed` then stops moving and
        // `finish` reports the error.
        let _ = self.tx.as_ref().expect("submit after finish").send(records);
    }

    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// The hash chain's head as committed.
    pub fn head(&self) -> Head {
        *self.head.lock().unwrap()
    }

    /// Commits everything submitted and stops the thread.
    pub fn finish(&mut self) -> Result<()> {
        self.finishing.store(true, Ordering::Release);
        drop(self.tx.take());
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(Error::Corrupt("ledger thread panicked".into()))),
            None => Ok(()),
        }
    }

    /// True when the writer thread stopped (a commit failed).
    pub fn is_dead(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| t.is_finished())
    }
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

/// What the writer thread shares with the `LedgerWriter`.
struct WriterState {
    committed: Arc<AtomicU64>,
    head: Arc<std::sync::Mutex<Head>>,
    failing: Arc<AtomicBool>,
    finishing: Arc<AtomicBool>,
    /// A std mutex: held for one `record` here and one copy by a scrape.
    commit_latency: Arc<std::sync::Mutex<Histogram<u64>>>,
}

fn commit_loop(
    ledger: &mut Ledger,
    rx: Receiver<Vec<Record>>,
    group: GroupCommit,
    state: &WriterState,
    on_commit: impl Fn(),
) -> Result<()> {
    let mut last_start: Option<Instant> = None;
    while let Ok(mut batch) = rx.recv() {
        let deadline = next_commit(last_start, Instant::now(), group.commit_interval);
        while batch.len() < group.max_batch {
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(more) => batch.extend(more),
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let started = Instant::now();
        last_start = Some(started);
        append_until_done(ledger, &batch, state, &on_commit)?;
        // Saturates at the histogram's top (two minutes) rather than being lost.
        let took_us = started.elapsed().as_micros().max(1) as u64;
        state
            .commit_latency
            .lock()
            .unwrap()
            .saturating_record(took_us);
        *state.head.lock().unwrap() = ledger.head();
        state
            .committed
            .store(batch.last().map_or(0, |r| r.seq), Ordering::Release);
        on_commit();
    }
    // Everything is committed: the write-ahead log folded into the ledger now, so that
    // closing this connection (the last, once the readers have closed theirs) removes it.
    if let Err(e) = ledger
        .conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
    {
        tracing::warn!(error = %e, "folding the write-ahead log into the ledger at the stop failed");
    }
    Ok(())
}

/// When a batch whose first event arrived `now` is committed: at once, unless the previous
/// commit began less than `interval` ago — then when it is `interval` old.
fn next_commit(last_start: Option<Instant>, now: Instant, interval: Duration) -> Instant {
    last_start.map_or(now, |s| (s + interval).max(now))
}

/// Appends `batch`, trying again every `RETRY_AFTER` while it fails (a failed append
/// rolled back whole, so trying again is safe): a disk that fills stops acknowledgements
/// and the server carries on, refusing what needs the ledger, until there is room again.
/// Gives up only once `finish` was asked and `FINISH_RETRY` has passed.
fn append_until_done(
    ledger: &mut Ledger,
    batch: &[Record],
    state: &WriterState,
    on_commit: &impl Fn(),
) -> Result<()> {
    let mut finishing_since = None;
    loop {
        match ledger.append(batch) {
            Ok(()) => {
                if state.failing.swap(false, Ordering::AcqRel) {
                    tracing::info!("the ledger commits again");
                    on_commit();
                }
                return Ok(());
            }
            Err(e) => {
                if !state.failing.swap(true, Ordering::AcqRel) {
                    tracing::error!(
                        error = %e,
                        retry_every_ms = RETRY_AFTER.as_millis() as u64,
                        "a ledger commit failed; refusing what needs the ledger until one succeeds"
                    );
                    on_commit();
                }
                if state.finishing.load(Ordering::Acquire) {
                    let since = *finishing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= FINISH_RETRY {
                        return Err(e);
                    }
                }
                std::thread::sleep(RETRY_AFTER);
            }
        }
    }
}

#[cfg(test)]
mod tests;
