//! Bytes ↔ frames, with no I/O.
//!
//! A frame on the wire, all integers big-endian:
//!
//! ```text
//! [len: u32][version: u8][type: u8][request_id: u32][payload ...]
//! ```
//!
//! `len` counts the bytes after the length prefix, so `len = 6 + payload length`. The
//! connection calls [`check`] on whatever it has buffered: it reads only the header and
//! never allocates, so a peer announcing a huge frame is refused before any memory is
//! reserved for it. Once `check` says a whole frame is there, [`decode`] turns exactly
//! those bytes into a [`Frame`]. [`encode`] appends one frame to an output buffer.
//!
//! Errors come in two grades (see [`FrameError::is_fatal`]): a bad length or version
//! means the byte stream can no longer be cut into frames, so the connection must go; an
//! unknown type or a malformed payload still has a known end, so the server answers with
//! an `Error` carrying the frame's request id and reads on.
//!
//! Payload layouts are listed on [`decode_message`] and in `docs/protocol.md`.

use crate::message::{
    kind, valid_idempotency_key, valid_token_bytes, Frame, KickReason, Message, ResultCode,
    HEADER_LEN, MAX_FRAME_LEN, MAX_IDEMPOTENCY_KEY_LEN, MAX_RECIPIENTS, MAX_TEXT_LEN,
    MAX_TOKEN_LEN, MIN_VERSION, VERSION,
};

/// Bytes of the length prefix.
const PREFIX_LEN: usize = 4;

/// Smallest legal value of the length field: version + type + request id.
const MIN_BODY_LEN: usize = HEADER_LEN - PREFIX_LEN;

/// Everything that can be wrong with bytes offered as a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field announces more than [`MAX_FRAME_LEN`].
    #[error("frame length {len} over limit {MAX_FRAME_LEN}")]
    TooLong { len: usize },
    /// The length field is too small to hold the header.
    #[error("frame length {len} under the {MIN_BODY_LEN}-byte minimum")]
    TooShort { len: usize },
    /// The version byte is not one this side reads ([`MIN_VERSION`]..=[`VERSION`]).
    #[error("frame version {version}, expected {MIN_VERSION} to {VERSION}")]
    BadVersion { version: u8 },
    /// `decode` was handed fewer bytes than the frame announces (a caller bug: use
    /// `check` first).
    #[error("incomplete frame: {have} bytes given, {need} needed")]
    Incomplete { have: usize, need: usize },
    /// `decode` was handed more bytes than the frame announces (a caller bug: cut the
    /// buffer at the length `check` returned).
    #[error("{extra} bytes given after the end of the frame")]
    TrailingBytes { extra: usize },
    /// A well-delimited frame whose type code we do not know.
    #[error("unknown message type 0x{kind:02x} in request {request_id}")]
    UnknownType { kind: u8, request_id: u32 },
    /// A well-delimited frame of a known type whose payload does not follow its layout.
    #[error("bad payload for message type 0x{kind:02x} in request {request_id}: {why}")]
    BadPayload {
        kind: u8,
        request_id: u32,
        why: PayloadError,
    },
}

/// What is wrong inside a payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("{field} needs {need} bytes, {have} left")]
    Short {
        field: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{extra} bytes after the last field")]
    Trailing { extra: usize },
    #[error("{field} is not valid UTF-8")]
    BadUtf8 { field: &'static str },
    #[error("unknown result code {code}")]
    UnknownResult { code: u8 },
    #[error("unknown kick reason {code}")]
    UnknownKickReason { code: u8 },
    #[error("{count} recipients over limit {MAX_RECIPIENTS}")]
    TooManyRecipients { count: usize },
    #[error("text of {len} bytes over limit {MAX_TEXT_LEN}")]
    TextTooLong { len: usize },
    #[error("token of {len} bytes over limit {MAX_TOKEN_LEN}")]
    TokenTooLong { len: usize },
    #[error("token is not printable ASCII (a JWT's compact form)")]
    TokenNotAscii,
    #[error("idempotency key is not 1..={MAX_IDEMPOTENCY_KEY_LEN} bytes of printable ASCII")]
    BadIdempotencyKey,
    #[error("retry_after_ms 0 is sent by leaving it out")]
    ZeroRetryAfter,
}

impl FrameError {
    /// True when the byte stream cannot be resynchronised after this error (the frame's
    /// end is unknown or untrustworthy), so the connection has to be closed. False when
    /// the frame was well delimited and only its contents were unusable.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            FrameError::UnknownType { .. } | FrameError::BadPayload { .. }
        )
    }

    /// The request id of the offending frame, for the `Error` reply to a non-fatal error.
    pub fn request_id(&self) -> Option<u32> {
        match self {
            FrameError::UnknownType { request_id, .. }
            | FrameError::BadPayload { request_id, .. } => Some(*request_id),
            _ => None,
        }
    }

    /// The result code the server answers a non-fatal error with (`unknown-type` or
    /// `bad-request`); `None` for fatal errors, which are answered with a kick.
    pub fn result_code(&self) -> Option<ResultCode> {
        match self {
            FrameError::UnknownType { .. } => Some(ResultCode::UnknownType),
            FrameError::BadPayload { .. } => Some(ResultCode::BadRequest),
            _ => None,
        }
    }

    /// A stable short name for this kind of error, as used in `testdata/golden.txt` and
    /// metrics labels. Payload errors are named for what is wrong with the payload.
    pub fn name(&self) -> &'static str {
        match self {
            FrameError::TooLong { .. } => "too-long",
            FrameError::TooShort { .. } => "too-short",
            FrameError::BadVersion { .. } => "bad-version",
            FrameError::Incomplete { .. } => "incomplete",
            FrameError::TrailingBytes { .. } => "trailing-bytes",
            FrameError::UnknownType { .. } => "unknown-type",
            FrameError::BadPayload { why, .. } => why.name(),
        }
    }
}

