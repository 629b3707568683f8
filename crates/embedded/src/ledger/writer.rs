//! The group-commit thread: a commit begins as soon as there is an event, no sooner than
//! `commit_interval` after the previous one began, and takes everything that arrived
//! meanwhile; the highest committed sequence number is published, and the core woken.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hongbao_money::event::Record;

use super::{Head, Ledger};
use crate::error::{Error, Result};

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
pub(super) fn next_commit(
    last_start: Option<Instant>,
    now: Instant,
    interval: Duration,
) -> Instant {
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
