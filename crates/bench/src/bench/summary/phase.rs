//! Each steady phase's figures (`summary.json`'s `phases`): medians, latency quantiles,
//! measured campaign rates, and the checks of the campaigns' counts against the
//! clients'; and, against a deployment with campaigns of its own, the wins judged after
//! the run by campaign.

use hdrhistogram::Histogram;
use hongbao_money::api::CampaignState;
use hongbao_money::CampaignStatus;
use serde::{Deserialize, Serialize};

use hongbao_load::coordinator::{progress, Row};
use hongbao_load::report::{self, Counters};

use super::audit::{Discrepancy, SendAudit, ShakeAudit};

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

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
