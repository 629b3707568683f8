//! Merges samples from any number of instances by wall-clock second into one row per
//! second per role, and writes each row as soon as its second is closed.
//!
//! A second is closed `GRACE_SECS` after it ends, or at `finish`. Counts are differences
//! of cumulative counters, so they add up to the instances' totals even when a report is
//! lost or late: a late report's counts go to the oldest second still open.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use hongbao_telemetry::prom::Page;
use hongbao_telemetry::sample::{
    merge_sparse, new_histogram, Sample, COUNTERS, LEVELS, NET_COLUMNS,
};

/// Seconds after a second ends before its row is written.
pub const GRACE_SECS: u64 = 3;
/// An instance silent this long no longer counts towards levels.
const GONE_SECS: u64 = 5;
/// Roles that also get a row per instance when several instances report them (a lab's
/// gateway hosts): `server@NAME`, `core@NAME`.
const PER_INSTANCE: &[&str] = &["server", "core"];

/// The columns of series.csv, in order (the report crate reads the same list).
pub use hongbao_report::COLUMNS;

/// One role in one second, while the second is open.
#[derive(Default)]
struct Cell {
    counts: BTreeMap<String, u64>,
    cpu_ms: u64,
    /// Levels and process count per instance that reported this second.
    levels: HashMap<String, (u32, BTreeMap<String, u64>)>,
    latency: Option<Histogram<u64>>,
}

#[derive(Default)]
struct Source {
    last_second: u64,
    counters: BTreeMap<String, u64>,
    cpu_ms: u64,
    /// Levels carried into seconds this instance did not report.
    levels: (u32, BTreeMap<String, u64>),
}

/// What the collector knows of one role over the whole run (for /metrics).
#[derive(Default)]
struct RoleTotals {
    counts: BTreeMap<String, u64>,
    cpu_ms: u64,
    latency: Option<Histogram<u64>>,
    levels: BTreeMap<String, u64>,
    /// Keys this role has reported, so other columns stay empty rather than 0.
    keys: BTreeSet<String>,
    first_second: u64,
}

pub struct Collector {
    out: Option<BufWriter<File>>,
    csv: String,
    /// Seconds before this are written.
    next_open: Option<u64>,
    open: BTreeMap<u64, BTreeMap<String, Cell>>,
    sources: HashMap<(String, String), Source>,
    /// Newest counters (`NET_COLUMNS` order) per host and interface.
    net: HashMap<(String, String), [u64; 4]>,
    roles: BTreeMap<String, RoleTotals>,
    marks: Vec<(u64, String)>,
    latest_rows: BTreeMap<String, Map<String, Value>>,
    rows_written: u64,
}

fn header() -> String {
    COLUMNS.join(",") + "\n"
}

