//! The money seam: the one interface through which the gateways reach money, whatever
//! keeps it. The embedded backend (the core in the supervisor, its SQLite ledger) is one
//! implementation; the cluster backend (Redis and PostgreSQL) another.
//!
//! Everything goes in as a call and comes out of `drain`, in order, once it is durable:
//! a reply is never released before the ledger holds what it tells, so "you won" cannot
//! be taken back by a crash. A backend that answers at once (the embedded core) and one
//! that answers after network round trips (the cluster) look the same from here; the
//! caller drains when the backend's waker fires and on every turn of its loop.
//!
//! Presence — who is connected where, chat, delivering a notice to a user's connection —
//! is not money and is not here: a notice comes out as `Output::Notice` for a user, and
//! the gateway side finds the user's connection, if any.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use hongbao_proto::ResultCode;
use serde::{Deserialize, Serialize};

use crate::api::{Audit, CampaignStatus, Notice, UserView};
use crate::gateway::Reply;
use crate::ids::{ConnId, UserId, WorkerId};
use crate::rules::{SendCampaignRequest, ShakeCampaignRequest};

/// Where an operation came from and where its reply goes: the worker and connection, the
/// request id the reply carries, and the user it acts for (checked by the gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Origin {
    pub worker: WorkerId,
    pub conn: ConnId,
    pub request: u32,
    pub user: UserId,
}

/// An operation a client's request became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// The gateway popped shake packet `packet` from its pool for the caller: commit the
    /// win (or answer `nothing` if the packet is no longer the gateway's to give).
    Claim {
        packet: u64,
    },
    Send {
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
        idempotency_key: Option<String>,
    },
    Open {
        packet: u64,
    },
    /// Answered with `Reply::Me`.
    Me,
    /// Answered with `Reply::Notices`.
    Notices,
    /// The caller just logged in: every packet waiting for it comes out as a notice.
    LoggedIn,
}

/// What an operator asks of the money side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminRequest {
    /// A shake campaign, started by the admin key named `by`.
    CreateShake {
        request: ShakeCampaignRequest,
        by: String,
    },
    /// A send campaign, started by the admin key named `by`.
    CreateSend {
        request: SendCampaignRequest,
        by: String,
    },
    Campaign(u32),
    Campaigns,
    Audit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminAnswer {
    /// A campaign created (durable) or looked up.
    Campaign(CampaignStatus),
    NoCampaign(u32),
    Campaigns(Vec<CampaignStatus>),
    Audit(Audit),
    /// The request broke a rule: nothing was started or written.
    Refused(String),
    /// The ledger could not be reached: nothing was started or written; try again.
    Unavailable(String),
}

/// What comes out of the money side, in order, once durable. (Serialized between an old
/// and a new server in an upgrade, as JSON: the API types skip empty fields.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Output {
    Reply {
        to: Origin,
        reply: Reply,
    },
    /// A notice for a user, wherever it is connected now; dropped if it is offline (it
    /// stays waiting and comes out again at its next login).
    Notice {
        user: UserId,
        notice: Notice,
    },
    /// Shake packets `(id, amount_cents)` for a worker's pool.
    Deal {
        worker: WorkerId,
        packets: Vec<(u64, u64)>,
    },
    Admin {
        ticket: u64,
        answer: AdminAnswer,
    },
    /// A push for a user from another host (a chat), to its connection here if any.
    Push {
        user: UserId,
        push: crate::gateway::Push,
    },
    /// An operator's broadcast made on another host, for every connection here.
    Broadcast {
        server_time_us: u64,
        text: String,
    },
}

/// Replies by operation and result, as fields rather than names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    Shake,
    Send,
    Open,
    Chat,
}

impl OpKind {
    pub const ALL: [OpKind; 4] = [OpKind::Shake, OpKind::Send, OpKind::Open, OpKind::Chat];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Shake => "shake",
            OpKind::Send => "send",
            OpKind::Open => "open",
            OpKind::Chat => "chat",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyCounts([[u64; ResultCode::ALL.len()]; OpKind::ALL.len()]);

impl ReplyCounts {
    pub fn count(&mut self, op: OpKind, result: ResultCode) {
        self.0[op as usize][result.index()] += 1;
    }

    pub fn get(&self, op: OpKind, result: ResultCode) -> u64 {
        self.0[op as usize][result.index()]
    }

