//! The monitor's `series.csv`, parsed into one row per (role, second).
//!
//! The monitor writes one row per wall-clock second per role; columns are looked up by
//! header name so the monitor can add columns without breaking older reports. Counts are
//! already per-second rates, so a chart plots the cells as they are. An empty cell (or one
//! that does not parse as a number) means "not applicable" and breaks the line there, as
//! does a second with no row at all: a chart never draws across a gap it did not see.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// Who a row describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Gateway workers, summed.
    Server,
    /// The supervisor/core process that owns the money.
    Core,
    /// Load client processes, summed.
    Load,
    /// The machine's network interface counters.
    Host,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Server, Role::Core, Role::Load, Role::Host];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Core => "core",
            Role::Load => "load",
            Role::Host => "host",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == text)
    }
}

/// The columns of `series.csv`, in order: the monitor writes them, this reads them
/// (docs/monitoring.md describes each).
pub const COLUMNS: &[&str] = &[
    "unix_second",
    "role",
    "instances",
    "phase",
    "connections",
    "logged_in",
    "cpu_seconds",
    "rss_bytes",
    "shakes",
    "won",
    "nothing",
    "overloaded",
    "opens",
    "opened",
    "sends",
    "errors",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "packets_released",
    "packets_won",
    "send_packets",
    "shares_opened",
    "net_rx_packets",
    "net_tx_packets",
    "net_rx_bytes",
    "net_tx_bytes",
    "broadcasts",
    "broadcast_delivered",
];

/// Where a numeric column's value sits in a row's cells (its place among `COLUMNS`);
/// `unix_second`, `role` and `phase` are read apart.
fn metric_index(column: &str) -> Option<usize> {
    if matches!(column, "unix_second" | "role" | "phase") {
        return None;
    }
    COLUMNS.iter().position(|c| *c == column)
}

/// One role's cells for one second; `None` is an empty (not applicable) cell.
type Cells = Vec<Option<f64>>;

/// Everything in one `series.csv`.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Per role, per unix second. A repeated (role, second) keeps the later row.
    rows: BTreeMap<Role, BTreeMap<u64, Cells>>,
    /// The phase label of each second that has a non-empty one (from any role's row).
    phases: BTreeMap<u64, String>,
    first_second: Option<u64>,
    last_second: Option<u64>,
}

/// Where a phase starts, in seconds since the series' first row.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseStart {
    pub second: f64,
    pub label: String,
}

impl Series {
    /// Parses `series.csv`. The header must name `unix_second` and `role`; unknown columns
    /// and roles are ignored. A last line without its newline is skipped when it has fewer
    /// cells than the header, since the monitor may be in the middle of writing it.
    pub fn from_csv(text: &str) -> Result<Series> {
        let mut lines = text.lines().enumerate();
        let Some((_, header)) = lines.by_ref().find(|(_, line)| !line.trim().is_empty()) else {
            return Ok(Series::default());
        };
        let header = split_csv_line(header);
        let column = |name: &str| header.iter().position(|h| h.trim() == name);
        let Some(second_at) = column("unix_second") else {
            return Err(Error::BadInput(format!(
                "series.csv header has no unix_second column: {:?}",
                header
            )));
        };
        let Some(role_at) = column("role") else {
            return Err(Error::BadInput(format!(
                "series.csv header has no role column: {:?}",
                header
            )));
        };
        let phase_at = column("phase");
        let metric_at: Vec<(usize, usize)> = header
            .iter()
            .enumerate()
            .filter_map(|(at, name)| metric_index(name.trim()).map(|m| (at, m)))
            .collect();

        let line_count = text.lines().count();
        let unterminated = !text.ends_with('\n');
        let mut series = Series::default();
        for (index, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let cells = split_csv_line(line);
            if unterminated && index + 1 == line_count && cells.len() < header.len() {
                continue;
            }
            let cell = |at: usize| cells.get(at).map(|c| c.trim()).unwrap_or("");
            let second: u64 = cell(second_at).parse().map_err(|e| {
                Error::BadInput(format!(
                    "while reading series.csv line {}: unix_second {:?} is not a whole number: {e}",
                    index + 1,
                    cell(second_at)
                ))
            })?;
            let Some(role) = Role::parse(cell(role_at)) else {
                continue;
            };
            let mut values: Cells = vec![None; COLUMNS.len()];
            for &(at, metric) in &metric_at {
                values[metric] = cell(at).parse::<f64>().ok().filter(|v| v.is_finite());
            }
            series.rows.entry(role).or_default().insert(second, values);
            if let Some(phase) = phase_at.map(cell).filter(|p| !p.is_empty()) {
                series
                    .phases
                    .entry(second)
                    .or_insert_with(|| phase.to_string());
            }
            series.first_second = Some(series.first_second.map_or(second, |f| f.min(second)));
            series.last_second = Some(series.last_second.map_or(second, |l| l.max(second)));
        }
        Ok(series)
    }

