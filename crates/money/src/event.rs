//! The ledger's events: every change of money is one of these, appended in order.
//!
//! The core applies an event to its memory state the moment it creates it, the ledger
//! writes it (group-committed), and a restart replays the same events through the same
//! `Core::apply`, so live state and rebuilt state cannot drift apart. `balance_deltas`
//! says how an event moves account balances, so the ledger can keep its derived
//! `balances` table without knowing anything else about the business.

use serde::{Deserialize, Serialize};

/// Who holds money: a user, or the system account of a campaign (where refunds of a
/// system campaign's unopened shares go back to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Account {
    User(u64),
    Campaign(u32),
}

impl Account {
    /// The key used in the ledger's `balances` table: `u:42`, `c:7`.
    pub fn key(&self) -> String {
        match self {
            Account::User(u) => format!("u:{u}"),
            Account::Campaign(c) => format!("c:{c}"),
        }
    }

    /// The account a `key` names, `None` if it is not one.
    pub fn from_key(key: &str) -> Option<Account> {
        match key.split_once(':')? {
            ("u", id) => Some(Account::User(id.parse().ok()?)),
            ("c", id) => Some(Account::Campaign(id.parse().ok()?)),
            _ => None,
        }
    }

    pub fn user(&self) -> Option<u64> {
        match self {
            Account::User(u) => Some(*u),
            Account::Campaign(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A shake campaign: mints all its packets at once (`minted_cents` is the sum of the
    /// amounts `shake_amount(seed, i)` for i in 0..packets); they are released over time.
    ShakeCampaign {
        campaign: u32,
        packets: u32,
        rate_per_sec: u32,
        amount_min: u64,
        amount_max: u64,
        seed: u64,
        minted_cents: u64,
        /// The admin key that started it (absent in ledgers from before admin keys).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// Packet `index` of a shake campaign was won by `user`.
    ShakeWon {
        campaign: u32,
        index: u32,
        user: u64,
        amount_cents: u64,
    },
    /// A system send campaign: creates `packets` packets at `rate_per_sec`, each for
    /// `recipients` users drawn from `user_min..=user_max`. Mints nothing by itself.
    SendCampaign {
        campaign: u32,
        packets: u32,
        rate_per_sec: u32,
        recipients: u32,
        user_min: u64,
        user_max: u64,
        amount_min: u64,
        amount_max: u64,
        /// The admin key that started it (absent in ledgers from before admin keys).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// A packet was sent. From a user it debits the user; from a campaign it is minted.
    PacketSent {
        packet: u64,
        sender: Account,
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
        expires_ms: u64,
        /// The sender's idempotency key: a retry with it gets this packet's answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
    },
    /// A recipient opened one share of a sent packet.
    ShareOpened {
        packet: u64,
        user: u64,
        amount_cents: u64,
    },
    /// The packet's time-to-live ran out; what was unopened went back to its sender.
    PacketExpired {
        packet: u64,
        sender: Account,
        refund_cents: u64,
    },
}

impl Event {
    /// How this event moves balances (account, signed cents).
    pub fn balance_deltas(&self) -> Vec<(Account, i64)> {
        match self {
            Event::ShakeWon {
                user, amount_cents, ..
            } => {
                vec![(Account::User(*user), *amount_cents as i64)]
            }
            Event::PacketSent {
                sender: sender @ Account::User(_),
                amount_cents,
                ..
            } => vec![(*sender, -(*amount_cents as i64))],
            Event::ShareOpened {
                user, amount_cents, ..
            } => {
                vec![(Account::User(*user), *amount_cents as i64)]
            }
            Event::PacketExpired {
                sender,
                refund_cents,
                ..
            } if *refund_cents > 0 => {
                vec![(*sender, *refund_cents as i64)]
            }
            _ => Vec::new(),
        }
    }

    /// The user this event concerns most, for `GET /v1/users/{id}` look-ups.
    pub fn user(&self) -> Option<u64> {
        match self {
            Event::ShakeWon { user, .. } | Event::ShareOpened { user, .. } => Some(*user),
            Event::PacketSent { sender, .. } | Event::PacketExpired { sender, .. } => sender.user(),
            _ => None,
        }
    }

    /// The kind name stored in the ledger's `kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::ShakeCampaign { .. } => "shake_campaign",
            Event::ShakeWon { .. } => "shake_won",
            Event::SendCampaign { .. } => "send_campaign",
            Event::PacketSent { .. } => "packet_sent",
            Event::ShareOpened { .. } => "share_opened",
            Event::PacketExpired { .. } => "packet_expired",
        }
    }
}

/// One stored event: its place in the ledger and when it happened (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub ts_ms: u64,
    pub event: Event,
}

/// The amount of packet `index` of a shake campaign, fixed by the campaign's seed so
/// that a campaign of millions of packets needs no table of amounts.
pub fn shake_amount(seed: u64, index: u32, amount_min: u64, amount_max: u64) -> u64 {
    let span = amount_max - amount_min + 1;
    amount_min + splitmix64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % span
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shake_amounts_stay_in_range_and_repeat() {
        for i in 0..10_000 {
            let a = shake_amount(7, i, 100, 250);
            assert!((100..=250).contains(&a));
            assert_eq!(a, shake_amount(7, i, 100, 250));
        }
        assert_eq!(shake_amount(1, 5, 9, 9), 9);
    }

    #[test]
    fn deltas_balance_for_user_send_and_refund() {
        let sent = Event::PacketSent {
            packet: 1,
            sender: Account::User(3),
            amount_cents: 500,
            shares: 2,
            recipients: vec![4, 5],
            expires_ms: 0,
            idempotency_key: Some("k".into()),
        };
        assert_eq!(sent.balance_deltas(), vec![(Account::User(3), -500)]);
        let minted = Event::PacketSent {
            packet: 2,
            sender: Account::Campaign(1),
            amount_cents: 500,
            shares: 2,
            recipients: vec![4, 5],
            expires_ms: 0,
            idempotency_key: None,
        };
        assert!(minted.balance_deltas().is_empty());
        // A ledger written before keys existed reads the same.
        let old = r#"{"kind":"packet_sent","packet":2,"sender":{"Campaign":1},"amount_cents":500,"shares":2,"recipients":[4,5],"expires_ms":0}"#;
        assert_eq!(serde_json::from_str::<Event>(old).unwrap(), minted);
        assert!(!serde_json::to_string(&minted)
            .unwrap()
            .contains("idempotency_key"));
        for account in [Account::User(3), Account::Campaign(9)] {
            assert_eq!(Account::from_key(&account.key()), Some(account));
        }
        assert_eq!(Account::from_key("x:1"), None);
        let json = serde_json::to_string(&sent).unwrap();
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), sent);
    }
}
