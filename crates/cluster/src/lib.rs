//! The cluster money backend: any number of equal gateway hosts over a Redis Cluster and
//! a PostgreSQL ledger of one formation or several shards (docs/scale-out.md).
//!
//! - PostgreSQL is the ledger and the only judge of money: wins, sends, opens and refunds
//!   are PL/pgSQL functions (`schema.sql`) that check every rule under row locks and
//!   append the event. A reply that tells of money goes out only after the transaction
//!   holding it has committed; ops are group-committed, one transaction per batch. A
//!   sharded ledger commits each op on its packet's shard; a credit for a wallet on
//!   another shard goes there by the outbox (`relay`), never in a distributed
//!   transaction.
//! - Redis holds what is hot and what crosses hosts: the release of campaign packets at
//!   their exact rate (`release.lua`, over one hash tag or several, Redis's clock), the
//!   packets each host holds (returned when a host dies), a gate per sent packet in
//!   front of PostgreSQL (`gate.lua`), user → host routes, and sharded pub/sub channels
//!   per host for notices, chat and broadcasts. Losing any of it costs speed or a
//!   push, never money; all of it Redis may lose is told again from the hosts and
//!   PostgreSQL (`restore.lua`).
//!
//! The gateways see the same [`Money`] interface as the embedded backend: calls go to a
//! tokio runtime on a thread of its own, outputs come back through `drain` and a waker.
//!
//! Where things are, from the gateway's side down to the engines:
//! - `cluster`: the [`Cluster`] the supervisor holds, the `Money` seam's cluster side;
//!   its calls become commands for this host's loop.
//! - `host`: this host's loop on the runtime thread: commands, ops, the released shake
//!   packets dealt to the workers, messages from other hosts.
//! - `shared`: what the runtime thread hands back to the gateway: outputs, counters, a
//!   failure.
//! - `admin`: operators' requests: creating campaigns, their status, the audit.
//! - `campaign`: a campaign's row, its send packets drawn from its seed, its status.
//! - `commit`: an op on its way to the ledger, and what it became there.
//! - `committer`: group commit, one PostgreSQL transaction per batch of ops.
//! - `outcome`: what a batch's ops are told once it committed (or did not), and what
//!   Redis and the recipients learn then.
//! - `ledger`: reads of the PostgreSQL ledger, packet numbering and expiry.
//! - `chain`: each host's hash chain over its events, as the audit walks it.
//! - `release`: packets released by Redis at their rate, packets held, hosts alive, and
//!   a release Redis lost started again from the ledger.
//! - `gate`: a sent packet's gate in Redis, in front of PostgreSQL.
//! - `delivery`: reaching users on other hosts: routes, publishing, notices, staying
//!   subscribed through failovers.
//! - `mesh`: the messages hosts send each other, and each host's channel.
//! - `store`: the connections to PostgreSQL and the Redis Cluster, shared by all of these;
//! - `connect`: connecting to PostgreSQL: the read-write one of the URL's hosts, each
//!   attempt bounded, dead connections found;
//! - `access`: admin keys and the admin log in PostgreSQL, for the admin API's threads;
//! - `standby`: whether the primary's commits are synchronous to a standby now.
//! - `shard`: the shard map: which formation a packet and a wallet live on, and the
//!   map's record in every formation;
//! - `relay`: credits moved from a packet's shard to the winner's wallet shard (the
//!   outbox), idempotently by op id.
//!
//! This file holds what every part agrees on: the configuration, the timings and the clock.
//!
//! [`Money`]: hongbao_money::Money

mod access;
mod admin;
mod campaign;
mod chain;
mod cluster;
mod commit;
mod committer;
mod connect;
mod delivery;
mod gate;
mod host;
mod ledger;
mod mesh;
mod outcome;
mod pg;
mod relay;
mod release;
pub mod shard;
mod shared;
mod standby;
mod store;
mod tags;
#[cfg(test)]
mod testpg;
pub mod versions;

use std::time::Duration;

pub use access::PgAccess;
pub use campaign::{campaign_packet, CampaignRow};
pub use cluster::Cluster;
pub use commit::Commit;
pub use store::Store;