    /// True when there is no row of a known role.
    pub fn is_empty(&self) -> bool {
        self.first_second.is_none()
    }

    /// The unix second of the earliest row: the charts' zero.
    pub fn first_second(&self) -> Option<u64> {
        self.first_second
    }

    /// Seconds from the first row to the last (0 for one second or none).
    pub fn span_seconds(&self) -> u64 {
        match (self.first_second, self.last_second) {
            (Some(first), Some(last)) => last - first,
            _ => 0,
        }
    }

    /// The role's `column` as runs of consecutive seconds with a value, each point being
    /// (seconds since the first row, value). Empty when the role or column is absent.
    pub fn segments(&self, role: Role, column: &str) -> Vec<Vec<(f64, f64)>> {
        let (Some(metric), Some(first), Some(rows)) = (
            metric_index(column),
            self.first_second,
            self.rows.get(&role),
        ) else {
            return Vec::new();
        };
        let mut segments: Vec<Vec<(f64, f64)>> = Vec::new();
        let mut previous: Option<u64> = None;
        for (&second, cells) in rows {
            let Some(value) = cells[metric] else {
                previous = None;
                continue;
            };
            let point = ((second - first) as f64, value);
            match (previous, segments.last_mut()) {
                (Some(p), Some(run)) if p + 1 == second => run.push(point),
                _ => segments.push(vec![point]),
            }
            previous = Some(second);
        }
        segments
    }

    /// The role's latest value of `column`, with the unix second it came from.
    pub fn last_value(&self, role: Role, column: &str) -> Option<(u64, f64)> {
        let metric = metric_index(column)?;
        self.rows
            .get(&role)?
            .iter()
            .rev()
            .find_map(|(&second, cells)| cells[metric].map(|v| (second, v)))
    }

    /// Every change of phase label, in seconds since the first row. A second without a row
    /// or without a label keeps the phase before it, so a gap does not mark a new phase.
    pub fn phase_starts(&self) -> Vec<PhaseStart> {
        let Some(first) = self.first_second else {
            return Vec::new();
        };
        let mut starts: Vec<PhaseStart> = Vec::new();
        for (&second, label) in &self.phases {
            if starts.last().map(|s| &s.label) != Some(label) {
                starts.push(PhaseStart {
                    second: (second - first) as f64,
                    label: label.clone(),
                });
            }
        }
        starts
    }

    /// The phase label of the latest second that has one.
    pub fn last_phase(&self) -> Option<&str> {
        self.phases.values().next_back().map(String::as_str)
    }

    /// A headline of the latest figures, for the dashboard's `GET /v1/latest`: each key is
    /// present only when the series has it.
    pub fn latest(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        if let (Some(first), Some(last)) = (self.first_second, self.last_second) {
            out.insert("second".into(), (last - first).into());
            out.insert("unix_second".into(), last.into());
        }
        if let Some(phase) = self.last_phase() {
            out.insert("phase".into(), phase.into());
        }
        let figures = [
            ("client_qps", Role::Load, "shakes"),
            ("server_qps", Role::Server, "shakes"),
            ("clients_connected", Role::Load, "connections"),
            ("server_connections", Role::Server, "connections"),
            ("latency_p50_ms", Role::Load, "latency_p50_ms"),
            ("latency_p99_ms", Role::Load, "latency_p99_ms"),
            ("overloaded_per_sec", Role::Load, "overloaded"),
            ("errors_per_sec", Role::Load, "errors"),
            ("packets_released_per_sec", Role::Core, "packets_released"),
            ("packets_won_per_sec", Role::Core, "packets_won"),
        ];
        for (key, role, column) in figures {
            if let Some((_, value)) = self.last_value(role, column) {
                out.insert(key.into(), json_number(value));
            }
        }
        serde_json::Value::Object(out)
    }
}

