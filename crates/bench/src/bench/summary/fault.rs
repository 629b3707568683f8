//! `summary.json`'s `fault`: a fault injected mid-run (`--fault`), and what the clients
//! saw of it — who was dropped, when all were back, and the served rate in its window —
//! read off the load's seconds around it.

use std::collections::BTreeMap;

use hongbao_load::coordinator::Row;
use serde::{Deserialize, Serialize};

/// A fault injected mid-run, and the clients' connections around it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSummary {
    /// What the bench did (the line it printed).
    pub what: String,
    /// The second of the run (from the load's epoch) it was done in.
    pub at_second: u64,
    /// Connections the clients lost from that second on.
    pub dropped: u64,
    /// The fewest users logged in at the end of a second from then on.
    pub logged_in_min: u64,
    /// Within how many seconds of the fault every dropped user had logged in again and
    /// all were logged in (counted in whole seconds from the start of the fault's
    /// second: 1 = within that second; 0 = nobody was dropped); none if some never were.
    pub reconnected_secs: Option<u64>,
    /// Over the fault's second and the `FAULT_WINDOW_SECS - 1` after it, within its
    /// phase: seconds in which the shakes served (answered
    /// `won` or `nothing`, as the clients saw them) fell below 90% of the rate asked...
    #[serde(default)]
    pub reduced_secs: u64,
    /// ...the shakes served short of the rate asked over those seconds, in all...
    #[serde(default)]
    pub shakes_short: u64,
    /// ...and the shakes answered `overloaded` and firings skipped backing off.
    #[serde(default)]
    pub overloaded: u64,
    #[serde(default)]
    pub backed_off: u64,
    /// Connection attempts refused (ECONNREFUSED) from the fault's second on.
    #[serde(default)]
    pub refused_connects: u64,
    /// Requests answered with an error from the fault's second on (a commit refused
    /// would be one).
    #[serde(default)]
    pub error_replies: u64,
    /// A sharded lab (`--shards`): how each shard carried its wins through the fault.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardCarried>,
    /// `upgrade`: what the upgrade did, as the new server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<crate::bench::local::Upgraded>,
    /// `upgrade` of a lab: each gateway's step of the rolling upgrade, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled: Vec<crate::bench::rolling::RolledGateway>,
}

/// How many seconds from a fault's on its served rate is judged.
pub const FAULT_WINDOW_SECS: u64 = 30;

/// One second of the load, as a fault is judged: the second, users logged in at its end, and the clients' cumulative disconnects, logins, shakes served
/// (`won` + `nothing`), `overloaded` answers and firings backed off.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultSecond {
    pub second: u64,
    pub logged_in: u64,
    pub disconnects: u64,
    pub logins: u64,
    pub served: u64,
    pub overloaded: u64,
    pub backed_off: u64,
    /// Connection attempts refused.
    pub refused: u64,
    /// Requests answered with an error.
    pub error_replies: u64,
}

impl From<&Row> for FaultSecond {
    fn from(r: &Row) -> FaultSecond {
        FaultSecond {
            second: r.second,
            logged_in: r.logged_in,
            disconnects: r.counters.disconnects,
            logins: r.counters.logins,
            served: r.counters.won + r.counters.nothing,
            overloaded: r.counters.overloaded,
            backed_off: r.counters.backed_off,
            refused: r.counters.failed_refused,
            error_replies: r.counters.error_replies,
        }
    }
}

/// One shard's wins through a fault: the median a second over the five seconds before
/// it, and the fewest in one second of the window after it (the fault's second and
/// `FAULT_WINDOW_SECS - 1` after, within its phase and while the campaign still had
/// packets), as a share of that median.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardCarried {
    pub shard: u32,
    pub before_per_sec: u64,
    pub min_per_sec: u64,
    pub min_ratio: f64,
    /// The seconds judged.
    pub window_secs: u64,
}

impl ShardCarried {
    /// From each shard's wins by run second, a fault in `at_second`, and `last`, the
    /// last second to judge.
    pub fn judge(by_shard: &[BTreeMap<u64, u64>], at_second: u64, last: u64) -> Vec<Self> {
        // The campaign's last second with wins anywhere: past it no shard has packets.
        let last = by_shard
            .iter()
            .filter_map(|w| w.keys().next_back().copied())
            .max()
            .map_or(last, |end| last.min(end.saturating_sub(1)));
        by_shard
            .iter()
            .enumerate()
            .map(|(k, wins)| {
                let n = |s: u64| wins.get(&s).copied().unwrap_or(0);
                let mut before: Vec<u64> =
                    (at_second.saturating_sub(5)..at_second).map(n).collect();
                before.sort_unstable();
                let median = before.get(before.len() / 2).copied().unwrap_or(0);
                let window: Vec<u64> = (at_second..=last.min(at_second + FAULT_WINDOW_SECS - 1))
                    .map(n)
                    .collect();
                let min = window.iter().copied().min().unwrap_or(0);
                ShardCarried {
                    shard: k as u32,
                    before_per_sec: median,
                    min_per_sec: min,
                    min_ratio: if median == 0 {
                        0.0
                    } else {
                        min as f64 / median as f64
                    },
                    window_secs: window.len() as u64,
                }
            })
            .collect()
    }
}

