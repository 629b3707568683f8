//! Packets released at their campaign's rate by Redis (`release.lua`, on Redis's clock),
//! the packets this host holds and has not given yet, and which hosts are alive: asking
//! for the release is a host's heartbeat, and a silent host's packets go to the others;
//! a release Redis lost is started again from what PostgreSQL says is done.
//!
//! The release is split over `ClusterConfig::release_tags` (K) Redis hash tags, each its
//! own slot (and so, in a cluster of several masters, perhaps its own node and core):
//! packet index i of a campaign is tag i mod K's, and every tag keeps its own hosts,
//! held packets and batches. A host asks every tag at each release tick, all at once,
//! so one host's calls cost each tag's slot a K-th of the packets and no more than one
//! call's fixed commands (docs/scale-out.md, "The release over several slots").

use hongbao_money::Error;
use redis::AsyncCommands;

use crate::campaign::CampaignRow;
use crate::pg::pg_error;
use crate::store::Store;
use crate::tags::{release_tag, tag_of, tag_packets};
use crate::HOST_DEAD_AFTER_MS;

/// Tag `t`'s hash of a campaign whose release starts (admin.rs makes one in every tag):
/// its packets (this tag's), the campaign's rate and start, none released yet, and K
/// and t. These two are kept in the hash, not passed by each call, so that a campaign
/// keeps the split it was made with: a host told another K, or of the version before
/// tags, releases a tag's indexes as they were dealt, never one twice. With one tag the
/// hash is the one from before tags (no `tags`, no `tag`).
pub(crate) fn release_fields(c: &CampaignRow, tags: u32, t: u32) -> Vec<(&'static str, u64)> {
    let mut fields = vec![
        ("packets", u64::from(tag_packets(c.packets, tags, t))),
        ("rate", u64::from(c.rate)),
        ("start", c.started_ms),
        ("next", 0),
    ];
    if tags > 1 {
        fields.extend([("tags", u64::from(tags)), ("tag", u64::from(t))]);
    }
    fields
}

/// restore.lua's call for tag `t` of `tags` of campaign `c`, whose packets `done` (of
/// every tag, ascending) are won or created: only tag t's are passed.
fn restore_call<'a>(
    restore: &'a redis::Script,
    c: &CampaignRow,
    tags: u32,
    t: u32,
    done: &[u32],
) -> redis::ScriptInvocation<'a> {
    let done_here: Vec<u32> = done
        .iter()
        .copied()
        .filter(|&i| tag_of(i, tags) == t)
        .collect();
    let mut call = restore.prepare_invoke();
    call.key(format!("{}:c:{}", release_tag(t), c.id))
        .arg(c.id)
        .arg(c.packets)
        .arg(c.rate)
        .arg(c.started_ms)
        .arg(tags)
        .arg(t)
        .arg(done_here);
    call
}

/// What one call of release.lua, on one tag, gave this host.
pub(crate) struct Released {
    /// The batch's number (each tag numbers its own).
    pub(crate) batch: u64,
    /// Its packets, as (campaign, index).
    pub(crate) due: Vec<(u32, u32)>,
    /// This host was not among the tag's hosts alive: its first call, a host found dead
    /// coming back, or Redis having lost the tag's keys (then every host is fresh).
    pub(crate) fresh: bool,
}

impl Store {
    /// The release's tags, `ClusterConfig::release_tags`.
    pub(crate) fn release_tags(&self) -> u32 {
        self.0.release_tags
    }

    /// The packets due to this host now on release tags `asked`, as (campaign, index),
    /// each tag's in a batch numbered after `received[t]`, the last batch this host
    /// received from tag t (release.lua gives a batch again until it is received).
    /// `users`: how many are logged in on this host now (its share of what comes due).
    /// The tags are asked all at once (their calls pipelined on the one connection to
    /// each node); one tag that does not answer leaves the others' answers whole.
    pub(crate) async fn release(
        &self,
        host: &str,
        asked: &[u32],
        received: &[u64],
        users: usize,
    ) -> Vec<(u32, Result<Released, Error>)> {
        let tags = self.release_tags();
        let ungiven = self.0.ungiven.lock().unwrap().clone();
        // A given packet's removal is told to the tag its index belongs to.
        let mut naming: Vec<Vec<String>> = vec![Vec::new(); tags as usize];
        for p in &ungiven {
            if let Some(i) = p.split_once(':').and_then(|(_, i)| i.parse::<u32>().ok()) {
                naming[tag_of(i, tags) as usize].push(p.clone());
            }
        }
        let calls = asked.iter().map(|&t| {
            let received = received.get(t as usize).copied().unwrap_or(0);
            let named = &naming[t as usize];
            async move { (t, self.release_on(t, host, received, users, named).await) }
        });
        let released = futures_util::future::join_all(calls).await;
        let told: Vec<&String> = released
            .iter()
            .filter(|(_, r)| r.is_ok())
            .flat_map(|(t, _)| &naming[*t as usize])
            .collect();
        if !told.is_empty() {
            self.0
                .ungiven
                .lock()
                .unwrap()
                .retain(|p| !told.contains(&p));
        }
        released
    }

