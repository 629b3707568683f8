//! Reads of the PostgreSQL ledger (balances, a user's view, the notices waiting for a
//! user, the wins and opened shares, the audit and its walk of the hosts' hash chains),
//! and the two writes that need no batch: numbering packets, a block of ids at a time, and
//! expiring them. A sharded ledger is read on every formation and the answers merged: a
//! wallet is on its own shard, a packet's rows on the packet's (`shard`).

use futures_util::TryStreamExt;
use hongbao_money::seam::{Balances, LedgerOp, OpsCursor, OpsPage};
use hongbao_money::Error;
use hongbao_money::{Audit, Notice, UserId, UserView};

use crate::chain::{Chains, Walked};
use crate::pg::{i64s, pg_error};
use crate::store::{Shard, Store};

/// Ids per block of `hb_packet_blocks`.
const PACKET_BLOCK: u64 = 4096;

impl Store {
    /// A fresh packet id, from this host's block of `hb_packet_blocks` (on shard 0).
    pub async fn next_packet_id(&self) -> Result<u64, Error> {
        let mut ids = self.0.ids.lock().await;
        self.draw_id(&mut ids).await
    }

    async fn draw_id(&self, ids: &mut crate::store::PacketIds) -> Result<u64, Error> {
        if ids.next >= ids.end {
            let pg = self.pg().await?;
            let row = pg
                .query_one("SELECT nextval('hb_packet_blocks')", &[])
                .await
                .map_err(|e| pg_error("numbering packets", e))?;
            let block = row.get::<_, i64>(0) as u64;
            (ids.next, ids.end) = (block * PACKET_BLOCK, (block + 1) * PACKET_BLOCK);
        }
        let id = ids.next;
        ids.next += 1;
        Ok(id)
    }

    /// A fresh packet id that lives on wallet shard `shard` (a send's: its sender's, so
    /// the debit and the packet are one transaction). Ids drawn on the way that belong
    /// to other shards are kept for their sends: none is wasted, and a send costs one
    /// id drawn on average. Sends are numbered under the map's first version, whatever
    /// this host's: they live on wallet shards, which every version has, so a host of
    /// any version finds them.
    pub async fn next_packet_id_on(&self, shard: usize) -> Result<u64, Error> {
        let map = self.map();
        let mut ids = self.0.ids.lock().await;
        ids.spare
            .resize_with(map.wallets as usize, Default::default);
        if let Some(id) = ids.spare.get_mut(shard).and_then(|s| s.pop_front()) {
            return Ok(id);
        }
        loop {
            let id = self.draw_id(&mut ids).await?;
            match map.packet(id) {
                Some(on) if on == shard => return Ok(id),
                Some(on) => ids.spare[on].push_back(id),
                None => {
                    return Err(Error::unavailable(
                        "numbering a send",
                        format!("packet id {id} carries no version of this host's map"),
                    ))
                }
            }
        }
    }

