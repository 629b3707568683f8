//! `hongbao bench --chaos SEED`: faults at random moments through every steady phase,
//! one at a time, each healed before the next, while the clients keep working — and what
//! each cost, read off the per-second rows afterwards.
//!
//! The schedule is a pure function of the seed: rounds, each a shuffle of the fault list
//! (so every kind comes once a round), each fault after a quiet gap drawn from
//! [every/2, 3·every/2] seconds counted from the end of the one before. The same seed
//! gives the same faults in the same order with the same gaps; when they land in the
//! run depends on how long each heal took.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hongbao_sys::clock::{Clock, UnixTime};

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::inject::Injector;
use super::options::{ChaosOptions, Fault};
use hongbao_load::coordinator::Row;

/// One fault of the schedule: the quiet gap before it, which, and the worker or gateway
/// host it is done to (an index, modulo their number).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Planned {
    pub gap_secs: f64,
    pub fault: Fault,
    pub target: usize,
}

/// The schedule for `opts`, as long as it is read.
pub fn schedule(opts: &ChaosOptions) -> impl Iterator<Item = Planned> {
    let mut rng = SmallRng::seed_from_u64(opts.seed);
    let (faults, every) = (opts.faults.clone(), opts.every_secs.max(0.1));
    let mut round: Vec<Fault> = Vec::new();
    std::iter::from_fn(move || {
        if faults.is_empty() {
            return None;
        }
        if round.is_empty() {
            round = faults.clone();
            round.shuffle(&mut rng);
        }
        let fault = round.pop().expect("refilled");
        Some(Planned {
            gap_secs: rng.gen_range(every / 2.0..=every * 1.5),
            fault,
            target: rng.gen_range(0..64),
        })
    })
}

/// How soon a gap's wait sees that it was told to stop.
const STOP_POLL: Duration = Duration::from_millis(50);

/// A fault as it was done.
#[derive(Debug, Clone)]
pub struct Done {
    pub fault: Fault,
    pub what: String,
    /// When it was done and when it was healed.
    pub start: UnixTime,
    pub end: UnixTime,
    /// A fault to the ledger's primary: from the fault to the ledger's first commit after
    /// it, in milliseconds.
    pub first_commit_ms: Option<u64>,
}

/// Runs the schedule on a thread of its own until `stop`: waits each gap (returning
/// early when told to stop), does the fault and its heal. A fault under way when `stop`
/// comes is finished and healed first. The gaps are timed on `clock`.
///
/// `mark` is told of each fault as it starts (`Some(fault)`) and once it is healed
/// (`None`), so the series shows it.
pub(crate) fn start(
    injector: Injector,
    opts: ChaosOptions,
    stop: Arc<AtomicBool>,
    clock: Clock,
    say: fn(&str),
    mark: impl Fn(UnixTime, Option<Fault>) + Send + 'static,
) -> std::thread::JoinHandle<Vec<Done>> {
    std::thread::spawn(move || {
        let mut done = Vec::new();
        for planned in schedule(&opts) {
            let until = clock.now() + Duration::from_secs_f64(planned.gap_secs);
            while clock.now() < until {
                if stop.load(Ordering::SeqCst) {
                    return done;
                }
                std::thread::sleep(STOP_POLL);
            }
            if stop.load(Ordering::SeqCst) {
                return done;
            }
            let start = UnixTime::now();
            mark(start, Some(planned.fault));
            let injected = injector.inject(planned.fault, planned.target, true);
            let (what, first_commit_ms) = (injected.what, injected.first_commit_ms);
            let end = UnixTime::now();
            // A fault healed in the second it started still gets a second of its own.
            mark(end.max(start + Duration::from_secs(1)), None);
            say(&format!("bench: chaos: {what}"));
            done.push(Done {
                fault: planned.fault,
                what,
                start,
                end,
                first_commit_ms,
            });
        }
        done
    })
}

/// The second of the run (from the load's `epoch`) `at` falls in.
fn second_of(at: UnixTime, epoch: UnixTime) -> u64 {
    at.since(epoch).as_secs()
}

/// `summary.json`'s `chaos`: the schedule asked for and every fault done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChaosSummary {
    pub seed: u64,
    pub every_secs: f64,
    /// The kinds drawn from.
    pub kinds: Vec<String>,
    pub faults: Vec<ChaosFault>,
}

/// One fault done by chaos and what it cost, over the seconds from its start to the
/// next fault's (or the end of the phases).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChaosFault {
    pub kind: String,
    /// What the bench did (the line it printed).
    pub what: String,
    /// The seconds of the run (from the load's epoch) the fault started and was healed in.
    pub start_second: u64,
    pub end_second: u64,
    /// Connections the clients lost in its window.
    pub dropped: u64,
    /// Seconds of its window in which the shakes served (`won` or `nothing`) fell below
    /// 90% of the rate asked.
    pub reduced_secs: u64,
    /// Answers that were errors (`unavailable` and the like) in its window.
    pub error_replies: u64,
    /// Seconds from its start until the clients were whole again: every user logged in
    /// and the shakes served at 90% of the rate asked, in a second at or after the heal;
    /// none if that never happened in its window.
    pub whole_after_secs: Option<u64>,
    /// A fault to the ledger's primary: milliseconds from the fault to the ledger's first
    /// commit after it (through whichever node was primary then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_commit_after_ms: Option<u64>,
}

