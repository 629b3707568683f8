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
    /// Its last second reported, and its cumulative counters then.
    pub(super) last_second: Option<u64>,
    pub(super) counters: Counters,
}

impl Shared {
    /// The reports a second needs to be complete: every slice's, but those of slices
    /// lost without reporting it.
    pub(super) fn expected(&self, second: u64) -> u32 {
        let gone = self
            .lost
            .iter()
            .enumerate()
            .filter(|(p, lost)| {
                lost.is_some()
                    && self.latest[*p]
                        .as_ref()
                        .is_none_or(|report| report.second < second)
            })
            .count() as u32;
        self.procs - gone
    }

    pub(super) fn complete(&self, row: &Row) -> bool {
        row.reports >= self.expected(row.second)
    }
}
