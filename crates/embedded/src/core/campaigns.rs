//! Campaigns in the core: a shake campaign mints all its packets at creation and releases
//! them at its rate, dealt round-robin to the workers' pools; a send campaign creates
//! packets for random recipients at its rate. Both follow one schedule:
//! `released = base + elapsed_ms × rate_per_sec / 1000`, restarted from where it stood
//! after a restart of the server.

use std::collections::BTreeMap;

use hongbao_money::api::{CampaignKind, CampaignState, CampaignStatus};
use hongbao_money::event::{shake_amount, Account, Event};
use hongbao_money::rules::{
    draw_recipients, shake_packet_id, SendCampaignRequest, ShakeCampaignRequest,
};
use hongbao_money::seam::AdminAnswer;
use hongbao_money::WorkerId;
use rand::Rng;

use super::Core;

/// Where a schedule stands: it reaches `base + elapsed × rate` from `start_ms`.
#[derive(Debug)]
struct Schedule {
    rate_per_sec: u32,
    base: u32,
    start_ms: u64,
}

impl Schedule {
    fn target(&self, now_ms: u64, cap: u32) -> u32 {
        let elapsed = now_ms.saturating_sub(self.start_ms);
        (self.base as u64 + elapsed * self.rate_per_sec as u64 / 1000).min(cap as u64) as u32
    }
}

#[derive(Debug)]
pub(super) struct ShakeCampaign {
    pub(super) packets: u32,
    amount_min: u64,
    amount_max: u64,
    seed: u64,
    pub(super) minted_cents: u64,
    won_bits: Vec<u64>,
    pub(super) won: u32,
    pub(super) won_cents: u64,
    released: u32,
    schedule: Schedule,
    released_all_ms: Option<u64>,
    started_ms: u64,
    /// Next index to scan for a never-dealt packet.
    scan: u32,
    /// Packets that were dealt to a worker that died: dealt again first.
    pub(super) returned: Vec<u32>,
    /// The sequence number of the campaign's own event: its deals wait for that commit.
    pub(super) created_seq: u64,
    /// The admin key that started it.
    pub(super) by: Option<String>,
}

impl ShakeCampaign {
    pub(super) fn from_event(event: &Event, seq: u64, ts_ms: u64) -> Option<ShakeCampaign> {
        let Event::ShakeCampaign {
            packets,
            rate_per_sec,
            amount_min,
            amount_max,
            seed,
            minted_cents,
            by,
            ..
        } = event
        else {
            return None;
        };
        Some(ShakeCampaign {
            by: by.clone(),
            packets: *packets,
            amount_min: *amount_min,
            amount_max: *amount_max,
            seed: *seed,
            minted_cents: *minted_cents,
            won_bits: vec![0; (*packets as usize).div_ceil(64)],
            won: 0,
            won_cents: 0,
            released: 0,
            schedule: Schedule {
                rate_per_sec: *rate_per_sec,
                base: 0,
                start_ms: ts_ms,
            },
            released_all_ms: None,
            started_ms: ts_ms,
            scan: 0,
            returned: Vec::new(),
            created_seq: seq,
        })
    }

    pub(super) fn is_won(&self, index: u32) -> bool {
        self.won_bits[(index / 64) as usize] & (1 << (index % 64)) != 0
    }

    pub(super) fn mark_won(&mut self, index: u32, amount_cents: u64) {
        self.won_bits[(index / 64) as usize] |= 1 << (index % 64);
        self.won += 1;
        self.won_cents += amount_cents;
    }

    pub(super) fn amount_of(&self, index: u32) -> u64 {
        shake_amount(self.seed, index, self.amount_min, self.amount_max)
    }

    /// After a restart: what was released but not won is released again.
    pub(super) fn resume(&mut self, now_ms: u64) {
        self.released = self.won;
        self.schedule.base = self.won;
        self.schedule.start_ms = now_ms;
        self.scan = 0;
        self.returned.clear();
        if self.won < self.packets {
            self.released_all_ms = None;
        }
    }

