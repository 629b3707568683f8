//! `summary.json`: what a bench run measured and what its audit found, as typed structs
//! (docs/bench.md describes every field; a test holds the two together, and the bench
//! tests read every summary back through these types, refusing unknown fields).
//!
//! Also the per-phase arithmetic: medians, latency quantiles, measured campaign rates,
//! and the checks of the campaigns' counts against the clients'.

use hdrhistogram::Histogram;
use hongbao_money::api::CampaignState;
use hongbao_money::{Audit, CampaignStatus};
use serde::{Deserialize, Serialize};

use hongbao_load::broadcast;
use hongbao_load::coordinator::{progress, Row};
use hongbao_load::report::{self, Counters};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub preset_connections: u64,
    pub connections: ConnectionsSummary,
    pub phases: Vec<PhaseSummary>,
    pub shake: ShakeAudit,
    pub send: SendAudit,
    pub broadcast: broadcast::Summary,
    pub audit: AuditSummary,
    pub resources: Resources,
    pub load: LoadSummary,
    pub options: OptionsSummary,
    pub network: NetworkSummary,
    /// With `--hosts`: what Redis and PostgreSQL did over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines: Option<EngineSummary>,
    /// With `--fault`: what was done and what the clients saw of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultSummary>,
    /// With `--chaos`: every fault done and what each cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chaos: Option<super::chaos::ChaosSummary>,
    /// Every win and open the clients were told of, against the ledger's, op by op.
    #[serde(default)]
    pub history: HistorySummary,
    /// With `--agents`: each agent, its clock, those lost, strangers refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentsSummary>,
    /// With `--target-*`: the deployment loaded (its clients' address and admin URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// With `--tls`: the handshakes, on both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSummary>,
}

/// The TLS handshakes of a `--tls` run: the server's (its workers' counters over the
/// run) and what the clients saw. A TLS connection's memory is `resources`'
/// `server_bytes_per_connection` and `load_bytes_per_connection` of the same run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSummary {
    /// Handshakes done: full, and resumed from a ticket.
    pub handshakes_full: u64,
    pub handshakes_resumed: u64,
    /// Failed, by why: refused (not TLS, nothing in common), not done within the
    /// server's handshake deadline, and clients that left before theirs was done (among
    /// them those that gave up in the accept queue, let go before any handshake work).
    pub refused: u64,
    pub timed_out: u64,
    pub abandoned: u64,
    /// The most under way at once in the once-a-second samples (every worker's), and the
    /// times a worker stopped accepting at its bound (`max_tls_handshakes`).
    pub in_progress_max: u64,
    pub accept_paused: u64,
    /// The clients' side: connections whose handshake (or upgrade) failed, and attempts
    /// that timed out (connect, handshake, upgrade: 10 s), each tried again on the
    /// back-off.
    pub client_handshake_failures: u64,
    pub client_timeouts: u64,
}

/// The agents of a run (docs/agents.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsSummary {
    pub count: u32,
    pub agents: Vec<hongbao_load::coordinator::AgentSummary>,
    /// Agents lost before their last report: their counters are what they had reported,
    /// and their users' history is incomplete (their users are left out of the balance
    /// check and counted in `users_incomplete`).
    pub lost: Vec<hongbao_load::coordinator::LostSlice>,
    pub users_incomplete: u64,
    /// Would-be agents refused at the door, and the newest of them.
    pub refused: u64,
    pub refusals: Vec<hongbao_load::coordinator::Refusal>,
    /// The largest |offset| and round trip measured, µs.
    pub offset_max_us: u64,
    pub rtt_max_us: u64,
}