impl FaultSummary {
    /// From the load's seconds around a fault done in `at_second` to `users` users.
    pub fn from_rows(what: String, at_second: u64, users: u64, rows: &[FaultSecond]) -> Self {
        let before = rows.iter().rev().find(|r| r.second < at_second);
        let (d0, l0) = before.map_or((0, 0), |r| (r.disconnects, r.logins));
        let (r0, e0) = before.map_or((0, 0), |r| (r.refused, r.error_replies));
        let after: Vec<&FaultSecond> = rows.iter().filter(|r| r.second >= at_second).collect();
        let dropped = after.last().map_or(0, |r| r.disconnects - d0);
        let reconnected_secs = if dropped == 0 {
            Some(0)
        } else {
            // Every drop seen and every user logged in again. Not "as many logins as
            // drops": a connection nginx took and closed when its gateway was gone is a
            // drop that never logged in, and a run waited for a login that never came.
            after
                .iter()
                .find(|r| r.disconnects - d0 >= dropped && r.logins > l0 && r.logged_in >= users)
                .map(|r| r.second - at_second + 1)
        };
        FaultSummary {
            what,
            at_second,
            dropped,
            logged_in_min: after.iter().map(|r| r.logged_in).min().unwrap_or(users),
            reconnected_secs,
            refused_connects: after.last().map_or(0, |r| r.refused - r0),
            error_replies: after.last().map_or(0, |r| r.error_replies - e0),
            ..FaultSummary::default()
        }
    }

    /// The served rate around the fault, second by second, in its phase: `asked` shakes
    /// a second, to its last second `until`.
    pub fn with_served(mut self, (asked, until): (u64, u64), rows: &[FaultSecond]) -> Self {
        let at = self.at_second;
        let from = rows
            .iter()
            .rev()
            .find(|r| r.second < at)
            .copied()
            .unwrap_or_default();
        let mut prev = from;
        for r in rows
            .iter()
            .filter(|r| r.second >= at && r.second < at + FAULT_WINDOW_SECS && r.second <= until)
        {
            let served = r.served - prev.served;
            if served * 10 < asked * 9 {
                self.reduced_secs += 1;
            }
            self.shakes_short += asked.saturating_sub(served);
            prev = *r;
        }
        self.overloaded = prev.overloaded - from.overloaded;
        self.backed_off = prev.backed_off - from.backed_off;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clients' view of a fault: who was dropped, and when all were back.
    #[test]
    fn a_fault_is_timed_from_the_clients_logins() {
        let at = |second, logged_in, disconnects, logins| FaultSecond {
            second,
            logged_in,
            disconnects,
            logins,
            ..Default::default()
        };
        // 48 dropped in second 6, back by the end of second 8.
        let rows = [
            at(4, 100, 0, 100),
            at(5, 100, 0, 100),
            at(6, 52, 48, 100),
            at(7, 80, 48, 128),
            at(8, 100, 48, 148),
            at(9, 100, 48, 148),
        ];
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &rows);
        assert_eq!(
            (f.dropped, f.logged_in_min, f.reconnected_secs),
            (48, 52, Some(4))
        );
        // Refusals counted from the fault's second on, not before.
        let refusing: Vec<FaultSecond> = rows
            .iter()
            .map(|r| FaultSecond {
                refused: if r.second >= 6 { 7 } else { 3 },
                error_replies: if r.second >= 5 { 2 } else { 1 },
                ..*r
            })
            .collect();
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &refusing);
        assert_eq!((f.refused_connects, f.error_replies), (4, 1));
        // One more drop than logins: a connection closed before it logged in (nginx
        // took it and found its gateway gone). Everyone is back all the same.
        let closed = [
            at(4, 100, 0, 100),
            at(5, 94, 501, 594),
            at(6, 100, 501, 600),
        ];
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &closed);
        assert_eq!((f.dropped, f.reconnected_secs), (501, Some(2)));
        // Dropped and back within the fault's own second: the rows never dip.
        let quick = [at(4, 100, 0, 100), at(5, 100, 30, 130), at(6, 100, 30, 130)];
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &quick);
        assert_eq!(
            (f.dropped, f.logged_in_min, f.reconnected_secs),
            (30, 100, Some(1))
        );
        let calm = FaultSummary::from_rows("killed".into(), 5, 100, &rows[..2]);
        assert_eq!((calm.dropped, calm.reconnected_secs), (0, Some(0)));
        let lost = FaultSummary::from_rows("killed".into(), 5, 100, &rows[..4]);
        assert_eq!((lost.dropped, lost.reconnected_secs), (48, None));
    }

    /// The served rate around a fault: the seconds short of 90% of the rate asked, and
    /// the shakes short, over the window while the rate stays the fault's.
    #[test]
    fn a_fault_costs_the_seconds_the_served_rate_dips() {
        let mut served = 0;
        let mut at = |second: u64, this_second: u64| {
            served += this_second;
            FaultSecond {
                second,
                logged_in: 10,
                served,
                overloaded: second * 7,
                backed_off: second * 5,
                ..Default::default()
            }
        };
        let rows = [
            at(3, 1000),
            at(4, 1000),
            at(5, 620),
            at(6, 880),
            at(7, 950),
            at(8, 1040),
            at(9, 500),
        ];
        // The phase: 1,000 a second to second 8.
        let f =
            FaultSummary::from_rows("stalled".into(), 5, 10, &rows).with_served((1000, 8), &rows);
        assert_eq!((f.reduced_secs, f.shakes_short), (2, 380 + 120 + 50));
        // From second 4's end to second 8's (the next phase is not judged).
        assert_eq!((f.overloaded, f.backed_off), (28, 20));
        assert_eq!(f.reconnected_secs, Some(0));
    }
}
