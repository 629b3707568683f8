//! Broadcast delivery: how long an operator broadcast took to reach every connection.
//!
//! The server stamps each broadcast with its send time (`server_time_us`, µs since the
//! Unix epoch); a client that receives it records receive time − stamp. Server and load
//! share the machine, so they share the clock. The stamp is also the broadcast's key: it
//! is what every receiving client sees and what `POST /v1/broadcast` answers.
//!
//! Three stages, no I/O in any of them:
//! - [`Receipts`]: a client process's receipts of the current second, drained into its
//!   per-second report as [`BroadcastReport`]s (only broadcasts with new receipts);
//! - [`Deliveries`]: the coordinator's merge of those reports over processes and seconds,
//!   kept as sparse HDR buckets (a full histogram is ~140 KB; a long run may see many
//!   broadcasts), handed out as [`BroadcastStats`];
//! - [`Sent`] + [`entries`] + [`summary`]: what the bench sent against what arrived, for
//!   `summary.json`'s `broadcast` and `broadcasts.json`.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use hongbao_report::Broadcast;
// From their home rather than through `report`, which carries this file's
// `BroadcastReport`: the two files do not lean on each other.
use hongbao_telemetry::sample::{merge_sparse, new_histogram, sparse};
use serde::{Deserialize, Serialize};

/// Points at most in a `broadcasts.json` delivery curve (plus the last delivery).
pub const CDF_POINTS: usize = 150;

/// One broadcast's receipts in one client process over one second.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BroadcastReport {
    pub server_time_us: u64,
    /// Messages received this second.
    pub delivered: u64,
    /// The latest receive time this second, µs since the Unix epoch.
    pub last_receive_us: u64,
    /// Receive time − stamp, µs: sparse HDR buckets (value, count).
    pub latency_us: Vec<(u64, u64)>,
}

struct Tally {
    delivered: u64,
    last_receive_us: u64,
    latency_us: Histogram<u64>,
}

/// A client process's receipts since its last report. Usually empty, or one broadcast
/// being delivered, so a histogram each costs nothing worth counting.
#[derive(Default)]
pub struct Receipts {
    by_stamp: BTreeMap<u64, Tally>,
}

impl Receipts {
    /// One broadcast message received at `receive_us`.
    pub fn record(&mut self, server_time_us: u64, receive_us: u64) {
        let tally = self
            .by_stamp
            .entry(server_time_us)
            .or_insert_with(|| Tally {
                delivered: 0,
                last_receive_us: 0,
                latency_us: new_histogram(),
            });
        tally.delivered += 1;
        tally.last_receive_us = tally.last_receive_us.max(receive_us);
        // A clock step backwards would make this negative: count it as the fastest.
        let latency_us = receive_us.saturating_sub(server_time_us).max(1);
        tally.latency_us.saturating_record(latency_us);
    }

