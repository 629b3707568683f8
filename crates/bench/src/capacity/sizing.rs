//! What the runs say together: how a scaling stage's knee grows with its instance count
//! (linearity), and how many instances of each layer a target QPS needs. No I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::judge::{cpu_limit, OBSERVERS};
use super::knee::RunRecord;
use super::plan::{Slo, Target};

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
    use super::super::judge::tests::slo;
    use super::super::judge::{clearly_broken, Window};
    use super::super::probe::{InstanceSample, Sample, Watched};
    use super::*;
    use hongbao_load::coordinator::Row;
    use hongbao_load::report::Counters;

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
}
