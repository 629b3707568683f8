//! The bench's audit, once the phases and the faults are over. It holds three witnesses
//! against each other: the campaigns' own counts (judged phase by phase), the clients'
//! counts of what they were told (final once the load has stopped), and the ledger's
//! balances user by user; and the history check, operation by operation. The server is
//! stopped once it has been read, and the monitor's series finished.

use std::time::Duration;

use hongbao_load::broadcast;
use hongbao_load::coordinator::{AgentSummary, Finished, Refusal, Row};
use hongbao_money::seam::Balances;
use hongbao_money::Audit;
use hongbao_server::stats::Stats;

use super::agents;
use super::broadcaster;
use super::connect::{AtStart, Connected};
use super::history;
use super::ledger;
use super::phases::Phases;
use super::say::say;
use super::server::{Server, ServerSample};
use super::setup::Bench;
use super::summary::{self, AgentsSummary, Discrepancy, EngineSummary, HistorySummary, TlsSummary};
use crate::Result;

/// Against a running deployment, how long after the load's last second it is stopped:
/// the deployment's own campaigns go on releasing, and a shake fired in that second may
/// still win one of theirs; its answer comes before the stop (or the ledger would hold a
/// win no client heard of).
const TARGET_LAST_ANSWERS: Duration = Duration::from_millis(1000);

/// The load stopped: what its clients counted and were told, and its processes' cost.
pub(super) struct Unloaded {
    pub finished: Finished,
    pub peak_connections: u64,
    pub load_procs: u32,
    pub load_peak_rss: u64,
    pub agents: Vec<AgentSummary>,
    pub refused: u64,
    pub refusals: Vec<Refusal>,
    pub broadcast: broadcast::Summary,
    pub start: AtStart,
}

/// What the audit read of the server and the ledger before it stopped them, and found.
pub(super) struct Audited {
    /// The server's final `GET /v1/audit`.
    pub server_audit: Audit,
    pub history: HistorySummary,
    pub samples: Vec<ServerSample>,
    pub server_baseline: ServerSample,
    pub engines: Option<EngineSummary>,
    pub tls: Option<TlsSummary>,
    pub agents: Option<AgentsSummary>,
    pub users_checked: u64,
    pub unacknowledged_cents: u64,
}

impl Bench<'_> {
    /// Quiets the load and stops it; judges, against a deployment, the phases' wins by
    /// campaign, and the broadcasts against what was delivered. `rows` are the load's
    /// rows as the faults were judged; `drops_after` its drops as the phases ended.
    pub fn stop_load(
        &self,
        connected: Connected,
        phases: &mut Phases,
        rows: &[Row],
        drops_after: u64,
    ) -> Result<Unloaded> {
        let Connected {
            load,
            seconds,
            start,
        } = connected;
        let opts = self.opts;
        let peak_connections = rows.iter().map(|r| r.logged_in).max().unwrap_or(0);
        let load_procs = load.procs();
        let load_peak_rss = load_peak_rss(rows, &load.pids());
        let quiet_from = load.set_qps(0)?;
        if opts.target.is_some() {
            seconds.wait_until(quiet_from);
            std::thread::sleep(TARGET_LAST_ANSWERS);
        }
        self.monitor.mark("stop");
        let finished = load.stop()?;
        if opts.target.is_some() {
            // The run's wins, by its campaigns: the deployment's own are not the run's.
            summary::judge_target_wins(
                &mut phases.summaries,
                &phases.shake_campaigns,
                &finished.history,
                &mut phases.discrepancies,
            );
            phases.shake_total = Default::default();
            for s in &phases.summaries {
                phases.shake_total.add(&s.shake);
            }
        }
        let (agents, (refused, refusals)) = (load.agents(), load.agent_refusals());
        let deliveries = load.broadcasts();
        drop(load);
        let broadcast = broadcaster::judge(
            &opts.out,
            &phases.broadcaster.sent,
            &deliveries,
            drops_after,
            &mut phases.discrepancies,
        )?;
        Ok(Unloaded {
            finished,
            peak_connections,
            load_procs,
            load_peak_rss,
            agents,
            refused,
            refusals,
            broadcast,
            start,
        })
    }

    /// Reads the server's last word (its audit, the ledger's balances and operations, its
    /// counters), stops it and finishes the series, then holds the ledger user by user
    /// against what each client was told.
    pub fn audit(self, phases: &mut Phases, unloaded: &mut Unloaded) -> Result<Audited> {
        let opts = self.opts;
        let samples = self.sampler.stop();
        let server = &self.server;
        let server_audit: Audit = server.get("/v1/audit")?;
        // Witness three: every balance the ledger holds, read through the server.
        let balances: Balances = server.get("/v1/balances")?;
        let scope = unloaded.start.history_scope.take().map(|mut scope| {
            scope.campaigns = phases.shake_campaigns.clone();
            scope
        });
        let finished = &unloaded.finished;
        let history = history::check(
            server,
            &finished.history,
            scope.as_ref(),
            &mut phases.discrepancies,
            say,
        )?;
        let engines = engines(server, phases, unloaded);
        let tls = match &opts.tls_dir {
            Some(_) => Some(tls(server, &samples, finished)?),
            None => None,
        };
        self.server.stop()?;
        if let Some(disk) = self.small_disk {
            if let Err(e) = disk.unmount_keeping() {
                say(&format!("bench: keeping the ledger from its tmpfs: {e:#}"));
            }
        }
        // Both sent their last second on the way out: the series is complete.
        self.monitor.finish()?;

        // The ledger, user by user, against what each user's client was told.
        let finished = &unloaded.finished;
        let balances = match &unloaded.start.balances {
            Some(before) => ledger::since(&balances, before),
            None => balances,
        };
        let (balances, users_incomplete) = ledger::without_lost(balances, &finished.lost);
        let agents = opts.agents.as_ref().map(|a| {
            agents::summarize(
                a,
                std::mem::take(&mut unloaded.agents),
                &finished.lost,
                users_incomplete,
                unloaded.refused,
                std::mem::take(&mut unloaded.refusals),
            )
        });
        if let Some(a) = &agents {
            say(&a.line());
        }
        let lost_any = !finished.lost.is_empty();
        let ledger::Checked {
            users_checked,
            unacknowledged_cents,
        } = ledger::check(
            &balances,
            &finished.users,
            phases.faults.faulty || lost_any,
            &mut phases.discrepancies,
        );
        if !server_audit.ok {
            phases
                .discrepancies
                .push(Discrepancy::new("conservation", None, 0, 0));
        }
        Ok(Audited {
            server_audit,
            history,
            samples,
            server_baseline: self.server_baseline,
            engines,
            tls,
            agents,
            users_checked,
            unacknowledged_cents,
        })
    }
}

