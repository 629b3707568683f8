//! The messages of the hongbao wire protocol, both directions, as plain values.
//!
//! `frame.rs` turns these into bytes and back; nothing here does I/O. The byte layout of
//! every message is written down in `docs/protocol.md`, and `testdata/golden.txt` holds
//! one encoded example of each so clients in other languages can check themselves.

/// Protocol version carried in every frame header. Version 2 (issue 44) made the login
/// token a JWT of up to [`MAX_TOKEN_LEN`] bytes (a `u16` length), and added `refresh`,
/// `rate-limited` and `retry_after_ms` on `error`.
pub const VERSION: u8 = 2;

/// The oldest version a server still reads: a version-1 `Login` carries its token with
/// a `u8` length (the HMAC token of old clients, accepted only where the server is told
/// to: `hmac_login`); every other version-1 frame reads as in version 2.
pub const MIN_VERSION: u8 = 1;

/// Largest frame body (everything after the 4-byte length prefix), in bytes.
/// A peer announcing more is cut off before anything is allocated.
pub const MAX_FRAME_LEN: usize = 16 * 1024;

/// Length prefix (u32) + version (u8) + type (u8) + request id (u32).
pub const HEADER_LEN: usize = 10;

/// Most recipients a single send may name.
pub const MAX_RECIPIENTS: usize = 1000;

/// Longest chat, broadcast or kick text, in bytes of UTF-8.
pub const MAX_TEXT_LEN: usize = 4096;

/// Longest login token, in bytes: a JWT's compact form (an HS256 one with a handful of
/// claims is about 200 bytes, an ES256 one about 250).
pub const MAX_TOKEN_LEN: usize = 2048;

/// Whether `token` may be a version-2 login token: printable ASCII only (no spaces), as a
/// JWT's compact form is (base64url and dots). It may be empty (the server refuses it as
/// `bad-token`); what it is signed with is the server's to check, not the codec's.
pub fn valid_token_bytes(token: &[u8]) -> bool {
    token.iter().all(|b| b.is_ascii_graphic())
}

/// Longest token a version-1 `Login` carries (its length is a `u8`).
pub const MAX_V1_TOKEN_LEN: usize = 255;

/// Longest idempotency key of a send, in bytes (printable ASCII; a UUID is 36).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 64;

/// Whether `key` may be an idempotency key: 1..=`MAX_IDEMPOTENCY_KEY_LEN` bytes of
/// printable ASCII (no spaces).
pub fn valid_idempotency_key(key: &str) -> bool {
    (1..=MAX_IDEMPOTENCY_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

/// One frame: a request id chosen by the client (echoed in the reply; 0 on server pushes)
/// and the message it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub request_id: u32,
    pub message: Message,
}

/// Every message of the protocol. Client→server kinds have type codes below 0x80,
/// server→client kinds 0x80 and above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    // client → server
    /// Prove who we are: `token` is a JWT's compact form (`docs/protocol.md`, Login
    /// tokens); `user_id` is the token's `sub`, or 0 for "whoever the token names".
    /// Sent again on a logged-in connection (same user), it refreshes the session.
    Login {
        user_id: u64,
        token: Vec<u8>,
    },
    /// Try to win a shake packet.
    Shake,
    /// Send `amount_cents` split into `shares` shares for `recipients`. A send retried
    /// with the same `idempotency_key` gets the first answer and moves no money twice.
    Send {
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
        idempotency_key: Option<String>,
    },
    /// Open (拆) my share of a sent packet.
    Open {
        packet_id: u64,
    },
    /// Route a text to another user's connection.
    Chat {
        to_user: u64,
        text: String,
    },
    /// Liveness and clock probe; answered by `Pong`.
    Ping {
        client_time_us: u64,
    },

    // server → client: replies (carry the request id of what they answer)
    LoginReply {
        result: ResultCode,
        user_id: u64,
    },
    ShakeReply {
        result: ResultCode,
        packet_id: u64,
        amount_cents: u64,
        /// With `overloaded`: how long the server asks the client not to shake (ms);
        /// 0 when it names no time (and with every other result).
        retry_after_ms: u32,
    },
    SendReply {
        result: ResultCode,
        packet_id: u64,
        balance_cents: u64,
    },
    OpenReply {
        result: ResultCode,
        packet_id: u64,
        amount_cents: u64,
    },
    ChatReply {
        result: ResultCode,
    },
    Pong {
        client_time_us: u64,
        server_time_us: u64,
    },
    /// A frame the server could not act on (unknown type, bad payload, not logged in),
    /// or a request refused before it was looked at (`rate-limited`: `retry_after_ms`
    /// says when to try again; 0 with every other result).
    Error {
        result: ResultCode,
        text: String,
        retry_after_ms: u32,
    },

    // server → client: pushes (request id 0)
    /// A sent packet names you as a recipient. `from_user` 0 means a system campaign.
    PacketNotice {
        packet_id: u64,
        from_user: u64,
        amount_cents: u64,
        shares: u32,
        expires_at_ms: u64,
    },
    ChatMessage {
        from_user: u64,
        text: String,
    },
    /// Operator broadcast, stamped with the server's send time (µs since the Unix epoch).
    Broadcast {
        server_time_us: u64,
        text: String,
    },
    /// The server is closing this connection, and why. `retry_after_ms` (0: none) is
    /// the server's hint: come back after about that long (a drain, a restart). Without
    /// one, the reason says whether to come back at all (`KickReason::comes_back`).
    Kick {
        reason: KickReason,
        text: String,
        retry_after_ms: u32,
    },
    /// The session's token expires at `expires_at_ms` (ms since the Unix epoch): send a
    /// `Login` with a fresh token on this connection before then, or be kicked
    /// `expired`.
    Refresh {
        expires_at_ms: u64,
    },
}

