//! Cluster mode's half of access: admin keys and the admin log in PostgreSQL beside the
//! ledger (`hb_admin_keys`, `hb_admin_log`), so a key added on one host works on every
//! host — each host reads the keys again at least once a second — and one log holds
//! what every host was asked.
//!
//! Called from the admin API's threads (and `hongbao admin-key`), not from the host's
//! loop: its own connection, on a small runtime of its own, so that a slow admin read
//! never holds up a commit. A lost connection is made again on the next call.

use std::sync::{Arc, Mutex};

use hongbao_money::access::{
    is_refusal, logged_body, AccessStore, KeyRecord, LogEntry, Revocation, Role, MAX_REFUSED_KEPT,
};
use hongbao_money::error::{Error, Result};
use tokio_postgres::Client;

use crate::connect::pg_connect;
use crate::pg::pg_error;
use crate::PgTarget;

/// How long one call may wait on PostgreSQL.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS hb_admin_keys (
    name       text PRIMARY KEY,
    role       text NOT NULL,
    hash       text NOT NULL UNIQUE,
    created_ms bigint NOT NULL,
    created_by text NOT NULL
);
CREATE TABLE IF NOT EXISTS hb_admin_log (
    id      bigserial PRIMARY KEY,
    at_ms   bigint NOT NULL,
    key     text,
    role    text,
    source  text NOT NULL,
    method  text NOT NULL,
    path    text NOT NULL,
    body    text NOT NULL,
    status  integer NOT NULL,
    result  text NOT NULL,
    refused boolean NOT NULL
);
CREATE INDEX IF NOT EXISTS hb_admin_log_refused ON hb_admin_log (refused, id);
CREATE TABLE IF NOT EXISTS hb_revocations (
    id      bigserial PRIMARY KEY,
    user_id bigint NOT NULL,
    at      bigint NOT NULL,
    by      text NOT NULL
);
";

/// Refused entries are trimmed to `MAX_REFUSED_KEPT` every this many of them.
const TRIM_EVERY: u64 = 100;

pub struct PgAccess {
    target: PgTarget,
    runtime: tokio::runtime::Runtime,
    client: Mutex<Option<Arc<Client>>>,
}

impl PgAccess {
    /// Connects to the ledger at `target` and makes the access tables if they are not
    /// there.
    pub fn connect(target: &PgTarget) -> Result<PgAccess> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::unavailable("starting a runtime for PostgreSQL", e))?;
        let access = PgAccess {
            target: target.clone(),
            runtime,
            client: Mutex::new(None),
        };
        access.with(|pg| async move {
            pg.batch_execute(SCHEMA)
                .await
                .map_err(|e| pg_error("creating the access tables", e))
        })?;
        Ok(access)
    }

    /// Runs `f` with a connection (made again if the last one was lost), within
    /// [`DEADLINE`]: past it (a frozen primary answers nothing) the connection is dropped,
    /// to be made again — to the new primary — at the next call.
    fn with<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut held = self.client.lock().expect("the access connection");
        let done = self.runtime.block_on(async {
            tokio::time::timeout(DEADLINE, async {
                let client = match held.as_ref().filter(|c| !c.is_closed()) {
                    Some(c) => c.clone(),
                    None => {
                        let c = Arc::new(pg_connect(&self.target).await?);
                        *held = Some(c.clone());
                        c
                    }
                };
                f(client).await
            })
            .await
        });
        done.unwrap_or_else(|_| {
            *held = None;
            Err(Error::unavailable(
                "PostgreSQL, admin keys and log",
                format!("no answer in {} s", DEADLINE.as_secs()),
            ))
        })
    }
}

fn role_of(text: &str) -> Result<Role> {
    text.parse()
        .map_err(|e: hongbao_money::access::UnknownRole| {
            Error::bug(format!("hb_admin_keys holds an unknown role: {e}"))
        })
}

impl AccessStore for PgAccess {
    fn keys(&self) -> Result<Vec<KeyRecord>> {
        self.with(|pg| async move {
            let rows = pg
                .query(
                    "SELECT name, role, hash, created_ms, created_by FROM hb_admin_keys ORDER BY name",
                    &[],
                )
                .await
                .map_err(|e| pg_error("reading the admin keys", e))?;
            rows.iter()
                .map(|r| {
                    Ok(KeyRecord {
                        name: r.get(0),
                        role: role_of(r.get(1))?,
                        hash: r.get(2),
                        created_ms: r.get::<_, i64>(3) as u64,
                        created_by: r.get(4),
                    })
                })
                .collect()
        })
    }

