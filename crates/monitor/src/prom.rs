//! Prometheus text exposition (format 0.0.4), written by hand: counters, gauges and
//! histograms, base units, a `hongbao_` prefix chosen by the callers.

use std::collections::HashMap;
use std::fmt::Write;

use hdrhistogram::Histogram;

/// Upper bounds (seconds) of the latency histogram buckets we export.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// A Prometheus text page under construction. The format wants every line of a metric
/// in one group, so lines are kept per metric (in the order metrics first appear) and
/// joined at `finish`.
#[derive(Default)]
pub struct Exposition {
    metrics: Vec<String>,
    index: HashMap<String, usize>,
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
    /// The text of metric `name`, begun with its HELP and TYPE lines.
    fn describe(&mut self, name: &str, kind: &str, help: &str) -> &mut String {
        let at = match self.index.get(name) {
            Some(&at) => at,
            None => {
                self.metrics
                    .push(format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
                self.index.insert(name.to_string(), self.metrics.len() - 1);
                self.metrics.len() - 1
            }
        };
        &mut self.metrics[at]
    }

    /// One sample of a counter or gauge.
    pub fn sample(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        labels: &[(&str, String)],
        value: f64,
    ) {
        let out = self.describe(name, kind, help);
        let _ = writeln!(out, "{name}{} {value}", label_text(labels));
    }

    /// A histogram of µs values, exported in seconds with `LATENCY_BUCKETS`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, String)],
        micros: &Histogram<u64>,
    ) {
        let out = self.describe(name, "histogram", help);
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
            let _ = writeln!(out, "{name}_bucket{} {cumulative}", label_text(&with_le));
        }
        let mut inf = labels.to_vec();
        inf.push(("le", "+Inf".to_string()));
        let total = micros.len();
        let _ = writeln!(out, "{name}_bucket{} {total}", label_text(&inf));
        let _ = writeln!(out, "{name}_sum{} {}", label_text(labels), sum_us / 1e6);
        let _ = writeln!(out, "{name}_count{} {total}", label_text(labels));
    }

    pub fn finish(self) -> String {
        self.metrics.concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_one_metric_stay_together() {
        let mut m = Exposition::default();
        for role in ["load", "server"] {
            m.sample(
                "hongbao_a_total",
                "counter",
                "a",
                &[("role", role.into())],
                1.0,
            );
            m.sample("hongbao_b", "gauge", "b", &[("role", role.into())], 2.0);
        }
        let text = m.finish();
        let names: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split('{').next().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "hongbao_a_total",
                "hongbao_a_total",
                "hongbao_b",
                "hongbao_b"
            ]
        );
        assert_eq!(text.matches("# TYPE hongbao_a_total counter").count(), 1);
    }
}
