use rand::{Rng, SeedableRng};

use super::*;
use crate::report;

fn shared(procs: u32) -> Mutex<Shared> {
    Mutex::new(Shared::new(procs))
}

fn report(p: u32, second: u64, latency: &[(u64, u64)]) -> Report {
    Report {
        proc_index: p,
        second,
        shake_latency_us: latency.to_vec(),
        ..Report::default()
    }
}

/// Four agents' seconds merged: every bucket and every percentile is that of one
/// histogram of all their samples together (bucket-exact, not an average of percentiles).
#[test]
fn merged_percentiles_are_those_of_the_union_of_the_samples() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(45);
    let (s, plan) = (shared(4), Mutex::new(Schedule::new(1000, 100)));
    let mut union = report::new_histogram();
    for p in 0..4u32 {
        let mut own = report::new_histogram();
        // Each agent its own spread: one slow, one with a long tail, two quick.
        let scale = [300u64, 5_000, 800, 120][p as usize];
        for _ in 0..10_000 {
            let tail = if rng.gen_bool(0.01) { 50 } else { 1 };
            let v = rng.gen_range(1..=scale) * tail;
            own.record(v).unwrap();
            union.record(v).unwrap();
        }
        merge(&s, report(p, 7, &report::sparse(&own)), &plan);
    }
    let s = s.lock().unwrap();
    let row = &s.rows[&7];
    assert!(s.complete(row));
    let mut merged = report::new_histogram();
    report::merge_sparse(&mut merged, &row.shake_latency);
    assert_eq!(report::sparse(&merged), report::sparse(&union));
    for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
        assert_eq!(
            merged.value_at_quantile(q),
            union.value_at_quantile(q),
            "q={q}"
        );
    }
    assert_eq!(merged.len(), 40_000);
}

/// A slice lost after reporting second 1: second 2 is complete without it, and second 1
/// still needed it.
#[test]
fn a_lost_slice_completes_the_seconds_after_its_last_report() {
    let (s, plan) = (shared(3), Mutex::new(Schedule::new(30, 3)));
    for second in 0..2 {
        for p in 0..3 {
            merge(&s, report(p, second, &[(100, 1)]), &plan);
        }
    }
    merge(&s, report(0, 2, &[(100, 1)]), &plan);
    merge(&s, report(2, 2, &[(100, 1)]), &plan);
    {
        let s = s.lock().unwrap();
        assert!(s.complete(&s.rows[&1]));
        assert!(
            !s.complete(&s.rows[&2]),
            "slice 1 may still report second 2"
        );
    }
    lose(&s, 1, "cut off".into());
    lose(&s, 1, "said twice".into());
    let s = s.lock().unwrap();
    assert!(s.complete(&s.rows[&2]));
    assert_eq!(s.expected(1), 3, "second 1 had its report");
    assert_eq!(s.expected(2), 2);
    assert_eq!(
        s.lost[1].as_ref().unwrap().why,
        "cut off",
        "the first word stands"
    );
}

/// The rows' counters are cumulative: a lost slice's last counters stay in every later
/// second, in rows made before the loss was known and after.
#[test]
fn a_lost_slices_counters_stay_in_the_later_rows() {
    let (s, plan) = (shared(2), Mutex::new(Schedule::new(20, 2)));
    let counted = |p, second, sent| Report {
        counters: Counters {
            shakes_sent: sent,
            ..Counters::default()
        },
        ..report(p, second, &[])
    };
    merge(&s, counted(0, 0, 10), &plan);
    merge(&s, counted(1, 0, 7), &plan);
    merge(&s, counted(0, 1, 20), &plan);
    lose(&s, 1, "cut off".into());
    merge(&s, counted(0, 2, 30), &plan);
    let s = s.lock().unwrap();
    let sent: Vec<u64> = s.rows.values().map(|r| r.counters.shakes_sent).collect();
    assert_eq!(sent, [17, 27, 37]);
}

/// An agent stopped before the others (SIGTERM: its last report comes): the seconds
/// after it are complete without it, its counters kept in them.
#[test]
fn a_slice_that_finished_early_completes_the_later_seconds() {
    let (s, plan) = (shared(2), Mutex::new(Schedule::new(20, 2)));
    merge(&s, report(0, 0, &[]), &plan);
    merge(&s, report(1, 0, &[]), &plan);
    merge(
        &s,
        Report {
            last: true,
            ..report(1, 1, &[])
        },
        &plan,
    );
    merge(&s, report(0, 1, &[]), &plan);
    let s = s.lock().unwrap();
    assert!(s.complete(&s.rows[&1]));
    assert!(s.finals[1].is_some() && s.lost[1].is_none());
}
