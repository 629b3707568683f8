//! What a batch's ops are told: replies as soon as the batch has committed, then what
//! Redis learns (packets given, gates for new packets) and the recipients' notices; or,
//! when it did not commit, a refusal that puts each shake packet back in its worker's pool.

use std::sync::Arc;

use hongbao_money::seam::{OpKind, Origin, Output};
use hongbao_money::{Notice, Reply};
use hongbao_proto::ResultCode;

use crate::commit::{Commit, Done};
use crate::shared::Shared;
use crate::store::Store;
use crate::ClusterConfig;

/// What an op of a batch that was not committed is told.
pub(crate) const UNAVAILABLE: &str = "the ledger is unavailable; nothing was done";
/// What an op left out of its batch is told (its batch-mates were committed).
pub(crate) const LEFT_OUT: &str =
    "the ledger refused this operation (a conflict); nothing was done";

/// Nothing of these ops happened: each is answered `unavailable` with `text`, and the
/// shake packets they would have given stay this host's to give.
pub(crate) async fn refuse(shared: &Shared, batch: Vec<Commit>, text: &str) {
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
pub(crate) async fn after_commit(
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
            (Commit::Open { to, packet, .. }, Done::Opened(result, cents)) => {
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
