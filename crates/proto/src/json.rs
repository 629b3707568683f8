//! The JSON form of every message, for browsers, with no I/O.
//!
//! Over WebSocket a browser may send text messages instead of binary ones: each text
//! message is one JSON object standing for one [`Frame`]. `"type"` names the message
//! (`"login"`, `"shake_reply"`, ...), `"id"` is the request id (0 on pushes), and the
//! other keys are the message's fields under their Rust names. Results and kick reasons
//! are their names from `message.rs` (`"won"`, `"already-opened"`), a login token is
//! its compact JWT string as it is, and every integer a JSON number.
//!
//! The binary codec's limits hold here too (text and token lengths, recipients); a
//! message the binary decoder would refuse is refused here, with a [`JsonError`] that
//! carries the request id whenever it could be read, so the gateway can answer with an
//! `error` reply just as it does for a malformed binary frame. Keys we do not know are
//! ignored. `docs/protocol.md` lists every message's JSON; a test checks those examples.

use serde_json::{Map, Value};

use crate::frame::truncate_text;
use crate::message::{
    valid_idempotency_key, valid_token_bytes, Frame, KickReason, Message, ResultCode,
    MAX_RECIPIENTS, MAX_TEXT_LEN, MAX_TOKEN_LEN,
};

/// Largest text message the gateway reads, in bytes. Room for the largest message the
/// binary codec allows: a `send` naming [`MAX_RECIPIENTS`] twenty-digit ids (about 21 KB)
/// or a [`MAX_TEXT_LEN`]-byte text of control characters, each escaped to six bytes
/// (about 25 KB).
pub const MAX_JSON_LEN: usize = 32 * 1024;

/// The `"type"` of `message` in JSON.
pub fn type_name(message: &Message) -> &'static str {
    use Message::*;
    match message {
        Login { .. } => "login",
        Shake => "shake",
        Send { .. } => "send",
        Open { .. } => "open",
        Chat { .. } => "chat",
        Ping { .. } => "ping",
        LoginReply { .. } => "login_reply",
        ShakeReply { .. } => "shake_reply",
        SendReply { .. } => "send_reply",
        OpenReply { .. } => "open_reply",
        ChatReply { .. } => "chat_reply",
        Pong { .. } => "pong",
        Error { .. } => "error",
        PacketNotice { .. } => "packet_notice",
        ChatMessage { .. } => "chat_message",
        Broadcast { .. } => "broadcast",
        Kick { .. } => "kick",
        Refresh { .. } => "refresh",
    }
}

/// Why a text message is not a message, and the request id if it could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    pub request_id: Option<u32>,
    pub kind: JsonErrorKind,
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.request_id {
            Some(id) => write!(f, "bad JSON message in request {id}: {}", self.kind),
            None => write!(f, "bad JSON message: {}", self.kind),
        }
    }
}

impl std::error::Error for JsonError {}