    /// One call of release.lua on tag `t`.
    async fn release_on(
        &self,
        t: u32,
        host: &str,
        received: u64,
        users: usize,
        ungiven: &[String],
    ) -> Result<Released, Error> {
        let mut redis = self.redis();
        let out: Vec<redis::Value> = self
            .0
            .release
            .key(format!("{}:hosts", release_tag(t)))
            .arg(host)
            .arg(HOST_DEAD_AFTER_MS)
            .arg(received)
            .arg(users)
            .arg(ungiven)
            .invoke_async(&mut redis)
            .await
            .map_err(|e| {
                let doing = match t {
                    0 => "Redis: releasing packets".to_string(),
                    t => format!("Redis: releasing packets of {}", release_tag(t)),
                };
                Error::unavailable(doing, e)
            })?;
        let batch = match out.get(1) {
            Some(redis::Value::Int(n)) => *n as u64,
            _ => received,
        };
        let fresh = matches!(out.get(2), Some(redis::Value::Int(1)));
        let mut due = Vec::new();
        for v in out.iter().skip(3) {
            let text = match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Value::SimpleString(s) => s.clone(),
                _ => continue,
            };
            if let Some((c, i)) = text.split_once(':') {
                if let (Ok(c), Ok(i)) = (c.parse(), i.parse()) {
                    due.push((c, i));
                }
            }
        }
        Ok(Released { batch, due, fresh })
    }

    /// Starts the release again of every campaign whose release Redis has lost in some
    /// tag (its `TAG:c:ID` gone while PostgreSQL has the campaign): restore.lua, with
    /// the packets of that tag already won or created. Returns the campaigns restored
    /// and the packets each put back in line, over the tags restored.
    pub(crate) async fn restore_releases(&self) -> Result<Vec<(u32, i64)>, Error> {
        let tags = self.release_tags();
        let mut restored = Vec::new();
        for c in self.campaign_rows().await? {
            let keys: Vec<String> = (0..tags)
                .map(|t| format!("{}:c:{}", release_tag(t), c.id))
                .collect();
            let there = futures_util::future::join_all(
                keys.iter()
                    .map(|key| async move { self.redis().exists::<_, bool>(key).await }),
            )
            .await;
            let mut lost = Vec::new();
            for (t, there) in (0..tags).zip(there) {
                if !there.map_err(|e| Error::unavailable("Redis", e))? {
                    lost.push(t);
                }
            }
            if lost.is_empty() {
                continue;
            }
            let done = self.packets_done(&c).await?;
            let mut put_back_in_all = None;
            for t in lost {
                let put_back: i64 = restore_call(&self.0.restore, &c, tags, t, &done)
                    .invoke_async(&mut self.redis())
                    .await
                    .map_err(|e| Error::unavailable("Redis: restoring a release", e))?;
                if put_back >= 0 {
                    *put_back_in_all.get_or_insert(0) += put_back;
                }
            }
            if let Some(put_back) = put_back_in_all {
                restored.push((c.id, put_back));
            }
        }
        Ok(restored)
    }

    /// The indexes of campaign `c`'s packets that are done, ascending: won (a shake
    /// campaign) or created (a send campaign).
    async fn packets_done(&self, c: &CampaignRow) -> Result<Vec<u32>, Error> {
        let query = if c.send {
            "SELECT id FROM hb_packets WHERE campaign = $1 ORDER BY id"
        } else {
            "SELECT packet FROM hb_wins WHERE campaign = $1 ORDER BY packet"
        };
        let id = c.id as i32;
        // On every shard (a packet's rows are on its own), merged in order.
        let mut done: Vec<u32> = self
            .on_every_shard(|_, shard| async move {
                let rows = shard
                    .pg()
                    .await?
                    .query(query, &[&id])
                    .await
                    .map_err(|e| pg_error("reading a campaign's packets", e))?;
                Ok(rows
                    .iter()
                    .map(|r| hongbao_money::rules::shake_packet_parts(r.get::<_, i64>(0) as u64).1)
                    .collect::<Vec<u32>>())
            })
            .await?
            .into_iter()
            .flatten()
            .collect();
        done.sort_unstable();
        Ok(done)
    }

    /// The packet is won (or created): no longer this host's to hand out. When Redis
    /// cannot be told now, the next release call tells it.
    pub(crate) async fn given(&self, host: &str, packet: u64) {
        let (c, i) = hongbao_money::rules::shake_packet_parts(packet);
        let member = format!("{c}:{i}");
        let mut redis = self.redis();
        let tag = release_tag(tag_of(i, self.release_tags()));
        let told: Result<(), _> = redis.srem(format!("{tag}:held:{host}"), &member).await;
        if told.is_err() {
            self.0.ungiven.lock().unwrap().push(member);
        }
    }

    /// This host stops: what it holds goes back to the others at once, on every tag.
    pub async fn forget_host(&self, host: &str) {
        futures_util::future::join_all((0..self.release_tags()).map(|t| async move {
            let key = format!("{}:hosts", release_tag(t));
            let _: Result<(), _> = self.redis().zadd(key, host, 0).await;
        }))
        .await;
    }

    /// The hosts alive, as tag 0 has heard from them (every host calls every tag).
    pub async fn live_hosts(&self) -> Vec<String> {
        let mut redis = self.redis();
        let since = hongbao_sys::clock::unix_ms().saturating_sub(HOST_DEAD_AFTER_MS);
        redis
            .zrangebyscore(format!("{}:hosts", release_tag(0)), since, "+inf")
            .await
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Script;

    use crate::store::{RELEASE, RESTORE};

    /// A standalone `redis-server` on a free loopback port, killed when dropped.
    struct TestRedis {
        child: std::process::Child,
        url: String,
    }

    impl TestRedis {
        fn start() -> TestRedis {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server (Debian's redis-server package) is needed");
            // Killed when dropped, also if it never answers.
            let redis = TestRedis {
                child,
                url: format!("redis://127.0.0.1:{port}"),
            };
            let client = redis::Client::open(redis.url.as_str()).unwrap();
            for _ in 0..100 {
                if let Ok(mut con) = client.get_connection() {
                    if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                        return redis;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            panic!("redis-server did not answer on port {port}");
        }
    }

    impl TestRedis {
        fn connection(&self) -> redis::Connection {
            redis::Client::open(self.url.as_str())
                .unwrap()
                .get_connection()
                .unwrap()
        }
    }

    /// Campaign 1: `packets` at `rate` a second, started a second ago, running.
    fn running_campaign(con: &mut redis::Connection, packets: u32, rate: u32) {
        redis::pipe()
            .hset_multiple(
                "{rel}:c:1",
                &[
                    ("packets", u64::from(packets)),
                    ("rate", u64::from(rate)),
                    ("start", hongbao_sys::clock::unix_ms() - 1000),
                    ("next", 0),
                ],
            )
            .sadd("{rel}:running", 1)
            .query::<()>(con)
            .unwrap();
    }

    impl Drop for TestRedis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// One call of release.lua by host `h1` that says it received batch `received`:
    /// the batch's number and its packets.
    fn release(con: &mut redis::Connection, received: u64) -> (u64, Vec<String>) {
        release_naming(con, received, &[])
    }

    /// The same, naming packets given whose removal from the held set failed.
    fn release_naming(
        con: &mut redis::Connection,
        received: u64,
        given: &[String],
    ) -> (u64, Vec<String>) {
        let out: Vec<redis::Value> = Script::new(RELEASE)
            .key("{rel}:hosts")
            .arg("h1")
            .arg(HOST_DEAD_AFTER_MS)
            .arg(received)
            .arg(1)
            .arg(given)
            .invoke(con)
            .unwrap();
        let batch = match out[1] {
            redis::Value::Int(n) => n as u64,
            ref other => panic!("batch number {other:?}"),
        };
        let packets = out[3..]
            .iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
                other => panic!("packet {other:?}"),
            })
            .collect();
        (batch, packets)
    }

    /// A reply of release.lua lost on the way (the script ran, the client timed out in a
    /// failover) does not lose its packets: the host gets them again, those it still
    /// holds, until it says it received them — and never twice once it has. A host that
    /// has received nothing (a process just started under a killed one's name) gets back
    /// everything its name held.
    #[test]
    fn a_released_batch_whose_reply_was_lost_is_given_again() {
        let redis = TestRedis::start();
        let mut con = redis.connection();
        // Ten packets at 1,000/s, started a second ago: all due at once.
        running_campaign(&mut con, 10, 1000);

        let (batch, first) = release(&mut con, 0);
        assert_eq!(batch, 1);
        assert_eq!(first.len(), 10, "{first:?}");
        // The reply never came: asked again having received nothing (as a process just
        // started under the host's name would), what it held goes back and comes to it
        // again, numbered afresh.
        let (batch, again) = release(&mut con, 0);
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v
        };
        assert_eq!((batch, sorted(&again)), (1, sorted(&first)));
        let held: Vec<String> = redis::cmd("SMEMBERS")
            .arg("{rel}:held:h1")
            .query(&mut con)
            .unwrap();
        assert_eq!(sorted(&held), sorted(&first));
        // Received: nothing more is due, and nothing comes twice.
        let (batch, none) = release(&mut con, 2);
        assert_eq!((batch, none.len()), (2, 0));
        // One packet won meanwhile (no longer held): a lost reply gives back only the rest.
        redis::cmd("SREM")
            .arg("{rel}:held:h1")
            .arg(&again[0])
            .query::<()>(&mut con)
            .unwrap();
        let (batch, rest) = release(&mut con, 1);
        assert_eq!((batch, &rest[..]), (3, &again[1..]));
        // A host ahead of Redis (writes lost in a failover) is believed, nothing resent.
        let (batch, none) = release(&mut con, 7);
        assert_eq!((batch, none.len()), (7, 0));
    }

    /// A packet given while Redis could not be told (a master frozen at that instant)
    /// leaves the held set at the next release call, which names it: a host that dies
    /// later gives back only what it had not given.
    #[test]
    fn packets_given_while_redis_was_away_leave_the_held_set_at_the_next_call() {
        let redis = TestRedis::start();
        let mut con = redis.connection();
        running_campaign(&mut con, 4, 1000);
        let (batch, given) = release(&mut con, 0);
        assert_eq!(given.len(), 4);
        release_naming(&mut con, batch, &given[..3]);
        let held: Vec<String> = redis::cmd("SMEMBERS")
            .arg("{rel}:held:h1")
            .query(&mut con)
            .unwrap();
        assert_eq!(held, vec![given[3].clone()]);
    }

    /// Redis lost the release (a master promoted before its replica synced): restored
    /// from what PostgreSQL says is done, every packet due counts as released, those due
    /// and not done are first in line again, nothing done is given again, and the rest
    /// of the campaign goes on at its rate. A release still there is left alone.
    #[test]
    fn a_release_redis_lost_is_started_again_without_what_is_done() {
        let redis = TestRedis::start();
        let mut con = redis.connection();
        // 100 packets at 10/s, started 3.05 s ago: 30 due.
        let start = hongbao_sys::clock::unix_ms() - 3050;
        let restore = |con: &mut redis::Connection, done: &[u32]| -> i64 {
            Script::new(RESTORE)
                .key("{rel}:c:7")
                .arg(7)
                .arg(100)
                .arg(10)
                .arg(start)
                // One tag, tag 0: the release as before tags.
                .arg(1)
                .arg(0)
                .arg(done)
                .invoke(con)
                .unwrap()
        };
        // Packets 0, 1, 5 and 29 are won: 26 of the 30 due go back in line.
        assert_eq!(restore(&mut con, &[0, 1, 5, 29]), 26);
        let next: u64 = redis::cmd("HGET")
            .arg("{rel}:c:7")
            .arg("next")
            .query(&mut con)
            .unwrap();
        assert_eq!(next, 30);
        assert_eq!(
            restore(&mut con, &[]),
            -1,
            "a release that is there is kept"
        );
        let (_, given) = release(&mut con, 0);
        let mut expected: Vec<String> = (0..30)
            .filter(|i| ![0, 1, 5, 29].contains(i))
            .map(|i| format!("7:{i}"))
            .collect();
        let mut got = given.clone();
        got.sort();
        expected.sort();
        assert_eq!(got, expected);
        // The rest comes at the campaign's rate, from where the release stood.
        std::thread::sleep(std::time::Duration::from_millis(250));
        let (_, more) = release(&mut con, 1);
        assert!(
            !more.is_empty()
                && more.len() <= 4
                && more
                    .iter()
                    .all(|p| p == "7:30" || p == "7:31" || p == "7:32" || p == "7:33"),
            "{more:?}"
        );
    }

    /// A host's part is its share of the users logged in on hosts alive: a host nobody
    /// is logged in on takes nothing and gives back what it holds (its clients went
    /// elsewhere), and the packets go where the shakers are.
    #[test]
    fn packets_go_to_the_hosts_the_users_are_on() {
        let redis = TestRedis::start();
        let mut con = redis.connection();
        let call = |con: &mut redis::Connection, host: &str, received: u64, users: u64| {
            let out: Vec<redis::Value> = Script::new(RELEASE)
                .key("{rel}:hosts")
                .arg(host)
                .arg(HOST_DEAD_AFTER_MS)
                .arg(received)
                .arg(users)
                .invoke(con)
                .unwrap();
            out.len() - 3
        };
        // Both hosts alive with 10 users each, then 40 packets, all due at once.
        assert_eq!(call(&mut con, "h1", 0, 10), 0);
        assert_eq!(call(&mut con, "h2", 0, 10), 0);
        running_campaign(&mut con, 40, 1000);
        let h2 = call(&mut con, "h2", 0, 10);
        let h1 = call(&mut con, "h1", 0, 10);
        assert_eq!((h1, h2), (20, 20));
        // h2's users leave: it takes nothing more and gives back its 20, which h1 takes.
        assert_eq!(call(&mut con, "h2", 1, 0), 0);
        let held: u64 = redis::cmd("SCARD")
            .arg("{rel}:held:h2")
            .query(&mut con)
            .unwrap();
        assert_eq!(held, 0);
        assert_eq!(call(&mut con, "h1", 1, 20), 20);
    }

    #[tokio::test]
    async fn no_release_tag_at_all_is_refused_before_connecting() {
        let cfg = crate::ClusterConfig {
            redis: vec!["redis://127.0.0.1:1".into()],
            redis_password: None,
            postgres: vec![crate::PgTarget::default()],
            shard_map_version: 1,
            host: "h1".into(),
            packet_ttl_ms: 1000,
            commit_window: std::time::Duration::from_millis(2),
            max_batch: 1,
            release_tags: 0,
        };
        let refused = Store::connect(&cfg).await.err().expect("refused");
        assert!(
            refused.to_string().contains("release_tags is 0"),
            "{refused}"
        );
    }

    use crate::store::tests::{cli, TwoNodes};
    use redis::cluster_async::ClusterConnection;
    use std::collections::{BTreeMap, BTreeSet};

    /// A two-node Redis Cluster (`{rel}` and `{rel.2}` on the second node, `{rel.1}` on
    /// the first) and a connection to it.
    async fn two_nodes() -> (TwoNodes, ClusterConnection) {
        let nodes = TwoNodes::start();
        let url = format!("redis://127.0.0.1:{}", nodes.ports[0]);
        let client = redis::cluster::ClusterClient::builder(vec![url])
            .build()
            .unwrap();
        let con = client.get_async_connection().await.unwrap();
        (nodes, con)
    }

    /// Shake campaign `id`: `packets` at `rate` a second from `started_ms`.
    fn campaign(id: u32, packets: u32, rate: u32, started_ms: u64) -> CampaignRow {
        CampaignRow {
            id,
            send: false,
            packets,
            rate,
            amount_min: 1,
            amount_max: 1,
            recipients: 0,
            user_min: 0,
            user_max: 0,
            seed: 1,
            minted: packets.into(),
            started_ms,
            created_by: None,
        }
    }

    /// The campaign's release started on every tag, as admin.rs starts it.
    async fn start_campaign(con: &mut ClusterConnection, c: &CampaignRow, tags: u32) {
        for t in 0..tags {
            let tag = release_tag(t);
            redis::pipe()
                .atomic()
                .hset_multiple(format!("{tag}:c:{}", c.id), &release_fields(c, tags, t))
                .sadd(format!("{tag}:running"), c.id)
                .query_async::<()>(con)
                .await
                .unwrap();
        }
    }

    /// A call of release.lua on tag `t` by `host` (one user logged in on it), which
    /// counts a host silent for `dead_ms` as dead: the batch's number, whether the host
    /// was fresh there, and its packets as (campaign, index).
    async fn call_tag(
        con: &mut ClusterConnection,
        t: u32,
        host: &str,
        received: u64,
        dead_ms: u64,
    ) -> (u64, bool, Vec<(u32, u32)>) {
        let out: Vec<redis::Value> = Script::new(RELEASE)
            .key(format!("{}:hosts", release_tag(t)))
            .arg(host)
            .arg(dead_ms)
            .arg(received)
            .arg(1)
            .invoke_async(con)
            .await
            .unwrap();
        let batch = match out[1] {
            redis::Value::Int(n) => n as u64,
            ref other => panic!("batch number {other:?}"),
        };
        let packets = out[3..]
            .iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => {
                    let text = String::from_utf8(b.clone()).unwrap();
                    let (c, i) = text.split_once(':').unwrap();
                    (c.parse().unwrap(), i.parse().unwrap())
                }
                other => panic!("packet {other:?}"),
            })
            .collect();
        (batch, out[2] == redis::Value::Int(1), packets)
    }

    /// A host's side of the calls: the last batch it received from each tag.
    struct Caller {
        name: &'static str,
        received: Vec<u64>,
    }

    impl Caller {
        fn new(name: &'static str, tags: u32) -> Caller {
            Caller {
                name,
                received: vec![0; tags as usize],
            }
        }

        /// Every tag called once, as a host's release tick does: what each tag gave.
        async fn call_every_tag(
            &mut self,
            con: &mut ClusterConnection,
            dead_ms: u64,
        ) -> Vec<Vec<u32>> {
            let mut given = Vec::new();
            for (t, received) in (0..).zip(self.received.iter_mut()) {
                let (batch, _, packets) = call_tag(con, t, self.name, *received, dead_ms).await;
                *received = batch;
                given.push(packets.into_iter().map(|(_, i)| i).collect());
            }
            given
        }
    }

    /// The campaign's release split over K tags, two hosts calling every tag as time
    /// passes (Redis's clock): after each round of calls, what all tags gave together
    /// is exactly the indexes below the campaign's count due, between the count at the
    /// round's start and at its end (each tag reads its clock when called), no index
    /// given twice, each given by its own tag; at the end every packet, once. K = 1 is
    /// the release as before tags, its campaign hash without `tags` and `tag`; with
    /// K = 3 the tags' keys really are on both nodes.
    #[tokio::test]
    async fn the_release_over_several_tags_gives_every_index_once_at_the_campaigns_rate() {
        for tags in [1, 3] {
            let (nodes, mut con) = two_nodes().await;
            let mut hosts = [Caller::new("h1", tags), Caller::new("h2", tags)];
            // Both hosts alive on every tag before the campaign.
            for host in &mut hosts {
                host.call_every_tag(&mut con, HOST_DEAD_AFTER_MS).await;
            }
            // 60 packets at 200 a second, 20 of them due at once.
            let (packets, rate) = (60, 200);
            let start = hongbao_sys::clock::unix_ms() - 100;
            let c = campaign(1, packets, rate, start);
            start_campaign(&mut con, &c, tags).await;
            let due_at = |ms: u64| packets.min(((ms - start) * u64::from(rate) / 1000) as u32);

            let fields: BTreeSet<String> = redis::cmd("HKEYS")
                .arg(format!("{}:c:1", release_tag(tags - 1)))
                .query_async::<Vec<String>>(&mut con)
                .await
                .unwrap()
                .into_iter()
                .collect();
            if tags == 1 {
                assert_eq!(
                    fields,
                    ["next", "packets", "rate", "start"]
                        .map(String::from)
                        .into()
                );
            } else {
                assert!(
                    fields.contains("tags") && fields.contains("tag"),
                    "{fields:?}"
                );
                let on = |port: u16| {
                    let mut keys: Vec<String> = cli(port, &["KEYS", "*:c:1"])
                        .lines()
                        .map(String::from)
                        .collect();
                    keys.sort();
                    keys
                };
                assert_eq!(on(nodes.ports[0]), ["{rel.1}:c:1"]);
                assert_eq!(on(nodes.ports[1]), ["{rel.2}:c:1", "{rel}:c:1"]);
            }

            let mut given = BTreeSet::new();
            let mut rounds = 0;
            while given.len() < packets as usize {
                rounds += 1;
                assert!(rounds < 500, "released {} of {packets}", given.len());
                let before = hongbao_sys::clock::unix_ms();
                for host in &mut hosts {
                    for (t, from_tag) in (0..tags).zip(host.call_every_tag(&mut con, 3000).await) {
                        for i in from_tag {
                            assert_eq!(tag_of(i, tags), t, "{i} given by tag {t} of {tags}");
                            assert!(given.insert(i), "{i} given twice (K {tags})");
                        }
                    }
                }
                let after = hongbao_sys::clock::unix_ms();
                let (least, most) = (due_at(before), due_at(after));
                assert!(
                    given.iter().all(|&i| i < most) && (0..least).all(|i| given.contains(&i)),
                    "K {tags}: {given:?} is not the first {least}..={most}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(7)).await;
            }
            assert_eq!(given, (0..packets).collect(), "K {tags}");
            assert!(rounds > 3, "K {tags}: all at once, not at the rate");
        }
    }

    /// A host that stops calling is found dead on every tag (each tag by the same rule,
    /// and it stopped calling them all at once): what it held goes back on each tag and
    /// is given to the other host, every tag's part to that tag's calls.
    #[tokio::test]
    async fn a_host_dead_on_the_tags_gives_back_its_packets_on_each() {
        let tags = 3;
        let (_nodes, mut con) = two_nodes().await;
        let (mut h1, mut h2) = (Caller::new("h1", tags), Caller::new("h2", tags));
        h1.call_every_tag(&mut con, HOST_DEAD_AFTER_MS).await;
        h2.call_every_tag(&mut con, HOST_DEAD_AFTER_MS).await;
        // 30 packets, all due: 10 a tag, half of each to each host.
        let c = campaign(1, 30, 1000, hongbao_sys::clock::unix_ms() - 1000);
        start_campaign(&mut con, &c, tags).await;
        let held_by_h1 = h1.call_every_tag(&mut con, HOST_DEAD_AFTER_MS).await;
        let first_to_h2 = h2.call_every_tag(&mut con, HOST_DEAD_AFTER_MS).await;
        for (t, (a, b)) in (0..tags).zip(held_by_h1.iter().zip(&first_to_h2)) {
            assert_eq!((a.len(), b.len()), (5, 5), "tag {t}: {a:?} {b:?}");
        }
        // h1 goes silent; h2, counting a host silent for 100 ms as dead, gets h1's
        // packets back from each tag.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let again_to_h2 = h2.call_every_tag(&mut con, 100).await;
        let sorted = |v: &[u32]| v.iter().copied().collect::<BTreeSet<u32>>();
        let mut all = BTreeSet::new();
        for t in 0..tags {
            let tag = release_tag(t);
            let (held, back) = (&held_by_h1[t as usize], &again_to_h2[t as usize]);
            assert_eq!(sorted(back), sorted(held), "tag {t}");
            let left: u64 = redis::cmd("SCARD")
                .arg(format!("{tag}:held:h1"))
                .query_async(&mut con)
                .await
                .unwrap();
            let alive: Vec<String> = redis::cmd("ZRANGE")
                .arg(format!("{tag}:hosts"))
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .unwrap();
            assert_eq!((left, alive), (0, vec!["h2".to_string()]), "tag {t}");
            all.extend(first_to_h2[t as usize].iter().chain(back));
        }
        assert_eq!(all, (0..30).collect());
    }

    /// A master lost with its data takes the tags whose slots it held, and only those:
    /// each lost tag is restored on its own, from the packets done that are its own,
    /// those due and not done first in line again; the tag that was not lost is left
    /// alone; and every tag goes on at its part of the rate.
    #[tokio::test]
    async fn a_release_lost_in_some_tags_is_restored_tag_by_tag() {
        let tags = 3;
        let (nodes, mut con) = two_nodes().await;
        // 100 packets at 10/s, started 3.05 s ago: 30 due, 10 on each tag.
        let c = campaign(7, 100, 10, hongbao_sys::clock::unix_ms() - 3050);
        start_campaign(&mut con, &c, tags).await;
        let mut h1 = Caller::new("h1", tags);
        let first: Vec<u32> = h1
            .call_every_tag(&mut con, HOST_DEAD_AFTER_MS)
            .await
            .concat();
        assert_eq!(first.len(), 30, "{first:?}");
        // The second node (`{rel}`, `{rel.2}`) loses everything.
        cli(nodes.ports[1], &["FLUSHALL"]);
        let done = [0, 1, 5, 29];
        let restore = Script::new(RESTORE);
        let mut put_back = Vec::new();
        for t in 0..tags {
            let n: i64 = restore_call(&restore, &c, tags, t, &done)
                .invoke_async(&mut con)
                .await
                .unwrap();
            put_back.push(n);
        }
        // Tag 0's 0, 3, …, 27 less 0; tag 1 still there; tag 2's 2, 5, …, 29 less 5, 29.
        assert_eq!(put_back, [9, -1, 8]);
        let fields: BTreeMap<String, u64> = redis::cmd("HGETALL")
            .arg("{rel.2}:c:7")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(
            (
                fields["packets"],
                fields["next"],
                fields["tags"],
                fields["tag"]
            ),
            (33, 10, 3, 2)
        );
        let mut again = BTreeSet::new();
        for t in [0, 2] {
            let (batch, fresh, packets) =
                call_tag(&mut con, t, "h1", h1.received[t as usize], 3000).await;
            assert!(fresh, "tag {t} lost h1");
            h1.received[t as usize] = batch;
            again.extend(packets.into_iter().map(|(_, i)| i));
        }
        let expected: BTreeSet<u32> = (0..30)
            .filter(|i| i % 3 != 1 && !done.contains(i))
            .collect();
        assert_eq!(again, expected);
        // The rest comes at the campaign's rate, from where each tag's release stood.
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let more: Vec<u32> = h1.call_every_tag(&mut con, 3000).await.concat();
        assert!(
            !more.is_empty() && more.iter().all(|i| (30..=33).contains(i)),
            "{more:?}"
        );
    }

    /// The host's side over three tags, through a `Store` on a real PostgreSQL and the
    /// two-node cluster: a campaign made by the admin request starts on every tag, the
    /// host's release calls bring all its packets (each tag numbering its own batches),
    /// a packet won leaves the held set of its own tag, the status adds the tags up,
    /// and the tags a node lost are found (the host is fresh there) and restored by
    /// `restore_releases`, the tag still there left alone.
    #[tokio::test]
    async fn a_host_releases_over_three_tags_through_the_store() {
        use hongbao_money::seam::{AdminAnswer, AdminRequest};
        let Some(pg) = crate::testpg::TestPg::start() else {
            return;
        };
        let (nodes, mut con) = two_nodes().await;
        let cfg = crate::ClusterConfig {
            redis: vec![format!("redis://127.0.0.1:{}", nodes.ports[0])],
            redis_password: None,
            postgres: vec![crate::PgTarget {
                url: format!(
                    "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
                    pg.port
                ),
                ..Default::default()
            }],
            shard_map_version: 1,
            host: "h1".into(),
            packet_ttl_ms: 60_000,
            commit_window: std::time::Duration::from_millis(2),
            max_batch: 64,
            release_tags: 3,
        };
        let store = Store::connect(&cfg).await.unwrap();
        let request = AdminRequest::CreateShake {
            request: hongbao_money::rules::ShakeCampaignRequest {
                packets: 30,
                rate_per_sec: 1000,
                amount_min: 1,
                amount_max: 1,
            },
            by: "ops".into(),
        };
        let answer = crate::admin::admin(&store, "h1", request).await;
        let AdminAnswer::Campaign(status) = answer else {
            panic!("{answer:?}");
        };
        let row = store.campaign_row(status.id).await.unwrap().unwrap();
        // Every tag's calls, once: what they gave, and whether h1 was fresh on each.
        let mut received = vec![0; 3];
        let release = async |received: &mut Vec<u64>| {
            let mut given = Vec::new();
            let mut fresh = Vec::new();
            for (t, released) in store.release("h1", &[0, 1, 2], received, 1).await {
                let t = t as usize;
                let released = released.unwrap();
                received[t] = released.batch;
                fresh.push(released.fresh);
                given.extend(released.due.into_iter().map(|(c, i)| {
                    assert_eq!(c, row.id);
                    i
                }));
            }
            (given, fresh)
        };
        let mut all = BTreeSet::new();
        for _ in 0..100 {
            for i in release(&mut received).await.0 {
                assert!(all.insert(i), "{i} given twice");
            }
            if all.len() == 30 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(all, (0..30).collect());
        assert!(received.iter().all(|&b| b > 0), "{received:?}");
        let held = async |con: &mut ClusterConnection, t: u32| -> u64 {
            redis::cmd("SCARD")
                .arg(format!("{}:held:h1", release_tag(t)))
                .query_async(con)
                .await
                .unwrap()
        };
        // Won: 0 (tag 0), 1 and 4 (tag 1), 2 (tag 2).
        for i in [0, 1, 2, 4] {
            let packet = hongbao_money::rules::shake_packet_id(row.id, i);
            store.given("h1", packet).await;
        }
        assert_eq!(
            [
                held(&mut con, 0).await,
                held(&mut con, 1).await,
                held(&mut con, 2).await
            ],
            [9, 8, 9]
        );
        let status = store.status(&row).await.unwrap();
        assert_eq!(status.released, 30);
        assert!(status.released_all_ms.is_some());

        // The second node (`{rel}`, `{rel.2}`) loses everything.
        cli(nodes.ports[1], &["FLUSHALL"]);
        assert_eq!(release(&mut received).await.1, [true, false, true]);
        // Nothing is won in the ledger: each lost tag's 10 go back in line.
        assert_eq!(store.restore_releases().await.unwrap(), [(row.id, 20)]);
        let (again, _) = release(&mut received).await;
        let again: BTreeSet<u32> = again.into_iter().collect();
        assert_eq!(again, (0..30).filter(|i| i % 3 != 1).collect());
        assert_eq!(store.status(&row).await.unwrap().released, 30);
    }
}
