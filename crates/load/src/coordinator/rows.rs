//! The merged row of each second of a load run, and the state the coordinator's report
//! readers share with the run and its monitor feed (apart, so that the feed depends on
//! these and not on the coordinator that starts it).

use std::collections::BTreeMap;

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
