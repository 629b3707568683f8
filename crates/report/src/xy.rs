//! Charts of one quantity against another (not against time): `hongbao capacity`'s
//! achieved vs offered QPS, latency vs QPS and CPU vs QPS, a line per stage, with marks
//! (the knees) as labelled vertical lines. The same drawing as the series charts.

use std::path::Path;

use crate::chart::{Line, Plot, Stroke, YScale};
use crate::series::PhaseStart;

/// What to draw.
#[derive(Clone, Debug, Default)]
pub struct XyChart {
    pub title: String,
    pub x_label: &'static str,
    pub y_label: &'static str,
    /// Latency-like values: a log axis.
    pub log_y: bool,
    /// One line per entry: its label and points (joined in the order given).
    pub lines: Vec<(String, Vec<(f64, f64)>)>,
    /// Reference lines (an "offered = achieved" diagonal, an SLO level), drawn dashed.
    pub references: Vec<(String, Vec<(f64, f64)>)>,
    /// Vertical marks at x, labelled.
    pub marks: Vec<(f64, String)>,
}

impl XyChart {
    fn plot(&self) -> Plot {
        let line = |(label, points): &(String, Vec<(f64, f64)>), stroke| {
            // In the order given: a step past the knee may achieve less than the one
            // before it, and the line goes back, as the run did.
            let mut points = points.clone();
            if self.log_y {
                points.retain(|p| p.1 > 0.0);
            }
            Line {
                label: label.clone(),
                stroke,
                segments: vec![points],
            }
        };
        let lines: Vec<Line> = self
            .lines
            .iter()
            .map(|l| line(l, Stroke::Solid))
            .chain(self.references.iter().map(|l| line(l, Stroke::Dashed)))
            .collect();
        let x_top = lines
            .iter()
            .flat_map(|l| l.segments.iter().flatten())
            .map(|p| p.0)
            .chain(self.marks.iter().map(|m| m.0))
            .fold(0.0_f64, f64::max);
        Plot {
            title: self.title.clone(),
            x_label: self.x_label,
            y_label: self.y_label,
            y_scale: if self.log_y {
                YScale::Log
            } else {
                YScale::Linear
            },
            // Room right of the last mark for its label.
            x_max: if x_top > 0.0 {
                x_top * if self.marks.is_empty() { 1.08 } else { 1.2 }
            } else {
                1.0
            },
            lines,
            phases: self
                .marks
                .iter()
                .map(|(x, label)| PhaseStart {
                    second: *x,
                    label: label.clone(),
                })
                .collect(),
            faults: Vec::new(),
        }
    }

    /// The chart as an SVG document.
    pub fn svg(&self) -> crate::Result<String> {
        crate::draw::svg(&self.plot())
    }

    /// Writes DIR/NAME.svg and DIR/NAME.png.
    pub fn write(&self, dir: &Path, name: &str) -> crate::Result<()> {
        let path = dir.join(format!("{name}.svg"));
        std::fs::write(&path, self.svg()?)
            .map_err(|e| crate::Error::io(format!("while writing {}", path.display()), e))?;
        crate::draw::png(&self.plot(), &dir.join(format!("{name}.png")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_marks_and_files() {
        let chart = XyChart {
            title: "Achieved vs offered".into(),
            x_label: "offered QPS",
            y_label: "achieved QPS",
            lines: vec![(
                "gateway ×1".into(),
                vec![(2000.0, 1990.0), (1000.0, 1000.0)],
            )],
            references: vec![("offered".into(), vec![(0.0, 0.0), (2000.0, 2000.0)])],
            marks: vec![(1000.0, "knee gateway ×1".into())],
            ..Default::default()
        };
        let plot = chart.plot();
        assert_eq!(plot.lines[0].segments[0][0], (2000.0, 1990.0));
        assert!(matches!(plot.lines[1].stroke, Stroke::Dashed));
        assert!((plot.x_max - 2400.0).abs() < 1e-6);
        let dir = tempfile::tempdir().unwrap();
        chart.write(dir.path(), "qps").unwrap();
        let svg = std::fs::read_to_string(dir.path().join("qps.svg")).unwrap();
        assert!(svg.contains("knee gateway ×1") && svg.contains("<svg"));
        assert!(std::fs::metadata(dir.path().join("qps.png")).unwrap().len() > 1000);
    }
}