    fn status(&self, id: u32) -> CampaignStatus {
        CampaignStatus {
            id,
            kind: CampaignKind::Shake,
            packets: self.packets,
            rate_per_sec: self.schedule.rate_per_sec,
            state: if self.won == self.packets {
                CampaignState::Done
            } else {
                CampaignState::Running
            },
            released: self.released,
            started_ms: self.started_ms,
            released_all_ms: self.released_all_ms,
            won: self.won,
            won_cents: self.won_cents,
            minted_cents: self.minted_cents,
            shares: 0,
            shares_opened: 0,
            amount_opened_cents: 0,
            refunded_cents: 0,
            created_by: self.by.clone(),
        }
    }
}

#[derive(Debug)]
pub(super) struct SendCampaign {
    packets: u32,
    recipients: u32,
    user_min: u64,
    user_max: u64,
    amount_min: u64,
    amount_max: u64,
    created: u32,
    schedule: Schedule,
    released_all_ms: Option<u64>,
    started_ms: u64,
    shares: u64,
    shares_opened: u64,
    pub(super) amount_sent_cents: u64,
    amount_opened_cents: u64,
    pub(super) refunded_cents: u64,
    /// The admin key that started it.
    pub(super) by: Option<String>,
}

impl SendCampaign {
    pub(super) fn from_event(event: &Event, ts_ms: u64) -> Option<SendCampaign> {
        let Event::SendCampaign {
            packets,
            rate_per_sec,
            recipients,
            user_min,
            user_max,
            amount_min,
            amount_max,
            by,
            ..
        } = event
        else {
            return None;
        };
        Some(SendCampaign {
            by: by.clone(),
            packets: *packets,
            recipients: *recipients,
            user_min: *user_min,
            user_max: *user_max,
            amount_min: *amount_min,
            amount_max: *amount_max,
            created: 0,
            schedule: Schedule {
                rate_per_sec: *rate_per_sec,
                base: 0,
                start_ms: ts_ms,
            },
            released_all_ms: None,
            started_ms: ts_ms,
            shares: 0,
            shares_opened: 0,
            amount_sent_cents: 0,
            amount_opened_cents: 0,
            refunded_cents: 0,
        })
    }

    pub(super) fn created(&mut self, shares: u32, amount_cents: u64, ts_ms: u64) {
        self.created += 1;
        self.shares += shares as u64;
        self.amount_sent_cents += amount_cents;
        if self.created == self.packets {
            self.released_all_ms = Some(ts_ms);
        }
    }

    pub(super) fn opened(&mut self, amount_cents: u64) {
        self.shares_opened += 1;
        self.amount_opened_cents += amount_cents;
    }

    pub(super) fn resume(&mut self, now_ms: u64) {
        self.schedule.base = self.created;
        self.schedule.start_ms = now_ms;
    }

    fn status(&self, id: u32) -> CampaignStatus {
        CampaignStatus {
            id,
            kind: CampaignKind::Send,
            packets: self.packets,
            rate_per_sec: self.schedule.rate_per_sec,
            state: if self.created == self.packets {
                CampaignState::Done
            } else {
                CampaignState::Running
            },
            released: self.created,
            started_ms: self.started_ms,
            released_all_ms: self.released_all_ms,
            won: 0,
            won_cents: 0,
            minted_cents: self.amount_sent_cents,
            shares: self.shares,
            shares_opened: self.shares_opened,
            amount_opened_cents: self.amount_opened_cents,
            refunded_cents: self.refunded_cents,
            created_by: self.by.clone(),
        }
    }
}

