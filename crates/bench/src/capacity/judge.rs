//! What one step measured and whether it met the SLO: the load's rows and the probe's
//! samples of a step's counted seconds in, its record of `summary.json` out, with what
//! broke and where the bottleneck lies (docs/capacity.md). No I/O. `knee` reads a run's
//! steps; `sizing` reads the runs together.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::plan::Slo;
use super::probe::{Sample, Watched};
use hongbao_lab::EngineCounters;
use hongbao_load::coordinator::Row;
use hongbao_load::report;

/// Latency from each request's intended send time, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub mean_ms: f64,
    pub max_ms: f64,
}

/// One instance of a layer (a process, or a host's processes) over a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceLoad {
    pub layer: String,
    pub instance: String,
    pub pids: Vec<u32>,
    /// Mean CPU over the step, in cores (1.0 = one core busy).
    pub cpu_cores: f64,
    /// The busiest second's CPU, cores.
    pub cpu_peak_cores: f64,
    /// Network of the instance's own namespace (lab hosts), bytes/s mean and peak; absent
    /// for processes sharing the machine's namespace (see `machine` in the layers).
    pub net_in_bytes_per_sec: Option<f64>,
    pub net_out_bytes_per_sec: Option<f64>,
    pub net_peak_bytes_per_sec: Option<f64>,
}

/// A layer over a step: its instances summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerLoad {
    pub layer: String,
    pub instances: u32,
    pub cpu_cores: f64,
    /// The busiest instance's mean CPU, cores (what the SLO's `cpu` limits).
    pub cpu_max_instance_cores: f64,
    pub net_in_bytes_per_sec: Option<f64>,
    pub net_out_bytes_per_sec: Option<f64>,
    /// The busiest second's in + out, bytes/s.
    pub net_peak_bytes_per_sec: Option<f64>,
}

/// Redis and PostgreSQL over a step (cluster stages).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineLoad {
    /// Commands per second over the masters, by command (scripts' inner commands
    /// included).
    pub redis_calls_per_sec: BTreeMap<String, f64>,
    pub redis_calls_per_sec_total: f64,
    pub pg_commits_per_sec: f64,
    pub pg_rows_written_per_sec: f64,
}

/// Where a step's limit lies: the layer that refused (answered "overloaded"), or the
/// instance that ran closest to its CPU limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bottleneck {
    pub layer: String,
    pub instance: String,
    /// The instance's processes (none for the machine).
    pub pids: Vec<u32>,
    pub cpu_cores: f64,
    /// CPU ÷ the layer's limit (the SLO's, or one core).
    pub share_of_limit: f64,
    /// `overloaded`: the layer refused requests (an admission limit); `cpu`: the instance
    /// is at 85% of its CPU limit or more; `busiest`: the busiest instance, short of its
    /// limit (the bound is elsewhere: a lock, the network, the load, another process);
    /// `machine`: no layer at its limit but the machine's cores 90% busy or more (layer
    /// `machine`).
    pub cause: String,
}

/// CPU at this share of its limit counts as saturated.
const SATURATED: f64 = 0.85;
/// The machine's busy CPU at this share of its cores counts as saturated.
const MACHINE_SATURATED: f64 = 0.9;

pub(super) fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub offered_qps: u64,
    /// Answered requests (not overloaded, not errors) per second.
    pub achieved_qps: f64,
    /// Requests the load sent per second.
    pub sent_qps: f64,
    /// Seconds counted (after the settling seconds).
    pub seconds: u64,
    /// Why the step was cut short, if it was.
    pub ended_early: Option<String>,
    pub latency: Latency,
    /// Counts over the step by cause: `overloaded`, `error_replies`, `connect_failed`,
    /// `not_sent` (user not connected or busy), `kicks`, `unanswered` (sent, no answer
    /// by the step's end).
    pub errors: BTreeMap<String, u64>,
    pub error_rate: f64,
    pub layers: Vec<LayerLoad>,
    pub instances: Vec<InstanceLoad>,
    pub engines: Option<EngineLoad>,
    pub meets_slo: bool,
    /// What broke, when it did not meet the SLO.
    pub broken: Vec<String>,
    pub bottleneck: Option<Bottleneck>,
}

/// Engine counters and the unix ms they were read at.
pub type Stamped = (u64, EngineCounters);

