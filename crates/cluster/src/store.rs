//! The connections to both engines, shared by every task of this host: PostgreSQL (the
//! ledger; its schema, `schema.sql`, created on connect) and the Redis Cluster (its
//! scripts, and the pushes of this host's channel). What is done over them lives with
//! its job: `release`, `gate`, `delivery`, `ledger`, `campaign`, `admin`, `committer`.

use hongbao_money::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, PushInfo, RedisError, RedisResult, Script};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_postgres::Client;

use crate::connect::pg_connect;
use crate::mesh::channel;
use crate::pg::pg_error;
use crate::shard::ShardMap;
use crate::{redact, ClusterConfig, PgTarget};

pub(crate) const SCHEMA: &str = include_str!("schema.sql");
pub(crate) const RELEASE: &str = include_str!("release.lua");
pub(crate) const RESTORE: &str = include_str!("restore.lua");
const GATE: &str = include_str!("gate.lua");
/// How long work that holds the chain turn outside the committer (a campaign made,
/// expiry) may wait on PostgreSQL (`Store::bounded`).
const HELD_WORK_DEADLINE: Duration = Duration::from_secs(5);
/// The advisory lock under which a host creates the schema.
const SCHEMA_LOCK: i64 = 0x6862_5f73_6368;

/// Both engines' connections, cheap to clone: every task of this host holds one.
#[derive(Clone)]
pub struct Store(pub(crate) Arc<Inner>);

/// Fields another file's `impl Store` needs are `pub(crate)`: each job's Redis and
/// PostgreSQL calls live in a file of their own.
pub(crate) struct Inner {
    /// The ledger's formations, shard 0 first (`shard`).
    pub(crate) shards: Vec<Shard>,
    pub(crate) map: ShardMap,
    /// The cluster connection for commands (replaced when it stops answering), the one
    /// subscribed to this host's channel (never sent a command, so a push is never read
    /// as a command's reply: seen once, an `sunsubscribe` push taken for a release's
    /// answer), and the client that makes new ones (pushes of every connection go to
    /// the same sender).
    pub(crate) redis: Mutex<ClusterConnection>,
    pub(crate) subscribed: Mutex<ClusterConnection>,
    pub(crate) redis_client: ClusterClient,
    pushes: Mutex<Option<UnboundedReceiver<String>>>,
    /// Packet ids: this host's block, and ids drawn for one shard kept for the others.
    pub(crate) ids: tokio::sync::Mutex<PacketIds>,
    pub(crate) release: Script,
    /// How many hash tags the release is split over (`ClusterConfig::release_tags`).
    pub(crate) release_tags: u32,
    /// Packets given whose removal from this host's held set failed; the next release
    /// call removes them.
    pub(crate) ungiven: Mutex<Vec<String>>,
    pub(crate) restore: Script,
    pub(crate) gate: Script,
}

/// One formation of the ledger, as this host reaches it.
pub(crate) struct Shard {
    postgres: PgTarget,
    read: Mutex<Arc<Client>>,
    /// Raised each time a connection is given up as dead or silent (a primary lost or
    /// frozen) — by the committer, and by `bounded` work past its deadline: the reading
    /// connection, made before, is replaced at its next use rather than left to hang
    /// until its host answers again.
    pub(crate) pg_lost: std::sync::atomic::AtomicU64,
    /// `pg_lost` when the reading connection was made.
    read_made: std::sync::atomic::AtomicU64,
    /// Held by each of this host's transactions that append to this formation's
    /// `hb_events` (the committer's batches, expiry, a new campaign) until it ends. The
    /// database already queues them on this host's row in `hb_chain_hosts` (`hb_chain` in
    /// `schema.sql`); queued here instead, a batch holding that row never waits inside
    /// PostgreSQL on a packet row that this host's expiry holds while it waits for that
    /// row (a deadlock).
    pub(crate) chain: tokio::sync::Mutex<()>,
}

/// The next packet id and the end of this host's block, and ids drawn while looking for
/// one shard's, by shard (`Store::next_packet_id_on`).
#[derive(Default)]
pub(crate) struct PacketIds {
    pub(crate) next: u64,
    pub(crate) end: u64,
    pub(crate) spare: Vec<std::collections::VecDeque<u64>>,
}