    pub fn add(&mut self, other: &ReplyCounts) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m += t;
            }
        }
    }

    /// Every (operation, result, count) counted at least once, in a fixed order.
    pub fn nonzero(&self) -> impl Iterator<Item = (OpKind, ResultCode, u64)> + '_ {
        OpKind::ALL.into_iter().flat_map(move |op| {
            ResultCode::ALL
                .into_iter()
                .map(move |r| (op, r, self.get(op, r)))
                .filter(|(_, _, n)| *n > 0)
        })
    }
}

/// The money side's counters and progress, read without I/O (stats, metrics, samples).
#[derive(Debug, Clone, Default)]
pub struct MoneySnapshot {
    pub replies: ReplyCounts,
    /// Shake packets put into play (again, after a restart).
    pub packets_released: u64,
    /// Sent packets created, by users and by send campaigns.
    pub send_packets: u64,
    /// The newest event applied, and the newest the ledger has committed.
    pub ledger_seq: u64,
    pub committed_seq: u64,
}

/// The interface. Calls never block on I/O; answers come out of `drain`.
pub trait Money: Send {
    fn submit(&mut self, now_ms: u64, origin: Origin, op: Op);
    /// Answered through `drain` as `Output::Admin { ticket, .. }`.
    fn admin(&mut self, now_ms: u64, ticket: u64, request: AdminRequest);
    /// Time passes: release shake packets, create campaign packets, expire packets. Call
    /// every few milliseconds for an even rate.
    fn tick(&mut self, now_ms: u64);
    fn worker_up(&mut self, worker: WorkerId);
    /// The worker is gone: the shake packets in its pool go back to their campaigns.
    fn worker_down(&mut self, worker: WorkerId);
    /// Everything that became durable since the last call, in order.
    fn drain(&mut self, out: &mut Vec<Output>);
    fn snapshot(&self) -> MoneySnapshot;
    /// The audit as of now if it can be had without I/O (for `/metrics`).
    fn audit_now(&self) -> Option<Audit>;
    /// Why nothing more may be acknowledged (the ledger failed), if so.
    fn failure(&self) -> Option<String>;
    /// Why the ledger cannot commit now, while it is trying again (a full disk), if so:
    /// what needs it is refused meanwhile, and the server is not ready.
    fn commits_failing(&self) -> Option<String> {
        None
    }
    /// How long each ledger commit took since the start (µs), from the start of its
    /// transaction until it was durable, tries again included; a commit given up is not
    /// in it. `None` where the backend keeps no such record.
    fn commit_latency(&self) -> Option<Histogram<u64>> {
        None
    }
    /// Whether what the ledger acknowledges now is on a synchronous standby too (a
    /// PostgreSQL primary with synchronous replication on and a standby connected), as
    /// last asked a few seconds ago. `None` where there is nothing to ask (the embedded
    /// ledger) or the last asking failed.
    fn standby_sync(&self) -> Option<bool> {
        None
    }
    /// Commits everything submitted, then stops.
    fn finish(&mut self) -> crate::error::Result<()>;

    // Presence across hosts. One host (the embedded backend) has nothing to do here: its
    // presence knows every connection. The cluster backend keeps user → host routes and
    // carries chat, notices and broadcasts to other hosts.

    /// `user` is now connected to this host.
    fn online(&mut self, _user: UserId) {}
    /// `user` left this host.
    fn offline(&mut self, _user: UserId) {}
    /// A chat to a user not connected here: `true` if this backend takes it (and answers
    /// with `Reply::Chat` through `drain`), `false` if the user is simply offline.
    fn chat_elsewhere(&mut self, _origin: Origin, _to_user: u64, _text: String) -> bool {
        false
    }
    /// An operator's broadcast, already delivered here, for the other hosts.
    fn broadcast_elsewhere(&mut self, _server_time_us: u64, _text: String) {}
}

/// Every balance the ledger holds, for the bench's user-by-user audit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balances {
    pub users: BTreeMap<u64, u64>,
    pub campaigns: BTreeMap<u32, u64>,
}

/// One money operation as the ledger holds it: shake packet `packet` won by `user`, or
/// `user`'s share of sent packet `packet` opened, for `amount_cents`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LedgerOp {
    pub packet: u64,
    pub user: u64,
    pub amount_cents: u64,
}

/// A page of the ledger's wins and opened shares (`GET /v1/ledger/ops`), for checking
/// clients' histories op by op. `next` continues after this page; none: the ledger had
/// nothing more when it was read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsPage {
    pub wins: Vec<LedgerOp>,
    pub opens: Vec<LedgerOp>,
    pub next: Option<OpsCursor>,
}

