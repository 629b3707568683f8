//! Draws a [`Plot`] with plotters onto any backend: SVG strings for pages, PNG files for
//! the report directory.
//!
//! Text is measured (and, for PNG, rasterised) with DejaVu Sans compiled into the binary
//! and registered with plotters' `ab_glyph` font table, so a fresh machine without
//! fontconfig or system fonts renders the same charts. SVG text names the `sans-serif`
//! family and is drawn by the browser.

use std::path::Path;
use std::sync::Once;

use crate::error::{Error, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::chart::{Plot, Stroke, YScale};

pub(crate) const WIDTH: u32 = 1000;
pub(crate) const HEIGHT: u32 = 500;

const FONT: &str = "sans-serif";
static DEJAVU_SANS: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Tableau-like colours, distinct for the up to three lines a chart holds and readable
/// on white.
const PALETTE: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
];
const PHASE_COLOUR: RGBColor = RGBColor(110, 110, 110);
const FAULT_COLOUR: RGBColor = RGBColor(198, 40, 40);

fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The font is compiled in and known good; a failure would surface as a drawing
        // error ("font unavailable") from the first text, not as a panic here.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, DEJAVU_SANS);
    });
}

/// The plot as an SVG document.
pub(crate) fn svg(plot: &Plot) -> Result<String> {
    register_font();
    let mut out = String::with_capacity(64 * 1024);
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, plot)
            .map_err(|e| Error::Draw(format!("while drawing {:?} as SVG: {e}", plot.title)))?;
        root.present()
            .map_err(|e| Error::Draw(format!("while finishing {:?} as SVG: {e}", plot.title)))?;
    }
    Ok(out)
}

/// The plot as a PNG file at `path`.
pub(crate) fn png(plot: &Plot, path: &Path) -> Result<()> {
    register_font();
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    draw(&root, plot)
        .map_err(|e| Error::Draw(format!("while drawing {:?} as PNG: {e}", plot.title)))?;
    root.present().map_err(|e| {
        Error::Draw(format!(
            "while writing {:?} to {}: {e}",
            plot.title,
            path.display()
        ))
    })?;
    Ok(())
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    plot: &Plot,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&plot.title, (FONT, 26))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(78);
    let x_range = 0.0..plot.x_max;
    let points = || plot.lines.iter().flat_map(|l| l.segments.iter().flatten());
    match plot.y_scale {
        YScale::Linear => {
            let top = points().map(|p| p.1).fold(0.0_f64, f64::max);
            // Headroom above the data keeps the legend and phase labels off the lines.
            let y_max = if top > 0.0 { top * 1.3 } else { 1.0 };
            let chart = builder.build_cartesian_2d(x_range, 0.0..y_max)?;
            draw_in(chart, plot, (0.0, y_max), y_max / 2.0)
        }
        YScale::Log => {
            let (low, high) = points()
                .map(|p| p.1)
                .filter(|v| *v > 0.0)
                .fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| {
                    (lo.min(v), hi.max(v))
                });
            // Start at a power of ten so the lowest decade is labelled.
            let (y_min, y_max) = if high > 0.0 {
                (10f64.powf(low.log10().floor()), high * 8.0)
            } else {
                (0.1, 100.0)
            };
            let chart = builder.build_cartesian_2d(x_range, (y_min..y_max).log_scale())?;
            draw_in(chart, plot, (y_min, y_max), (y_min * y_max).sqrt())
        }
    }
}