impl PayloadError {
    /// A stable short name, see [`FrameError::name`].
    pub fn name(&self) -> &'static str {
        match self {
            PayloadError::Short { .. } => "short-payload",
            PayloadError::Trailing { .. } => "trailing-payload",
            PayloadError::BadUtf8 { .. } => "bad-utf8",
            PayloadError::UnknownResult { .. } => "unknown-result",
            PayloadError::UnknownKickReason { .. } => "unknown-kick-reason",
            PayloadError::TooManyRecipients { .. } => "too-many-recipients",
            PayloadError::TextTooLong { .. } => "text-too-long",
            PayloadError::TokenTooLong { .. } => "token-too-long",
            PayloadError::TokenNotAscii => "token-not-ascii",
            PayloadError::BadIdempotencyKey => "bad-idempotency-key",
            PayloadError::ZeroRetryAfter => "zero-retry-after",
        }
    }
}

/// Looks at the start of `buf` and says whether a whole frame is there.
///
/// `Ok(None)`: not yet, read more. `Ok(Some(n))`: the first `n` bytes (length prefix
/// included) are one frame, hand them to [`decode`]. `Err`: the length is out of bounds
/// (reported as soon as the 4 length bytes are in) or the version is wrong (as soon as
/// that byte is in); these errors are always fatal. Never allocates.
pub fn check(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*prefix) as usize;
    if len > MAX_FRAME_LEN {
        return Err(FrameError::TooLong { len });
    }
    if len < MIN_BODY_LEN {
        return Err(FrameError::TooShort { len });
    }
    if let Some(&version) = buf.get(PREFIX_LEN) {
        if !(MIN_VERSION..=VERSION).contains(&version) {
            return Err(FrameError::BadVersion { version });
        }
    }
    let total = PREFIX_LEN + len;
    Ok((buf.len() >= total).then_some(total))
}

/// The request id in a frame's header, or 0 if `frame` is too short to have one. Lets a
/// caller name the request even when [`decode`] fails.
pub fn request_id_of(frame: &[u8]) -> u32 {
    match frame.get(6..HEADER_LEN) {
        Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        None => 0,
    }
}

/// Decodes exactly one whole frame: `frame` must be the bytes [`check`] delimited, no
/// more and no fewer.
///
/// Allocates at most what the message's own strings and recipient list need, each
/// bounded by the frame's length and by the protocol limits.
pub fn decode(frame: &[u8]) -> Result<Frame, FrameError> {
    let total = match check(frame)? {
        Some(total) => total,
        None => {
            let need = frame
                .first_chunk::<PREFIX_LEN>()
                .map_or(PREFIX_LEN, |p| PREFIX_LEN + u32::from_be_bytes(*p) as usize);
            return Err(FrameError::Incomplete {
                have: frame.len(),
                need,
            });
        }
    };
    if frame.len() > total {
        return Err(FrameError::TrailingBytes {
            extra: frame.len() - total,
        });
    }
    let version = frame[PREFIX_LEN];
    let kind = frame[PREFIX_LEN + 1];
    let request_id = request_id_of(frame);
    let payload = &frame[HEADER_LEN..];
    let decoded = if version == 1 && kind == kind::LOGIN {
        decode_v1_login(payload).map(Some)
    } else {
        decode_message(kind, payload)
    };
    match decoded {
        Ok(Some(message)) => Ok(Frame {
            request_id,
            message,
        }),
        Ok(None) => Err(FrameError::UnknownType { kind, request_id }),
        Err(why) => Err(FrameError::BadPayload {
            kind,
            request_id,
            why,
        }),
    }
}

/// A version-1 `Login`: user_id u64, token_len u8, token (≤ [`crate::message::MAX_V1_TOKEN_LEN`]). What
/// old clients send (the HMAC token); the server decides whether it accepts such a token.
fn decode_v1_login(payload: &[u8]) -> Result<Message, PayloadError> {
    let mut r = Reader { rest: payload };
    let user_id = r.u64("user_id")?;
    let len = r.u8("token_len")? as usize;
    let token = r.bytes("token", len)?.to_vec();
    if !r.rest.is_empty() {
        return Err(PayloadError::Trailing {
            extra: r.rest.len(),
        });
    }
    Ok(Message::Login { user_id, token })
}

