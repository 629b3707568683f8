//! Reads of the PostgreSQL ledger (balances, a user's view, the notices waiting for a
//! user, the wins and opened shares, the audit and its walk of the hosts' hash chains),
//! and the two writes that need no batch: numbering packets, a block of ids at a time, and
//! expiring them.

use futures_util::TryStreamExt;
use hongbao_money::seam::{Balances, LedgerOp, OpsCursor, OpsPage};
use hongbao_money::Error;
use hongbao_money::{Audit, Notice, UserId, UserView};

use crate::chain::{Chains, Walked};
use crate::pg::{i64s, pg_error};
use crate::store::Store;

/// Ids per block of `hb_packet_blocks`.
const PACKET_BLOCK: u64 = 4096;

impl Store {
    pub async fn next_packet_id(&self) -> Result<u64, Error> {
        let mut ids = self.0.ids.lock().await;
        if ids.0 >= ids.1 {
            let pg = self.pg().await?;
            let row = pg
                .query_one("SELECT nextval('hb_packet_blocks')", &[])
                .await
                .map_err(|e| pg_error("numbering packets", e))?;
            let block = row.get::<_, i64>(0) as u64;
            *ids = (block * PACKET_BLOCK, (block + 1) * PACKET_BLOCK);
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    pub async fn balance(&self, user: u64) -> Result<u64, Error> {
        let pg = self.pg().await?;
        let row = pg
            .query_opt(
                "SELECT cents FROM hb_balances WHERE user_id = $1",
                &[&(user as i64)],
            )
            .await
            .map_err(|e| pg_error("reading a balance", e))?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0) as u64))
    }

    pub async fn user_view(&self, user: u64, limit: usize) -> Result<UserView, Error> {
        let balance_cents = self.balance(user).await?;
        let pg = self.pg().await?;
        let rows = pg
            .query(
                "SELECT seq, at_ms, body FROM hb_events WHERE user_id = $1 ORDER BY seq DESC LIMIT $2",
                &[&(user as i64), &(limit as i64)],
            )
            .await
            .map_err(|e| pg_error("reading events", e))?;
        let recent_events = rows
            .iter()
            .map(|r| {
                let mut event: serde_json::Value = r.get(2);
                event["seq"] = r.get::<_, i64>(0).into();
                event["ts_ms"] = r.get::<_, i64>(1).into();
                event
            })
            .collect();
        Ok(UserView {
            user,
            balance_cents,
            recent_events,
        })
    }

    pub async fn waiting_notices(&self, user: u64, now: u64) -> Result<Vec<Notice>, Error> {
        let pg = self.pg().await?;
        let rows = pg
            .query(
                "SELECT p.id, p.sender, p.cents, p.shares, p.expires_ms FROM hb_recipients r \
                 JOIN hb_packets p ON p.id = r.packet \
                 WHERE r.user_id = $1 AND r.opened_cents IS NULL AND p.refunded IS NULL \
                   AND p.expires_ms > $2 ORDER BY p.id",
                &[&(user as i64), &(now as i64)],
            )
            .await
            .map_err(|e| pg_error("reading waiting packets", e))?;
        Ok(rows
            .iter()
            .map(|r| Notice {
                packet_id: r.get::<_, i64>(0) as u64,
                from_user: UserId::new(r.get::<_, i64>(1) as u64),
                amount_cents: r.get::<_, i64>(2) as u64,
                shares: r.get::<_, i32>(3) as u32,
                expires_at_ms: r.get::<_, i64>(4) as u64,
            })
            .collect())
    }

    /// The waiting notices of all of `users` (this host's users, after its channel was
    /// lost for a while), as (user, notice), in one query.
    pub async fn waiting_notices_of(
        &self,
        users: &[u64],
        now: u64,
    ) -> Result<Vec<(u64, Notice)>, Error> {
        let pg = self.pg().await?;
        let rows = pg
            .query(
                "SELECT r.user_id, p.id, p.sender, p.cents, p.shares, p.expires_ms \
                 FROM hb_recipients r JOIN hb_packets p ON p.id = r.packet \
                 WHERE r.user_id = ANY($1) AND r.opened_cents IS NULL \
                   AND p.refunded IS NULL AND p.expires_ms > $2 ORDER BY p.id",
                &[&i64s(users), &(now as i64)],
            )
            .await
            .map_err(|e| pg_error("reading waiting packets", e))?;
        Ok(rows
            .iter()
            .map(|r| {
                let notice = Notice {
                    packet_id: r.get::<_, i64>(1) as u64,
                    from_user: UserId::new(r.get::<_, i64>(2) as u64),
                    amount_cents: r.get::<_, i64>(3) as u64,
                    shares: r.get::<_, i32>(4) as u32,
                    expires_at_ms: r.get::<_, i64>(5) as u64,
                };
                (r.get::<_, i64>(0) as u64, notice)
            })
            .collect())
    }

    pub async fn balances(&self) -> Result<Balances, Error> {
        let pg = self.pg().await?;
        let users = pg
            .query(
                "SELECT user_id, cents FROM hb_balances WHERE cents != 0",
                &[],
            )
            .await
            .map_err(|e| pg_error("reading balances", e))?;
        let campaigns = pg
            .query(
                "SELECT campaign, sum(refunded)::bigint FROM hb_packets \
                 WHERE campaign IS NOT NULL AND refunded > 0 GROUP BY campaign",
                &[],
            )
            .await
            .map_err(|e| pg_error("reading balances", e))?;
        Ok(Balances {
            users: users
                .iter()
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64))
                .collect(),
            campaigns: campaigns
                .iter()
                .map(|r| (r.get::<_, i32>(0) as u32, r.get::<_, i64>(1) as u64))
                .collect(),
        })
    }

    /// Up to `limit` wins and opened shares after `after`: the wins (`hb_wins`) by packet,
    /// then the opened shares (`hb_recipients` with `opened_cents`) by (packet, user), each
    /// paged on its primary key, so a page costs the same wherever it starts. These tables
    /// are what pays: their keys allow one win per packet and one share per recipient.
    pub async fn ops(&self, after: Option<OpsCursor>, limit: usize) -> Result<OpsPage, Error> {
        let pg = self.pg().await?;
        let mut page = OpsPage::default();
        let op = |r: &tokio_postgres::Row| LedgerOp {
            packet: r.get::<_, i64>(0) as u64,
            user: r.get::<_, i64>(1) as u64,
            amount_cents: r.get::<_, i64>(2) as u64,
        };
        // Keys are stored as bigint: ids and users below 2^63 compare alike either way.
        let (win_after, open_after) = match after {
            None => (Some(i64::MIN), (i64::MIN, i64::MIN)),
            Some(OpsCursor::Win(packet)) => (Some(packet as i64), (i64::MIN, i64::MIN)),
            Some(OpsCursor::Open { packet, user }) => (None, (packet as i64, user as i64)),
            Some(other) => {
                return Err(Error::refused(format!(
                    "cursor {other} is not this ledger's: it pages by packet (win.N, open.N.U)"
                )))
            }
        };
        if let Some(win_after) = win_after {
            let rows = pg
                .query(
                    "SELECT packet, user_id, cents FROM hb_wins WHERE packet > $1 \
                     ORDER BY packet LIMIT $2",
                    &[&win_after, &(limit as i64)],
                )
                .await
                .map_err(|e| pg_error("reading wins", e))?;
            page.wins = rows.iter().map(op).collect();
            if page.wins.len() == limit {
                page.next = page.wins.last().map(|w| OpsCursor::Win(w.packet));
                return Ok(page);
            }
        }
        let left = limit - page.wins.len();
        let rows = pg
            .query(
                "SELECT packet, user_id, opened_cents FROM hb_recipients \
                 WHERE opened_cents IS NOT NULL AND (packet, user_id) > ($1, $2) \
                 ORDER BY packet, user_id LIMIT $3",
                &[&open_after.0, &open_after.1, &(left as i64)],
            )
            .await
            .map_err(|e| pg_error("reading opened shares", e))?;
        page.opens = rows.iter().map(op).collect();
        if page.opens.len() == left {
            page.next = page.opens.last().map(|o| OpsCursor::Open {
                packet: o.packet,
                user: o.user,
            });
        }
        Ok(page)
    }

    /// The audit, from one snapshot of the ledger: every cent minted is in a balance, a
    /// live packet, or a shake packet not yet won; and, walked just before in a snapshot
    /// of its own, every host's hash chain holds.
    pub async fn audit(&self) -> Result<Audit, Error> {
        let chains = self.chains().await?;
        let pg = self.pg().await?;
        let r = pg
            .query_one(
                "SELECT \
                 (SELECT coalesce(sum(minted),0) FROM hb_campaigns WHERE kind = 'shake')::bigint, \
                 (SELECT coalesce(sum(cents),0) FROM hb_packets WHERE campaign IS NOT NULL)::bigint, \
                 (SELECT coalesce(sum(cents),0) FROM hb_balances)::bigint, \
                 (SELECT count(*) FROM hb_balances WHERE cents > 0), \
                 (SELECT coalesce(sum(refunded),0) FROM hb_packets WHERE campaign IS NOT NULL)::bigint, \
                 (SELECT coalesce(sum(cents - opened_cents),0) FROM hb_packets WHERE refunded IS NULL)::bigint, \
                 (SELECT count(*) FROM hb_packets WHERE refunded IS NULL AND opened < shares), \
                 (SELECT coalesce(sum(shares - opened),0) FROM hb_packets WHERE refunded IS NULL)::bigint, \
                 (SELECT coalesce(sum(cents),0) FROM hb_wins)::bigint, \
                 (SELECT count(*) FROM hb_wins), \
                 (SELECT coalesce(sum(packets),0) FROM hb_campaigns WHERE kind = 'shake')::bigint, \
                 (SELECT coalesce(max(seq),0) FROM hb_events)",
                &[],
            )
            .await
            .map_err(|e| pg_error("auditing", e))?;
        let n = |i: usize| r.get::<_, i64>(i) as u64;
        let shake_minted = n(0);
        // Who minted each cent: a shake campaign's mint, a send campaign's packets.
        let makers = pg
            .query(
                "SELECT coalesce(c.created_by, $1), sum(CASE WHEN c.kind = 'shake' THEN c.minted \
                 ELSE (SELECT coalesce(sum(p.cents),0) FROM hb_packets p WHERE p.campaign = c.id) END)::bigint \
                 FROM hb_campaigns c GROUP BY 1",
                &[&hongbao_money::api::MAKER_UNKNOWN],
            )
            .await
            .map_err(|e| pg_error("auditing who minted", e))?;
        let minted_by = makers
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
            .filter(|(_, cents)| *cents > 0)
            .collect();
        Ok(Audit {
            ok: false,
            minted_cents: shake_minted + n(1),
            user_balances_cents: n(2),
            users_with_balance: n(3),
            campaign_balances_cents: n(4),
            unopened_cents: n(5),
            live_packets: n(6),
            unopened_shares: n(7),
            unclaimed_cents: shake_minted.saturating_sub(n(8)),
            unclaimed_packets: n(10).saturating_sub(n(9)),
            ledger_seq: n(11),
            minted_by,
            ledger_head: None,
            ledger_heads: chains.heads,
            chain_problems: chains.problems,
        }
        .checked())
    }

    /// Every host's hash chain recomputed from its events (`chain.rs`). On a connection
    /// of its own: the events are streamed, not held, and a long stream on the shared one
    /// would hold up every other task's reads behind it. The cost is one pass over
    /// `hb_events` after `hb_chain_since`, in `seq` order.
    async fn chains(&self) -> Result<Walked, Error> {
        let chaining = |e: tokio_postgres::Error| pg_error("walking the hash chains", e);
        let started = std::time::Instant::now();
        let pg = self.pg_own().await?;
        let since = pg
            .query_one("SELECT coalesce(max(seq), 0) FROM hb_chain_since", &[])
            .await
            .map_err(chaining)?
            .get::<_, i64>(0);
        let mut chains = Chains::new(since as u64);
        let rows = pg
            .query_raw(
                "SELECT host, seq, at_ms, body::text, hash FROM hb_events WHERE seq > $1 \
                 ORDER BY seq",
                [since],
            )
            .await
            .map_err(chaining)?;
        let mut rows = std::pin::pin!(rows);
        while let Some(r) = rows.try_next().await.map_err(chaining)? {
            chains.step(
                r.get(0),
                r.get::<_, i64>(1) as u64,
                r.get::<_, i64>(2) as u64,
                r.get(3),
                r.get(4),
            );
        }
        let events = chains.events;
        let walked = chains.finish();
        tracing::info!(
            events,
            hosts = walked.heads.len() + walked.problems.len(),
            ms = started.elapsed().as_millis() as u64,
            "the audit walked the hash chains"
        );
        Ok(walked)
    }

    pub async fn expire(&self, now: u64, host: &str) -> Result<(), Error> {
        self.bounded("expiring packets", async {
            let pg = self.pg().await?;
            let _turn = self.chain_turn().await;
            pg.query_one("SELECT hb_expire($1, $2)", &[&(now as i64), &host])
                .await
                .map_err(|e| pg_error("expiring packets", e))?;
            Ok(())
        })
        .await
    }
}
