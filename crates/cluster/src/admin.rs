//! Operators' requests: creating a campaign (in the ledger first, then in Redis for its
//! release), a campaign's status or all of them, and the audit. Each is answered off the
//! host's loop, from the ledger and Redis.

use hongbao_money::event::Event;
use hongbao_money::seam::{AdminAnswer, AdminRequest};
use hongbao_money::Error;

use crate::campaign::CampaignRow;
use crate::pg::pg_error;
use crate::release::release_fields;
use crate::store::Store;
use crate::tags::release_tag;

/// An operator's request, answered from the ledger (and Redis for what is released).
pub async fn admin(store: &Store, host: &str, request: AdminRequest) -> AdminAnswer {
    let answer = match request {
        AdminRequest::CreateShake { request: req, by } => match req.check() {
            Err(why) => return AdminAnswer::Refused(why.to_string()),
            Ok(()) => {
                let seed: u64 = rand::random();
                let minted = (0..req.packets)
                    .map(|i| {
                        hongbao_money::event::shake_amount(seed, i, req.amount_min, req.amount_max)
                    })
                    .sum();
                create(
                    store,
                    host,
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
                        created_by: Some(by),
                    },
                )
                .await
            }
        },
        AdminRequest::CreateSend { request: req, by } => match req.check() {
            Err(why) => return AdminAnswer::Refused(why.to_string()),
            Ok(()) => {
                create(
                    store,
                    host,
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
                        created_by: Some(by),
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

/// A campaign: in the ledger first (with what it mints, and its event, as the embedded
/// ledger logs it, so that the money minted can be read from the events alone), then in
/// Redis for release.
async fn create(store: &Store, host: &str, c: CampaignRow) -> Result<AdminAnswer, Error> {
    if let Some(why) = older_host(store).await? {
        return Ok(AdminAnswer::Refused(why));
    }
    store
        .bounded(0, "making a campaign", create_in_ledger(store, host, c))
        .await
}

/// Under a grown map (this host's version newer than the first), a campaign's packets
/// spread over formations an older host does not have: while a live host runs an older
/// version (or a build from before versions were recorded), why the campaign waits.
async fn older_host(store: &Store) -> Result<Option<String>, Error> {
    let map = store.map();
    if map.campaign_bits() == 0 {
        return Ok(None);
    }
    let live = store.live_hosts().await;
    let pg = store.pg().await?;
    let rows = pg
        .query(
            "SELECT host, version FROM hb_host_maps WHERE host = ANY($1)",
            &[&live],
        )
        .await
        .map_err(|e| pg_error("reading the hosts' shard maps", e))?;
    let on: std::collections::HashMap<String, i32> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok(live.iter().find_map(|h| {
        let version = on.get(h).copied().unwrap_or(0);
        (version < map.version as i32).then(|| {
            format!(
                "no campaign started: gateway host {h} runs shard map version {}, this host \
                 version {v}; a campaign numbered under version {v} puts packets on \
                 formations {h} does not have: restart every host on version {v} first \
                 (docs/scale-out.md, \"Growing\")",
                if version == 0 {
                    "(none recorded)".to_string()
                } else {
                    version.to_string()
                },
                v = map.version,
            )
        })
    }))
}

async fn create_in_ledger(
    store: &Store,
    host: &str,
    mut c: CampaignRow,
) -> Result<AdminAnswer, Error> {
    let pg = store.pg().await?;
    c.started_ms = hongbao_sys::clock::unix_ms();
    // Its id is the row's: filled in by the same statement.
    let event = if c.send {
        Event::SendCampaign {
            campaign: 0,
            packets: c.packets,
            rate_per_sec: c.rate,
            recipients: c.recipients,
            user_min: c.user_min,
            user_max: c.user_max,
            amount_min: c.amount_min,
            amount_max: c.amount_max,
            by: c.created_by.clone(),
        }
    } else {
        Event::ShakeCampaign {
            campaign: 0,
            packets: c.packets,
            rate_per_sec: c.rate,
            amount_min: c.amount_min,
            amount_max: c.amount_max,
            seed: c.seed,
            minted_cents: c.minted,
            by: c.created_by.clone(),
        }
    };
    let body = serde_json::to_value(event).expect("serializable");
    let turn = store.chain_turn(0).await;
    let row = pg
        .query_one(
            "WITH c AS (INSERT INTO hb_campaigns (id, kind, packets, rate, amount_min, amount_max, recipients, user_min, user_max, seed, minted, started_ms, created_by) \
                   VALUES (nextval('hb_campaign_ids') | $15, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $14) RETURNING id), \
             e AS (INSERT INTO hb_events (at_ms, host, user_id, body) \
                   SELECT $11, $12, NULL, jsonb_set($13::jsonb, '{campaign}', to_jsonb(c.id)) FROM c) \
             SELECT id FROM c",
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
                &host,
                &body,
                &c.created_by,
                &(store.map().campaign_bits() as i64),
            ],
        )
        .await
        .map_err(|e| pg_error("creating a campaign", e))?;
    drop(turn);
    c.id = row.get::<_, i32>(0) as u32;
    start_release(store, &c).await?;
    store.status(&c).await.map(AdminAnswer::Campaign)
}

/// The campaign's release, in every release tag: its hash (`release_fields`) and a
/// place in the tag's running set, one transaction per tag (each tag is a slot of its
/// own), all at once.
async fn start_release(store: &Store, c: &CampaignRow) -> Result<(), Error> {
    let tags = store.release_tags();
    let made = futures_util::future::join_all((0..tags).map(|t| async move {
        let tag = release_tag(t);
        let key = format!("{tag}:c:{}", c.id);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hset_multiple(&key, &release_fields(c, tags, t))
            .ignore()
            .sadd(format!("{tag}:running"), c.id)
            .ignore();
        store.transaction(&pipe, &key).await
    }))
    .await;
    for made in made {
        made.map_err(|e| Error::unavailable("Redis: starting the campaign's release", e))?;
    }
    Ok(())
}