/// The load's rows and the probe's samples of one step's counted seconds.
pub struct Window<'a> {
    pub offered_qps: u64,
    /// Rows of the counted seconds, and the row of the second before them (the
    /// counters' baseline).
    pub rows: &'a [Row],
    pub before: &'a Row,
    /// What the probe watches, and its samples: the one at the window's start, then one
    /// per second.
    pub watched: &'a [Watched],
    pub samples: &'a [Sample],
    /// The engines' counters (cluster stages) at the window's start and end, with their
    /// unix ms.
    pub engines: Option<(&'a Stamped, &'a Stamped)>,
    pub slo: &'a Slo,
    /// The layer whose "overloaded" answers (429/503) the load counts: the gateway's
    /// admission, or an external target's.
    pub refusing_layer: &'a str,
}

/// Rows that are not layers under test: the load generator and the machine as a whole.
pub const OBSERVERS: &[&str] = &["load", "machine"];

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl Window<'_> {
    pub fn record(&self) -> StepRecord {
        let mut h = report::new_histogram();
        for row in self.rows {
            report::merge_sparse(&mut h, &row.shake_latency);
        }
        let latency = if h.is_empty() {
            Latency::default()
        } else {
            Latency {
                p50_ms: ms(h.value_at_quantile(0.5)),
                p99_ms: ms(h.value_at_quantile(0.99)),
                p999_ms: ms(h.value_at_quantile(0.999)),
                mean_ms: h.mean() / 1000.0,
                max_ms: ms(h.max()),
            }
        };
        let seconds = self.rows.len() as u64;
        let last = self
            .rows
            .last()
            .map_or(&self.before.counters, |r| &r.counters);
        let d = last.since(&self.before.counters);
        let offered = self.offered_qps * seconds;
        let ok = d.won + d.nothing;
        let answered = d.shake_replies + d.error_replies;
        let mut errors = BTreeMap::new();
        errors.insert("overloaded".to_string(), d.overloaded);
        errors.insert("error_replies".to_string(), d.error_replies);
        errors.insert(
            "connect_failed".to_string(),
            d.connect_failures() + d.login_failures,
        );
        errors.insert(
            "not_sent".to_string(),
            d.skipped_not_ready + d.skipped_busy + d.backed_off,
        );
        errors.insert("kicks".to_string(), d.kicks);
        errors.insert(
            "unanswered".to_string(),
            d.shakes_sent.saturating_sub(answered),
        );
        let error_count: u64 = errors.values().sum();
        let per_sec = |n: u64| {
            if seconds == 0 {
                0.0
            } else {
                n as f64 / seconds as f64
            }
        };
        let (instances, layers) = loads(self.watched, self.samples);
        let engines = self.engines.and_then(|(a, b)| engines(a, b));
        let mut step = StepRecord {
            offered_qps: self.offered_qps,
            achieved_qps: per_sec(ok),
            sent_qps: per_sec(d.shakes_sent),
            seconds,
            ended_early: None,
            latency,
            error_rate: error_count as f64 / offered.max(1) as f64,
            errors,
            layers,
            instances,
            engines,
            meets_slo: false,
            broken: Vec::new(),
            bottleneck: None,
        };
        judge(&mut step, self.slo, self.refusing_layer);
        step
    }
}

