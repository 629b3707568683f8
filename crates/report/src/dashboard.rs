//! The live dashboard: one self-contained page that polls the monitor's HTTP endpoints.
//!
//! The server side stays trivial: `GET /v1/charts` lists the charts (see
//! [`crate::chart_list`]), `GET /charts/<name>.svg` is [`crate::render_svg`], and
//! `GET /v1/latest` is any JSON object (e.g. [`crate::Series::latest`]). The page draws
//! nothing itself; it swaps each chart's SVG in once a second, and waits for a round to
//! finish before starting the next, so a slow server is never asked for more than one
//! copy of a chart at a time.

use crate::html::{escape, STYLE};

const SCRIPT: &str = r#"
"use strict";
const PERIOD_MS = 1000;
const chartsEl = document.getElementById("charts");
const headlineEl = document.getElementById("headline");
const statusEl = document.getElementById("status");

function chartBox(entry) {
  const id = "chart-" + entry.name;
  let box = document.getElementById(id);
  if (!box) {
    // The SVG carries its own title; until it arrives the box shows the title alone.
    const section = document.createElement("section");
    section.className = "chart";
    box = document.createElement("div");
    box.id = id;
    box.textContent = entry.title + " (loading)";
    section.appendChild(box);
    chartsEl.appendChild(section);
  }
  return box;
}

async function refreshChart(entry) {
  const response = await fetch("/charts/" + encodeURIComponent(entry.name) + ".svg", { cache: "no-store" });
  if (!response.ok) throw new Error("/charts/" + entry.name + ".svg: HTTP " + response.status);
  const text = await response.text();
  const start = text.indexOf("<svg");
  if (start < 0) throw new Error("/charts/" + entry.name + ".svg: not an SVG");
  chartBox(entry).innerHTML = text.slice(start);
}

// Keys the monitor is known to send come first, in this order; any others follow.
const HEADLINE_ORDER = ["second", "phase", "client_qps", "server_qps", "clients_connected",
  "server_connections", "latency_p50_ms", "latency_p99_ms"];

function showHeadline(latest) {
  const items = [];
  const rank = key => {
    const at = HEADLINE_ORDER.indexOf(key);
    return at < 0 ? HEADLINE_ORDER.length : at;
  };
  const entries = Object.entries(latest || {}).sort((a, b) => rank(a[0]) - rank(b[0]));
  for (const [key, value] of entries) {
    const item = document.createElement("div");
    item.className = "figure";
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = key.replace(/_/g, " ");
    const shown = document.createElement("span");
    shown.className = "value";
    shown.textContent = typeof value === "number"
      ? value.toLocaleString(undefined, { maximumFractionDigits: 3 })
      : (typeof value === "object" ? JSON.stringify(value) : String(value));
    item.appendChild(label);
    item.appendChild(shown);
    items.push(item);
  }
  headlineEl.replaceChildren(...items);
}

async function refreshLatest() {
  const response = await fetch("/v1/latest", { cache: "no-store" });
  if (!response.ok) throw new Error("/v1/latest: HTTP " + response.status);
  showHeadline(await response.json());
}

async function tick() {
  const started = Date.now();
  try {
    const response = await fetch("/v1/charts", { cache: "no-store" });
    if (!response.ok) throw new Error("/v1/charts: HTTP " + response.status);
    const charts = await response.json();
    charts.forEach(chartBox);
    const results = await Promise.allSettled([refreshLatest(), ...charts.map(refreshChart)]);
    const failed = results.filter(r => r.status === "rejected").map(r => String(r.reason && r.reason.message || r.reason));
    statusEl.textContent = failed.length
      ? "updated " + new Date().toLocaleTimeString() + " — " + failed.join("; ")
      : "updated " + new Date().toLocaleTimeString();
    statusEl.className = failed.length ? "failed" : "";
  } catch (error) {
    statusEl.textContent = "cannot reach the monitor: " + (error && error.message || error);
    statusEl.className = "failed";
  }
  setTimeout(tick, Math.max(0, PERIOD_MS - (Date.now() - started)));
}

tick();
"#;

const DASHBOARD_STYLE: &str = r#"
body { max-width: 1100px; }
#headline { display: flex; flex-wrap: wrap; gap: 0.5rem; margin: 0.8rem 0 1.2rem; }
#headline .figure { background: #fff; border: 1px solid #ddd; border-radius: 6px;
                    padding: 0.35rem 0.7rem; min-width: 7rem; }
#headline .label { display: block; font-size: 0.75rem; color: #666; }
#headline .value { font-size: 1.15rem; font-weight: 600; font-variant-numeric: tabular-nums; }
#status { font-size: 0.85rem; color: #666; min-height: 1.2em; }
#status.failed { color: #c62828; }
"#;

/// See [`crate::dashboard_html`].
pub(crate) fn dashboard_html(title: &str) -> String {
    let title = escape(title);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>{STYLE}{DASHBOARD_STYLE}</style>\n</head>\n<body>\n\
         <h1>{title}</h1>\n<div id=\"status\">connecting…</div>\n<div id=\"headline\"></div>\n\
         <div id=\"charts\"></div>\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_polls_the_chart_list_and_each_chart() {
        let page = dashboard_html("Live <run>");
        assert!(page.contains("fetch(\"/v1/charts\""));
        assert!(page.contains("\"/charts/\" + encodeURIComponent(entry.name) + \".svg\""));
        assert!(page.contains("fetch(\"/v1/latest\""));
        assert!(page.contains("\"chart-\" + entry.name"));
        assert!(page.contains("<title>Live &lt;run&gt;</title>"));
        assert!(!page.contains("<run>"));
        // Self-contained: nothing loaded from elsewhere.
        assert!(!page.contains("src=\"http") && !page.contains("href=\"http"));
        // Only chart boxes may have ids starting with "chart-" (the browser test counts them).
        assert!(!page.contains("id=\"chart-"));
    }
}
