//! What the gateways and the money side say to each other, free of any transport: a
//! `Request` is what a client asked (a codec made it from a binary frame, a WebSocket
//! message or an HTTP request), a `Reply` answers one request, a `Push` is sent unasked.
//! The wire seam in the gateway encodes replies and pushes for each transport; nothing
//! here knows bytes.

use hongbao_proto::{KickReason, ResultCode};
use serde::{Deserialize, Serialize};

use crate::api::{Notice, UserView};
use crate::ids::UserId;

/// What a client asks, whatever carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Prove who we are (binary frames and WebSocket; HTTP carries a bearer token instead).
    /// `legacy`: a version-1 login, whose token is the old HMAC one (32 raw bytes or 64
    /// hex), never a JWT.
    Login {
        user_id: u64,
        token: Vec<u8>,
        legacy: bool,
    },
    Ping {
        client_time_us: u64,
    },
    Shake,
    /// `idempotency_key`: a retry with the same key returns the first answer and moves no
    /// money twice.
    Send {
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
        idempotency_key: Option<String>,
    },
    Open {
        packet_id: u64,
    },
    Chat {
        to_user: u64,
        text: String,
    },
    /// The caller's balance and recent ledger events.
    Me,
    /// Packets waiting for the caller to open them.
    Notices,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Login {
        result: ResultCode,
        user_id: u64,
    },
    Pong {
        client_time_us: u64,
        server_time_us: u64,
    },
    Shake {
        result: ResultCode,
        packet_id: u64,
        amount_cents: u64,
        /// With `overloaded`: how long the client is asked not to shake (ms), 0 for none.
        #[serde(default)]
        retry_after_ms: u32,
    },
    Send {
        result: ResultCode,
        packet_id: u64,
        balance_cents: u64,
    },
    Open {
        result: ResultCode,
        packet_id: u64,
        amount_cents: u64,
    },
    Chat {
        result: ResultCode,
    },
    /// Carried as JSON text: its events are the ledger's JSON, which only a
    /// self-describing format reads back.
    Me(#[serde(with = "as_json")] UserView),
    Notices(Vec<Notice>),
    /// A request that could not be acted on (not logged in, malformed, server-only).
    Error {
        result: ResultCode,
        text: String,
    },
    /// Over one of the user's limits (`rate-limited`): try again after `retry_after_ms`.
    /// A shake's is a `Shake` reply instead, as its other refusals are.
    RateLimited {
        retry_after_ms: u32,
        text: String,
    },
}

impl Reply {
    /// The result it names (`ok` for the views, which always succeed).
    pub fn result(&self) -> ResultCode {
        match self {
            Reply::Login { result, .. }
            | Reply::Shake { result, .. }
            | Reply::Send { result, .. }
            | Reply::Open { result, .. }
            | Reply::Chat { result }
            | Reply::Error { result, .. } => *result,
            Reply::RateLimited { .. } => ResultCode::RateLimited,
            Reply::Pong { .. } | Reply::Me(_) | Reply::Notices(_) => ResultCode::Ok,
        }
    }
}

/// Sent to a connection unasked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Push {
    Notice(Notice),
    Chat {
        from_user: UserId,
        text: String,
    },
    Broadcast {
        server_time_us: u64,
        text: String,
    },
    /// The connection is about to close, and why; `retry_after_ms` (0: none) is when to
    /// come back (`Message::Kick`).
    Kick {
        reason: KickReason,
        text: String,
        #[serde(default)]
        retry_after_ms: u32,
    },
    /// The session's token expires at `expires_at_ms`: send a fresh one.
    Refresh {
        expires_at_ms: u64,
    },
}

mod as_json {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(value).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}
