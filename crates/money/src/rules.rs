//! The rules every backend applies before money moves: limits, the shape of a send, the
//! shape of a campaign. Pure functions, so the embedded core and the cluster backend
//! refuse exactly the same things with exactly the same words.

use std::collections::HashSet;

use hongbao_proto::message::MAX_RECIPIENTS;
use hongbao_proto::ResultCode;

use crate::error::Error;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Largest amount of a single packet or campaign packet, in cents (10 million yuan).
pub const MAX_PACKET_CENTS: u64 = 1_000_000_000;
/// Most packets a campaign may mint.
pub const MAX_CAMPAIGN_PACKETS: u32 = 100_000_000;
/// Fastest a campaign may release or create packets.
pub const MAX_CAMPAIGN_RATE_PER_SEC: u32 = 1_000_000;

/// The id of a shake packet: campaign in the high half, index in the low half.
pub fn shake_packet_id(campaign: u32, index: u32) -> u64 {
    ((campaign as u64) << 32) | index as u64
}

/// The campaign and index of a shake packet id.
pub fn shake_packet_parts(packet: u64) -> (u32, u32) {
    ((packet >> 32) as u32, packet as u32)
}

/// Whether a send is well formed whatever the sender holds: an amount in
/// 1..=`MAX_PACKET_CENTS`, at least one share and at least a cent per share, no more
/// shares than recipients, at most `MAX_RECIPIENTS` distinct recipients, none of them 0.
pub fn send_is_well_formed(amount_cents: u64, shares: u32, recipients: &[u64]) -> bool {
    send_refusal(amount_cents, shares, recipients).is_none()
}

/// Why a send is not well formed ([`send_is_well_formed`]), in words for the sender;
/// `None` when it is. The first rule broken is named.
pub fn send_refusal(amount_cents: u64, shares: u32, recipients: &[u64]) -> Option<String> {
    let distinct: HashSet<&u64> = recipients.iter().collect();
    if amount_cents == 0 {
        Some("amount_cents must be at least 1".into())
    } else if amount_cents > MAX_PACKET_CENTS {
        Some(format!("amount_cents over {MAX_PACKET_CENTS}"))
    } else if shares == 0 {
        Some("shares must be at least 1".into())
    } else if shares as u64 > amount_cents {
        Some("more shares than cents: every share is at least one cent".into())
    } else if recipients.is_empty() {
        Some("no recipients".into())
    } else if recipients.len() > MAX_RECIPIENTS {
        Some(format!("more than {MAX_RECIPIENTS} recipients"))
    } else if shares as usize > recipients.len() {
        Some("more shares than recipients".into())
    } else if distinct.len() != recipients.len() {
        Some("a recipient is named twice".into())
    } else if recipients.contains(&0) {
        Some("user 0 cannot be a recipient".into())
    } else {
        None
    }
}

/// The result of a send by a sender holding `balance_cents`: `bad-request` when it is
/// malformed (checked first, so an absurd amount is never `insufficient-funds`),
/// `insufficient-funds`, or `ok`.
pub fn check_send(
    balance_cents: u64,
    amount_cents: u64,
    shares: u32,
    recipients: &[u64],
) -> ResultCode {
    if !send_is_well_formed(amount_cents, shares, recipients) {
        ResultCode::BadRequest
    } else if balance_cents < amount_cents {
        ResultCode::InsufficientFunds
    } else {
        ResultCode::Ok
    }
}

/// `POST /v1/campaigns/shake`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShakeCampaignRequest {
    pub packets: u32,
    pub rate_per_sec: u32,
    pub amount_min: u64,
    pub amount_max: u64,
}

/// `POST /v1/campaigns/send`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SendCampaignRequest {
    pub packets: u32,
    pub rate_per_sec: u32,
    pub recipients: u32,
    pub user_min: u64,
    pub user_max: u64,
    pub amount_min: u64,
    pub amount_max: u64,
}

impl ShakeCampaignRequest {
    /// The first rule broken, in the order docs/admin-api.md lists them.
    pub fn check(&self) -> Result<(), Error> {
        check_campaign_shape(
            self.packets,
            self.rate_per_sec,
            self.amount_min,
            self.amount_max,
            1,
        )
    }
}

impl SendCampaignRequest {
    /// The first rule broken, in the order docs/admin-api.md lists them.
    pub fn check(&self) -> Result<(), Error> {
        check_campaign_shape(
            self.packets,
            self.rate_per_sec,
            self.amount_min,
            self.amount_max,
            self.recipients as u64,
        )?;
        if self.recipients == 0 || self.recipients as usize > MAX_RECIPIENTS {
            return Err(Error::refused(format!(
                "recipients must be 1..={MAX_RECIPIENTS}"
            )));
        }
        if self.user_min == 0 || self.user_max < self.user_min {
            return Err(Error::refused(
                "user_min must be ≥ 1 and user_max ≥ user_min",
            ));
        }
        if self.user_max - self.user_min + 1 < self.recipients as u64 {
            return Err(Error::refused(
                "the user range holds fewer users than recipients",
            ));
        }
        Ok(())
    }
}

