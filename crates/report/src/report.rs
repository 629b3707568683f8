//! `report.html` and the PNG copies of every chart, written next to a run's `series.csv`.
//!
//! `summary.json` (from `hongbao bench`) is read as a loose JSON value: a field that is
//! missing shows as a dash and an unexpected one is shown as it is, so a report can be
//! made from an older or newer bench, or from a monitor run with no bench at all.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::broadcast::Broadcast;
use crate::chart::chart_list;
use crate::error::{Error, Result};
use crate::html::{escape, STYLE};
use crate::series::Series;

/// Discrepancy rows beyond this many are counted, not listed: a broken ledger can
/// disagree with a million clients.
const MAX_DISCREPANCY_ROWS: usize = 200;

/// An optional input: absent, present, or present but unreadable (said on the page).
enum Optional<T> {
    Absent,
    Read(T),
    Unreadable(String),
}

fn read_optional<T>(path: &Path, parse: impl FnOnce(&str) -> Result<T>) -> Optional<T> {
    match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Optional::Absent,
        Err(e) => Optional::Unreadable(format!("{}: {e}", path.display())),
        Ok(text) => match parse(&text) {
            Ok(value) => Optional::Read(value),
            Err(e) => Optional::Unreadable(format!("{}: {e:#}", path.display())),
        },
    }
}

/// See [`crate::write_report`].
pub(crate) fn write_report(dir: &Path) -> Result<Vec<String>> {
    let series_path = dir.join("series.csv");
    let series_text = std::fs::read_to_string(&series_path)
        .map_err(|e| Error::io(format!("while reading {}", series_path.display()), e))?;
    let series = Series::from_csv(&series_text)
        .map_err(|e| e.within(format!("while parsing {}", series_path.display())))?;
    let summary = read_optional(&dir.join("summary.json"), |t| {
        Ok(serde_json::from_str::<Value>(t)?)
    });
    let broadcasts = read_optional(&dir.join("broadcasts.json"), Broadcast::from_json);
    let broadcast_list: &[Broadcast] = match &broadcasts {
        Optional::Read(list) => list,
        _ => &[],
    };

    let mut page = String::with_capacity(512 * 1024);
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    page.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    page.push_str("<title>hongbao run report</title>\n<style>");
    page.push_str(STYLE);
    page.push_str("</style>\n</head>\n<body>\n<h1>hongbao run report</h1>\n");
    let _ = writeln!(
        page,
        "<p class=\"note\">{}</p>",
        escape(&dir.display().to_string())
    );

    match &summary {
        Optional::Read(summary) => summary_sections(&mut page, summary),
        Optional::Absent => {
            page.push_str("<section class=\"audit\"><h2>Audit: not run</h2>");
            page.push_str(
                "<p class=\"note\">There is no summary.json in this directory (it is written by ",
            );
            page.push_str("<code>hongbao bench</code>), so only the charts from series.csv are shown.</p></section>\n");
        }
        Optional::Unreadable(why) => {
            page.push_str("<section class=\"audit audit-failed\"><h2>Audit: <span class=\"failed\">unknown</span></h2>");
            let _ = writeln!(
                page,
                "<p>summary.json could not be read: {}</p></section>",
                escape(why)
            );
        }
    }
    if let Optional::Unreadable(why) = &broadcasts {
        let _ = writeln!(
            page,
            "<p class=\"note\">broadcasts.json could not be read: {}</p>",
            escape(why)
        );
    }

    page.push_str("<h2>Charts</h2>\n");
    if series.is_empty() {
        page.push_str("<p class=\"note\">series.csv has no rows.</p>\n");
    }
    let charts = chart_list(broadcast_list);
    page.push_str("<ul class=\"contents\">");
    for entry in &charts {
        let _ = write!(
            page,
            "<li><a href=\"#{}\">{}</a></li>",
            escape(&entry.name),
            escape(&entry.title)
        );
    }
    page.push_str("</ul>\n");
    let mut written = Vec::new();
    for entry in charts {
        let file = format!("{}.png", entry.name);
        crate::render::render_png(&series, broadcast_list, &entry.name, &dir.join(&file))?;
        let svg =
            crate::render::render_svg(&series, broadcast_list, &entry.name).unwrap_or_default();
        let _ = writeln!(
            page,
            "<section class=\"chart\" id=\"{name}\">\n{svg}<a href=\"{file}\">{file}</a></section>",
            name = escape(&entry.name),
            file = escape(&file),
        );
        written.push(file);
    }
    page.push_str("</body>\n</html>\n");

    let report_path = dir.join("report.html");
    std::fs::write(&report_path, page)
        .map_err(|e| Error::io(format!("while writing {}", report_path.display()), e))?;
    Ok(written)
}