/// Everything after the coordinates are chosen; `y_span` is the y axis' extent and
/// `y_middle` where "no data" goes (they differ between linear and log axes).
fn draw_in<'a, DB, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    plot: &Plot,
    y_span: (f64, f64),
    y_middle: f64,
) -> DrawResult<DB>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(plot.x_label)
        .y_desc(plot.y_label)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 17))
        .bold_line_style(RGBColor(0, 0, 0).mix(0.12))
        .light_line_style(RGBColor(0, 0, 0).mix(0.04))
        .draw()?;

    // Faults first, under everything: a pale band each, and its kind below the phase
    // labels on the first of three rows where it does not print over the one before
    // (left out where none is free: the table in report.html lists every fault).
    let seconds_per_px = plot.x_max / f64::from(WIDTH - 110);
    let mut row_free_from = [f64::MIN; 3];
    for fault in &plot.faults {
        let to = fault.to.max(fault.from + 1.0);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(fault.from, y_span.0), (to, y_span.1)],
            FAULT_COLOUR.mix(0.13).filled(),
        )))?;
        let Some(row) = row_free_from.iter().position(|free| *free <= fault.from) else {
            continue;
        };
        row_free_from[row] = fault.from + (fault.kind.len() as f64 * 6.5 + 6.0) * seconds_per_px;
        let label = Text::new(
            fault.kind.clone(),
            (2, 44 + 13 * row as i32),
            (FONT, 11).into_font().color(&FAULT_COLOUR),
        );
        chart.draw_series(std::iter::once(
            EmptyElement::at((fault.from, y_span.1)) + label,
        ))?;
    }

    for (index, phase) in plot.phases.iter().enumerate() {
        chart.draw_series(std::iter::once(DashedPathElement::new(
            vec![(phase.second, y_span.0), (phase.second, y_span.1)],
            6,
            4,
            PHASE_COLOUR.stroke_width(1),
        )))?;
        // Alternate two rows so labels of short phases do not print over each other.
        let row = (index % 2) as i32;
        let label = Text::new(
            phase.label.clone(),
            (5, 5 + 18 * row),
            (FONT, 15).into_font().color(&PHASE_COLOUR),
        );
        chart.draw_series(std::iter::once(
            EmptyElement::at((phase.second, y_span.1)) + label,
        ))?;
    }

    for (index, line) in plot.lines.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        let stroke = line.stroke;
        // The first line is drawn wider so that where a later line covers it exactly (the
        // server receiving every shake the clients sent) it still shows at the edges.
        let width = if index == 0 { 4 } else { 2 };
        // An empty series still gets its legend entry, so a missing role is visible as
        // "(no data)" rather than silently absent.
        chart
            .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())?
            .label(line.label.as_str())
            .legend(move |(x, y)| match stroke {
                Stroke::Solid => {
                    PathElement::new(vec![(x, y), (x + 22, y)], colour.stroke_width(3)).into_dyn()
                }
                Stroke::Dashed => {
                    DashedPathElement::new(vec![(x, y), (x + 22, y)], 5, 3, colour.stroke_width(2))
                        .into_dyn()
                }
            });
        for segment in &line.segments {
            match (line.stroke, segment.len()) {
                (_, 0) => {}
                (_, 1) => {
                    chart.draw_series(std::iter::once(Circle::new(
                        segment[0],
                        3,
                        colour.filled(),
                    )))?;
                }
                (Stroke::Solid, _) => {
                    chart.draw_series(LineSeries::new(
                        segment.iter().copied(),
                        colour.stroke_width(width),
                    ))?;
                }
                (Stroke::Dashed, _) => {
                    chart.draw_series(DashedLineSeries::new(
                        segment.iter().copied(),
                        8,
                        5,
                        colour.stroke_width(2),
                    ))?;
                }
            }
        }
    }

    if !plot.has_data() {
        let style = (FONT, 28)
            .into_font()
            .color(&PHASE_COLOUR)
            .pos(Pos::new(HPos::Center, VPos::Center));
        chart.draw_series(std::iter::once(Text::new(
            "no data",
            (plot.x_max / 2.0, y_middle),
            style,
        )))?;
    }

    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.35))
        .margin(10)
        .draw()?;
    Ok(())
}

/// An axis tick: short, with k/M/G for large counts and no trailing zeros.
pub(crate) fn tick(value: f64) -> String {
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e15 {
        return format!("{value:.1e}");
    } else if magnitude >= 1e12 {
        (value / 1e12, "T")
    } else if magnitude >= 1e9 {
        (value / 1e9, "G")
    } else if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e4 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let decimals = match scaled.abs() {
        m if m == 0.0 || m >= 100.0 => 0,
        m if m >= 1.0 => 2,
        m if m >= 0.001 => 3,
        _ => return format!("{value:.0e}"),
    };
    let mut text = format!("{scaled:.decimals$}");
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    text + suffix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1.5), "1.5");
        assert_eq!(tick(20.0), "20");
        assert_eq!(tick(5000.0), "5000");
        assert_eq!(tick(30000.0), "30k");
        assert_eq!(tick(1_250_000.0), "1.25M");
        assert_eq!(tick(0.0001), "1e-4");
        assert_eq!(tick(2e12), "2T");
        assert_eq!(tick(1.8e19), "1.8e19");
    }
}
