//! The embedded money backend, the default: the core runs in the supervisor's loop, its
//! SQLite ledger is group-committed on a thread of its own, and a reader thread answers
//! `Op::Me` from what the ledger has committed. Together they are one `Money`.
//!
//! - `core`: the money state machine (plain code, no I/O);
//! - `ledger`: SQLite — events plus derived balances, the group-commit writer, readers;
//! - `access`: admin keys and the admin log, in the ledger's file;
//! - `error`: what kind of failure, and what we were doing.
//!
//! `hongbao serve`'s supervisor (crates/server) hosts it; `hongbao backup`, `restore`,
//! `ledger verify` and `ledger-bench` use the ledger without a server.

pub mod access;
pub mod core;
pub mod error;
pub mod ledger;

pub use error::{Error, Result};

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use hongbao_money::seam::{AdminAnswer, AdminRequest, MoneySnapshot, Op, OpKind, Origin, Output};
use hongbao_money::{Audit, Money, Reply, WorkerId};
use hongbao_proto::ResultCode;

use self::core::{Core, CoreConfig};
use self::ledger::{GroupCommit, Ledger, LedgerWriter, Reader};

/// `Op::Me` requests waiting for the reader; beyond this they are answered `unavailable`.
const READS_QUEUED: usize = 1024;
/// Recent events in a `Reply::Me`.
const RECENT_EVENTS: usize = 20;
/// What an operation that needs the ledger is told while the ledger cannot commit.
const CANNOT_COMMIT: &str =
    "the ledger cannot commit (its disk may be full); nothing was done, try again later";

pub struct EmbeddedConfig {
    pub data_dir: PathBuf,
    pub core: CoreConfig,
    pub group: GroupCommit,
}

pub struct Embedded {
    core: Core,
    ledger: LedgerWriter,
    path: PathBuf,
    /// `None` once finished: the reader thread has closed its connection.
    reads: Option<SyncSender<Origin>>,
    reader: Option<std::thread::JoinHandle<()>>,
    answers: Receiver<Output>,
    /// Refusals while the ledger cannot commit: out at the next drain, not behind the
    /// commits they do not depend on.
    refused: Vec<Output>,
}

/// Wakes the loop that drains the backend (the ledger committed, a read is answered).
pub type Wake = Arc<dyn Fn() + Send + Sync>;

impl Embedded {
    /// Opens the ledger in `cfg.data_dir`, rebuilds the money state from it and checks
    /// that it balances. Returns the backend and how many events were replayed.
    pub fn open(cfg: EmbeddedConfig, now_ms: u64, wake: Wake) -> Result<(Embedded, u64)> {
        let ledger = Ledger::open(&cfg.data_dir)?;
        let path = cfg.data_dir.join("ledger.sqlite");
        let mut core = Core::new(cfg.core);
        let replayed = ledger.for_each(|record| core.replay(&record))?;
        let stored = ledger.balances()?;
        let rebuilt = core.balances_by_key();
        if stored != rebuilt {
            return Err(Error::Corrupt(format!(
                "the ledger's balances table disagrees with its events ({} vs {} accounts)",
                stored.len(),
                rebuilt.len()
            )));
        }
        core.resume(now_ms);
        let audit = core.audit();
        if !audit.ok {
            return Err(Error::Corrupt(format!(
                "the ledger in {} does not balance: {audit:?}",
                cfg.data_dir.display()
            )));
        }
        let commit_wake = wake.clone();
        let ledger = LedgerWriter::spawn(ledger, core.seq(), cfg.group, move || commit_wake());
        let (reads, reader, answers) = spawn_reader(&path, wake)?;
        Ok((
            Embedded {
                core,
                ledger,
                path,
                reads: Some(reads),
                reader: Some(reader),
                answers,
                refused: Vec::new(),
            },
            replayed,
        ))
    }

    /// The SQLite file, for read-only connections beside the writer.
    pub fn ledger_path(&self) -> &Path {
        &self.path
    }

    /// How often `tick` wants calling for an even release.
    pub fn tick_interval_ms(&self) -> u64 {
        self.core.tick_interval_ms()
    }
}

/// The reader thread: `Op::Me` from committed data, off the money loop. It ends, closing
/// its connection, when its sender is dropped.
type ReaderThread = (
    SyncSender<Origin>,
    std::thread::JoinHandle<()>,
    Receiver<Output>,
);

