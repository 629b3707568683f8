//! The shard map: which PostgreSQL formation a packet and a wallet live on
//! (docs/scale-out.md, "Shards"), and the map's record in every formation.
//!
//! A packet (a campaign's, or a user's send with its shares and who opened them) lives on
//! the shard its id hashes to; a wallet (a user's balance) on the shard its user id
//! hashes to. A user's send is given an id that hashes to the sender's own wallet shard
//! (`Store::next_packet_id_on`), so its debit, its packet and its refund are one shard's
//! transactions; only credits (a win, an opened share) cross shards, by the outbox
//! (`relay`). Shard 0 also holds what is global: campaigns, packet numbering, admin keys.

use hongbao_money::Error;
use tokio_postgres::Client;

use crate::pg::pg_error;

/// The map: its version and how many formations it spreads over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMap {
    pub version: u32,
    pub shards: u32,
}

impl ShardMap {
    /// One formation: everything on shard 0.
    pub const ONE: ShardMap = ShardMap {
        version: 1,
        shards: 1,
    };

    /// The shard packet `id` lives on.
    pub fn packet(&self, id: u64) -> usize {
        (mix(id) % u64::from(self.shards.max(1))) as usize
    }

    /// The shard user `user`'s wallet lives on. Salted apart from packets', so that a
    /// user's wallet and the packets numbered like it are not bound together.
    pub fn wallet(&self, user: u64) -> usize {
        (mix(user ^ WALLET_SALT) % u64::from(self.shards.max(1))) as usize
    }
}

const WALLET_SALT: u64 = 0x5761_6c6c_6574_7321;

/// SplitMix64's finalizer: consecutive ids spread evenly over the shards.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What a formation records of the map: its version, its shard count, and which shard
/// this formation is in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recorded {
    version: u32,
    shards: u32,
    me: u32,
}

/// Records `map` in formation `me` (`hb_shard_map`), or checks it against what the
/// formation recorded before: a host whose map disagrees — another version, another
/// count, or the formations given in another order — is refused, and starts nothing.
/// A formation holding wallets from before any map is refused a map of several shards:
/// half of those wallets would belong elsewhere, and moving wallets is not built.
pub(crate) async fn record(pg: &Client, map: ShardMap, me: usize) -> Result<(), Error> {
    let read = |e| pg_error("reading the shard map", e);
    let wanted = Recorded {
        version: map.version,
        shards: map.shards,
        me: me as u32,
    };
    let found = match newest_recorded(pg).await.map_err(read)? {
        Some(found) => found,
        None => {
            let wallets: bool = pg
                .query_one("SELECT EXISTS (SELECT 1 FROM hb_balances)", &[])
                .await
                .map_err(read)?
                .get(0);
            if wallets && map.shards > 1 {
                return Err(Error::refused(format!(
                    "shard map: formation {me} holds wallets from before any shard map, and \
                     this host's map spreads wallets over {} shards; moving wallets is not \
                     built (docs/scale-out.md, \"Growing\")",
                    map.shards
                )));
            }
            pg.execute(
                "INSERT INTO hb_shard_map (version, shards, me, written_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (version) DO NOTHING",
                &[
                    &(map.version as i32),
                    &(map.shards as i32),
                    &(me as i32),
                    &(hongbao_sys::clock::unix_ms() as i64),
                ],
            )
            .await
            .map_err(|e| pg_error("recording the shard map", e))?;
            newest_recorded(pg).await.map_err(read)?.unwrap_or(wanted)
        }
    };
    if found == wanted {
        return Ok(());
    }
    Err(Error::refused(format!(
        "shard map: formation {me} records version {} ({} shards, this formation shard {}); \
         this host's map is version {} ({} shards, this formation shard {me}): start every \
         host with the same formations, in the same order, and the same --shard-map-version \
         (docs/scale-out.md, \"Shards\")",
        found.version, found.shards, found.me, map.version, map.shards
    )))
}

/// The newest map formation `pg` recorded, if any.
async fn newest_recorded(pg: &Client) -> Result<Option<Recorded>, tokio_postgres::Error> {
    let row = pg
        .query_opt(
            "SELECT version, shards, me FROM hb_shard_map ORDER BY version DESC LIMIT 1",
            &[],
        )
        .await?;
    Ok(row.map(|r| Recorded {
        version: r.get::<_, i32>(0) as u32,
        shards: r.get::<_, i32>(1) as u32,
        me: r.get::<_, i32>(2) as u32,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_and_wallets_spread_evenly_and_one_shard_takes_everything() {
        let two = ShardMap {
            version: 1,
            shards: 2,
        };
        let four = ShardMap {
            version: 1,
            shards: 4,
        };
        let mut packets = [0u32; 4];
        let mut wallets = [0u32; 4];
        for id in 0..40_000u64 {
            packets[four.packet(id)] += 1;
            wallets[four.wallet(id)] += 1;
            assert_eq!(ShardMap::ONE.packet(id), 0);
            assert_eq!(ShardMap::ONE.wallet(id), 0);
            assert!(two.packet(id) < 2 && two.wallet(id) < 2);
        }
        // Within 3% of a quarter each (campaign packets are `campaign << 32 | i`: consecutive).
        for n in packets.iter().chain(&wallets) {
            assert!((9_700..=10_300).contains(n), "{packets:?} {wallets:?}");
        }
        let campaign = |i: u64| (7u64 << 32) | i;
        let on_zero = (0..10_000)
            .filter(|&i| two.packet(campaign(i)) == 0)
            .count();
        assert!((4_800..=5_200).contains(&on_zero), "{on_zero}");
    }
}
