//! Which simulated users fire in which second, and when within it: coordinated QPS with no
//! talk between client processes.
//!
//! Every client process knows the total number of users `U`, the QPS plan (`Q` from some
//! second on) and the clock (whole seconds since a shared epoch). From that alone each one
//! computes the firings of its own users, and together they send exactly `Q` requests a
//! second, spread evenly through it.
//!
//! The scheme is one global sequence of firings. Firing number `n` belongs to the user with
//! index `n mod U`. Second `s` holds the firings `base(s) .. base(s) + Q(s)`, where `base(s)`
//! is the sum of `Q` over all earlier seconds. The `k`-th of them is sent at
//! `k * 1e9 / Q(s)` nanoseconds into the second. So:
//! - exactly `Q(s)` firings happen in second `s` (if `U > 0`), with no burst at its start;
//! - any run of consecutive seconds covers a contiguous stretch of the sequence, so every
//!   user fires the same number of times ±1 over it. This holds when `U` is not a multiple
//!   of `Q`, when `Q > U` (users then fire several times a second, `U / Q` seconds apart),
//!   and across QPS changes, because the sequence carries on where it was.
//!
//! The worker loop calls [`Schedule::firings`] once a second for the index range that
//! [`partition`] gave its process; it costs time in proportion to that process's firings,
//! not to `U` or `Q`. The intended send time of a firing (from which latency is measured,
//! so there is no coordinated omission) is `epoch + second + offset_ns`.

use std::ops::Range;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// One request to send: which user, and when within the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Firing {
    /// Global user index, `0..users`; the user id is `first_user + user_index`.
    pub user_index: u64,
    /// Nanoseconds after the start of the second, below 1e9.
    pub offset_ns: u32,
}

/// The QPS plan from one second on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QpsChange {
    from_second: u64,
    qps: u64,
    /// Sequence number of the first firing in `from_second`. u128 because seconds times QPS
    /// can pass u64 for large seconds and QPS, and wrapping would break the fairness.
    first_seq: u128,
}

/// The firing plan shared by all client processes: total users and QPS over time.
///
/// Processes agree on the schedule as long as they make the same [`Schedule::set_qps`]
/// calls in the same order, before the seconds those calls affect are asked for.
#[derive(Debug, Clone)]
pub struct Schedule {
    users: u64,
    /// Sorted by `from_second`, strictly; the first entry is for second 0.
    changes: Vec<QpsChange>,
}

impl Schedule {
    /// A schedule of `users` users firing `qps` times a second from second 0 on.
    pub fn new(users: u64, qps: u64) -> Schedule {
        Schedule {
            users,
            changes: vec![QpsChange {
                from_second: 0,
                qps,
                first_seq: 0,
            }],
        }
    }

    /// Total number of users `U`.
    pub fn users(&self) -> u64 {
        self.users
    }

    /// Fire `qps` times a second from second `from_second` on.
    ///
    /// Seconds before `from_second` keep their QPS, so the sequence continues without a
    /// jump. Any change planned for `from_second` or later is dropped: the newest call
    /// describes the future, which makes a stale or repeated call harmless.
    pub fn set_qps(&mut self, from_second: u64, qps: u64) {
        let first_seq = self.first_seq(from_second);
        self.changes.retain(|c| c.from_second < from_second);
        self.changes.push(QpsChange {
            from_second,
            qps,
            first_seq,
        });
    }

    /// QPS in effect during `second`.
    pub fn qps_at(&self, second: u64) -> u64 {
        self.change_at(second).qps
    }

    /// Appends to `out`, in time order, the firings in `second` of the users whose index is
    /// in `range` (clipped to `0..users`).
    ///
    /// Costs O(firings appended + 1): only the laps of the sequence that overlap `range`
    /// are visited, and each lap past the first yields at least one firing.
    pub fn firings(&self, second: u64, range: Range<u64>, out: &mut Vec<Firing>) {
        let change = self.change_at(second);
        let lo = u128::from(range.start.min(self.users));
        let hi = u128::from(range.end.min(self.users));
        if change.qps == 0 || lo >= hi {
            return;
        }
        let users = u128::from(self.users);
        let qps = u128::from(change.qps);
        let first = self.first_seq(second);
        let end = first + qps;
        // A lap is `users` consecutive sequence numbers starting at a multiple of `users`;
        // within one, our users' firings are the contiguous run `lap + lo .. lap + hi`.
        let mut lap = first - first % users;
        while lap < end {
            for seq in (lap + lo).max(first)..(lap + hi).min(end) {
                out.push(Firing {
                    user_index: (seq - lap) as u64,
                    // k < qps, so the offset is below 1e9 and fits in u32.
                    offset_ns: ((seq - first) * NANOS_PER_SEC / qps) as u32,
                });
            }
            lap += users;
        }
    }

    /// The change in effect during `second`.
    fn change_at(&self, second: u64) -> &QpsChange {
        // The first change is for second 0, so at least one entry precedes any second.
        let i = self.changes.partition_point(|c| c.from_second <= second);
        &self.changes[i - 1]
    }

