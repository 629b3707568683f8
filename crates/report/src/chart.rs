//! Which charts exist and what goes on each: turns a [`Series`] or a [`Broadcast`] into a
//! [`Plot`], a backend-free description (lines, axes, phase marks) that `draw.rs` hands to
//! plotters. Keeping the choice of data apart from the drawing lets tests check the data
//! without parsing SVG, and lets the SVG and PNG copies come from one description.

use serde::Serialize;

use crate::broadcast::Broadcast;
use crate::series::{PhaseStart, Role, Series};

/// A chart's name (file stem, URL path, element id) and its title.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ChartInfo {
    pub name: &'static str,
    pub title: &'static str,
}

/// The fixed charts, in the order pages show them. Broadcast charts come after, one per
/// broadcast (see [`chart_list`]).
pub const CHARTS: &[ChartInfo] = &[
    ChartInfo {
        name: "qps",
        title: "Client QPS vs server QPS",
    },
    ChartInfo {
        name: "shake_packets",
        title: "Shake packets released/s vs won/s",
    },
    ChartInfo {
        name: "send_packets",
        title: "Send packets created/s and shares opened/s",
    },
    ChartInfo {
        name: "latency",
        title: "Shake latency p50/p99/max",
    },
    ChartInfo {
        name: "connections",
        title: "Connections",
    },
    ChartInfo {
        name: "cpu",
        title: "CPU per role",
    },
    ChartInfo {
        name: "memory",
        title: "Memory per role",
    },
    ChartInfo {
        name: "network",
        title: "Network packets/s",
    },
];

/// A chart as listed to the dashboard (`GET /v1/charts` answers a JSON array of these).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChartEntry {
    pub name: String,
    pub title: String,
}