/// What a gateway host needs to join a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Redis Cluster seed nodes, `redis://[USER@]HOST:PORT`, or `rediss://…` for TLS
    /// (trusting `PgTarget::ca`, the one CA file of the engines).
    pub redis: Vec<String>,
    /// The Redis ACL user's password (from a file or the environment, never the URL).
    pub redis_password: Option<String>,
    /// The PostgreSQL formations of the ledger, shard 0 first (docs/scale-out.md,
    /// "Shards"): one for a ledger that is not sharded. Shard 0 also holds what is global
    /// (campaigns, packet numbering, admin keys, host versions).
    pub postgres: Vec<PgTarget>,
    /// The shard map's version: recorded in every formation at the first start, and a
    /// host whose map disagrees with theirs refuses to start.
    pub shard_map_version: u32,
    /// This host's name: unique among the hosts; its pub/sub channel and held packets.
    pub host: String,
    pub packet_ttl_ms: u64,
    /// How long a batch waits for more ops before it commits.
    pub commit_window: Duration,
    pub max_batch: usize,
    /// How many Redis hash tags (slots) the release of every campaign is split over:
    /// packet index i goes out from tag i mod K (`tags::release_tag`), so each slot
    /// serves a K-th of the release. 1 is the release under `{rel}` alone; 0 is refused.
    /// The same on every host; changed only while no campaign is running (a campaign
    /// keeps the K it was created with, but a packet won is told to tag i mod this K).
    pub release_tags: u32,
}

impl ClusterConfig {
    /// The shard map these formations make, as this host wants it: what the ledger
    /// recorded before fills in the rest (`shard::record`).
    pub fn shard_map(&self) -> shard::ShardMap {
        shard::ShardMap::first(
            self.shard_map_version.max(1),
            self.postgres.len().max(1) as u32,
        )
    }
}

/// Where the PostgreSQL ledger is and how to log in to it: the password is kept apart
/// from the URL, so that the URL can be shown (`Debug` shows no password).
#[derive(Clone, Default)]
pub struct PgTarget {
    /// `postgres://USER@HOST:PORT/DB` (libpq-style key=value strings work too);
    /// `sslmode=verify-full` (or `require`, `verify-ca`: each verifies fully here) for TLS.
    pub url: String,
    pub password: Option<String>,
    /// The CA certificates (PEM) the engines' TLS is trusted by: PostgreSQL's with an
    /// `sslmode` asking for TLS, Redis's with `rediss://`.
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", redact(&self.url))?;
        if self.password.is_some() {
            f.write_str(" (with a password)")?;
        }
        Ok(())
    }
}

/// A URL as it may be shown: a password in it (`scheme://user:password@host`) replaced
/// by `***`. The user info ends at the last `@` before the query, so a password holding
/// `@`, `:` or `/` (written unescaped) is hidden whole.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let before_query = rest.find(['?', '#']).unwrap_or(rest.len());
    match rest[..before_query].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// A host silent for this long is dead: its held packets are released again.
pub const HOST_DEAD_AFTER_MS: u64 = 3000;
/// How often a host asks Redis for the packets due (and says it is alive).
pub const RELEASE_EVERY: Duration = Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_url_is_printed_without_its_password() {
        for (url, shown) in [
            (
                "redis://hongbao:s3cret@127.0.0.1:6379/0",
                "redis://hongbao:***@127.0.0.1:6379/0",
            ),
            (
                "rediss://:s3cret@10.0.0.1:6380",
                "rediss://:***@10.0.0.1:6380",
            ),
            // A password holding '@' and ':' is hidden whole: the host is after the last '@'.
            (
                "postgres://hongbao:p@ss:w@rd@db.example:5432/hongbao?sslmode=verify-full",
                "postgres://hongbao:***@db.example:5432/hongbao?sslmode=verify-full",
            ),
            // Unescaped '/' in a password: still hidden.
            (
                "postgres://hongbao:s3cret/x@db:5432/hongbao",
                "postgres://hongbao:***@db:5432/hongbao",
            ),
            // No password: nothing to hide.
            (
                "redis://hongbao@127.0.0.1:6379",
                "redis://hongbao@127.0.0.1:6379",
            ),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
            assert!(!redact(url).contains("s3cret") && !redact(url).contains("w@rd"));
        }
    }
}
