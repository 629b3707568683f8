//! The embedded ledger's half of access: admin keys and the admin log, in two tables of
//! the ledger's own SQLite file, written through a connection of their own beside the
//! ledger writer (synchronous=FULL: an entry is on disk before the request it records is
//! answered). `hongbao admin-key` opens the same file while the server runs; SQLite's
//! lock makes their writes take turns, a few milliseconds each.

use std::path::Path;
use std::sync::Mutex;

use hongbao_money::access::{
    is_refusal, logged_body, AccessStore, KeyRecord, LogEntry, Revocation, Role, MAX_REFUSED_KEPT,
};
use hongbao_money::error::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS admin_keys (
    name       TEXT PRIMARY KEY,
    role       TEXT NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL,
    created_by TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS admin_log (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms   INTEGER NOT NULL,
    key     TEXT,
    role    TEXT,
    source  TEXT NOT NULL,
    method  TEXT NOT NULL,
    path    TEXT NOT NULL,
    body    TEXT NOT NULL,
    status  INTEGER NOT NULL,
    result  TEXT NOT NULL,
    refused INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS admin_log_refused ON admin_log (refused, id);
CREATE TABLE IF NOT EXISTS revocations (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    by      TEXT NOT NULL
);
";

/// Refused entries are trimmed to `MAX_REFUSED_KEPT` every this many of them.
const TRIM_EVERY: u64 = 100;

pub struct SqliteAccess {
    conn: Mutex<Connection>,
}

fn sqlite(doing: &'static str) -> impl Fn(rusqlite::Error) -> Error {
    move |e| Error::unavailable(format!("SQLite, {doing}"), e)
}

impl SqliteAccess {
    /// Opens (creating if needed) `DIR/ledger.sqlite` and its access tables.
    pub fn open(dir: &Path) -> Result<SqliteAccess> {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::refused(format!(
                "creating the data directory {}: {e}",
                dir.display()
            ))
        })?;
        let conn = Connection::open(dir.join("ledger.sqlite")).map_err(sqlite("opening"))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sqlite("WAL"))?;
        crate::ledger::keep_wal(&conn);
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sqlite("sync"))?;
        conn.execute_batch(SCHEMA)
            .map_err(sqlite("creating the access tables"))?;
        Ok(SqliteAccess {
            conn: Mutex::new(conn),
        })
    }
}

fn role_of(text: &str) -> Result<Role> {
    text.parse()
        .map_err(|e: hongbao_money::access::UnknownRole| {
            Error::bug(format!("admin_keys holds an unknown role: {e}"))
        })
}