    /// Sequence number of the first firing in `second`, i.e. how many firings came before.
    fn first_seq(&self, second: u64) -> u128 {
        let c = self.change_at(second);
        c.first_seq + u128::from(second - c.from_second) * u128::from(c.qps)
    }
}

/// The user indices owned by client process `p` of `procs`: contiguous ranges, in process
/// order, that cover `0..users` and differ in length by at most one. Empty when `p` is not
/// below `procs`.
pub fn partition(users: u64, procs: u32, p: u32) -> Range<u64> {
    if p >= procs {
        return users..users;
    }
    let bound = |i: u32| (u128::from(users) * u128::from(i) / u128::from(procs)) as u64;
    bound(p)..bound(p + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (U, Q) pairs: divisible, not divisible, and Q > U.
    const CASES: &[(u64, u64)] = &[
        (20_000, 3_000),
        (1_000, 300),
        (1_000, 250),
        (7, 3),
        (10, 25),
        (10, 20),
        (1, 5),
    ];
    const PROCS: &[u32] = &[1, 2, 3, 7];

    /// Firings of all processes in `second`, each process's list checked to be in time order.
    fn all_firings(schedule: &Schedule, second: u64, procs: u32) -> Vec<Firing> {
        let mut all = Vec::new();
        for p in 0..procs {
            let mut mine = Vec::new();
            schedule.firings(second, partition(schedule.users(), procs, p), &mut mine);
            assert!(
                mine.windows(2).all(|w| w[0].offset_ns <= w[1].offset_ns),
                "process {p} of {procs} out of time order in second {second}"
            );
            all.extend(mine);
        }
        all
    }

    fn even_offsets(qps: u64) -> Vec<u32> {
        (0..qps)
            .map(|k| (u128::from(k) * NANOS_PER_SEC / u128::from(qps)) as u32)
            .collect()
    }

    /// Firings per user over `seconds`, all processes together.
    fn counts(schedule: &Schedule, seconds: Range<u64>, procs: u32) -> Vec<u64> {
        let mut counts = vec![0; schedule.users() as usize];
        for s in seconds {
            for f in all_firings(schedule, s, procs) {
                counts[f.user_index as usize] += 1;
            }
        }
        counts
    }

    fn spread(counts: &[u64]) -> u64 {
        counts.iter().max().unwrap() - counts.iter().min().unwrap()
    }

    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }

    #[test]
    fn exactly_qps_firings_each_second_evenly_spread() {
        for &(users, qps) in CASES {
            let schedule = Schedule::new(users, qps);
            for &procs in PROCS {
                for second in [0, 1, 2, 3, 17, 1_234, 86_400] {
                    let mut offsets: Vec<u32> = all_firings(&schedule, second, procs)
                        .iter()
                        .map(|f| f.offset_ns)
                        .collect();
                    offsets.sort_unstable();
                    assert_eq!(
                        offsets,
                        even_offsets(qps),
                        "U={users} Q={qps} P={procs} s={second}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_user_fires_equally_over_any_ceil_u_over_q_window() {
        for &(users, qps) in CASES {
            let schedule = Schedule::new(users, qps);
            let window = users.div_ceil(qps);
            for &procs in PROCS {
                for start in [0, 1, 5, 999] {
                    let counts = counts(&schedule, start..start + window, procs);
                    assert!(
                        spread(&counts) <= 1,
                        "U={users} Q={qps} P={procs} s={start}"
                    );
                    assert!(counts.iter().all(|&c| c >= 1), "someone never fired");
                }
            }
        }
    }

    #[test]
    fn every_user_fires_exactly_equally_over_a_full_cycle() {
        // After U / gcd(U, Q) seconds the sequence has gone round a whole number of times.
        for &(users, qps) in CASES {
            let schedule = Schedule::new(users, qps);
            let g = gcd(users, qps);
            let cycle = users / g;
            for start in [0, 3] {
                let counts = counts(&schedule, start..start + cycle, 3);
                assert!(counts.iter().all(|&c| c == qps / g), "U={users} Q={qps}");
            }
        }
    }

    #[test]
    fn more_qps_than_users_fires_each_user_several_times_evenly() {
        // U=10, Q=25: each user fires 2 or 3 times a second, 0.4 s apart.
        let schedule = Schedule::new(10, 25);
        for second in 0..4 {
            let firings = all_firings(&schedule, second, 1);
            for user in 0..10 {
                let times: Vec<u32> = firings
                    .iter()
                    .filter(|f| f.user_index == user)
                    .map(|f| f.offset_ns)
                    .collect();
                assert!((2..=3).contains(&times.len()));
                assert!(times.windows(2).all(|w| w[1] - w[0] == 400_000_000));
            }
        }
    }

    #[test]
    fn qps_change_takes_effect_exactly_at_its_second_and_stays_fair() {
        let mut schedule = Schedule::new(1_000, 300);
        schedule.set_qps(5, 700);
        for s in 0..12 {
            let expected = if s < 5 { 300 } else { 700 };
            assert_eq!(schedule.qps_at(s), expected);
            assert_eq!(all_firings(&schedule, s, 3).len() as u64, expected);
        }
        // The sequence carries on: second 5 starts with the user after second 4's last.
        let last = *all_firings(&schedule, 4, 1).last().unwrap();
        let next = all_firings(&schedule, 5, 1)[0];
        assert_eq!(next.user_index, (last.user_index + 1) % 1_000);
        assert_eq!(next.offset_ns, 0);
        // Any run of seconds across the change is a contiguous stretch of the sequence.
        for seconds in [3..6, 4..7, 0..9, 5..7] {
            assert!(
                spread(&counts(&schedule, seconds.clone(), 7)) <= 1,
                "{seconds:?}"
            );
        }
    }

    #[test]
    fn a_change_replaces_later_planned_changes() {
        let mut schedule = Schedule::new(100, 10);
        schedule.set_qps(10, 50);
        schedule.set_qps(20, 5);
        schedule.set_qps(15, 0);
        assert_eq!(
            [9, 10, 14, 15, 20, 99].map(|s| schedule.qps_at(s)),
            [10, 50, 50, 0, 0, 0]
        );
        // Restating the same plan changes nothing.
        let before = all_firings(&schedule, 12, 2);
        schedule.set_qps(10, 50);
        schedule.set_qps(15, 0);
        assert_eq!(all_firings(&schedule, 12, 2), before);
    }

    #[test]
    fn zero_qps_fires_nothing_and_resuming_continues_the_sequence() {
        let mut schedule = Schedule::new(50, 0);
        assert!(all_firings(&schedule, 3, 2).is_empty());
        schedule.set_qps(4, 20);
        schedule.set_qps(6, 0);
        schedule.set_qps(9, 20);
        assert!(all_firings(&schedule, 7, 2).is_empty());
        // 40 firings went out in seconds 4 and 5, so second 9 starts at user 40.
        assert_eq!(all_firings(&schedule, 9, 1)[0].user_index, 40);
    }

    #[test]
    fn zero_users_or_empty_ranges_fire_nothing() {
        let mut out = Vec::new();
        Schedule::new(0, 1_000).firings(5, 0..10, &mut out);
        let schedule = Schedule::new(100, 1_000);
        schedule.firings(5, 30..30, &mut out);
        schedule.firings(5, 100..200, &mut out);
        assert!(out.is_empty());
        // A range past the end is clipped to the users there are.
        schedule.firings(0, 90..200, &mut out);
        assert_eq!(out.len(), 100);
        assert!(out.iter().all(|f| (90..100).contains(&f.user_index)));
    }

    #[test]
    fn seed_scale_and_far_seconds_need_no_scan_and_do_not_overflow() {
        // 1M users at 60K QPS over 64 processes; seconds since the Unix epoch and beyond.
        let schedule = Schedule::new(1_000_000, 60_000);
        for second in [1_700_000_000, u64::MAX] {
            assert_eq!(all_firings(&schedule, second, 64).len(), 60_000);
        }
        let mut out = Vec::new();
        Schedule::new(u64::MAX, 10).firings(u64::MAX, u64::MAX - 5..u64::MAX, &mut out);
        assert!(out.len() <= 10);
    }

    #[test]
    fn partition_covers_all_users_in_near_equal_contiguous_ranges() {
        for users in [0, 1, 7, 1_000, 1_000_000, u64::MAX] {
            for procs in [1, 2, 3, 7, 64, 1_000] {
                let ranges: Vec<_> = (0..procs).map(|p| partition(users, procs, p)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges.last().unwrap().end, users);
                assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
                let lens: Vec<u64> = ranges.iter().map(|r| r.end - r.start).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
                assert!(partition(users, procs, procs).is_empty());
            }
        }
        assert!(partition(10, 0, 0).is_empty());
    }

    proptest! {
        #[test]
        fn prop_exact_count_even_offsets_and_fairness(
            users in 1u64..5_000,
            qps in 0u64..3_000,
            procs in 1u32..8,
            second in 0u64..10_000,
        ) {
            let schedule = Schedule::new(users, qps);
            let mut offsets: Vec<u32> =
                all_firings(&schedule, second, procs).iter().map(|f| f.offset_ns).collect();
            offsets.sort_unstable();
            prop_assert_eq!(offsets, even_offsets(qps));
            if qps > 0 {
                let window = users.div_ceil(qps);
                let counts = counts(&schedule, second..second + window, procs);
                prop_assert!(spread(&counts) <= 1);
                prop_assert!(counts.iter().all(|&c| c >= 1));
            }
        }

        #[test]
        fn prop_fair_across_qps_changes(
            users in 1u64..500,
            plan in proptest::collection::vec((0u64..40, 0u64..300), 0..5),
            procs in 1u32..8,
            window in 0u64..40,
            start in 0u64..40,
        ) {
            let mut schedule = Schedule::new(users, 50);
            for &(from, qps) in &plan {
                schedule.set_qps(from, qps);
            }
            let seconds = start..start + window;
            for s in seconds.clone() {
                prop_assert_eq!(
                    all_firings(&schedule, s, procs).len() as u64,
                    schedule.qps_at(s)
                );
            }
            prop_assert!(spread(&counts(&schedule, seconds, procs)) <= 1);
        }
    }
}
