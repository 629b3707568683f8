//! The two engines, as this host uses them: PostgreSQL (the ledger, its functions in
//! `schema.sql`) and the Redis Cluster (release, gates, routes, pub/sub).

use std::sync::{Arc, Mutex};

use hongbao_money::api::{CampaignKind, CampaignState};
use hongbao_money::seam::{AdminAnswer, AdminRequest, Balances, OpKind, Origin, Output};
use hongbao_money::{Account, Audit, CampaignStatus, Event, Notice, Reply, UserId, UserView};
use hongbao_proto::ResultCode;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, PushInfo, Script};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_postgres::{Client, NoTls};

use crate::{CampaignRow, ClusterConfig, Commit, Mesh, Shared, HOST_DEAD_AFTER_MS};

const SCHEMA: &str = include_str!("schema.sql");
const RELEASE: &str = include_str!("release.lua");
const GATE: &str = include_str!("gate.lua");
/// Ids per block of `hb_packet_blocks`.
const PACKET_BLOCK: u64 = 4096;
/// How long a route or a notice waits for Redis to answer again (a failover).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);
/// How long a message is published again while nobody receives it: a hung master keeps
/// its slots for the node timeout, and the client may route to it until it wakes (seen:
/// notices dropped after 15 s with a master frozen for 8 s).
const PUBLISH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
/// Checks in a row (a second apart, or a timeout) with a Redis master not answering,
/// after which the cluster connection is replaced.
const STUCK_AFTER: u32 = 3;
/// The advisory lock under which a host creates the schema.
const SCHEMA_LOCK: i64 = 0x6862_5f73_6368;

#[derive(Clone)]
pub struct Store(Arc<Inner>);

struct Inner {
    postgres: String,
    read: Mutex<Arc<Client>>,
    /// The cluster connection in use (replaced when it stops answering), and the client
    /// that makes new ones (pushes of every connection go to the same sender).
    redis: Mutex<ClusterConnection>,
    redis_client: ClusterClient,
    pushes: Mutex<Option<UnboundedReceiver<String>>>,
    /// The next packet id and the end of this host's block.
    ids: tokio::sync::Mutex<(u64, u64)>,
    release: Script,
    gate: Script,
}

fn pg_error(what: &str, e: impl std::borrow::Borrow<tokio_postgres::Error>) -> String {
    let e = e.borrow();
    match e.as_db_error() {
        Some(db) => format!(
            "PostgreSQL, {what}: {} ({})",
            db.message(),
            db.code().code()
        ),
        None => format!("PostgreSQL, {what}: {e}"),
    }
}

async fn pg_connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| pg_error("connecting", e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("hongbao cluster: PostgreSQL connection ended: {e}");
        }
    });
    Ok(client)
}

