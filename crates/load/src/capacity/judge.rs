//! What a step measured and whether it met the SLO; the knee of a run, the linearity of a
//! scaling stage and the instances per layer for a target. No I/O: the load's rows and
//! the probe's samples in, the records of `summary.json` out (docs/capacity.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::plan::{Slo, Target};
use super::probe::{Sample, Watched};
use crate::coordinator::Row;
use crate::report;
use hongbao_lab::EngineCounters;

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

fn cores() -> f64 {
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
fn cpu_limit(slo: &Slo, layer: &str) -> (f64, bool) {
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

/// " (pid 12)", " (pids 12, 13)", or nothing.
fn pids(pids: &[u32]) -> String {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    match list.len() {
        0 => String::new(),
        1 => format!(" (pid {})", list[0]),
        _ => format!(" (pids {})", list.join(", ")),
    }
}

/// One stage at one instance count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub stage: String,
    pub layers: String,
    pub scaled_layer: String,
    pub instances: u32,
    pub steps: Vec<StepRecord>,
    /// The highest step that met the SLO (every step below it met it too).
    pub knee: Option<Knee>,
    /// The first step that did not (the run's last step).
    pub broke_at: Option<Broke>,
    /// One line: the knee and what broke.
    pub note: String,
    /// Set when the stage could not run (its layers did not come up).
    pub failed: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    pub offered_qps: u64,
    pub achieved_qps: f64,
    pub p99_ms: f64,
    /// Every step met the SLO: the real knee is higher than the plan's steps reached.
    pub lower_bound: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Broke {
    pub offered_qps: u64,
    pub reasons: Vec<String>,
    pub bottleneck: Option<Bottleneck>,
}

impl RunRecord {
    /// The knee, what broke and the note, from the steps.
    pub fn conclude(&mut self) {
        let first_bad = self.steps.iter().position(|s| !s.meets_slo);
        let good = first_bad.unwrap_or(self.steps.len());
        self.knee = good.checked_sub(1).map(|k| {
            let s = &self.steps[k];
            Knee {
                offered_qps: s.offered_qps,
                achieved_qps: s.achieved_qps,
                p99_ms: s.latency.p99_ms,
                lower_bound: first_bad.is_none(),
            }
        });
        self.broke_at = first_bad.map(|b| {
            let s = &self.steps[b];
            Broke {
                offered_qps: s.offered_qps,
                reasons: s.broken.clone(),
                bottleneck: s.bottleneck.clone(),
            }
        });
        let knee = match &self.knee {
            Some(k) => format!(
                "knee {}/s (achieved {}/s, p99 {:.1} ms)",
                group(k.offered_qps as f64),
                group(k.achieved_qps),
                k.p99_ms
            ),
            None => "no step met the SLO".to_string(),
        };
        let broke = match &self.broke_at {
            Some(b) => {
                let by = b
                    .bottleneck
                    .as_ref()
                    .map(|n| match n.cause.as_str() {
                        "overloaded" => format!("; {} refused (overloaded)", n.layer),
                        "cpu" => format!(
                            "; bound by {} {}{} at {:.2} cores",
                            n.layer,
                            n.instance,
                            pids(&n.pids),
                            n.cpu_cores
                        ),
                        "machine" => format!(
                            "; no layer at its CPU limit, the machine is: {:.2} of {} cores busy",
                            n.cpu_cores,
                            cores()
                        ),
                        _ => format!(
                            "; no layer at its CPU limit (busiest {} {}{} at {:.2} cores)",
                            n.layer,
                            n.instance,
                            pids(&n.pids),
                            n.cpu_cores
                        ),
                    })
                    .unwrap_or_default();
                format!(
                    "; at {}/s: {}{by}",
                    group(b.offered_qps as f64),
                    b.reasons.join("; ")
                )
            }
            None => "; every step met the SLO (the knee is above the last step)".to_string(),
        };
        self.note = format!("{knee}{broke}");
    }
}

/// Measured QPS at the knee against N × the single instance's, per instance count of a
/// scaling stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Linearity {
    pub stage: String,
    pub scaled_layer: String,
    pub rows: Vec<LinearityRow>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinearityRow {
    pub instances: u32,
    pub knee_qps: f64,
    /// instances × the smallest count's knee per instance.
    pub linear_qps: f64,
    /// knee ÷ linear.
    pub ratio: f64,
    /// This knee, or the smallest count's, is a lower bound (every step met the SLO):
    /// the ratio says little.
    pub lower_bound: bool,
}

/// Linearity of each stage run at more than one instance count.
pub fn linearity(runs: &[RunRecord]) -> Vec<Linearity> {
    let mut out: Vec<Linearity> = Vec::new();
    for run in runs {
        let knee = run.knee.as_ref().map_or(0.0, |k| k.achieved_qps);
        let lower_bound = run.knee.as_ref().is_some_and(|k| k.lower_bound);
        match out.iter_mut().find(|l| l.stage == run.stage) {
            Some(l) => l.rows.push(LinearityRow {
                instances: run.instances,
                knee_qps: knee,
                lower_bound,
                ..Default::default()
            }),
            None => out.push(Linearity {
                stage: run.stage.clone(),
                scaled_layer: run.scaled_layer.clone(),
                rows: vec![LinearityRow {
                    instances: run.instances,
                    knee_qps: knee,
                    lower_bound,
                    ..Default::default()
                }],
            }),
        }
    }
    out.retain(|l| l.rows.len() > 1);
    for l in &mut out {
        let base = &l.rows[0];
        let per_instance = base.knee_qps / base.instances as f64;
        let base_bound = base.lower_bound;
        for row in &mut l.rows {
            row.linear_qps = per_instance * row.instances as f64;
            row.lower_bound |= base_bound;
            row.ratio = if row.linear_qps > 0.0 {
                row.knee_qps / row.linear_qps
            } else {
                0.0
            };
        }
    }
    out
}

/// Instances of each layer for the target.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CapacityPlan {
    pub target_qps: u64,
    pub headroom: f64,
    pub layers: Vec<LayerPlan>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerPlan {
    pub layer: String,
    /// QPS one instance carries within the SLO (the lowest estimate over the runs).
    pub per_instance_qps: f64,
    /// `measured`: the run's knee, bounded by this layer; `projected`: the knee's QPS
    /// per instance scaled by the layer's CPU limit ÷ its busiest instance's CPU there.
    pub basis: String,
    /// The run the estimate comes from ("stage ×N").
    pub from_run: String,
    /// ceil(target × (1 + headroom) ÷ per_instance_qps).
    pub instances: u64,
}

/// Per layer: the lowest per-instance capacity any run with a knee shows.
pub fn capacity_plan(runs: &[RunRecord], slo: &Slo, target: &Target) -> CapacityPlan {
    let mut best: BTreeMap<String, LayerPlan> = BTreeMap::new();
    for run in runs {
        let Some(knee) = &run.knee else { continue };
        let Some(step) = run.steps.iter().find(|s| s.offered_qps == knee.offered_qps) else {
            continue;
        };
        let bound = run
            .broke_at
            .as_ref()
            .and_then(|b| b.bottleneck.as_ref())
            .filter(|b| b.cause != "busiest")
            .map(|b| b.layer.clone());
        for layer in &step.layers {
            if OBSERVERS.contains(&layer.layer.as_str()) || layer.instances == 0 {
                continue;
            }
            let per_instance_at_knee = knee.achieved_qps / layer.instances as f64;
            let (estimate, basis) = if bound.as_deref() == Some(layer.layer.as_str()) {
                (per_instance_at_knee, "measured")
            } else if layer.cpu_max_instance_cores > 0.02 {
                let (limit, _) = cpu_limit(slo, &layer.layer);
                (
                    per_instance_at_knee * limit / layer.cpu_max_instance_cores,
                    "projected",
                )
            } else {
                continue;
            };
            if estimate <= 0.0 {
                continue;
            }
            let entry = LayerPlan {
                layer: layer.layer.clone(),
                per_instance_qps: estimate,
                basis: basis.to_string(),
                from_run: format!("{} ×{}", run.stage, run.instances),
                instances: 0,
            };
            match best.get(&layer.layer) {
                Some(b) if b.per_instance_qps <= estimate => {}
                _ => {
                    best.insert(layer.layer.clone(), entry);
                }
            }
        }
    }
    let need = target.qps as f64 * (1.0 + target.headroom);
    CapacityPlan {
        target_qps: target.qps,
        headroom: target.headroom,
        layers: best
            .into_values()
            .map(|mut l| {
                l.instances = (need / l.per_instance_qps).ceil().max(1.0) as u64;
                l
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::probe::{InstanceSample, Watched};
    use super::*;
    use crate::report::Counters;

    fn slo() -> Slo {
        Slo {
            p99_ms: 50.0,
            mean_ms: None,
            error_rate: 0.05,
            min_achieved: 0.95,
            cpu: [("gateway".to_string(), 0.5)].into(),
        }
    }

    fn row(second: u64, qps: u64, sent: u64, nothing: u64, overloaded: u64, lat_us: u64) -> Row {
        Row {
            second,
            target_qps: qps,
            counters: Counters {
                shakes_sent: sent,
                shake_replies: nothing + overloaded,
                nothing,
                overloaded,
                ..Default::default()
            },
            shake_latency: vec![(lat_us, qps)],
            ..Default::default()
        }
    }

    fn watched() -> Vec<Watched> {
        vec![
            Watched {
                layer: "gateway".into(),
                instance: "w0".into(),
                pids: vec![7],
                has_net: true,
            },
            Watched {
                layer: "load".into(),
                instance: "p0".into(),
                pids: vec![9],
                has_net: false,
            },
        ]
    }

    fn samples(cpu_ms_per_sec: u64, secs: u64) -> Vec<Sample> {
        (0..=secs)
            .map(|s| Sample {
                unix_ms: 1_000_000 + s * 1000,
                instances: vec![
                    InstanceSample {
                        cpu_ms: s * cpu_ms_per_sec,
                        net_in_bytes: s * 1000,
                        net_out_bytes: s * 3000,
                    },
                    InstanceSample {
                        cpu_ms: s * 900,
                        ..Default::default()
                    },
                ],
            })
            .collect()
    }

    #[test]
    fn a_step_within_the_slo_and_one_past_it() {
        let slo = slo();
        let before = row(0, 1000, 0, 0, 0, 1000);
        let rows = [
            row(1, 1000, 1000, 1000, 0, 2000),
            row(2, 1000, 2000, 2000, 0, 3000),
        ];
        let s = samples(300, 2);
        let watched = watched();
        let w = Window {
            offered_qps: 1000,
            rows: &rows,
            before: &before,
            watched: &watched,
            samples: &s,
            engines: None,
            slo: &slo,
            refusing_layer: "gateway",
        };
        let good = w.record();
        assert!(good.meets_slo, "{:?}", good.broken);
        assert_eq!(good.achieved_qps, 1000.0);
        assert!((good.latency.p99_ms - 3.0).abs() < 0.01);
        assert!((good.instances[0].cpu_cores - 0.3).abs() < 1e-9);
        assert_eq!(good.instances[0].net_in_bytes_per_sec, Some(1000.0));
        assert_eq!(good.instances[0].net_peak_bytes_per_sec, Some(4000.0));
        assert_eq!(good.instances[1].net_in_bytes_per_sec, None);
        let b = good.bottleneck.as_ref().unwrap();
        assert_eq!((b.layer.as_str(), b.share_of_limit), ("gateway", 0.6));
        assert_eq!(b.cause, "busiest");

        // 2,000 offered, 1,200 answered, 800 overloaded, a slow p99, a hot gateway.
        let rows = [
            row(1, 2000, 2000, 600, 400, 80_000),
            row(2, 2000, 4000, 1200, 800, 80_000),
        ];
        let s = samples(700, 2);
        let bad = Window {
            offered_qps: 2000,
            rows: &rows,
            samples: &s,
            ..w
        }
        .record();
        assert!(!bad.meets_slo);
        let text = bad.broken.join(" | ");
        for needle in [
            "p99 80.",
            "errors 70.0% > 5.0% (overloaded 800, unanswered 2,000)",
            "achieved 600/s < 95% of 2,000/s",
            "gateway w0 at 0.70 cores > 0.5",
        ] {
            assert!(text.contains(needle), "{needle} in {text}");
        }
        assert!(clearly_broken(&bad, &slo).is_some());
        assert!(clearly_broken(&good, &slo).is_none());

        let mut run = RunRecord {
            stage: "app".into(),
            instances: 1,
            steps: vec![good.clone(), bad.clone()],
            ..Default::default()
        };
        run.conclude();
        assert_eq!(run.knee.as_ref().unwrap().offered_qps, 1000);
        assert_eq!(run.broke_at.as_ref().unwrap().offered_qps, 2000);
        assert!(run.note.starts_with("knee 1,000/s"), "{}", run.note);
        assert!(
            run.note.contains("gateway refused (overloaded)"),
            "{}",
            run.note
        );

        let plan = capacity_plan(
            &[run.clone()],
            &slo,
            &Target {
                qps: 10_000,
                headroom: 0.3,
            },
        );
        // Bounded by the gateway: measured 1,000/s per instance → 13 for 13,000.
        assert_eq!(plan.layers.len(), 1);
        assert_eq!(plan.layers[0].basis, "measured");
        assert_eq!(plan.layers[0].instances, 13);

        let mut run2 = run.clone();
        run2.instances = 2;
        run2.knee.as_mut().unwrap().achieved_qps = 1800.0;
        let lin = linearity(&[run, run2]);
        assert_eq!(lin.len(), 1);
        assert_eq!(lin[0].rows[1].linear_qps, 2000.0);
        assert!((lin[0].rows[1].ratio - 0.9).abs() < 1e-9);
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

    #[test]
    fn a_run_whose_first_step_fails_has_no_knee() {
        let mut run = RunRecord {
            steps: vec![StepRecord {
                offered_qps: 10,
                meets_slo: false,
                broken: vec!["x".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        run.conclude();
        assert!(run.knee.is_none());
        assert!(run.note.starts_with("no step met the SLO"));
    }
}
