//! Two real PostgreSQL formations (and a two-node Redis Cluster for the `Store`): a win
//! whose winner's wallet is on the other shard commits its credit as an outbox row; the
//! relay pays it there once, however often it is relayed, and the audit across both
//! shards balances at every step, credits in flight included.

use std::time::Duration;

use hongbao_sys::clock::UnixTime;

use super::*;
use crate::commit::Commit;
use crate::committer::tests::origin;
use crate::committer::{commit_until_known, Here, Link};
use crate::connect::pg_connect;
use crate::shard::ShardMap;
use crate::store::tests::TwoNodes;
use crate::testpg::TestPg;
use crate::{ClusterConfig, PgTarget};

const TWO: ShardMap = ShardMap::first(1, 2);

fn target(pg: &TestPg) -> PgTarget {
    PgTarget {
        url: format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            pg.port
        ),
        ..PgTarget::default()
    }
}

fn config(redis: &TwoNodes, shards: &[&TestPg], version: u32) -> ClusterConfig {
    ClusterConfig {
        redis: vec![format!("redis://127.0.0.1:{}", redis.ports[0])],
        redis_password: None,
        postgres: shards.iter().map(|pg| target(pg)).collect(),
        shard_map_version: version,
        host: "h1".into(),
        packet_ttl_ms: 60_000,
        commit_window: Duration::from_millis(1),
        max_batch: 64,
        release_tags: 1,
    }
}