fn check_campaign_shape(
    packets: u32,
    rate_per_sec: u32,
    amount_min: u64,
    amount_max: u64,
    min_amount: u64,
) -> Result<(), Error> {
    if packets == 0 || packets > MAX_CAMPAIGN_PACKETS {
        return Err(Error::refused(format!(
            "packets is {packets}: it must be from 1 to {MAX_CAMPAIGN_PACKETS}"
        )));
    }
    if rate_per_sec == 0 || rate_per_sec > MAX_CAMPAIGN_RATE_PER_SEC {
        return Err(Error::refused(format!(
            "rate_per_sec is {rate_per_sec}: it must be from 1 to {MAX_CAMPAIGN_RATE_PER_SEC}"
        )));
    }
    if amount_min < min_amount.max(1) {
        let why = match min_amount {
            0 | 1 => "at least 1 cent".to_string(),
            n => format!("at least {n} cents, one for each of the {n} shares"),
        };
        return Err(Error::refused(format!(
            "amount_min is {amount_min}: it must be {why}"
        )));
    }
    if amount_max < amount_min || amount_max > MAX_PACKET_CENTS {
        return Err(Error::refused(format!(
            "amount_max is {amount_max}: it must be from amount_min ({amount_min}) to {MAX_PACKET_CENTS} cents"
        )));
    }
    Ok(())
}

/// `k` distinct recipients drawn from `lo..=hi` (a send campaign's packet); the range
/// must hold at least `k` users (`SendCampaignRequest::check`).
pub fn draw_recipients<R: Rng + ?Sized>(rng: &mut R, k: usize, lo: u64, hi: u64) -> Vec<u64> {
    let mut recipients = Vec::with_capacity(k);
    while recipients.len() < k {
        let user = rng.gen_range(lo..=hi);
        if !recipients.contains(&user) {
            recipients.push(user);
        }
    }
    recipients
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_sends_are_bad_requests_before_funds_are_looked_at() {
        let ok = |r| check_send(1_000, 500, 2, r);
        assert_eq!(ok(&[1, 2]), ResultCode::Ok);
        assert_eq!(
            check_send(100, 500, 2, &[1, 2]),
            ResultCode::InsufficientFunds
        );
        // Absurd amounts are malformed, not unaffordable.
        assert_eq!(check_send(0, 1 << 63, 1, &[1]), ResultCode::BadRequest);
        assert_eq!(check_send(0, 0, 1, &[1]), ResultCode::BadRequest);
        // Each refusal names the rule it broke.
        for (amount, shares, to, why) in [
            (0, 1, &[1][..], "at least 1"),
            (1 << 63, 1, &[1], "over"),
            (5, 0, &[1], "shares must be"),
            (1, 2, &[1, 2], "every share is at least one cent"),
            (5, 1, &[], "no recipients"),
            (5, 2, &[1], "more shares than recipients"),
            (5, 1, &[1, 1], "named twice"),
            (5, 1, &[0], "user 0"),
        ] {
            let said = send_refusal(amount, shares, to).expect("refused");
            assert!(said.contains(why), "{said:?} for {amount} {shares} {to:?}");
        }
        assert_eq!(send_refusal(5, 2, &[1, 2]), None);
        // More shares than recipients or than cents; duplicates; user 0; none.
        assert_eq!(check_send(1_000, 500, 3, &[1, 2]), ResultCode::BadRequest);
        assert_eq!(check_send(1_000, 2, 3, &[1, 2, 3]), ResultCode::BadRequest);
        assert_eq!(ok(&[1, 1]), ResultCode::BadRequest);
        assert_eq!(ok(&[0, 1]), ResultCode::BadRequest);
        assert_eq!(check_send(1_000, 500, 0, &[1]), ResultCode::BadRequest);
        let many: Vec<u64> = (1..=MAX_RECIPIENTS as u64 + 1).collect();
        assert_eq!(
            check_send(u64::MAX, 5_000, 1, &many),
            ResultCode::BadRequest
        );
    }

    #[test]
    fn campaign_rules_in_order() {
        let shake = ShakeCampaignRequest {
            packets: 10,
            rate_per_sec: 5,
            amount_min: 1,
            amount_max: 9,
        };
        assert!(shake.check().is_ok());
        let bad = ShakeCampaignRequest {
            packets: 0,
            amount_min: 0,
            ..shake.clone()
        };
        let refused = bad.check().unwrap_err();
        assert_eq!(refused.kind(), crate::ErrorKind::Refused);
        assert_eq!(
            refused.to_string(),
            "packets is 0: it must be from 1 to 100000000"
        );
        let send = SendCampaignRequest {
            packets: 1,
            rate_per_sec: 1,
            recipients: 3,
            user_min: 1,
            user_max: 2,
            amount_min: 3,
            amount_max: 10,
        };
        assert_eq!(
            send.check().unwrap_err().to_string(),
            "the user range holds fewer users than recipients"
        );
        assert_eq!(
            SendCampaignRequest {
                amount_min: 2,
                ..send
            }
            .check()
            .unwrap_err()
            .to_string(),
            "amount_min is 2: it must be at least 3 cents, one for each of the 3 shares"
        );
        assert_eq!(shake_packet_parts(shake_packet_id(7, 9)), (7, 9));
    }
}