    /// `read` on every formation at once, the answers in shard order.
    pub(crate) async fn on_every_shard<'a, T, F, Fut>(&'a self, read: F) -> Result<Vec<T>, Error>
    where
        F: Fn(usize, &'a Shard) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        futures_util::future::try_join_all(
            self.shards()
                .iter()
                .enumerate()
                .map(|(i, shard)| read(i, shard)),
        )
        .await
    }

    /// A one-row query of bigint columns, on every formation, summed column by column.
    pub(crate) async fn summed(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<i64>, Error> {
        let rows = self
            .on_every_shard(|_, shard| async move {
                let pg = shard.pg().await?;
                let row = pg
                    .query_one(sql, params)
                    .await
                    .map_err(|e| pg_error(what, e))?;
                Ok((0..row.len())
                    .map(|i| row.get::<_, i64>(i))
                    .collect::<Vec<i64>>())
            })
            .await?;
        let mut sums = vec![0i64; rows.first().map_or(0, Vec::len)];
        for row in rows {
            for (sum, v) in sums.iter_mut().zip(row) {
                *sum += v;
            }
        }
        Ok(sums)
    }

    /// A user's balance: on their wallet's shard. A credit still in an outbox on
    /// another shard (a win or an opened share, relayed within `relay::EVERY` and a
    /// commit) is not in it yet.
    pub async fn balance(&self, user: u64) -> Result<u64, Error> {
        let pg = self.shard(self.map().wallet(user)).pg().await?;
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
        // A user's events are on the shards of the packets they won, opened and sent:
        // each shard's newest, merged newest first (by time: each shard numbers its own).
        let (user_id, limit_i) = (user as i64, limit as i64);
        let mut rows: Vec<(i64, i64, serde_json::Value)> = self
            .on_every_shard(|_, shard| async move {
                let pg = shard.pg().await?;
                let rows = pg
                    .query(
                        "SELECT seq, at_ms, body FROM hb_events WHERE user_id = $1 \
                         ORDER BY seq DESC LIMIT $2",
                        &[&user_id, &limit_i],
                    )
                    .await
                    .map_err(|e| pg_error("reading events", e))?;
                Ok(rows
                    .iter()
                    .map(|r| (r.get::<_, i64>(1), r.get::<_, i64>(0), r.get(2)))
                    .collect::<Vec<_>>())
            })
            .await?
            .into_iter()
            .flatten()
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse((r.0, r.1)));
        let recent_events = rows
            .into_iter()
            .take(limit)
            .map(|(at, seq, mut event)| {
                event["seq"] = seq.into();
                event["ts_ms"] = at.into();
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
        Ok(self
            .waiting_notices_of(&[user], now)
            .await?
            .into_iter()
            .map(|(_, notice)| notice)
            .collect())
    }

    /// The waiting notices of all of `users` (this host's users, after its channel was
    /// lost for a while), as (user, notice), in one query a shard, by packet.
    pub async fn waiting_notices_of(
        &self,
        users: &[u64],
        now: u64,
    ) -> Result<Vec<(u64, Notice)>, Error> {
        let (users, now) = (&i64s(users), now as i64);
        let mut all: Vec<(u64, Notice)> = self
            .on_every_shard(|_, shard| async move {
                let pg = shard.pg().await?;
                let rows = pg
                    .query(
                        "SELECT r.user_id, p.id, p.sender, p.cents, p.shares, p.expires_ms \
                         FROM hb_recipients r JOIN hb_packets p ON p.id = r.packet \
                         WHERE r.user_id = ANY($1) AND r.opened_cents IS NULL \
                           AND p.refunded IS NULL AND p.expires_ms > $2 ORDER BY p.id",
                        &[users, &now],
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
                    .collect::<Vec<_>>())
            })
            .await?
            .into_iter()
            .flatten()
            .collect();
        all.sort_by_key(|(_, n)| n.packet_id);
        Ok(all)
    }

    pub async fn balances(&self) -> Result<Balances, Error> {
        let mut all = Balances::default();
        for (users, campaigns) in self
            .on_every_shard(|_, shard| async move {
                let pg = shard.pg().await?;
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
                Ok((users, campaigns))
            })
            .await?
        {
            for r in users {
                *all.users.entry(r.get::<_, i64>(0) as u64).or_default() +=
                    r.get::<_, i64>(1) as u64;
            }
            for r in campaigns {
                *all.campaigns.entry(r.get::<_, i32>(0) as u32).or_default() +=
                    r.get::<_, i64>(1) as u64;
            }
        }
        Ok(all)
    }

    /// Up to `limit` wins and opened shares after `after`: the wins (`hb_wins`) by packet,
    /// then the opened shares (`hb_recipients` with `opened_cents`) by (packet, user), each
    /// paged on its primary key, so a page costs the same wherever it starts. These tables
    /// are what pays: their keys allow one win per packet and one share per recipient. A
    /// sharded ledger's page is every shard's page merged, its first `limit` kept: the
    /// cursor is the same, since a packet lives on one shard only.
    pub async fn ops(&self, after: Option<OpsCursor>, limit: usize) -> Result<OpsPage, Error> {
        let mut page = OpsPage::default();
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
        let ops = |sql: &'static str, what: &'static str, after: (i64, i64), limit: i64| async move {
            let mut all: Vec<LedgerOp> = self
                .on_every_shard(|_, shard| async move {
                    let pg = shard.pg().await?;
                    let rows = pg
                        .query(sql, &[&after.0, &after.1, &limit])
                        .await
                        .map_err(|e| pg_error(what, e))?;
                    Ok(rows
                        .iter()
                        .map(|r| LedgerOp {
                            packet: r.get::<_, i64>(0) as u64,
                            user: r.get::<_, i64>(1) as u64,
                            amount_cents: r.get::<_, i64>(2) as u64,
                        })
                        .collect::<Vec<_>>())
                })
                .await?
                .into_iter()
                .flatten()
                .collect();
            all.sort_by_key(|o| (o.packet as i64, o.user as i64));
            all.truncate(limit as usize);
            Ok::<_, Error>(all)
        };
        if let Some(win_after) = win_after {
            page.wins = ops(
                "SELECT packet, user_id, cents FROM hb_wins WHERE packet > $1 AND $2::bigint IS NOT NULL \
                 ORDER BY packet LIMIT $3",
                "reading wins",
                (win_after, 0),
                limit as i64,
            )
            .await?;
            if page.wins.len() == limit {
                page.next = page.wins.last().map(|w| OpsCursor::Win(w.packet));
                return Ok(page);
            }
        }
        let left = limit - page.wins.len();
        page.opens = ops(
            "SELECT packet, user_id, opened_cents FROM hb_recipients \
             WHERE opened_cents IS NOT NULL AND (packet, user_id) > ($1, $2) \
             ORDER BY packet, user_id LIMIT $3",
            "reading opened shares",
            open_after,
            left as i64,
        )
        .await?;
        if page.opens.len() == left {
            page.next = page.opens.last().map(|o| OpsCursor::Open {
                packet: o.packet,
                user: o.user,
            });
        }
        Ok(page)
    }

    /// The audit: every cent minted is in a balance, a live packet, a shake packet not
    /// yet won, or a credit on its way between shards; and, walked just before in
    /// snapshots of their own, every host's hash chain on every shard holds.
    ///
    /// Each shard is read in one snapshot of its own, and the shards' snapshots are not
    /// taken at one instant; the sum is exact anyway. A credit leaves its packet's shard
    /// in the transaction that writes its outbox row (the win or the open), and reaches
    /// its wallet's shard in the transaction that writes its `hb_credits_in` row (the
    /// relay's). Counted as in flight is every outbox row ever written less every credit
    /// ever received: whichever of the two commits each snapshot saw, the credit is
    /// counted exactly once — as the packet's (neither seen), in flight (the first), or
    /// in the wallet (both); seeing only the second counts it in the wallet and takes it
    /// off in flight, its packet still counting it, so it nets to once again.
    pub async fn audit(&self) -> Result<Audit, Error> {
        let chains = self.chains().await?;
        let pg = self.pg().await?;
        let global = pg
            .query_one(
                "SELECT \
                 (SELECT coalesce(sum(minted),0) FROM hb_campaigns WHERE kind = 'shake')::bigint, \
                 (SELECT coalesce(sum(packets),0) FROM hb_campaigns WHERE kind = 'shake')::bigint",
                &[],
            )
            .await
            .map_err(|e| pg_error("auditing", e))?;
        let (shake_minted, shake_packets) = (
            global.get::<_, i64>(0) as u64,
            global.get::<_, i64>(1) as u64,
        );
        let r = self
            .summed(
                "auditing",
                "SELECT \
                 (SELECT coalesce(sum(cents),0) FROM hb_packets WHERE campaign IS NOT NULL)::bigint, \
                 (SELECT coalesce(sum(cents),0) FROM hb_balances)::bigint, \
                 (SELECT count(*) FROM hb_balances WHERE cents > 0), \
                 (SELECT coalesce(sum(refunded),0) FROM hb_packets WHERE campaign IS NOT NULL)::bigint, \
                 (SELECT coalesce(sum(cents - opened_cents),0) FROM hb_packets WHERE refunded IS NULL)::bigint, \
                 (SELECT count(*) FROM hb_packets WHERE refunded IS NULL AND opened < shares), \
                 (SELECT coalesce(sum(shares - opened),0) FROM hb_packets WHERE refunded IS NULL)::bigint, \
                 (SELECT coalesce(sum(cents),0) FROM hb_wins)::bigint, \
                 (SELECT count(*) FROM hb_wins), \
                 (SELECT coalesce(max(seq),0) FROM hb_events), \
                 (SELECT coalesce(sum(cents),0) FROM hb_outbox)::bigint, \
                 (SELECT coalesce(sum(cents),0) FROM hb_credits_in)::bigint",
                &[],
            )
            .await?;
        let n = |i: usize| r[i] as u64;
        // Who minted each cent: a shake campaign's mint, a send campaign's packets (on
        // every shard).
        let makers = pg
            .query(
                "SELECT id, coalesce(created_by, $1), CASE WHEN kind = 'shake' THEN minted END \
                 FROM hb_campaigns",
                &[&hongbao_money::api::MAKER_UNKNOWN],
            )
            .await
            .map_err(|e| pg_error("auditing who minted", e))?;
        let sent: std::collections::HashMap<i32, i64> = self
            .on_every_shard(|_, shard| async move {
                let pg = shard.pg().await?;
                pg.query(
                    "SELECT campaign, sum(cents)::bigint FROM hb_packets \
                     WHERE campaign IS NOT NULL GROUP BY campaign",
                    &[],
                )
                .await
                .map_err(|e| pg_error("auditing who minted", e))
            })
            .await?
            .into_iter()
            .flatten()
            .fold(Default::default(), |mut sums, r| {
                *sums.entry(r.get::<_, i32>(0)).or_default() += r.get::<_, i64>(1);
                sums
            });
        let mut minted_by = std::collections::BTreeMap::<String, u64>::new();
        for m in &makers {
            let cents = m
                .get::<_, Option<i64>>(2)
                .unwrap_or_else(|| sent.get(&m.get::<_, i32>(0)).copied().unwrap_or(0));
            *minted_by.entry(m.get(1)).or_default() += cents as u64;
        }
        minted_by.retain(|_, cents| *cents > 0);
        Ok(Audit {
            ok: false,
            minted_cents: shake_minted + n(0),
            user_balances_cents: n(1),
            users_with_balance: n(2),
            campaign_balances_cents: n(3),
            unopened_cents: n(4),
            live_packets: n(5),
            unopened_shares: n(6),
            unclaimed_cents: shake_minted.saturating_sub(n(7)),
            unclaimed_packets: shake_packets.saturating_sub(n(8)),
            ledger_seq: n(9),
            credits_in_flight_cents: n(10).saturating_sub(n(11)),
            minted_by,
            ledger_head: None,
            ledger_heads: chains.heads,
            chain_problems: chains.problems,
        }
        .checked())
    }

    /// Every host's hash chain on every shard, recomputed from its events (`chain.rs`);
    /// a sharded ledger's heads are named `SHARD/HOST`.
    async fn chains(&self) -> Result<Walked, Error> {
        let sharded = self.shards().len() > 1;
        let mut all = Walked {
            heads: Default::default(),
            problems: Vec::new(),
        };
        for (i, walked) in self
            .on_every_shard(|i, shard| async move {
                chains_of(shard)
                    .await
                    .map_err(|e| e.context(format!("shard {i}")))
            })
            .await?
            .into_iter()
            .enumerate()
        {
            let name = |host: String| if sharded { format!("{i}/{host}") } else { host };
            all.heads
                .extend(walked.heads.into_iter().map(|(h, head)| (name(h), head)));
            all.problems.extend(walked.problems.into_iter().map(|p| {
                if sharded {
                    format!("shard {i}: {p}")
                } else {
                    p
                }
            }));
        }
        Ok(all)
    }

    /// Expiry on every shard, each under this host's chain turn there.
    pub async fn expire(&self, now: u64, host: &str) -> Result<(), Error> {
        let expired = self
            .on_every_shard(|i, shard| async move {
                self.bounded(i, "expiring packets", async {
                    let pg = shard.pg().await?;
                    let _turn = self.chain_turn(i).await;
                    pg.query_one("SELECT hb_expire($1, $2)", &[&(now as i64), &host])
                        .await
                        .map_err(|e| pg_error("expiring packets", e))?;
                    Ok(())
                })
                .await
                .map_err(|e| e.context(format!("shard {i}")))
            })
            .await;
        expired.map(|_| ())
    }
}

/// One formation's hash chains, recomputed from its events. On a connection of its own:
/// the events are streamed, not held, and a long stream on the shared one would hold up
/// every other task's reads behind it. The cost is one pass over `hb_events` after
/// `hb_chain_since`, in `seq` order.
async fn chains_of(shard: &Shard) -> Result<Walked, Error> {
    let chaining = |e: tokio_postgres::Error| pg_error("walking the hash chains", e);
    let started = std::time::Instant::now();
    let pg = shard.pg_own().await?;
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
