//! Prometheus text exposition (format 0.0.4). A scrape builds a `Page` of metric families
//! from values known now — workers' cumulative counters, the core's state, a monitor's
//! rows — and the `prometheus` crate's text encoder writes it: escaping, grouping and
//! bucket lines are its business, not ours. Latency is kept in HDR histograms (µs) and
//! exported as classic histograms in seconds with `LATENCY_BUCKETS`.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use prometheus::proto::{self, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, TextEncoder};

/// The content type of the page.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Upper bounds (seconds) of the latency histogram buckets we export.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// Metric families under construction, in the order they first appear.
#[derive(Default)]
pub struct Page {
    families: Vec<MetricFamily>,
    index: HashMap<String, usize>,
}

fn labels_of(labels: &[(&str, String)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(k, v)| {
            let mut pair = LabelPair::default();
            pair.set_name(k.to_string());
            pair.set_value(v.clone());
            pair
        })
        .collect()
}

impl Page {
    /// The family `name`, created with its help and type the first time.
    fn family(&mut self, name: &str, help: &str, kind: MetricType) -> &mut MetricFamily {
        let at = *self.index.entry(name.to_string()).or_insert_with(|| {
            let mut family = MetricFamily::default();
            family.set_name(name.to_string());
            family.set_help(help.to_string());
            family.set_field_type(kind);
            self.families.push(family);
            self.families.len() - 1
        });
        &mut self.families[at]
    }

    /// One sample of a counter (`name` ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, String)], value: f64) {
        let mut counter = proto::Counter::default();
        counter.set_value(value);
        let mut metric = Metric::from_label(labels_of(labels));
        metric.set_counter(counter);
        self.family(name, help, MetricType::COUNTER)
            .mut_metric()
            .push(metric);
    }

    /// One sample of a gauge.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, String)], value: f64) {
        let mut gauge = proto::Gauge::default();
        gauge.set_value(value);
        let mut metric = Metric::from_label(labels_of(labels));
        metric.set_gauge(gauge);
        self.family(name, help, MetricType::GAUGE)
            .mut_metric()
            .push(metric);
    }

    /// A histogram of µs values, exported in seconds with `LATENCY_BUCKETS`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, String)],
        micros: &Histogram<u64>,
    ) {
        let mut counts = vec![0u64; LATENCY_BUCKETS.len()];
        let mut sum_us = 0f64;
        for v in micros.iter_recorded() {
            let (value, n) = (v.value_iterated_to(), v.count_at_value());
            sum_us += value as f64 * n as f64;
            let seconds = value as f64 / 1e6;
            if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| seconds <= b) {
                counts[i] += n;
            }
        }
        let mut cumulative = 0;
        let buckets = LATENCY_BUCKETS
            .iter()
            .zip(counts)
            .map(|(&bound, n)| {
                cumulative += n;
                let mut bucket = proto::Bucket::default();
                bucket.set_upper_bound(bound);
                bucket.set_cumulative_count(cumulative);
                bucket
            })
            .collect();
        let mut histogram = proto::Histogram::default();
        histogram.set_sample_count(micros.len());
        histogram.set_sample_sum(sum_us / 1e6);
        histogram.set_bucket(buckets);
        let mut metric = Metric::from_label(labels_of(labels));
        metric.set_histogram(histogram);
        self.family(name, help, MetricType::HISTOGRAM)
            .mut_metric()
            .push(metric);
    }

    /// The page as Prometheus text.
    pub fn render(self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.families, &mut out)
            .expect("metric families we built encode");
        String::from_utf8(out).expect("the text encoder writes UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_one_metric_stay_together() {
        let mut m = Page::default();
        for role in ["load", "server"] {
            m.counter("hongbao_a_total", "a", &[("role", role.into())], 1.0);
            m.gauge("hongbao_b", "b", &[("role", role.into())], 2.0);
        }
        let text = m.render();
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

    #[test]
    fn histograms_count_in_seconds_with_inf_equal_to_count() {
        let mut h = Histogram::new_with_bounds(1, 120_000_000, 3).unwrap();
        for us in [50, 300, 2_000, 40_000_000] {
            h.record(us).unwrap();
        }
        let mut m = Page::default();
        m.histogram("hongbao_l_seconds", "l", &[("worker", "1".into())], &h);
        let text = m.render();
        assert!(text.contains("hongbao_l_seconds_bucket{worker=\"1\",le=\"0.0001\"} 1"));
        assert!(text.contains("hongbao_l_seconds_bucket{worker=\"1\",le=\"30\"} 3"));
        assert!(text.contains("hongbao_l_seconds_bucket{worker=\"1\",le=\"+Inf\"} 4"));
        assert!(text.contains("hongbao_l_seconds_count{worker=\"1\"} 4"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut m = Page::default();
        m.gauge("hongbao_c", "c", &[("phase", "a\"b\\c\nd".into())], 1.0);
        assert!(m.render().contains(r#"hongbao_c{phase="a\"b\\c\nd"} 1"#));
    }
}