fn spawn_reader(path: &Path, wake: Wake) -> Result<ReaderThread> {
    let (tx, rx) = sync_channel::<Origin>(READS_QUEUED);
    let (out_tx, out_rx) = std::sync::mpsc::channel();
    let reader = Reader::open(path)?;
    let thread = std::thread::Builder::new()
        .name("ledger-reader".into())
        .spawn(move || {
            for to in rx {
                let reply = match reader.user(to.user.get(), RECENT_EVENTS) {
                    Ok(view) => Reply::Me(view),
                    Err(e) => Reply::Error {
                        result: ResultCode::Unavailable,
                        text: format!("reading the ledger: {e}"),
                    },
                };
                if out_tx.send(Output::Reply { to, reply }).is_err() {
                    return;
                }
                wake();
            }
        })
        .map_err(|e| Error::io("starting the ledger reader", e))?;
    Ok((tx, thread, out_rx))
}

/// What a read asked while the server stops is told.
fn stopping_read() -> Reply {
    Reply::Error {
        result: ResultCode::Unavailable,
        text: "the server is stopping; try again".into(),
    }
}

impl Money for Embedded {
    /// While the ledger cannot commit (a full disk), what would change money — a claim, a
    /// send, an open — is refused `unavailable` before it changes anything; reads and
    /// logins go on.
    fn submit(&mut self, now_ms: u64, origin: Origin, op: Op) {
        if self.ledger.failing() {
            match op {
                Op::Claim { packet } => {
                    let out = self.core.refuse_claim(origin, packet, CANNOT_COMMIT);
                    return self.refused.extend(out);
                }
                Op::Send { .. } => {
                    let out = self.core.refuse(origin, OpKind::Send, CANNOT_COMMIT);
                    return self.refused.push(out);
                }
                Op::Open { .. } => {
                    let out = self.core.refuse(origin, OpKind::Open, CANNOT_COMMIT);
                    return self.refused.push(out);
                }
                _ => {}
            }
        }
        if op != Op::Me {
            return self.core.submit(now_ms, origin, op);
        }
        let Some(reads) = &self.reads else {
            return self.core.answer(origin, stopping_read());
        };
        if let Err(TrySendError::Full(to) | TrySendError::Disconnected(to)) = reads.try_send(origin)
        {
            let reply = Reply::Error {
                result: ResultCode::Unavailable,
                text: "the ledger reader is busy; try again".into(),
            };
            self.core.answer(to, reply);
        }
    }

    fn admin(&mut self, now_ms: u64, ticket: u64, request: AdminRequest) {
        let creates = matches!(
            request,
            AdminRequest::CreateShake { .. } | AdminRequest::CreateSend { .. }
        );
        if creates && self.ledger.failing() {
            let answer = AdminAnswer::Unavailable(CANNOT_COMMIT.into());
            return self.refused.push(Output::Admin { ticket, answer });
        }
        self.core.admin(now_ms, ticket, request);
    }

    /// Campaigns release and packets expire only while the ledger commits: their events
    /// would wait behind a failing commit. They catch up once it commits again.
    fn tick(&mut self, now_ms: u64) {
        if !self.ledger.failing() {
            self.core.tick(now_ms);
        }
    }

    fn worker_up(&mut self, worker: WorkerId) {
        self.core.worker_up(worker);
    }

    fn worker_down(&mut self, worker: WorkerId) {
        self.core.worker_down(worker);
    }

    fn drain(&mut self, out: &mut Vec<Output>) {
        out.append(&mut self.refused);
        self.ledger.submit(self.core.take_records());
        let from = out.len();
        self.core.drain_ready(self.ledger.committed(), out);
        // An audit the core answers goes out with the ledger's committed head.
        for output in &mut out[from..] {
            if let Output::Admin {
                answer: AdminAnswer::Audit(audit),
                ..
            } = output
            {
                audit.ledger_head = Some(self.ledger.head().text());
            }
        }
        out.extend(self.answers.try_iter());
    }

    fn snapshot(&self) -> MoneySnapshot {
        MoneySnapshot {
            committed_seq: self.ledger.committed(),
            ..self.core.snapshot()
        }
    }

    fn audit_now(&self) -> Option<Audit> {
        Some(Audit {
            ledger_head: Some(self.ledger.head().text()),
            ..self.core.audit()
        })
    }

    fn commits_failing(&self) -> Option<String> {
        self.ledger.failing().then(|| CANNOT_COMMIT.to_string())
    }

    fn commit_latency(&self) -> Option<hdrhistogram::Histogram<u64>> {
        Some(self.ledger.commit_latency())
    }

    fn failure(&self) -> Option<String> {
        self.ledger
            .is_dead()
            .then(|| "the ledger writer stopped; refusing to acknowledge anything more".into())
    }

    /// The reader's connection closed first, then the writer's: the last connection to
    /// close folds the write-ahead log into the ledger and removes it, so a clean stop
    /// leaves `ledger.sqlite` alone.
    fn finish(&mut self) -> hongbao_money::error::Result<()> {
        drop(self.reads.take());
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.ledger.submit(self.core.take_records());
        Ok(self.ledger.finish()?)
    }
}
