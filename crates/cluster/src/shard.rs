//! The shard map: which PostgreSQL formation a packet and a wallet live on
//! (docs/scale-out.md, "Shards"), and the map's record in every formation.
//!
//! A packet (a campaign's, or a user's send with its shares and who opened them) lives on
//! the shard its id hashes to; a wallet (a user's balance) on the shard its user id
//! hashes to. A user's send is given an id that hashes to the sender's own wallet shard
//! (`Store::next_packet_id_on`), so its debit, its packet and its refund are one shard's
//! transactions; only credits (a win, an opened share) cross shards, by the outbox
//! (`relay`). Shard 0 also holds what is global: campaigns, packet numbering, admin keys.
//!
//! **Growing.** The map has versions; a packet is numbered under its host's version,
//! which its id carries (bits 56–59 of a packet id, 24–27 of a campaign id, so bits 56–59
//! of the campaign's packets' ids too; 0 for the first version, so a ledger that never
//! grew numbers as before), and it lives on the shard that version's count gives. A new
//! version may add formations for packets at the end of the list: packets numbered under
//! it spread over them too, older packets stay where they were born, nothing is moved.
//! Wallets stay on the first version's formations (moving wallets is not built:
//! docs/scale-out.md, "Growing").

use hongbao_money::Error;
use tokio_postgres::Client;

use crate::pg::pg_error;

/// The newest map version an id can carry (4 bits).
pub const MAX_VERSION: u32 = 15;
/// Where a packet id carries its map version.
const PACKET_VERSION_SHIFT: u32 = 56;
/// Where a campaign id carries it (a campaign's packet ids are `campaign << 32 | index`).
const CAMPAIGN_VERSION_SHIFT: u32 = 24;
/// The campaign numbers below the version's bits.
pub const MAX_CAMPAIGN_NUMBER: u32 = (1 << CAMPAIGN_VERSION_SHIFT) - 1;

/// The map as this host knows it: the version it numbers new packets under, how many
/// formations that version spreads packets over, how many hold wallets, and the shard
/// count of every earlier version recorded (to find packets born under them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMap {
    pub version: u32,
    pub shards: u32,
    /// The first version's count: wallets never move.
    pub wallets: u32,
    /// The first version recorded: its packets carry 0 in their ids.
    first: u32,
    /// Each version's shard count by the number its ids carry (0: not known here).
    counts: [u8; MAX_VERSION as usize + 1],
}

impl ShardMap {
    /// One formation: everything on shard 0.
    pub const ONE: ShardMap = ShardMap::first(1, 1);

    /// Version `version` over `shards` formations, as the first the ledger records.
    pub const fn first(version: u32, shards: u32) -> ShardMap {
        let mut counts = [0u8; MAX_VERSION as usize + 1];
        counts[0] = shards as u8;
        ShardMap {
            version,
            shards,
            wallets: shards,
            first: version,
            counts,
        }
    }

    /// The number version `version` carries in ids.
    fn mark(&self, version: u32) -> usize {
        if version == self.first {
            0
        } else {
            version as usize
        }
    }

    /// Version `version` known here with `shards` (a version past [`MAX_VERSION`],
    /// which no id can carry, is left unknown).
    fn knowing(mut self, version: u32, shards: u32) -> ShardMap {
        let mark = self.mark(version);
        if let Some(count) = self.counts.get_mut(mark) {
            *count = shards.min(u32::from(u8::MAX)) as u8;
        }
        self
    }

    /// How many shards version `version` has, if known here.
    pub fn count_of(&self, version: u32) -> Option<u32> {
        match self.counts.get(self.mark(version)).copied().unwrap_or(0) {
            0 => None,
            n => Some(u32::from(n)),
        }
    }

    /// The shard packet `id` lives on, or `None` for a packet numbered under a version
    /// newer than this host's (a host not yet restarted on the grown map).
    pub fn packet(&self, id: u64) -> Option<usize> {
        let mark = (id >> PACKET_VERSION_SHIFT) as usize;
        let shards = *self.counts.get(mark)?;
        (shards > 0).then(|| (mix(id) % u64::from(shards)) as usize)
    }

    /// The shard user `user`'s wallet lives on. Salted apart from packets', so that a
    /// user's wallet and the packets numbered like it are not bound together.
    pub fn wallet(&self, user: u64) -> usize {
        (mix(user ^ WALLET_SALT) % u64::from(self.wallets.max(1))) as usize
    }

    /// What this host's new packet ids carry: its version's mark, in place.
    pub fn packet_bits(&self) -> u64 {
        (self.mark(self.version) as u64) << PACKET_VERSION_SHIFT
    }

