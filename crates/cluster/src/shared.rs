//! What the runtime thread shares with the gateway's loop: the outputs waiting for
//! `drain` (each addition wakes the gateway), the snapshot's counters, and the first
//! failure. A std mutex each: held for a push or a copy, never across an await.

use std::sync::{Arc, Mutex};

use hongbao_money::seam::{MoneySnapshot, OpKind, Output};
use hongbao_proto::ResultCode;

/// What the runtime thread shares with the gateway's loop.
pub(crate) struct Shared {
    pub(crate) outputs: Mutex<Vec<Output>>,
    pub(crate) snapshot: Mutex<MoneySnapshot>,
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

    pub(crate) fn count(&self, op: OpKind, result: ResultCode) {
        self.snapshot.lock().unwrap().replies.count(op, result);
    }
}