impl AccessStore for SqliteAccess {
    fn keys(&self) -> Result<Vec<KeyRecord>> {
        let conn = self.conn.lock().expect("the access connection");
        let mut stmt = conn
            .prepare(
                "SELECT name, role, hash, created_ms, created_by FROM admin_keys ORDER BY name",
            )
            .map_err(sqlite("reading keys"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, String>(4)?,
                ))
            })
            .map_err(sqlite("reading keys"))?;
        let mut keys = Vec::new();
        for row in rows {
            let (name, role, hash, created_ms, created_by) = row.map_err(sqlite("reading keys"))?;
            keys.push(KeyRecord {
                name,
                role: role_of(&role)?,
                hash,
                created_ms: created_ms as u64,
                created_by,
            });
        }
        Ok(keys)
    }

    fn add_key(&self, key: &KeyRecord) -> Result<()> {
        let conn = self.conn.lock().expect("the access connection");
        let taken: Option<String> = conn
            .query_row(
                "SELECT name FROM admin_keys WHERE name = ?1",
                [&key.name],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite("adding a key"))?;
        if taken.is_some() {
            return Err(Error::refused(format!(
                "a key named {:?} exists; remove it first",
                key.name
            )));
        }
        conn.execute(
            "INSERT INTO admin_keys (name, role, hash, created_ms, created_by) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![key.name, key.role.name(), key.hash, key.created_ms as i64, key.created_by],
        )
        .map_err(sqlite("adding a key"))?;
        Ok(())
    }

    fn remove_key(&self, name: &str) -> Result<bool> {
        let conn = self.conn.lock().expect("the access connection");
        let n = conn
            .execute("DELETE FROM admin_keys WHERE name = ?1", [name])
            .map_err(sqlite("removing a key"))?;
        Ok(n > 0)
    }

    fn record(&self, e: &LogEntry) -> Result<u64> {
        let conn = self.conn.lock().expect("the access connection");
        let refused = is_refusal(e.status);
        conn.execute(
            "INSERT INTO admin_log (at_ms, key, role, source, method, path, body, status, result, refused)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                e.at_ms as i64,
                e.key,
                e.role.map(Role::name),
                e.source,
                e.method,
                e.path,
                logged_body(&e.body),
                e.status,
                e.result,
                refused
            ],
        )
        .map_err(sqlite("writing the admin log"))?;
        let id = conn.last_insert_rowid() as u64;
        if refused && id.is_multiple_of(TRIM_EVERY) {
            conn.execute(
                "DELETE FROM admin_log WHERE refused = 1 AND id <= (
                     SELECT id FROM admin_log WHERE refused = 1 ORDER BY id DESC LIMIT 1 OFFSET ?1)",
                [MAX_REFUSED_KEPT as i64],
            )
            .map_err(sqlite("trimming the admin log"))?;
        }
        Ok(id)
    }

    fn log(&self, before: Option<u64>, limit: usize) -> Result<Vec<LogEntry>> {
        let conn = self.conn.lock().expect("the access connection");
        let mut stmt = conn
            .prepare(
                "SELECT id, at_ms, key, role, source, method, path, body, status, result
                 FROM admin_log WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
            )
            .map_err(sqlite("reading the admin log"))?;
        let before = before.map_or(i64::MAX, |b| b as i64);
        let rows = stmt
            .query_map(params![before, limit as i64], |r| {
                Ok((
                    LogEntry {
                        id: r.get::<_, i64>(0)? as u64,
                        at_ms: r.get::<_, i64>(1)? as u64,
                        key: r.get(2)?,
                        role: None,
                        source: r.get(4)?,
                        method: r.get(5)?,
                        path: r.get(6)?,
                        body: r.get(7)?,
                        status: r.get(8)?,
                        result: r.get(9)?,
                    },
                    r.get::<_, Option<String>>(3)?,
                ))
            })
            .map_err(sqlite("reading the admin log"))?;
        let mut entries = Vec::new();
        for row in rows {
            let (mut entry, role) = row.map_err(sqlite("reading the admin log"))?;
            entry.role = role.as_deref().map(role_of).transpose()?;
            entries.push(entry);
        }
        Ok(entries)
    }

    fn revoke(&self, r: &Revocation) -> Result<u64> {
        let conn = self.conn.lock().expect("the access connection");
        conn.execute(
            "INSERT INTO revocations (user_id, at, by) VALUES (?1, ?2, ?3)",
            params![r.user as i64, r.at as i64, r.by],
        )
        .map_err(sqlite("writing a revocation"))?;
        Ok(conn.last_insert_rowid() as u64)
    }

    fn revocations(&self, after: u64, since: u64) -> Result<Vec<Revocation>> {
        let conn = self.conn.lock().expect("the access connection");
        let mut stmt = conn
            .prepare(
                "SELECT id, user_id, at, by FROM revocations WHERE id > ?1 AND at >= ?2 ORDER BY id",
            )
            .map_err(sqlite("reading revocations"))?;
        let rows = stmt
            .query_map(params![after as i64, since as i64], |r| {
                Ok(Revocation {
                    id: r.get::<_, i64>(0)? as u64,
                    user: r.get::<_, i64>(1)? as u64,
                    at: r.get::<_, i64>(2)? as u64,
                    by: r.get(3)?,
                })
            })
            .map_err(sqlite("reading revocations"))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(sqlite("reading revocations"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hongbao_money::access::MAX_LOGGED_BODY;

    fn entry(status: u16) -> LogEntry {
        LogEntry {
            at_ms: 1,
            source: "127.0.0.1:9".into(),
            method: "POST".into(),
            path: "/v1/broadcast".into(),
            body: "é".repeat(MAX_LOGGED_BODY),
            status,
            result: "ok".into(),
            ..Default::default()
        }
    }

    #[test]
    fn keys_and_the_log_survive_a_reopen_and_refusals_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteAccess::open(dir.path()).unwrap();
        let key = KeyRecord {
            name: "ops".into(),
            role: Role::Operator,
            hash: "ab".repeat(32),
            created_ms: 5,
            created_by: "cli".into(),
        };
        store.add_key(&key).unwrap();
        let again = store.add_key(&key).unwrap_err();
        assert_eq!(again.kind(), hongbao_money::ErrorKind::Refused);
        let first = store.record(&entry(201)).unwrap();
        for _ in 0..(MAX_REFUSED_KEPT + 2 * TRIM_EVERY) {
            store.record(&entry(401)).unwrap();
        }
        drop(store);
        let store = SqliteAccess::open(dir.path()).unwrap();
        assert_eq!(store.keys().unwrap(), vec![key]);
        let all = store.log(None, 100_000).unwrap();
        let refused = all.iter().filter(|e| e.status == 401).count() as u64;
        assert!(
            (MAX_REFUSED_KEPT..MAX_REFUSED_KEPT + TRIM_EVERY).contains(&refused),
            "{refused}"
        );
        let kept = all.last().unwrap();
        assert_eq!(
            (kept.id, kept.status),
            (first, 201),
            "a change is never trimmed"
        );
        assert!(kept.body.len() <= MAX_LOGGED_BODY);
        // Paged newest first.
        let page = store.log(None, 2).unwrap();
        assert!(page[0].id > page[1].id);
        let next = store.log(Some(page[1].id), 1).unwrap();
        assert!(next[0].id < page[1].id);
        assert!(store.remove_key("ops").unwrap());
        assert!(!store.remove_key("ops").unwrap());
        assert!(store.keys().unwrap().is_empty());
    }
}
