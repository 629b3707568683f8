//! `summary.json` of `hongbao capacity` as typed structs: the plan's runs, linearity and
//! capacity plan, and the machine they ran on (docs/capacity.md). `page` draws from it.

use serde::{Deserialize, Serialize};

use super::knee::RunRecord;
use super::plan::{LoadPlan, Slo};
use super::sizing::{CapacityPlan, Linearity};

/// `summary.json`'s layout version.
pub const SCHEMA: u32 = 1;

/// What `hongbao capacity` found; `DIR/summary.json` (docs/capacity.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub schema: u32,
    pub plan_name: String,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub machine: Machine,
    pub slo: Slo,
    pub load: LoadPlan,
    /// One per stage and instance count, in run order.
    pub runs: Vec<RunRecord>,
    /// Stages run at more than one instance count.
    pub linearity: Vec<Linearity>,
    /// With a `[target]` in the plan.
    pub capacity_plan: Option<CapacityPlan>,
    /// Chart files written next to it (`NAME.svg` and `NAME.png`).
    pub charts: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cores: u32,
    pub memory_bytes: u64,
    pub kernel: String,
}

impl Machine {
    pub(super) fn read() -> Machine {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            memory_bytes: memory_kib * 1024,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
        }
    }
}
