//! What the runtime thread shares with the gateway's loop: the outputs waiting for
//! `drain` (each addition wakes the gateway), the snapshot's counters, how long commits
//! take and whether they are synchronous to a standby (for `/metrics`), and the first
//! failure. A std mutex each: held for a push or a copy, never across an await.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use hongbao_money::seam::{MoneySnapshot, OpKind, Output};
use hongbao_proto::ResultCode;

/// What the runtime thread shares with the gateway's loop.
pub(crate) struct Shared {
    pub(crate) outputs: Mutex<Vec<Output>>,
    pub(crate) snapshot: Mutex<MoneySnapshot>,
    /// How long each committed batch took (µs), resends included.
    pub(crate) commit_latency: Mutex<Histogram<u64>>,
    /// The primary's last answer (`standby.rs`); none while it cannot be had.
    pub(crate) standby_sync: Mutex<Option<bool>>,
    pub(crate) failure: Mutex<Option<String>>,
    pub(crate) wake: Arc<dyn Fn() + Send + Sync>,
}

impl Shared {
    pub(crate) fn emit(&self, out: Output) {
        self.outputs.lock().unwrap().push(out);
        (self.wake)();
    }

    pub(crate) fn emit_all(&self, outs: Vec<Output>) {
        if outs.is_empty() {
            return;
        }
        self.outputs.lock().unwrap().extend(outs);
        (self.wake)();
    }

    /// A batch committed, `took` after its first attempt began.
    pub(crate) fn committed_in(&self, took: Duration) {
        let us = took.as_micros().max(1) as u64;
        self.commit_latency.lock().unwrap().saturating_record(us);
    }

    pub(crate) fn count(&self, op: OpKind, result: ResultCode) {
        self.snapshot.lock().unwrap().replies.count(op, result);
    }
}