/// What is wrong with a JSON message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonErrorKind {
    #[error("not JSON: {0}")]
    Syntax(String),
    #[error("not a JSON object")]
    NotAnObject,
    #[error("unknown message type {0:?}")]
    UnknownType(String),
    #[error("field `{field}` missing")]
    Missing { field: &'static str },
    #[error("field `{field}` should be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    #[error("field `{field}` out of range")]
    OutOfRange { field: &'static str },
    #[error("unknown result {0:?}")]
    UnknownResult(String),
    #[error("unknown kick reason {0:?}")]
    UnknownKickReason(String),
    #[error("{count} recipients over limit {MAX_RECIPIENTS}")]
    TooManyRecipients { count: usize },
    #[error("text of {len} bytes over limit {MAX_TEXT_LEN}")]
    TextTooLong { len: usize },
    #[error("token of {len} bytes over limit {MAX_TOKEN_LEN}")]
    TokenTooLong { len: usize },
    #[error("token is not printable ASCII (a JWT's compact form)")]
    TokenNotAscii,
}

impl JsonError {
    /// The result code to answer with: `unknown-type` for an unknown `"type"`,
    /// `bad-request` for everything else (as for binary frames).
    pub fn result_code(&self) -> ResultCode {
        match self.kind {
            JsonErrorKind::UnknownType(_) => ResultCode::UnknownType,
            _ => ResultCode::BadRequest,
        }
    }
}

/// The JSON form of `frame`: one line, `"type"` and `"id"` first, then the fields in
/// declaration order. Texts are cut to [`MAX_TEXT_LEN`] bytes as the binary encoder
/// does, so what this writes [`from_json`] reads back; but for a version-1 login's raw
/// token, which is not printable ASCII: it has no JSON form (written lossily here, refused
/// by [`from_json`]).
pub fn to_json(frame: &Frame) -> String {
    use Message::*;
    let mut w = Writer::new(type_name(&frame.message), frame.request_id);
    match &frame.message {
        Login { user_id, token } => {
            w.num("user_id", *user_id);
            w.str("token", &String::from_utf8_lossy(token));
        }
        Shake => {}
        Send {
            amount_cents,
            shares,
            recipients,
            idempotency_key,
        } => {
            w.num("amount_cents", *amount_cents);
            w.num("shares", (*shares).into());
            w.key("recipients");
            w.out.push('[');
            for (i, id) in recipients.iter().enumerate() {
                if i > 0 {
                    w.out.push(',');
                }
                w.out.push_str(&id.to_string());
            }
            w.out.push(']');
            if let Some(key) = idempotency_key {
                w.str("idempotency_key", key);
            }
        }
        Open { packet_id } => w.num("packet_id", *packet_id),
        Chat { to_user, text } => {
            w.num("to_user", *to_user);
            w.text(text);
        }
        Ping { client_time_us } => w.num("client_time_us", *client_time_us),
        LoginReply { result, user_id } => {
            w.result(*result);
            w.num("user_id", *user_id);
        }
        ShakeReply {
            result,
            packet_id,
            amount_cents,
            retry_after_ms,
        } => {
            w.result(*result);
            w.num("packet_id", *packet_id);
            w.num("amount_cents", *amount_cents);
            if *retry_after_ms != 0 {
                w.num("retry_after_ms", u64::from(*retry_after_ms));
            }
        }
        OpenReply {
            result,
            packet_id,
            amount_cents,
        } => {
            w.result(*result);
            w.num("packet_id", *packet_id);
            w.num("amount_cents", *amount_cents);
        }
        SendReply {
            result,
            packet_id,
            balance_cents,
        } => {
            w.result(*result);
            w.num("packet_id", *packet_id);
            w.num("balance_cents", *balance_cents);
        }
        ChatReply { result } => w.result(*result),
        Pong {
            client_time_us,
            server_time_us,
        } => {
            w.num("client_time_us", *client_time_us);
            w.num("server_time_us", *server_time_us);
        }
        Error {
            result,
            text,
            retry_after_ms,
        } => {
            w.result(*result);
            w.text(text);
            if *retry_after_ms != 0 {
                w.num("retry_after_ms", u64::from(*retry_after_ms));
            }
        }
        PacketNotice {
            packet_id,
            from_user,
            amount_cents,
            shares,
            expires_at_ms,
        } => {
            w.num("packet_id", *packet_id);
            w.num("from_user", *from_user);
            w.num("amount_cents", *amount_cents);
            w.num("shares", (*shares).into());
            w.num("expires_at_ms", *expires_at_ms);
        }
        ChatMessage { from_user, text } => {
            w.num("from_user", *from_user);
            w.text(text);
        }
        Broadcast {
            server_time_us,
            text,
        } => {
            w.num("server_time_us", *server_time_us);
            w.text(text);
        }
        Kick {
            reason,
            text,
            retry_after_ms,
        } => {
            w.str("reason", reason.name());
            w.text(text);
            if *retry_after_ms != 0 {
                w.num("retry_after_ms", u64::from(*retry_after_ms));
            }
        }
        Refresh { expires_at_ms } => w.num("expires_at_ms", *expires_at_ms),
    }
    w.out.push('}');
    w.out
}

/// Appends keys in a fixed order. (`serde_json`'s map sorts its keys, which would put
/// `"type"` after `"amount_cents"`.)
struct Writer {
    out: String,
}

impl Writer {
    fn new(type_name: &str, request_id: u32) -> Writer {
        Writer {
            out: format!("{{\"type\":\"{type_name}\",\"id\":{request_id}"),
        }
    }

    fn key(&mut self, key: &str) {
        self.out.push_str(",\"");
        self.out.push_str(key);
        self.out.push_str("\":");
    }

    fn num(&mut self, key: &str, value: u64) {
        self.key(key);
        self.out.push_str(&value.to_string());
    }

    fn str(&mut self, key: &str, value: &str) {
        self.key(key);
        // Escaping a str into a String cannot fail.
        self.out
            .push_str(&serde_json::to_string(value).expect("a str serialises"));
    }

    fn text(&mut self, text: &str) {
        self.str("text", truncate_text(text));
    }

    fn result(&mut self, result: ResultCode) {
        self.str("result", result.name());
    }
}

/// The most elements of one JSON array: more than `MAX_RECIPIENTS`, and as a `Value` at
/// most `MAX_JSON_LEN` bytes (32 bytes an element, the vector doubling as it grows).
pub const MAX_JSON_ARRAY: usize = 1024;

/// Where an array of more than `MAX_JSON_ARRAY` elements ends in `text`, found by a
/// scan that allocates nothing (strings skipped, nesting tracked to serde_json's own
/// depth limit, past which it refuses the text itself).
fn long_array_at(text: &str) -> Option<usize> {
    const DEPTH: usize = 130;
    // Per open bracket: commas so far at that level, or `None` for an object.
    let mut levels = [None::<usize>; DEPTH];
    let mut depth = 0;
    let mut in_string = false;
    let mut escaped = false;
    for (at, b) in text.bytes().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' if depth < DEPTH => {
                levels[depth] = (b == b'[').then_some(0);
                depth += 1;
            }
            b'[' | b'{' => return None,
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth > 0 => {
                if let Some(commas) = levels[depth - 1].as_mut() {
                    *commas += 1;
                    if *commas >= MAX_JSON_ARRAY {
                        return Some(at);
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// Reads one JSON message. Checks what the binary decoder checks; keys it does not know
/// are ignored. `text` should be at most [`MAX_JSON_LEN`] bytes (the WebSocket layer
/// refuses longer messages before they get here).
pub fn from_json(text: &str) -> Result<Frame, JsonError> {
    if let Some(at) = long_array_at(text) {
        // Read into a `Value`, an array of n elements takes one allocation of up to 64n
        // bytes: refused before that, so no message costs more than `MAX_JSON_LEN` at once.
        return Err(JsonError {
            request_id: None,
            kind: JsonErrorKind::Syntax(format!(
                "an array of more than {MAX_JSON_ARRAY} elements at byte {at}"
            )),
        });
    }
    let value: Value = serde_json::from_str(text).map_err(|e| JsonError {
        request_id: None,
        kind: JsonErrorKind::Syntax(e.to_string()),
    })?;
    let Value::Object(object) = value else {
        return Err(JsonError {
            request_id: None,
            kind: JsonErrorKind::NotAnObject,
        });
    };
    let mut f = Fields {
        object: &object,
        request_id: None,
    };
    let id = f.num("id")?;
    let request_id =
        u32::try_from(id).map_err(|_| f.err(JsonErrorKind::OutOfRange { field: "id" }))?;
    f.request_id = Some(request_id);
    let message = match f.str("type")? {
        "login" => Message::Login {
            user_id: f.num_or_zero("user_id")?,
            token: f.token()?,
        },
        "shake" => Message::Shake,
        "send" => Message::Send {
            amount_cents: f.num("amount_cents")?,
            shares: f.u32("shares")?,
            recipients: f.recipients()?,
            idempotency_key: f.idempotency_key()?,
        },
        "open" => Message::Open {
            packet_id: f.num("packet_id")?,
        },
        "chat" => Message::Chat {
            to_user: f.num("to_user")?,
            text: f.text()?,
        },
        "ping" => Message::Ping {
            client_time_us: f.num("client_time_us")?,
        },
        "login_reply" => Message::LoginReply {
            result: f.result()?,
            user_id: f.num("user_id")?,
        },
        "shake_reply" => Message::ShakeReply {
            result: f.result()?,
            packet_id: f.num("packet_id")?,
            amount_cents: f.num("amount_cents")?,
            retry_after_ms: f.retry_after_ms()?,
        },
        "send_reply" => Message::SendReply {
            result: f.result()?,
            packet_id: f.num("packet_id")?,
            balance_cents: f.num("balance_cents")?,
        },
        "open_reply" => Message::OpenReply {
            result: f.result()?,
            packet_id: f.num("packet_id")?,
            amount_cents: f.num("amount_cents")?,
        },
        "chat_reply" => Message::ChatReply {
            result: f.result()?,
        },
        "pong" => Message::Pong {
            client_time_us: f.num("client_time_us")?,
            server_time_us: f.num("server_time_us")?,
        },
        "error" => Message::Error {
            result: f.result()?,
            text: f.text()?,
            retry_after_ms: f.retry_after_ms()?,
        },
        "packet_notice" => Message::PacketNotice {
            packet_id: f.num("packet_id")?,
            from_user: f.num("from_user")?,
            amount_cents: f.num("amount_cents")?,
            shares: f.u32("shares")?,
            expires_at_ms: f.num("expires_at_ms")?,
        },
        "chat_message" => Message::ChatMessage {
            from_user: f.num("from_user")?,
            text: f.text()?,
        },
        "broadcast" => Message::Broadcast {
            server_time_us: f.num("server_time_us")?,
            text: f.text()?,
        },
        "kick" => {
            let name = f.str("reason")?;
            let reason = KickReason::from_name(name)
                .ok_or_else(|| f.err(JsonErrorKind::UnknownKickReason(clip(name))))?;
            Message::Kick {
                reason,
                text: f.text()?,
                retry_after_ms: f.retry_after_ms()?,
            }
        }
        "refresh" => Message::Refresh {
            expires_at_ms: f.num("expires_at_ms")?,
        },
        other => return Err(f.err(JsonErrorKind::UnknownType(clip(other)))),
    };
    Ok(Frame {
        request_id,
        message,
    })
}

/// A name from the peer, cut short enough to put in an error reply.
fn clip(name: &str) -> String {
    let mut end = name.len().min(40);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// Typed reads from a message object; errors carry the request id once it is known.
struct Fields<'a> {
    object: &'a Map<String, Value>,
    request_id: Option<u32>,
}

impl<'a> Fields<'a> {
    fn err(&self, kind: JsonErrorKind) -> JsonError {
        JsonError {
            request_id: self.request_id,
            kind,
        }
    }

    fn get(&self, field: &'static str) -> Result<&'a Value, JsonError> {
        self.object
            .get(field)
            .ok_or_else(|| self.err(JsonErrorKind::Missing { field }))
    }

    fn num(&self, field: &'static str) -> Result<u64, JsonError> {
        match self.get(field)? {
            Value::Number(n) if n.is_i64() => {
                // An integer, but negative: the right type, the wrong size.
                n.as_u64()
                    .ok_or_else(|| self.err(JsonErrorKind::OutOfRange { field }))
            }
            Value::Number(n) => n
                .as_u64()
                .ok_or_else(|| self.wrong(field, "an unsigned integer")),
            _ => Err(self.wrong(field, "an unsigned integer")),
        }
    }

    fn u32(&self, field: &'static str) -> Result<u32, JsonError> {
        u32::try_from(self.num(field)?).map_err(|_| self.err(JsonErrorKind::OutOfRange { field }))
    }

    fn str(&self, field: &'static str) -> Result<&'a str, JsonError> {
        match self.get(field)? {
            Value::String(s) => Ok(s),
            _ => Err(self.wrong(field, "a string")),
        }
    }

    fn wrong(&self, field: &'static str, expected: &'static str) -> JsonError {
        self.err(JsonErrorKind::WrongType { field, expected })
    }

    /// The optional `retry_after_ms` of a shake reply (absent means 0).
    /// An optional unsigned integer, 0 when absent (a login's `user_id`).
    fn num_or_zero(&self, field: &'static str) -> Result<u64, JsonError> {
        match self.object.get(field) {
            None | Some(Value::Null) => Ok(0),
            Some(_) => self.num(field),
        }
    }

    fn retry_after_ms(&self) -> Result<u32, JsonError> {
        match self.object.get("retry_after_ms") {
            None | Some(Value::Null) => Ok(0),
            Some(_) => self.u32("retry_after_ms"),
        }
    }

    /// The optional `idempotency_key` of a send.
    fn idempotency_key(&self) -> Result<Option<String>, JsonError> {
        let field = "idempotency_key";
        match self.object.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(key)) if valid_idempotency_key(key) => Ok(Some(key.clone())),
            Some(Value::String(_)) => Err(self.err(JsonErrorKind::OutOfRange { field })),
            Some(_) => Err(self.wrong(field, "a string")),
        }
    }

    fn text(&self) -> Result<String, JsonError> {
        let text = self.str("text")?;
        if text.len() > MAX_TEXT_LEN {
            return Err(self.err(JsonErrorKind::TextTooLong { len: text.len() }));
        }
        Ok(text.to_owned())
    }

    /// The token, its string's bytes as they are (a JWT is ASCII).
    fn token(&self) -> Result<Vec<u8>, JsonError> {
        let token = self.str("token")?;
        if token.len() > MAX_TOKEN_LEN {
            return Err(self.err(JsonErrorKind::TokenTooLong { len: token.len() }));
        }
        if !valid_token_bytes(token.as_bytes()) {
            return Err(self.err(JsonErrorKind::TokenNotAscii));
        }
        Ok(token.as_bytes().to_vec())
    }

    fn result(&self) -> Result<ResultCode, JsonError> {
        let name = self.str("result")?;
        ResultCode::from_name(name)
            .ok_or_else(|| self.err(JsonErrorKind::UnknownResult(clip(name))))
    }

    fn recipients(&self) -> Result<Vec<u64>, JsonError> {
        let field = "recipients";
        let Value::Array(items) = self.get(field)? else {
            return Err(self.wrong(field, "an array of unsigned integers"));
        };
        if items.len() > MAX_RECIPIENTS {
            return Err(self.err(JsonErrorKind::TooManyRecipients { count: items.len() }));
        }
        items
            .iter()
            .map(|item| {
                item.as_u64()
                    .ok_or_else(|| self.wrong(field, "an array of unsigned integers"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, encode_to_vec};

    fn frame(request_id: u32, message: Message) -> Frame {
        Frame {
            request_id,
            message,
        }
    }

    fn error_of(text: &str) -> JsonError {
        from_json(text).expect_err("an error")
    }

    #[test]
    fn every_message_round_trips_through_binary_and_json() {
        let samples = crate::frame::tests::samples();
        let mut types: Vec<&str> = samples.iter().map(|f| type_name(&f.message)).collect();
        types.dedup();
        assert_eq!(types.len(), crate::message::kind::ALL.len());
        for f in samples {
            let from_wire = decode(&encode_to_vec(&f)).expect("a valid frame");
            let json = to_json(&from_wire);
            assert_eq!(from_json(&json).as_ref(), Ok(&f), "{json}");
            // And it is JSON to anyone else, with the type first.
            let value: Value = serde_json::from_str(&json).unwrap();
            assert!(value.is_object());
            assert!(json.starts_with(&format!("{{\"type\":\"{}\",", type_name(&f.message))));
        }
    }

    #[test]
    fn extremes_round_trip() {
        for f in [
            frame(
                u32::MAX,
                Message::Send {
                    amount_cents: u64::MAX,
                    shares: u32::MAX,
                    recipients: vec![u64::MAX; MAX_RECIPIENTS],
                    idempotency_key: Some("k".repeat(crate::message::MAX_IDEMPOTENCY_KEY_LEN)),
                },
            ),
            frame(
                0,
                Message::Chat {
                    to_user: 0,
                    text: "\u{0}\"\\\n\u{1f}🧧".repeat(MAX_TEXT_LEN / 10),
                },
            ),
            frame(
                1,
                Message::Login {
                    user_id: 1,
                    token: vec![],
                },
            ),
        ] {
            let json = to_json(&f);
            assert!(json.len() <= MAX_JSON_LEN, "{}", json.len());
            assert_eq!(from_json(&json), Ok(f));
        }
        // The worst case for size: a full text of control characters.
        let worst = frame(
            u32::MAX,
            Message::Error {
                result: ResultCode::NotARecipient,
                text: "\u{1}".repeat(MAX_TEXT_LEN),
                retry_after_ms: u32::MAX,
            },
        );
        assert!(to_json(&worst).len() <= MAX_JSON_LEN);
        assert_eq!(from_json(&to_json(&worst)), Ok(worst));
    }

    #[test]
    fn long_text_is_cut_like_the_binary_encoder() {
        let f = frame(
            3,
            Message::Broadcast {
                server_time_us: 1,
                text: "红".repeat(MAX_TEXT_LEN),
            },
        );
        let via_binary = decode(&encode_to_vec(&f)).unwrap();
        assert_eq!(from_json(&to_json(&f)), Ok(via_binary));
    }

    #[test]
    fn golden_strings() {
        let cases = [
            (
                r#"{"type":"login","id":1,"user_id":42,"token":"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2ln"}"#,
                frame(
                    1,
                    Message::Login {
                        user_id: 42,
                        token: b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2ln".to_vec(),
                    },
                ),
            ),
            (
                r#"{"type":"shake_reply","id":2,"result":"won","packet_id":7,"amount_cents":512}"#,
                frame(
                    2,
                    Message::ShakeReply {
                        result: ResultCode::Won,
                        packet_id: 7,
                        amount_cents: 512,
                        retry_after_ms: 0,
                    },
                ),
            ),
            (
                r#"{"type":"open_reply","id":9,"result":"already-opened","packet_id":3,"amount_cents":40}"#,
                frame(
                    9,
                    Message::OpenReply {
                        result: ResultCode::AlreadyOpened,
                        packet_id: 3,
                        amount_cents: 40,
                    },
                ),
            ),
            (
                r#"{"type":"kick","id":0,"reason":"replaced","text":"logged in elsewhere"}"#,
                frame(
                    0,
                    Message::Kick {
                        reason: KickReason::Replaced,
                        text: "logged in elsewhere".into(),
                        retry_after_ms: 0,
                    },
                ),
            ),
        ];
        for (json, want) in cases {
            assert_eq!(from_json(json).as_ref(), Ok(&want));
            assert_eq!(to_json(&want), json);
        }
        // Whitespace, key order, upper-case hex and unknown keys are all fine.
        let loose = r#" { "token": "a.b.c", "extra": [1, {"x": null}],
                          "id": 3, "type": "login" } "#;
        assert_eq!(
            from_json(loose),
            Ok(frame(
                3,
                Message::Login {
                    user_id: 0,
                    token: b"a.b.c".to_vec()
                }
            )),
            "user_id may be left out: the token names the user"
        );
        // Escapes in texts.
        assert_eq!(
            from_json(r#"{"type":"chat","id":4,"to_user":2,"text":"\u7ea2\ud83e\udde7\n"}"#),
            Ok(frame(
                4,
                Message::Chat {
                    to_user: 2,
                    text: "红🧧\n".into()
                }
            ))
        );
    }

    #[test]
    fn errors_name_the_problem_and_the_request() {
        use JsonErrorKind::*;
        let cases: [(&str, Option<u32>, JsonErrorKind); 17] = [
            (
                "{",
                None,
                Syntax("EOF while parsing an object at line 1 column 1".into()),
            ),
            ("[1]", None, NotAnObject),
            (r#"{"type":"shake"}"#, None, Missing { field: "id" }),
            (
                r#"{"type":"shake","id":"1"}"#,
                None,
                WrongType {
                    field: "id",
                    expected: "an unsigned integer",
                },
            ),
            (
                r#"{"type":"shake","id":4294967296}"#,
                None,
                OutOfRange { field: "id" },
            ),
            (
                r#"{"type":"shake","id":-1}"#,
                None,
                OutOfRange { field: "id" },
            ),
            (
                r#"{"type":"shake","id":1.5}"#,
                None,
                WrongType {
                    field: "id",
                    expected: "an unsigned integer",
                },
            ),
            (r#"{"id":7}"#, Some(7), Missing { field: "type" }),
            (
                r#"{"type":"hug","id":7}"#,
                Some(7),
                UnknownType("hug".into()),
            ),
            (
                r#"{"type":"open","id":7}"#,
                Some(7),
                Missing { field: "packet_id" },
            ),
            (
                r#"{"type":"send","id":7,"amount_cents":1,"shares":4294967296,"recipients":[]}"#,
                Some(7),
                OutOfRange { field: "shares" },
            ),
            (
                r#"{"type":"send","id":7,"amount_cents":1,"shares":1,"recipients":[1,"2"]}"#,
                Some(7),
                WrongType {
                    field: "recipients",
                    expected: "an array of unsigned integers",
                },
            ),
            (
                r#"{"type":"login","id":7,"user_id":1,"token":7}"#,
                Some(7),
                WrongType {
                    field: "token",
                    expected: "a string",
                },
            ),
            (
                r#"{"type":"chat_reply","id":7,"result":"meh"}"#,
                Some(7),
                UnknownResult("meh".into()),
            ),
            (
                r#"{"type":"chat_reply","id":7,"result":"already_opened"}"#,
                Some(7),
                UnknownResult("already_opened".into()),
            ),
            (
                r#"{"type":"kick","id":0,"reason":"bored","text":""}"#,
                Some(0),
                UnknownKickReason("bored".into()),
            ),
            (
                r#"{"type":"chat","id":7,"to_user":1,"text":5}"#,
                Some(7),
                WrongType {
                    field: "text",
                    expected: "a string",
                },
            ),
        ];
        for (json, request_id, kind) in cases {
            assert_eq!(error_of(json), JsonError { request_id, kind }, "{json}");
        }
        let unknown = error_of(r#"{"type":"hug","id":7}"#);
        assert_eq!(unknown.result_code(), ResultCode::UnknownType);
        assert_eq!(
            unknown.to_string(),
            "bad JSON message in request 7: unknown message type \"hug\""
        );
        // The example in docs/protocol.md: the server's reply to a bad message.
        let bad = error_of(r#"{"type":"open","id":9}"#);
        let reply = Frame {
            request_id: bad.request_id.unwrap_or(0),
            message: Message::Error {
                result: bad.result_code(),
                text: bad.to_string(),
                retry_after_ms: 0,
            },
        };
        assert_eq!(
            to_json(&reply),
            r#"{"type":"error","id":9,"result":"bad-request","text":"bad JSON message in request 9: field `packet_id` missing"}"#
        );
        let missing = error_of(r#"{"type":"shake"}"#);
        assert_eq!(missing.result_code(), ResultCode::BadRequest);
        assert_eq!(missing.to_string(), "bad JSON message: field `id` missing");
    }

    #[test]
    fn limits_are_the_binary_codecs() {
        let ids: Vec<String> = (0..=MAX_RECIPIENTS).map(|i| i.to_string()).collect();
        let send = format!(
            r#"{{"type":"send","id":1,"amount_cents":5000,"shares":2,"recipients":[{}]}}"#,
            ids.join(",")
        );
        assert_eq!(
            error_of(&send).kind,
            JsonErrorKind::TooManyRecipients {
                count: MAX_RECIPIENTS + 1
            }
        );
        let chat = format!(
            r#"{{"type":"chat","id":1,"to_user":2,"text":"{}"}}"#,
            "a".repeat(MAX_TEXT_LEN + 1)
        );
        assert_eq!(
            error_of(&chat).kind,
            JsonErrorKind::TextTooLong {
                len: MAX_TEXT_LEN + 1
            }
        );
        let login = format!(
            r#"{{"type":"login","id":1,"user_id":2,"token":"{}"}}"#,
            "a".repeat(MAX_TOKEN_LEN + 1)
        );
        assert_eq!(
            error_of(&login).kind,
            JsonErrorKind::TokenTooLong {
                len: MAX_TOKEN_LEN + 1
            }
        );
        // At the limits, fine.
        let at_limit = format!(
            r#"{{"type":"login","id":1,"user_id":2,"token":"{}"}}"#,
            "a".repeat(MAX_TOKEN_LEN)
        );
        assert!(from_json(&at_limit).is_ok());
        // A JWT's compact form is printable ASCII, as the binary codec insists.
        for token in ["a b", "a\\u0001", "红"] {
            let login = format!(r#"{{"type":"login","id":1,"user_id":2,"token":"{token}"}}"#);
            assert_eq!(
                error_of(&login).kind,
                JsonErrorKind::TokenNotAscii,
                "{login}"
            );
        }
        // An unknown type name from the peer is clipped before it goes into a reply.
        let long_type = format!(r#"{{"type":"{}","id":1}}"#, "x".repeat(1000));
        assert_eq!(
            error_of(&long_type).kind,
            JsonErrorKind::UnknownType("x".repeat(40))
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,200}") {
            let _ = from_json(&text);
        }

        #[test]
        fn objects_with_a_known_type_never_panic(
            ty in proptest::sample::select(vec!["login", "send", "chat", "kick", "open_reply"]),
            id in proptest::prelude::any::<i64>(),
            value in r#"(-?[0-9]{1,22}|"[0-9a-f]{0,6}"|\[[0-9,]{0,12}\]|null|true|1\.5)"#,
        ) {
            for key in ["user_id", "token", "shares", "recipients", "text", "reason", "result"] {
                let json = format!(r#"{{"type":"{ty}","id":{id},"{key}":{value}}}"#);
                let _ = from_json(&json);
            }
        }
    }

    /// Long arrays are refused before they are read into memory (the fuzzer found a
    /// 2 KB message of 1,025 zeros taking a 64 KB allocation); commas inside strings and
    /// in objects do not count, and recipients over the limit are still named as such.
    #[test]
    fn arrays_over_the_limit_are_refused_before_reading() {
        let zeros = |n: usize| vec!["0"; n].join(",");
        let long = format!(
            r#"{{"type":"shake","id":1,"x":[{}]}}"#,
            zeros(MAX_JSON_ARRAY + 1)
        );
        let e = from_json(&long).unwrap_err();
        assert!(
            matches!(&e.kind, JsonErrorKind::Syntax(t) if t.contains("more than 1024")),
            "{e:?}"
        );
        let nested = format!(
            r#"{{"type":"shake","id":1,"x":[[{}]]}}"#,
            zeros(MAX_JSON_ARRAY + 1)
        );
        assert!(from_json(&nested).is_err());
        let fine = format!(
            r#"{{"type":"shake","id":1,"x":[{}],"t":"{}","o":{{{}}}}}"#,
            zeros(MAX_JSON_ARRAY),
            ",".repeat(3000),
            (0..1500)
                .map(|i| format!(r#""k{i}":0"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(from_json(&fine).unwrap().message, Message::Shake);
        let ids: Vec<String> = (1..=MAX_RECIPIENTS as u64 + 1)
            .map(|u| u.to_string())
            .collect();
        let send = format!(
            r#"{{"type":"send","id":2,"amount_cents":5000,"shares":1,"recipients":[{}]}}"#,
            ids.join(",")
        );
        let e = from_json(&send).unwrap_err();
        assert!(
            matches!(e.kind, JsonErrorKind::TooManyRecipients { .. }),
            "{e:?}"
        );
    }

    /// The JSON examples in the WebSocket section of `docs/protocol.md` are what this
    /// module reads and writes, byte for byte, and cover every message type.
    #[test]
    fn protocol_doc_examples_are_true() {
        let doc = include_str!("../../../docs/protocol.md");
        let section = doc
            .split("## WebSocket transport")
            .nth(1)
            .expect("a WebSocket section");
        let mut seen = Vec::new();
        let mut in_json = false;
        for line in section.lines() {
            if line.starts_with("```") {
                in_json = line == "```json";
                continue;
            }
            if !in_json {
                continue;
            }
            let f = from_json(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(to_json(&f), line);
            seen.push(type_name(&f.message));
        }
        for f in crate::frame::tests::samples() {
            let name = type_name(&f.message);
            assert!(
                seen.contains(&name),
                "no example of {name} in docs/protocol.md"
            );
        }
    }
}