impl Collector {
    /// A collector that writes `dir/series.csv` (when given) as rows are closed.
    pub fn new(dir: Option<&Path>) -> Result<Collector> {
        let out = match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
                let path = dir.join("series.csv");
                let writing = || format!("writing {}", path.display());
                let file = File::create(&path).map_err(|e| Error::io(writing(), e))?;
                let mut w = BufWriter::new(file);
                w.write_all(header().as_bytes())
                    .and_then(|()| w.flush())
                    .map_err(|e| Error::io(writing(), e))?;
                Some(w)
            }
            None => None,
        };
        Ok(Collector {
            out,
            csv: header(),
            next_open: None,
            open: BTreeMap::new(),
            sources: HashMap::new(),
            net: HashMap::new(),
            roles: BTreeMap::new(),
            marks: Vec::new(),
            latest_rows: BTreeMap::new(),
            rows_written: 0,
        })
    }

    /// Takes one instance's report.
    pub fn add(&mut self, sample: &Sample) {
        let mut second = sample.unix_second;
        if let Some(open) = self.next_open {
            second = second.max(open);
        }
        for rs in &sample.roles {
            // The machine is one source however many instances on it report it.
            let source_name = if rs.role == "host" {
                &sample.host
            } else {
                &sample.instance
            };
            self.add_role(sample.unix_second, second, source_name, &rs.role, rs);
            if PER_INSTANCE.contains(&rs.role.as_str()) {
                // Also a row of its own, written once the role has several instances.
                let own = format!("{}@{}", rs.role, sample.instance);
                self.add_role(sample.unix_second, second, source_name, &own, rs);
            }
        }
        if let Some(net) = &sample.net {
            let key = (sample.host.clone(), net.interface.clone());
            let (totals, cell) = slot(&mut self.roles, &mut self.open, second, "host");
            cell.levels.insert(key.0.clone(), (0, BTreeMap::new()));
            let now = net.values();
            let before = self.net.get(&key).copied();
            // The first report of an interface sets the baseline: its counters hold
            // everything since boot.
            let deltas: [u64; 4] =
                std::array::from_fn(|i| before.map_or(0, |b| now[i].saturating_sub(b[i])));
            for (i, name) in NET_COLUMNS.into_iter().enumerate() {
                totals.keys.insert(name.into());
                *cell.counts.entry(name.into()).or_default() += deltas[i];
                *totals.counts.entry(name.into()).or_default() += deltas[i];
            }
            // A gateway host of a lab has an interface of its own: its traffic goes in
            // its own rows too.
            if sample.roles.iter().any(|r| r.role == "server") {
                let own = format!("server@{}", sample.instance);
                let (totals, cell) = slot(&mut self.roles, &mut self.open, second, &own);
                for (i, name) in NET_COLUMNS.into_iter().enumerate() {
                    totals.keys.insert(name.into());
                    *cell.counts.entry(name.into()).or_default() += deltas[i];
                    *totals.counts.entry(name.into()).or_default() += deltas[i];
                }
            }
            // Several instances on one host report the same counters: keep the newest.
            let newest = match before {
                Some(b) => std::array::from_fn(|i| now[i].max(b[i])),
                None => now,
            };
            self.net.insert(key, newest);
        }
    }

    /// Adds what one role of one instance reported to the row of `key` (the role, or
    /// the role of that instance alone) for `second` (`reported`: the second it describes).
    fn add_role(
        &mut self,
        reported: u64,
        second: u64,
        source_name: &str,
        key: &str,
        rs: &hongbao_telemetry::sample::RoleSample,
    ) {
        let source_key = (source_name.to_string(), key.to_string());
        let first = !self.sources.contains_key(&source_key);
        let source = self.sources.entry(source_key).or_default();
        if first && rs.role == "host" {
            // The machine's busy time counts from boot: its first report is the baseline.
            source.cpu_ms = rs.cpu_ms;
        }
        let (totals, cell) = slot(&mut self.roles, &mut self.open, second, key);
        for (name, &value) in &rs.counters {
            let before = source.counters.get(name).copied().unwrap_or(0);
            let delta = value.saturating_sub(before);
            *cell.counts.entry(name.clone()).or_default() += delta;
            *totals.counts.entry(name.clone()).or_default() += delta;
            totals.keys.insert(name.clone());
            source.counters.insert(name.clone(), value.max(before));
        }
        let cpu = rs.cpu_ms.saturating_sub(source.cpu_ms);
        cell.cpu_ms += cpu;
        totals.cpu_ms += cpu;
        source.cpu_ms = source.cpu_ms.max(rs.cpu_ms);
        totals.keys.extend(rs.levels.keys().cloned());
        if reported >= source.last_second {
            source.last_second = reported;
            source.levels = (rs.processes, rs.levels.clone());
            cell.levels
                .insert(source_name.to_string(), source.levels.clone());
        }
        if !rs.latency_us.is_empty() {
            totals.keys.insert("latency".into());
            merge_sparse(
                cell.latency.get_or_insert_with(new_histogram),
                &rs.latency_us,
            );
            merge_sparse(
                totals.latency.get_or_insert_with(new_histogram),
                &rs.latency_us,
            );
        }
    }

    /// Whether `role` is a row to write: every role, and an instance's own rows
    /// (`server@gw1`) once its role has had several instances.
    fn written(&self, role: &str) -> bool {
        match role.split_once('@') {
            None => true,
            Some((base, _)) => {
                let mut instances = self.sources.keys().filter(|(_, r)| r == base);
                instances.next().is_some() && instances.next().is_some()
            }
        }
    }

    /// A phase starts at `unix_ms` (rows from its second on carry its name).
    pub fn mark(&mut self, unix_ms: u64, phase: &str) {
        self.marks.push((unix_ms / 1000, phase.to_string()));
        self.marks.sort_by_key(|(s, _)| *s);
    }

    fn phase_at(&self, second: u64) -> &str {
        self.marks
            .iter()
            .rev()
            .find(|(s, _)| *s <= second)
            .map_or("", |(_, name)| name.as_str())
    }

    /// Writes the rows of every second that ended `GRACE_SECS` before `now_second`.
    pub fn close_before(&mut self, now_second: u64) -> Result<()> {
        self.close_through(now_second.saturating_sub(GRACE_SECS + 1))
    }

    /// Writes the rows of every second reported so far.
    pub fn finish(&mut self) -> Result<()> {
        match self.open.keys().next_back().copied() {
            Some(last) => self.close_through(last),
            None => Ok(()),
        }
    }

    fn close_through(&mut self, last: u64) -> Result<()> {
        let Some(first) = self.next_open.or_else(|| self.open.keys().next().copied()) else {
            return Ok(());
        };
        for second in first..=last {
            self.close_second(second)?;
            self.next_open = Some(second + 1);
        }
        if let Some(out) = self.out.as_mut() {
            out.flush()
                .map_err(|e| Error::io("writing series.csv", e))?;
        }
        Ok(())
    }

    fn close_second(&mut self, second: u64) -> Result<()> {
        let mut cells = self.open.remove(&second).unwrap_or_default();
        let phase = self.phase_at(second).to_string();
        let roles: Vec<String> = self
            .roles
            .iter()
            .filter(|(r, t)| t.first_second <= second && self.written(r))
            .map(|(r, _)| r.clone())
            .collect();
        for role in roles {
            let mut cell = cells.remove(&role).unwrap_or_default();
            if role != "host" {
                // Instances that did not report this second but are not gone: carry levels.
                for ((instance, r), source) in &self.sources {
                    if *r == role
                        && !cell.levels.contains_key(instance)
                        && source.last_second + GONE_SECS >= second
                        && source.last_second > 0
                    {
                        cell.levels.insert(instance.clone(), source.levels.clone());
                    }
                }
            }
            let row = self.row(second, &role, &phase, &cell);
            let line: Vec<String> = COLUMNS
                .iter()
                .map(|c| match row.get(*c) {
                    Some(Value::String(s)) => csv_field(s),
                    Some(Value::Null) | None => String::new(),
                    Some(v) => v.to_string(),
                })
                .collect();
            let line = line.join(",") + "\n";
            if let Some(out) = self.out.as_mut() {
                out.write_all(line.as_bytes())
                    .map_err(|e| Error::io("writing series.csv", e))?;
            }
            self.csv.push_str(&line);
            self.rows_written += 1;
            let totals = self.roles.get_mut(&role).expect("role known");
            for (k, v) in &row {
                if LEVELS.contains(&k.as_str()) {
                    totals.levels.insert(k.clone(), v.as_u64().unwrap_or(0));
                }
            }
            if !role.contains('@') {
                self.latest_rows.insert(role, row);
            }
        }
        Ok(())
    }

    fn row(&self, second: u64, role: &str, phase: &str, cell: &Cell) -> Map<String, Value> {
        let totals = &self.roles[role];
        let has = |k: &str| totals.keys.contains(k);
        let mut row = Map::new();
        row.insert("unix_second".into(), second.into());
        row.insert("role".into(), role.into());
        row.insert("instances".into(), cell.levels.len().into());
        row.insert("phase".into(), phase.into());
        row.insert("cpu_seconds".into(), json!(cell.cpu_ms as f64 / 1000.0));
        for level in LEVELS {
            if has(level) {
                let sum: u64 = cell
                    .levels
                    .values()
                    .map(|(_, l)| l.get(*level).copied().unwrap_or(0))
                    .sum();
                row.insert(level.to_string(), sum.into());
            }
        }
        for name in COUNTERS.iter().chain(NET_COLUMNS.iter()) {
            if has(name) {
                let v = cell.counts.get(*name).copied().unwrap_or(0);
                row.insert(name.to_string(), v.into());
            }
        }
        if let Some(h) = cell.latency.as_ref().filter(|h| !h.is_empty()) {
            let ms = |us: u64| us as f64 / 1000.0;
            row.insert("latency_p50_ms".into(), json!(ms(h.value_at_quantile(0.5))));
            row.insert(
                "latency_p99_ms".into(),
                json!(ms(h.value_at_quantile(0.99))),
            );
            row.insert("latency_max_ms".into(), json!(ms(h.max())));
        }
        row
    }

    /// series.csv as written so far.
    pub fn csv(&self) -> &str {
        &self.csv
    }

    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// The newest closed row of every role, for the dashboard's headline.
    pub fn latest(&self) -> Value {
        json!({
            "rows": self.latest_rows,
            "phase": self.latest_rows.values().next().and_then(|r| r.get("phase")).cloned(),
            "unix_second": self.next_open.map(|s| s.saturating_sub(1)),
        })
    }

    /// Totals over the run as Prometheus text: counters per role, levels of the newest
    /// row, CPU, and the latency histogram of each role that reports one.
    pub fn metrics(&self) -> String {
        let mut m = Page::default();
        // An instance's own rows stay in series.csv: the page has one series per role.
        for (role, t) in self.roles.iter().filter(|(r, _)| !r.contains('@')) {
            let labels = [("role", role.clone())];
            for (k, v) in &t.counts {
                let (name, help) = match k.strip_prefix("net_") {
                    Some(rest) => (
                        format!("hongbao_network_{rest}_total"),
                        "Interface counter since the monitor started".to_string(),
                    ),
                    None => (
                        format!("hongbao_{k}_total"),
                        format!("{k} counted by each role since the monitor started"),
                    ),
                };
                m.counter(&name, &help, &labels, *v as f64);
            }
            m.counter("hongbao_cpu_seconds_total",
                "CPU time used by each role's processes (host: the whole machine) since the monitor started",
                &labels,
                t.cpu_ms as f64 / 1000.0,
            );
            for (k, v) in &t.levels {
                let name = match k.as_str() {
                    "rss_bytes" => "hongbao_resident_memory_bytes".to_string(),
                    _ => format!("hongbao_{k}"),
                };
                m.gauge(&name, &format!("{k} of each role"), &labels, *v as f64);
            }
            if let Some(h) = &t.latency {
                m.histogram(
                    "hongbao_shake_latency_seconds",
                    "Shake latency: from intended send time (load) or from request read to reply (server)",
                    &labels,
                    h,
                );
            }
        }
        m.counter(
            "hongbao_monitor_rows_total",
            "Series rows written",
            &[],
            self.rows_written as f64,
        );
        m.render()
    }
}

/// The run totals of `role` and its cell for `second`, made on first use.
fn slot<'a>(
    roles: &'a mut BTreeMap<String, RoleTotals>,
    open: &'a mut BTreeMap<u64, BTreeMap<String, Cell>>,
    second: u64,
    role: &str,
) -> (&'a mut RoleTotals, &'a mut Cell) {
    let totals = roles.entry(role.to_string()).or_insert_with(|| RoleTotals {
        first_second: second,
        ..Default::default()
    });
    let cell = open
        .entry(second)
        .or_default()
        .entry(role.to_string())
        .or_default();
    (totals, cell)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests;