/// With `--hosts`: the engines' counters from the phases' start to now, beside the
/// operations the clients saw over the same span.
fn engines(server: &Server, phases: &Phases, unloaded: &Unloaded) -> Option<EngineSummary> {
    let (Some(before), Some(after)) = (&unloaded.start.engines, server.engine_counters()) else {
        return None;
    };
    let (d, t, t0) = (
        after.since(before),
        &unloaded.finished.totals,
        &unloaded.start.totals,
    );
    Some(EngineSummary {
        redis_calls: d.redis_calls,
        pg_commits: d.pg_commits,
        pg_rows_inserted: d.pg_rows_inserted,
        pg_rows_updated: d.pg_rows_updated,
        cpu_seconds: d.cpu_ms as f64 / 1000.0,
        shake_replies: t.shake_replies - t0.shake_replies,
        wins: t.won - t0.won,
        opens: t.opens_sent - t0.opens_sent,
        packets_sent: phases.send_total.packets,
        outbox: server.outbox(),
    })
}

/// The handshakes of a TLS run: the server's counters over the run (a fresh server),
/// and the clients'.
fn tls(server: &Server, samples: &[ServerSample], finished: &Finished) -> Result<TlsSummary> {
    let stats: Stats = server.get("/v1/stats")?;
    let counted = &stats.totals.counters;
    let t = &finished.totals;
    Ok(TlsSummary {
        handshakes_full: counted.tls_handshakes,
        handshakes_resumed: counted.tls_resumed,
        refused: counted.tls_refused,
        timed_out: counted.tls_handshake_timeouts,
        abandoned: counted.tls_abandoned,
        in_progress_max: samples.iter().map(|s| s.tls_handshaking).max().unwrap_or(0),
        accept_paused: counted.accept_paused,
        client_handshake_failures: t.failed_handshake,
        client_timeouts: t.failed_timeout,
    })
}

/// The load's peak memory: the most its rows reported, or what its processes hold now.
fn load_peak_rss(rows: &[Row], pids: &[u32]) -> u64 {
    let from_rows = rows.iter().map(|r| r.rss_bytes).max().unwrap_or(0);
    let now: u64 = pids
        .iter()
        .map(|p| hongbao_sys::usage::usage_of(&p.to_string()).0)
        .sum();
    from_rows.max(now)
}