    fn add_key(&self, key: &KeyRecord) -> Result<()> {
        let key = key.clone();
        self.with(|pg| async move {
            let n = pg
                .execute(
                    "INSERT INTO hb_admin_keys (name, role, hash, created_ms, created_by) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
                    &[
                        &key.name,
                        &key.role.name(),
                        &key.hash,
                        &(key.created_ms as i64),
                        &key.created_by,
                    ],
                )
                .await
                .map_err(|e| pg_error("adding an admin key", e))?;
            if n == 0 {
                return Err(Error::refused(format!(
                    "a key named {:?} exists; remove it first",
                    key.name
                )));
            }
            Ok(())
        })
    }

    fn remove_key(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.with(|pg| async move {
            let n = pg
                .execute("DELETE FROM hb_admin_keys WHERE name = $1", &[&name])
                .await
                .map_err(|e| pg_error("removing an admin key", e))?;
            Ok(n > 0)
        })
    }

    fn record(&self, e: &LogEntry) -> Result<u64> {
        let e = e.clone();
        self.with(|pg| async move {
            let refused = is_refusal(e.status);
            let body = logged_body(&e.body);
            let row = pg
                .query_one(
                    "INSERT INTO hb_admin_log (at_ms, key, role, source, method, path, body, status, result, refused) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
                    &[
                        &(e.at_ms as i64),
                        &e.key,
                        &e.role.map(Role::name),
                        &e.source,
                        &e.method,
                        &e.path,
                        &body,
                        &(e.status as i32),
                        &e.result,
                        &refused,
                    ],
                )
                .await
                .map_err(|e| pg_error("writing the admin log", e))?;
            let id = row.get::<_, i64>(0) as u64;
            if refused && id.is_multiple_of(TRIM_EVERY) {
                pg.execute(
                    "DELETE FROM hb_admin_log WHERE refused AND id <= \
                     (SELECT id FROM hb_admin_log WHERE refused ORDER BY id DESC LIMIT 1 OFFSET $1)",
                    &[&(MAX_REFUSED_KEPT as i64)],
                )
                .await
                .map_err(|e| pg_error("trimming the admin log", e))?;
            }
            Ok(id)
        })
    }

    fn log(&self, before: Option<u64>, limit: usize) -> Result<Vec<LogEntry>> {
        self.with(|pg| async move {
            let before = before.map_or(i64::MAX, |b| b as i64);
            let rows = pg
                .query(
                    "SELECT id, at_ms, key, role, source, method, path, body, status, result \
                     FROM hb_admin_log WHERE id < $1 ORDER BY id DESC LIMIT $2",
                    &[&before, &(limit as i64)],
                )
                .await
                .map_err(|e| pg_error("reading the admin log", e))?;
            rows.iter()
                .map(|r| {
                    Ok(LogEntry {
                        id: r.get::<_, i64>(0) as u64,
                        at_ms: r.get::<_, i64>(1) as u64,
                        key: r.get(2),
                        role: r.get::<_, Option<&str>>(3).map(role_of).transpose()?,
                        source: r.get(4),
                        method: r.get(5),
                        path: r.get(6),
                        body: r.get(7),
                        status: r.get::<_, i32>(8) as u16,
                        result: r.get(9),
                    })
                })
                .collect()
        })
    }

    fn revoke(&self, r: &Revocation) -> Result<u64> {
        let r = r.clone();
        self.with(|pg| async move {
            let row = pg
                .query_one(
                    "INSERT INTO hb_revocations (user_id, at, by) VALUES ($1, $2, $3) RETURNING id",
                    &[&(r.user as i64), &(r.at as i64), &r.by],
                )
                .await
                .map_err(|e| pg_error("writing a revocation", e))?;
            Ok(row.get::<_, i64>(0) as u64)
        })
    }

    fn revocations(&self, after: u64, since: u64) -> Result<Vec<Revocation>> {
        self.with(|pg| async move {
            let rows = pg
                .query(
                    "SELECT id, user_id, at, by FROM hb_revocations \
                     WHERE id > $1 AND at >= $2 ORDER BY id",
                    &[&(after as i64), &(since as i64)],
                )
                .await
                .map_err(|e| pg_error("reading revocations", e))?;
            Ok(rows
                .iter()
                .map(|r| Revocation {
                    id: r.get::<_, i64>(0) as u64,
                    user: r.get::<_, i64>(1) as u64,
                    at: r.get::<_, i64>(2) as u64,
                    by: r.get(3),
                })
                .collect())
        })
    }
}
