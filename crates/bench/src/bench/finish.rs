//! The bench's last step: `summary.json` from what the steps before found, and the
//! report drawn from the run's directory.

use super::audit::{Audited, Unloaded};
use super::faults::Judged;
use super::options::BenchOptions;
use super::phases::Phases;
use super::say::say;
use super::summary::{
    AuditSummary, ConnectionsSummary, LoadSummary, NetworkSummary, OptionsSummary, Resources,
    Summary,
};
use crate::{Error, Result};

/// The run's summary, from each step's findings.
pub(super) fn summary(
    opts: &BenchOptions,
    phases: Phases,
    unloaded: Unloaded,
    audited: Audited,
    faults: Judged,
) -> Summary {
    let (finished, start) = (unloaded.finished, unloaded.start);
    let samples = &audited.samples;
    let server_baseline = &audited.server_baseline;
    let peak_connections = unloaded.peak_connections;
    let server_peak = samples.iter().map(|s| s.rss_bytes).max().unwrap_or(0);
    let server_cpu = samples
        .last()
        .map_or(0, |s| s.cpu_ms)
        .saturating_sub(server_baseline.cpu_ms);
    let per_conn = |peak: u64, base: u64| {
        peak.saturating_sub(base)
            .checked_div(peak_connections)
            .unwrap_or(0)
    };
    let load_baseline = start.load_rss_baseline_bytes;
    let audit_ok = phases.discrepancies.is_empty() && phases.summaries.iter().all(|s| s.audit_ok);
    Summary {
        preset_connections: opts.connections,
        connections: ConnectionsSummary {
            target: opts.connections,
            peak: peak_connections,
            connect_seconds: start.connect_seconds,
            all_connected: start.all_connected,
        },
        phases: phases.summaries,
        shake: phases.shake_total,
        send: phases.send_total,
        broadcast: unloaded.broadcast,
        audit: AuditSummary {
            ok: audit_ok,
            discrepancies: phases.discrepancies,
            users_checked: audited.users_checked,
            unacknowledged_cents: audited.unacknowledged_cents,
            server: audited.server_audit,
        },
        resources: Resources {
            server_rss_bytes: server_peak,
            server_rss_baseline_bytes: server_baseline.rss_bytes,
            server_rss_per_connection_bytes: per_conn(server_peak, server_baseline.rss_bytes),
            server_cpu_seconds: server_cpu as f64 / 1000.0,
            load_rss_bytes: unloaded.load_peak_rss,
            load_rss_baseline_bytes: load_baseline,
            load_rss_per_connection_bytes: per_conn(unloaded.load_peak_rss, load_baseline),
            load_cpu_seconds: finished.cpu_ms as f64 / 1000.0,
        },
        agents: audited.agents,
        target: opts
            .target
            .as_ref()
            .map(|t| format!("clients {} admin {}", t.clients, t.admin)),
        load: LoadSummary {
            procs: unloaded.load_procs as u64,
            totals: finished.totals,
            coordinator: finished.coordinator.clone(),
        },
        options: options(opts),
        network: NetworkSummary {
            own_namespace: opts.netns,
            ehash_buckets: hongbao_sys::doctor::ehash_buckets(),
        },
        engines: audited.engines,
        fault: faults.fault,
        chaos: faults.chaos,
        history: audited.history,
        tls: audited.tls,
    }
}

/// What the bench was asked to do, as the summary tells it.
fn options(opts: &BenchOptions) -> OptionsSummary {
    OptionsSummary {
        workers: opts.workers.clone(),
        phase_qps: opts.phase_qps.clone(),
        shake_packets: opts.shake_packets,
        send_packets: opts.send_packets,
        campaign_rate: opts.campaign_rate,
        recipients: opts.recipients,
        max_shake_qps: opts.max_shake_qps,
        connect_rate: opts.connect_rate,
        transport: opts.transport.to_string(),
        http_connection: opts.http_connection.to_string(),
        broadcast_every: opts.broadcast_every_secs,
        max_queue_ms: opts.max_queue_ms,
        broadcast_yield_ms: opts.broadcast_yield_ms,
        server_nice: opts.server_nice,
        hosts: opts.hosts,
        fault: opts.fault.map_or(String::new(), |f| f.name().to_string()),
    }
}

/// Writes `summary.json` and the report, and says where they are.
pub(super) fn write(opts: &BenchOptions, summary: &Summary) -> Result<()> {
    let path = opts.out.join("summary.json");
    let writing = || format!("writing {}", path.display());
    let json = serde_json::to_string_pretty(summary).map_err(|e| Error::json(writing(), e))?;
    std::fs::write(&path, json).map_err(|e| Error::io(writing(), e))?;
    let charts = hongbao_report::write_report(&opts.out)
        .map_err(|e| Error::from(e).within("writing the report"))?;
    say(&format!(
        "bench: report {} ({} charts)",
        opts.out.join("report.html").display(),
        charts.len()
    ));
    say(&format!(
        "bench: audit {}; summary in {}",
        if summary.audit.ok { "ok" } else { "FAILED" },
        opts.out.join("summary.json").display()
    ));
    Ok(())
}
