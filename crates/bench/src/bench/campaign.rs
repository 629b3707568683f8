//! A steady phase's campaigns: the shake campaign and the send campaign the bench starts
//! through the admin API, each waited for until it has run its course, the load's
//! progress printed meanwhile and the phase's broadcasts sent on time.

use std::time::Duration;

use hongbao_load::coordinator::Load;
use hongbao_money::rules::{SendCampaignRequest, ShakeCampaignRequest};
use hongbao_money::CampaignStatus;

use super::broadcaster::Broadcaster;
use super::options::BenchOptions;
use super::say::say;
use super::setup::Bench;
use super::summary;
use crate::Result;

/// How often a campaign's status is asked for while it runs.
const POLL: Duration = Duration::from_millis(100);

/// The phase's shake campaign: `--shake-packets` at `--campaign-rate`.
pub(super) fn shake_request(opts: &BenchOptions) -> ShakeCampaignRequest {
    ShakeCampaignRequest {
        packets: opts.shake_packets,
        rate_per_sec: opts.campaign_rate,
        amount_min: 100,
        amount_max: 10_000,
    }
}

/// The phase's send campaign: `--send-packets` to `--recipients` of the users each.
pub(super) fn send_request(opts: &BenchOptions) -> SendCampaignRequest {
    SendCampaignRequest {
        packets: opts.send_packets,
        rate_per_sec: opts.campaign_rate,
        recipients: opts.recipients,
        user_min: 1,
        user_max: opts.connections,
        amount_min: 100 * opts.recipients as u64,
        amount_max: 20_000,
    }
}

/// Starts a campaign of `kind` (`shake` or `send`).
pub(super) fn start(
    bench: &Bench,
    kind: &str,
    request: &impl serde::Serialize,
) -> Result<CampaignStatus> {
    bench
        .server
        .post(&format!("/v1/campaigns/{kind}"), request)
        .map_err(|e| e.within(format!("starting a {kind} campaign")))
}

/// Polls a campaign until it has run its course (or for twice its packets' time and
/// 30 s), printing the load's progress line each second; `printed` is the second of the
/// newest line printed, so that a second is printed once however many campaigns wait
/// through it.
pub(super) fn wait(
    bench: &Bench,
    load: &Load,
    broadcaster: &mut Broadcaster,
    started: &CampaignStatus,
    printed: &mut u64,
) -> Result<CampaignStatus> {
    let (server, clock) = (&bench.server, &bench.clock);
    let rate = started.rate_per_sec.max(1);
    let deadline = clock.now() + Duration::from_secs(30 + (started.packets / rate) as u64 * 2);
    loop {
        let c: CampaignStatus = server.get(&format!("/v1/campaigns/{}", started.id))?;
        if summary::campaign_done(&c) {
            return Ok(c);
        }
        if clock.now() > deadline {
            say(&format!(
                "bench: campaign {} did not finish in time: {c:?}",
                c.id
            ));
            return Ok(c);
        }
        if let Some(p) = load.progress() {
            if p.second != *printed {
                *printed = p.second;
                say(&format!("  {}", p.line()));
            }
        }
        broadcaster.sleep(POLL, server, load)?;
    }
}
