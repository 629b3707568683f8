//! What the money side shows the outside: a campaign's status and the audit (admin API),
//! a user's view of the ledger, and the notice of a packet waiting to be opened. Both
//! backends produce these and the bench reads them back, so they deserialize too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::UserId;

/// Who minted money made before campaigns named their maker (a ledger from before admin
/// keys).
pub const MAKER_UNKNOWN: &str = "(before admin keys)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CampaignKind {
    Shake,
    Send,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CampaignState {
    /// Packets remain to release (shake: to win) or to create (send).
    Running,
    Done,
}

/// `GET /v1/campaigns/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CampaignStatus {
    pub id: u32,
    pub kind: CampaignKind,
    pub packets: u32,
    pub rate_per_sec: u32,
    pub state: CampaignState,
    /// Shake: packets put into play (dealt to workers). Send: packets created.
    pub released: u32,
    pub started_ms: u64,
    pub released_all_ms: Option<u64>,
    /// Shake only: packets won and their amount; the amount minted.
    pub won: u32,
    pub won_cents: u64,
    pub minted_cents: u64,
    /// Send only: shares created and opened, amounts sent, opened and refunded.
    pub shares: u64,
    pub shares_opened: u64,
    pub amount_opened_cents: u64,
    pub refunded_cents: u64,
    /// The name of the admin key that started it (none in a ledger from before keys).
    #[serde(default)]
    pub created_by: Option<String>,
}

/// `GET /v1/audit`: the conservation check, minted = held, recomputed from the state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audit {
    pub ok: bool,
    pub minted_cents: u64,
    pub user_balances_cents: u64,
    pub campaign_balances_cents: u64,
    pub unopened_cents: u64,
    pub unclaimed_cents: u64,
    pub users_with_balance: u64,
    pub live_packets: u64,
    pub unopened_shares: u64,
    pub unclaimed_packets: u64,
    pub ledger_seq: u64,
    /// Cluster mode with a sharded ledger: credits committed on a packet's shard (a win,
    /// an opened share) that its winner's wallet shard has not received yet (the outbox;
    /// docs/scale-out.md, "Shards").
    #[serde(default)]
    pub credits_in_flight_cents: u64,
    /// Cents minted by the campaigns of each admin key (by its name): every cent of
    /// `minted_cents`, each with who made it.
    #[serde(default)]
    pub minted_by: BTreeMap<String, u64>,
    /// The ledger's hash-chain head, `SEQ:HEX` (the newest committed event and its hash;
    /// docs/ledger.md): kept elsewhere, it proves later that the ledger still holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_head: Option<String>,
    /// Cluster mode: each gateway host's hash-chain head, `SEQ:HEX` by host name (each
    /// host chains its own events; docs/scale-out.md), as the audit recomputed it. A host
    /// whose chain breaks is left out, and named in `chain_problems`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ledger_heads: BTreeMap<String, String>,
    /// Where a hash chain breaks (cluster mode: the host and the first event that does
    /// not match). Any: the audit is not ok.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain_problems: Vec<String>,
}

impl Audit {
    /// Money held anywhere: in users' and campaigns' balances, in credits on their way
    /// to a wallet, in unopened shares, in shake packets nobody has won.
    pub fn held_cents(&self) -> u64 {
        self.user_balances_cents
            + self.credits_in_flight_cents
            + self.campaign_balances_cents
            + self.unopened_cents
            + self.unclaimed_cents
    }

    /// Sets `ok`: every cent minted is held somewhere, no cent is held twice, every cent
    /// minted names the key whose campaign minted it, and no hash chain breaks.
    pub fn checked(mut self) -> Audit {
        let named: u64 = self.minted_by.values().sum();
        self.ok = self.held_cents() == self.minted_cents
            && named == self.minted_cents
            && self.chain_problems.is_empty();
        self
    }
}

/// A user's balance and newest ledger events (`GET /v1/users/{id}`, `GET /v1/me`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserView {
    pub user: u64,
    pub balance_cents: u64,
    /// Newest first: the event as the ledger stores it, with its `seq` and `ts_ms`.
    pub recent_events: Vec<serde_json::Value>,
}

/// A sent packet that names a user who has not opened it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub packet_id: u64,
    /// `None` for a system campaign's packet.
    pub from_user: Option<UserId>,
    pub amount_cents: u64,
    pub shares: u32,
    pub expires_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_balances_only_when_every_cent_is_held_once_and_named() {
        let audit = Audit {
            minted_cents: 100,
            user_balances_cents: 60,
            unopened_cents: 30,
            unclaimed_cents: 10,
            minted_by: [("ops".to_string(), 70), ("night".to_string(), 30)].into(),
            ..Audit::default()
        };
        assert!(audit.clone().checked().ok);
        let extra = Audit {
            campaign_balances_cents: 1,
            ..audit.clone()
        };
        assert!(!extra.checked().ok);
        // A cent minted that no key's campaign made: not balanced.
        let unnamed = Audit {
            minted_by: [("ops".to_string(), 70)].into(),
            ..audit
        };
        assert!(!unnamed.checked().ok);
        // Balanced, but a chain breaks: not ok.
        let broken = Audit {
            chain_problems: vec!["host gw1: event 7 does not match".into()],
            ..audit_ok()
        };
        assert!(!broken.checked().ok);
    }

    fn audit_ok() -> Audit {
        Audit {
            minted_cents: 10,
            user_balances_cents: 10,
            minted_by: [("ops".to_string(), 10)].into(),
            ..Audit::default()
        }
    }

    #[test]
    fn an_audit_without_heads_or_problems_writes_neither() {
        let json = serde_json::to_value(audit_ok().checked()).unwrap();
        assert_eq!(json["ok"], true);
        assert!(json.get("ledger_heads").is_none() && json.get("chain_problems").is_none());
        let with = Audit {
            ledger_heads: [("gw1".to_string(), "3:ab".to_string())].into(),
            ..audit_ok()
        };
        let json = serde_json::to_value(&with).unwrap();
        assert_eq!(json["ledger_heads"]["gw1"], "3:ab");
        assert_eq!(serde_json::from_value::<Audit>(json).unwrap(), with);
    }

    #[test]
    fn campaign_status_reads_back_what_it_writes() {
        let status = CampaignStatus {
            id: 3,
            kind: CampaignKind::Send,
            packets: 2,
            rate_per_sec: 1,
            state: CampaignState::Running,
            released: 1,
            started_ms: 5,
            released_all_ms: None,
            won: 0,
            won_cents: 0,
            minted_cents: 9,
            shares: 3,
            shares_opened: 1,
            amount_opened_cents: 4,
            refunded_cents: 0,
            created_by: Some("ops".into()),
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["kind"], "send");
        assert_eq!(json["state"], "running");
        assert_eq!(
            serde_json::from_value::<CampaignStatus>(json).unwrap(),
            status
        );
    }
}