impl Core {
    pub(super) fn create_shake_campaign(
        &mut self,
        now_ms: u64,
        req: &ShakeCampaignRequest,
        by: &str,
    ) -> AdminAnswer {
        if let Err(why) = req.check() {
            return AdminAnswer::Refused(why.to_string());
        }
        let seed = self.rng.gen();
        let minted_cents = (0..req.packets)
            .map(|i| shake_amount(seed, i, req.amount_min, req.amount_max))
            .sum();
        let campaign = self.next_campaign;
        self.record(
            now_ms,
            Event::ShakeCampaign {
                campaign,
                packets: req.packets,
                rate_per_sec: req.rate_per_sec,
                amount_min: req.amount_min,
                amount_max: req.amount_max,
                seed,
                minted_cents,
                by: Some(by.to_string()),
            },
        );
        AdminAnswer::Campaign(self.campaign(campaign).expect("just created"))
    }

    pub(super) fn create_send_campaign(
        &mut self,
        now_ms: u64,
        req: &SendCampaignRequest,
        by: &str,
    ) -> AdminAnswer {
        if let Err(why) = req.check() {
            return AdminAnswer::Refused(why.to_string());
        }
        let campaign = self.next_campaign;
        self.record(
            now_ms,
            Event::SendCampaign {
                campaign,
                packets: req.packets,
                rate_per_sec: req.rate_per_sec,
                recipients: req.recipients,
                user_min: req.user_min,
                user_max: req.user_max,
                amount_min: req.amount_min,
                amount_max: req.amount_max,
                by: Some(by.to_string()),
            },
        );
        AdminAnswer::Campaign(self.campaign(campaign).expect("just created"))
    }

    pub fn campaign(&self, id: u32) -> Option<CampaignStatus> {
        match self.shake.get(&id) {
            Some(c) => Some(c.status(id)),
            None => self.send.get(&id).map(|c| c.status(id)),
        }
    }

    /// Shake campaigns by id, then send campaigns by id.
    pub fn campaign_ids(&self) -> Vec<u32> {
        self.shake.keys().chain(self.send.keys()).copied().collect()
    }

    pub(super) fn release_shake_packets(&mut self, now_ms: u64) {
        if self.workers.is_empty() {
            return;
        }
        let workers: Vec<WorkerId> = self.workers.keys().copied().collect();
        let mut deals: BTreeMap<(u64, WorkerId), Vec<(u64, u64)>> = BTreeMap::new();
        for (&id, c) in self.shake.iter_mut() {
            let mut due: Vec<u32> = std::mem::take(&mut c.returned);
            let target = c.schedule.target(now_ms, c.packets);
            while c.released < target {
                while c.is_won(c.scan) {
                    c.scan += 1;
                }
                due.push(c.scan);
                c.scan += 1;
                c.released += 1;
                self.counters.packets_released += 1;
            }
            if c.released == c.packets && c.released_all_ms.is_none() {
                c.released_all_ms = Some(now_ms);
            }
            for index in due {
                let worker = workers[self.deal_cursor % workers.len()];
                self.deal_cursor = self.deal_cursor.wrapping_add(1);
                deals
                    .entry((c.created_seq, worker))
                    .or_default()
                    .push((shake_packet_id(id, index), c.amount_of(index)));
            }
        }
        for ((created_seq, worker), packets) in deals {
            let pool = self
                .workers
                .get_mut(&worker)
                .expect("dealt to a live worker");
            pool.extend(packets.iter().map(|(id, _)| *id));
            let deal = hongbao_money::Output::Deal { worker, packets };
            self.deals.push((created_seq, deal));
        }
    }

    pub(super) fn create_campaign_packets(&mut self, now_ms: u64) {
        let due: Vec<(u32, u32)> = self
            .send
            .iter()
            .filter_map(|(&id, c)| {
                let target = c.schedule.target(now_ms, c.packets);
                (target > c.created).then(|| (id, target - c.created))
            })
            .collect();
        for (id, count) in due {
            for _ in 0..count {
                let c = &self.send[&id];
                let (k, lo, hi) = (c.recipients as usize, c.user_min, c.user_max);
                let amount = self.rng.gen_range(c.amount_min..=c.amount_max);
                let recipients = draw_recipients(&mut self.rng, k, lo, hi);
                let sender = Account::Campaign(id);
                self.new_packet(now_ms, sender, amount, k as u32, recipients, None);
            }
        }
    }
}
