//! Counters across workers, per-second rates, and the Prometheus text exposition.
//!
//! Worker stats travel as a struct whose field names are the metric names; here they are
//! handled as JSON maps so adding a counter needs no code beyond the field.

use serde_json::{Map, Value};

use hongbao_telemetry::prom::Page;

use crate::link::WorkerStats;

/// Fields of `WorkerStats` that are levels, not counters.
const LEVELS: &[&str] = &["connections", "logged_in", "pool_packets", "rss_bytes"];
/// Fields that identify rather than count, or are not numbers.
const IDS: &[&str] = &["worker", "pid", "unix_second", "shake_latency_us"];

fn as_map(stats: &WorkerStats) -> Map<String, Value> {
    match serde_json::to_value(stats).expect("stats serialize") {
        Value::Object(map) => map,
        _ => unreachable!("a struct serializes to an object"),
    }
}

/// Adds every numeric field of `stats` (but ids) into `totals`: a live worker's levels
/// and counters.
pub fn add_counters(totals: &mut Map<String, Value>, stats: &WorkerStats) {
    add_fields(totals, stats, &[]);
}

/// Adds the counters of a worker that has exited into `totals`: its levels ended with it.
pub fn retire(totals: &mut Map<String, Value>, stats: &WorkerStats) {
    add_fields(totals, stats, LEVELS);
}

fn add_fields(totals: &mut Map<String, Value>, stats: &WorkerStats, skip: &[&str]) {
    for (k, v) in as_map(stats) {
        if IDS.contains(&k.as_str()) || skip.contains(&k.as_str()) {
            continue;
        }
        let sum = totals.get(&k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
        totals.insert(k, sum.into());
    }
}

/// Per-second rates of the counters between two reports a second apart.
pub fn rates(latest: &WorkerStats, previous: Option<&WorkerStats>) -> Map<String, Value> {
    let Some(previous) = previous else {
        return Map::new();
    };
    let (a, b) = (as_map(latest), as_map(previous));
    let seconds = latest
        .unix_second
        .saturating_sub(previous.unix_second)
        .max(1);
    a.iter()
        // CPU time is a counter, but it is reported per worker, not as a rate.
        .filter(|(k, _)| {
            !IDS.contains(&k.as_str()) && !LEVELS.contains(&k.as_str()) && k.as_str() != "cpu_ms"
        })
        .map(|(k, v)| {
            let delta = v
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(b[k].as_u64().unwrap_or(0));
            (k.clone(), (delta / seconds).into())
        })
        .collect()
}

/// Writes the summed worker counters as `hongbao_worker_<name>_total` counters (gauges for
/// levels), in base units.
pub fn worker_totals(m: &mut Page, totals: &Map<String, Value>) {
    for (k, v) in totals {
        let value = v.as_u64().unwrap_or(0) as f64;
        match k.as_str() {
            "rss_bytes" | "cpu_ms" => {} // exported per worker with their own names
            "connections" | "logged_in" | "pool_packets" => m.gauge(
                &format!("hongbao_{k}"),
                &format!("Sum over workers of {k}"),
                &[],
                value,
            ),
            _ => m.counter(
                &format!("hongbao_worker_{k}_total"),
                &format!("Sum over workers of {k}"),
                &[],
                value,
            ),
        }
    }
}
