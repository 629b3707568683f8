//! Campaigns as this host needs them: the row it hands packets out from, a send
//! campaign's packets drawn from its seed (so a packet released twice is the same
//! packet), and a campaign's status, from the ledger and the release.

use hongbao_money::api::{CampaignKind, CampaignState};
use hongbao_money::CampaignStatus;
use hongbao_money::Error;

use crate::commit::Commit;
use crate::pg::pg_error;
use crate::store::Store;
use crate::tags::{release_tag, tag_packets};

/// A campaign as this host needs it to hand out its packets.
#[derive(Debug, Clone)]
pub struct CampaignRow {
    pub id: u32,
    pub send: bool,
    pub packets: u32,
    pub rate: u32,
    pub amount_min: u64,
    pub amount_max: u64,
    pub recipients: u32,
    pub user_min: u64,
    pub user_max: u64,
    pub seed: u64,
    pub minted: u64,
    pub started_ms: u64,
    /// The admin key that started it.
    pub created_by: Option<String>,
}

/// Packet `index` of send campaign `c`: its amount, recipients and shares all follow from
/// the campaign's seed, so a packet released twice (its host died) is the same packet.
pub fn campaign_packet(c: &CampaignRow, index: u32, expires_ms: u64) -> Commit {
    use rand::{Rng, SeedableRng};
    let mut rng =
        rand::rngs::SmallRng::seed_from_u64(c.seed ^ ((index as u64) << 20) ^ index as u64);
    let cents = rng.gen_range(c.amount_min..=c.amount_max);
    let k = c.recipients as usize;
    let recipients = hongbao_money::rules::draw_recipients(&mut rng, k, c.user_min, c.user_max);
    let shares = hongbao_money::split::split_all(&mut rng, cents, k as u32);
    Commit::CampaignPacket {
        campaign: c.id,
        packet: hongbao_money::rules::shake_packet_id(c.id, index),
        cents,
        recipients,
        shares,
        expires_ms,
    }
}

impl Store {
    pub async fn campaign_row(&self, id: u32) -> Result<Option<CampaignRow>, Error> {
        let pg = self.pg().await?;
        let row = pg
            .query_opt(
                "SELECT id, kind, packets, rate, amount_min, amount_max, recipients, user_min, \
                 user_max, seed, minted, started_ms, created_by FROM hb_campaigns WHERE id = $1",
                &[&(id as i32)],
            )
            .await
            .map_err(|e| pg_error("reading a campaign", e))?;
        Ok(row.map(|r| campaign_from(&r)))
    }

    pub(crate) async fn campaign_rows(&self) -> Result<Vec<CampaignRow>, Error> {
        let pg = self.pg().await?;
        let rows = pg
            .query(
                "SELECT id, kind, packets, rate, amount_min, amount_max, recipients, user_min, \
                 user_max, seed, minted, started_ms, created_by FROM hb_campaigns ORDER BY id",
                &[],
            )
            .await
            .map_err(|e| pg_error("reading campaigns", e))?;
        Ok(rows.iter().map(campaign_from).collect())
    }

    /// How far campaign `c`'s release has come over its tags: the packets released (a
    /// tag whose hash Redis does not have counts as all of its released, as one tag's
    /// did before tags), and when the last was released (Redis's clock), once every tag
    /// has released all of its.
    async fn released(&self, c: &CampaignRow) -> (u32, Option<u64>) {
        let tags = self.release_tags();
        let fields = futures_util::future::join_all((0..tags).map(|t| async move {
            let key = format!("{}:c:{}", release_tag(t), c.id);
            let (next, all): (Option<u32>, Option<u64>) = redis::cmd("HMGET")
                .arg(key)
                .arg("next")
                .arg("all")
                .query_async(&mut self.redis())
                .await
                .unwrap_or((None, None));
            (next.unwrap_or(tag_packets(c.packets, tags, t)), all)
        }))
        .await;
        let released = fields.iter().map(|(next, _)| next).sum();
        let all = fields
            .iter()
            .map(|(_, all)| *all)
            .collect::<Option<Vec<u64>>>()
            .and_then(|all| all.into_iter().max());
        (released, all)
    }

