//! What the report keeps from one second to the next: the counters of workers that
//! exited (so totals never go backwards), the replies of the second past, the shake
//! latency not yet reported, the token refusals as last logged.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use hongbao_money::seam::{OpKind, ReplyCounts};
use hongbao_money::WorkerId;
use hongbao_proto::ResultCode;
use hongbao_telemetry::sample::{self};

use crate::stats::{WorkerCounters, WorkerStats};

/// What a worker index's exited processes counted, so its totals never go backwards.
#[derive(Default)]
pub(super) struct Retired {
    pub(super) counters: WorkerCounters,
    pub(super) cpu_ms: u64,
}

pub(super) struct Report {
    pub(super) retired: BTreeMap<WorkerId, Retired>,
    pub(super) previous_replies: ReplyCounts,
    /// Replies in the last whole second.
    pub(super) reply_rates: Vec<(OpKind, ResultCode, u64)>,
    /// Workers' shake latency not yet reported to the monitor, and since the start.
    pub(super) latency_pending: Histogram<u64>,
    pub(super) latency_total: Histogram<u64>,
    pub(super) net_interface: String,
    /// The token refusals as last logged (`log_token_refusals`).
    pub(super) refusals_logged: Vec<u64>,
}

impl Report {
    pub(super) fn new(net_interface: String) -> Report {
        Report {
            retired: BTreeMap::new(),
            previous_replies: ReplyCounts::default(),
            reply_rates: Vec::new(),
            latency_pending: sample::new_histogram(),
            latency_total: sample::new_histogram(),
            net_interface,
            refusals_logged: Vec::new(),
        }
    }

    pub(super) fn worker_latency(&mut self, sparse: &[(u64, u64)]) {
        sample::merge_sparse(&mut self.latency_pending, sparse);
        sample::merge_sparse(&mut self.latency_total, sparse);
    }

    pub(super) fn retire(&mut self, last: &WorkerStats) {
        let retired = self.retired.entry(last.worker).or_default();
        retired.counters.add(&last.counters);
        retired.cpu_ms += last.cpu_ms;
    }

    /// Once a second: the replies of the second just ended.
    pub(super) fn roll_rates(&mut self, now: &ReplyCounts) {
        self.reply_rates = now
            .nonzero()
            .map(|(op, result, n)| (op, result, n - self.previous_replies.get(op, result)))
            .collect();
        self.previous_replies = now.clone();
    }
}