/// Decodes one payload of type `kind` (version 2); `Ok(None)` if the type is unknown.
///
/// Layouts (big-endian; `text` is `text_len: u16` then that many bytes of UTF-8, at most
/// [`MAX_TEXT_LEN`]):
///
/// | message      | payload                                                             |
/// |--------------|---------------------------------------------------------------------|
/// | Login        | user_id u64, token_len u16, token (≤ [`MAX_TOKEN_LEN`]; version 1: token_len u8) |
/// | Shake        | (empty)                                                             |
/// | Send         | amount_cents u64, shares u32, count u16 (≤ [`MAX_RECIPIENTS`]), count × u64, then optionally key_len u8 + key (an idempotency key, [`valid_idempotency_key`]) |
/// | Open         | packet_id u64                                                       |
/// | Chat         | to_user u64, text                                                   |
/// | Ping         | client_time_us u64                                                  |
/// | LoginReply   | result u8, user_id u64                                              |
/// | ShakeReply   | result u8, packet_id u64, amount_cents u64, then retry_after_ms u32 when it is not 0 |
/// | SendReply    | result u8, packet_id u64, balance_cents u64                         |
/// | OpenReply    | result u8, packet_id u64, amount_cents u64                          |
/// | ChatReply    | result u8                                                           |
/// | Pong         | client_time_us u64, server_time_us u64                              |
/// | Error        | result u8, text, then retry_after_ms u32 when it is not 0           |
/// | PacketNotice | packet_id u64, from_user u64, amount_cents u64, shares u32, expires_at_ms u64 |
/// | ChatMessage  | from_user u64, text                                                 |
/// | Broadcast    | server_time_us u64, text                                            |
/// | Kick         | reason u8, text, then retry_after_ms u32 when it is not 0           |
/// | Refresh      | expires_at_ms u64                                                   |
pub fn decode_message(kind: u8, payload: &[u8]) -> Result<Option<Message>, PayloadError> {
    let mut r = Reader { rest: payload };
    let message = match kind {
        kind::LOGIN => {
            let user_id = r.u64("user_id")?;
            let len = r.u16("token_len")? as usize;
            if len > MAX_TOKEN_LEN {
                return Err(PayloadError::TokenTooLong { len });
            }
            let token = r.bytes("token", len)?;
            if !valid_token_bytes(token) {
                return Err(PayloadError::TokenNotAscii);
            }
            Message::Login {
                user_id,
                token: token.to_vec(),
            }
        }
        kind::SHAKE => Message::Shake,
        kind::SEND => {
            let amount_cents = r.u64("amount_cents")?;
            let shares = r.u32("shares")?;
            let count = r.u16("count")? as usize;
            if count > MAX_RECIPIENTS {
                return Err(PayloadError::TooManyRecipients { count });
            }
            // Check the ids are really there before reserving room for them.
            let ids = r.bytes("recipients", count * 8)?;
            let recipients = ids
                .chunks_exact(8)
                .map(|c| u64::from_be_bytes(c.try_into().expect("chunks of 8")))
                .collect();
            let idempotency_key = if r.rest.is_empty() {
                None
            } else {
                let len = r.u8("key_len")? as usize;
                let key = std::str::from_utf8(r.bytes("key", len)?)
                    .ok()
                    .filter(|k| valid_idempotency_key(k))
                    .ok_or(PayloadError::BadIdempotencyKey)?;
                Some(key.to_string())
            };
            Message::Send {
                amount_cents,
                shares,
                recipients,
                idempotency_key,
            }
        }
        kind::OPEN => Message::Open {
            packet_id: r.u64("packet_id")?,
        },
        kind::CHAT => Message::Chat {
            to_user: r.u64("to_user")?,
            text: r.text()?,
        },
        kind::PING => Message::Ping {
            client_time_us: r.u64("client_time_us")?,
        },
        kind::LOGIN_REPLY => Message::LoginReply {
            result: r.result()?,
            user_id: r.u64("user_id")?,
        },
        kind::SHAKE_REPLY => Message::ShakeReply {
            result: r.result()?,
            packet_id: r.u64("packet_id")?,
            amount_cents: r.u64("amount_cents")?,
            retry_after_ms: r.retry_after()?,
        },
        kind::SEND_REPLY => Message::SendReply {
            result: r.result()?,
            packet_id: r.u64("packet_id")?,
            balance_cents: r.u64("balance_cents")?,
        },
        kind::OPEN_REPLY => Message::OpenReply {
            result: r.result()?,
            packet_id: r.u64("packet_id")?,
            amount_cents: r.u64("amount_cents")?,
        },
        kind::CHAT_REPLY => Message::ChatReply {
            result: r.result()?,
        },
        kind::PONG => Message::Pong {
            client_time_us: r.u64("client_time_us")?,
            server_time_us: r.u64("server_time_us")?,
        },
        kind::ERROR => Message::Error {
            result: r.result()?,
            text: r.text()?,
            retry_after_ms: r.retry_after()?,
        },
        kind::PACKET_NOTICE => Message::PacketNotice {
            packet_id: r.u64("packet_id")?,
            from_user: r.u64("from_user")?,
            amount_cents: r.u64("amount_cents")?,
            shares: r.u32("shares")?,
            expires_at_ms: r.u64("expires_at_ms")?,
        },
        kind::CHAT_MESSAGE => Message::ChatMessage {
            from_user: r.u64("from_user")?,
            text: r.text()?,
        },
        kind::BROADCAST => Message::Broadcast {
            server_time_us: r.u64("server_time_us")?,
            text: r.text()?,
        },
        kind::KICK => {
            let code = r.u8("reason")?;
            let reason =
                KickReason::from_u8(code).ok_or(PayloadError::UnknownKickReason { code })?;
            Message::Kick {
                reason,
                text: r.text()?,
                retry_after_ms: r.retry_after()?,
            }
        }
        kind::REFRESH => Message::Refresh {
            expires_at_ms: r.u64("expires_at_ms")?,
        },
        _ => return Ok(None),
    };
    if !r.rest.is_empty() {
        return Err(PayloadError::Trailing {
            extra: r.rest.len(),
        });
    }
    Ok(Some(message))
}

