//! The named chart drawn: an SVG document for pages (the dashboard and report.html), or a
//! PNG file for the report directory. Apart from `lib.rs` so that the report it serves
//! does not import the crate's root back.

use std::path::Path;

use crate::broadcast::Broadcast;
use crate::series::Series;
use crate::{chart, draw, html};

/// Width and height of every chart, SVG and PNG alike.
pub const CHART_SIZE: (u32, u32) = (draw::WIDTH, draw::HEIGHT);

/// The named chart as an SVG document (fixed charts by name; "broadcast_<id>" from
/// `broadcasts`). None for an unknown name.
///
/// A drawing failure (none is expected: the font is built in) still yields an SVG, one
/// that says what went wrong, so a dashboard shows the error where the chart would be.
pub fn render_svg(series: &Series, broadcasts: &[Broadcast], name: &str) -> Option<String> {
    let plot = chart::plot(series, broadcasts, name)?;
    Some(draw::svg(&plot).unwrap_or_else(|e| error_svg(&format!("{e:#}"))))
}

/// Writes the named chart as a PNG file. `Ok(false)` for an unknown name.
pub fn render_png(
    series: &Series,
    broadcasts: &[Broadcast],
    name: &str,
    path: &Path,
) -> crate::Result<bool> {
    let Some(plot) = chart::plot(series, broadcasts, name) else {
        return Ok(false);
    };
    draw::png(&plot, path)?;
    Ok(true)
}

fn error_svg(message: &str) -> String {
    let (width, height) = CHART_SIZE;
    format!(
        "<svg width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         xmlns=\"http://www.w3.org/2000/svg\"><rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\
         <text x=\"20\" y=\"40\" font-family=\"sans-serif\" font-size=\"16\" fill=\"#c62828\">{}</text></svg>\n",
        html::escape(message)
    )
}