/// Per instance and per layer, from the probe's samples (the first is the baseline).
fn loads(watched: &[Watched], samples: &[Sample]) -> (Vec<InstanceLoad>, Vec<LayerLoad>) {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return (Vec::new(), Vec::new());
    };
    let span_s = (last.unix_ms.saturating_sub(first.unix_ms)) as f64 / 1000.0;
    let mut instances = Vec::new();
    for (k, watched) in watched.iter().enumerate() {
        let at = |s: &Sample| s.instances.get(k).cloned().unwrap_or_default();
        let rate = |a: u64, b: u64, secs: f64| {
            if secs > 0.0 {
                b.saturating_sub(a) as f64 / secs
            } else {
                0.0
            }
        };
        let (a, b) = (at(first), at(last));
        let mut cpu_peak = 0.0_f64;
        let mut net_peak = 0.0_f64;
        for pair in samples.windows(2) {
            let secs = (pair[1].unix_ms.saturating_sub(pair[0].unix_ms)) as f64 / 1000.0;
            let (x, y) = (at(&pair[0]), at(&pair[1]));
            cpu_peak = cpu_peak.max(rate(x.cpu_ms, y.cpu_ms, secs) / 1000.0);
            net_peak = net_peak.max(
                rate(x.net_in_bytes, y.net_in_bytes, secs)
                    + rate(x.net_out_bytes, y.net_out_bytes, secs),
            );
        }
        instances.push(InstanceLoad {
            layer: watched.layer.clone(),
            instance: watched.instance.clone(),
            pids: watched.pids.clone(),
            cpu_cores: rate(a.cpu_ms, b.cpu_ms, span_s) / 1000.0,
            cpu_peak_cores: cpu_peak,
            net_in_bytes_per_sec: watched
                .has_net
                .then(|| rate(a.net_in_bytes, b.net_in_bytes, span_s)),
            net_out_bytes_per_sec: watched
                .has_net
                .then(|| rate(a.net_out_bytes, b.net_out_bytes, span_s)),
            net_peak_bytes_per_sec: watched.has_net.then_some(net_peak),
        });
    }
    let mut layers: Vec<LayerLoad> = Vec::new();
    for i in &instances {
        let at = match layers.iter().position(|l| l.layer == i.layer) {
            Some(at) => at,
            None => {
                layers.push(LayerLoad {
                    layer: i.layer.clone(),
                    ..Default::default()
                });
                layers.len() - 1
            }
        };
        let l = &mut layers[at];
        l.instances += 1;
        l.cpu_cores += i.cpu_cores;
        l.cpu_max_instance_cores = l.cpu_max_instance_cores.max(i.cpu_cores);
        let add = |sum: &mut Option<f64>, v: Option<f64>| {
            if let Some(v) = v {
                *sum = Some(sum.unwrap_or(0.0) + v);
            }
        };
        add(&mut l.net_in_bytes_per_sec, i.net_in_bytes_per_sec);
        add(&mut l.net_out_bytes_per_sec, i.net_out_bytes_per_sec);
        add(&mut l.net_peak_bytes_per_sec, i.net_peak_bytes_per_sec);
    }
    (instances, layers)
}

fn engines(first: &Stamped, last: &Stamped) -> Option<EngineLoad> {
    let secs = (last.0.saturating_sub(first.0)) as f64 / 1000.0;
    if secs <= 0.0 {
        return None;
    }
    let d = last.1.since(&first.1);
    let redis: BTreeMap<String, f64> = d
        .redis_calls
        .iter()
        .map(|(k, v)| (k.clone(), *v as f64 / secs))
        .collect();
    Some(EngineLoad {
        redis_calls_per_sec_total: redis.values().sum(),
        redis_calls_per_sec: redis,
        pg_commits_per_sec: d.pg_commits as f64 / secs,
        pg_rows_written_per_sec: (d.pg_rows_inserted + d.pg_rows_updated) as f64 / secs,
    })
}

/// A layer's CPU limit per instance, cores: the SLO's, or one core.
pub(super) fn cpu_limit(slo: &Slo, layer: &str) -> (f64, bool) {
    match slo.cpu.get(layer) {
        Some(l) => (*l, true),
        None => (1.0, false),
    }
}