/// Type codes on the wire, one per `Message` variant.
pub mod kind {
    pub const LOGIN: u8 = 0x01;
    pub const SHAKE: u8 = 0x02;
    pub const SEND: u8 = 0x03;
    pub const OPEN: u8 = 0x04;
    pub const CHAT: u8 = 0x05;
    pub const PING: u8 = 0x06;
    pub const LOGIN_REPLY: u8 = 0x81;
    pub const SHAKE_REPLY: u8 = 0x82;
    pub const SEND_REPLY: u8 = 0x83;
    pub const OPEN_REPLY: u8 = 0x84;
    pub const CHAT_REPLY: u8 = 0x85;
    pub const PONG: u8 = 0x86;
    pub const ERROR: u8 = 0x87;
    pub const PACKET_NOTICE: u8 = 0x90;
    pub const CHAT_MESSAGE: u8 = 0x91;
    pub const BROADCAST: u8 = 0x92;
    pub const KICK: u8 = 0x93;
    pub const REFRESH: u8 = 0x94;

    /// Every type code, in the order above.
    pub const ALL: [u8; 18] = [
        LOGIN,
        SHAKE,
        SEND,
        OPEN,
        CHAT,
        PING,
        LOGIN_REPLY,
        SHAKE_REPLY,
        SEND_REPLY,
        OPEN_REPLY,
        CHAT_REPLY,
        PONG,
        ERROR,
        PACKET_NOTICE,
        CHAT_MESSAGE,
        BROADCAST,
        KICK,
        REFRESH,
    ];
}

impl Message {
    /// The wire type code of this message.
    pub fn kind(&self) -> u8 {
        use Message::*;
        match self {
            Login { .. } => kind::LOGIN,
            Shake => kind::SHAKE,
            Send { .. } => kind::SEND,
            Open { .. } => kind::OPEN,
            Chat { .. } => kind::CHAT,
            Ping { .. } => kind::PING,
            LoginReply { .. } => kind::LOGIN_REPLY,
            ShakeReply { .. } => kind::SHAKE_REPLY,
            SendReply { .. } => kind::SEND_REPLY,
            OpenReply { .. } => kind::OPEN_REPLY,
            ChatReply { .. } => kind::CHAT_REPLY,
            Pong { .. } => kind::PONG,
            Error { .. } => kind::ERROR,
            PacketNotice { .. } => kind::PACKET_NOTICE,
            ChatMessage { .. } => kind::CHAT_MESSAGE,
            Broadcast { .. } => kind::BROADCAST,
            Kick { .. } => kind::KICK,
            Refresh { .. } => kind::REFRESH,
        }
    }

    /// True for the kinds a client may send.
    pub fn is_client_kind(&self) -> bool {
        self.kind() < 0x80
    }
}

/// The outcome named in every reply. One namespace for all replies so a result byte means
/// the same thing wherever it appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum ResultCode {
    Ok = 0,
    Won = 1,
    Nothing = 2,
    Overloaded = 3,
    Opened = 4,
    AlreadyOpened = 5,
    Empty = 6,
    NotARecipient = 7,
    Expired = 8,
    InsufficientFunds = 9,
    BadRequest = 10,
    Delivered = 11,
    Offline = 12,
    BadToken = 13,
    NotLoggedIn = 14,
    UnknownType = 15,
    NoSuchPacket = 16,
    Unavailable = 17,
    /// Over a per-user limit: the reply says how long to wait (`retry_after_ms`).
    RateLimited = 18,
}