/// Where a page of the ledger's operations starts: just after this position in the
/// ledger's own order. Each backend pages in the order its storage keeps cheaply — the
/// embedded ledger by event sequence number, wins and opens interleaved; PostgreSQL its
/// wins by packet, then its opened shares by (packet, user), each by primary key — so a
/// cursor means something only to the kind of ledger that gave it. Opaque to clients: a
/// short string (`seq.104`, `win.4294967296`, `open.12.7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsCursor {
    /// After the event with this sequence number (the embedded ledger).
    Seq(u64),
    /// After this won packet (PostgreSQL's `hb_wins`); its opens come next.
    Win(u64),
    /// After this opened share (PostgreSQL's `hb_recipients`).
    Open { packet: u64, user: u64 },
}

impl std::fmt::Display for OpsCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpsCursor::Seq(seq) => write!(f, "seq.{seq}"),
            OpsCursor::Win(packet) => write!(f, "win.{packet}"),
            OpsCursor::Open { packet, user } => write!(f, "open.{packet}.{user}"),
        }
    }
}

/// A `GET /v1/ledger/ops` cursor that is not one this API gave (`after=…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCursor(pub String);

impl std::fmt::Display for BadCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} is not a cursor this API gave", self.0)
    }
}

impl std::error::Error for BadCursor {}

impl std::str::FromStr for OpsCursor {
    type Err = BadCursor;

    fn from_str(s: &str) -> Result<OpsCursor, BadCursor> {
        let bad = || BadCursor(s.to_string());
        let (kind, rest) = s.split_once('.').ok_or_else(bad)?;
        let numbers: Vec<u64> = rest
            .split('.')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let cursor = match (kind, numbers.as_slice()) {
            ("seq", &[seq]) => OpsCursor::Seq(seq),
            ("win", &[packet]) => OpsCursor::Win(packet),
            ("open", &[packet, user]) => OpsCursor::Open { packet, user },
            _ => return Err(bad()),
        };
        // One spelling of each: `seq.+1` or `seq.01` is not a cursor this API gave.
        if cursor.to_string() != s {
            return Err(bad());
        }
        Ok(cursor)
    }
}

impl Serialize for OpsCursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for OpsCursor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OpsCursor, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Reads of what the ledger has committed, beside the money loop (admin threads).
pub trait LedgerRead: Send {
    fn user(&self, user: u64, limit: usize) -> crate::error::Result<UserView>;
    fn balances(&self) -> crate::error::Result<Balances>;
    /// Up to `limit` wins and opened shares together, after `after` (from the start when
    /// none). A cursor of another kind of ledger is refused.
    fn ops(&self, after: Option<OpsCursor>, limit: usize) -> crate::error::Result<OpsPage>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_cursors_read_back_and_nothing_else_reads() {
        for cursor in [
            OpsCursor::Seq(0),
            OpsCursor::Seq(104),
            OpsCursor::Win(4_294_967_296),
            OpsCursor::Open {
                packet: u64::MAX,
                user: 7,
            },
        ] {
            let json = serde_json::to_string(&cursor).unwrap();
            assert_eq!(serde_json::from_str::<OpsCursor>(&json).unwrap(), cursor);
            assert_eq!(cursor.to_string().parse::<OpsCursor>(), Ok(cursor));
        }
        assert_eq!(OpsCursor::Seq(104).to_string(), "seq.104");
        for bad in [
            "",
            "seq",
            "seq.",
            "seq.x",
            "seq.+1",
            "seq.01",
            "seq.1.2",
            "win.1.2",
            "open.1",
            "open.1.2.3",
            "page.1",
            "-1",
            "seq.18446744073709551616",
        ] {
            assert!(bad.parse::<OpsCursor>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reply_counts_are_fields_by_operation_and_result() {
        let mut c = ReplyCounts::default();
        c.count(OpKind::Shake, ResultCode::Won);
        c.count(OpKind::Shake, ResultCode::Won);
        c.count(OpKind::Chat, ResultCode::Offline);
        let mut total = ReplyCounts::default();
        total.add(&c);
        total.add(&c);
        assert_eq!(total.get(OpKind::Shake, ResultCode::Won), 4);
        let seen: Vec<_> = c.nonzero().collect();
        assert_eq!(
            seen,
            [
                (OpKind::Shake, ResultCode::Won, 2),
                (OpKind::Chat, ResultCode::Offline, 1)
            ]
        );
    }
}