impl ChaosFault {
    /// The cost of fault `done`, judged over `rows` (the load's per-second rows, in
    /// order) from its start's second to `window_end` (exclusive), with `users` users;
    /// the rows' seconds count from `epoch`.
    pub fn judge(done: &Done, rows: &[Row], epoch: UnixTime, window_end: u64, users: u64) -> Self {
        let (start, end) = (second_of(done.start, epoch), second_of(done.end, epoch));
        let mut fault = ChaosFault {
            kind: done.fault.name().to_string(),
            what: done.what.clone(),
            start_second: start,
            end_second: end,
            first_commit_after_ms: done.first_commit_ms,
            ..ChaosFault::default()
        };
        let Some(before) = rows.iter().rev().find(|r| r.second < start) else {
            return fault;
        };
        let mut prev = before;
        for r in rows
            .iter()
            .filter(|r| r.second >= start && r.second < window_end)
        {
            let (c, p) = (&r.counters, &prev.counters);
            let served = (c.won + c.nothing).saturating_sub(p.won + p.nothing);
            let reduced = served * 10 < r.target_qps * 9;
            fault.reduced_secs += u64::from(reduced);
            fault.dropped += c.disconnects.saturating_sub(p.disconnects);
            fault.error_replies += c.error_replies.saturating_sub(p.error_replies);
            if fault.whole_after_secs.is_none()
                && r.second >= end
                && !reduced
                && r.logged_in >= users
            {
                fault.whole_after_secs = Some(r.second - start + 1);
            }
            prev = r;
        }
        fault
    }
}

/// Every fault done, judged: each over the seconds to the next one's start, the last to
/// `last_second` (inclusive).
pub fn summarize(
    opts: &ChaosOptions,
    done: &[Done],
    rows: &[Row],
    epoch: UnixTime,
    last_second: u64,
    users: u64,
) -> ChaosSummary {
    let starts: Vec<u64> = done.iter().map(|d| second_of(d.start, epoch)).collect();
    let faults = done
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let window_end = starts.get(i + 1).copied().unwrap_or(last_second + 1);
            ChaosFault::judge(d, rows, epoch, window_end, users)
        })
        .collect();
    ChaosSummary {
        seed: opts.seed,
        every_secs: opts.every_secs,
        kinds: opts.faults.iter().map(|f| f.name().to_string()).collect(),
        faults,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hongbao_load::report::Counters;

    fn opts(seed: u64) -> ChaosOptions {
        ChaosOptions {
            seed,
            every_secs: 10.0,
            faults: ChaosOptions::default_faults(2, false, 1),
        }
    }

    #[test]
    fn the_schedule_is_the_seeds_and_every_kind_comes_each_round() {
        let kinds = opts(7).faults;
        let rounds = 3 * kinds.len();
        let a: Vec<Planned> = schedule(&opts(7)).take(rounds).collect();
        let b: Vec<Planned> = schedule(&opts(7)).take(rounds).collect();
        let c: Vec<Planned> = schedule(&opts(8)).take(rounds).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        for round in a.chunks(kinds.len()) {
            for k in &kinds {
                assert_eq!(round.iter().filter(|p| p.fault == *k).count(), 1, "{k:?}");
            }
        }
        assert!(a.iter().all(|p| (5.0..=15.0).contains(&p.gap_secs)));
        assert_eq!(
            schedule(&ChaosOptions {
                faults: vec![],
                ..opts(1)
            })
            .count(),
            0
        );
    }

    fn row(second: u64, served: u64, logged_in: u64, disconnects: u64, errors: u64) -> Row {
        Row {
            second,
            target_qps: 100,
            logged_in,
            counters: Counters {
                won: served,
                disconnects,
                error_replies: errors,
                ..Counters::default()
            },
            ..Row::default()
        }
    }

    #[test]
    fn a_fault_is_judged_over_its_window() {
        // Cumulative counters: 100 served a second, then a fault in second 3 drops 5
        // users and costs two slow seconds; whole again in second 5.
        let rows = [
            row(1, 100, 10, 0, 0),
            row(2, 200, 10, 0, 0),
            row(3, 240, 5, 5, 3),
            row(4, 300, 8, 5, 4),
            row(5, 400, 10, 5, 4),
            row(6, 500, 10, 5, 4),
        ];
        let done = Done {
            fault: Fault::WorkerKill,
            what: "killed".into(),
            start: UnixTime::from_millis(3_200),
            end: UnixTime::from_millis(4_100),
            first_commit_ms: None,
        };
        let epoch = UnixTime::from_millis(0);
        let f = ChaosFault::judge(&done, &rows, epoch, 7, 10);
        assert_eq!((f.start_second, f.end_second), (3, 4));
        assert_eq!((f.dropped, f.reduced_secs, f.error_replies), (5, 2, 4));
        assert_eq!(f.whole_after_secs, Some(3));
        // Cut short by the next fault in second 5: never whole in its window.
        let f = ChaosFault::judge(&done, &rows, epoch, 5, 10);
        assert_eq!(f.whole_after_secs, None);
    }
}