/// A cursor over a payload; every read names the field so errors can say what was short.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], PayloadError> {
        if self.rest.len() < n {
            return Err(PayloadError::Short {
                field,
                need: n,
                have: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], PayloadError> {
        Ok(self.bytes(field, N)?.try_into().expect("length checked"))
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, PayloadError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, PayloadError> {
        self.array(field).map(u16::from_be_bytes)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, PayloadError> {
        self.array(field).map(u32::from_be_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, PayloadError> {
        self.array(field).map(u64::from_be_bytes)
    }

    /// A trailing `retry_after_ms`: present only when not 0, so every message has one
    /// encoding.
    fn retry_after(&mut self) -> Result<u32, PayloadError> {
        if self.rest.is_empty() {
            return Ok(0);
        }
        match self.u32("retry_after_ms")? {
            0 => Err(PayloadError::ZeroRetryAfter),
            ms => Ok(ms),
        }
    }

    fn result(&mut self) -> Result<ResultCode, PayloadError> {
        let code = self.u8("result")?;
        ResultCode::from_u8(code).ok_or(PayloadError::UnknownResult { code })
    }

    fn text(&mut self) -> Result<String, PayloadError> {
        let len = self.u16("text_len")? as usize;
        if len > MAX_TEXT_LEN {
            return Err(PayloadError::TextTooLong { len });
        }
        let bytes = self.bytes("text", len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(PayloadError::BadUtf8 { field: "text" }),
        }
    }
}

/// Appends one encoded frame to `out`.
///
/// Never panics, and clamps what would not fit its length field: a text longer than
/// [`MAX_TEXT_LEN`] bytes is cut at the last char boundary at or before the limit (see
/// [`truncate_text`]); a token longer than 65535 bytes is cut to 65535; a recipient list
/// longer than 65535 is cut to 65535. Tokens over [`MAX_TOKEN_LEN`] and recipient lists
/// over [`MAX_RECIPIENTS`] are written as given (so tests can check the server refuses
/// them) and will not decode; neither will a frame whose body ends up over
/// [`MAX_FRAME_LEN`].
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; PREFIX_LEN]);
    out.push(VERSION);
    out.push(frame.message.kind());
    out.extend_from_slice(&frame.request_id.to_be_bytes());
    encode_payload(&frame.message, out);
    // The body is at most a few hundred KiB even with every clamp hit, so it fits a u32.
    let len = (out.len() - start - PREFIX_LEN) as u32;
    out[start..start + PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
}

/// One encoded frame in a fresh buffer.
pub fn encode_to_vec(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 32);
    encode(frame, &mut out);
    out
}

/// The longest prefix of `text` that is at most [`MAX_TEXT_LEN`] bytes and ends on a
/// char boundary: what [`encode`] puts on the wire.
pub fn truncate_text(text: &str) -> &str {
    if text.len() <= MAX_TEXT_LEN {
        return text;
    }
    let mut end = MAX_TEXT_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn encode_payload(message: &Message, out: &mut Vec<u8>) {
    use Message::*;
    match message {
        Login { user_id, token } => {
            out.extend_from_slice(&user_id.to_be_bytes());
            let token = &token[..token.len().min(u16::MAX as usize)];
            out.extend_from_slice(&(token.len() as u16).to_be_bytes());
            out.extend_from_slice(token);
        }
        Shake => {}
        Send {
            amount_cents,
            shares,
            recipients,
            idempotency_key,
        } => {
            out.extend_from_slice(&amount_cents.to_be_bytes());
            out.extend_from_slice(&shares.to_be_bytes());
            let recipients = &recipients[..recipients.len().min(u16::MAX as usize)];
            out.extend_from_slice(&(recipients.len() as u16).to_be_bytes());
            for id in recipients {
                out.extend_from_slice(&id.to_be_bytes());
            }
            if let Some(key) = idempotency_key {
                let key = &key.as_bytes()[..key.len().min(u8::MAX as usize)];
                out.push(key.len() as u8);
                out.extend_from_slice(key);
            }
        }
        Open { packet_id } => out.extend_from_slice(&packet_id.to_be_bytes()),
        Chat { to_user, text } => {
            out.extend_from_slice(&to_user.to_be_bytes());
            put_text(out, text);
        }
        Ping { client_time_us } => out.extend_from_slice(&client_time_us.to_be_bytes()),
        LoginReply { result, user_id } => {
            out.push(*result as u8);
            out.extend_from_slice(&user_id.to_be_bytes());
        }
        ShakeReply {
            result,
            packet_id,
            amount_cents,
            retry_after_ms,
        } => {
            out.push(*result as u8);
            out.extend_from_slice(&packet_id.to_be_bytes());
            out.extend_from_slice(&amount_cents.to_be_bytes());
            put_retry_after(out, *retry_after_ms);
        }
        OpenReply {
            result,
            packet_id,
            amount_cents,
        } => {
            out.push(*result as u8);
            out.extend_from_slice(&packet_id.to_be_bytes());
            out.extend_from_slice(&amount_cents.to_be_bytes());
        }
        SendReply {
            result,
            packet_id,
            balance_cents,
        } => {
            out.push(*result as u8);
            out.extend_from_slice(&packet_id.to_be_bytes());
            out.extend_from_slice(&balance_cents.to_be_bytes());
        }
        ChatReply { result } => out.push(*result as u8),
        Pong {
            client_time_us,
            server_time_us,
        } => {
            out.extend_from_slice(&client_time_us.to_be_bytes());
            out.extend_from_slice(&server_time_us.to_be_bytes());
        }
        Error {
            result,
            text,
            retry_after_ms,
        } => {
            out.push(*result as u8);
            put_text(out, text);
            put_retry_after(out, *retry_after_ms);
        }
        PacketNotice {
            packet_id,
            from_user,
            amount_cents,
            shares,
            expires_at_ms,
        } => {
            out.extend_from_slice(&packet_id.to_be_bytes());
            out.extend_from_slice(&from_user.to_be_bytes());
            out.extend_from_slice(&amount_cents.to_be_bytes());
            out.extend_from_slice(&shares.to_be_bytes());
            out.extend_from_slice(&expires_at_ms.to_be_bytes());
        }
        ChatMessage { from_user, text } => {
            out.extend_from_slice(&from_user.to_be_bytes());
            put_text(out, text);
        }
        Broadcast {
            server_time_us,
            text,
        } => {
            out.extend_from_slice(&server_time_us.to_be_bytes());
            put_text(out, text);
        }
        Kick {
            reason,
            text,
            retry_after_ms,
        } => {
            out.push(*reason as u8);
            put_text(out, text);
            put_retry_after(out, *retry_after_ms);
        }
        Refresh { expires_at_ms } => out.extend_from_slice(&expires_at_ms.to_be_bytes()),
    }
}

fn put_retry_after(out: &mut Vec<u8>, retry_after_ms: u32) {
    if retry_after_ms != 0 {
        out.extend_from_slice(&retry_after_ms.to_be_bytes());
    }
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    let text = truncate_text(text);
    // MAX_TEXT_LEN < u16::MAX, so the cast is exact.
    out.extend_from_slice(&(text.len() as u16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn frame(request_id: u32, message: Message) -> Frame {
        Frame {
            request_id,
            message,
        }
    }

    /// One of every message, with non-trivial field values (also used by `json.rs`).
    pub(crate) fn samples() -> Vec<Frame> {
        vec![
            frame(
                1,
                Message::Login {
                    user_id: 42,
                    token: b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2ln".to_vec(),
                },
            ),
            frame(2, Message::Shake),
            frame(
                3,
                Message::Send {
                    amount_cents: 10_000,
                    shares: 3,
                    recipients: vec![7, 8, u64::MAX],
                    idempotency_key: None,
                },
            ),
            frame(
                3,
                Message::Send {
                    amount_cents: 1,
                    shares: 1,
                    recipients: vec![],
                    idempotency_key: Some("order-7f3a".into()),
                },
            ),
            frame(4, Message::Open { packet_id: 99 }),
            frame(
                5,
                Message::Chat {
                    to_user: 7,
                    text: "新年快乐 🧧".into(),
                },
            ),
            frame(
                6,
                Message::Ping {
                    client_time_us: 1_700_000_000_000_000,
                },
            ),
            frame(
                1,
                Message::LoginReply {
                    result: ResultCode::Ok,
                    user_id: 42,
                },
            ),
            frame(
                2,
                Message::ShakeReply {
                    result: ResultCode::Won,
                    packet_id: 5,
                    amount_cents: 88,
                    retry_after_ms: 0,
                },
            ),
            frame(
                2,
                Message::ShakeReply {
                    result: ResultCode::Overloaded,
                    packet_id: 0,
                    amount_cents: 0,
                    retry_after_ms: 4000,
                },
            ),
            frame(
                3,
                Message::SendReply {
                    result: ResultCode::InsufficientFunds,
                    packet_id: 0,
                    balance_cents: 12,
                },
            ),
            frame(
                4,
                Message::OpenReply {
                    result: ResultCode::AlreadyOpened,
                    packet_id: 99,
                    amount_cents: 33,
                },
            ),
            frame(
                5,
                Message::ChatReply {
                    result: ResultCode::Offline,
                },
            ),
            frame(
                6,
                Message::Pong {
                    client_time_us: 1,
                    server_time_us: 2,
                },
            ),
            frame(
                7,
                Message::Error {
                    result: ResultCode::UnknownType,
                    text: "unknown message type 0x7f".into(),
                    retry_after_ms: 0,
                },
            ),
            frame(
                8,
                Message::Error {
                    result: ResultCode::RateLimited,
                    text: "over 1 send a second".into(),
                    retry_after_ms: 700,
                },
            ),
            frame(
                0,
                Message::PacketNotice {
                    packet_id: 9,
                    from_user: 0,
                    amount_cents: 500,
                    shares: 5,
                    expires_at_ms: 1_700_000_060_000,
                },
            ),
            frame(
                0,
                Message::ChatMessage {
                    from_user: 3,
                    text: String::new(),
                },
            ),
            frame(
                0,
                Message::Broadcast {
                    server_time_us: 123,
                    text: "happy new year".into(),
                },
            ),
            frame(
                0,
                Message::Kick {
                    reason: KickReason::Replaced,
                    text: "logged in elsewhere".into(),
                    retry_after_ms: 0,
                },
            ),
            frame(
                0,
                Message::Refresh {
                    expires_at_ms: 1_700_000_600_000,
                },
            ),
        ]
    }

    /// A frame with the given type and raw payload, header filled in correctly.
    fn raw(kind: u8, request_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = ((6 + payload.len()) as u32).to_be_bytes().to_vec();
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&request_id.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn payload_error(bytes: &[u8]) -> PayloadError {
        match decode(bytes) {
            Err(FrameError::BadPayload { why, .. }) => why,
            other => panic!("expected a payload error, got {other:?}"),
        }
    }

    #[test]
    fn every_message_round_trips() {
        let samples = samples();
        let mut kinds: Vec<u8> = samples.iter().map(|f| f.message.kind()).collect();
        kinds.dedup();
        assert_eq!(kinds.len(), kind::ALL.len(), "a sample of every kind");
        for f in samples {
            let bytes = encode_to_vec(&f);
            assert_eq!(check(&bytes), Ok(Some(bytes.len())));
            assert_eq!(decode(&bytes).as_ref(), Ok(&f), "{bytes:02x?}");
        }
    }

    #[test]
    fn encode_appends() {
        let mut out = vec![0xee];
        let f = frame(9, Message::Shake);
        encode(&f, &mut out);
        encode(&f, &mut out);
        assert_eq!(out[0], 0xee);
        assert_eq!(&out[1..11], &out[11..]);
        assert_eq!(&out[1..11], &[0, 0, 0, 6, VERSION, 2, 0, 0, 0, 9]);
    }

    #[test]
    fn header_layout() {
        let bytes = encode_to_vec(&frame(0x01020304, Message::Open { packet_id: 5 }));
        assert_eq!(
            bytes,
            [0, 0, 0, 14, VERSION, 0x04, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 5]
        );
        assert_eq!(request_id_of(&bytes), 0x01020304);
        assert_eq!(request_id_of(&bytes[..9]), 0);
    }

    #[test]
    fn split_at_every_offset() {
        let mut stream = Vec::new();
        let samples = samples();
        for f in &samples {
            encode(f, &mut stream);
        }
        // Feed the stream one cut at a time; everything before the cut is what a
        // connection would have buffered.
        for cut in 0..=stream.len() {
            let (buffered, _) = stream.split_at(cut);
            let mut at = 0;
            let mut decoded = Vec::new();
            while let Some(n) = check(&buffered[at..]).expect("valid stream") {
                decoded.push(decode(&buffered[at..at + n]).expect("valid frame"));
                at += n;
            }
            assert_eq!(decoded[..], samples[..decoded.len()]);
            // Whatever is left is a strict prefix of the next frame.
            if decoded.len() < samples.len() {
                let next = encode_to_vec(&samples[decoded.len()]);
                assert!(buffered.len() - at < next.len());
                assert!(next.starts_with(&buffered[at..]));
            } else {
                assert_eq!(at, stream.len());
            }
        }
    }

    #[test]
    fn every_prefix_of_a_frame_is_incomplete() {
        for f in samples() {
            let bytes = encode_to_vec(&f);
            for cut in 0..bytes.len() {
                assert_eq!(check(&bytes[..cut]), Ok(None), "cut {cut}");
                assert!(matches!(
                    decode(&bytes[..cut]),
                    Err(FrameError::Incomplete { .. })
                ));
            }
        }
    }

    #[test]
    fn length_limits() {
        let too_long = (MAX_FRAME_LEN as u32 + 1).to_be_bytes();
        assert_eq!(
            check(&too_long),
            Err(FrameError::TooLong {
                len: MAX_FRAME_LEN + 1
            })
        );
        assert_eq!(
            check(&9_000_000u32.to_be_bytes()).unwrap_err().to_string(),
            "frame length 9000000 over limit 16384"
        );
        assert_eq!(
            check(&[0, 0, 0, 5, 1, 2]),
            Err(FrameError::TooShort { len: 5 })
        );
        assert_eq!(check(&[0, 0, 0, 0]), Err(FrameError::TooShort { len: 0 }));
        // Exactly the limit is fine.
        let mut max = raw(kind::SHAKE, 0, &vec![0; MAX_FRAME_LEN - 6]);
        assert_eq!(check(&max), Ok(Some(MAX_FRAME_LEN + 4)));
        // ... though a shake with a payload is not.
        assert!(matches!(
            decode(&max).unwrap_err(),
            FrameError::BadPayload {
                why: PayloadError::Trailing { .. },
                ..
            }
        ));
        max.truncate(10);
        assert_eq!(check(&max), Ok(None));
    }

    #[test]
    fn bad_version_as_soon_as_seen() {
        assert_eq!(check(&[0, 0, 0, 6]), Ok(None));
        let err = check(&[0, 0, 0, 6, 3]).unwrap_err();
        assert_eq!(err, FrameError::BadVersion { version: 3 });
        assert!(err.is_fatal());
        assert_eq!(err.to_string(), "frame version 3, expected 1 to 2");
        assert!(check(&[0, 0, 0, 6, 0]).is_err());
        assert_eq!(check(&[0, 0, 0, 6, 1]), Ok(None), "version 1 still reads");
    }

    /// A version-1 frame reads as version 2, but for `Login`, whose token has a `u8`
    /// length there: what the old clients (and the C floor's) send.
    #[test]
    fn version_1_frames_read_with_their_login() {
        let mut shake = raw(kind::SHAKE, 7, &[]);
        shake[4] = 1;
        assert_eq!(decode(&shake), Ok(frame(7, Message::Shake)));
        let mut payload = 42u64.to_be_bytes().to_vec();
        payload.push(32);
        payload.extend_from_slice(&[0xab; 32]);
        let mut login = raw(kind::LOGIN, 1, &payload);
        login[4] = 1;
        let want = frame(
            1,
            Message::Login {
                user_id: 42,
                token: vec![0xab; 32],
            },
        );
        assert_eq!(decode(&login), Ok(want.clone()));
        // The same payload as version 2 is short: its length is two bytes there.
        assert!(decode(&raw(kind::LOGIN, 1, &payload)).is_err());
        // What this side writes is always the current version.
        assert_eq!(encode_to_vec(&want)[4], VERSION);
        payload.push(0);
        let mut trailing = raw(kind::LOGIN, 1, &payload);
        trailing[4] = 1;
        assert_eq!(
            payload_error(&trailing),
            PayloadError::Trailing { extra: 1 }
        );
    }

    #[test]
    fn decode_wants_exactly_one_frame() {
        let mut bytes = encode_to_vec(&frame(1, Message::Shake));
        bytes.push(0);
        assert_eq!(decode(&bytes), Err(FrameError::TrailingBytes { extra: 1 }));
        assert_eq!(
            decode(&bytes[..3]),
            Err(FrameError::Incomplete { have: 3, need: 4 })
        );
        assert_eq!(
            decode(&bytes[..8]),
            Err(FrameError::Incomplete { have: 8, need: 10 })
        );
    }

    #[test]
    fn unknown_type_is_recoverable() {
        let bytes = raw(0x7f, 77, b"whatever");
        let err = decode(&bytes).unwrap_err();
        assert_eq!(
            err,
            FrameError::UnknownType {
                kind: 0x7f,
                request_id: 77
            }
        );
        assert!(!err.is_fatal());
        assert_eq!(err.request_id(), Some(77));
        assert_eq!(err.result_code(), Some(ResultCode::UnknownType));
        assert_eq!(err.name(), "unknown-type");
    }

    #[test]
    fn short_payloads() {
        for f in samples() {
            let bytes = encode_to_vec(&f);
            let payload = &bytes[HEADER_LEN..];
            // A send's idempotency key is optional: cut right before it, the send is whole.
            let optional_tail = match &f.message {
                Message::Send {
                    recipients,
                    idempotency_key: Some(_),
                    ..
                } => Some(14 + 8 * recipients.len()),
                // So is a shake reply's wait, and an error's.
                Message::ShakeReply {
                    retry_after_ms: 1..,
                    ..
                } => Some(17),
                Message::Error {
                    retry_after_ms: 1..,
                    text,
                    ..
                } => Some(3 + text.len()),
                _ => None,
            };
            for cut in 0..payload.len() {
                let short = raw(f.message.kind(), f.request_id, &payload[..cut]);
                if Some(cut) == optional_tail {
                    assert!(decode(&short).is_ok(), "{f:?} without its key");
                    continue;
                }
                let err = decode(&short).unwrap_err();
                assert!(!err.is_fatal());
                assert_eq!(err.request_id(), Some(f.request_id));
                assert_eq!(err.result_code(), Some(ResultCode::BadRequest));
                assert!(
                    matches!(
                        err,
                        FrameError::BadPayload {
                            why: PayloadError::Short { .. },
                            ..
                        }
                    ),
                    "{f:?} cut at {cut}: {err}"
                );
            }
        }
    }

    #[test]
    fn trailing_payload() {
        for f in samples() {
            let mut bytes = encode_to_vec(&f);
            bytes.push(0);
            let long = raw(f.message.kind(), f.request_id, &bytes[HEADER_LEN..]);
            // After a keyless send's recipients, a byte begins a key (here an empty one).
            let expected = match &f.message {
                Message::Send {
                    idempotency_key: None,
                    ..
                } => PayloadError::BadIdempotencyKey,
                // After a shake reply or an error without a wait, a byte begins one
                // (cut short).
                Message::ShakeReply {
                    retry_after_ms: 0, ..
                }
                | Message::Error {
                    retry_after_ms: 0, ..
                }
                | Message::Kick {
                    retry_after_ms: 0, ..
                } => PayloadError::Short {
                    field: "retry_after_ms",
                    need: 4,
                    have: 1,
                },
                _ => PayloadError::Trailing { extra: 1 },
            };
            assert_eq!(payload_error(&long), expected, "{f:?}");
        }
    }

    #[test]
    fn bad_utf8() {
        let mut payload = 3u64.to_be_bytes().to_vec();
        payload.extend_from_slice(&[0, 2, 0xc3, 0x28]);
        assert_eq!(
            payload_error(&raw(kind::CHAT, 1, &payload)),
            PayloadError::BadUtf8 { field: "text" }
        );
    }

    #[test]
    fn unknown_codes() {
        let mut payload = vec![19];
        payload.extend_from_slice(&0u64.to_be_bytes());
        assert_eq!(
            payload_error(&raw(kind::LOGIN_REPLY, 1, &payload)),
            PayloadError::UnknownResult { code: 19 }
        );
        assert_eq!(
            payload_error(&raw(kind::KICK, 0, &[0, 0, 0])),
            PayloadError::UnknownKickReason { code: 0 }
        );
    }

    #[test]
    fn too_many_recipients() {
        let count = MAX_RECIPIENTS + 1;
        let mut payload = 100u64.to_be_bytes().to_vec();
        payload.extend_from_slice(&1u32.to_be_bytes());
        payload.extend_from_slice(&(count as u16).to_be_bytes());
        payload.resize(payload.len() + count * 8, 0);
        let err = decode(&raw(kind::SEND, 4, &payload)).unwrap_err();
        assert_eq!(err.name(), "too-many-recipients");
        assert_eq!(
            err.to_string(),
            "bad payload for message type 0x03 in request 4: 1001 recipients over limit 1000"
        );
        // A count the payload cannot back is short, not an allocation.
        let mut payload = 100u64.to_be_bytes().to_vec();
        payload.extend_from_slice(&1u32.to_be_bytes());
        payload.extend_from_slice(&1000u16.to_be_bytes());
        assert_eq!(
            payload_error(&raw(kind::SEND, 4, &payload)),
            PayloadError::Short {
                field: "recipients",
                need: 8000,
                have: 0
            }
        );
    }

    #[test]
    fn text_and_token_limits() {
        let mut payload = 0u64.to_be_bytes().to_vec();
        payload.extend_from_slice(&((MAX_TEXT_LEN + 1) as u16).to_be_bytes());
        payload.resize(payload.len() + MAX_TEXT_LEN + 1, b'a');
        assert_eq!(
            payload_error(&raw(kind::BROADCAST, 0, &payload)),
            PayloadError::TextTooLong {
                len: MAX_TEXT_LEN + 1
            }
        );

        let too_long = Message::Login {
            user_id: 1,
            token: vec![1; MAX_TOKEN_LEN + 1],
        };
        assert_eq!(
            payload_error(&encode_to_vec(&frame(1, too_long))),
            PayloadError::TokenTooLong {
                len: MAX_TOKEN_LEN + 1
            }
        );
        let at_limit = frame(
            1,
            Message::Login {
                user_id: 1,
                token: vec![b'a'; MAX_TOKEN_LEN],
            },
        );
        assert_eq!(decode(&encode_to_vec(&at_limit)), Ok(at_limit));

        // A JWT's compact form is printable ASCII: a space, a control byte or a byte
        // over 0x7e is refused, an empty token is the server's to refuse.
        for token in [&b"a b"[..], b"a\x01", b"\xffab", "红".as_bytes()] {
            let login = Message::Login {
                user_id: 1,
                token: token.to_vec(),
            };
            assert_eq!(
                payload_error(&encode_to_vec(&frame(1, login))),
                PayloadError::TokenNotAscii,
                "{token:?}"
            );
        }
        let empty = frame(
            1,
            Message::Login {
                user_id: 1,
                token: vec![],
            },
        );
        assert_eq!(decode(&encode_to_vec(&empty)), Ok(empty));
    }

    #[test]
    fn long_text_is_truncated_at_a_char_boundary() {
        // 3-byte chars: MAX_TEXT_LEN (4096) is not a multiple of 3, so the cut must back up.
        let text = "红".repeat(MAX_TEXT_LEN);
        let f = frame(
            1,
            Message::Chat {
                to_user: 2,
                text: text.clone(),
            },
        );
        let decoded = decode(&encode_to_vec(&f)).unwrap();
        let Message::Chat { text: got, .. } = decoded.message else {
            panic!("not a chat: {decoded:?}");
        };
        assert_eq!(got.len(), MAX_TEXT_LEN / 3 * 3);
        assert!(text.starts_with(&got));
        assert_eq!(truncate_text(&text), got);
        assert_eq!(truncate_text("short"), "short");
        // Longer than u16 too: still no panic, still the limit.
        let huge = "a".repeat(70_000);
        let bytes = encode_to_vec(&frame(
            0,
            Message::Kick {
                reason: KickReason::Idle,
                text: huge,
                retry_after_ms: 0,
            },
        ));
        assert_eq!(bytes.len(), HEADER_LEN + 1 + 2 + MAX_TEXT_LEN);
    }

    #[test]
    fn oversized_lists_encode_without_panicking() {
        let f = frame(
            1,
            Message::Send {
                amount_cents: 1,
                shares: 1,
                recipients: vec![1; 70_000],
                idempotency_key: None,
            },
        );
        let bytes = encode_to_vec(&f);
        assert_eq!(bytes.len(), HEADER_LEN + 14 + 65_535 * 8);
        assert!(matches!(check(&bytes), Err(FrameError::TooLong { .. })));
        let f = frame(
            1,
            Message::Login {
                user_id: 1,
                token: vec![1; 70_000],
            },
        );
        assert_eq!(encode_to_vec(&f).len(), HEADER_LEN + 10 + 65_535);
    }
}
