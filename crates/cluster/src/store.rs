//! The connections to both engines, shared by every task of this host: PostgreSQL (the
//! ledger; its schema, `schema.sql`, created on connect) and the Redis Cluster (its
//! scripts, and the pushes of this host's channel). What is done over them lives with
//! its job: `release`, `gate`, `delivery`, `ledger`, `campaign`, `admin`, `committer`.

use std::sync::{Arc, Mutex};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, Script};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_postgres::{Client, NoTls};

use crate::mesh::channel;
use crate::ClusterConfig;

const SCHEMA: &str = include_str!("schema.sql");
pub(crate) const RELEASE: &str = include_str!("release.lua");
pub(crate) const RESTORE: &str = include_str!("restore.lua");
const GATE: &str = include_str!("gate.lua");
/// The advisory lock under which a host creates the schema.
const SCHEMA_LOCK: i64 = 0x6862_5f73_6368;

/// Both engines' connections, cheap to clone: every task of this host holds one.
#[derive(Clone)]
pub struct Store(pub(crate) Arc<Inner>);

/// Fields another file's `impl Store` needs are `pub(crate)`: each job's Redis and
/// PostgreSQL calls live in a file of their own.
pub(crate) struct Inner {
    postgres: String,
    read: Mutex<Arc<Client>>,
    /// The cluster connection for commands (replaced when it stops answering), the one
    /// subscribed to this host's channel (never sent a command, so a push is never read
    /// as a command's reply: seen once, an `sunsubscribe` push taken for a release's
    /// answer), and the client that makes new ones (pushes of every connection go to
    /// the same sender).
    pub(crate) redis: Mutex<ClusterConnection>,
    pub(crate) subscribed: Mutex<ClusterConnection>,
    pub(crate) redis_client: ClusterClient,
    pushes: Mutex<Option<UnboundedReceiver<String>>>,
    /// The next packet id and the end of this host's block.
    pub(crate) ids: tokio::sync::Mutex<(u64, u64)>,
    pub(crate) release: Script,
    /// Packets given whose removal from this host's held set failed; the next release
    /// call removes them.
    pub(crate) ungiven: Mutex<Vec<String>>,
    pub(crate) restore: Script,
    pub(crate) gate: Script,
}

pub(crate) fn pg_error(what: &str, e: impl std::borrow::Borrow<tokio_postgres::Error>) -> String {
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

pub(crate) async fn pg_connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| pg_error("connecting", e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            say!("PostgreSQL connection ended: {e}");
        }
    });
    Ok(client)
}

pub(crate) fn i64s(v: &[u64]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
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
        let redis = client
            .get_async_connection()
            .await
            .map_err(|e| format!("Redis Cluster {:?}: {e}", cfg.redis))?;
        let mut subscribed = client
            .get_async_connection()
            .await
            .map_err(|e| format!("Redis Cluster {:?}: {e}", cfg.redis))?;
        subscribed
            .ssubscribe(channel(&cfg.host))
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
            subscribed: Mutex::new(subscribed),
            redis_client: client,
            pushes: Mutex::new(Some(rx)),
            ids: tokio::sync::Mutex::new((0, 0)),
            release: Script::new(RELEASE),
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

    /// The reading connection, opened again if it was lost (PostgreSQL restarted).
    pub(crate) async fn pg(&self) -> Result<Arc<Client>, String> {
        let current = self.0.read.lock().unwrap().clone();
        if !current.is_closed() {
            return Ok(current);
        }
        let fresh = Arc::new(pg_connect(&self.0.postgres).await?);
        *self.0.read.lock().unwrap() = fresh.clone();
        Ok(fresh)
    }
}