/// Whole numbers as JSON integers, so a headline reads `30000`, not `30000.0`.
fn json_number(value: f64) -> serde_json::Value {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        (value as i64).into()
    } else {
        value.into()
    }
}

/// Splits one CSV line; double-quoted cells may hold commas and `""` for a quote.
fn split_csv_line(line: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cell.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => cells.push(std::mem::take(&mut cell)),
            _ => cell.push(c),
        }
    }
    cells.push(cell);
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "\
unix_second,role,phase,shakes,extra,connections
100,load,connect,,x,10
100,server,,5,,9
101,load,connect,7,,20
103,load,qps-30000,9,,20
104,load,,10,,20
104,mystery,other,1,,1
";

    #[test]
    fn parses_by_header_name_and_ignores_unknowns() {
        let series = Series::from_csv(CSV).unwrap();
        assert!(!series.is_empty());
        assert_eq!(series.first_second(), Some(100));
        assert_eq!(series.span_seconds(), 4);
        assert_eq!(
            series.segments(Role::Server, "shakes"),
            vec![vec![(0.0, 5.0)]]
        );
        assert!(series.segments(Role::Core, "shakes").is_empty());
        assert!(series.segments(Role::Load, "no_such_column").is_empty());
    }

    #[test]
    fn empty_cells_and_missing_seconds_break_lines() {
        let series = Series::from_csv(CSV).unwrap();
        assert_eq!(
            series.segments(Role::Load, "shakes"),
            vec![vec![(1.0, 7.0)], vec![(3.0, 9.0), (4.0, 10.0)]]
        );
    }

    #[test]
    fn phase_changes_are_found_across_roles() {
        let series = Series::from_csv(CSV).unwrap();
        let starts = series.phase_starts();
        assert_eq!(
            starts,
            vec![
                PhaseStart {
                    second: 0.0,
                    label: "connect".into()
                },
                PhaseStart {
                    second: 3.0,
                    label: "qps-30000".into()
                },
            ]
        );
        assert_eq!(series.last_phase(), Some("qps-30000"));
    }

    #[test]
    fn latest_has_the_headline_figures() {
        let latest = Series::from_csv(CSV).unwrap().latest();
        assert_eq!(latest["second"], 4);
        assert_eq!(latest["phase"], "qps-30000");
        assert_eq!(latest["client_qps"], 10);
        assert_eq!(latest["server_qps"], 5);
        assert!(latest.get("packets_won_per_sec").is_none());
    }

    #[test]
    fn header_only_and_blank_inputs_are_empty() {
        assert!(Series::from_csv("").unwrap().is_empty());
        assert!(Series::from_csv("unix_second,role\n").unwrap().is_empty());
        assert!(Series::from_csv("role,shakes\nload,1\n").is_err());
        let bad = Series::from_csv("unix_second,role\nsoon,load\n").unwrap_err();
        assert!(format!("{bad:#}").contains("line 2"), "{bad:#}");
    }

    #[test]
    fn a_half_written_last_line_is_skipped() {
        let text = "unix_second,role,shakes,connections\n1,load,5,3\n2,load,6";
        let series = Series::from_csv(text).unwrap();
        assert_eq!(
            series.segments(Role::Load, "shakes"),
            vec![vec![(0.0, 5.0)]]
        );
    }

    #[test]
    fn quoted_cells_may_hold_commas() {
        assert_eq!(
            split_csv_line(r#"1,"a,b","say ""hi""",,"#),
            vec!["1", "a,b", "say \"hi\"", "", ""]
        );
    }
}