async fn scalar(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// The first user id from 1 whose wallet is on `shard`, and the first packet of campaign
/// 1 that lives on `shard`.
fn user_on(shard: usize) -> u64 {
    (1..).find(|&u| TWO.wallet(u) == shard).unwrap()
}

fn packet_on(shard: usize, after: u32) -> u64 {
    (after..)
        .map(|i| hongbao_money::rules::shake_packet_id(1, i))
        .find(|&p| TWO.packet(p) == Some(shard))
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Shake campaign 1, minting 1,000 in 10 packets of 100 (its row on shard 0, as
/// admin.rs makes it).
async fn campaign_one(shard_zero: &Client) {
    shard_zero
        .batch_execute(
            "INSERT INTO hb_campaigns (id, kind, packets, rate, amount_min, amount_max, \
             recipients, user_min, user_max, seed, minted, started_ms) \
             VALUES (1, 'shake', 10, 10, 100, 100, 0, 0, 0, 1, 1000, 0)",
        )
        .await
        .unwrap();
}

/// Commits one batch on `shard` (its committer's way, one attempt known).
async fn commit(pg: &TestPg, shard: usize, batch: &[Commit]) -> Vec<Option<crate::commit::Done>> {
    commit_on(pg, TWO, shard, batch).await
}

/// Commits one batch on `shard` of `map`.
async fn commit_on(
    pg: &TestPg,
    map: ShardMap,
    shard: usize,
    batch: &[Commit],
) -> Vec<Option<crate::commit::Done>> {
    let (chain, lost, mut conn) = (
        tokio::sync::Mutex::new(()),
        std::sync::atomic::AtomicU64::new(0),
        None,
    );
    commit_until_known(
        &mut conn,
        Link {
            chain: &chain,
            lost: &lost,
            target: &target(pg),
        },
        Here { map, shard },
        "h1",
        UnixTime::from_millis(1_800_000_000_000),
        batch,
    )
    .await
    .unwrap()
}

#[test]
fn a_credit_crosses_shards_once_and_the_audit_balances_while_it_is_in_flight() {
    let Some(a) = TestPg::start() else { return };
    let b = TestPg::start().unwrap();
    let redis = TwoNodes::start();
    let rt = runtime();
    rt.block_on(async {
        let store = Store::connect(&config(&redis, &[&a, &b], 1)).await.unwrap();
        let (pa, pb) = (
            pg_connect(&target(&a)).await.unwrap(),
            pg_connect(&target(&b)).await.unwrap(),
        );
        // A shake campaign minting 1,000 (its row on shard 0, as admin.rs makes it).
        campaign_one(&pa).await;
        let audit = store.audit().await.unwrap();
        assert!(audit.ok, "{audit:?}");

        // User `far` (wallet on shard 1) wins a packet that lives on shard 0, and user
        // `near` (wallet on shard 0) another one there.
        let (far, near) = (user_on(1), user_on(0));
        let (p1, p2) = (packet_on(0, 0), packet_on(0, 1 + (packet_on(0, 0) as u32)));
        let win = |user, packet, cents, op_id| Commit::Win {
            to: origin(user),
            campaign: 1,
            packet,
            cents,
            op_id,
        };
        let done = commit(&a, 0, &[win(far, p1, 300, 11), win(near, p2, 200, 12)]).await;
        assert!(done
            .iter()
            .all(|d| matches!(d, Some(crate::commit::Done::Won(true)))));
        // The near one is paid at once; the far one waits in shard 0's outbox.
        assert_eq!(store.balance(near).await.unwrap(), 200);
        assert_eq!(store.balance(far).await.unwrap(), 0);
        assert_eq!(
            scalar(&pa, "SELECT count(*) FROM hb_outbox WHERE moved_ms IS NULL").await,
            1
        );
        let audit = store.audit().await.unwrap();
        assert!(audit.ok, "{audit:?}");
        assert_eq!(audit.credits_in_flight_cents, 300);
        assert_eq!(audit.unclaimed_cents, 500);

        // A relay that paid shard 1 and was killed before marking the row moved: the
        // row is still waiting; the audit counts the credit once (in the wallet now).
        let mut source = pg_connect(&target(&a)).await.unwrap();
        {
            let tx = source.transaction().await.unwrap();
            let credits = waiting(&tx, 10).await.unwrap();
            assert_eq!(credits.len(), 1);
            assert_eq!(pay(&pb, 0, &credits, 1).await.unwrap(), 1);
            // Dropped without commit: the relay died here.
        }
        assert_eq!(store.balance(far).await.unwrap(), 300);
        assert_eq!(
            scalar(&pa, "SELECT count(*) FROM hb_outbox WHERE moved_ms IS NULL").await,
            1
        );
        let audit = store.audit().await.unwrap();
        assert!(audit.ok, "{audit:?}");
        assert_eq!(audit.credits_in_flight_cents, 0);

        // Relayed again, whole: paid once, marked moved; and relayed twice more, nothing.
        assert_eq!(relay_once(&store, &mut source, 0).await.unwrap(), 1);
        assert_eq!(relay_once(&store, &mut source, 0).await.unwrap(), 0);
        let credits = [Credit {
            op: 11,
            to_shard: 1,
            user: far as i64,
            cents: 300,
        }];
        assert_eq!(
            pay(&pb, 0, &credits, 2).await.unwrap(),
            0,
            "relayed twice, paid once"
        );
        assert_eq!(store.balance(far).await.unwrap(), 300);
        assert_eq!(
            scalar(&pa, "SELECT count(*) FROM hb_outbox WHERE moved_ms IS NULL").await,
            0
        );
        assert_eq!(scalar(&pb, "SELECT count(*) FROM hb_credits_in").await, 1);
        let audit = store.audit().await.unwrap();
        assert!(audit.ok, "{audit:?}");
        assert_eq!(audit.credits_in_flight_cents, 0);
        assert_eq!(audit.user_balances_cents, 500);
        // Both shards' chains are walked, each named by its shard.
        assert!(
            audit.ledger_heads.contains_key("0/h1"),
            "{:?}",
            audit.ledger_heads
        );

        // The wins page across shards as on one.
        let page = store.ops(None, 10).await.unwrap();
        assert_eq!(page.wins.len(), 2);
        assert!(page.wins.windows(2).all(|w| w[0].packet < w[1].packet));

        // The batch sent again (its COMMIT unanswered): told won, nothing more in the outbox.
        let again = commit(&a, 0, &[win(far, p1, 300, 11)]).await;
        assert!(matches!(again[0], Some(crate::commit::Done::Won(true))));
        assert_eq!(scalar(&pa, "SELECT count(*) FROM hb_outbox").await, 1);
        assert!(store.audit().await.unwrap().ok);
    });
}

#[test]
fn a_send_debits_and_makes_its_packet_on_the_senders_shard_or_does_neither() {
    let Some(a) = TestPg::start() else { return };
    let b = TestPg::start().unwrap();
    let redis = TwoNodes::start();
    let rt = runtime();
    rt.block_on(async {
        let store = Store::connect(&config(&redis, &[&a, &b], 1)).await.unwrap();
        let pb = pg_connect(&target(&b)).await.unwrap();
        let sender = user_on(1);
        // Every id drawn for shard 1 lives there; none is handed out twice.
        let mut ids = Vec::new();
        for _ in 0..50 {
            let id = store.next_packet_id_on(1).await.unwrap();
            assert_eq!(TWO.packet(id), Some(1));
            ids.push(id);
        }
        let zero = store.next_packet_id_on(0).await.unwrap();
        assert_eq!(TWO.packet(zero), Some(0));
        ids.push(zero);
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 51);

        pb.execute("SELECT hb_credit($1, 1000)", &[&(sender as i64)])
            .await
            .unwrap();
        let send = |packet: u64, cents: u64| Commit::Send {
            to: origin(sender),
            packet,
            cents,
            recipients: vec![user_on(0), user_on(1) + 1000],
            shares: vec![cents / 2, cents - cents / 2],
            expires_ms: 1_900_000_000_000,
            key: None,
        };
        let packet = store.next_packet_id_on(1).await.unwrap();
        let done = commit(&b, 1, &[send(packet, 400)]).await;
        assert!(
            matches!(&done[0], Some(crate::commit::Done::Sent(r, p, 600)) if r == "ok" && *p == packet)
        );
        // Its packet is on the same shard as the debit.
        assert_eq!(
            scalar(&pb, &format!("SELECT count(*) FROM hb_packets WHERE id = {packet}")).await,
            1
        );
        // A send whose packet cannot be made (its id taken by another's packet) is left
        // out of its batch whole — no debit without its packet — and its batch-mate
        // commits.
        let (taken, good) = (
            store.next_packet_id_on(1).await.unwrap(),
            store.next_packet_id_on(1).await.unwrap(),
        );
        pb.execute(
            "INSERT INTO hb_packets (id, sender, cents, shares, expires_ms) VALUES ($1, 1, 1, 1, 0)",
            &[&(taken as i64)],
        )
        .await
        .unwrap();
        let done = commit(&b, 1, &[send(taken, 100), send(good, 50)]).await;
        assert!(done[0].is_none(), "left out");
        assert!(matches!(&done[1], Some(crate::commit::Done::Sent(r, _, 550)) if r == "ok"));
        assert_eq!(store.balance(sender).await.unwrap(), 550);
    });
}

#[test]
fn a_host_whose_shard_map_disagrees_with_the_formations_is_refused_at_start() {
    let Some(a) = TestPg::start() else { return };
    let b = TestPg::start().unwrap();
    let redis = TwoNodes::start();
    let rt = runtime();
    rt.block_on(async {
        let refused = |cfg: ClusterConfig| async move {
            match Store::connect(&cfg).await {
                Ok(_) => panic!("started on {:?}", cfg.postgres),
                Err(e) => e.to_string(),
            }
        };
        // A single formation holding wallets from before any map: not spread over two.
        let pa = pg_connect(&target(&a)).await.unwrap();
        pa.batch_execute(crate::store::SCHEMA).await.unwrap();
        pa.execute("SELECT hb_credit(7, 100)", &[]).await.unwrap();
        let why = refused(config(&redis, &[&a, &b], 1)).await;
        assert!(why.contains("moving wallets is not built"), "{why}");
        pa.batch_execute("TRUNCATE hb_balances").await.unwrap();
        // Nor a second formation that holds some.
        let pb = pg_connect(&target(&b)).await.unwrap();
        pb.batch_execute(crate::store::SCHEMA).await.unwrap();
        pb.execute("SELECT hb_credit(7, 100)", &[]).await.unwrap();
        let why = refused(config(&redis, &[&a, &b], 1)).await;
        assert!(why.contains("formation 1 holds wallets"), "{why}");
        pb.batch_execute("TRUNCATE hb_balances").await.unwrap();

        Store::connect(&config(&redis, &[&a, &b], 1)).await.unwrap();
        Store::connect(&config(&redis, &[&a, &b], 1)).await.unwrap();
        // The formations swapped, another version, one formation left out: refused.
        for (cfg, says) in [
            (
                config(&redis, &[&b, &a], 1),
                "formation 0 records version 1 (2 shards, this formation shard 1)",
            ),
            (config(&redis, &[&a, &b], 2), "this host's map is version 2"),
            (
                config(&redis, &[&a], 1),
                "this host's map is version 1 (1 shards",
            ),
        ] {
            let why = refused(cfg).await;
            assert!(why.contains(says), "{why}");
        }
        assert_eq!(scalar(&pa, "SELECT count(*) FROM hb_shard_map").await, 1);
    });
}

/// Growing (docs/scale-out.md, "Growing"): a ledger over two formations grows a third
/// for packets by a new map version. Nothing moves: a campaign of the first version
/// stays on its two shards, wallets stay on theirs; a campaign made under the new
/// version spreads its packets over all three, its wins credited across by the outbox,
/// and the audit over the three shards exact. A host still on the old version starts
/// (hosts are restarted one by one) and knows no packet of the new one; while it is
/// alive, no campaign is numbered under the new version. Maps that shrink, reorder or
/// grow by nothing are refused.
#[test]
fn a_shard_added_for_packets_takes_new_campaigns_and_moves_nothing() {
    let Some(a) = TestPg::start() else { return };
    let (b, c) = (TestPg::start().unwrap(), TestPg::start().unwrap());
    let redis = TwoNodes::start();
    let rt = runtime();
    rt.block_on(async {
        let old = Store::connect(&config(&redis, &[&a, &b], 1)).await.unwrap();
        // The first version numbers as a ledger that never grew.
        assert_eq!((old.map().campaign_bits(), old.map().packet_bits()), (0, 0));
        let pa = pg_connect(&target(&a)).await.unwrap();
        campaign_one(&pa).await;
        let win = |user, campaign, packet, cents, op_id| Commit::Win {
            to: origin(user),
            campaign,
            packet,
            cents,
            op_id,
        };

        // Version 2 adds formation c at the end.
        let grown_cfg = ClusterConfig {
            host: "h2".into(),
            ..config(&redis, &[&a, &b, &c], 2)
        };
        let grown = Store::connect(&grown_cfg).await.unwrap();
        let map = grown.map();
        assert_eq!((map.version, map.shards, map.wallets), (2, 3, 2));
        assert_eq!((map.count_of(1), map.count_of(2)), (Some(2), Some(3)));
        let pc = pg_connect(&target(&c)).await.unwrap();
        let row = pc
            .query_one("SELECT version, shards, me FROM hb_shard_map", &[])
            .await
            .unwrap();
        assert_eq!(
            (
                row.get::<_, i32>(0),
                row.get::<_, i32>(1),
                row.get::<_, i32>(2)
            ),
            (2, 3, 2)
        );
        assert_eq!(scalar(&pa, "SELECT count(*) FROM hb_shard_map").await, 2);

        // The first campaign's packets are where they were, for both hosts: one won on
        // shard 1 under the grown map is the old map's shard 1.
        let p_old = packet_on(1, 0);
        assert_eq!(map.packet(p_old), Some(1));
        let done = commit_on(&b, map, 1, &[win(user_on(0), 1, p_old, 100, 21)]).await;
        assert!(matches!(done[0], Some(crate::commit::Done::Won(true))));

        // A host still on version 1 starts beside it, and knows nothing of version 2.
        let still_old = Store::connect(&config(&redis, &[&a, &b], 1)).await.unwrap();
        assert_eq!(still_old.map().count_of(2), None);

        // While it is alive, the grown host starts no campaign under version 2.
        let now = hongbao_sys::clock::unix_ms();
        let hosts = format!("{}:hosts", crate::tags::release_tag(0));
        let mut r = grown.redis();
        let _: () = redis::AsyncCommands::zadd(&mut r, &hosts, "h1", now)
            .await
            .unwrap();
        let shake = || hongbao_money::seam::AdminRequest::CreateShake {
            request: hongbao_money::rules::ShakeCampaignRequest {
                packets: 300,
                rate_per_sec: 1000,
                amount_min: 10,
                amount_max: 10,
            },
            by: "ops".into(),
        };
        match crate::admin::admin(&grown, "h2", shake()).await {
            hongbao_money::seam::AdminAnswer::Refused(why) => assert!(
                why.contains("gateway host h1 runs shard map version 1"),
                "{why}"
            ),
            other => panic!("a campaign under version 2 beside a version-1 host: {other:?}"),
        }
        assert_eq!(scalar(&pa, "SELECT count(*) FROM hb_campaigns").await, 1);

        // Once it is gone (restarted on version 2), the campaign starts, numbered under 2.
        let _: () = redis::AsyncCommands::zrem(&mut r, &hosts, "h1")
            .await
            .unwrap();
        let id = match crate::admin::admin(&grown, "h2", shake()).await {
            hongbao_money::seam::AdminAnswer::Campaign(status) => status.id,
            other => panic!("no campaign: {other:?}"),
        };
        assert_eq!(id >> 24, 2, "campaign {id} numbered under version 2");
        let packets: Vec<u64> = (0..300)
            .map(|i| hongbao_money::rules::shake_packet_id(id, i))
            .collect();
        let mut on = [0; 3];
        for &p in &packets {
            on[map.packet(p).unwrap()] += 1;
            assert_eq!(still_old.map().packet(p), None, "the old host knows none");
        }
        assert!(on.iter().all(|&n| n > 60), "{on:?}");

        // A packet of it on the new shard, won by a user whose wallet is on shard 1:
        // committed on c with its credit in c's outbox, relayed to b once.
        let p_new = *packets.iter().find(|&&p| map.packet(p) == Some(2)).unwrap();
        let far = user_on(1);
        let done = commit_on(&c, map, 2, &[win(far, id, p_new, 10, 22)]).await;
        assert!(matches!(done[0], Some(crate::commit::Done::Won(true))));
        let audit = grown.audit().await.unwrap();
        assert!(audit.ok, "{audit:?}");
        // In flight: this credit, and the first campaign's win on shard 1 for shard 0.
        assert_eq!(audit.credits_in_flight_cents, 10 + 100);
        let mut source = pg_connect(&target(&c)).await.unwrap();
        assert_eq!(relay_once(&grown, &mut source, 2).await.unwrap(), 1);
        let mut source = pg_connect(&target(&b)).await.unwrap();
        assert_eq!(relay_once(&grown, &mut source, 1).await.unwrap(), 1);
        assert_eq!(grown.balance(user_on(0)).await.unwrap(), 100);
        assert_eq!(grown.balance(far).await.unwrap(), 10);
        let audit = grown.audit().await.unwrap();
        assert!(audit.ok, "{audit:?}");
        assert_eq!(audit.credits_in_flight_cents, 0);
        assert_eq!(audit.minted_cents, 1000 + 3000);
        assert!(
            audit.ledger_heads.keys().any(|h| h.starts_with("2/")),
            "{audit:?}"
        );

        // Shrinking, reordering, or a new version that adds nothing: refused.
        for (cfg, says) in [
            (config(&redis, &[&a, &b], 2), "records version 2 (3 shards"),
            (
                config(&redis, &[&a, &c, &b], 2),
                "formation 1 records version 2 (3 shards, this formation shard 2)",
            ),
            (config(&redis, &[&a, &b, &c], 3), "adds no formation"),
        ] {
            match Store::connect(&cfg).await {
                Ok(_) => panic!("started on {:?}", cfg.postgres),
                Err(e) => assert!(e.to_string().contains(says), "{e}"),
            }
        }
        assert_eq!(scalar(&pa, "SELECT count(*) FROM hb_shard_map").await, 2);
    });
}
