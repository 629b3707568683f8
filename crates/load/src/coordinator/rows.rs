//! The merged row of each second of a load run, and the state the coordinator's report
//! readers share with the run and its monitor feed (apart, so that the feed depends on
//! these and not on the coordinator that starts it).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::broadcast::Deliveries;
use crate::report::{Counters, History, Report};

/// One second of the whole run, merged over the client processes.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub second: u64,
    pub unix_ms: u64,
    pub reports: u32,
    pub target_qps: u64,
    pub connected: u64,
    pub logged_in: u64,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
    /// Cumulative at the end of this second.
    pub counters: Counters,
    /// That second's latency, as sparse HDR buckets (µs, count) from every process; a
    /// full histogram is ~140 KB, too much to keep for every second of a long run.
    pub shake_latency: Vec<(u64, u64)>,
    /// The same of the shakes served (won or nothing), without those shed.
    pub served_latency: Vec<(u64, u64)>,
    pub open_latency: Vec<(u64, u64)>,
    pub send_lag: Vec<(u64, u64)>,
    /// Distinct broadcasts received so far (by any client), cumulative like `counters`.
    pub broadcasts_seen: u64,
}

#[derive(Default)]
pub(super) struct Shared {
    /// The run's slices (client processes or agents).
    pub(super) procs: u32,
    /// Slices lost before their last report (an agent cut off, a client that died).
    pub(super) lost: Vec<Option<Lost>>,
    /// Slices that report no more (lost, or their last report came: an agent stopped
    /// early), with their last second and counters.
    pub(super) gone: Vec<Option<Gone>>,
    pub(super) rows: BTreeMap<u64, Row>,
    /// Newest cumulative report per process.
    pub(super) latest: Vec<Option<Report>>,
    pub(super) finals: Vec<Option<Report>>,
    pub(super) peak_rss_bytes: u64,
    pub(super) deliveries: Deliveries,
    /// Every process's wins and opens told so far, as their reports brought them.
    pub(super) history: History,
}

/// A slice lost before its last report.
#[derive(Debug, Clone)]
pub(super) struct Lost {
    pub(super) unix_ms: u64,
    pub(super) why: String,
}

/// A slice that reports no more: its last second reported, and its cumulative counters
/// then, which stay in every later second's row.
#[derive(Debug, Clone)]
pub(super) struct Gone {
    pub(super) last_second: Option<u64>,
    pub(super) counters: Counters,
}

impl Shared {
    /// The state of a run of `procs` slices, nothing reported yet.
    pub(super) fn new(procs: u32) -> Shared {
        Shared {
            procs,
            lost: vec![None; procs as usize],
            gone: vec![None; procs as usize],
            latest: vec![None; procs as usize],
            finals: vec![None; procs as usize],
            ..Default::default()
        }
    }

    /// The reports a second needs to be complete: every slice's, but those of slices
    /// gone without reporting it.
    pub(super) fn expected(&self, second: u64) -> u32 {
        let gone = self
            .gone
            .iter()
            .flatten()
            .filter(|g| g.last_second.is_none_or(|l| l < second))
            .count() as u32;
        self.procs - gone
    }

    /// Slice `p` reports no more: its last counters go into the rows after its last
    /// second, made or to be made.
    pub(super) fn retire(&mut self, p: usize) {
        if self.gone.get(p).is_none_or(Option::is_some) {
            return;
        }
        let latest = self.latest[p].as_ref();
        let last_second = latest.map(|r| r.second);
        let counters = latest.map(|r| r.counters.clone()).unwrap_or_default();
        for (_, row) in self.rows.range_mut(last_second.map_or(0, |l| l + 1)..) {
            row.counters.add(&counters);
        }
        self.gone[p] = Some(Gone {
            last_second,
            counters,
        });
    }

    /// The counters a new row for `second` starts from: those of the slices gone before.
    pub(super) fn frozen(&self, second: u64) -> Counters {
        let mut frozen = Counters::default();
        for g in self.gone.iter().flatten() {
            if g.last_second.is_none_or(|l| l < second) {
                frozen.add(&g.counters);
            }
        }
        frozen
    }

    pub(super) fn complete(&self, row: &Row) -> bool {
        row.reports >= self.expected(row.second)
    }
}

/// The progress line and `GET /stats`: one second's rates and the totals so far.
#[derive(Debug, Clone, Serialize)]
pub struct Progress {
    pub second: u64,
    pub unix_ms: u64,
    pub target_qps: u64,
    pub users: u64,
    pub connections: u64,
    pub logged_in: u64,
    pub sent_per_sec: u64,
    pub replies_per_sec: u64,
    pub won_per_sec: u64,
    pub nothing_per_sec: u64,
    pub overloaded_per_sec: u64,
    pub opened_per_sec: u64,
    pub errors_per_sec: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Distinct broadcasts received so far; their deliveries are `totals.broadcast_delivered`.
    pub broadcasts_seen: u64,
    pub totals: Counters,
}

impl Progress {
    pub fn line(&self) -> String {
        let bar = if self.logged_in < self.users {
            let done = (20 * self.logged_in / self.users.max(1)) as usize;
            format!(" [{}{}]", "#".repeat(done), "-".repeat(20 - done))
        } else {
            String::new()
        };
        let t = &self.totals;
        let broadcasts = if t.broadcast_delivered > 0 {
            format!(
                " broadcasts={} (delivered={})",
                self.broadcasts_seen, t.broadcast_delivered
            )
        } else {
            String::new()
        };
        format!(
            "t={}s conns={}/{}{} sent/s={} replies/s={} (won={} nothing={} overloaded={}) opened/s={} p50={:.2}ms p99={:.2}ms errors={} (refused={} timeout={} reset={} ports={} files={} handshake={} not_ready={}){}",
            self.second, self.logged_in, self.users, bar, self.sent_per_sec, self.replies_per_sec,
            self.won_per_sec, self.nothing_per_sec, self.overloaded_per_sec, self.opened_per_sec,
            self.p50_ms, self.p99_ms, t.errors(), t.failed_refused, t.failed_timeout, t.failed_reset,
            t.failed_out_of_ports, t.failed_out_of_files, t.failed_handshake, t.skipped_not_ready,
            broadcasts,
        )
    }
}

/// Rates of `row` against the cumulative counters of the second before it.
pub fn progress(row: &Row, previous: &Counters, users: u64) -> Progress {
    let c = &row.counters;
    let mut shake = crate::report::new_histogram();
    crate::report::merge_sparse(&mut shake, &row.shake_latency);
    let ms = |h: &Histogram<u64>, q: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(q) as f64 / 1000.0
        }
    };
    Progress {
        second: row.second,
        unix_ms: row.unix_ms,
        target_qps: row.target_qps,
        users,
        connections: row.connected,
        logged_in: row.logged_in,
        sent_per_sec: c.shakes_sent.saturating_sub(previous.shakes_sent),
        replies_per_sec: c.shake_replies - previous.shake_replies,
        won_per_sec: c.won - previous.won,
        nothing_per_sec: c.nothing - previous.nothing,
        overloaded_per_sec: c.overloaded - previous.overloaded,
        opened_per_sec: c.opened - previous.opened,
        errors_per_sec: c.errors() - previous.errors(),
        p50_ms: ms(&shake, 0.5),
        p99_ms: ms(&shake, 0.99),
        max_ms: ms(&shake, 1.0),
        broadcasts_seen: row.broadcasts_seen,
        totals: c.clone(),
    }
}