fn summary_sections(page: &mut String, summary: &Value) {
    audit_section(page, &summary["audit"]);

    page.push_str("<h2>Connections</h2>\n");
    key_value_table(
        page,
        &summary["connections"],
        &["target", "peak", "connect_seconds", "all_connected"],
    );

    page.push_str("<h2>Phases</h2>\n");
    phases_table(page, &summary["phases"]);
    if let Some(faults) = summary["chaos"]["faults"].as_array() {
        let _ = writeln!(
            page,
            "<h2>Chaos: {} faults (seed {})</h2>",
            faults.len(),
            summary["chaos"]["seed"]
        );
        page.push_str("<p class=\"note\">Each is shaded on the charts below.</p>\n");
        faults_table(page, faults);
    }

    page.push_str("<h2>Totals</h2>\n<div class=\"tables\">\n");
    let totals: [(&str, &str, &[&str]); 2] = [
        (
            "shake",
            "Shake packets",
            &["packets", "released", "won_server", "won_clients"],
        ),
        (
            "send",
            "Send packets",
            &["packets", "shares", "opened_server", "opened_clients"],
        ),
    ];
    for (key, heading, order) in totals {
        let _ = writeln!(page, "<div><h3>{heading}</h3>");
        key_value_table(page, &summary[key], order);
        page.push_str("</div>\n");
    }
    page.push_str("</div>\n");

    page.push_str("<h2>Resources</h2>\n");
    key_value_table(
        page,
        &summary["resources"],
        &[
            "server_rss_bytes",
            "server_rss_baseline_bytes",
            "server_rss_per_connection_bytes",
            "server_cpu_seconds",
        ],
    );

    if !summary["broadcast"].is_null() {
        page.push_str("<h2>Broadcast</h2>\n");
        key_value_table(
            page,
            &summary["broadcast"],
            &["sent", "connections", "delivered", "complete_ms"],
        );
    }
}

