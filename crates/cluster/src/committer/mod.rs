//! Group commit: the host's ops are taken in batches (up to `max_batch`, waiting up to
//! `commit_window` for more), each batch one PostgreSQL transaction of pipelined calls to
//! the ledger's functions (`schema.sql`). Nothing an op tells goes out before its batch
//! has committed: that is `outcome`'s job, called from here.
//!
//! Every event a batch appends is hashed onto this host's chain by PostgreSQL as it is
//! inserted (`hb_chain` in `schema.sql`), from the host's newest event in the database: a
//! batch whose COMMIT went unanswered either added its events or did not, and the next
//! batch chains on whatever the database holds, so no head is kept here to go stale or
//! fork.
//!
//! A sharded ledger has one committer per formation (`Committers` routes each op to its
//! packet's shard): a win or an open whose winner's wallet is on another shard commits
//! its credit as an outbox row there (`hb_pay`), for `relay` to move.

use std::sync::Arc;
use std::time::Duration;

use hongbao_money::Error;
use hongbao_money::{Account, Event};
use hongbao_sys::clock::UnixTime;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::Client;

use crate::commit::{Commit, Done};
use crate::connect::pg_connect;
use crate::outcome::{after_commit, refuse, LEFT_OUT, UNAVAILABLE};
use crate::pg::{i64s, pg_error};
use crate::shard::ShardMap;
use crate::shared::Shared;
use crate::store::Store;
use crate::{ClusterConfig, PgTarget};

/// The formation a committer commits to, in the shard map: where a user's wallet is,
/// seen from there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Here {
    pub(crate) map: ShardMap,
    pub(crate) shard: usize,
}

impl Here {
    /// One formation: every wallet here.
    #[cfg(test)]
    pub(crate) const ONE: Here = Here {
        map: ShardMap::ONE,
        shard: 0,
    };

    /// `user`'s wallet shard when it is another one (their credit goes by the outbox),
    /// none when it is here.
    fn wallet_elsewhere(&self, user: u64) -> Option<i32> {
        let wallet = self.map.wallet(user);
        (wallet != self.shard).then_some(wallet as i32)
    }
}

/// A committer per formation, each op sent to its packet's.
#[derive(Clone)]
pub(crate) struct Committers {
    map: ShardMap,
    to: Vec<tokio::sync::mpsc::UnboundedSender<Commit>>,
    shared: Arc<Shared>,
}

/// What an op on a packet numbered under a map version newer than this host's is told.
const NEWER_MAP: &str = "the packet was numbered under a newer shard map than this host's; \
                         nothing was done (try again: hosts are being restarted on it)";

impl Committers {
    pub(crate) fn new(
        map: ShardMap,
        to: Vec<tokio::sync::mpsc::UnboundedSender<Commit>>,
        shared: Arc<Shared>,
    ) -> Self {
        Committers { map, to, shared }
    }

    /// `op` to its packet's committer; refused at once when its packet is on a shard
    /// this host does not know (a host not yet restarted while the map grows).
    pub(crate) fn send(&self, op: Commit) {
        match self.map.packet(op.packet()).and_then(|k| self.to.get(k)) {
            Some(to) => {
                let _ = to.send(op);
            }
            None => {
                tracing::warn!(
                    packet = op.packet(),
                    "an op on a packet of a newer shard map than this host's, refused"
                );
                let shared = self.shared.clone();
                tokio::spawn(async move { refuse(&shared, vec![op], NEWER_MAP).await });
            }
        }
    }
}

pub(crate) struct Statements {
    win: tokio_postgres::Statement,
    send: tokio_postgres::Statement,
    open: tokio_postgres::Statement,
    campaign_packet: tokio_postgres::Statement,
}

