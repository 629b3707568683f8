//! Upgrading cluster mode one gateway at a time (expand, then contract): the schema
//! carries a version, each host records the one it runs, and a release only *adds* —
//! new tables, new columns, new functions under new names or signatures — while any host
//! of the version before it is alive; what only older versions need is dropped
//! (`contract.sql`) by the first start that finds no live host older than itself.
//!
//! At start, under the schema lock, after `schema.sql` (the expand, idempotent): the
//! hosts alive in Redis (`{rel}:hosts`, heard from in the last `HOST_DEAD_AFTER_MS`) other
//! than this one, each with the version it recorded (`hb_host_versions`; none recorded:
//! a release from before versions, `UNRECORDED`), decide (`plan`):
//!
//! - a live host more than one version from this binary's, or a schema already contracted
//!   past this binary by a newer release: refused at start, naming it — two consecutive
//!   versions run side by side, no more;
//! - any live host older than this one: its needs are kept;
//! - none: contracted to this version (once).
//!
//! Then this host's version is recorded under its name.

use hongbao_money::Error;

use crate::pg::pg_error;

/// The schema version this binary runs. 2: the first release that records it (every
/// release before counts as 1).
pub const SCHEMA_VERSION: u32 = 2;

/// The version of a live host that recorded none: a release from before versions.
pub const UNRECORDED: u32 = 1;

/// What only versions older than `SCHEMA_VERSION` need, dropped once none is alive.
const CONTRACT: &str = include_str!("contract.sql");

/// What a start does to the schema, once it may run beside the hosts alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No live host is older: drop what only older versions need (if not done yet).
    Contract,
    /// A live host is older (the oldest named): keep what it needs.
    Keep { host: String, version: u32 },
}

/// Why a start may not run beside the schema or the hosts alive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "the schema was contracted to version {contracted} by a newer release, dropping \
         what this binary (schema version {ours}) calls: run the newer release"
    )]
    Contracted { contracted: u32, ours: u32 },
    #[error(
        "gateway host {host} runs schema version {theirs}; this binary (version {ours}) runs \
         beside versions {} to {} only: upgrade one version at a time",
        ours.saturating_sub(1).max(1),
        ours + 1
    )]
    TooFarApart {
        host: String,
        theirs: u32,
        ours: u32,
    },
}

/// The rule, without I/O: this binary runs version `ours`; the schema was contracted to
/// `contracted` (1: never); `live` are the other hosts alive with their versions.
pub fn plan(ours: u32, contracted: u32, live: &[(String, u32)]) -> Result<Plan, Refused> {
    if contracted > ours {
        return Err(Refused::Contracted { contracted, ours });
    }
    if let Some((host, v)) = live
        .iter()
        .find(|(_, v)| v.saturating_add(1) < ours || *v > ours.saturating_add(1))
    {
        return Err(Refused::TooFarApart {
            host: host.clone(),
            theirs: *v,
            ours,
        });
    }
    match live
        .iter()
        .filter(|(_, v)| *v < ours)
        .min_by_key(|(_, v)| *v)
    {
        Some((host, version)) => Ok(Plan::Keep {
            host: host.clone(),
            version: *version,
        }),
        None => Ok(Plan::Contract),
    }
}