    /// What this host's new campaign ids carry (over a number up to
    /// [`MAX_CAMPAIGN_NUMBER`]).
    pub fn campaign_bits(&self) -> u32 {
        (self.mark(self.version) as u32) << CAMPAIGN_VERSION_SHIFT
    }
}

const WALLET_SALT: u64 = 0x5761_6c6c_6574_7321;

/// SplitMix64's finalizer: consecutive ids spread evenly over the shards.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A version a formation records: its shard count, and which shard this formation is
/// in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recorded {
    version: u32,
    shards: u32,
    me: u32,
}

/// Formation `me` recorded `r`, which disagrees with `wanted` (`why`, if more is to say).
fn disagree(me: usize, r: Recorded, wanted: ShardMap, why: &str) -> Error {
    Error::refused(format!(
        "shard map: formation {me} records version {} ({} shards, this formation shard {}); \
         this host's map is version {} ({} shards, this formation shard {me}){why}: start \
         every host with the same formations, in the same order, and the same \
         --shard-map-version, or a newer version that adds formations at the end \
         (docs/scale-out.md, \"Shards\" and \"Growing\")",
        r.version, r.shards, r.me, wanted.version, wanted.shards
    ))
}

/// Records `wanted` (this host's version over its formations) in formation `me`
/// (`hb_shard_map`), or checks it against what the formation recorded before, and
/// returns the map as the ledger has it. Shard 0 holds the map's history (`known` is
/// `None` there); every other formation is checked against what shard 0 gave.
///
/// Refused, starting nothing: a version recorded with another count; a formation that
/// recorded another place in a map (given in another order); a version newer than the
/// newest recorded with fewer formations (growing adds, never takes away); a formation
/// holding wallets from before any map under a map of several shards (half of those
/// wallets would belong elsewhere, and moving wallets is not built). A version older
/// than the newest recorded starts (a host not yet restarted while the map grows): it
/// numbers packets under its own version, and refuses ops on packets numbered under
/// versions it does not know.
pub(crate) async fn record(
    pg: &Client,
    wanted: ShardMap,
    me: usize,
    known: Option<ShardMap>,
) -> Result<ShardMap, Error> {
    let read = |e| pg_error("reading the shard map", e);
    if wanted.version == 0 || wanted.version > MAX_VERSION {
        return Err(Error::refused(format!(
            "shard map: version {} is not 1 to {MAX_VERSION}",
            wanted.version
        )));
    }
    let here = recorded(pg).await.map_err(read)?;
    if let Some(&other) = here.iter().find(|r| r.me as usize != me) {
        return Err(disagree(me, other, wanted, ""));
    }
    let map = match known {
        Some(map) if here.is_empty() && holds_wallets(pg).await? => {
            return Err(Error::refused(format!(
                "shard map: formation {me} holds wallets from before any shard map, and \
                 this host's map puts wallets on {} of its formations only; moving wallets is \
                 not built (docs/scale-out.md, \"Growing\")",
                map.wallets
            )));
        }
        Some(map) => {
            if let Some(&r) = here
                .iter()
                .find(|r| map.count_of(r.version).is_some_and(|n| n != r.shards))
            {
                return Err(disagree(me, r, wanted, ", and formation 0 another count"));
            }
            map
        }
        None => history(pg, &here, wanted).await?,
    };
    if !here.iter().any(|r| r.version == wanted.version) {
        pg.execute(
            "INSERT INTO hb_shard_map (version, shards, me, written_ms) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (version) DO NOTHING",
            &[
                &(wanted.version as i32),
                &(wanted.shards as i32),
                &(me as i32),
                &(hongbao_sys::clock::unix_ms() as i64),
            ],
        )
        .await
        .map_err(|e| pg_error("recording the shard map", e))?;
        // Another host's insert of the same version may have won: read what stands.
        if let Some(r) = recorded(pg)
            .await
            .map_err(read)?
            .into_iter()
            .find(|r| r.version == wanted.version)
        {
            if r.shards != wanted.shards || r.me as usize != me {
                return Err(disagree(me, r, wanted, ""));
            }
        }
    }
    Ok(map)
}

/// Whether formation `pg` holds any wallet.
async fn holds_wallets(pg: &Client) -> Result<bool, Error> {
    Ok(pg
        .query_one("SELECT EXISTS (SELECT 1 FROM hb_balances)", &[])
        .await
        .map_err(|e| pg_error("reading the shard map", e))?
        .get(0))
}

