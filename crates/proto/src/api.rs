//! The HTTP API's answers (docs/http-api.md), typed: the gateway writes them
//! (`worker/http.rs`), the load reads them (`client/receive.rs`), and the docs test reads
//! the page's examples through them. One struct an answer; `result` is a `ResultCode` by
//! its name. Written through `serde_json::Value`, so the keys come out sorted, as they
//! always have.

use serde::{Deserialize, Serialize};

use crate::ResultCode;

/// `POST /v1/shake` and `POST /v1/packets/{id}/open`: what was won or opened (a packet of
/// 0 and 0 cents for nothing); with `overloaded`, how long to wait before shaking again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taken {
    #[serde(default)]
    pub amount_cents: u64,
    #[serde(default)]
    pub packet_id: u64,
    #[serde(with = "by_name")]
    pub result: ResultCode,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_after_ms: u32,
}

/// `POST /v1/packets`: the packet sent, and the sender's balance after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    pub balance_cents: u64,
    pub packet_id: u64,
    #[serde(with = "by_name")]
    pub result: ResultCode,
}

/// `POST /v1/chat`: only the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    #[serde(with = "by_name")]
    pub result: ResultCode,
}

/// A login's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedIn {
    #[serde(with = "by_name")]
    pub result: ResultCode,
    pub user_id: u64,
}

/// `POST /v1/ping`: the client's time back, and the server's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    pub client_time_us: u64,
    #[serde(with = "by_name")]
    pub result: ResultCode,
    pub server_time_us: u64,
}

/// `GET /v1/me`: the user's balance and newest events, as the ledger stores them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Me {
    pub balance_cents: u64,
    pub recent_events: Vec<serde_json::Value>,
    #[serde(with = "by_name")]
    pub result: ResultCode,
    pub user: u64,
}

/// `GET /v1/notices`: the sent packets naming the user that it has not opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notices {
    #[serde(default)]
    pub notices: Vec<PacketNotice>,
    #[serde(with = "by_name")]
    pub result: ResultCode,
}

/// One packet of `Notices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketNotice {
    pub amount_cents: u64,
    pub expires_at_ms: u64,
    /// `None` for a system campaign's packet.
    pub from_user: Option<u64>,
    pub packet_id: u64,
    pub shares: u32,
}

/// A request refused: why, and for `rate-limited` when to try again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub error: String,
    #[serde(with = "by_name")]
    pub result: ResultCode,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_after_ms: u32,
}

/// `GET /token?user=N` (the demo login): a token of that user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemoToken {
    pub token: String,
    pub user_id: u64,
}

/// An answer as the API writes it: its JSON, keys sorted.
pub fn to_body(answer: &impl Serialize) -> String {
    serde_json::to_value(answer)
        .expect("an answer is JSON")
        .to_string()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A `ResultCode` as its name (`"ok"`, `"overloaded"`, …).
mod by_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::ResultCode;

    pub fn serialize<S: Serializer>(result: &ResultCode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(result.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ResultCode, D::Error> {
        let name = String::deserialize(d)?;
        ResultCode::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("no result named {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_back_and_keep_their_sorted_keys() {
        let taken = Taken {
            amount_cents: 12,
            packet_id: 7,
            result: ResultCode::Ok,
            retry_after_ms: 0,
        };
        let body = to_body(&taken);
        assert_eq!(body, r#"{"amount_cents":12,"packet_id":7,"result":"ok"}"#);
        assert_eq!(serde_json::from_str::<Taken>(&body).unwrap(), taken);
        // A refusal reads as a shake's answer too: nothing won, and the wait.
        let refused = to_body(&Refused {
            error: "slow down".into(),
            result: ResultCode::RateLimited,
            retry_after_ms: 1500,
        });
        let read: Taken = serde_json::from_str(&refused).unwrap();
        assert_eq!(
            (read.result, read.packet_id, read.retry_after_ms),
            (ResultCode::RateLimited, 0, 1500)
        );
        assert!(serde_json::from_str::<Done>(r#"{"result":"no-such"}"#).is_err());
        let notices: Notices = serde_json::from_str(
            r#"{"result":"ok","notices":[{"packet_id":3,"from_user":null,"amount_cents":5,"shares":2,"expires_at_ms":9}]}"#,
        )
        .unwrap();
        assert_eq!(notices.notices[0].from_user, None);
    }
}