impl Shard {
    /// The reading connection, opened again if it was lost (PostgreSQL restarted) or the
    /// committer has given a connection up since it was made (`pg_lost`).
    pub(crate) async fn pg(&self) -> Result<Arc<Client>, Error> {
        use std::sync::atomic::Ordering::SeqCst;
        let current = self.read.lock().unwrap().clone();
        let lost = self.pg_lost.load(SeqCst);
        if !current.is_closed() && self.read_made.load(SeqCst) == lost {
            return Ok(current);
        }
        let fresh = Arc::new(pg_connect(&self.postgres).await?);
        *self.read.lock().unwrap() = fresh.clone();
        self.read_made.store(lost, SeqCst);
        Ok(fresh)
    }

    /// A connection of its own, for a transaction (the reading one is shared by every
    /// task, whose statements would land inside it).
    pub(crate) async fn pg_own(&self) -> Result<Client, Error> {
        pg_connect(&self.postgres).await
    }

    pub(crate) fn target(&self) -> &PgTarget {
        &self.postgres
    }
}

/// Connects to formation `me`, creates the schema there (under the schema lock), and
/// records the shard map there or checks it against what it holds (`shard::record`).
async fn open_shard(
    target: &PgTarget,
    wanted: ShardMap,
    me: usize,
    known: Option<ShardMap>,
) -> Result<(Client, ShardMap), Error> {
    let pg = pg_connect(target)
        .await
        .map_err(|e| e.context(format!("shard {me}")))?;
    pg.query("SELECT pg_advisory_lock($1)", &[&SCHEMA_LOCK])
        .await
        .map_err(|e| pg_error("locking the schema", e))?;
    let created = pg.batch_execute(SCHEMA).await;
    let _ = pg
        .query("SELECT pg_advisory_unlock($1)", &[&SCHEMA_LOCK])
        .await;
    created.map_err(|e| pg_error("creating the schema", e))?;
    let map = crate::shard::record(&pg, wanted, me, known).await?;
    Ok((pg, map))
}

/// The Redis TLS trust for `rediss://` nodes: the CA of the engines.
pub(crate) fn redis_tls(ca: Option<&[u8]>) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: ca.map(<[u8]>::to_vec),
    }
}

