//! The run's faults: `--fault` (one, at a moment of the first steady phase) and `--chaos`
//! (faults at random moments from the first phase's start), each on a thread of its own,
//! started as the first phase begins; once the phases are over, waited for until healed
//! and the users back, and judged off the load's per-second rows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hongbao_load::coordinator::{Load, Row};
use hongbao_sys::clock::UnixTime;

use super::chaos::{self, ChaosSummary, Done};
use super::options::Fault;
use super::say::say;
use super::seconds::RunSeconds;
use super::setup::Bench;
use super::summary::{FaultSecond, FaultSummary, ShardCarried};

/// How long the users dropped by a fault are waited for, once the phases are over.
const BACK_TIMEOUT: Duration = Duration::from_secs(30);

/// How long after the users are back the rows are read: the second they came back in
/// ends, and its row arrives from every client (they report once a second, just after
/// it) — two seconds, and 100 ms for reports on their way.
const ROWS_AFTER_BACK: Duration = Duration::from_millis(2100);

/// The faults judged, and the load's rows they were judged over (the run's end reads
/// its peaks from the same rows).
pub(super) struct Judged {
    pub chaos: Option<ChaosSummary>,
    pub fault: Option<FaultSummary>,
    pub rows: Vec<Row>,
}

/// The faults under way, from the first steady phase to their judging.
pub(super) struct Faults {
    /// A fault or chaos was asked for: the clients may have been told less than the
    /// server did (a reply lost after its commit).
    pub faulty: bool,
    /// `--fault`'s thread, and the second of the run it falls in.
    fault: Option<JoinHandle<String>>,
    fault_second: u64,
    /// `--chaos`'s thread, and what tells it to do no more faults.
    chaos: Option<JoinHandle<Vec<Done>>>,
    chaos_stop: Arc<AtomicBool>,
    /// The phase under way, for chaos to mark again once a fault is healed.
    current_phase: Arc<Mutex<String>>,
}

impl Faults {
    pub fn new(bench: &Bench) -> Faults {
        Faults {
            faulty: bench.opts.fault.is_some() || bench.opts.chaos.is_some(),
            fault: None,
            fault_second: 0,
            chaos: None,
            chaos_stop: Arc::new(AtomicBool::new(false)),
            current_phase: Arc::new(Mutex::new(String::new())),
        }
    }

    /// The steady phase `name` begins.
    pub fn enter_phase(&self, name: &str) {
        *self.current_phase.lock().unwrap() = name.to_string();
    }

    /// Starts chaos and the fault, as the first steady phase's QPS holds (from second
    /// `from + 1` of the run).
    pub fn start(&mut self, bench: &Bench, seconds: RunSeconds, from: u64) {
        let (opts, server, monitor) = (bench.opts, &bench.server, &bench.monitor);
        if let Some(chaos) = &opts.chaos {
            let (injector, stop) = (server.injector(), self.chaos_stop.clone());
            // Each fault marked on the series as it starts, and the phase again once
            // it is healed.
            let (marker, phase) = (monitor.marker(), self.current_phase.clone());
            let mark = move |at: hongbao_sys::clock::UnixTime, fault: Option<Fault>| {
                let at = at.as_millis();
                match fault {
                    Some(f) => {
                        marker.mark_at(at, &format!("{}{}", hongbao_report::CHAOS_PHASE, f.name()))
                    }
                    None => marker.mark_at(at, &phase.lock().unwrap()),
                }
            };
            let thread = chaos::start(injector, chaos.clone(), stop, bench.clock, say, mark);
            self.chaos = Some(thread);
        }
        if let Some(fault) = opts.fault {
            let after = Duration::from_secs_f64(opts.fault_at_secs.max(0.0));
            self.fault = server.inject_later(fault, after);
            self.fault_second = from + 1 + after.as_secs();
            monitor.mark_at(
                (seconds.start_of(from + 1) + after).as_millis(),
                fault.name(),
            );
        }
    }

    /// Whether chaos was started (told to stop since or not).
    pub fn chaos_started(&self) -> bool {
        self.chaos.is_some()
    }

    /// Chaos does no more faults (the one under way is finished and healed).
    pub fn stop_chaos(&self) {
        self.chaos_stop.store(true, Ordering::SeqCst);
    }

