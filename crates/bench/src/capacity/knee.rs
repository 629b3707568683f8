//! A run's knee: one stage at one instance count, read from its steps — the highest step
//! that met the SLO, the first that did not, and one line saying what broke. No I/O.

use serde::{Deserialize, Serialize};

use super::judge::{cores, group, Bottleneck, StepRecord};

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

#[cfg(test)]
mod tests {
    use super::*;

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
