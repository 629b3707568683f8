//! Prometheus text exposition (format 0.0.4), written by hand: counters, gauges and
//! histograms, base units, a `hongbao_` prefix chosen by the callers.

use std::collections::BTreeSet;
use std::fmt::Write;

use hdrhistogram::Histogram;

/// Upper bounds (seconds) of the latency histogram buckets we export.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// A Prometheus text page under construction.
#[derive(Default)]
pub struct Exposition {
    out: String,
    described: BTreeSet<String>,
}

fn label_text(labels: &[(&str, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let body: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{{{}}}", body.join(","))
}

impl Exposition {
    fn describe(&mut self, name: &str, kind: &str, help: &str) {
        if self.described.insert(name.to_string()) {
            let _ = writeln!(self.out, "# HELP {name} {help}");
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
        }
    }

    /// One sample of a counter or gauge. Samples of one name must be added together.
    pub fn sample(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        labels: &[(&str, String)],
        value: f64,
    ) {
        self.describe(name, kind, help);
        let _ = writeln!(self.out, "{name}{} {value}", label_text(labels));
    }

    /// A histogram of µs values, exported in seconds with `LATENCY_BUCKETS`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, String)],
        micros: &Histogram<u64>,
    ) {
        self.describe(name, "histogram", help);
        let mut counts = vec![0u64; LATENCY_BUCKETS.len()];
        let mut sum_us = 0f64;
        for v in micros.iter_recorded() {
            let value = v.value_iterated_to();
            let n = v.count_at_value();
            sum_us += value as f64 * n as f64;
            let seconds = value as f64 / 1e6;
            if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| seconds <= b) {
                counts[i] += n;
            }
        }
        let mut cumulative = 0;
        for (bound, n) in LATENCY_BUCKETS.iter().zip(counts) {
            cumulative += n;
            let mut with_le = labels.to_vec();
            with_le.push(("le", bound.to_string()));
            let _ = writeln!(
                self.out,
                "{name}_bucket{} {cumulative}",
                label_text(&with_le)
            );
        }
        let mut inf = labels.to_vec();
        inf.push(("le", "+Inf".to_string()));
        let total = micros.len();
        let _ = writeln!(self.out, "{name}_bucket{} {total}", label_text(&inf));
        let _ = writeln!(
            self.out,
            "{name}_sum{} {}",
            label_text(labels),
            sum_us / 1e6
        );
        let _ = writeln!(self.out, "{name}_count{} {total}", label_text(labels));
    }

    pub fn finish(self) -> String {
        self.out
    }
}