impl Store {
    pub async fn connect(cfg: &ClusterConfig) -> Result<Store, Error> {
        if cfg.release_tags == 0 {
            return Err(Error::refused(
                "release_tags is 0: the release needs at least one Redis hash tag \
                 (1 releases every campaign under {rel} alone, as before)",
            ));
        }
        // Shard 0 holds the map's history; every other formation is checked against it.
        let wanted = cfg.shard_map();
        let mut map = None;
        let mut pgs = Vec::with_capacity(cfg.postgres.len());
        for (me, target) in cfg.postgres.iter().enumerate() {
            let (pg, ledgers) = open_shard(target, wanted, me, map).await?;
            map = Some(ledgers);
            pgs.push(pg);
        }
        let map = map.unwrap_or(wanted);
        let ca = cfg.postgres.first().and_then(|t| t.ca.clone());

        let (push_tx, mut push_rx) = unbounded_channel::<PushInfo>();
        let nodes: Vec<String> = cfg.redis.iter().map(|u| redact(u)).collect();
        let mut builder = ClusterClient::builder(cfg.redis.clone());
        if let Some(password) = &cfg.redis_password {
            builder = builder.password(password.clone());
        }
        if cfg.redis.iter().any(|u| u.starts_with("rediss://")) {
            builder = builder.certs(redis_tls(ca.as_deref()));
        }
        let client = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push_tx)
            .connection_timeout(std::time::Duration::from_secs(2))
            .response_timeout(std::time::Duration::from_secs(2))
            .build()
            .map_err(|e| Error::unavailable(format!("Redis Cluster {nodes:?}"), e))?;
        let redis = client
            .get_async_connection()
            .await
            .map_err(|e| Error::unavailable(format!("Redis Cluster {nodes:?}"), e))?;
        let mut subscribed = client
            .get_async_connection()
            .await
            .map_err(|e| Error::unavailable(format!("Redis Cluster {nodes:?}"), e))?;
        // The schema's version: beside the hosts alive, what they need kept or dropped
        // (versions.rs), under the schema lock.
        let since = hongbao_sys::clock::unix_ms().saturating_sub(crate::HOST_DEAD_AFTER_MS);
        let hosts = format!("{}:hosts", crate::tags::release_tag(0));
        let live: Vec<String> =
            redis::AsyncCommands::zrangebyscore(&mut redis.clone(), hosts, since, "+inf")
                .await
                .map_err(|e| Error::unavailable("Redis: reading the hosts alive", e))?;
        for pg in &pgs {
            pg.query("SELECT pg_advisory_lock($1)", &[&SCHEMA_LOCK])
                .await
                .map_err(|e| pg_error("locking the schema", e))?;
            let versioned =
                crate::versions::apply(pg, &cfg.host, &live, hongbao_sys::clock::unix_ms()).await;
            let _ = pg
                .query("SELECT pg_advisory_unlock($1)", &[&SCHEMA_LOCK])
                .await;
            versioned?;
        }
        pgs[0]
            .execute(
                "INSERT INTO hb_host_maps (host, version, written_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (host) DO UPDATE SET version = $2, written_ms = $3",
                &[
                    &cfg.host,
                    &(map.version as i32),
                    &(hongbao_sys::clock::unix_ms() as i64),
                ],
            )
            .await
            .map_err(|e| pg_error("recording this host's shard map", e))?;
        subscribed
            .ssubscribe(channel(&cfg.host))
            .await
            .map_err(|e| Error::unavailable("Redis: subscribing to this host's channel", e))?;
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
        let shards = cfg
            .postgres
            .iter()
            .zip(pgs)
            .map(|(target, pg)| Shard {
                postgres: target.clone(),
                read: Mutex::new(Arc::new(pg)),
                pg_lost: 0.into(),
                read_made: 0.into(),
                chain: tokio::sync::Mutex::new(()),
            })
            .collect();
        Ok(Store(Arc::new(Inner {
            shards,
            map,
            redis: Mutex::new(redis),
            subscribed: Mutex::new(subscribed),
            redis_client: client,
            pushes: Mutex::new(Some(rx)),
            ids: tokio::sync::Mutex::new(PacketIds::default()),
            release: Script::new(RELEASE),
            release_tags: cfg.release_tags,
            ungiven: Mutex::new(Vec::new()),
            restore: Script::new(RESTORE),
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

    pub(crate) fn redis(&self) -> ClusterConnection {
        self.0.redis.lock().unwrap().clone()
    }

    /// Formation `i` of the ledger (`shard`).
    pub(crate) fn shard(&self, i: usize) -> &Shard {
        &self.0.shards[i]
    }

    pub(crate) fn shards(&self) -> &[Shard] {
        &self.0.shards
    }

    pub(crate) fn map(&self) -> ShardMap {
        self.0.map
    }

    /// `work` on formation `shard` that holds this host's chain turn there, given up
    /// after [`HELD_WORK_DEADLINE`]: a frozen primary answers nothing, and the turn held
    /// meanwhile would stop the committer. Given up, it counts as a connection lost
    /// (`Shard::pg_lost`): the reading connection is made again at its next use. Its
    /// outcome is then unknown, as a commit's whose answer was lost.
    pub(crate) async fn bounded<T>(
        &self,
        shard: usize,
        what: &str,
        work: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(HELD_WORK_DEADLINE, work).await {
            Ok(done) => done,
            Err(_) => {
                self.shard(shard)
                    .pg_lost
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err(Error::unavailable(
                    what.to_string(),
                    format!(
                        "no answer from PostgreSQL in {} s",
                        HELD_WORK_DEADLINE.as_secs()
                    ),
                ))
            }
        }
    }

    /// Shard 0's reading connection: what is global (campaigns, numbering, keys).
    pub(crate) async fn pg(&self) -> Result<Arc<Client>, Error> {
        self.shard(0).pg().await
    }

    /// Taken around each of this host's transactions that append events on formation
    /// `shard` (`Shard::chain`).
    pub(crate) async fn chain_turn(&self, shard: usize) -> tokio::sync::MutexGuard<'_, ()> {
        self.shard(shard).chain.lock().await
    }

    /// A MULTI/EXEC on the slot of `key`, sent again while the cluster answers that it
    /// did not run it (a slot moved in a failover, the cluster down for a moment). The
    /// client follows a `MOVED` for a single command but not inside a transaction, so a
    /// plain `EXISTS key` goes first each time to make it learn where the slot is now.
    pub(crate) async fn transaction(&self, pipe: &redis::Pipeline, key: &str) -> RedisResult<()> {
        transaction(&mut self.redis(), pipe, key).await
    }
}

/// `Store::transaction` over one connection.
async fn transaction(
    redis: &mut ClusterConnection,
    pipe: &redis::Pipeline,
    key: &str,
) -> RedisResult<()> {
    let mut tries = 0;
    loop {
        match pipe.query_async::<()>(redis).await {
            Err(e) if tries < TRANSACTION_TRIES && not_run(&e) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50 * tries)).await;
                let _: RedisResult<bool> = redis.exists(key).await;
            }
            done => return done,
        }
    }
}

