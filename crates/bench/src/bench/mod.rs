//! `hongbao bench`: the seed experiment on one machine. Starts a server and a load, runs
//! the phases (connect everyone; then for each QPS step a shake campaign and a send
//! campaign under that load), audits the money after every phase and at the end, stops
//! everything it started, and writes `summary.json` and `series.csv` (docs/bench.md).
//!
//! The audit holds three witnesses against each other: the campaigns' own counts, the
//! clients' counts of what they were told, and the ledger's balances user by user.
//!
//! With `--broadcast-every S` it also broadcasts every S seconds of each steady phase and
//! checks that every connection the server handed a broadcast to received it, timing the
//! deliveries (`broadcast.rs`; `broadcasts.json`).
//!
//! The run is a pipeline, one step a file: `setup` (the server, the monitor, the
//! sampler), `connect` (the load, everyone logged in), `phases` (each QPS step and its
//! `campaign`s; the `faults` started in the first), then `faults` judged, the load
//! stopped and the money `audit`ed, and `finish` (`summary.json`, the report). `seconds`
//! tells the load's seconds as times; `say` is the bench's own words.
//!
//! - `options`: what the bench is asked to do, its presets and faults;
//! - `admin`: requests to the server's admin API, with its key;
//! - `agents`: the load on agents (their plan, their summary) and a target's CA;
//! - `inject`: the faults done to the server, and their heals;
//! - `disk`: the small tmpfs for the ledger that `disk-full` fills;
//! - `chaos`: `--chaos`, faults at random moments, and what each cost;
//! - `server`: the bench's server, a local one or a lab; `local`: the local `hongbao serve`
//!   child, started again after `supervisor-kill`; `broadcaster`: broadcasts in phases;
//!   `sampler`: the server sampled once a second; `rolling`: a lab's rolling upgrade;
//! - `summary`: `summary.json` as typed structs, and each phase's audit;
//! - `ledger`: the audit's third witness, the ledger's balances user by user;
//! - `history`: the per-operation check of what each client was told against the ledger.

mod admin;
mod agents;
mod audit;
mod broadcaster;
mod campaign;
pub mod chaos;
mod connect;
mod disk;
mod faults;
mod finish;
mod history;
mod inject;
mod injected;
mod ledger;
mod local;
mod options;
mod phases;
mod primary;
mod rolling;
mod sampler;
mod say;
mod seconds;
pub(crate) mod server;
mod setup;
pub mod summary;

pub use options::{
    AgentsChoice, BenchOptions, ChaosOptions, Fault, Preset, RedisAim, Target,
    DEFAULT_BENCH_BROADCAST_YIELD_MS, DEFAULT_BENCH_MAX_QUEUE_MS, DEFAULT_SERVER_NICE,
    DISK_FULL_HOLD, SECRET, WORKER_STALL,
};
pub use summary::Summary;

use phases::Phases;
use setup::Bench;

/// Runs the bench; returns the summary (also written to `out/summary.json`). The caller
/// exits non-zero when `summary.audit.ok` is false.
pub fn run(opts: BenchOptions) -> crate::Result<Summary> {
    let bench = Bench::set_up(&opts)?;
    let connected = bench.connect()?;
    let mut phases = Phases::new(&bench);
    for (n, &qps) in opts.phase_qps.iter().enumerate() {
        phases.run(&bench, &connected, n, qps)?;
    }
    let drops_after = phases.await_broadcasts(&bench, &connected);
    let faults = phases.faults.finish(
        &bench,
        &connected.load,
        connected.seconds,
        phases.last_phase_end,
        phases.fault_phase,
    );
    let mut unloaded = bench.stop_load(connected, &mut phases, &faults.rows, drops_after)?;
    let audited = bench.audit(&mut phases, &mut unloaded)?;
    let summary = finish::summary(&opts, phases, unloaded, audited, faults);
    finish::write(&opts, &summary)?;
    Ok(summary)
}