impl ResultCode {
    pub const ALL: [ResultCode; 19] = [
        ResultCode::Ok,
        ResultCode::Won,
        ResultCode::Nothing,
        ResultCode::Overloaded,
        ResultCode::Opened,
        ResultCode::AlreadyOpened,
        ResultCode::Empty,
        ResultCode::NotARecipient,
        ResultCode::Expired,
        ResultCode::InsufficientFunds,
        ResultCode::BadRequest,
        ResultCode::Delivered,
        ResultCode::Offline,
        ResultCode::BadToken,
        ResultCode::NotLoggedIn,
        ResultCode::UnknownType,
        ResultCode::NoSuchPacket,
        ResultCode::Unavailable,
        ResultCode::RateLimited,
    ];

    pub fn from_u8(b: u8) -> Option<ResultCode> {
        Self::ALL.get(b as usize).copied()
    }

    /// The name used in docs, JSON and metrics labels: `already-opened`, `won`, ...
    pub fn name(self) -> &'static str {
        use ResultCode::*;
        match self {
            Ok => "ok",
            Won => "won",
            Nothing => "nothing",
            Overloaded => "overloaded",
            Opened => "opened",
            AlreadyOpened => "already-opened",
            Empty => "empty",
            NotARecipient => "not-a-recipient",
            Expired => "expired",
            InsufficientFunds => "insufficient-funds",
            BadRequest => "bad-request",
            Delivered => "delivered",
            Offline => "offline",
            BadToken => "bad-token",
            NotLoggedIn => "not-logged-in",
            UnknownType => "unknown-type",
            NoSuchPacket => "no-such-packet",
            Unavailable => "unavailable",
            RateLimited => "rate-limited",
        }
    }

    pub fn from_name(name: &str) -> Option<ResultCode> {
        Self::ALL.iter().copied().find(|r| r.name() == name)
    }

    /// Its place in `ALL` (its wire byte), for tables indexed by result.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why the server closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum KickReason {
    /// The same user logged in on another connection.
    Replaced = 1,
    /// Login failed (bad token).
    BadToken = 2,
    /// The byte stream cannot be read as frames (bad length, bad version).
    BadFrame = 3,
    /// The client did not log in, or went silent, for too long.
    Idle = 4,
    /// The client does not read what it is sent.
    SlowReader = 5,
    /// The server is shutting down.
    Shutdown = 6,
    /// The session's token expired and no fresh one came.
    Expired = 7,
    /// The user's tokens were revoked, or the key that signed this one was removed.
    Revoked = 8,
}

impl KickReason {
    pub const ALL: [KickReason; 8] = [
        KickReason::Replaced,
        KickReason::BadToken,
        KickReason::BadFrame,
        KickReason::Idle,
        KickReason::SlowReader,
        KickReason::Shutdown,
        KickReason::Expired,
        KickReason::Revoked,
    ];

    pub fn from_u8(b: u8) -> Option<KickReason> {
        Self::ALL.iter().copied().find(|r| *r as u8 == b)
    }

    pub fn name(self) -> &'static str {
        match self {
            KickReason::Replaced => "replaced",
            KickReason::BadToken => "bad-token",
            KickReason::BadFrame => "bad-frame",
            KickReason::Idle => "idle",
            KickReason::SlowReader => "slow-reader",
            KickReason::Shutdown => "shutdown",
            KickReason::Expired => "expired",
            KickReason::Revoked => "revoked",
        }
    }

    pub fn from_name(name: &str) -> Option<KickReason> {
        Self::ALL.iter().copied().find(|r| r.name() == name)
    }

    /// Whether a client kicked for this reason comes back by itself (after the kick's
    /// `retry_after_ms`, or its own back-off when the kick names none). The others are
    /// terminal: another connection holds the session (`replaced`), the token or the user
    /// is refused (`bad-token`, `revoked`), or the token ended and the app gave no fresh
    /// one (`expired`); coming back with the same token would only repeat them.
    pub fn comes_back(self) -> bool {
        match self {
            KickReason::Idle
            | KickReason::SlowReader
            | KickReason::Shutdown
            | KickReason::BadFrame => true,
            KickReason::Replaced
            | KickReason::BadToken
            | KickReason::Expired
            | KickReason::Revoked => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Results and kick reasons serialize under the names the docs, JSON and metrics use.
    #[test]
    fn serde_names_are_the_documented_names() {
        for r in ResultCode::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
            assert_eq!(r.index(), r as u8 as usize);
        }
        for k in KickReason::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.name());
        }
    }
}