/// A count with thousands separators: 12,345.
pub(super) fn group(n: f64) -> String {
    let n = n.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Sets `meets_slo`, `broken` and `bottleneck`.
pub fn judge(step: &mut StepRecord, slo: &Slo, refusing_layer: &str) {
    let mut broken = Vec::new();
    if step.seconds == 0 {
        broken.push("no second was measured".to_string());
    }
    if step.latency.p99_ms > slo.p99_ms {
        broken.push(format!(
            "p99 {:.1} ms > {} ms",
            step.latency.p99_ms, slo.p99_ms
        ));
    }
    if let Some(mean) = slo.mean_ms {
        if step.latency.mean_ms > mean {
            broken.push(format!("mean {:.1} ms > {mean} ms", step.latency.mean_ms));
        }
    }
    if step.error_rate > slo.error_rate {
        let causes: Vec<String> = step
            .errors
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k} {}", group(*v as f64)))
            .collect();
        broken.push(format!(
            "errors {:.1}% > {:.1}% ({})",
            step.error_rate * 100.0,
            slo.error_rate * 100.0,
            causes.join(", ")
        ));
    }
    let floor = slo.min_achieved * step.offered_qps as f64;
    if step.achieved_qps < floor {
        broken.push(format!(
            "achieved {}/s < {:.0}% of {}/s",
            group(step.achieved_qps),
            slo.min_achieved * 100.0,
            group(step.offered_qps as f64)
        ));
    }
    for i in &step.instances {
        let (limit, given) = cpu_limit(slo, &i.layer);
        if given && i.cpu_cores > limit {
            broken.push(format!(
                "{} {} at {:.2} cores > {limit}",
                i.layer, i.instance, i.cpu_cores
            ));
        }
    }
    // The load and the machine are not layers under test: reported, never a bottleneck.
    let busiest = |layer: Option<&str>| {
        step.instances
            .iter()
            .filter(|i| !OBSERVERS.contains(&i.layer.as_str()))
            .filter(|i| layer.is_none_or(|l| l == i.layer))
            .map(|i| {
                let share = i.cpu_cores / cpu_limit(slo, &i.layer).0;
                Bottleneck {
                    layer: i.layer.clone(),
                    instance: i.instance.clone(),
                    pids: i.pids.clone(),
                    cpu_cores: i.cpu_cores,
                    share_of_limit: share,
                    cause: if share >= SATURATED { "cpu" } else { "busiest" }.to_string(),
                }
            })
            .max_by(|a, b| a.share_of_limit.total_cmp(&b.share_of_limit))
    };
    let offered = (step.offered_qps * step.seconds).max(1) as f64;
    let refused = *step.errors.get("overloaded").unwrap_or(&0) as f64 / offered;
    // No layer at its limit, yet the machine's cores nearly all busy: on one machine
    // the layers and the load share them, and that is the bound.
    let machine = step
        .layers
        .iter()
        .find(|l| l.layer == "machine")
        .map_or(0.0, |l| l.cpu_cores);
    let cores = cores();
    step.bottleneck = if refused > slo.error_rate / 2.0 {
        let mut b = busiest(Some(refusing_layer)).unwrap_or(Bottleneck {
            layer: refusing_layer.to_string(),
            instance: String::new(),
            ..Default::default()
        });
        b.cause = "overloaded".into();
        Some(b)
    } else {
        match busiest(None) {
            Some(b) if b.cause == "busiest" && machine >= MACHINE_SATURATED * cores => {
                Some(Bottleneck {
                    layer: "machine".into(),
                    instance: "all".into(),
                    pids: Vec::new(),
                    cpu_cores: machine,
                    share_of_limit: machine / cores,
                    cause: "machine".into(),
                })
            }
            other => other,
        }
    };
    step.meets_slo = broken.is_empty();
    step.broken = broken;
}

/// Whether a step still under way is clearly past the SLO (so it ends early): p99 over
/// four times the SLO's, errors over four times theirs (and over 20%), or under half the
/// offered rate achieved.
pub fn clearly_broken(step: &StepRecord, slo: &Slo) -> Option<String> {
    if step.seconds < 2 {
        return None;
    }
    if step.latency.p99_ms > 4.0 * slo.p99_ms {
        return Some(format!(
            "p99 {:.1} ms, over 4× the SLO's {} ms",
            step.latency.p99_ms, slo.p99_ms
        ));
    }
    if step.error_rate > (4.0 * slo.error_rate).max(0.2) {
        return Some(format!("errors {:.1}%", step.error_rate * 100.0));
    }
    if step.achieved_qps < 0.5 * step.offered_qps as f64 {
        return Some(format!(
            "achieved {}/s, under half of {}/s",
            group(step.achieved_qps),
            group(step.offered_qps as f64)
        ));
    }
    None
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The SLO the capacity tests judge by (also `sizing`'s).
    pub(in super::super) fn slo() -> Slo {
        Slo {
            p99_ms: 50.0,
            mean_ms: None,
            error_rate: 0.05,
            min_achieved: 0.95,
            cpu: [("gateway".to_string(), 0.5)].into(),
        }
    }

    #[test]
    fn a_busy_machine_is_the_bound_when_no_layer_is() {
        let layer = |name: &str, cpu: f64| LayerLoad {
            layer: name.into(),
            instances: 1,
            cpu_cores: cpu,
            cpu_max_instance_cores: cpu,
            ..Default::default()
        };
        let instance = |name: &str, cpu: f64| InstanceLoad {
            layer: name.into(),
            instance: "a".into(),
            cpu_cores: cpu,
            ..Default::default()
        };
        let mut step = StepRecord {
            offered_qps: 100,
            seconds: 2,
            achieved_qps: 80.0,
            layers: vec![layer("nginx", 0.4), layer("machine", 0.99 * cores())],
            instances: vec![instance("nginx", 0.4), instance("machine", 0.99 * cores())],
            ..Default::default()
        };
        judge(&mut step, &slo(), "gateway");
        let b = step.bottleneck.clone().unwrap();
        assert_eq!((b.layer.as_str(), b.cause.as_str()), ("machine", "machine"));
        step.layers[1].cpu_cores = 0.5 * cores();
        judge(&mut step, &slo(), "gateway");
        let b = step.bottleneck.unwrap();
        assert_eq!((b.layer.as_str(), b.cause.as_str()), ("nginx", "busiest"));
    }
}