fn audit_section(page: &mut String, audit: &Value) {
    let (class, verdict) = match audit["ok"].as_bool() {
        Some(true) => ("ok", "OK"),
        Some(false) => ("failed", "FAILED"),
        None => ("failed", "not recorded"),
    };
    let _ = writeln!(
        page,
        "<section class=\"audit audit-{class}\"><h2>Audit: <span class=\"{class}\">{verdict}</span></h2>"
    );
    if let Some(users) = audit.get("users_checked") {
        let _ = writeln!(
            page,
            "<p>Users checked against the ledger: {}</p>",
            escape(&format_value("", users))
        );
    }
    let discrepancies = audit["discrepancies"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if discrepancies.is_empty() {
        page.push_str("<p>No discrepancies.</p>\n");
    } else {
        let _ = writeln!(page, "<p>Discrepancies ({}):</p>", discrepancies.len());
        let mut columns: Vec<String> = ["kind", "user", "phase", "server", "clients"]
            .map(String::from)
            .to_vec();
        for row in discrepancies {
            for key in row.as_object().into_iter().flat_map(|o| o.keys()) {
                if !columns.contains(key) {
                    columns.push(key.clone());
                }
            }
        }
        page.push_str("<table><thead><tr>");
        for column in &columns {
            let _ = write!(page, "<th>{}</th>", escape(column));
        }
        page.push_str("</tr></thead><tbody>\n");
        for row in discrepancies.iter().take(MAX_DISCREPANCY_ROWS) {
            page.push_str("<tr>");
            for column in &columns {
                value_cell(page, column, &row[column.as_str()]);
            }
            page.push_str("</tr>\n");
        }
        page.push_str("</tbody></table>\n");
        if discrepancies.len() > MAX_DISCREPANCY_ROWS {
            let _ = writeln!(
                page,
                "<p class=\"note\">… and {} more (see summary.json).</p>",
                discrepancies.len() - MAX_DISCREPANCY_ROWS
            );
        }
    }
    page.push_str("</section>\n");
}

fn phases_table(page: &mut String, phases: &Value) {
    let Some(phases) = phases.as_array().filter(|p| !p.is_empty()) else {
        page.push_str("<p class=\"note\">No phases recorded.</p>\n");
        return;
    };
    let columns: [(&str, &[&str]); 13] = [
        ("phase", &["name"]),
        ("seconds", &["seconds"]),
        ("target QPS", &["target_qps"]),
        ("client QPS (median)", &["client_qps_median"]),
        ("server QPS (median)", &["server_qps_median"]),
        ("p50 ms", &["latency_ms", "p50"]),
        ("p99 ms", &["latency_ms", "p99"]),
        ("p99.9 ms", &["latency_ms", "p999"]),
        ("max ms", &["latency_ms", "max"]),
        ("load send lag p99 ms", &["send_lag_ms", "p99"]),
        ("overloaded", &["overloaded"]),
        ("errors", &["errors"]),
        ("audit", &["audit_ok"]),
    ];
    rows_table(page, phases, &columns);
}

/// A table of one row per object in `rows`, a column per (heading, path into the object).
/// An `audit_ok` cell reads OK or FAILED.
fn rows_table(page: &mut String, rows: &[Value], columns: &[(&str, &[&str])]) {
    page.push_str("<table><thead><tr>");
    for (heading, _) in columns {
        let _ = write!(page, "<th>{heading}</th>");
    }
    page.push_str("</tr></thead><tbody>\n");
    for row in rows {
        page.push_str("<tr>");
        for (_, path) in columns {
            let value = path.iter().fold(row, |v, key| &v[*key]);
            match (*path, value.as_bool()) {
                (&["audit_ok"], Some(ok)) => {
                    let (class, text) = if ok {
                        ("ok", "OK")
                    } else {
                        ("failed", "FAILED")
                    };
                    let _ = write!(page, "<td class=\"{class}\">{text}</td>");
                }
                _ => value_cell(page, path[path.len() - 1], value),
            }
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</tbody></table>\n");
}

/// One row per fault chaos did: when, what, and what it cost.
fn faults_table(page: &mut String, faults: &[Value]) {
    let columns: [(&str, &[&str]); 8] = [
        ("kind", &["kind"]),
        ("start s", &["start_second"]),
        ("healed s", &["end_second"]),
        ("what", &["what"]),
        ("dropped", &["dropped"]),
        ("seconds below 90%", &["reduced_secs"]),
        ("error replies", &["error_replies"]),
        ("whole after s", &["whole_after_secs"]),
    ];
    rows_table(page, faults, &columns);
}

/// An object as a two-column table; nested objects are flattened into "outer inner" keys.
/// Keys named in `first` lead, in that order; the rest follow alphabetically.
fn key_value_table(page: &mut String, value: &Value, first: &[&str]) {
    let mut rows = Vec::new();
    flatten("", value, &mut rows);
    let rank = |key: &str| first.iter().position(|f| *f == key).unwrap_or(first.len());
    rows.sort_by_key(|(key, _)| rank(key));
    if rows.is_empty() {
        page.push_str("<p class=\"note\">Not recorded.</p>\n");
        return;
    }
    page.push_str("<table><tbody>\n");
    for (key, value) in rows {
        let _ = write!(page, "<tr><th>{}</th>", escape(&key.replace('_', " ")));
        value_cell(page, &key, value);
        page.push_str("</tr>\n");
    }
    page.push_str("</tbody></table>\n");
}

fn flatten<'v>(prefix: &str, value: &'v Value, rows: &mut Vec<(String, &'v Value)>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let key = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix} {key}")
                };
                flatten(&key, inner, rows);
            }
        }
        Value::Null if prefix.is_empty() => {}
        _ => rows.push((prefix.to_string(), value)),
    }
}

