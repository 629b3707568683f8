//! Credits moved from a packet's shard to the winner's wallet shard (docs/scale-out.md,
//! "Shards"). A win or an open whose winner's wallet lives on another formation commits
//! the credit as an outbox row beside the win (`hb_pay`); each host's relay for that
//! formation takes the rows not yet moved, pays them on their wallets' shards
//! (`hb_take_credits`, idempotent by op id), and only then marks them moved.
//!
//! No money is made or lost between the two commits: the outbox row is the credit until
//! the wallet's shard has it, and the audit counts it there (`ledger::audit`). A relay
//! that stops after the wallet's commit and before marking the rows leaves them to be
//! relayed again, and the wallet's shard pays each op once (`hb_credits_in`'s key). Two
//! hosts' relays share the rows (`FOR UPDATE SKIP LOCKED`): a row is being moved by one
//! at a time, and were it moved twice it would still pay once.

use std::collections::BTreeMap;
use std::time::Duration;

use hongbao_money::Error;
use tokio_postgres::Client;

use crate::pg::pg_error;
use crate::store::Store;

/// How often a relay looks for credits to move (and at once again after a full batch).
/// Every host relays every shard: at 200 ms, three hosts over two shards make 30 passes
/// a second a shard, each moving what 1/15 s of wins left (measured at 50 ms: twice the
/// ledger's commits a win of one shard; docs/BENCHMARKS.md, "Shards").
pub(crate) const EVERY: Duration = Duration::from_millis(200);
/// Rows moved a pass, at most.
const BATCH: i64 = 2000;
/// How long one pass may take before its connections are given up (a frozen primary).
const PASS_TIMEOUT: Duration = Duration::from_secs(5);

/// A credit waiting in an outbox: its op, its wallet's shard, its user and amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Credit {
    pub(crate) op: i64,
    pub(crate) to_shard: usize,
    pub(crate) user: i64,
    pub(crate) cents: i64,
}

/// Relays formation `from`'s outbox for as long as the host runs.
pub(crate) async fn relay(store: Store, from: usize) {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut source: Option<Client> = None;
    loop {
        every.tick().await;
        loop {
            if source.as_ref().is_none_or(Client::is_closed) {
                source = match store.shard(from).pg_own().await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::debug!("relaying shard {from}'s credits: {e}");
                        break;
                    }
                };
            }
            let client = source.as_mut().expect("connected above");
            let pass = tokio::time::timeout(PASS_TIMEOUT, relay_once(&store, client, from));
            match pass.await {
                Ok(Ok(moved)) if moved as i64 == BATCH => continue,
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    tracing::warn!("relaying shard {from}'s credits: {e}");
                    source = None;
                    break;
                }
                Err(_) => {
                    tracing::warn!(
                        "relaying shard {from}'s credits: no answer in {} s",
                        PASS_TIMEOUT.as_secs()
                    );
                    source = None;
                    break;
                }
            }
        }
    }
}

/// One pass over formation `from`'s outbox (on `source`, its own connection): the rows
/// not moved, locked; paid on their wallets' shards; marked moved. Returns how many.
async fn relay_once(store: &Store, source: &mut Client, from: usize) -> Result<usize, Error> {
    // Nothing waiting (the index on rows not moved): one statement, no transaction.
    let any: bool = source
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM hb_outbox WHERE moved_ms IS NULL)",
            &[],
        )
        .await
        .map_err(|e| pg_error("reading the outbox", e))?
        .get(0);
    if !any {
        return Ok(0);
    }
    let tx = source
        .transaction()
        .await
        .map_err(|e| pg_error("relaying credits", e))?;
    let credits = waiting(&tx, BATCH).await?;
    if credits.is_empty() {
        return Ok(0);
    }
    let now = hongbao_sys::clock::unix_ms() as i64;
    let mut by_shard: BTreeMap<usize, Vec<Credit>> = BTreeMap::new();
    for c in &credits {
        by_shard.entry(c.to_shard).or_default().push(*c);
    }
    for (to, credits) in by_shard {
        let wallet = store.shard(to).pg().await?;
        pay(&wallet, from, &credits, now)
            .await
            .map_err(|e| e.context(format!("paying credits on shard {to}")))?;
    }
    mark_moved(&tx, &credits, now).await?;
    tx.commit()
        .await
        .map_err(|e| pg_error("marking credits moved", e))?;
    Ok(credits.len())
}

/// Up to `limit` outbox rows not moved yet, locked for this transaction (rows another
/// relay holds are skipped).
pub(crate) async fn waiting(
    tx: &tokio_postgres::Transaction<'_>,
    limit: i64,
) -> Result<Vec<Credit>, Error> {
    let rows = tx
        .query(
            "SELECT op, to_shard, user_id, cents FROM hb_outbox WHERE moved_ms IS NULL \
             ORDER BY op LIMIT $1 FOR UPDATE SKIP LOCKED",
            &[&limit],
        )
        .await
        .map_err(|e| pg_error("reading the outbox", e))?;
    Ok(rows
        .iter()
        .map(|r| Credit {
            op: r.get(0),
            to_shard: r.get::<_, i32>(1) as usize,
            user: r.get(2),
            cents: r.get(3),
        })
        .collect())
}

/// Pays `credits` (all for one wallet shard, from shard `from`) there in one statement,
/// each op once. Returns how many were paid now (the rest had been before).
pub(crate) async fn pay(
    wallet: &Client,
    from: usize,
    credits: &[Credit],
    now: i64,
) -> Result<i32, Error> {
    let mut sorted = credits.to_vec();
    sorted.sort_by_key(|c| (c.user, c.op));
    let ops: Vec<i64> = sorted.iter().map(|c| c.op).collect();
    let users: Vec<i64> = sorted.iter().map(|c| c.user).collect();
    let cents: Vec<i64> = sorted.iter().map(|c| c.cents).collect();
    let row = wallet
        .query_one(
            "SELECT hb_take_credits($1, $2, $3, $4, $5)",
            &[&(from as i32), &ops, &users, &cents, &now],
        )
        .await
        .map_err(|e| pg_error("paying relayed credits", e))?;
    Ok(row.get(0))
}

/// Marks `credits` moved, inside the transaction that locked them.
pub(crate) async fn mark_moved(
    tx: &tokio_postgres::Transaction<'_>,
    credits: &[Credit],
    now: i64,
) -> Result<(), Error> {
    let ops: Vec<i64> = credits.iter().map(|c| c.op).collect();
    tx.execute(
        "UPDATE hb_outbox SET moved_ms = $2 WHERE op = ANY($1)",
        &[&ops, &now],
    )
    .await
    .map_err(|e| pg_error("marking credits moved", e))?;
    Ok(())
}

#[cfg(test)]
mod tests;