impl Store {
    pub async fn connect(cfg: &ClusterConfig) -> Result<Store, String> {
        let pg = pg_connect(&cfg.postgres).await?;
        pg.query("SELECT pg_advisory_lock($1)", &[&SCHEMA_LOCK])
            .await
            .map_err(|e| pg_error("locking the schema", e))?;
        let created = pg.batch_execute(SCHEMA).await;
        let _ = pg
            .query("SELECT pg_advisory_unlock($1)", &[&SCHEMA_LOCK])
            .await;
        created.map_err(|e| pg_error("creating the schema", e))?;

        let (push_tx, mut push_rx) = unbounded_channel::<PushInfo>();
        let client = ClusterClient::builder(cfg.redis.clone())
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push_tx)
            .connection_timeout(std::time::Duration::from_secs(2))
            .response_timeout(std::time::Duration::from_secs(2))
            .build()
            .map_err(|e| format!("Redis Cluster {:?}: {e}", cfg.redis))?;
        let mut redis = client
            .get_async_connection()
            .await
            .map_err(|e| format!("Redis Cluster {:?}: {e}", cfg.redis))?;
        redis
            .ssubscribe(crate::channel(&cfg.host))
            .await
            .map_err(|e| format!("Redis: subscribing to this host's channel: {e}"))?;
        // Only the payloads of this host's channel go on.
        let (tx, rx) = unbounded_channel();
        tokio::spawn(async move {
            while let Some(push) = push_rx.recv().await {
                if push.kind == redis::PushKind::SMessage {
                    if let Some(redis::Value::BulkString(bytes)) = push.data.get(1) {
                        let _ = tx.send(String::from_utf8_lossy(bytes).into_owned());
                    }
                }
            }
        });
        Ok(Store(Arc::new(Inner {
            postgres: cfg.postgres.clone(),
            read: Mutex::new(Arc::new(pg)),
            redis: Mutex::new(redis),
            redis_client: client,
            pushes: Mutex::new(Some(rx)),
            ids: tokio::sync::Mutex::new((0, 0)),
            release: Script::new(RELEASE),
            gate: Script::new(GATE),
        })))
    }

    pub fn take_pushes(&self) -> UnboundedReceiver<String> {
        self.0
            .pushes
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| unbounded_channel().1)
    }

    fn redis(&self) -> ClusterConnection {
        self.0.redis.lock().unwrap().clone()
    }

    /// The reading connection, opened again if it was lost (PostgreSQL restarted).
    async fn pg(&self) -> Result<Arc<Client>, String> {
        let current = self.0.read.lock().unwrap().clone();
        if !current.is_closed() {
            return Ok(current);
        }
        let fresh = Arc::new(pg_connect(&self.0.postgres).await?);
        *self.0.read.lock().unwrap() = fresh.clone();
        Ok(fresh)
    }

    // ----- Redis ---------------------------------------------------------------------

    /// The packets due to this host now, as (campaign, index), in a batch numbered after
    /// `received`, the last batch this host received (release.lua gives a batch again
    /// until it is received). Returns the batch's number and its packets.
    pub async fn release(
        &self,
        host: &str,
        received: u64,
    ) -> Result<(u64, Vec<(u32, u32)>), String> {
        let mut redis = self.redis();
        let out: Vec<redis::Value> = self
            .0
            .release
            .key("{rel}:hosts")
            .arg(host)
            .arg(HOST_DEAD_AFTER_MS)
            .arg(received)
            .invoke_async(&mut redis)
            .await
            .map_err(|e| e.to_string())?;
        let batch = match out.get(1) {
            Some(redis::Value::Int(n)) => *n as u64,
            _ => received,
        };
        let mut due = Vec::new();
        for v in out.iter().skip(2) {
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
        Ok((batch, due))
    }

    /// The packet is won (or created): no longer this host's to hand out.
    async fn given(&self, host: &str, packet: u64) {
        let (c, i) = hongbao_money::rules::shake_packet_parts(packet);
        let mut redis = self.redis();
        let _: Result<(), _> = redis
            .srem(format!("{{rel}}:held:{host}"), format!("{c}:{i}"))
            .await;
    }

    /// This host stops: what it holds goes back to the others at once.
    pub async fn forget_host(&self, host: &str) {
        let mut redis = self.redis();
        let _: Result<(), _> = redis.zadd("{rel}:hosts", host, 0).await;
    }

    pub async fn live_hosts(&self) -> Vec<String> {
        let mut redis = self.redis();
        let since = crate::now_ms().saturating_sub(HOST_DEAD_AFTER_MS);
        redis
            .zrangebyscore("{rel}:hosts", since, "+inf")
            .await
            .unwrap_or_default()
    }

    pub async fn set_route(&self, user: u64, host: &str) {
        let key = format!("route:{{{user}}}");
        self.patiently(|mut redis| {
            let (key, host) = (key.clone(), host.to_string());
            async move { redis.set::<_, _, ()>(key, host).await }
        })
        .await;
    }

    pub async fn clear_route(&self, user: u64, host: &str) {
        if self.route(user).await.as_deref() == Some(host) {
            let mut redis = self.redis();
            let _: Result<(), _> = redis.del(format!("route:{{{user}}}")).await;
        }
    }

    /// The host `user` is connected to, if any (asked again through a failover).
    pub async fn route(&self, user: u64) -> Option<String> {
        self.route_known(user).await.flatten()
    }

    /// `Some(route)` as Redis knows it, `None` when Redis did not answer for `PATIENCE`.
    async fn route_known(&self, user: u64) -> Option<Option<String>> {
        let key = format!("route:{{{user}}}");
        self.patiently(|mut redis| {
            let key = key.clone();
            async move { redis.get::<_, Option<String>>(key).await }
        })
        .await
    }

    /// `msg` on `host`'s channel. Sent again while nobody received it (SPUBLISH counts
    /// the receivers) or Redis did not answer: after a failover the host's subscription
    /// moves to the new master a moment after publishers can reach it, and pub/sub keeps
    /// nothing for later.
    pub(crate) async fn publish(&self, host: &str, msg: &Mesh) {
        let text = serde_json::to_string(msg).expect("serializable");
        let channel = crate::channel(host);
        let deadline = tokio::time::Instant::now() + PUBLISH_PATIENCE;
        loop {
            let received = self
                .patiently(|mut redis| {
                    let (channel, text) = (channel.clone(), text.clone());
                    async move {
                        redis::cmd("SPUBLISH")
                            .arg(channel)
                            .arg(text)
                            .query_async::<i64>(&mut redis)
                            .await
                    }
                })
                .await;
            // Received by someone: done. Nobody (0), or no answer from Redis at all
            // (`None`, a failover longer than `PATIENCE`): not delivered, so again.
            if received.is_some_and(|n| n > 0) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                eprintln!(
                    "hongbao cluster: nobody on {channel} received a message for {} s; dropped",
                    PUBLISH_PATIENCE.as_secs()
                );
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Keeps this host subscribed to its channel, for as long as the runtime runs. A
    /// Redis master failing over takes its subscribers' subscriptions with it, and the
    /// client does not always subscribe again on the new master (seen here: every notice
    /// published to a host for 15 s after a failover reached nobody). So once a second
    /// the host publishes an empty message on its own channel (not JSON: `on_push`
    /// ignores it) and, when nobody received it, subscribes again — on whichever node
    /// owns the channel's slot now.
    ///
    /// The connection is checked too, with the message and a probe of every master: a
    /// cluster connection can stay stuck after a master's failover, every command timing
    /// out while other hosts' connections recovered (seen in the lab: two of three hosts,
    /// until the end of the run), and a master that hangs (SIGSTOP: its connections open
    /// and silent) keeps the client sending its slots there even after its replica took
    /// over. After `STUCK_AFTER` checks in a row with a master not answering, a new
    /// connection is made (it learns the cluster's slots afresh) and replaces it.
    ///
    /// Each time the channel was subscribed again or the connection replaced, `renewed`
    /// is told: a message published while the subscription was gone may have been
    /// counted as received by a master that died before passing it on, so the host
    /// tells its users their waiting notices again (`Host::renew_notices`).
    pub async fn keep_subscribed(self, host: String, renewed: Arc<tokio::sync::Notify>) {
        let channel = crate::channel(&host);
        // Keys whose slots fall on every master (32 hash tags: the chance that one of
        // three masters owns none of them is below one in 100,000).
        let probes: Vec<String> = (0..32).map(|i| format!("{{hb-probe-{i}}}")).collect();
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut unanswered = 0;
        loop {
            every.tick().await;
            let mut redis = self.redis();
            let received = redis::cmd("SPUBLISH")
                .arg(&channel)
                .arg("")
                .query_async::<i64>(&mut redis)
                .await;
            // A master that hangs (its connection open and silent) keeps the client
            // sending its slots there: every probe must answer.
            let probed = futures_util::future::join_all(probes.iter().map(|key| {
                let mut redis = redis.clone();
                async move {
                    redis::cmd("EXISTS")
                        .arg(key)
                        .query_async::<i64>(&mut redis)
                        .await
                }
            }))
            .await;
            let all_answered = probed.iter().all(|r| r.is_ok());
            if let Ok(0) = received {
                match redis.ssubscribe(&channel).await {
                    Ok(()) => {
                        eprintln!("hongbao cluster: subscribed to {channel} again");
                        renewed.notify_one();
                    }
                    Err(e) => eprintln!("hongbao cluster: subscribing to {channel} again: {e}"),
                }
            }
            if received.is_ok() && all_answered {
                unanswered = 0;
                continue;
            }
            unanswered += 1;
            if unanswered >= STUCK_AFTER {
                unanswered = 0;
                if self.reconnect_redis(&channel).await {
                    renewed.notify_one();
                }
            }
        }
    }

    /// A new cluster connection, subscribed to `channel`, in place of the current one;
    /// whether it was replaced.
    async fn reconnect_redis(&self, channel: &str) -> bool {
        let connect = self.0.redis_client.get_async_connection();
        let mut fresh = match tokio::time::timeout(PATIENCE, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                eprintln!("hongbao cluster: Redis: connecting again: {e}");
                return false;
            }
            Err(_) => {
                eprintln!("hongbao cluster: Redis: connecting again: timed out");
                return false;
            }
        };
        if let Err(e) = fresh.ssubscribe(channel).await {
            eprintln!("hongbao cluster: Redis: subscribing on the new connection: {e}");
            return false;
        }
        *self.0.redis.lock().unwrap() = fresh;
        eprintln!(
            "hongbao cluster: Redis: a master did not answer {STUCK_AFTER} checks in a row; connected to the cluster again"
        );
        true
    }

    /// `ask` until Redis answers, for up to `PATIENCE` (a master failing over takes the
    /// node timeout and an election, a few seconds): a route or a notice is not dropped
    /// for a failover. `None` if Redis never answered.
    async fn patiently<T, F, Fut>(&self, mut ask: F) -> Option<T>
    where
        F: FnMut(ClusterConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match ask(self.redis()).await {
                Ok(v) => return Some(v),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    eprintln!("hongbao cluster: Redis: {e}");
                    return None;
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
    }

    /// The packet's gate: `Some(refusal)` when Redis can refuse the open by itself.
    pub async fn gate(&self, packet: u64, user: u64) -> Option<ResultCode> {
        let mut redis = self.redis();
        let answer: Result<String, _> = self
            .0
            .gate
            .key(format!("{{pk:{packet}}}"))
            .arg(user)
            .invoke_async(&mut redis)
            .await;
        match answer.as_deref() {
            Ok("pass") | Err(_) => None,
            Ok(name) => ResultCode::from_name(name),
        }
    }

    /// A sent packet's gate, once PostgreSQL holds the packet.
    async fn open_gate(&self, packet: u64, shares: usize, recipients: &[u64], ttl_ms: u64) {
        let key = format!("{{pk:{packet}}}");
        let secs = (ttl_ms / 1000 + 60) as i64;
        // MULTI/EXEC: a replica taking over has all of the gate or none of it (a gate
        // with `left` but no recipients would refuse every recipient).
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hset(&key, "left", shares)
            .ignore()
            .sadd(format!("{key}:r"), recipients)
            .ignore()
            .expire(&key, secs)
            .ignore()
            .expire(format!("{key}:r"), secs)
            .ignore()
            .expire(format!("{key}:o"), secs)
            .ignore();
        let mut redis = self.redis();
        let _: Result<(), _> = pipe.query_async(&mut redis).await;
    }

    /// Notices for a new packet's recipients: here, on their host's channel, or waiting
    /// in the ledger for their next login. A recipient whose route Redis could not tell
    /// (its master failing over) is told on every live host: a host where the user is
    /// not connected drops the notice, and a client drops a notice it already had.
    async fn notify(&self, host: &str, recipients: &[u64], notice: Notice) -> Vec<Output> {
        let mut here = Vec::new();
        for &user in recipients {
            let Some(id) = UserId::new(user) else {
                continue;
            };
            match self.route_known(user).await {
                Some(Some(there)) if there == host => {
                    here.push(Output::Notice { user: id, notice })
                }
                Some(Some(there)) => self.publish(&there, &Mesh::Notice { user, notice }).await,
                Some(None) => {}
                None => {
                    here.push(Output::Notice { user: id, notice });
                    for there in self.live_hosts().await {
                        if there != host {
                            self.publish(&there, &Mesh::Notice { user, notice }).await;
                        }
                    }
                }
            }
        }
        here
    }

    // ----- PostgreSQL: reads ---------------------------------------------------------

    pub async fn next_packet_id(&self) -> Result<u64, String> {
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

    pub async fn balance(&self, user: u64) -> Result<u64, String> {
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

    pub async fn user_view(&self, user: u64, limit: usize) -> Result<UserView, String> {
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

    pub async fn waiting_notices(&self, user: u64, now: u64) -> Result<Vec<Notice>, String> {
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
    ) -> Result<Vec<(u64, Notice)>, String> {
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

    pub async fn balances(&self) -> Result<Balances, String> {
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

    pub async fn campaign_row(&self, id: u32) -> Result<Option<CampaignRow>, String> {
        let pg = self.pg().await?;
        let row = pg
            .query_opt(
                "SELECT id, kind, packets, rate, amount_min, amount_max, recipients, user_min, \
                 user_max, seed, minted, started_ms FROM hb_campaigns WHERE id = $1",
                &[&(id as i32)],
            )
            .await
            .map_err(|e| pg_error("reading a campaign", e))?;
        Ok(row.map(|r| campaign_from(&r)))
    }

    async fn campaign_rows(&self) -> Result<Vec<CampaignRow>, String> {
        let pg = self.pg().await?;
        let rows = pg
            .query(
                "SELECT id, kind, packets, rate, amount_min, amount_max, recipients, user_min, \
                 user_max, seed, minted, started_ms FROM hb_campaigns ORDER BY id",
                &[],
            )
            .await
            .map_err(|e| pg_error("reading campaigns", e))?;
        Ok(rows.iter().map(campaign_from).collect())
    }

    /// A field of a campaign's release hash (`next`, `all`), if Redis has it.
    async fn release_field<T: redis::FromRedisValue>(&self, id: u32, field: &str) -> Option<T> {
        let mut redis = self.redis();
        redis
            .hget(format!("{{rel}}:c:{id}"), field)
            .await
            .unwrap_or(None)
    }

    async fn status(&self, c: &CampaignRow) -> Result<CampaignStatus, String> {
        let pg = self.pg().await?;
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
        };
        if c.send {
            let r = pg
                .query_one(
                    "SELECT count(*), coalesce(sum(cents),0)::bigint, coalesce(sum(shares),0)::bigint, \
                     coalesce(sum(opened),0)::bigint, coalesce(sum(opened_cents),0)::bigint, \
                     coalesce(sum(refunded),0)::bigint FROM hb_packets WHERE campaign = $1",
                    &[&(c.id as i32)],
                )
                .await
                .map_err(|e| pg_error("reading a campaign", e))?;
            let n = |i: usize| r.get::<_, i64>(i) as u64;
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
            let r = pg
                .query_one(
                    "SELECT count(*), coalesce(sum(cents),0)::bigint FROM hb_wins WHERE campaign = $1",
                    &[&(c.id as i32)],
                )
                .await
                .map_err(|e| pg_error("reading a campaign", e))?;
            status.won = r.get::<_, i64>(0) as u32;
            status.won_cents = r.get::<_, i64>(1) as u64;
            let next: Option<u32> = self.release_field(c.id, "next").await;
            status.released = next.unwrap_or(c.packets).min(c.packets);
            if status.won == c.packets {
                status.state = CampaignState::Done;
            }
        }
        // When the release reached the campaign's last packet (Redis's clock).
        status.released_all_ms = self.release_field(c.id, "all").await;
        Ok(status)
    }

    /// The audit, from one snapshot of the ledger: every cent minted is in a balance, a
    /// live packet, or a shake packet not yet won.
    pub async fn audit(&self) -> Result<Audit, String> {
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
                 (SELECT count(*) FROM hb_packets WHERE refunded IS NULL), \
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
        }
        .checked())
    }

    pub async fn expire(&self, now: u64, host: &str) -> Result<(), String> {
        let pg = self.pg().await?;
        pg.query_one("SELECT hb_expire($1, $2)", &[&(now as i64), &host])
            .await
            .map_err(|e| pg_error("expiring packets", e))?;
        Ok(())
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
    }
}

/// An operator's request, answered from the ledger (and Redis for what is released).
pub async fn admin(store: &Store, _host: &str, request: AdminRequest) -> AdminAnswer {
    let answer = match request {
        AdminRequest::CreateShake(req) => match req.check() {
            Err(why) => return AdminAnswer::Refused(why),
            Ok(()) => {
                let seed: u64 = rand::random();
                let minted = (0..req.packets)
                    .map(|i| {
                        hongbao_money::event::shake_amount(seed, i, req.amount_min, req.amount_max)
                    })
                    .sum();
                create(
                    store,
                    CampaignRow {
                        id: 0,
                        send: false,
                        packets: req.packets,
                        rate: req.rate_per_sec,
                        amount_min: req.amount_min,
                        amount_max: req.amount_max,
                        recipients: 0,
                        user_min: 0,
                        user_max: 0,
                        seed,
                        minted,
                        started_ms: 0,
                    },
                )
                .await
            }
        },
        AdminRequest::CreateSend(req) => match req.check() {
            Err(why) => return AdminAnswer::Refused(why),
            Ok(()) => {
                create(
                    store,
                    CampaignRow {
                        id: 0,
                        send: true,
                        packets: req.packets,
                        rate: req.rate_per_sec,
                        amount_min: req.amount_min,
                        amount_max: req.amount_max,
                        recipients: req.recipients,
                        user_min: req.user_min,
                        user_max: req.user_max,
                        seed: rand::random(),
                        minted: 0,
                        started_ms: 0,
                    },
                )
                .await
            }
        },
        AdminRequest::Campaign(id) => match store.campaign_row(id).await {
            Ok(Some(row)) => store.status(&row).await.map(AdminAnswer::Campaign),
            Ok(None) => Ok(AdminAnswer::NoCampaign(id)),
            Err(e) => Err(e),
        },
        AdminRequest::Campaigns => match store.campaign_rows().await {
            Ok(rows) => {
                let mut all = Vec::new();
                let mut failed = None;
                for row in &rows {
                    match store.status(row).await {
                        Ok(s) => all.push(s),
                        Err(e) => failed = Some(e),
                    }
                }
                failed.map_or(Ok(AdminAnswer::Campaigns(all)), Err)
            }
            Err(e) => Err(e),
        },
        AdminRequest::Audit => store.audit().await.map(AdminAnswer::Audit),
    };
    answer.unwrap_or_else(|e| AdminAnswer::Unavailable(format!("the ledger is unavailable: {e}")))
}

/// A campaign: in the ledger first (with what it mints), then in Redis for release.
async fn create(store: &Store, mut c: CampaignRow) -> Result<AdminAnswer, String> {
    let pg = store.pg().await?;
    c.started_ms = crate::now_ms();
    let row = pg
        .query_one(
            "INSERT INTO hb_campaigns VALUES (nextval('hb_campaign_ids'), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
            &[
                &if c.send { "send" } else { "shake" },
                &(c.packets as i32),
                &(c.rate as i32),
                &(c.amount_min as i64),
                &(c.amount_max as i64),
                &(c.recipients as i32),
                &(c.user_min as i64),
                &(c.user_max as i64),
                &(c.seed as i64),
                &(c.minted as i64),
                &(c.started_ms as i64),
            ],
        )
        .await
        .map_err(|e| pg_error("creating a campaign", e))?;
    c.id = row.get::<_, i32>(0) as u32;
    let mut redis = store.redis();
    let key = format!("{{rel}}:c:{}", c.id);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .hset_multiple(
            &key,
            &[
                ("packets", c.packets as u64),
                ("rate", c.rate as u64),
                ("start", c.started_ms),
                ("next", 0),
            ],
        )
        .ignore()
        .sadd("{rel}:running", c.id)
        .ignore();
    pipe.query_async::<()>(&mut redis)
        .await
        .map_err(|e| format!("Redis: starting the campaign's release: {e}"))?;
    store.status(&c).await.map(AdminAnswer::Campaign)
}

// ----- the committer -----------------------------------------------------------------

/// What an op became in the ledger.
enum Done {
    Won(bool),
    Sent(String, u64, u64),
    Opened(String, u64),
    Created(bool),
}

struct Statements {
    win: tokio_postgres::Statement,
    send: tokio_postgres::Statement,
    open: tokio_postgres::Statement,
    campaign_packet: tokio_postgres::Statement,
}

async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
    Ok(Statements {
        win: client
            .prepare("SELECT hb_win($1, $2, $3, $4, $5, $6, $7)")
            .await?,
        send: client
            .prepare("SELECT * FROM hb_send($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
            .await?,
        open: client
            .prepare("SELECT * FROM hb_open($1, $2, $3, $4)")
            .await?,
        campaign_packet: client
            .prepare("SELECT hb_campaign_packet($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .await?,
    })
}

fn i64s(v: &[u64]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// One op inside the batch's transaction.
async fn run_op(
    client: &Client,
    st: &Statements,
    host: &str,
    at: i64,
    op: &Commit,
) -> Result<Done, tokio_postgres::Error> {
    match op {
        Commit::Win {
            to,
            campaign,
            packet,
            cents,
        } => {
            let user = to.user.get();
            let body = serde_json::to_value(Event::ShakeWon {
                campaign: *campaign,
                index: *packet as u32,
                user,
                amount_cents: *cents,
            })
            .expect("serializable");
            let row = client
                .query_one(
                    &st.win,
                    &[
                        &(*packet as i64),
                        &(*campaign as i32),
                        &(user as i64),
                        &(*cents as i64),
                        &at,
                        &host,
                        &body,
                    ],
                )
                .await?;
            Ok(Done::Won(row.get(0)))
        }
        Commit::Send {
            to,
            packet,
            cents,
            recipients,
            shares,
            expires_ms,
            key,
        } => {
            let user = to.user.get();
            let body = serde_json::to_value(Event::PacketSent {
                packet: *packet,
                sender: Account::User(user),
                amount_cents: *cents,
                shares: shares.len() as u32,
                recipients: recipients.clone(),
                expires_ms: *expires_ms,
                idempotency_key: key.clone(),
            })
            .expect("serializable");
            let row = client
                .query_one(
                    &st.send,
                    &[
                        &(user as i64),
                        &(*packet as i64),
                        &(*cents as i64),
                        &i64s(recipients),
                        &i64s(shares),
                        &(*expires_ms as i64),
                        &key.as_deref(),
                        &at,
                        &host,
                        &body,
                    ],
                )
                .await?;
            Ok(Done::Sent(
                row.get(0),
                row.get::<_, i64>(1) as u64,
                row.get::<_, i64>(2) as u64,
            ))
        }
        Commit::Open { to, packet } => {
            let row = client
                .query_one(
                    &st.open,
                    &[&(*packet as i64), &(to.user.get() as i64), &at, &host],
                )
                .await?;
            Ok(Done::Opened(row.get(0), row.get::<_, i64>(1) as u64))
        }
        Commit::CampaignPacket {
            campaign,
            packet,
            cents,
            recipients,
            shares,
            expires_ms,
        } => {
            let body = serde_json::to_value(Event::PacketSent {
                packet: *packet,
                sender: Account::Campaign(*campaign),
                amount_cents: *cents,
                shares: shares.len() as u32,
                recipients: recipients.clone(),
                expires_ms: *expires_ms,
                idempotency_key: None,
            })
            .expect("serializable");
            let row = client
                .query_one(
                    &st.campaign_packet,
                    &[
                        &(*packet as i64),
                        &(*campaign as i32),
                        &(*cents as i64),
                        &i64s(recipients),
                        &i64s(shares),
                        &(*expires_ms as i64),
                        &at,
                        &host,
                        &body,
                    ],
                )
                .await?;
            Ok(Done::Created(row.get(0)))
        }
    }
}

/// One transaction for the whole batch, its ops pipelined; retried whole on a deadlock
/// or a serialization failure (another host's batch locked the same rows). An op that
/// fails on its own (a unique key another host's batch took first, a check) costs only
/// itself: its batch-mates are committed again without it, and it comes back as
/// `Err(why)` in its place, to be answered alone. A failure without a database error
/// (the connection lost) fails the whole batch.
async fn commit_batch(
    client: &Client,
    st: &Statements,
    host: &str,
    ops: &[Commit],
) -> Result<Vec<Result<Done, String>>, tokio_postgres::Error> {
    let at = crate::now_ms() as i64;
    let mut left_out: Vec<Option<String>> = vec![None; ops.len()];
    let mut attempt = 0;
    loop {
        attempt += 1;
        let running: Vec<usize> = (0..ops.len()).filter(|&i| left_out[i].is_none()).collect();
        client.batch_execute("BEGIN").await?;
        let results = futures_util::future::join_all(
            running
                .iter()
                .map(|&i| run_op(client, st, host, at, &ops[i])),
        )
        .await;
        if results.iter().all(Result::is_ok) {
            client.batch_execute("COMMIT").await?;
            let mut done = results.into_iter().map(|r| r.expect("all ok"));
            return Ok(left_out
                .into_iter()
                .map(|why| match why {
                    Some(why) => Err(why),
                    None => Ok(done.next().expect("one result an op that ran")),
                })
                .collect());
        }
        let _ = client.batch_execute("ROLLBACK").await;
        let culprits = culprits(&results);
        let first = results
            .into_iter()
            .find_map(Result::err)
            .expect("one op failed");
        let retry = first.code().is_some_and(|c| {
            *c == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
                || *c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
        });
        if attempt >= 10 {
            return Err(first);
        }
        if retry {
            continue;
        }
        // Ops that failed by themselves are left out; the rest failed only because the
        // transaction was already aborted. None to blame, or all: the batch fails.
        if culprits.is_empty() || culprits.len() == running.len() {
            return Err(first);
        }
        for (k, why) in culprits {
            eprintln!("hongbao cluster: an op was left out of its batch: {why}");
            left_out[running[k]] = Some(why);
        }
    }
}

/// The positions of the ops whose own statement failed (not those refused because the
/// transaction had already failed), with why.
fn culprits(results: &[Result<Done, tokio_postgres::Error>]) -> Vec<(usize, String)> {
    results
        .iter()
        .enumerate()
        .filter_map(|(k, r)| {
            let e = r.as_ref().err()?;
            let code = e.code()?;
            (*code != tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION)
                .then(|| (k, pg_error("committing", e)))
        })
        .collect()
}

/// Takes ops as they come, commits them in batches (one transaction each), and only then
/// lets out what they tell.
pub async fn committer(
    store: Store,
    cfg: ClusterConfig,
    shared: Arc<Shared>,
    mut rx: UnboundedReceiver<Commit>,
) {
    let mut conn: Option<(Client, Statements)> = None;
    let max = cfg.max_batch.max(1);
    // Send-campaign packets whose batch failed: tried again with the next batch, or
    // alone after half a second.
    let mut again: Vec<Commit> = Vec::new();
    loop {
        let first = if again.is_empty() {
            match rx.recv().await {
                Some(op) => Some(op),
                None => break,
            }
        } else {
            // Closed or quiet: `again` goes alone.
            tokio::time::timeout(std::time::Duration::from_millis(500), rx.recv())
                .await
                .ok()
                .flatten()
        };
        let mut batch = std::mem::take(&mut again);
        batch.extend(first);
        let deadline = tokio::time::Instant::now() + cfg.commit_window;
        while batch.len() < max {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) if cfg.commit_window.is_zero() => break,
                Err(_) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(op)) => batch.push(op),
                    _ => break,
                },
            }
        }
        batch.sort_by_key(Commit::lock_order);
        if conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
            conn = match pg_connect(&cfg.postgres).await {
                Ok(c) => match prepare(&c).await {
                    Ok(st) => Some((c, st)),
                    Err(e) => {
                        eprintln!("hongbao cluster: {}", pg_error("preparing", e));
                        None
                    }
                },
                Err(e) => {
                    eprintln!("hongbao cluster: {e}");
                    None
                }
            };
        }
        let result = match &conn {
            Some((client, st)) => commit_batch(client, st, &cfg.host, &batch)
                .await
                .map_err(|e| pg_error("committing", e)),
            None => Err("no connection to PostgreSQL".to_string()),
        };
        match result {
            Ok(done) => {
                let (mut committed, mut results, mut left_out) =
                    (Vec::new(), Vec::new(), Vec::new());
                for (op, d) in batch.into_iter().zip(done) {
                    match d {
                        Ok(d) => {
                            committed.push(op);
                            results.push(d);
                        }
                        Err(_) => left_out.push(op),
                    }
                }
                if !left_out.is_empty() {
                    let (campaign, rest) = left_out
                        .into_iter()
                        .partition(|op| matches!(op, Commit::CampaignPacket { .. }));
                    if !rx.is_closed() {
                        again = campaign;
                    }
                    refuse(&shared, rest, LEFT_OUT).await;
                }
                after_commit(&store, &cfg, &shared, committed, results).await;
            }
            Err(why) => {
                eprintln!(
                    "hongbao cluster: a batch of {} was not committed: {why}",
                    batch.len()
                );
                let (campaign, rest): (Vec<Commit>, Vec<Commit>) = batch
                    .into_iter()
                    .partition(|op| matches!(op, Commit::CampaignPacket { .. }));
                if !rx.is_closed() {
                    again = campaign;
                }
                refuse(&shared, rest, UNAVAILABLE).await;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// What an op of a batch that was not committed is told.
const UNAVAILABLE: &str = "the ledger is unavailable; nothing was done";
/// What an op left out of its batch is told (its batch-mates were committed).
const LEFT_OUT: &str = "the ledger refused this operation (a conflict); nothing was done";

/// Nothing of these ops happened: each is answered `unavailable` with `text`, and the
/// shake packets they would have given stay this host's to give.
async fn refuse(shared: &Shared, batch: Vec<Commit>, text: &str) {
    let mut out = Vec::new();
    for op in batch {
        let (to, kind) = match op {
            Commit::Win {
                to, packet, cents, ..
            } => {
                // The packet goes back to the pool of the worker that gave it.
                out.push(Output::Deal {
                    worker: to.worker,
                    packets: vec![(packet, cents)],
                });
                (to, OpKind::Shake)
            }
            Commit::Send { to, .. } => (to, OpKind::Send),
            Commit::Open { to, .. } => (to, OpKind::Open),
            // Tried again by the committer.
            Commit::CampaignPacket { .. } => continue,
        };
        shared.count(kind, ResultCode::Unavailable);
        out.push(reply(
            to,
            Reply::Error {
                result: ResultCode::Unavailable,
                text: text.into(),
            },
        ));
    }
    shared.emit_all(out);
}

fn reply(to: Origin, reply: Reply) -> Output {
    Output::Reply { to, reply }
}

/// The batch is committed: replies go out at once; then Redis learns what changed
/// (packets given, gates for new packets) and recipients hear of their packets.
async fn after_commit(
    store: &Store,
    cfg: &ClusterConfig,
    shared: &Arc<Shared>,
    batch: Vec<Commit>,
    done: Vec<Done>,
) {
    let mut out = Vec::new();
    let mut later = Vec::new();
    {
        let mut snap = shared.snapshot.lock().unwrap();
        snap.ledger_seq += 1;
        snap.committed_seq = snap.ledger_seq;
    }
    for (op, d) in batch.into_iter().zip(done) {
        match (op, d) {
            (
                Commit::Win {
                    to, packet, cents, ..
                },
                Done::Won(won),
            ) => {
                let result = if won {
                    ResultCode::Won
                } else {
                    ResultCode::Nothing
                };
                shared.count(OpKind::Shake, result);
                out.push(reply(
                    to,
                    Reply::Shake {
                        result,
                        packet_id: if won { packet } else { 0 },
                        amount_cents: if won { cents } else { 0 },
                        retry_after_ms: 0,
                    },
                ));
                later.push((packet, None));
            }
            (
                Commit::Send {
                    to,
                    packet,
                    cents,
                    recipients,
                    shares,
                    expires_ms,
                    ..
                },
                Done::Sent(result, first, balance_cents),
            ) => {
                let (result, reply_) = match result.as_str() {
                    "ok" => (
                        ResultCode::Ok,
                        Reply::Send {
                            result: ResultCode::Ok,
                            packet_id: first,
                            balance_cents,
                        },
                    ),
                    "insufficient-funds" => (
                        ResultCode::InsufficientFunds,
                        Reply::Send {
                            result: ResultCode::InsufficientFunds,
                            packet_id: 0,
                            balance_cents,
                        },
                    ),
                    _ => (
                        ResultCode::BadRequest,
                        Reply::Error {
                            result: ResultCode::BadRequest,
                            text: "this idempotency key was used for a different send".into(),
                        },
                    ),
                };
                shared.count(OpKind::Send, result);
                out.push(reply(to, reply_));
                if result == ResultCode::Ok && first == packet {
                    shared.snapshot.lock().unwrap().send_packets += 1;
                    let notice = Notice {
                        packet_id: packet,
                        from_user: Some(to.user),
                        amount_cents: cents,
                        shares: shares.len() as u32,
                        expires_at_ms: expires_ms,
                    };
                    later.push((packet, Some((notice, recipients, true))));
                }
            }
            (Commit::Open { to, packet }, Done::Opened(result, cents)) => {
                let result = ResultCode::from_name(&result).unwrap_or(ResultCode::Unavailable);
                shared.count(OpKind::Open, result);
                out.push(reply(
                    to,
                    Reply::Open {
                        result,
                        packet_id: packet,
                        amount_cents: cents,
                    },
                ));
            }
            (
                Commit::CampaignPacket {
                    packet,
                    cents,
                    recipients,
                    shares,
                    expires_ms,
                    ..
                },
                Done::Created(created),
            ) => {
                if created {
                    shared.snapshot.lock().unwrap().send_packets += 1;
                    let notice = Notice {
                        packet_id: packet,
                        from_user: None,
                        amount_cents: cents,
                        shares: shares.len() as u32,
                        expires_at_ms: expires_ms,
                    };
                    later.push((packet, Some((notice, recipients, false))));
                } else {
                    later.push((packet, None));
                }
            }
            _ => unreachable!("each op has its own kind of result"),
        }
    }
    shared.emit_all(out);
    if later.is_empty() {
        return;
    }
    // Off the committer's path: the next batch does not wait for these round trips.
    let (store, host, ttl_ms, shared) = (
        store.clone(),
        cfg.host.clone(),
        cfg.packet_ttl_ms,
        shared.clone(),
    );
    tokio::spawn(async move {
        tell_redis(&store, &host, ttl_ms, &shared, later).await;
    });
}

type Later = Vec<(u64, Option<(Notice, Vec<u64>, bool)>)>;

/// What Redis learns after a commit: packets given, gates for new packets, and the new
/// packets' notices (here, or on their recipients' hosts).
async fn tell_redis(store: &Store, host: &str, ttl_ms: u64, shared: &Shared, later: Later) {
    for (packet, new) in later {
        match new {
            None => store.given(host, packet).await,
            Some((notice, recipients, by_user)) => {
                store
                    .open_gate(packet, notice.shares as usize, &recipients, ttl_ms)
                    .await;
                if !by_user {
                    store.given(host, packet).await;
                }
                let here = store.notify(host, &recipients, notice).await;
                shared.emit_all(here);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    impl Drop for TestRedis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// One call of release.lua by host `h1` that says it received batch `received`:
    /// the batch's number and its packets.
    fn release(con: &mut redis::Connection, received: u64) -> (u64, Vec<String>) {
        let out: Vec<redis::Value> = Script::new(RELEASE)
            .key("{rel}:hosts")
            .arg("h1")
            .arg(HOST_DEAD_AFTER_MS)
            .arg(received)
            .invoke(con)
            .unwrap();
        let batch = match out[1] {
            redis::Value::Int(n) => n as u64,
            ref other => panic!("batch number {other:?}"),
        };
        let packets = out[2..]
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
    /// holds, until it says it received them — and never twice once it has.
    #[test]
    fn a_released_batch_whose_reply_was_lost_is_given_again() {
        let redis = TestRedis::start();
        let mut con = redis::Client::open(redis.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        // Ten packets at 1,000/s, started a second ago: all due at once.
        let start = crate::now_ms() - 1000;
        redis::pipe()
            .hset_multiple(
                "{rel}:c:1",
                &[
                    ("packets", 10),
                    ("rate", 1000),
                    ("start", start),
                    ("next", 0),
                ],
            )
            .sadd("{rel}:running", 1)
            .query::<()>(&mut con)
            .unwrap();

        let (batch, first) = release(&mut con, 0);
        assert_eq!(batch, 1);
        assert_eq!(first.len(), 10, "{first:?}");
        // The reply never came: asked again having received nothing, the same packets.
        let (batch, again) = release(&mut con, 0);
        assert_eq!((batch, &again), (2, &first));
        // Received: nothing more is due, and nothing comes twice.
        let (batch, none) = release(&mut con, 2);
        assert_eq!((batch, none.len()), (2, 0));
        // One packet won meanwhile (no longer held): a lost reply gives back only the rest.
        redis::cmd("SREM")
            .arg("{rel}:held:h1")
            .arg(&first[0])
            .query::<()>(&mut con)
            .unwrap();
        let (batch, rest) = release(&mut con, 1);
        assert_eq!((batch, &rest[..]), (3, &first[1..]));
        // A host ahead of Redis (writes lost in a failover) is believed, nothing resent.
        let (batch, none) = release(&mut con, 7);
        assert_eq!((batch, none.len()), (7, 0));
    }
}
