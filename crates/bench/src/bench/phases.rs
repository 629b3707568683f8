//! The bench's steady phases: for each QPS step, the load set to it, a shake campaign and
//! a send campaign run under it (broadcasts sent meanwhile, the faults started in the
//! first), the clients' reports let catch up, and the phase judged — its figures, its
//! campaigns' counts against the clients', and the money's conservation as it ends.

use std::time::Duration;

use hongbao_load::coordinator::Row;
use hongbao_money::{Audit, CampaignStatus};
use hongbao_sys::clock::UnixTime;

use super::broadcaster::{wait_deliveries, Broadcaster};
use super::campaign;
use super::connect::Connected;
use super::faults::Faults;
use super::say::say;
use super::setup::Bench;
use super::summary::{self, Discrepancy, Phase, PhaseSummary, SendAudit, ShakeAudit};
use crate::Result;

/// How long the clients' reports are given to catch up with what the server said of the
/// phase's campaigns.
const CATCH_UP: Duration = Duration::from_secs(5);
const CATCH_UP_POLL: Duration = Duration::from_millis(100);

/// How long the phase's load goes on after its campaigns: a whole second more in the
/// rows past the campaigns' last, and 100 ms for the clients' reports of it.
const PHASE_TAIL: Duration = Duration::from_millis(1100);

/// A steady phase's name, as the series and the summary call it.
fn phase_name(qps: u64) -> String {
    format!("qps-{qps}")
}

/// What the phases found, phase by phase and in all.
pub(super) struct Phases {
    pub summaries: Vec<PhaseSummary>,
    /// Each phase's shake campaign: a deployment's own campaigns beside the run's are
    /// told apart by it (`--target`).
    pub shake_campaigns: Vec<u32>,
    pub discrepancies: Vec<Discrepancy>,
    pub shake_total: ShakeAudit,
    pub send_total: SendAudit,
    pub broadcaster: Broadcaster,
    pub faults: Faults,
    /// The last phase's last second.
    pub last_phase_end: u64,
    /// The fault's phase (the first): its rate and its last second.
    pub fault_phase: (u64, u64),
}

/// A phase's campaigns as they ended, and the clients' totals around them.
struct Campaigns {
    shake: CampaignStatus,
    send: CampaignStatus,
    before: hongbao_load::report::Counters,
}

impl Phases {
    pub fn new(bench: &Bench) -> Phases {
        Phases {
            summaries: Vec::new(),
            shake_campaigns: Vec::new(),
            discrepancies: Vec::new(),
            shake_total: ShakeAudit::default(),
            send_total: SendAudit::default(),
            broadcaster: Broadcaster::new(bench.opts.broadcast_every_secs, bench.clock),
            faults: Faults::new(bench),
            last_phase_end: 0,
            fault_phase: (0, 0),
        }
    }

    /// Runs phase `n` (0 for the first steady phase) at `qps`.
    pub fn run(&mut self, bench: &Bench, c: &Connected, n: usize, qps: u64) -> Result<()> {
        let (load, seconds) = (&c.load, c.seconds);
        let name = phase_name(qps);
        let from = load.set_qps(qps)?;
        bench
            .monitor
            .mark_at(seconds.start_of(from).as_millis(), &name);
        self.faults.enter_phase(&name);
        say(&format!(
            "bench: phase {} at {qps} QPS from second {from}",
            n + 2
        ));
        seconds.wait_until(from + 1);
        self.broadcaster.start_phase(&name);
        if n == 0 {
            self.faults.start(bench, seconds, from);
        }
        let campaigns = self.campaigns(bench, c)?;
        self.catch_up(bench, c, &campaigns)?;
        self.judge(bench, c, n, qps, from, campaigns)
    }

    /// The phase's shake campaign, then its send campaign, each run to its end.
    fn campaigns(&mut self, bench: &Bench, c: &Connected) -> Result<Campaigns> {
        let (opts, load) = (bench.opts, &c.load);
        let before = load.totals();
        // The newest progress line printed: the send campaign's wait goes on from it.
        let mut printed = 0;
        let shake = campaign::start(bench, "shake", &campaign::shake_request(opts))?;
        let shake = campaign::wait(bench, load, &mut self.broadcaster, &shake, &mut printed)?;
        let send = campaign::start(bench, "send", &campaign::send_request(opts))?;
        let mut send = campaign::wait(bench, load, &mut self.broadcaster, &send, &mut printed)?;
        if !summary::campaign_done(&send) && self.faults.chaos_started() {
            // Faults every second or two can keep a recipient away longer than the wait
            // (each loss starts its back-off again): the faults end here, and its last
            // shares are waited for as in any run, once the clients can come back.
            self.faults.stop_chaos();
            say(&format!(
                "bench: chaos: no more faults while campaign {} waits for its last shares",
                send.id
            ));
            send = campaign::wait(bench, load, &mut self.broadcaster, &send, &mut printed)?;
        }
        Ok(Campaigns {
            shake,
            send,
            before,
        })
    }

