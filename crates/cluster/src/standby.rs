//! Whether what the ledger acknowledges now is on a synchronous standby too, for
//! `/metrics`'s `hongbao_ledger_standby_sync` (docs/scale-out.md, "A standby and
//! failover"). Asked of the primary every `ASK_EVERY` over this host's reading
//! connection, which the multi-host URL's `target_session_attrs=read-write` keeps on the
//! primary, as the committer's.
//!
//! A commit is acknowledged only once a standby has it when the primary names standbys
//! in `synchronous_standby_names` and our session's `synchronous_commit` waits for them
//! (`on`, `remote_write`, `remote_apply`). pg_auto_failover empties the names when it
//! moves the primary to `wait_primary` (the standby down or behind: writes go on, on one
//! node), which is the moment an operator must hear of. Between the standby's loss and
//! that move the names still stand but no WAL sender does: commits wait, none is
//! acknowledged on one node, and the answer is already no. Both settings are any role's
//! to read. `pg_stat_replication` shows every role its WAL senders' rows, but their
//! `sync_state` only to members of `pg_read_all_stats` (`pg_monitor`): without it a
//! connected standby is taken to be a synchronous one, which is what the names say it
//! is; with it, a standby the names do not cover (`async`, `potential`) does not count.

use std::sync::Arc;
use std::time::Duration;

use hongbao_money::Error;
use tokio_postgres::Client;

use crate::pg::pg_error;
use crate::shared::Shared;
use crate::store::Store;

/// How often the primary is asked.
const ASK_EVERY: Duration = Duration::from_secs(5);
/// How long an answer may take: a frozen primary says nothing, and an answer that old is
/// no answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

const SYNC_NOW: &str = "SELECT current_setting('synchronous_standby_names') <> '' \
     AND current_setting('synchronous_commit') IN ('on', 'remote_write', 'remote_apply') \
     AND EXISTS (SELECT 1 FROM pg_stat_replication \
                 WHERE sync_state IS NULL OR sync_state IN ('sync', 'quorum'))";

/// The primary's answer on `client`: true when a commit acknowledged now is on a
/// synchronous standby too.
pub(crate) async fn sync_now(client: &Client) -> Result<bool, Error> {
    let row = client
        .query_one(SYNC_NOW, &[])
        .await
        .map_err(|e| pg_error("asking whether a standby is synchronous", e))?;
    Ok(row.get(0))
}

/// Asks every `ASK_EVERY` for as long as the host runs, and keeps the answer in
/// `shared` for the gateway's `/metrics`: none while it cannot be had.
pub(crate) async fn watch(store: Store, shared: Arc<Shared>) {
    let mut every = tokio::time::interval(ASK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut said: Option<bool> = None;
    loop {
        every.tick().await;
        // Every formation's primary (a sharded ledger): synchronous only when all are,
        // not when any one says not, unknown while any is silent.
        let answers = futures_util::future::join_all(store.shards().iter().map(|shard| async {
            let asked = async { sync_now(shard.pg().await?.as_ref()).await };
            match tokio::time::timeout(ASK_TIMEOUT, asked).await {
                Ok(Ok(sync)) => Some(sync),
                Ok(Err(e)) => {
                    tracing::debug!("asking the primary about its standby: {e}");
                    None
                }
                Err(_) => None,
            }
        }))
        .await;
        let answer = if answers.contains(&Some(false)) {
            Some(false)
        } else if answers.contains(&None) {
            None
        } else {
            Some(true)
        };
        if let Some(sync) = answer.filter(|&sync| said != Some(sync)) {
            match (said, sync) {
                (_, true) => tracing::info!("the ledger's commits are synchronous to a standby"),
                // Lost: what is acknowledged from now on is on one node only.
                (Some(true), false) => tracing::warn!(
                    "the ledger's commits are on the primary alone: its standby is not synchronous now"
                ),
                (_, false) => tracing::info!("the ledger's commits are not synchronous to a standby"),
            }
            said = Some(sync);
        }
        *shared.standby_sync.lock().unwrap() = answer;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::pg_connect;
    use crate::testpg::TestPg;
    use crate::PgTarget;

    fn target(port: u16, user: &str) -> PgTarget {
        PgTarget {
            url: format!("postgres://{user}@127.0.0.1:{port}/postgres?sslmode=disable"),
            ..PgTarget::default()
        }
    }

    /// Against a real primary and a real streaming standby, as a role without any
    /// privilege (the gateways'): no standby is no; names with no standby connected is
    /// no; a standby the names cover, connected, is yes (and the superuser's view agrees
    /// that it is `sync`); names emptied (pg_auto_failover's `wait_primary`) is no; the
    /// standby stopped is no.
    #[test]
    fn the_primary_says_whether_its_commits_wait_for_a_standby() {
        let Some(primary) = TestPg::start() else {
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let admin = pg_connect(&target(primary.port, "postgres")).await.unwrap();
            admin
                .batch_execute("CREATE ROLE gateway LOGIN")
                .await
                .unwrap();
            let gateway = pg_connect(&target(primary.port, "gateway")).await.unwrap();
            let names = |value: &'static str| {
                let admin = &admin;
                async move {
                    // Two statements: ALTER SYSTEM cannot run inside a multi-statement one.
                    admin
                        .batch_execute(&format!(
                            "ALTER SYSTEM SET synchronous_standby_names = '{value}'"
                        ))
                        .await
                        .unwrap();
                    admin
                        .batch_execute("SELECT pg_reload_conf()")
                        .await
                        .unwrap();
                    // A reload reaches every backend at its next command.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            };
            assert!(!sync_now(&gateway).await.unwrap(), "a lone primary");
            names("*").await;
            assert!(
                !sync_now(&gateway).await.unwrap(),
                "standbys named, none connected: commits wait, none is on a standby"
            );

            let standby = primary.standby();
            let streaming = async {
                loop {
                    let row = admin
                        .query_opt(
                            "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'",
                            &[],
                        )
                        .await
                        .unwrap();
                    // Streaming, a standby is `async` for a moment, until its walsender
                    // has read the names.
                    if let Some(state) = row.and_then(|r| r.get::<_, Option<String>>(0)) {
                        if state == "sync" {
                            return state;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            let state = tokio::time::timeout(Duration::from_secs(30), streaming)
                .await
                .expect("the standby streams, synchronous, within 30 s");
            assert_eq!(
                state, "sync",
                "the superuser sees the standby as synchronous"
            );
            assert!(sync_now(&gateway).await.unwrap(), "a synchronous standby");
            let hidden: i64 = gateway
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(
                hidden, 1,
                "the gateway's role sees the WAL sender, not its state"
            );

            names("").await;
            assert!(
                !sync_now(&gateway).await.unwrap(),
                "names emptied (wait_primary): commits on one node"
            );
            names("*").await;
            assert!(sync_now(&gateway).await.unwrap(), "named again");

            drop(standby);
            let gone = async {
                while sync_now(&gateway).await.unwrap() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), gone)
                .await
                .expect("the standby stopped is no within 10 s");
        });
    }
}