    /// A campaign's status: its row (shard 0), its packets and wins (every shard), its
    /// release (Redis).
    pub(crate) async fn status(&self, c: &CampaignRow) -> Result<CampaignStatus, Error> {
        let id = c.id as i32;
        let mut status = CampaignStatus {
            id: c.id,
            kind: if c.send {
                CampaignKind::Send
            } else {
                CampaignKind::Shake
            },
            packets: c.packets,
            rate_per_sec: c.rate,
            state: CampaignState::Running,
            released: 0,
            started_ms: c.started_ms,
            released_all_ms: None,
            won: 0,
            won_cents: 0,
            minted_cents: c.minted,
            shares: 0,
            shares_opened: 0,
            amount_opened_cents: 0,
            refunded_cents: 0,
            created_by: c.created_by.clone(),
        };
        // Released so far, and when the last was (Redis's clock).
        let (released, released_all_ms) = self.released(c).await;
        if c.send {
            let r = self
                .summed(
                    "reading a campaign",
                    "SELECT count(*), coalesce(sum(cents),0)::bigint, coalesce(sum(shares),0)::bigint, \
                     coalesce(sum(opened),0)::bigint, coalesce(sum(opened_cents),0)::bigint, \
                     coalesce(sum(refunded),0)::bigint FROM hb_packets WHERE campaign = $1",
                    &[&id],
                )
                .await?;
            let n = |i: usize| r[i] as u64;
            status.released = n(0) as u32;
            status.minted_cents = n(1);
            status.shares = n(2);
            status.shares_opened = n(3);
            status.amount_opened_cents = n(4);
            status.refunded_cents = n(5);
            if status.released == c.packets {
                status.state = CampaignState::Done;
            }
        } else {
            let r = self
                .summed(
                    "reading a campaign",
                    "SELECT count(*), coalesce(sum(cents),0)::bigint FROM hb_wins WHERE campaign = $1",
                    &[&id],
                )
                .await?;
            status.won = r[0] as u32;
            status.won_cents = r[1] as u64;
            status.released = released.min(c.packets);
            if status.won == c.packets {
                status.state = CampaignState::Done;
            }
        }
        status.released_all_ms = released_all_ms;
        Ok(status)
    }
}

fn campaign_from(r: &tokio_postgres::Row) -> CampaignRow {
    CampaignRow {
        id: r.get::<_, i32>(0) as u32,
        send: r.get::<_, &str>(1) == "send",
        packets: r.get::<_, i32>(2) as u32,
        rate: r.get::<_, i32>(3) as u32,
        amount_min: r.get::<_, i64>(4) as u64,
        amount_max: r.get::<_, i64>(5) as u64,
        recipients: r.get::<_, i32>(6) as u32,
        user_min: r.get::<_, i64>(7) as u64,
        user_max: r.get::<_, i64>(8) as u64,
        seed: r.get::<_, i64>(9) as u64,
        minted: r.get::<_, i64>(10) as u64,
        started_ms: r.get::<_, i64>(11) as u64,
        created_by: r.get(12),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn send_campaign() -> CampaignRow {
        CampaignRow {
            id: 3,
            send: true,
            packets: 10,
            rate: 5,
            amount_min: 300,
            amount_max: 900,
            recipients: 3,
            user_min: 1,
            user_max: 20,
            seed: 42,
            minted: 0,
            started_ms: 0,
            created_by: Some("ops".into()),
        }
    }

    #[test]
    fn a_campaign_packet_released_twice_is_the_same_packet() {
        let c = send_campaign();
        let a = format!("{:?}", campaign_packet(&c, 4, 1000));
        let b = format!("{:?}", campaign_packet(&c, 4, 1000));
        assert_eq!(a, b);
        let Commit::CampaignPacket {
            packet,
            cents,
            recipients,
            shares,
            ..
        } = campaign_packet(&c, 4, 1000)
        else {
            unreachable!()
        };
        assert_eq!(packet, (3u64 << 32) | 4);
        assert!((300..=900).contains(&cents));
        assert_eq!(shares.iter().sum::<u64>(), cents);
        let distinct: HashSet<_> = recipients.iter().collect();
        assert_eq!(distinct.len(), 3);
        assert!(recipients.iter().all(|u| (1..=20).contains(u)));
        assert_ne!(a, format!("{:?}", campaign_packet(&c, 5, 1000)));
    }
}