/// On shard 0: the map's history with `wanted` in it, as this host will use it.
async fn history(pg: &Client, here: &[Recorded], wanted: ShardMap) -> Result<ShardMap, Error> {
    let Some(first) = here.first() else {
        if holds_wallets(pg).await? && wanted.shards > 1 {
            return Err(Error::refused(format!(
                "shard map: formation 0 holds wallets from before any shard map, and this \
                 host's map spreads wallets over {} shards; moving wallets is not built \
                 (docs/scale-out.md, \"Growing\")",
                wanted.shards
            )));
        }
        return Ok(ShardMap::first(wanted.version, wanted.shards));
    };
    // Only the versions up to this host's: a newer one's formations are not among its own.
    let mut map = ShardMap::first(first.version, first.shards);
    for r in here.iter().filter(|r| r.version <= wanted.version) {
        map = map.knowing(r.version, r.shards);
    }
    let newest = *here.last().expect("a first above");
    match here.iter().find(|r| r.version == wanted.version) {
        Some(&r) if r.shards != wanted.shards => return Err(disagree(0, r, wanted, "")),
        Some(_) => {}
        None if wanted.version < newest.version => {
            return Err(disagree(
                0,
                newest,
                wanted,
                ", an older version never recorded",
            ))
        }
        None if wanted.shards <= newest.shards => {
            return Err(disagree(
                0,
                newest,
                wanted,
                ", a newer version that adds no formation",
            ))
        }
        None if here.len() >= MAX_VERSION as usize => {
            return Err(disagree(
                0,
                newest,
                wanted,
                ", and no room for another version",
            ))
        }
        None => map = map.knowing(wanted.version, wanted.shards),
    }
    Ok(ShardMap {
        version: wanted.version,
        shards: wanted.shards,
        ..map
    })
}

/// Every version formation `pg` recorded, oldest first.
async fn recorded(pg: &Client) -> Result<Vec<Recorded>, tokio_postgres::Error> {
    let rows = pg
        .query(
            "SELECT version, shards, me FROM hb_shard_map ORDER BY version",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Recorded {
            version: r.get::<_, i32>(0) as u32,
            shards: r.get::<_, i32>(1) as u32,
            me: r.get::<_, i32>(2) as u32,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_and_wallets_spread_evenly_and_one_shard_takes_everything() {
        let two = ShardMap::first(1, 2);
        let four = ShardMap::first(1, 4);
        let mut packets = [0u32; 4];
        let mut wallets = [0u32; 4];
        for id in 0..40_000u64 {
            packets[four.packet(id).unwrap()] += 1;
            wallets[four.wallet(id)] += 1;
            assert_eq!(ShardMap::ONE.packet(id), Some(0));
            assert_eq!(ShardMap::ONE.wallet(id), 0);
            assert!(two.packet(id).unwrap() < 2 && two.wallet(id) < 2);
        }
        // Within 3% of a quarter each (campaign packets are `campaign << 32 | i`: consecutive).
        for n in packets.iter().chain(&wallets) {
            assert!((9_700..=10_300).contains(n), "{packets:?} {wallets:?}");
        }
        let campaign = |i: u64| (7u64 << 32) | i;
        let on_zero = (0..10_000)
            .filter(|&i| two.packet(campaign(i)) == Some(0))
            .count();
        assert!((4_800..=5_200).contains(&on_zero), "{on_zero}");
    }

    #[test]
    fn a_grown_map_puts_new_campaigns_packets_on_every_shard_and_leaves_the_old_where_they_were() {
        // Version 1 over two formations, then version 2 adding a third.
        let old = ShardMap::first(1, 2);
        let grown = ShardMap {
            version: 2,
            shards: 3,
            ..old.knowing(2, 3)
        };
        assert_eq!(
            (grown.wallets, grown.count_of(1), grown.count_of(2)),
            (2, Some(2), Some(3))
        );
        // The first version's ids carry 0: a ledger that never grew numbers as before.
        assert_eq!((old.packet_bits(), old.campaign_bits()), (0, 0));
        assert_eq!(grown.campaign_bits(), 2 << 24);
        assert_eq!(grown.packet_bits(), 2 << 56);
        let packet = |campaign: u32, i: u32| hongbao_money::rules::shake_packet_id(campaign, i);
        let mut on = [0u32; 3];
        for i in 0..30_000 {
            // A campaign numbered under version 1 stays on its two shards for both hosts.
            let before = packet(7, i);
            assert_eq!(grown.packet(before), old.packet(before));
            assert!(grown.packet(before).unwrap() < 2);
            // One numbered under version 2 spreads over three; the old host knows none.
            let after = packet(grown.campaign_bits() | 7, i);
            on[grown.packet(after).unwrap()] += 1;
            assert_eq!(old.packet(after), None);
            // Wallets never move.
            assert_eq!(grown.wallet(u64::from(i)), old.wallet(u64::from(i)));
        }
        for n in on {
            assert!((9_700..=10_300).contains(&n), "{on:?}");
        }
        // An id of a version nobody recorded is nobody's.
        assert_eq!(grown.packet(packet(5 << 24 | 7, 0)), None);
        assert_eq!(grown.packet(15 << 56), None);
    }
}