/// A fault injected mid-run, and the clients' connections around it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSummary {
    /// What the bench did (the line it printed).
    pub what: String,
    /// The second of the run (from the load's epoch) it was done in.
    pub at_second: u64,
    /// Connections the clients lost from that second on.
    pub dropped: u64,
    /// The fewest users logged in at the end of a second from then on.
    pub logged_in_min: u64,
    /// Within how many seconds of the fault every dropped user had logged in again and
    /// all were logged in (counted in whole seconds from the start of the fault's
    /// second: 1 = within that second; 0 = nobody was dropped); none if some never were.
    pub reconnected_secs: Option<u64>,
    /// Over the fault's second and the `FAULT_WINDOW_SECS - 1` after it, within its
    /// phase: seconds in which the shakes served (answered
    /// `won` or `nothing`, as the clients saw them) fell below 90% of the rate asked...
    #[serde(default)]
    pub reduced_secs: u64,
    /// ...the shakes served short of the rate asked over those seconds, in all...
    #[serde(default)]
    pub shakes_short: u64,
    /// ...and the shakes answered `overloaded` and firings skipped backing off.
    #[serde(default)]
    pub overloaded: u64,
    #[serde(default)]
    pub backed_off: u64,
    /// Connection attempts refused (ECONNREFUSED) from the fault's second on.
    #[serde(default)]
    pub refused_connects: u64,
    /// Requests answered with an error from the fault's second on (a commit refused
    /// would be one).
    #[serde(default)]
    pub error_replies: u64,
    /// `upgrade`: what the upgrade did, as the new server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<super::local::Upgraded>,
    /// `upgrade` of a lab: each gateway's step of the rolling upgrade, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rolled: Vec<super::rolling::RolledGateway>,
}

/// How many seconds from a fault's on its served rate is judged.
pub const FAULT_WINDOW_SECS: u64 = 30;

/// One second of the load, as a fault is judged: the second, users logged in at its end, and the clients' cumulative disconnects, logins, shakes served
/// (`won` + `nothing`), `overloaded` answers and firings backed off.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultSecond {
    pub second: u64,
    pub logged_in: u64,
    pub disconnects: u64,
    pub logins: u64,
    pub served: u64,
    pub overloaded: u64,
    pub backed_off: u64,
    /// Connection attempts refused.
    pub refused: u64,
    /// Requests answered with an error.
    pub error_replies: u64,
}

impl FaultSummary {
    /// From the load's seconds around a fault done in `at_second` to `users` users.
    pub fn from_rows(what: String, at_second: u64, users: u64, rows: &[FaultSecond]) -> Self {
        let before = rows.iter().rev().find(|r| r.second < at_second);
        let (d0, l0) = before.map_or((0, 0), |r| (r.disconnects, r.logins));
        let (r0, e0) = before.map_or((0, 0), |r| (r.refused, r.error_replies));
        let after: Vec<&FaultSecond> = rows.iter().filter(|r| r.second >= at_second).collect();
        let dropped = after.last().map_or(0, |r| r.disconnects - d0);
        let reconnected_secs = if dropped == 0 {
            Some(0)
        } else {
            // Every drop seen and every user logged in again. Not "as many logins as
            // drops": a connection nginx took and closed when its gateway was gone is a
            // drop that never logged in, and a run waited for a login that never came.
            after
                .iter()
                .find(|r| r.disconnects - d0 >= dropped && r.logins > l0 && r.logged_in >= users)
                .map(|r| r.second - at_second + 1)
        };
        FaultSummary {
            what,
            at_second,
            dropped,
            logged_in_min: after.iter().map(|r| r.logged_in).min().unwrap_or(users),
            reconnected_secs,
            refused_connects: after.last().map_or(0, |r| r.refused - r0),
            error_replies: after.last().map_or(0, |r| r.error_replies - e0),
            ..FaultSummary::default()
        }
    }

    /// The served rate around the fault, second by second, in its phase: `asked` shakes
    /// a second, to its last second `until`.
    pub fn with_served(mut self, (asked, until): (u64, u64), rows: &[FaultSecond]) -> Self {
        let at = self.at_second;
        let from = rows
            .iter()
            .rev()
            .find(|r| r.second < at)
            .copied()
            .unwrap_or_default();
        let mut prev = from;
        for r in rows
            .iter()
            .filter(|r| r.second >= at && r.second < at + FAULT_WINDOW_SECS && r.second <= until)
        {
            let served = r.served - prev.served;
            if served * 10 < asked * 9 {
                self.reduced_secs += 1;
            }
            self.shakes_short += asked.saturating_sub(served);
            prev = *r;
        }
        self.overloaded = prev.overloaded - from.overloaded;
        self.backed_off = prev.backed_off - from.backed_off;
        self
    }
}