/// The fixed charts followed by one per broadcast.
pub fn chart_list(broadcasts: &[Broadcast]) -> Vec<ChartEntry> {
    let fixed = CHARTS.iter().map(|c| ChartEntry {
        name: c.name.to_string(),
        title: c.title.to_string(),
    });
    let per_broadcast = broadcasts.iter().map(|b| ChartEntry {
        name: b.chart_name(),
        title: b.chart_title(),
    });
    fixed.chain(per_broadcast).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum YScale {
    /// From zero: counts, levels, cores, bytes.
    Linear,
    /// Latency, where the max can be a thousand times the median; values ≤ 0 are left out.
    Log,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stroke {
    Solid,
    /// A reference level rather than a measurement.
    Dashed,
}

/// One legend entry and its points, as runs to join with lines.
#[derive(Clone, Debug)]
pub(crate) struct Line {
    pub label: String,
    pub stroke: Stroke,
    pub segments: Vec<Vec<(f64, f64)>>,
}

impl Line {
    fn has_data(&self) -> bool {
        self.segments.iter().any(|s| !s.is_empty())
    }
}

/// Everything needed to draw one chart.
#[derive(Clone, Debug)]
pub(crate) struct Plot {
    pub title: String,
    pub x_label: &'static str,
    pub y_label: &'static str,
    pub y_scale: YScale,
    /// The x axis runs from 0 to here.
    pub x_max: f64,
    pub lines: Vec<Line>,
    pub phases: Vec<PhaseStart>,
    /// Faults done by `hongbao bench --chaos`, shaded where they fell.
    pub faults: Vec<FaultSpan>,
}

/// The phase label a fault done by `hongbao bench --chaos` has on the series, before its
/// kind: `chaos:worker-kill` from its start until its heal (the phase's own name again).
pub const CHAOS_PHASE: &str = "chaos:";

/// A fault as the series marks it, in seconds since the first row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FaultSpan {
    pub from: f64,
    pub to: f64,
    pub kind: String,
}

/// The series' phase starts worth a line (a phase taken up again after a fault is not a
/// new one) and its faults' spans (the last one, still under way, to the series' end).
fn marks(series: &Series) -> (Vec<PhaseStart>, Vec<FaultSpan>) {
    let (mut phases, mut faults) = (Vec::<PhaseStart>::new(), Vec::<FaultSpan>::new());
    let mut open: Option<FaultSpan> = None;
    for start in series.phase_starts() {
        if let Some(mut fault) = open.take() {
            fault.to = start.second;
            faults.push(fault);
        }
        if let Some(kind) = start.label.strip_prefix(CHAOS_PHASE) {
            open = Some(FaultSpan {
                from: start.second,
                to: series.span_seconds() as f64,
                kind: kind.to_string(),
            });
        } else if phases.last().map(|p| &p.label) != Some(&start.label) {
            phases.push(start);
        }
    }
    faults.extend(open);
    (phases, faults)
}

impl Plot {
    pub fn has_data(&self) -> bool {
        self.lines.iter().any(Line::has_data)
    }
}

/// One line of a fixed chart: a role's column, times `scale` (for units).
struct LineSpec {
    role: Role,
    column: &'static str,
    label: &'static str,
    scale: f64,
}

const fn line(role: Role, column: &'static str, label: &'static str) -> LineSpec {
    LineSpec {
        role,
        column,
        label,
        scale: 1.0,
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// What a fixed chart plots: y axis label, scale and lines.
fn fixed_spec(name: &str) -> Option<(&'static str, YScale, Vec<LineSpec>)> {
    use Role::{Core, Host, Load, Server};
    let per_role = |column: &'static str, scale: f64| {
        [(Server, "server"), (Core, "core"), (Load, "load")]
            .into_iter()
            .map(|(role, label)| LineSpec {
                role,
                column,
                label,
                scale,
            })
            .collect::<Vec<_>>()
    };
    let spec = match name {
        "qps" => (
            "shakes per second",
            YScale::Linear,
            vec![
                line(Load, "shakes", "client shakes sent/s"),
                line(Server, "shakes", "server shakes received/s"),
            ],
        ),
        "shake_packets" => (
            "packets per second",
            YScale::Linear,
            vec![
                line(Core, "packets_released", "packets released/s"),
                line(Core, "packets_won", "packets won/s"),
            ],
        ),
        "send_packets" => (
            "packets or shares per second",
            YScale::Linear,
            vec![
                line(Core, "send_packets", "send packets created/s"),
                line(Core, "shares_opened", "shares opened/s"),
            ],
        ),
        "latency" => (
            "shake latency (ms, log scale)",
            YScale::Log,
            vec![
                line(Load, "latency_p50_ms", "p50"),
                line(Load, "latency_p99_ms", "p99"),
                line(Load, "latency_max_ms", "max"),
            ],
        ),
        "connections" => (
            "connections",
            YScale::Linear,
            vec![
                line(Load, "connections", "clients connected"),
                line(Server, "connections", "server connections"),
            ],
        ),
        "cpu" => ("CPU (cores)", YScale::Linear, {
            // The machine's busy time beside the roles': the gap is everyone else's.
            let mut lines = per_role("cpu_seconds", 1.0);
            lines.push(LineSpec {
                role: Host,
                column: "cpu_seconds",
                label: "machine",
                scale: 1.0,
            });
            lines
        }),
        "memory" => (
            "resident memory (MiB)",
            YScale::Linear,
            per_role("rss_bytes", 1.0 / MIB),
        ),
        "network" => (
            "packets per second",
            YScale::Linear,
            vec![
                line(Host, "net_rx_packets", "rx packets/s"),
                line(Host, "net_tx_packets", "tx packets/s"),
            ],
        ),
        _ => return None,
    };
    Some(spec)
}

/// The named chart's plot; `None` for a name that is neither fixed nor a given broadcast.
pub(crate) fn plot(series: &Series, broadcasts: &[Broadcast], name: &str) -> Option<Plot> {
    if let Some(info) = CHARTS.iter().find(|c| c.name == name) {
        return fixed_plot(series, info);
    }
    let id: u64 = name.strip_prefix("broadcast_")?.parse().ok()?;
    broadcasts.iter().find(|b| b.id == id).map(broadcast_plot)
}

fn fixed_plot(series: &Series, info: &ChartInfo) -> Option<Plot> {
    let (y_label, y_scale, specs) = fixed_spec(info.name)?;
    let lines = specs
        .iter()
        .map(|spec| {
            let mut segments = series.segments(spec.role, spec.column);
            for point in segments.iter_mut().flatten() {
                point.1 *= spec.scale;
            }
            if y_scale == YScale::Log {
                segments = positive_runs(segments);
            }
            let mut label = spec.label.to_string();
            if segments.is_empty() {
                label.push_str(" (no data)");
            }
            Line {
                label,
                stroke: Stroke::Solid,
                segments,
            }
        })
        .collect();
    let (phases, faults) = marks(series);
    Some(Plot {
        title: info.title.to_string(),
        x_label: "seconds",
        y_label,
        y_scale,
        x_max: series.span_seconds().max(1) as f64,
        lines,
        phases,
        faults,
    })
}

/// Splits runs where a value cannot go on a log axis.
fn positive_runs(segments: Vec<Vec<(f64, f64)>>) -> Vec<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    for segment in segments {
        let mut run = Vec::new();
        for point in segment {
            if point.1 > 0.0 {
                run.push(point);
            } else if !run.is_empty() {
                out.push(std::mem::take(&mut run));
            }
        }
        if !run.is_empty() {
            out.push(run);
        }
    }
    out
}

fn broadcast_plot(broadcast: &Broadcast) -> Plot {
    // The curve is cumulative and only changes at the recorded points, so draw it as
    // steps from (0, 0) at the stamp rather than as slopes between samples.
    let mut curve = vec![(0.0, 0.0)];
    let mut delivered = 0.0;
    for &(ms, count) in &broadcast.cdf {
        let ms = ms.max(0.0);
        curve.push((ms, delivered));
        delivered = count as f64;
        curve.push((ms, delivered));
    }
    let last_ms = broadcast.cdf.last().map_or(0.0, |p| p.0);
    let x_max = last_ms.max(broadcast.complete_ms).max(1.0) * 1.05;
    if let Some(&(_, y)) = curve.last() {
        curve.push((x_max, y));
    }
    let mut lines = vec![Line {
        label: format!(
            "delivered ({} of {})",
            broadcast.delivered, broadcast.connections
        ),
        stroke: Stroke::Solid,
        segments: if broadcast.cdf.is_empty() {
            Vec::new()
        } else {
            vec![curve]
        },
    }];
    if broadcast.connections > 0 {
        let all = broadcast.connections as f64;
        lines.push(Line {
            label: "connections".to_string(),
            stroke: Stroke::Dashed,
            segments: vec![vec![(0.0, all), (x_max, all)]],
        });
    }
    Plot {
        title: broadcast.chart_title(),
        x_label: "ms since the server's send stamp",
        y_label: "connections delivered",
        y_scale: YScale::Linear,
        x_max,
        lines,
        phases: Vec::new(),
        faults: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_chart_has_a_spec() {
        for info in CHARTS {
            assert!(fixed_spec(info.name).is_some(), "{}", info.name);
        }
        assert_eq!(CHARTS.len(), 8);
    }

    #[test]
    fn memory_is_in_mib_and_absent_roles_say_so() {
        let csv = "unix_second,role,rss_bytes\n10,server,2097152\n11,server,3145728\n";
        let series = Series::from_csv(csv).unwrap();
        let plot = plot(&series, &[], "memory").unwrap();
        assert_eq!(plot.lines[0].segments, vec![vec![(0.0, 2.0), (1.0, 3.0)]]);
        assert_eq!(plot.lines[1].label, "core (no data)");
        assert!(plot.has_data());
    }

    #[test]
    fn chaos_faults_are_spans_and_the_phase_taken_up_again_is_no_new_phase() {
        let csv = "unix_second,role,phase,shakes\n\
            100,load,start,1\n101,load,qps-500,1\n102,load,qps-500,1\n\
            103,load,chaos:worker-kill,1\n104,load,chaos:worker-kill,1\n105,load,qps-500,1\n\
            106,load,chaos:gateway,1\n107,load,qps-500,1\n108,load,chaos:partition-redis,1\n\
            110,load,chaos:partition-redis,1\n";
        let series = Series::from_csv(csv).unwrap();
        let plot = plot(&series, &[], "qps").unwrap();
        let phases: Vec<(f64, &str)> = plot
            .phases
            .iter()
            .map(|p| (p.second, p.label.as_str()))
            .collect();
        assert_eq!(phases, [(0.0, "start"), (1.0, "qps-500")]);
        let span = |from, to, kind: &str| FaultSpan {
            from,
            to,
            kind: kind.to_string(),
        };
        assert_eq!(
            plot.faults,
            [
                span(3.0, 5.0, "worker-kill"),
                span(6.0, 7.0, "gateway"),
                // Still under way when the series ends.
                span(8.0, 10.0, "partition-redis"),
            ]
        );
        crate::draw::svg(&plot).unwrap();
    }

    #[test]
    fn log_charts_leave_out_zeros() {
        let csv = "unix_second,role,latency_p50_ms\n1,load,0.5\n2,load,0\n3,load,0.7\n4,load,\n";
        let series = Series::from_csv(csv).unwrap();
        let plot = plot(&series, &[], "latency").unwrap();
        assert_eq!(
            plot.lines[0].segments,
            vec![vec![(0.0, 0.5)], vec![(2.0, 0.7)]]
        );
    }

    #[test]
    fn broadcast_curves_are_steps_from_the_stamp() {
        let broadcast = Broadcast {
            id: 9,
            connections: 3,
            delivered: 3,
            complete_ms: 2.0,
            cdf: vec![(1.0, 2), (2.0, 3)],
            ..Broadcast::default()
        };
        let plot = plot(&Series::default(), &[broadcast], "broadcast_9").unwrap();
        let x_max = plot.x_max;
        assert_eq!(
            plot.lines[0].segments[0],
            vec![
                (0.0, 0.0),
                (1.0, 0.0),
                (1.0, 2.0),
                (2.0, 2.0),
                (2.0, 3.0),
                (x_max, 3.0)
            ]
        );
        assert_eq!(plot.lines[1].stroke, Stroke::Dashed);
        assert!(super::plot(&Series::default(), &[], "broadcast_9").is_none());
        assert!(super::plot(&Series::default(), &[], "broadcast_x").is_none());
    }

    #[test]
    fn chart_list_appends_broadcasts() {
        let list = chart_list(&[Broadcast {
            id: 2,
            ..Broadcast::default()
        }]);
        assert_eq!(list.len(), CHARTS.len() + 1);
        assert_eq!(list.last().unwrap().name, "broadcast_2");
        assert_eq!(list.last().unwrap().title, "Broadcast 2 delivery");
    }
}