fn value_cell(page: &mut String, key: &str, value: &Value) {
    let class = if value.is_number() {
        " class=\"num\""
    } else {
        ""
    };
    let _ = write!(
        page,
        "<td{class}>{}</td>",
        escape(&format_value(key, value))
    );
}

/// A JSON value for a table cell; `key` picks units (bytes are shown in MiB as well).
fn format_value(key: &str, value: &Value) -> String {
    match value {
        Value::Null => "—".to_string(),
        Value::Bool(true) => "yes".to_string(),
        Value::Bool(false) => "no".to_string(),
        Value::Number(n) if key.ends_with("_bytes") => {
            let bytes = n.as_f64().unwrap_or(0.0);
            format!(
                "{} ({:.1} MiB)",
                group_thousands(n),
                bytes / (1024.0 * 1024.0)
            )
        }
        Value::Number(n) => group_thousands(n),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// 1234567 → "1,234,567"; fractions keep at most three decimals.
fn group_thousands(n: &serde_json::Number) -> String {
    let text = match (n.as_i64(), n.as_u64(), n.as_f64()) {
        (Some(i), _, _) => i.to_string(),
        (_, Some(u), _) => u.to_string(),
        (_, _, Some(f)) => {
            let t = format!("{f:.3}");
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        _ => n.to_string(),
    };
    let (sign, rest) = text
        .strip_prefix('-')
        .map_or(("", text.as_str()), |r| ("-", r));
    let (whole, fraction) = rest
        .split_once('.')
        .map_or((rest, None), |(w, f)| (w, Some(f)));
    let mut grouped = String::new();
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    match fraction {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_are_grouped_and_bytes_shown_in_mib() {
        assert_eq!(format_value("peak", &json!(1234567)), "1,234,567");
        assert_eq!(format_value("p50", &json!(0.4213)), "0.421");
        assert_eq!(format_value("x", &json!(-1500.5)), "-1,500.5");
        assert_eq!(
            format_value("server_rss_bytes", &json!(2097152)),
            "2,097,152 (2.0 MiB)"
        );
        assert_eq!(format_value("ok", &json!(true)), "yes");
        assert_eq!(format_value("missing", &Value::Null), "—");
    }

    #[test]
    fn summary_sections_tolerate_missing_fields_and_escape_text() {
        let summary = json!({
            "audit": {"ok": false, "discrepancies": [
                {"kind": "user_balance", "user": 7, "phase": "<end>", "server": 10, "clients": 9, "note": "x"}
            ]},
            "phases": [{"name": "qps-30000", "target_qps": 30000, "audit_ok": true}],
        });
        let mut page = String::new();
        summary_sections(&mut page, &summary);
        assert!(page.contains("FAILED"));
        assert!(page.contains("user_balance"));
        assert!(page.contains("&lt;end&gt;"));
        assert!(page.contains("<th>note</th>"));
        assert!(page.contains("30,000"));
        assert!(!page.contains("<end>"));
        assert!(page.contains("Not recorded."));
        assert!(!page.contains("Chaos"), "no chaos section without chaos");
    }

    #[test]
    fn every_chaos_fault_is_a_row() {
        let summary = json!({"chaos": {"seed": 3, "faults": [
            {"kind": "worker-kill", "what": "killed gateway worker 7 <SIGKILL>", "start_second": 9,
             "end_second": 11, "dropped": 334, "reduced_secs": 0, "error_replies": 2,
             "whole_after_secs": 3},
            {"kind": "partition-redis", "what": "cut gw2 off", "start_second": 30,
             "end_second": 38, "dropped": 0, "reduced_secs": 4, "error_replies": 0},
        ]}});
        let mut page = String::new();
        summary_sections(&mut page, &summary);
        assert!(page.contains("Chaos: 2 faults (seed 3)"));
        assert!(page.contains("<td>worker-kill</td>"));
        assert!(page.contains("killed gateway worker 7 &lt;SIGKILL&gt;"));
        assert_eq!(page.matches("<tr>").count(), 3, "a header and two faults");
        // Never whole in its window: a dash, not a number.
        assert!(page.contains("<td>—</td></tr>"));
    }
}