    /// Everything received since the last call, oldest broadcast first; starts afresh.
    pub fn drain(&mut self) -> Vec<BroadcastReport> {
        std::mem::take(&mut self.by_stamp)
            .into_iter()
            .map(|(server_time_us, t)| BroadcastReport {
                server_time_us,
                delivered: t.delivered,
                last_receive_us: t.last_receive_us,
                latency_us: sparse(&t.latency_us),
            })
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
struct Merged {
    delivered: u64,
    last_receive_us: u64,
    /// Bucket value (µs) → count: exact, since every report uses the same bucketing.
    latency_us: BTreeMap<u64, u64>,
}

/// Every broadcast the load has received, merged over processes and seconds.
#[derive(Debug, Clone, Default)]
pub struct Deliveries {
    by_stamp: BTreeMap<u64, Merged>,
}

impl Deliveries {
    pub fn merge(&mut self, reports: &[BroadcastReport]) {
        for r in reports {
            let m = self.by_stamp.entry(r.server_time_us).or_default();
            m.delivered += r.delivered;
            m.last_receive_us = m.last_receive_us.max(r.last_receive_us);
            for &(value, count) in &r.latency_us {
                *m.latency_us.entry(value).or_default() += count;
            }
        }
    }

    /// Distinct broadcasts received by at least one client.
    pub fn seen(&self) -> u64 {
        self.by_stamp.len() as u64
    }

    /// Messages received, all broadcasts together.
    pub fn delivered(&self) -> u64 {
        self.by_stamp.values().map(|m| m.delivered).sum()
    }

    /// Messages received per broadcast, by stamp.
    pub fn delivered_by_stamp(&self) -> BTreeMap<u64, u64> {
        self.by_stamp
            .iter()
            .map(|(&stamp, m)| (stamp, m.delivered))
            .collect()
    }

    /// One entry per broadcast, oldest stamp first.
    pub fn stats(&self) -> Vec<BroadcastStats> {
        self.by_stamp
            .iter()
            .map(|(&server_time_us, m)| {
                let mut latency_us = new_histogram();
                let buckets: Vec<(u64, u64)> = m.latency_us.iter().map(|(&v, &c)| (v, c)).collect();
                merge_sparse(&mut latency_us, &buckets);
                BroadcastStats {
                    server_time_us,
                    delivered: m.delivered,
                    latency_us,
                    last_receive_us: m.last_receive_us,
                }
            })
            .collect()
    }
}

/// One broadcast as the whole load saw it (`Load::broadcasts`).
#[derive(Debug, Clone)]
pub struct BroadcastStats {
    /// The server's stamp, µs since the Unix epoch: names the broadcast.
    pub server_time_us: u64,
    /// Messages received, all clients together.
    pub delivered: u64,
    /// Receive time − stamp, µs, every delivery.
    pub latency_us: Histogram<u64>,
    /// The latest receive time, µs since the Unix epoch.
    pub last_receive_us: u64,
}

impl BroadcastStats {
    /// From the stamp to the last delivery, ms (exact, not bucketed).
    pub fn complete_ms(&self) -> f64 {
        self.last_receive_us.saturating_sub(self.server_time_us) as f64 / 1000.0
    }

    /// The delivery curve: (ms since the stamp, deliveries so far), in time order, at
    /// most `max_points` + 1 points. A point is kept where the running count crosses a
    /// multiple of delivered ÷ `max_points`, so points fall where deliveries do; the last
    /// bucket is always kept. Times are bucket upper bounds (HDR, 3 significant digits).
    pub fn cdf(&self, max_points: usize) -> Vec<(f64, u64)> {
        cdf(&sparse(&self.latency_us), max_points)
    }
}

/// [`BroadcastStats::cdf`] on sparse buckets sorted by value.
pub fn cdf(buckets: &[(u64, u64)], max_points: usize) -> Vec<(f64, u64)> {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    let steps = max_points.max(1) as u128;
    let step_of = |count: u64| count as u128 * steps / total.max(1) as u128;
    let mut points = Vec::new();
    let mut so_far = 0u64;
    for (n, &(value_us, count)) in buckets.iter().enumerate() {
        let before = so_far;
        so_far += count;
        if n + 1 == buckets.len() || step_of(so_far) > step_of(before) {
            points.push((value_us as f64 / 1000.0, so_far));
        }
    }
    points
}

/// A broadcast the bench asked for, with what `POST /v1/broadcast` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub id: u64,
    pub server_time_us: u64,
    /// Connections the server handed it to.
    pub connections: u64,
    /// The steady phase it was sent in.
    pub phase: String,
    /// Connections the clients had lost so far when it was sent: disconnects plus
    /// connect failures (counted, cumulative).
    pub drops_before: u64,
}

/// Whether a broadcast reached every connection it should have. The server handed it to
/// `connections`; each connection lost after that (`drops_after − drops_before`) may have
/// gone before reading it, and nothing else may. So with no loss, exactly `connections`
/// deliveries; with `k` lost, between `connections − k` and `connections`. More than
/// `connections` is a duplicate or a stray.
pub fn delivery_ok(sent: &Sent, delivered: u64, drops_after: u64) -> bool {
    let lost = drops_after.saturating_sub(sent.drops_before);
    delivered <= sent.connections && delivered + lost >= sent.connections
}

/// `broadcasts.json`: one entry per broadcast sent, matched to what arrived by stamp.
pub fn entries(sent: &[Sent], stats: &[BroadcastStats]) -> Vec<Broadcast> {
    sent.iter()
        .map(|s| {
            let got = stats.iter().find(|b| b.server_time_us == s.server_time_us);
            Broadcast {
                id: s.id,
                server_time_us: s.server_time_us,
                connections: s.connections,
                delivered: got.map_or(0, |b| b.delivered),
                complete_ms: got.map_or(0.0, BroadcastStats::complete_ms),
                cdf: got.map_or_else(Vec::new, |b| b.cdf(CDF_POINTS)),
            }
        })
        .collect()
}

/// Delivery latency over every delivery of every broadcast, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyDistMs {
    pub min: f64,
    pub mean: f64,
    pub stddev: f64,
    pub p50: f64,
    pub p75: f64,
    pub p95: f64,
    pub p98: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl LatencyDistMs {
    pub fn of(h: &Histogram<u64>) -> LatencyDistMs {
        if h.is_empty() {
            return LatencyDistMs::default();
        }
        let q = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        LatencyDistMs {
            min: h.min() as f64 / 1000.0,
            mean: h.mean() / 1000.0,
            stddev: h.stdev() / 1000.0,
            p50: q(0.5),
            p75: q(0.75),
            p95: q(0.95),
            p98: q(0.98),
            p99: q(0.99),
            p999: q(0.999),
            max: h.max() as f64 / 1000.0,
        }
    }
}

/// `summary.json`'s `broadcast`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// Broadcasts sent.
    pub sent: u64,
    /// Messages the clients received, all broadcasts together.
    pub delivered: u64,
    /// Connections the server handed them to, summed over broadcasts.
    pub connections: u64,
    /// The slowest broadcast's time from stamp to last delivery, ms.
    pub complete_ms: f64,
    pub latency_ms: LatencyDistMs,
}

