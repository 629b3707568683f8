//! `hongbao capacity PLAN.toml`: the layered capacity test of the seed (`002_*`), run by
//! the tool (docs/capacity.md). For each stage of the plan (which layers are up, how many
//! instances of the one it scales) it brings the layers up, connects the load, raises the
//! offered QPS step by step, holds each step, and records what the clients saw
//! (intended-time latency, errors by cause) and what each layer and instance spent (CPU,
//! network, Redis and PostgreSQL). The knee is the highest step that met the SLO; the
//! first that did not says what broke. Scaling stages give linearity, and a target gives
//! instances per layer.
//!
//! - `plan`: the TOML plan; `stack`: bringing a stage's layers up;
//! - `probe`: CPU and network per instance from /proc;
//! - `judge`: what a step measured and whether it met the SLO; `knee`: a run's knee and
//!   what broke; `sizing`: linearity across instance counts, instances per layer;
//! - `summary`: `summary.json` as typed structs; `page`: its companions, report.html and
//!   the charts.

pub mod judge;
pub mod knee;
mod page;
pub mod plan;
pub mod probe;
pub mod sizing;
mod stack;
mod summary;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hongbao_monitor::Monitor;
use hongbao_sys::clock::unix_ms;

use crate::bench::SECRET;
use hongbao_load::coordinator::{Load, LoadOptions, Row};
use hongbao_load::transport::Transport;
use judge::{StepRecord, Window};
use knee::RunRecord;
use plan::{Plan, Stage};
use probe::{Probe, Watched};
use stack::Stack;
pub use summary::{Machine, Summary, SCHEMA};

pub struct CapacityOptions {
    pub plan: Plan,
    pub out: PathBuf,
    /// The monitor (live dashboard, `series/series.csv`).
    pub monitor_listen: SocketAddr,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// Runs the plan; writes DIR/summary.json, DIR/report.html and the charts.
pub fn run(opts: CapacityOptions) -> anyhow::Result<Summary> {
    let out = &opts.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(
        out.join("plan.json"),
        serde_json::to_vec_pretty(&opts.plan)?,
    )?;
    let series_dir = out.join("series");
    std::fs::create_dir_all(&series_dir)?;
    let monitor = Monitor::start(opts.monitor_listen, Some(&series_dir), "hongbao capacity")?;
    say(&format!(
        "capacity: plan {:?}, {} runs; dashboard at http://{}/",
        opts.plan.name,
        opts.plan.runs().len(),
        monitor.addr()
    ));
    // Ctrl-C or SIGTERM: the step under way ends, its layers go down, what was measured
    // is written.
    let stop = hongbao_sys::Stop::on_signals()?;
    let mut summary = Summary {
        schema: SCHEMA,
        plan_name: opts.plan.name.clone(),
        started_unix_ms: unix_ms(),
        finished_unix_ms: 0,
        machine: Machine::read(),
        slo: opts.plan.slo.clone(),
        load: opts.plan.load.clone(),
        runs: Vec::new(),
        linearity: Vec::new(),
        capacity_plan: None,
        charts: Vec::new(),
    };
    for (s, instances) in opts.plan.runs() {
        if stop.requested() {
            say("capacity: interrupted; the runs left are not run");
            break;
        }
        let stage = &opts.plan.stages[s];
        let dir = out.join(format!("{}-x{instances}", slug(&stage.name)));
        say(&format!(
            "capacity: stage {:?} ({}), {} ×{instances}",
            stage.name,
            stage.layers.name(),
            stage.scaled_layer()
        ));
        let mut run = RunRecord {
            stage: stage.name.clone(),
            layers: stage.layers.name().to_string(),
            scaled_layer: stage.scaled_layer().to_string(),
            instances,
            ..Default::default()
        };
        let cx = Run {
            plan: &opts.plan,
            stage,
            instances,
            monitor: &monitor,
            stop: &stop,
            out: &opts.out,
        };
        if let Err(e) = run_stage(&cx, &dir, &mut run) {
            tracing::error!(
                stage = stage.name,
                instances,
                error = format!("{e:#}"),
                "a capacity stage failed"
            );
            run.failed = Some(format!("{e:#}"));
        }
        run.conclude();
        if let Some(why) = &run.failed {
            run.note = format!("failed: {why}; {}", run.note);
        }
        say(&format!(
            "capacity: {} ×{instances}: {}",
            stage.name, run.note
        ));
        summary.runs.push(run);
        // Written as it goes: an interrupted plan leaves what it measured.
        write_summary(out, &summary)?;
    }
    summary.linearity = sizing::linearity(&summary.runs);
    summary.capacity_plan = opts
        .plan
        .target
        .as_ref()
        .map(|t| sizing::capacity_plan(&summary.runs, &opts.plan.slo, t));
    summary.finished_unix_ms = unix_ms();
    monitor.finish()?;
    if let Err(e) = hongbao_report::write_report(&series_dir) {
        tracing::warn!(
            error = format!("{e:#}"),
            "writing the per-second report failed"
        );
    }
    summary.charts = page::charts(out, &summary)?;
    write_summary(out, &summary)?;
    std::fs::write(out.join("report.html"), page::html(&summary))?;
    for line in page::table(&summary).lines() {
        say(&format!("capacity: {line}"));
    }
    say(&format!(
        "capacity: summary in {}, report in {}",
        out.join("summary.json").display(),
        out.join("report.html").display()
    ));
    Ok(summary)
}

/// Redraws DIR/report.html and the charts from DIR/summary.json (`hongbao report DIR`
/// on a capacity run's directory).
pub fn redraw(dir: &Path) -> anyhow::Result<Summary> {
    let path = dir.join("summary.json");
    let mut summary: Summary = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("reading {}", path.display()))?;
    summary.charts = page::charts(dir, &summary)?;
    write_summary(dir, &summary)?;
    std::fs::write(dir.join("report.html"), page::html(&summary))?;
    Ok(summary)
}