    /// Lets the clients' reports catch up with what the server has said, then lets the
    /// phase's load run a little longer; the phase's broadcasts end.
    fn catch_up(&mut self, bench: &Bench, c: &Connected, campaigns: &Campaigns) -> Result<()> {
        let (server, load, clock) = (&bench.server, &c.load, &bench.clock);
        let Campaigns {
            shake,
            send,
            before,
        } = campaigns;
        let settle = clock.now() + CATCH_UP;
        while clock.now() < settle {
            let t = load.totals();
            if t.won - before.won >= shake.won as u64
                && t.opened - before.opened >= send.shares_opened
            {
                break;
            }
            self.broadcaster.sleep(CATCH_UP_POLL, server, load)?;
        }
        self.broadcaster.sleep(PHASE_TAIL, server, load)?;
        self.broadcaster.end_phase();
        Ok(())
    }

    /// Judges phase `n` over its seconds, from `from` to the last one over: its figures,
    /// its audit (the server's conservation check as it ends), and a line said of it.
    fn judge(
        &mut self,
        bench: &Bench,
        c: &Connected,
        n: usize,
        qps: u64,
        from: u64,
        campaigns: Campaigns,
    ) -> Result<()> {
        let (opts, load, seconds) = (bench.opts, &c.load, c.seconds);
        let (
            name,
            Campaigns {
                shake,
                send,
                before,
            },
        ) = (&phase_name(qps), campaigns);
        let after = load.totals();
        let end_second = seconds.second_at(UnixTime::now()).saturating_sub(1);
        let rows: Vec<Row> = load
            .rows()
            .into_iter()
            .filter(|r| r.second >= from && r.second <= end_second)
            .collect();
        let server_rates = bench
            .sampler
            .shake_rates(seconds.start_of(from + 1), seconds.start_of(end_second + 1));
        let phase = Phase {
            name,
            qps,
            start_second: from,
            end_second,
            rows: &rows,
            server_rates,
            shake: &shake,
            send: &send,
            before: &before,
            after: &after,
            campaign_rate: opts.campaign_rate,
            // A lost agent's users were told things nobody heard: judged as after a fault.
            fault: self.faults.faulty || load.lost() > 0,
            others_campaigns: opts.target.is_some(),
        };
        self.shake_campaigns.push(shake.id);
        self.last_phase_end = end_second;
        if n == 0 {
            self.fault_phase = (qps, end_second);
        }
        let summary = phase.summary(&mut self.discrepancies);
        let audit: Audit = bench.server.get("/v1/audit")?;
        if !audit.ok {
            self.discrepancies
                .push(Discrepancy::new("conservation", Some(name), 0, 0));
        }
        let verdict = match (summary.audit_ok && audit.ok, opts.target.is_some()) {
            (false, _) => "FAILED",
            // Its wins as the clients saw them: at the end, by campaign.
            (true, true) => "ok so far",
            (true, false) => "ok",
        };
        say(&format!(
            "bench: {name}: client median {:.0}/s server median {:.0}/s p50 {:.2} ms p99 {:.2} ms (load's send lag p99 {:.2} ms) overloaded {} errors {} audit {verdict}",
            summary.client_qps_median, summary.server_qps_median, summary.latency_ms.p50, summary.latency_ms.p99,
            summary.send_lag_ms.p99, summary.overloaded, summary.errors
        ));
        self.shake_total.add(&summary.shake);
        self.send_total.add(&summary.send);
        self.summaries.push(summary);
        Ok(())
    }

    /// Once the last phase is over: every connection should get every broadcast, so the
    /// last ones are given time to arrive; the clients' drops as the phases end.
    pub fn await_broadcasts(&self, bench: &Bench, c: &Connected) -> u64 {
        let (load, sent) = (&c.load, &self.broadcaster.sent);
        if !sent.is_empty() && !wait_deliveries(load, sent, &bench.clock) {
            say("bench: some broadcasts were not delivered to every connection in time");
        }
        let t = load.totals();
        t.disconnects + t.connect_failures()
    }
}