    /// Once the phases are over: waits for chaos and the fault to be healed and the
    /// users back, and judges each over the load's rows. `last_phase_end` is the last
    /// steady phase's last second; `fault_phase` the first phase's rate and last second.
    pub fn finish(
        &mut self,
        bench: &Bench,
        load: &Load,
        seconds: RunSeconds,
        last_phase_end: u64,
        fault_phase: (u64, u64),
    ) -> Judged {
        self.stop_chaos();
        let chaos_done = self.chaos.take().map(|handle| {
            let done = handle.join().unwrap_or_default();
            wait_back(load);
            done
        });
        let fault_done = self.fault.take().map(|handle| {
            let what = handle
                .join()
                .unwrap_or_else(|_| "the fault thread panicked".to_string());
            // Users dropped near a phase's end come back after it.
            wait_back(load);
            what
        });
        let rows = load.rows();
        let opts = bench.opts;
        let chaos = opts.chaos.as_ref().zip(chaos_done).map(|(options, done)| {
            let users = opts.connections;
            let c = chaos::summarize(
                options,
                &done,
                &rows,
                seconds.epoch(),
                last_phase_end,
                users,
            );
            say_chaos(&c);
            c
        });
        let fault = fault_done
            .map(|what| judge_fault(bench, what, self.fault_second, fault_phase, &rows, seconds));
        Judged { chaos, fault, rows }
    }
}

/// Waits for every user to be logged in again (a while), then for the rows to show when
/// they were.
fn wait_back(load: &Load) {
    load.wait_logged_in(BACK_TIMEOUT);
    std::thread::sleep(ROWS_AFTER_BACK);
}

/// `--fault`'s cost: from the load's seconds around second `at_second`, and its served
/// rate within the first phase (`fault_phase`: its rate and last second).
fn judge_fault(
    bench: &Bench,
    what: String,
    at_second: u64,
    fault_phase: (u64, u64),
    rows: &[Row],
    run: RunSeconds,
) -> FaultSummary {
    let (opts, server) = (bench.opts, &bench.server);
    let seconds: Vec<FaultSecond> = rows.iter().map(FaultSecond::from).collect();
    let mut f = FaultSummary::from_rows(what, at_second, opts.connections, &seconds)
        .with_served(fault_phase, &seconds);
    if let Some(by_shard) = server.wins_by_shard() {
        // Each shard's wins by run second (their batches' Unix seconds, from the epoch).
        let by_run_second: Vec<std::collections::BTreeMap<u64, u64>> = by_shard
            .iter()
            .map(|wins| {
                wins.iter()
                    .filter(|(&unix, _)| unix * 1000 >= run.epoch().as_millis())
                    .map(|(&unix, &n)| (run.second_at(UnixTime::from_millis(unix * 1000)), n))
                    .collect()
            })
            .collect();
        f.shards = ShardCarried::judge(&by_run_second, at_second, fault_phase.1);
        for s in &f.shards {
            say(&format!(
                "bench: fault: shard {} won {} a second before it and at least {} a second in {} s after it ({:.2}x)",
                s.shard, s.before_per_sec, s.min_per_sec, s.window_secs, s.min_ratio
            ));
        }
    }
    if opts.fault == Some(Fault::Upgrade) {
        f.upgrade = server.last_upgrade();
        f.rolled = server.rolled();
    }
    let back = match f.reconnected_secs {
        Some(0) => "no client was dropped".to_string(),
        Some(s) => format!(
            "{} connections dropped, every user logged in again within {s} s (as few as {} of {} at a second's end)",
            f.dropped, f.logged_in_min, opts.connections
        ),
        None => format!("{} connections dropped; some users never logged in again", f.dropped),
    };
    say(&format!(
        "bench: fault: {} (second {}); {back}; served under 90% of the rate in {} s ({} shakes short), {} overloaded, {} firings backed off, {} connection attempts refused, {} error answers",
        f.what, f.at_second, f.reduced_secs, f.shakes_short, f.overloaded, f.backed_off, f.refused_connects, f.error_replies
    ));
    f
}

/// Each chaos fault's cost, a line each.
fn say_chaos(c: &ChaosSummary) {
    for f in &c.faults {
        let whole = f
            .whole_after_secs
            .map_or("never whole again in its window".to_string(), |s| {
                format!("whole again {s} s after its start")
            });
        say(&format!(
            "bench: chaos: {} at second {}: {} connections dropped, {} s under 90% of the rate, {} error answers; {whole}",
            f.kind, f.start_second, f.dropped, f.reduced_secs, f.error_replies
        ));
    }
}