pub fn summary(sent: &[Sent], stats: &[BroadcastStats]) -> Summary {
    let mut all = new_histogram();
    for b in stats {
        all.add(&b.latency_us).expect("same bounds");
    }
    let complete_ms = entries(sent, stats)
        .iter()
        .map(|e| e.complete_ms)
        .fold(0.0, f64::max);
    Summary {
        sent: sent.len() as u64,
        delivered: stats.iter().map(|b| b.delivered).sum(),
        connections: sent.iter().map(|s| s.connections).sum(),
        complete_ms,
        latency_ms: LatencyDistMs::of(&all),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000_000;

    /// Two client processes receiving broadcasts A (stamp T0) and B (T0 + 5 s) over two
    /// seconds; the coordinator merges their reports in any order.
    fn reports() -> Vec<Vec<BroadcastReport>> {
        let mut p0 = Receipts::default();
        let mut p1 = Receipts::default();
        p0.record(T0, T0 + 1_000);
        p0.record(T0, T0 + 3_000);
        p1.record(T0, T0 + 2_000);
        let first = vec![p0.drain(), p1.drain()];
        assert!(p0.drain().is_empty(), "drained");
        p0.record(T0, T0 + 1_200_000);
        p1.record(T0 + 5_000_000, T0 + 5_000_500);
        p1.record(T0 + 5_000_000, T0 + 5_000_100);
        let mut all = first;
        all.push(p0.drain());
        all.push(p1.drain());
        all
    }

    #[test]
    fn merges_per_broadcast_in_any_order() {
        let reports = reports();
        let mut forward = Deliveries::default();
        let mut backward = Deliveries::default();
        for r in &reports {
            forward.merge(r);
        }
        for r in reports.iter().rev() {
            backward.merge(r);
        }
        for d in [&forward, &backward] {
            assert_eq!(d.seen(), 2);
            assert_eq!(d.delivered(), 6);
            let stats = d.stats();
            assert_eq!(stats.len(), 2);
            let (a, b) = (&stats[0], &stats[1]);
            assert_eq!((a.server_time_us, a.delivered), (T0, 4));
            assert_eq!(a.last_receive_us, T0 + 1_200_000);
            assert_eq!(a.complete_ms(), 1200.0);
            assert_eq!(a.latency_us.len(), 4);
            assert_eq!(a.latency_us.min(), 1_000);
            assert!(a.latency_us.max().abs_diff(1_200_000) <= 1_200);
            assert_eq!((b.server_time_us, b.delivered), (T0 + 5_000_000, 2));
            assert_eq!(b.complete_ms(), 0.5);
            assert_eq!(b.latency_us.value_at_quantile(0.0), 100);
        }
    }

    #[test]
    fn early_receipt_counts_as_fastest() {
        let mut r = Receipts::default();
        r.record(T0, T0 - 10);
        let got = r.drain();
        assert_eq!(got[0].latency_us, vec![(1, 1)]);
        assert_eq!(got[0].last_receive_us, T0 - 10);
    }

    #[test]
    fn cdf_is_monotone_bounded_and_ends_at_the_total() {
        // 10,000 deliveries spread over 1..=10,000 µs, then one straggler at 2 s.
        let mut h = new_histogram();
        for us in 1..=10_000u64 {
            h.record(us).unwrap();
        }
        h.record(2_000_000).unwrap();
        let stats = BroadcastStats {
            server_time_us: T0,
            delivered: 10_001,
            latency_us: h,
            last_receive_us: T0 + 2_000_000,
        };
        let points = stats.cdf(CDF_POINTS);
        assert!(points.len() <= CDF_POINTS + 1, "{} points", points.len());
        assert!(points.len() >= CDF_POINTS / 2, "{} points", points.len());
        assert!(points
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        let last = *points.last().unwrap();
        assert_eq!(last.1, 10_001);
        assert!((last.0 - 2000.0).abs() < 2.0, "{last:?}");
        // The curve passes near the median: half delivered by ~5 ms.
        let half = points.iter().find(|p| p.1 >= 5_000).unwrap();
        assert!((half.0 - 5.0).abs() < 0.2, "{half:?}");
    }

    #[test]
    fn cdf_small_and_empty() {
        assert!(cdf(&[], 100).is_empty());
        assert_eq!(
            cdf(&[(500, 1), (1000, 2), (2500, 1)], 100),
            vec![(0.5, 1), (1.0, 3), (2.5, 4)]
        );
        // One point per crossed step at most, and the last one always.
        assert_eq!(
            cdf(&[(1000, 1), (2000, 1), (3000, 1), (4000, 1)], 2),
            vec![(2.0, 2), (4.0, 4)]
        );
    }

    #[test]
    fn delivery_is_exact_unless_connections_were_lost() {
        let sent = Sent {
            id: 1,
            server_time_us: T0,
            connections: 1000,
            phase: "qps-1000".into(),
            drops_before: 7,
        };
        // Nothing lost since the send: every connection, exactly once.
        assert!(delivery_ok(&sent, 1000, 7));
        assert!(!delivery_ok(&sent, 999, 7));
        assert!(!delivery_ok(&sent, 1001, 7));
        // Three lost: up to three may be missing, none may be extra.
        assert!(delivery_ok(&sent, 997, 10));
        assert!(delivery_ok(&sent, 1000, 10));
        assert!(!delivery_ok(&sent, 996, 10));
        assert!(!delivery_ok(&sent, 1001, 10));
        // Counters read before the send may be older than the ones after: never negative.
        assert!(delivery_ok(&sent, 1000, 0));
    }

    #[test]
    fn entries_and_summary_match_sent_to_received_by_stamp() {
        let mut d = Deliveries::default();
        for r in reports() {
            d.merge(&r);
        }
        let stats = d.stats();
        let sent = |id, stamp, connections| Sent {
            id,
            server_time_us: stamp,
            connections,
            phase: "qps-1000".into(),
            drops_before: 0,
        };
        let sent = vec![
            sent(1, T0, 4),
            sent(2, T0 + 5_000_000, 3),
            sent(3, T0 + 9_000_000, 2),
        ];
        let e = entries(&sent, &stats);
        assert_eq!(e.len(), 3);
        assert_eq!((e[0].id, e[0].delivered, e[0].connections), (1, 4, 4));
        assert_eq!(e[0].complete_ms, 1200.0);
        assert_eq!(e[0].cdf.last().unwrap().1, 4);
        assert_eq!((e[1].delivered, e[1].complete_ms), (2, 0.5));
        // Sent but never received: an entry with nothing in it.
        assert_eq!((e[2].delivered, e[2].complete_ms), (0, 0.0));
        assert!(e[2].cdf.is_empty());

        let s = summary(&sent, &stats);
        assert_eq!((s.sent, s.delivered, s.connections), (3, 6, 9));
        assert_eq!(s.complete_ms, 1200.0);
        let l = &s.latency_ms;
        assert_eq!(l.min, 0.1);
        assert!(l.min <= l.p50 && l.p50 <= l.p75 && l.p75 <= l.p95);
        assert!(l.p95 <= l.p98 && l.p98 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max);
        assert!((l.max - 1200.0).abs() < 1.5);
        assert!(l.mean > 0.0 && l.stddev > 0.0);

        // Broadcasting off: zeros, not NaN.
        let off = summary(&[], &[]);
        assert_eq!(off, Summary::default());
        assert!(serde_json::to_string(&off)
            .unwrap()
            .contains("\"p999\":0.0"));
    }
}