/// The start's step, on `pg` under the schema lock, after the expand: `live` are the
/// host names Redis has heard from lately (this host's own among them or not).
pub(crate) async fn apply(
    pg: &tokio_postgres::Client,
    host: &str,
    live: &[String],
    now_ms: u64,
) -> Result<Plan, Error> {
    let contracted: i32 = pg
        .query_one(
            "SELECT coalesce(max(version), 1) FROM hb_schema_contracted",
            &[],
        )
        .await
        .map_err(|e| pg_error("reading the schema's version", e))?
        .get(0);
    let others: Vec<String> = live.iter().filter(|h| *h != host).cloned().collect();
    let recorded = pg
        .query(
            "SELECT host, version FROM hb_host_versions WHERE host = ANY($1)",
            &[&others],
        )
        .await
        .map_err(|e| pg_error("reading the hosts' versions", e))?;
    let versions: Vec<(String, u32)> = others
        .iter()
        .map(|h| {
            let v = recorded
                .iter()
                .find(|r| r.get::<_, String>(0) == *h)
                .map_or(UNRECORDED, |r| r.get::<_, i32>(1) as u32);
            (h.clone(), v)
        })
        .collect();
    let plan = plan(SCHEMA_VERSION, contracted as u32, &versions)
        .map_err(|e| Error::refused(e.to_string()))?;
    pg.execute(
        "INSERT INTO hb_host_versions (host, version, started_ms) VALUES ($1, $2, $3) \
         ON CONFLICT (host) DO UPDATE SET version = excluded.version, started_ms = excluded.started_ms",
        &[&host, &(SCHEMA_VERSION as i32), &(now_ms as i64)],
    )
    .await
    .map_err(|e| pg_error("recording this host's version", e))?;
    match &plan {
        Plan::Contract if (contracted as u32) < SCHEMA_VERSION => {
            pg.batch_execute(CONTRACT)
                .await
                .map_err(|e| pg_error("dropping what older versions needed", e))?;
            pg.execute(
                "INSERT INTO hb_schema_contracted (version, at_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&(SCHEMA_VERSION as i32), &(now_ms as i64)],
            )
            .await
            .map_err(|e| pg_error("recording the contract", e))?;
            tracing::info!(
                version = SCHEMA_VERSION,
                "schema: no older gateway alive; what older versions needed is dropped"
            );
        }
        Plan::Contract => {}
        Plan::Keep { host, version } => tracing::info!(
            version = SCHEMA_VERSION,
            older_host = %host,
            older_version = version,
            "schema: an older gateway is alive; what it needs is kept"
        ),
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(v: &[(&str, u32)]) -> Vec<(String, u32)> {
        v.iter().map(|(h, n)| (h.to_string(), *n)).collect()
    }

    #[test]
    fn alone_or_beside_its_own_version_it_contracts() {
        assert_eq!(plan(2, 1, &[]), Ok(Plan::Contract));
        assert_eq!(plan(2, 2, &hosts(&[("gw1", 2)])), Ok(Plan::Contract));
        // Beside a newer host (the rollback of one gateway): nothing older to keep.
        assert_eq!(plan(2, 2, &hosts(&[("gw1", 3)])), Ok(Plan::Contract));
    }

    #[test]
    fn beside_the_version_before_it_keeps_what_that_needs() {
        assert_eq!(
            plan(3, 2, &hosts(&[("gw1", 3), ("gw2", 2), ("gw3", 2)])),
            Ok(Plan::Keep {
                host: "gw2".into(),
                version: 2
            })
        );
        // A release from before versions is version 1.
        assert_eq!(
            plan(2, 1, &hosts(&[("gw1", UNRECORDED)])),
            Ok(Plan::Keep {
                host: "gw1".into(),
                version: 1
            })
        );
    }

    #[test]
    fn more_than_one_version_apart_is_refused_naming_the_host() {
        let e = plan(4, 2, &hosts(&[("gw1", 4), ("gw2", 2)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("gw2") && e.contains("version 2"), "{e}");
        let e = plan(2, 1, &hosts(&[("gw9", 4)])).unwrap_err().to_string();
        assert!(e.contains("gw9"), "{e}");
        // Contracted by a newer release: what this one calls may be gone.
        let e = plan(2, 3, &[]).unwrap_err().to_string();
        assert!(e.contains("contracted to version 3"), "{e}");
    }

    /// The step against a real PostgreSQL: the schema laid out as a release from before
    /// versions left it (an old signature present), a live host that recorded nothing
    /// keeps it; alone, the start drops it once and records the contract; a live host
    /// three versions away is refused, and the refused start records nothing.
    #[tokio::test]
    async fn a_real_schema_is_kept_for_an_older_host_and_contracted_once_alone() {
        let Some(pg) = crate::testpg::TestPg::start() else {
            return;
        };
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            pg.port
        );
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client.batch_execute(crate::store::SCHEMA).await.unwrap();
        client
            .batch_execute(
                "CREATE FUNCTION hb_open(bigint, bigint, bigint, text) RETURNS integer \
                 LANGUAGE sql AS 'SELECT 1'",
            )
            .await
            .unwrap();
        let old_open = || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_proc WHERE proname = 'hb_open' \
                     AND pronargs = 4",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        };
        let contracted = || async {
            client
                .query_one("SELECT count(*) FROM hb_schema_contracted", &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
        };

        let live = vec!["gw1".to_string(), "gw2".to_string()];
        let kept = apply(&client, "gw2", &live, 1_000).await.unwrap();
        assert_eq!(
            kept,
            Plan::Keep {
                host: "gw1".into(),
                version: UNRECORDED
            }
        );
        assert_eq!(old_open().await, 1, "kept for gw1, which calls it");
        assert_eq!(contracted().await, 0);

        // gw1 gone (upgraded): the next start finds only itself and gw2, both version 2.
        let alone = apply(&client, "gw1", &live, 2_000).await.unwrap();
        assert_eq!(alone, Plan::Contract);
        assert_eq!(old_open().await, 0, "dropped once no older host is alive");
        assert_eq!(contracted().await, 1);
        assert_eq!(
            apply(&client, "gw2", &live, 3_000).await.unwrap(),
            Plan::Contract
        );
        assert_eq!(contracted().await, 1, "contracted once");
        let versions: Vec<(String, i32)> = client
            .query(
                "SELECT host, version FROM hb_host_versions ORDER BY host",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            versions,
            vec![
                ("gw1".into(), SCHEMA_VERSION as i32),
                ("gw2".into(), SCHEMA_VERSION as i32)
            ]
        );

        client
            .execute(
                "INSERT INTO hb_host_versions VALUES ('gw9', $1, 0)",
                &[&(SCHEMA_VERSION as i32 + 3)],
            )
            .await
            .unwrap();
        let live = vec!["gw9".to_string()];
        let refused = apply(&client, "gw3", &live, 4_000).await.unwrap_err();
        assert!(refused.to_string().contains("gw9"), "{refused}");
        let recorded: i64 = client
            .query_one(
                "SELECT count(*) FROM hb_host_versions WHERE host = 'gw3'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(recorded, 0, "a refused start records nothing");
    }
}