/// Whether DIR holds a capacity run (its summary.json is one).
pub fn is_capacity_dir(dir: &Path) -> bool {
    std::fs::read(dir.join("summary.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v["schema"].is_number() && v["runs"].is_array() && v["slo"].is_object())
}

fn write_summary(out: &Path, summary: &Summary) -> anyhow::Result<()> {
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_vec_pretty(summary)?,
    )
    .with_context(|| format!("writing {}", out.join("summary.json").display()))
}

/// The load's complete row for `second` (every client process reported), waiting up to
/// `deadline` for it.
fn row_at(load: &Load, second: u64, deadline: Instant) -> Option<Row> {
    loop {
        let procs = load.procs();
        if let Some(row) = load
            .rows()
            .into_iter()
            .find(|r| r.second == second && r.reports >= procs)
        {
            return Some(row);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sleep_until_ms(at: u64) {
    let now = unix_ms();
    if at > now {
        std::thread::sleep(Duration::from_millis(at - now));
    }
}

/// One stage at one instance count: up, connected, the steps until one misses the SLO,
/// down.
/// What every part of one run shares.
struct Run<'a> {
    plan: &'a Plan,
    stage: &'a Stage,
    instances: u32,
    monitor: &'a Monitor,
    stop: &'a hongbao_sys::Stop,
    /// The run's directory (the agents' files, unless the plan names theirs).
    out: &'a Path,
}

fn run_stage(cx: &Run, dir: &Path, run: &mut RunRecord) -> anyhow::Result<()> {
    let Run {
        plan,
        stage,
        instances,
        monitor,
        ..
    } = *cx;
    let users = plan.load.users;
    // Long enough for every step and the connecting before them.
    let campaign_secs =
        60 + stage.steps.len() as u64 * (plan.load.step_secs + plan.load.settle_secs + 2);
    let stack = Stack::up(
        stage,
        instances,
        users,
        plan.load.procs,
        campaign_secs,
        dir,
        (monitor.addr(), monitor.key()),
    )?;
    let result = drive(cx, &stack, run);
    let down = stack.down();
    result?;
    down
}

fn drive(cx: &Run, stack: &Stack, run: &mut RunRecord) -> anyhow::Result<()> {
    let Run {
        plan,
        stage,
        monitor,
        ..
    } = *cx;
    let users = plan.load.users;
    let load = Load::start(LoadOptions {
        server: stack.target,
        transport: Transport::Http,
        users,
        first_user: 1,
        qps: 0,
        procs: plan.load.procs,
        source_ips: None,
        connect_rate: 20_000,
        connect_storm: false,
        connect_timeout_ms: hongbao_load::client::DEFAULT_CONNECT_TIMEOUT_MS,
        secret: SECRET.into(),
        signer: Default::default(),
        tls_ca: None,
        connect_at_epoch: false,
        monitor: Some(monitor.addr().to_string()),
        monitor_key: Some(monitor.key().to_string()),
        monitor_key_file: None,
        // Capacity is measured with every request offered: nobody backs off.
        overload_backoff_secs: 0,
        http_connection: plan.load.http_connection,
        notice_poll_secs: 0,
        hosts: stack.load_hosts.clone(),
        request: stage.template()?,
        agents: (plan.load.agents > 0).then(|| hongbao_load::coordinator::AgentPlan {
            listen: plan
                .load
                .agent_listen
                .unwrap_or_else(|| stack.agent_listen()),
            count: plan.load.agents,
            dir: plan
                .load
                .agent_dir
                .clone()
                .unwrap_or_else(|| cx.out.join("agents")),
            cert_names: Vec::new(),
            join_timeout: std::time::Duration::from_secs(120),
            spawn: plan.load.spawn_agents,
        }),
    })?;
    let result = steps(cx, stack, &load, run);
    let stopped = load.stop();
    result?;
    stopped?;
    Ok(())
}

fn steps(cx: &Run, stack: &Stack, load: &Load, run: &mut RunRecord) -> anyhow::Result<()> {
    let Run {
        plan,
        stage,
        instances,
        monitor,
        stop,
        ..
    } = *cx;
    let users = plan.load.users;
    let per_request = plan.load.http_connection.per_request();
    if !per_request && !load.wait_logged_in(Duration::from_secs(120)) {
        bail!(
            "only {} of {users} users connected within 120 s",
            load.logged_in()
        );
    }
    let mut watched = stack.watched.clone();
    for (k, pid) in load.pids().into_iter().enumerate() {
        watched.push(Watched::new(
            "load",
            format!("process {k}"),
            vec![pid],
            false,
        ));
    }
    let probe = Probe::start(watched.clone())?;
    let epoch = load.epoch_ms();
    let settle = plan.load.settle_secs;
    let hold = plan.load.step_secs;
    for &qps in &stage.steps {
        let from = load.set_qps(qps)?;
        monitor.mark_at(
            epoch + from * 1000,
            &format!("{} ×{instances} {qps}/s", stage.name),
        );
        let start = from + settle;
        sleep_until_ms(epoch + start * 1000);
        let engines_start = stack.engine_counters().map(|e| (unix_ms(), e));
        let before_second = start.checked_sub(1);
        let before = before_second
            .and_then(|s| row_at(load, s, Instant::now() + Duration::from_secs(5)))
            .unwrap_or_default();
        // The step so far (each second, without the engines) and whole (with them).
        let record = |rows: &[Row], samples: &[probe::Sample], engines| {
            Window {
                offered_qps: qps,
                rows,
                before: &before,
                watched: &watched,
                samples,
                engines,
                slo: &plan.slo,
                refusing_layer: stage.layers.refusing_layer(),
            }
            .record()
        };
        let mut rows: Vec<Row> = Vec::new();
        let mut step = StepRecord::default();
        for k in 0..hold {
            let second = start + k;
            let deadline = Instant::now()
                + Duration::from_millis(
                    (epoch + (second + 1) * 1000 + 5000).saturating_sub(unix_ms()),
                );
            let Some(row) = row_at(load, second, deadline) else {
                step.ended_early = Some(format!("no report from the load for second {second}"));
                break;
            };
            rows.push(row);
            if stop.requested() {
                step.ended_early = Some("interrupted".into());
                break;
            }
            let samples = probe.between(epoch + start * 1000, epoch + (second + 1) * 1000);
            step = record(&rows, &samples, None);
            if k + 1 < hold {
                if let Some(why) = judge::clearly_broken(&step, &plan.slo) {
                    step.ended_early = Some(why);
                    break;
                }
            }
        }
        let ended_early = step.ended_early.take();
        let engines_end = stack.engine_counters().map(|e| (unix_ms(), e));
        let last_second = start + rows.len() as u64;
        let samples = probe.between(epoch + start * 1000, epoch + last_second * 1000);
        let engines = match (&engines_start, &engines_end) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        };
        step = record(&rows, &samples, engines);
        if let Some(why) = ended_early {
            step.broken.push(format!("ended early: {why}"));
            step.meets_slo = false;
            step.ended_early = Some(why);
        }
        say(&format!(
            "capacity:   {qps}/s offered: achieved {:.0}/s p50 {:.2} ms p99 {:.2} ms errors {:.2}%{}{}",
            step.achieved_qps,
            step.latency.p50_ms,
            step.latency.p99_ms,
            step.error_rate * 100.0,
            step.bottleneck
                .as_ref()
                .map(|b| format!(" {} {} {} {:.2} cores", b.cause, b.layer, b.instance, b.cpu_cores))
                .unwrap_or_default(),
            if step.meets_slo {
                " — meets the SLO".to_string()
            } else {
                format!(" — misses: {}", step.broken.join("; "))
            }
        ));
        if stop.requested() {
            // A step cut short by the operator says nothing about the SLO: left out.
            let _ = load.set_qps(0);
            bail!("interrupted at {qps}/s");
        }
        let meets = step.meets_slo;
        run.steps.push(step);
        if !meets {
            break;
        }
    }
    let _ = load.set_qps(0);
    Ok(())
}