async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
    Ok(Statements {
        win: client
            .prepare("SELECT hb_win($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .await?,
        send: client
            .prepare("SELECT * FROM hb_send($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
            .await?,
        open: client
            .prepare("SELECT * FROM hb_open($1, $2, $3, $4, $5, $6)")
            .await?,
        campaign_packet: client
            .prepare("SELECT hb_campaign_packet($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .await?,
    })
}

/// One op inside the batch's transaction.
async fn run_op(
    client: &Client,
    st: &Statements,
    here: Here,
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
            op_id,
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
                        op_id,
                        &at,
                        &host,
                        &body,
                        &here.wallet_elsewhere(user),
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
        Commit::Open { to, packet, op_id } => {
            let row = client
                .query_one(
                    &st.open,
                    &[
                        &(*packet as i64),
                        &(to.user.get() as i64),
                        op_id,
                        &at,
                        &host,
                        &here.wallet_elsewhere(to.user.get()),
                    ],
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
/// itself: its batch-mates are committed again without it, and it comes back as `None`
/// in its place (why is logged), to be answered alone. A failure without a database error
/// (the connection lost) fails the whole batch.
async fn commit_batch(
    client: &Client,
    st: &Statements,
    here: Here,
    host: &str,
    at: UnixTime,
    ops: &[Commit],
) -> Result<Vec<Option<Done>>, tokio_postgres::Error> {
    let at = at.as_millis() as i64;
    let mut left_out = vec![false; ops.len()];
    let mut attempt = 0;
    loop {
        attempt += 1;
        let running: Vec<usize> = (0..ops.len()).filter(|&i| !left_out[i]).collect();
        // A transaction id from the start, so that COMMIT waits for the synchronous
        // standby even when every op finds its work done (a batch sent again): an answer
        // read from rows a lost attempt committed on a primary that was then cut off —
        // visible there, never replicated, rewound away at its demotion — is told only
        // once this commit, after them in the WAL, is on the standby.
        client.batch_execute("BEGIN; SELECT txid_current()").await?;
        let results = futures_util::future::join_all(
            running
                .iter()
                .map(|&i| run_op(client, st, here, host, at, &ops[i])),
        )
        .await;
        if results.iter().all(Result::is_ok) {
            client.batch_execute("COMMIT").await?;
            let mut done = results.into_iter().map(|r| r.expect("all ok"));
            return Ok(left_out
                .into_iter()
                .map(|out| (!out).then(|| done.next().expect("one result an op that ran")))
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
            tracing::warn!("an op was left out of its batch: {why}");
            left_out[running[k]] = true;
        }
    }
}

/// The positions of the ops whose own statement failed (not those refused because the
/// transaction had already failed), with why.
fn culprits(results: &[Result<Done, tokio_postgres::Error>]) -> Vec<(usize, Error)> {
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

/// How long one attempt at a batch may go unanswered before its connection is given up
/// (a frozen primary answers nothing, and no timeout of its own can fire).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a batch whose outcome is unknown is sent again before its ops are refused:
/// past any failover the ledger's standby makes (docs/scale-out.md).
const RESEND_FOR: Duration = Duration::from_secs(60);

/// What a committer holds of its formation (`store::Shard`'s parts): the host's turn at
/// its hash chain, the count of connections given up, and where it is.
#[derive(Clone, Copy)]
pub(crate) struct Link<'a> {
    pub(crate) chain: &'a tokio::sync::Mutex<()>,
    pub(crate) lost: &'a std::sync::atomic::AtomicU64,
    pub(crate) target: &'a PgTarget,
}

/// Commits `batch`, and when its outcome is unknown — the connection lost or silent with
/// the batch sent, its COMMIT perhaps among what went out — sends it again, to whichever
/// host is the primary by then, until one attempt's outcome is known. Every op is keyed
/// (a packet's win, a send's packet id or key, a recipient's share, a campaign packet's
/// id), so an op the lost attempt committed is found done, not done twice; what it was
/// told then is told now (`settle`). A batch refused by the database, or never sent (no
/// connection), is known not committed and fails at once. Each connection given up is
/// counted in `lost` (`Inner::pg_lost`), so the host's reading connection is made again.
pub(crate) async fn commit_until_known(
    conn: &mut Option<(Client, Statements)>,
    link: Link<'_>,
    here: Here,
    host: &str,
    at: UnixTime,
    batch: &[Commit],
) -> Result<Vec<Option<Done>>, Error> {
    let Link {
        chain,
        lost,
        target,
    } = link;
    let started = tokio::time::Instant::now();
    let mut resent = false;
    loop {
        if conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
            *conn = connect(target).await;
        }
        let Some((client, st)) = conn.as_ref() else {
            let why = Error::unavailable("committing", "no connection to PostgreSQL");
            if !resent || started.elapsed() > RESEND_FOR {
                return Err(why);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let attempt = {
            let _turn = chain.lock().await;
            tokio::time::timeout(
                ATTEMPT_TIMEOUT,
                commit_batch(client, st, here, host, at, batch),
            )
            .await
        };
        let why = match attempt {
            Ok(Ok(done)) if resent => return Ok(settle(batch, done)),
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(e)) if !outcome_unknown(&e) => {
                let why = pg_error("committing", &e);
                if why.kind() == hongbao_money::ErrorKind::Unavailable {
                    *conn = None;
                }
                return Err(why);
            }
            Ok(Err(e)) => pg_error("committing", e),
            Err(_) => Error::unavailable(
                "committing",
                format!("no answer in {} s", ATTEMPT_TIMEOUT.as_secs()),
            ),
        };
        *conn = None;
        lost.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if started.elapsed() > RESEND_FOR {
            return Err(why);
        }
        tracing::warn!(
            "a batch of {} may or may not have committed ({why}): sending it again",
            batch.len()
        );
        resent = true;
    }
}

/// Whether a failed attempt may have committed: the connection failed under it (no
/// answer from the database, or one saying the connection or the server is going).
/// An error the database answered with otherwise rolled the transaction back.
fn outcome_unknown(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    match e.code() {
        None => true,
        Some(code) => {
            code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
        }
    }
}

/// What a batch sent again tells, where the lost attempt had committed an op: a campaign
/// packet it created is found made — told as then, its recipients told of it. (A win, an
/// open and a send are found by their op ids and keys in `schema.sql` itself.) Another
/// host may have made the same campaign packet: its recipients may then hear of it twice,
/// never not at all.
fn settle(batch: &[Commit], done: Vec<Option<Done>>) -> Vec<Option<Done>> {
    batch
        .iter()
        .zip(done)
        .map(|(op, d)| match (op, d) {
            (Commit::CampaignPacket { .. }, Some(Done::Created(false))) => {
                Some(Done::Created(true))
            }
            (_, d) => d,
        })
        .collect()
}

async fn connect(target: &PgTarget) -> Option<(Client, Statements)> {
    match pg_connect(target).await {
        Ok(c) => match prepare(&c).await {
            Ok(st) => Some((c, st)),
            Err(e) => {
                tracing::warn!("{}", pg_error("preparing", e));
                None
            }
        },
        Err(e) => {
            tracing::warn!("{e}");
            None
        }
    }
}

/// Takes ops as they come, commits them in batches (one transaction each) to formation
/// `shard`, and only then lets out what they tell.
pub async fn committer(
    store: Store,
    cfg: ClusterConfig,
    shared: Arc<Shared>,
    mut rx: UnboundedReceiver<Commit>,
    shard: usize,
) {
    let here = Here {
        map: store.map(),
        shard,
    };
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
        let started = std::time::Instant::now();
        let result = commit_until_known(
            &mut conn,
            Link {
                chain: &store.shard(shard).chain,
                lost: &store.shard(shard).pg_lost,
                target: store.shard(shard).target(),
            },
            here,
            &cfg.host,
            // The batch's time, kept if it is sent again: an open judged against its
            // packet's expiry as of when it was asked (a packet refunded meanwhile still
            // answers `expired`: hb_open checks `refunded` under the row's lock). So a
            // host's `at_ms` follows the order its batches were formed in, which the
            // chain's `seq` need not (another holder of the chain may commit between).
            UnixTime::now(),
            &batch,
        )
        .await;
        match result {
            Ok(done) => {
                shared.committed_in(started.elapsed());
                let (mut committed, mut results, mut left_out) =
                    (Vec::new(), Vec::new(), Vec::new());
                for (op, d) in batch.into_iter().zip(done) {
                    match d {
                        Some(d) => {
                            committed.push(op);
                            results.push(d);
                        }
                        None => left_out.push(op),
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
                tracing::warn!("a batch of {} was not committed: {why}", batch.len());
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

#[cfg(test)]
pub(crate) mod tests;