/// The engines' work over a `--hosts` run (from the lab's first phase to its end), and
/// the operations it served, for costs per operation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSummary {
    /// Redis commands by name, over every node (commands run inside scripts included).
    pub redis_calls: std::collections::BTreeMap<String, u64>,
    pub pg_commits: u64,
    pub pg_rows_inserted: u64,
    pub pg_rows_updated: u64,
    /// Over the same span: shake replies, wins, opens answered (from the clients), and
    /// packets sent (campaigns').
    pub shake_replies: u64,
    pub wins: u64,
    pub opens: u64,
    pub packets_sent: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionsSummary {
    pub target: u64,
    pub peak: u64,
    pub connect_seconds: f64,
    pub all_connected: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyMs {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl LatencyMs {
    pub fn of(h: &Histogram<u64>) -> LatencyMs {
        if h.is_empty() {
            return LatencyMs::default();
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        LatencyMs {
            p50: ms(0.5),
            p99: ms(0.99),
            p999: ms(0.999),
            max: h.max() as f64 / 1000.0,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSummary {
    pub name: String,
    pub target_qps: u64,
    pub seconds: u64,
    pub client_qps_median: f64,
    pub server_qps_median: f64,
    pub latency_ms: LatencyMs,
    pub open_latency_ms: LatencyMs,
    /// How late the load sent its shakes against their intended time (included in
    /// `latency_ms`): the load generator's own lag, e.g. when it shares the machine.
    pub send_lag_ms: LatencyMs,
    pub overloaded: u64,
    /// Shakes the schedule asked for that users skipped while backing off after an
    /// "overloaded" (not sent, not errors).
    pub backed_off: u64,
    pub errors: u64,
    /// |client median − target| / target ≤ 2% (meaningful when nothing was overloaded).
    pub qps_within_2pct: bool,
    pub shake_release_rate_per_sec: f64,
    pub send_create_rate_per_sec: f64,
    /// Both campaigns within 1% of their configured rate.
    pub campaign_rates_within_1pct: bool,
    pub shake: ShakeAudit,
    pub send: SendAudit,
    pub audit_ok: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShakeAudit {
    pub packets: u64,
    pub released: u64,
    pub won_server: u64,
    pub won_clients: u64,
    pub amount_minted: u64,
    pub amount_won_server: u64,
    pub amount_won_clients: u64,
}

impl ShakeAudit {
    pub fn add(&mut self, s: &ShakeAudit) {
        self.packets += s.packets;
        self.released += s.released;
        self.won_server += s.won_server;
        self.won_clients += s.won_clients;
        self.amount_minted += s.amount_minted;
        self.amount_won_server += s.amount_won_server;
        self.amount_won_clients += s.amount_won_clients;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendAudit {
    pub packets: u64,
    pub shares: u64,
    pub opened_server: u64,
    pub opened_clients: u64,
    pub amount_sent: u64,
    pub amount_opened_server: u64,
    pub amount_opened_clients: u64,
}

impl SendAudit {
    pub fn add(&mut self, s: &SendAudit) {
        self.packets += s.packets;
        self.shares += s.shares;
        self.opened_server += s.opened_server;
        self.opened_clients += s.opened_clients;
        self.amount_sent += s.amount_sent;
        self.amount_opened_server += s.amount_opened_server;
        self.amount_opened_clients += s.amount_opened_clients;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Discrepancy {
    pub kind: String,
    pub user: Option<u64>,
    pub phase: Option<String>,
    pub server: u64,
    pub clients: u64,
}

impl Discrepancy {
    pub fn new(kind: &str, phase: Option<&str>, server: u64, clients: u64) -> Discrepancy {
        Discrepancy {
            kind: kind.into(),
            user: None,
            phase: phase.map(str::to_string),
            server,
            clients,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSummary {
    pub ok: bool,
    pub discrepancies: Vec<Discrepancy>,
    pub users_checked: u64,
    /// After a `--fault`: cents the ledger credited that no client was told of (a reply
    /// lost after its commit). Without a fault any such cent is a discrepancy.
    #[serde(default)]
    pub unacknowledged_cents: u64,
    /// The server's final `GET /v1/audit`.
    pub server: Audit,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub server_rss_bytes: u64,
    pub server_rss_baseline_bytes: u64,
    pub server_rss_per_connection_bytes: u64,
    pub server_cpu_seconds: f64,
    pub load_rss_bytes: u64,
    pub load_rss_baseline_bytes: u64,
    pub load_rss_per_connection_bytes: u64,
    pub load_cpu_seconds: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSummary {
    pub procs: u64,
    pub totals: Counters,
    /// The coordinator's part: the agents' join, the last reports' wait, its CPU.
    #[serde(default)]
    pub coordinator: hongbao_load::coordinator::CoordinatorCost,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionsSummary {
    pub workers: String,
    pub phase_qps: Vec<u64>,
    pub shake_packets: u32,
    pub send_packets: u32,
    pub campaign_rate: u32,
    pub recipients: u32,
    pub max_shake_qps: u32,
    pub connect_rate: u64,
    pub transport: String,
    pub http_connection: String,
    pub broadcast_every: f64,
    pub max_queue_ms: u32,
    /// Absent from summaries written before pacing.
    #[serde(default)]
    pub broadcast_yield_ms: u32,
    pub server_nice: i32,
    /// Gateway hosts of a lab in cluster mode; 0 for one local server.
    #[serde(default)]
    pub hosts: usize,
    /// The failure injected (`--fault`), "" for none.
    #[serde(default)]
    pub fault: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSummary {
    pub own_namespace: bool,
    pub ehash_buckets: u64,
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One steady phase, as the bench saw it.
pub struct Phase<'a> {
    pub name: &'a str,
    pub qps: u64,
    pub start_second: u64,
    pub end_second: u64,
    /// The phase's rows of the load (one per second).
    pub rows: &'a [Row],
    /// The server's shakes per second, sampled in the phase.
    pub server_rates: Vec<f64>,
    pub shake: &'a CampaignStatus,
    pub send: &'a CampaignStatus,
    /// The clients' totals when the phase's campaigns started and when it ended.
    pub before: &'a Counters,
    pub after: &'a Counters,
    pub campaign_rate: u32,
    /// A failure was injected: what the server did may exceed what clients were told.
    pub fault: bool,
    /// A deployment that runs campaigns of its own (`--target`): the clients' wins
    /// include theirs, so the phase's wins as the clients saw them are judged after the
    /// run, from the history, by campaign (`judge_target_wins`).
    pub others_campaigns: bool,
}

impl Phase<'_> {
    /// The phase's figures and its audit; what does not match goes to `discrepancies`.
    pub fn summary(&self, discrepancies: &mut Vec<Discrepancy>) -> PhaseSummary {
        let mut shake_h = report::new_histogram();
        let mut open_h = report::new_histogram();
        let mut lag_h = report::new_histogram();
        let mut client_rates = Vec::new();
        let mut previous: Option<&Row> = None;
        for row in self.rows {
            report::merge_sparse(&mut shake_h, &row.shake_latency);
            report::merge_sparse(&mut open_h, &row.open_latency);
            report::merge_sparse(&mut lag_h, &row.send_lag);
            if let Some(prev) = previous {
                client_rates.push(progress(row, &prev.counters, 0).sent_per_sec as f64);
            }
            previous = Some(row);
        }
        let (shake, send, before, after) = (self.shake, self.send, self.before, self.after);
        let shake_audit = ShakeAudit {
            packets: shake.packets as u64,
            released: shake.released as u64,
            won_server: shake.won as u64,
            won_clients: after.won - before.won,
            amount_minted: shake.minted_cents,
            amount_won_server: shake.won_cents,
            amount_won_clients: after.won_cents - before.won_cents,
        };
        let send_audit = SendAudit {
            packets: send.released as u64,
            shares: send.shares,
            opened_server: send.shares_opened,
            opened_clients: after.opened - before.opened,
            amount_sent: send.minted_cents,
            amount_opened_server: send.amount_opened_cents,
            amount_opened_clients: after.opened_cents - before.opened_cents,
        };
        let checks = [
            (
                "shake_packets_released_vs_won",
                shake_audit.released,
                shake_audit.won_server,
            ),
            (
                "shake_packets_minted_vs_released",
                shake_audit.packets,
                shake_audit.released,
            ),
            ("shake_won", shake_audit.won_server, shake_audit.won_clients),
            (
                "shake_amount_minted_vs_won",
                shake_audit.amount_minted,
                shake_audit.amount_won_server,
            ),
            (
                "shake_amount_won",
                shake_audit.amount_won_server,
                shake_audit.amount_won_clients,
            ),
            (
                "send_shares_created_vs_opened",
                send_audit.shares,
                send_audit.opened_server,
            ),
            (
                "send_shares_opened",
                send_audit.opened_server,
                send_audit.opened_clients,
            ),
            (
                "send_amount_sent_vs_opened",
                send_audit.amount_sent,
                send_audit.amount_opened_server,
            ),
            (
                "send_amount_opened",
                send_audit.amount_opened_server,
                send_audit.amount_opened_clients,
            ),
        ];
        // What the clients were told of, against what the server did: after a fault the
        // server may have done more (a reply lost after its commit), never less.
        let told = [
            "shake_won",
            "shake_amount_won",
            "send_shares_opened",
            "send_amount_opened",
        ];
        // And a packet's notice may be lost with its host or in a Redis failover (it waits
        // in the ledger for the recipient's next login or poll): fewer shares opened.
        let notices = [
            "send_shares_created_vs_opened",
            "send_amount_sent_vs_opened",
        ];
        let mut ok = true;
        // Judged after the run, from the history, when others' campaigns run beside.
        let later = ["shake_won", "shake_amount_won"];
        for (kind, server, clients) in checks {
            if self.others_campaigns && later.contains(&kind) {
                continue;
            }
            let relaxed = told.contains(&kind) || notices.contains(&kind);
            let fine = server == clients || (self.fault && relaxed && server > clients);
            if !fine {
                ok = false;
                discrepancies.push(Discrepancy::new(kind, Some(self.name), server, clients));
            }
        }
        let shake_rate = measured_rate(shake);
        let send_rate = measured_rate(send);
        let rate = self.campaign_rate as f64;
        let within = |r: f64| (r - rate).abs() <= rate * 0.01;
        let client_qps_median = median(client_rates);
        let qps = self.qps as f64;
        PhaseSummary {
            name: self.name.to_string(),
            target_qps: self.qps,
            seconds: self.end_second + 1 - self.start_second,
            client_qps_median,
            server_qps_median: median(self.server_rates.clone()),
            latency_ms: LatencyMs::of(&shake_h),
            open_latency_ms: LatencyMs::of(&open_h),
            send_lag_ms: LatencyMs::of(&lag_h),
            overloaded: after.overloaded - before.overloaded,
            backed_off: after.backed_off - before.backed_off,
            errors: after.errors() - before.errors(),
            qps_within_2pct: (client_qps_median - qps).abs() <= qps * 0.02,
            shake_release_rate_per_sec: shake_rate,
            send_create_rate_per_sec: send_rate,
            campaign_rates_within_1pct: within(shake_rate) && within(send_rate),
            shake: shake_audit,
            send: send_audit,
            audit_ok: ok,
        }
    }
}

/// Packets released (created) per second, from the campaign's start to its last release.
fn measured_rate(c: &CampaignStatus) -> f64 {
    match c.released_all_ms {
        Some(end) if end > c.started_ms => c.released as f64 * 1000.0 / (end - c.started_ms) as f64,
        _ => 0.0,
    }
}

/// Whether a campaign has run its course: a shake campaign's packets all won, a send
/// campaign's packets all created and their shares all opened.
pub fn campaign_done(c: &CampaignStatus) -> bool {
    match c.kind {
        hongbao_money::api::CampaignKind::Shake => c.won == c.packets,
        hongbao_money::api::CampaignKind::Send => {
            c.state == CampaignState::Done && c.shares_opened == c.shares
        }
    }
}

/// Findings listed in the summary per kind; the rest are only counted.
pub(super) const FIRST: usize = 10;

/// The history check's result (`history.rs`), `summary.json`'s `history` (docs/bench.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySummary {
    /// Nothing missing, mismatched or duplicated.
    pub ok: bool,
    /// Wins the clients were told of, and opens (once per user, packet and amount).
    pub wins_told: u64,
    pub opens_told: u64,
    /// What the ledger holds.
    pub wins_in_ledger: u64,
    pub opens_in_ledger: u64,
    /// Told operations the ledger holds exactly once, as told.
    pub confirmed: u64,
    /// Told, and not in the ledger at all.
    pub missing: Findings,
    /// Told, and in the ledger once, for another user (a win) or another amount.
    pub mismatched: Findings,
    /// In the ledger more than once, or told more than once (a packet won twice, a share
    /// told at two amounts).
    pub duplicates: Findings,
    /// In the ledger, told to nobody (a reply lost after its commit): not an error.
    pub ledger_only: Findings,
    pub ledger_only_cents: u64,
}

/// How many operations were found so, and the first few.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Findings {
    pub count: u64,
    pub first: Vec<Finding>,
}

impl Findings {
    pub(super) fn add(&mut self, finding: Finding) {
        self.count += 1;
        if self.first.len() < FIRST {
            self.first.push(finding);
        }
    }
}

/// One operation, by its key: what the clients were told of it, and what the ledger holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finding {
    pub op: Operation,
    pub packet: u64,
    pub told: Vec<Payee>,
    pub ledger: Vec<Payee>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    #[default]
    Win,
    Open,
}

/// Who was paid for an operation, and how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payee {
    pub user: u64,
    pub amount_cents: u64,
}

/// Against a deployment that runs campaigns of its own (`--target`): each phase's wins as
/// the clients saw them are the history's wins of that phase's shake campaign (a shake
/// packet's id names its campaign), judged against the server's; what does not match
/// goes to `discrepancies` and fails the phase. `campaigns`: each phase's shake campaign.
pub fn judge_target_wins(
    phases: &mut [PhaseSummary],
    campaigns: &[u32],
    history: &hongbao_load::report::History,
    discrepancies: &mut Vec<Discrepancy>,
) {
    use hongbao_money::rules::shake_packet_parts;
    for (phase, &campaign) in phases.iter_mut().zip(campaigns) {
        let ours = history
            .wins
            .iter()
            .filter(|w| shake_packet_parts(w.packet).0 == campaign);
        let (won, cents) = ours.fold((0, 0), |(n, c), w| (n + 1, c + w.amount_cents));
        phase.shake.won_clients = won;
        phase.shake.amount_won_clients = cents;
        let s = &phase.shake;
        for (kind, server, clients) in [
            ("shake_won", s.won_server, s.won_clients),
            (
                "shake_amount_won",
                s.amount_won_server,
                s.amount_won_clients,
            ),
        ] {
            if server != clients {
                phase.audit_ok = false;
                discrepancies.push(Discrepancy::new(kind, Some(&phase.name), server, clients));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A summary with one of everything, so every field shows in its JSON.
    fn example() -> Summary {
        Summary {
            phases: vec![PhaseSummary::default()],
            audit: AuditSummary {
                discrepancies: vec![Discrepancy {
                    user: Some(1),
                    phase: Some("qps-1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
            engines: Some(EngineSummary::default()),
            fault: Some(FaultSummary {
                reconnected_secs: Some(3),
                ..Default::default()
            }),
            agents: None,
            target: None,
            chaos: Some(super::super::chaos::ChaosSummary {
                faults: vec![super::super::chaos::ChaosFault {
                    whole_after_secs: Some(4),
                    ..Default::default()
                }],
                kinds: vec!["worker-kill".into()],
                ..Default::default()
            }),
            history: HistorySummary {
                missing: Findings {
                    first: vec![Finding {
                        told: vec![Payee {
                            user: 1,
                            amount_cents: 1,
                        }],
                        ledger: vec![Payee {
                            user: 1,
                            amount_cents: 2,
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The clients' view of a fault: who was dropped, and when all were back.
    #[test]
    fn a_fault_is_timed_from_the_clients_logins() {
        let at = |second, logged_in, disconnects, logins| FaultSecond {
            second,
            logged_in,
            disconnects,
            logins,
            ..Default::default()
        };
        // 48 dropped in second 6, back by the end of second 8.
        let rows = [
            at(4, 100, 0, 100),
            at(5, 100, 0, 100),
            at(6, 52, 48, 100),
            at(7, 80, 48, 128),
            at(8, 100, 48, 148),
            at(9, 100, 48, 148),
        ];
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &rows);
        assert_eq!(
            (f.dropped, f.logged_in_min, f.reconnected_secs),
            (48, 52, Some(4))
        );
        // Refusals counted from the fault's second on, not before.
        let refusing: Vec<FaultSecond> = rows
            .iter()
            .map(|r| FaultSecond {
                refused: if r.second >= 6 { 7 } else { 3 },
                error_replies: if r.second >= 5 { 2 } else { 1 },
                ..*r
            })
            .collect();
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &refusing);
        assert_eq!((f.refused_connects, f.error_replies), (4, 1));
        // One more drop than logins: a connection closed before it logged in (nginx
        // took it and found its gateway gone). Everyone is back all the same.
        let closed = [
            at(4, 100, 0, 100),
            at(5, 94, 501, 594),
            at(6, 100, 501, 600),
        ];
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &closed);
        assert_eq!((f.dropped, f.reconnected_secs), (501, Some(2)));
        // Dropped and back within the fault's own second: the rows never dip.
        let quick = [at(4, 100, 0, 100), at(5, 100, 30, 130), at(6, 100, 30, 130)];
        let f = FaultSummary::from_rows("killed".into(), 5, 100, &quick);
        assert_eq!(
            (f.dropped, f.logged_in_min, f.reconnected_secs),
            (30, 100, Some(1))
        );
        let calm = FaultSummary::from_rows("killed".into(), 5, 100, &rows[..2]);
        assert_eq!((calm.dropped, calm.reconnected_secs), (0, Some(0)));
        let lost = FaultSummary::from_rows("killed".into(), 5, 100, &rows[..4]);
        assert_eq!((lost.dropped, lost.reconnected_secs), (48, None));
    }

    /// The served rate around a fault: the seconds short of 90% of the rate asked, and
    /// the shakes short, over the window while the rate stays the fault's.
    #[test]
    fn a_fault_costs_the_seconds_the_served_rate_dips() {
        let mut served = 0;
        let mut at = |second: u64, this_second: u64| {
            served += this_second;
            FaultSecond {
                second,
                logged_in: 10,
                served,
                overloaded: second * 7,
                backed_off: second * 5,
                ..Default::default()
            }
        };
        let rows = [
            at(3, 1000),
            at(4, 1000),
            at(5, 620),
            at(6, 880),
            at(7, 950),
            at(8, 1040),
            at(9, 500),
        ];
        // The phase: 1,000 a second to second 8.
        let f =
            FaultSummary::from_rows("stalled".into(), 5, 10, &rows).with_served((1000, 8), &rows);
        assert_eq!((f.reduced_secs, f.shakes_short), (2, 380 + 120 + 50));
        // From second 4's end to second 8's (the next phase is not judged).
        assert_eq!((f.overloaded, f.backed_off), (28, 20));
        assert_eq!(f.reconnected_secs, Some(0));
    }

    /// Every leaf of `value` as a dotted path (array elements as `[]`).
    fn leaves(prefix: &str, value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    leaves(&format!("{prefix}{k}."), v, out);
                }
            }
            Value::Array(items) => {
                for v in items.iter().take(1) {
                    leaves(&format!("{}[].", prefix.trim_end_matches('.')), v, out);
                }
            }
            _ => out.push(prefix.trim_end_matches('.').to_string()),
        }
    }

    /// docs/bench.md names every field summary.json has (the load's `totals` and the
    /// server's audit are described with their own endpoints).
    #[test]
    fn docs_describe_every_summary_field() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/bench.md"))
                .expect("docs/bench.md");
        let mut paths = Vec::new();
        leaves("", &serde_json::to_value(example()).unwrap(), &mut paths);
        assert!(paths.len() > 80, "{paths:?}");
        for path in paths {
            if path.starts_with("load.totals.") || path.starts_with("audit.server.") {
                continue;
            }
            let leaf = path.rsplit('.').next().unwrap();
            assert!(
                doc.contains(&format!("`{leaf}`")),
                "docs/bench.md does not describe `{leaf}` ({path})"
            );
        }
    }

    #[test]
    fn a_summary_reads_back_and_refuses_unknown_fields() {
        let json = serde_json::to_value(example()).unwrap();
        assert_eq!(
            serde_json::from_value::<Summary>(json.clone()).unwrap(),
            example()
        );
        let mut extra = json;
        extra["phases"][0]["surprise"] = 1.into();
        assert!(serde_json::from_value::<Summary>(extra).is_err());
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