/// How often a transaction the cluster did not run is sent again (about 2 s of waits).
const TRANSACTION_TRIES: u64 = 8;

/// Whether the cluster refused a transaction without running any of it.
fn not_run(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as K};
    matches!(
        e.kind(),
        ErrorKind::Server(
            K::ExecAbort | K::Moved | K::Ask | K::TryAgain | K::ClusterDown | K::MasterDown
        )
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    /// Two `redis-server` cluster nodes on loopback, slots split between them, killed
    /// when dropped (release.rs's tests use it too).
    pub(crate) struct TwoNodes {
        children: Vec<Child>,
        pub(crate) ports: [u16; 2],
        _dir: std::path::PathBuf,
    }

    impl Drop for TwoNodes {
        fn drop(&mut self) {
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(&self._dir);
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    pub(crate) fn cli(port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli (Debian's redis-tools package) is needed");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn wait(what: &str, mut ok: impl FnMut() -> bool) {
        for _ in 0..200 {
            if ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}");
    }

    impl TwoNodes {
        /// Slots 0..=8191 on the first node, the rest (`{rel}`'s 12189 among them) on the
        /// second.
        pub(crate) fn start() -> TwoNodes {
            let ports = [free_port(), free_port()];
            // A directory of its own: tests run at once in one process.
            let dir = std::env::temp_dir().join(format!(
                "hb-two-nodes-{}-{}",
                std::process::id(),
                ports[0]
            ));
            let mut nodes = TwoNodes {
                children: Vec::new(),
                ports,
                _dir: dir.clone(),
            };
            for port in ports {
                let d = dir.join(port.to_string());
                std::fs::create_dir_all(&d).unwrap();
                let child = Command::new("redis-server")
                    .current_dir(&d)
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args([
                        "--cluster-enabled",
                        "yes",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ])
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("redis-server (Debian's redis-server package) is needed");
                nodes.children.push(child);
                wait("redis-server", || cli(port, &["PING"]) == "PONG");
            }
            cli(ports[0], &["CLUSTER", "ADDSLOTSRANGE", "0", "8191"]);
            cli(ports[1], &["CLUSTER", "ADDSLOTSRANGE", "8192", "16383"]);
            cli(
                ports[0],
                &["CLUSTER", "MEET", "127.0.0.1", &ports[1].to_string()],
            );
            for port in ports {
                wait("the cluster", || {
                    cli(port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                });
            }
            nodes
        }

        /// Hands the (empty) slot to the first node, as a failover or a resharding
        /// would: a client that read the slots before still sends it to the second.
        fn move_slot_to_first(&self, slot: u16) {
            let id = cli(self.ports[0], &["CLUSTER", "MYID"]);
            for port in self.ports {
                cli(
                    port,
                    &["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &id],
                );
            }
            for port in self.ports {
                wait("the slot's new owner", || {
                    cli(port, &["CLUSTER", "NODES"])
                        .lines()
                        .any(|l| l.starts_with(&id) && l.contains(&slot.to_string()))
                });
            }
        }
    }

    #[tokio::test]
    async fn a_transaction_refused_by_a_moved_slot_is_sent_again_where_the_slot_is_now() {
        let nodes = TwoNodes::start();
        let url = format!("redis://127.0.0.1:{}", nodes.ports[0]);
        let client = ClusterClient::builder(vec![url]).build().unwrap();
        // Two connections, each with its own map of the slots: `{rel}` on the second node.
        let key = "{rel}:running";
        let mut plain = client.get_async_connection().await.unwrap();
        let mut retried = client.get_async_connection().await.unwrap();
        let _: bool = plain.exists(key).await.unwrap();
        let _: bool = retried.exists(key).await.unwrap();
        nodes.move_slot_to_first(12189);

        let mut pipe = redis::pipe();
        pipe.atomic().sadd(key, 1).ignore().sadd(key, 2).ignore();
        // Sent as it is, the transaction is refused whole (the second node answers MOVED
        // to each command inside it): what CI once met after a failover.
        let refused = pipe.query_async::<()>(&mut plain).await;
        assert!(
            refused.as_ref().is_err_and(not_run),
            "expected a refused transaction, got {refused:?}"
        );
        transaction(&mut retried, &pipe, key).await.unwrap();
        let members: Vec<u64> = retried.smembers(key).await.unwrap();
        assert_eq!(members, [1, 2]);
    }
}
