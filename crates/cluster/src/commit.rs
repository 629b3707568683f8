//! An op on its way to the ledger ([`Commit`]), the order a batch locks rows in, and
//! what the op became there (`Done`). The host makes commits, the committer runs them,
//! and `outcome` tells what they became.

use hongbao_money::seam::Origin;

/// An op for the ledger, waiting for its batch.
#[derive(Debug, Clone)]
pub enum Commit {
    Win {
        to: Origin,
        campaign: u32,
        packet: u64,
        cents: u64,
        /// This op's own id ([`op_id`]).
        op_id: i64,
    },
    Send {
        to: Origin,
        packet: u64,
        cents: u64,
        recipients: Vec<u64>,
        shares: Vec<u64>,
        expires_ms: u64,
        key: Option<String>,
    },
    Open {
        to: Origin,
        packet: u64,
        /// This op's own id ([`op_id`]).
        op_id: i64,
    },
    CampaignPacket {
        campaign: u32,
        packet: u64,
        cents: u64,
        recipients: Vec<u64>,
        shares: Vec<u64>,
        expires_ms: u64,
    },
}

/// A fresh id for a win or an open, drawn once when the op is made and kept when its
/// batch is sent again: the ledger tells the op that did the work from another that
/// finds it done (the same packet dealt twice, the same share opened twice), so only the
/// first is told it won or opened. Random, so that hosts need not agree on a counter; two
/// ops on one packet share an id with odds of 2^-64.
pub(crate) fn op_id(rng: &mut impl rand::Rng) -> i64 {
    rng.gen()
}

impl Commit {
    /// The packet the op is about: where it commits, on a sharded ledger.
    pub(crate) fn packet(&self) -> u64 {
        match self {
            Commit::Win { packet, .. }
            | Commit::Send { packet, .. }
            | Commit::Open { packet, .. }
            | Commit::CampaignPacket { packet, .. } => *packet,
        }
    }

    /// The order a batch runs its ops in. Only packet rows are locked by two hosts at
    /// once (opens of one packet by users on different hosts; a user's balance row is
    /// touched by its own host only, and by expiry), so every batch locks packets first,
    /// in id order: two hosts' batches then cannot wait on each other in a cycle (which
    /// PostgreSQL would break only after `deadlock_timeout`, a second).
    pub(crate) fn lock_order(&self) -> (u8, u64) {
        match self {
            Commit::Open { packet, .. } => (0, *packet),
            Commit::Win { to, .. } | Commit::Send { to, .. } => (1, to.user.get()),
            Commit::CampaignPacket { packet, .. } => (2, *packet),
        }
    }
}

/// What an op became in the ledger.
pub(crate) enum Done {
    Won(bool),
    Sent(String, u64, u64),
    Opened(String, u64),
    Created(bool),
}
