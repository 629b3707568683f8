//! Charts, report.html and the dashboard page.
//!
//! The monitor writes `series.csv` (one row per second per role); this crate turns it into
//! charts drawn by plotters — SVG for pages (the live dashboard swaps them in once a
//! second), PNG copies for the report directory — and into `report.html`, which puts the
//! bench's `summary.json` (audit first) above the charts.
//!
//! Modules:
//! - `series`: parses `series.csv` into one row per (role, second);
//! - `broadcast`: parses `broadcasts.json`, each broadcast's delivery curve;
//! - `chart`: which charts exist and which lines go on each, as a backend-free plot;
//! - `xy`: charts of one quantity against another (capacity's QPS, latency and CPU);
//! - `draw`: draws a plot with plotters: SVG for pages, PNG for the report directory;
//! - `html`: escaping and the stylesheet that report.html and the dashboard share;
//! - `render`: the named chart drawn: an SVG document, or a PNG file;
//! - `report`: writes the report directory (report.html and a PNG of every chart);
//! - `dashboard`: the live page, which polls the monitor and swaps each chart's SVG in;
//! - `error`: the crate's error: what failed, and what we were doing.

mod broadcast;
mod chart;
mod dashboard;
mod draw;
mod error;
mod html;
mod render;
mod report;
mod series;
mod xy;

use std::path::Path;

pub use broadcast::Broadcast;
pub use chart::{chart_list, ChartEntry, ChartInfo, CHAOS_PHASE, CHARTS};
pub use error::{Error, Result};
pub use html::escape;
pub use render::{render_png, render_svg, CHART_SIZE};
pub use series::{PhaseStart, Role, Series, COLUMNS};
pub use xy::XyChart;

/// Reads DIR/series.csv (required), DIR/summary.json and DIR/broadcasts.json (optional);
/// writes DIR/report.html and DIR/<chart>.png for every chart (+ one per broadcast).
/// Returns the chart file names written (`qps.png`, …), in page order.
///
/// An unreadable summary.json or broadcasts.json is reported on the page rather than
/// failing the report; a missing or malformed series.csv is an error.
pub fn write_report(dir: &Path) -> Result<Vec<String>> {
    report::write_report(dir)
}

/// The live dashboard page (self-contained HTML+JS, no external resources). Every second it
/// fetches `/charts/<name>.svg` for each name listed by `GET /v1/charts` (JSON array of
/// {name,title}, e.g. `serde_json::to_string(&chart_list(&broadcasts))`) into an element
/// with id `chart-<name>`, and shows every key of the JSON object from `GET /v1/latest`
/// (e.g. [`Series::latest`]) as a headline.
pub fn dashboard_html(title: &str) -> String {
    dashboard::dashboard_html(title)
}
