//! What a capacity run leaves besides summary.json: the seed-shaped table (printed and in
//! report.html), the linearity and plan tables, and the charts (achieved vs offered QPS,
//! p99 vs achieved QPS, CPU per layer vs offered QPS), the knee marked on each.

use std::fmt::Write as _;
use std::path::Path;

use hongbao_report::{escape, XyChart};

use super::judge::{group, StepRecord, OBSERVERS};
use super::knee::RunRecord;
use super::summary::Summary;

fn run_label(run: &RunRecord) -> String {
    format!("{} ×{}", run.stage, run.instances)
}

fn knee_step(run: &RunRecord) -> Option<&StepRecord> {
    let knee = run.knee.as_ref()?;
    run.steps.iter().find(|s| s.offered_qps == knee.offered_qps)
}

fn mib(bytes_per_sec: f64) -> String {
    format!("{:.1} MiB/s", bytes_per_sec / (1024.0 * 1024.0))
}

/// CPU per layer at a step: "gateway 0.62 (max 0.33), nginx 0.20".
fn cpu_cell(step: &StepRecord) -> String {
    step.layers
        .iter()
        .map(|l| {
            if l.instances > 1 {
                format!(
                    "{} {:.2} (max {:.2})",
                    l.layer, l.cpu_cores, l.cpu_max_instance_cores
                )
            } else {
                format!("{} {:.2}", l.layer, l.cpu_cores)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The busiest network of a step: the machine's (loopback included) or, per layer with
/// interfaces of its own, the peak in + out.
fn net_cell(step: &StepRecord) -> String {
    step.layers
        .iter()
        .filter_map(|l| Some((l, l.net_peak_bytes_per_sec?)))
        .map(|(l, peak)| format!("{} {}", l.layer, mib(peak)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows of the seed's table: stage, instances, QPS, response time, CPU per layer (cores),
/// network peak, note.
fn rows(summary: &Summary) -> Vec<[String; 7]> {
    summary
        .runs
        .iter()
        .map(|run| {
            let step = knee_step(run);
            [
                run.stage.clone(),
                format!("{} {}", run.instances, run.scaled_layer),
                run.knee
                    .as_ref()
                    .map_or("—".into(), |k| group(k.achieved_qps)),
                step.map_or("—".into(), |s| {
                    format!(
                        "p50 {:.1} / p99 {:.1} / mean {:.1} ms",
                        s.latency.p50_ms, s.latency.p99_ms, s.latency.mean_ms
                    )
                }),
                step.map_or("—".into(), cpu_cell),
                step.map_or("—".into(), net_cell),
                run.note.clone(),
            ]
        })
        .collect()
}

const HEADS: [&str; 7] = [
    "stage",
    "instances",
    "QPS at the knee",
    "response time",
    "CPU per layer (cores)",
    "network peak",
    "note",
];

/// The table as text lines, for the terminal.
pub fn table(summary: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", HEADS.join(" | "));
    for row in rows(summary) {
        let _ = writeln!(out, "{}", row.join(" | "));
    }
    for l in &summary.linearity {
        for r in &l.rows {
            let _ = writeln!(
                out,
                "linearity {} ×{}: {} /s against {} /s linear ({:.2}){}",
                l.stage,
                r.instances,
                group(r.knee_qps),
                group(r.linear_qps),
                r.ratio,
                if r.lower_bound {
                    " — a lower bound: every step met the SLO"
                } else {
                    ""
                }
            );
        }
    }
    if let Some(plan) = &summary.capacity_plan {
        for l in &plan.layers {
            let _ = writeln!(
                out,
                "plan for {}/s with {:.0}% headroom: {} × {} ({} /s each, {} from {})",
                group(plan.target_qps as f64),
                plan.headroom * 100.0,
                l.instances,
                l.layer,
                group(l.per_instance_qps),
                l.basis,
                l.from_run
            );
        }
    }
    out
}

fn html_table(page: &mut String, heads: &[&str], rows: &[Vec<String>]) {
    page.push_str("<table><tr>");
    for h in heads {
        let _ = write!(page, "<th>{}</th>", escape(h));
    }
    page.push_str("</tr>\n");
    for row in rows {
        page.push_str("<tr>");
        for cell in row {
            let _ = write!(page, "<td>{}</td>", escape(cell));
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</table>\n");
}

/// report.html: the tables, each run's steps, the charts.
pub fn html(summary: &Summary) -> String {
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>hongbao capacity: {}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;font-size:14px;text-align:left}}\
         th{{background:#f3f3f3}}img{{max-width:100%}}</style></head><body>\n\
         <h1>hongbao capacity: {}</h1>\n",
        escape(&summary.plan_name),
        escape(&summary.plan_name)
    );
    let slo = &summary.slo;
    let cpu: Vec<String> = slo
        .cpu
        .iter()
        .map(|(k, v)| format!("{k} ≤ {v} cores"))
        .collect();
    let _ = writeln!(
        page,
        "<p>SLO: p99 ≤ {} ms{}, errors ≤ {:.1}%, achieved ≥ {:.0}% of offered{}. \
         Machine: {} cores, {:.1} GiB, Linux {}. Load: {} users, steps of {} s after {} s settling. \
         Per-second series of the whole run: <a href=\"series/report.html\">series/report.html</a>.</p>",
        slo.p99_ms,
        slo.mean_ms.map(|m| format!(", mean ≤ {m} ms")).unwrap_or_default(),
        slo.error_rate * 100.0,
        slo.min_achieved * 100.0,
        if cpu.is_empty() { String::new() } else { format!(", CPU {}", cpu.join(", ")) },
        summary.machine.cores,
        summary.machine.memory_bytes as f64 / (1u64 << 30) as f64,
        escape(&summary.machine.kernel),
        summary.load.users,
        summary.load.step_secs,
        summary.load.settle_secs
    );
    page.push_str("<h2>Stages</h2>\n");
    let table_rows: Vec<Vec<String>> = rows(summary).into_iter().map(Vec::from).collect();
    html_table(&mut page, &HEADS, &table_rows);
    if !summary.linearity.is_empty() {
        page.push_str("<h2>Linearity</h2>\n");
        let mut rows = Vec::new();
        for l in &summary.linearity {
            for r in &l.rows {
                rows.push(vec![
                    l.stage.clone(),
                    format!("{} {}", r.instances, l.scaled_layer),
                    group(r.knee_qps),
                    group(r.linear_qps),
                    format!(
                        "{:.2}{}",
                        r.ratio,
                        if r.lower_bound {
                            " (a knee above the last step: raise the steps)"
                        } else {
                            ""
                        }
                    ),
                ]);
            }
        }
        html_table(
            &mut page,
            &[
                "stage",
                "instances",
                "QPS at the knee",
                "N × one instance",
                "ratio",
            ],
            &rows,
        );
    }
    if let Some(plan) = &summary.capacity_plan {
        let _ = writeln!(
            page,
            "<h2>Plan for {}/s with {:.0}% headroom</h2>",
            group(plan.target_qps as f64),
            plan.headroom * 100.0
        );
        let rows: Vec<Vec<String>> = plan
            .layers
            .iter()
            .map(|l| {
                vec![
                    l.layer.clone(),
                    l.instances.to_string(),
                    group(l.per_instance_qps),
                    l.basis.clone(),
                    l.from_run.clone(),
                ]
            })
            .collect();
        html_table(
            &mut page,
            &["layer", "instances", "QPS per instance", "basis", "from"],
            &rows,
        );
    }
    page.push_str("<h2>Charts</h2>\n");
    for chart in &summary.charts {
        let _ = writeln!(page, "<p><img src=\"{chart}.svg\" alt=\"{chart}\"></p>");
    }
    page.push_str("<h2>Steps</h2>\n");
    for run in &summary.runs {
        let _ = writeln!(
            page,
            "<h3>{}</h3><p>{}</p>",
            escape(&run_label(run)),
            escape(&run.note)
        );
        let rows: Vec<Vec<String>> = run
            .steps
            .iter()
            .map(|s| {
                let causes: Vec<String> = s
                    .errors
                    .iter()
                    .filter(|(_, v)| **v > 0)
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                vec![
                    group(s.offered_qps as f64),
                    group(s.achieved_qps),
                    format!("{:.2}", s.latency.p50_ms),
                    format!("{:.2}", s.latency.p99_ms),
                    format!("{:.2}", s.latency.p999_ms),
                    format!("{:.2}% {}", s.error_rate * 100.0, causes.join(", ")),
                    cpu_cell(s),
                    net_cell(s),
                    s.engines.as_ref().map_or(String::new(), |e| {
                        format!(
                            "redis {} calls/s, pg {} commits/s",
                            group(e.redis_calls_per_sec_total),
                            group(e.pg_commits_per_sec)
                        )
                    }),
                    if s.meets_slo {
                        "meets".into()
                    } else {
                        s.broken.join("; ")
                    },
                ]
            })
            .collect();
        html_table(
            &mut page,
            &[
                "offered/s",
                "achieved/s",
                "p50 ms",
                "p99 ms",
                "p99.9 ms",
                "errors",
                "CPU (cores)",
                "network peak",
                "engines",
                "SLO",
            ],
            &rows,
        );
    }
    page.push_str("</body></html>\n");
    page
}

/// A line per run: a point per step.
fn per_run(
    runs: &[&RunRecord],
    point: impl Fn(&StepRecord) -> (f64, f64),
) -> Vec<(String, Vec<(f64, f64)>)> {
    runs.iter()
        .map(|r| (run_label(r), r.steps.iter().map(&point).collect()))
        .collect()
}

/// Writes the charts; returns their names.
pub fn charts(dir: &Path, summary: &Summary) -> crate::Result<Vec<String>> {
    let runs: Vec<&RunRecord> = summary
        .runs
        .iter()
        .filter(|r| !r.steps.is_empty())
        .collect();
    // Runs whose knees fall on the same x share one mark, so labels do not overprint.
    let knee_marks = |x: &dyn Fn(&RunRecord) -> Option<f64>| {
        let mut marks: Vec<(f64, Vec<String>)> = Vec::new();
        for r in &runs {
            let Some(at) = x(r) else { continue };
            match marks.iter_mut().find(|(m, _)| (*m - at).abs() < 1e-9) {
                Some((_, labels)) => labels.push(run_label(r)),
                None => marks.push((at, vec![run_label(r)])),
            }
        }
        marks
            .into_iter()
            .map(|(at, labels)| match labels.len() {
                1 => (at, format!("knee {}", labels[0])),
                n => (at, format!("knee of {n} runs")),
            })
            .collect::<Vec<_>>()
    };
    let mut names = Vec::new();
    let top = runs
        .iter()
        .flat_map(|r| r.steps.iter().map(|s| s.offered_qps as f64))
        .fold(0.0_f64, f64::max);
    let qps = XyChart {
        title: "Achieved vs offered QPS".into(),
        x_label: "offered QPS",
        y_label: "achieved QPS",
        lines: per_run(&runs, |s| (s.offered_qps as f64, s.achieved_qps)),
        references: vec![("offered".into(), vec![(0.0, 0.0), (top, top)])],
        marks: knee_marks(&|r| r.knee.as_ref().map(|k| k.offered_qps as f64)),
        ..Default::default()
    };
    qps.write(dir, "capacity_qps")?;
    names.push("capacity_qps".to_string());
    let top_achieved = runs
        .iter()
        .flat_map(|r| r.steps.iter().map(|s| s.achieved_qps))
        .fold(0.0_f64, f64::max);
    let latency = XyChart {
        title: "p99 latency vs achieved QPS".into(),
        x_label: "achieved QPS",
        y_label: "p99 ms (from intended send time)",
        log_y: true,
        lines: per_run(&runs, |s| (s.achieved_qps, s.latency.p99_ms)),
        references: vec![(
            "SLO p99".into(),
            vec![
                (0.0, summary.slo.p99_ms),
                (top_achieved, summary.slo.p99_ms),
            ],
        )],
        marks: knee_marks(&|r| r.knee.as_ref().map(|k| k.achieved_qps)),
    };
    latency.write(dir, "capacity_latency")?;
    names.push("capacity_latency".to_string());
    for (k, run) in runs.iter().enumerate() {
        let mut layers: Vec<String> = Vec::new();
        for s in &run.steps {
            for l in &s.layers {
                if !layers.contains(&l.layer) && l.layer != "machine" {
                    layers.push(l.layer.clone());
                }
            }
        }
        let lines = layers
            .iter()
            .map(|name| {
                let points = run
                    .steps
                    .iter()
                    .filter_map(|s| {
                        let l = s.layers.iter().find(|l| &l.layer == name)?;
                        Some((s.offered_qps as f64, l.cpu_cores))
                    })
                    .collect();
                let label = if OBSERVERS.contains(&name.as_str()) {
                    format!("{name} (not under test)")
                } else {
                    name.clone()
                };
                (label, points)
            })
            .collect();
        let cpu = XyChart {
            title: format!("CPU per layer vs offered QPS: {}", run_label(run)),
            x_label: "offered QPS",
            y_label: "CPU (cores)",
            lines,
            marks: run
                .knee
                .as_ref()
                .map(|kn| vec![(kn.offered_qps as f64, "knee".to_string())])
                .unwrap_or_default(),
            ..Default::default()
        };
        let name = format!("capacity_cpu_{k}");
        cpu.write(dir, &name)?;
        names.push(name);
    }
    Ok(names)
}
