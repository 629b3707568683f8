//! WebSocket (RFC 6455) for the gateway and the load client, with no I/O.
//!
//! The gateway holds up to a million connections on a few mio workers, so nothing here
//! owns a buffer: a worker reads into one shared buffer, prepends whatever tail the
//! connection kept from its last read, and calls these functions on it.
//!
//! - Handshake: the server calls [`accept`] on the bytes read so far until it says
//!   something other than [`Handshake::Partial`]; the load client sends
//!   [`client_request`] and feeds the reply to [`check_response`].
//! - Frames: [`decode`] unmasks complete frames in place, hands every complete message
//!   and control frame to a callback as an [`Incoming`] borrowing the buffer, and says
//!   how many bytes it used; the caller keeps the rest (part of one frame). Only a
//!   fragmented message in flight is copied, into a [`Partial`] the connection holds as
//!   an `Option<Box<Partial>>` (8 bytes while idle). [`encode`] and [`close_frame`]
//!   append one frame to an output buffer.
//!
//! `tungstenite` supplies the RFC primitives (frame header layout, opcodes, close-code
//! classes, the accept key) but not its `WebSocket` type, which keeps about 4 KiB of
//! buffers per connection; our budget is under 1 KiB. `httparse` reads the HTTP heads.
//!
//! What rides inside the messages is `frame.rs`'s business (binary: one protocol frame
//! per message) and `json.rs`'s (text: one JSON object per message).

mod handshake;

pub use handshake::*;

use std::cell::Cell;
use std::io::Cursor;
use std::ops::ControlFlow;

use tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

use crate::json::MAX_JSON_LEN;
use crate::message::MAX_FRAME_LEN;

/// Longest payload of a ping, pong or close frame (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// Longest frame header: 2 bytes, an 8-byte length, a 4-byte mask.
pub const MAX_HEADER_LEN: usize = 14;

/// Close codes the gateway sends (RFC 6455 §7.4.1).
pub mod close_code {
    /// The conversation is over (also the usual reply to a peer's close).
    pub const NORMAL: u16 = 1000;
    /// The server is shutting down.
    pub const GOING_AWAY: u16 = 1001;
    /// The peer broke RFC 6455.
    pub const PROTOCOL_ERROR: u16 = 1002;
    /// A text message or close reason that is not UTF-8.
    pub const INVALID_DATA: u16 = 1007;
    /// We closed for a reason of our own: every `kick`.
    pub const POLICY: u16 = 1008;
    /// A message over the size limit.
    pub const TOO_BIG: u16 = 1009;
    /// Something went wrong on our side.
    pub const INTERNAL_ERROR: u16 = 1011;
}

// ---------------------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------------------

/// Which end of the connection we are. Clients mask every frame and servers never do
/// (RFC 6455 §5.1), so a `Server` decodes masked frames and encodes unmasked ones, and a
/// `Client` the reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// Largest message [`decode`] accepts, by kind, in payload bytes (after assembly of
/// fragments). Checked as soon as a frame header announces a length, so no more than
/// this is ever buffered for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub binary: usize,
    pub text: usize,
}

impl Limits {
    /// hongbao's limits: a binary message is exactly one protocol frame (length prefix
    /// included, so `4 + MAX_FRAME_LEN`), a text message one JSON object of at most
    /// [`MAX_JSON_LEN`] bytes.
    pub const HONGBAO: Limits = Limits {
        binary: 4 + MAX_FRAME_LEN,
        text: MAX_JSON_LEN,
    };

    fn for_kind(self, text: bool) -> usize {
        if text {
            self.text
        } else {
            self.binary
        }
    }

    /// The most bytes a connection may have to keep between reads: the tail [`decode`]
    /// leaves unconsumed is always shorter than this (one frame header plus a payload
    /// within the limits).
    pub fn max_tail(self) -> usize {
        MAX_HEADER_LEN + self.binary.max(self.text).max(MAX_CONTROL_PAYLOAD)
    }
}

/// A fragmented message being assembled: only exists between its first and last frame.
#[derive(Debug)]
pub struct Partial {
    text: bool,
    data: Vec<u8>,
}

impl Partial {
    /// Bytes held so far.
    pub fn held(&self) -> usize {
        self.data.len()
    }

    /// Appends a fragment that [`check_header`] found room for. Grows by doubling, as a
    /// `Vec` does, so many small fragments cost little copying, but never reserves past
    /// the limit.
    fn append(&mut self, fragment: &[u8], limits: Limits) {
        let need = self.data.len() + fragment.len();
        if need > self.data.capacity() {
            let limit = limits.for_kind(self.text).max(need);
            let target = (self.data.capacity() * 2).clamp(need, limit);
            self.data.reserve_exact(target - self.data.len());
        }
        self.data.extend_from_slice(fragment);
    }
}

/// A complete message or control frame, borrowing the decode buffer (or the assembled
/// [`Partial`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming<'a> {
    Binary(&'a [u8]),
    Text(&'a str),
    /// Answer with a pong carrying the same payload.
    Ping(&'a [u8]),
    Pong(&'a [u8]),
    /// The peer is closing. `code` is `None` for an empty close frame. Answer with a close
    /// (echoing the code, or empty) and close the connection; [`decode`] reads nothing
    /// after it.
    Close {
        code: Option<u16>,
        reason: &'a str,
    },
}

/// Why the peer's bytes cannot be read as WebSocket frames: send a close frame with
/// `code` (and `reason`, which is short ASCII) and close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("WebSocket violation (close {code}): {reason}")]
pub struct Violation {
    pub code: u16,
    pub reason: &'static str,
}

impl Violation {
    fn protocol(reason: &'static str) -> Violation {
        Violation {
            code: close_code::PROTOCOL_ERROR,
            reason,
        }
    }
}

/// Decodes every complete frame at the start of `input`, unmasking in place, and calls
/// `on` for each complete message and control frame in order. Returns how many bytes it
/// used; the rest (less than one frame, shorter than [`Limits::max_tail`]) is for the
/// caller to keep and put in front of the next read. Stops after a close frame.
///
/// `partial` carries a fragmented message across frames and calls; control frames that
/// arrive between its fragments are delivered at once and the message goes on.
///
/// Allocates only for a fragmented message (at most its limit) — a message in a single
/// frame is handed over where it lies. On `Err` the connection is beyond repair: send
/// the violation's close code and close.
pub fn decode(
    role: Role,
    input: &mut [u8],
    partial: &mut Option<Box<Partial>>,
    limits: Limits,
    mut on: impl FnMut(Incoming<'_>),
) -> Result<usize, Violation> {
    decode_each(role, input, partial, limits, |m| {
        on(m);
        ControlFlow::Continue(())
    })
}

/// Like [`decode`], but `on` may stop the decoding after any message (returning
/// `ControlFlow::Break`): the bytes used up to and including that message are returned,
/// and the rest is left for the next call. A caller that acts on each message before
/// reading the next one (the gateway: a message sets the form of its reply) stops after
/// every data message.
pub fn decode_each(
    role: Role,
    input: &mut [u8],
    partial: &mut Option<Box<Partial>>,
    limits: Limits,
    mut on: impl FnMut(Incoming<'_>) -> ControlFlow<()>,
) -> Result<usize, Violation> {
    let mut at = 0;
    while at < input.len() {
        let mut cursor = Cursor::new(&input[at..]);
        let (header, len) = match FrameHeader::parse(&mut cursor) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => break,
            // The only error a parse from memory can give.
            Err(_) => return Err(Violation::protocol("unknown opcode")),
        };
        let start = at + cursor.position() as usize;
        let len = check_header(role, &header, len, partial.as_deref(), limits)?;
        if input.len() - start < len {
            break;
        }
        let end = start + len;
        let payload = &mut input[start..end];
        if let Some(mask) = header.mask {
            apply_mask(payload, mask);
        }
        let payload = &*payload;
        at = end;
        match header.opcode {
            OpCode::Control(Control::Ping) => {
                if on(Incoming::Ping(payload)).is_break() {
                    break;
                }
            }
            OpCode::Control(Control::Pong) => {
                if on(Incoming::Pong(payload)).is_break() {
                    break;
                }
            }
            // Close: the reserved control opcodes were refused by the parse.
            OpCode::Control(_) => {
                let _ = on(read_close(payload)?);
                break;
            }
            OpCode::Data(Data::Continue) => {
                let assembling = partial.as_mut().expect("check_header: a message is open");
                assembling.append(payload, limits);
                if header.is_final {
                    let done = partial.take().expect("just used");
                    if deliver(done.text, &done.data, &mut on)?.is_break() {
                        break;
                    }
                }
            }
            OpCode::Data(data) => {
                let text = data == Data::Text;
                if header.is_final {
                    if deliver(text, payload, &mut on)?.is_break() {
                        break;
                    }
                } else {
                    *partial = Some(Box::new(Partial {
                        text,
                        data: payload.to_vec(),
                    }));
                }
            }
        }
    }
    Ok(at)
}

/// Everything a header alone can tell is wrong. Returns the payload length, which the
/// checks bound by the limits (so it fits a `usize`).
fn check_header(
    role: Role,
    header: &FrameHeader,
    len: u64,
    partial: Option<&Partial>,
    limits: Limits,
) -> Result<usize, Violation> {
    if header.rsv1 || header.rsv2 || header.rsv3 {
        return Err(Violation::protocol("reserved bits set"));
    }
    match (role, header.mask.is_some()) {
        (Role::Server, false) => return Err(Violation::protocol("client frame not masked")),
        (Role::Client, true) => return Err(Violation::protocol("server frame masked")),
        _ => {}
    }
    if len >> 63 != 0 {
        return Err(Violation::protocol("64-bit length with the top bit set"));
    }
    let (text, held) = match header.opcode {
        OpCode::Control(_) => {
            if !header.is_final {
                return Err(Violation::protocol("fragmented control frame"));
            }
            if len > MAX_CONTROL_PAYLOAD as u64 {
                return Err(Violation::protocol("control frame over 125 bytes"));
            }
            return Ok(len as usize);
        }
        OpCode::Data(Data::Continue) => match partial {
            Some(p) => (p.text, p.data.len()),
            None => return Err(Violation::protocol("continuation with no message open")),
        },
        OpCode::Data(data) => {
            if partial.is_some() {
                return Err(Violation::protocol("new message before the last one ended"));
            }
            (data == Data::Text, 0)
        }
    };
    let room = limits.for_kind(text).saturating_sub(held);
    if len > room as u64 {
        return Err(Violation {
            code: close_code::TOO_BIG,
            reason: "message over the size limit",
        });
    }
    Ok(len as usize)
}

fn deliver(
    text: bool,
    payload: &[u8],
    on: &mut impl FnMut(Incoming<'_>) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, Violation> {
    if !text {
        return Ok(on(Incoming::Binary(payload)));
    }
    match std::str::from_utf8(payload) {
        Ok(text) => Ok(on(Incoming::Text(text))),
        Err(_) => Err(Violation {
            code: close_code::INVALID_DATA,
            reason: "text message is not UTF-8",
        }),
    }
}

fn read_close(payload: &[u8]) -> Result<Incoming<'_>, Violation> {
    let (code, reason) = match payload {
        [] => {
            return Ok(Incoming::Close {
                code: None,
                reason: "",
            })
        }
        [_] => return Err(Violation::protocol("close payload of one byte")),
        [hi, lo, reason @ ..] => (u16::from_be_bytes([*hi, *lo]), reason),
    };
    if !CloseCode::from(code).is_allowed() {
        return Err(Violation::protocol("close code not allowed on the wire"));
    }
    match std::str::from_utf8(reason) {
        Ok(reason) => Ok(Incoming::Close {
            code: Some(code),
            reason,
        }),
        Err(_) => Err(Violation {
            code: close_code::INVALID_DATA,
            reason: "close reason is not UTF-8",
        }),
    }
}

/// XORs `buf` with the repeating 4-byte `mask` (RFC 6455 §5.3), a word at a time.
fn apply_mask(buf: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let mut chunks = buf.chunks_exact_mut(4);
    for chunk in &mut chunks {
        let v = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) ^ word;
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    for (b, m) in chunks.into_remainder().iter_mut().zip(mask) {
        *b ^= m;
    }
}

/// The kinds of frame we send. We never fragment, so there is no continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    Text,
    Binary,
    Ping,
    Pong,
    Close,
}

impl Opcode {
    fn wire(self) -> OpCode {
        match self {
            Opcode::Text => OpCode::Data(Data::Text),
            Opcode::Binary => OpCode::Data(Data::Binary),
            Opcode::Ping => OpCode::Control(Control::Ping),
            Opcode::Pong => OpCode::Control(Control::Pong),
            Opcode::Close => OpCode::Control(Control::Close),
        }
    }

    fn is_control(self) -> bool {
        matches!(self, Opcode::Ping | Opcode::Pong | Opcode::Close)
    }
}

/// Appends one unfragmented frame to `out`: unmasked for a `Server`, masked with a fresh
/// mask for a `Client`. Control payloads are cut to [`MAX_CONTROL_PAYLOAD`] bytes (a
/// pong echoing a decoded ping never is); a `Text` payload must be UTF-8.
pub fn encode(role: Role, opcode: Opcode, payload: &[u8], out: &mut Vec<u8>) {
    let payload = if opcode.is_control() {
        &payload[..payload.len().min(MAX_CONTROL_PAYLOAD)]
    } else {
        payload
    };
    let mask = match role {
        Role::Server => None,
        Role::Client => Some(next_mask()),
    };
    let header = FrameHeader {
        is_final: true,
        rsv1: false,
        rsv2: false,
        rsv3: false,
        opcode: opcode.wire(),
        mask,
    };
    header
        .format(payload.len() as u64, out)
        .expect("writing to a Vec cannot fail");
    let start = out.len();
    out.extend_from_slice(payload);
    if let Some(mask) = mask {
        apply_mask(&mut out[start..], mask);
    }
}

/// Appends a close frame with `code` and `reason`, the reason cut at a char boundary to
/// fit the 125-byte control payload.
pub fn close_frame(role: Role, code: u16, reason: &str, out: &mut Vec<u8>) {
    let mut end = reason.len().min(MAX_CONTROL_PAYLOAD - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut payload = [0u8; MAX_CONTROL_PAYLOAD];
    payload[..2].copy_from_slice(&code.to_be_bytes());
    payload[2..2 + end].copy_from_slice(&reason.as_bytes()[..end]);
    encode(role, Opcode::Close, &payload[..2 + end], out);
}

/// Bytes of the header of an unmasked (server) frame carrying `payload_len` bytes: 2, 4
/// or 10. For sizing output when one pre-encoded broadcast frame is written to many
/// connections.
pub fn frame_header_len(payload_len: usize) -> usize {
    FrameHeader::default().len(payload_len as u64)
}

/// A fresh client mask. The mask exists so a browser's script cannot choose the bytes on
/// the wire (RFC 6455 §10.3); our client is a load generator with nothing to hide, so a
/// per-thread xorshift seeded from std's per-process random keys is enough, and keeps
/// `rand` out of the codec.
fn next_mask() -> [u8; 4] {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish() | 1
        });
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        ((x >> 32) as u32).to_ne_bytes()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        binary: 70_000,
        text: 70_000,
    };

    /// An owned copy of an [`Incoming`], to compare across calls.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Got {
        Binary(Vec<u8>),
        Text(String),
        Ping(Vec<u8>),
        Pong(Vec<u8>),
        Close(Option<u16>, String),
    }

    impl From<Incoming<'_>> for Got {
        fn from(m: Incoming<'_>) -> Got {
            match m {
                Incoming::Binary(b) => Got::Binary(b.to_vec()),
                Incoming::Text(t) => Got::Text(t.to_owned()),
                Incoming::Ping(b) => Got::Ping(b.to_vec()),
                Incoming::Pong(b) => Got::Pong(b.to_vec()),
                Incoming::Close { code, reason } => Got::Close(code, reason.to_owned()),
            }
        }
    }

    /// A raw frame: first byte (FIN/RSV/opcode) as given, payload masked if `mask`.
    fn raw(first: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![first];
        let m = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(m | n as u8),
            n if n < 65536 => {
                out.push(m | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(m | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if let Some(mask) = mask {
            out.extend_from_slice(&mask);
        }
        let body = out.len();
        out.extend_from_slice(payload);
        if let Some(mask) = mask {
            apply_mask(&mut out[body..], mask);
        }
        out
    }

    const MASK: Option<[u8; 4]> = Some([0x37, 0xfa, 0x21, 0x3d]);
    const FIN: u8 = 0x80;

    /// A client frame (masked), as a server receives it.
    fn client(first: u8, payload: &[u8]) -> Vec<u8> {
        raw(first, MASK, payload)
    }

    /// Decodes `input` whole as `role`, returning what came out and how much was used.
    fn run(
        role: Role,
        input: &[u8],
        limits: Limits,
    ) -> (Result<usize, Violation>, Vec<Got>, Option<Box<Partial>>) {
        let mut buf = input.to_vec();
        let mut partial = None;
        let mut got = Vec::new();
        let r = decode(role, &mut buf, &mut partial, limits, |m| got.push(m.into()));
        (r, got, partial)
    }

    fn server_gets(input: &[u8]) -> Result<Vec<Got>, Violation> {
        let (r, got, _) = run(Role::Server, input, LIMITS);
        r.map(|n| {
            assert_eq!(n, input.len(), "all consumed");
            got
        })
    }

    fn violation(input: &[u8]) -> Violation {
        server_gets(input).expect_err("a violation")
    }

    #[test]
    fn rfc_sample_frames() {
        // RFC 6455 §5.7: "Hello", unmasked and masked.
        let unmasked = [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];
        let masked = [
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
        ];
        let (r, got, _) = run(Role::Client, &unmasked, LIMITS);
        assert_eq!(r, Ok(7));
        assert_eq!(got, [Got::Text("Hello".into())]);
        assert_eq!(server_gets(&masked), Ok(vec![Got::Text("Hello".into())]));
        // Fragmented unmasked text "Hel" + "lo".
        let frags = [0x01, 0x03, 0x48, 0x65, 0x6c, 0x80, 0x02, 0x6c, 0x6f];
        let (r, got, partial) = run(Role::Client, &frags, LIMITS);
        assert_eq!((r, got), (Ok(9), vec![Got::Text("Hello".into())]));
        assert!(partial.is_none());
        // 256 bytes binary in one unmasked frame: 16-bit length.
        let mut out = Vec::new();
        encode(Role::Server, Opcode::Binary, &[7; 256], &mut out);
        assert_eq!(out[..4], [0x82, 0x7e, 0x01, 0x00]);
        assert_eq!(out.len(), 4 + 256);
        // Ping "Hello", unmasked.
        let mut out = Vec::new();
        encode(Role::Server, Opcode::Ping, b"Hello", &mut out);
        assert_eq!(out, [0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
    }

    #[test]
    fn masking_follows_the_role() {
        // A server must get masked frames, a client unmasked ones.
        assert_eq!(
            violation(&raw(FIN | 2, None, b"x")),
            Violation::protocol("client frame not masked")
        );
        let (r, _, _) = run(Role::Client, &client(FIN | 2, b"x"), LIMITS);
        assert_eq!(r, Err(Violation::protocol("server frame masked")));
        // What each role encodes, the other decodes.
        for (sender, receiver) in [(Role::Server, Role::Client), (Role::Client, Role::Server)] {
            let mut out = Vec::new();
            encode(sender, Opcode::Binary, b"hongbao", &mut out);
            assert_eq!(out[1] & 0x80 != 0, sender == Role::Client);
            let (r, got, _) = run(receiver, &out, LIMITS);
            assert_eq!(r, Ok(out.len()));
            assert_eq!(got, [Got::Binary(b"hongbao".to_vec())]);
        }
        // Client masks vary.
        let mut a = Vec::new();
        let mut b = Vec::new();
        encode(Role::Client, Opcode::Binary, b"", &mut a);
        encode(Role::Client, Opcode::Binary, b"", &mut b);
        assert_ne!(a[2..6], b[2..6]);
    }

    #[test]
    fn every_length_encoding() {
        for len in [0, 1, 125, 126, 127, 65535, 65536, 69_999] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            for role in [Role::Server, Role::Client] {
                let mut out = Vec::new();
                encode(role, Opcode::Binary, &payload, &mut out);
                let mask_len = if role == Role::Client { 4 } else { 0 };
                assert_eq!(out.len(), frame_header_len(len) + mask_len + len);
                let peer = if role == Role::Server {
                    Role::Client
                } else {
                    Role::Server
                };
                let (r, got, _) = run(peer, &out, LIMITS);
                assert_eq!(r, Ok(out.len()), "len {len}");
                assert_eq!(got, [Got::Binary(payload.clone())]);
                // One byte short: nothing yet.
                let (r, got, _) = run(peer, &out[..out.len() - 1], LIMITS);
                assert_eq!((r, got.len()), (Ok(0), 0));
            }
        }
        assert_eq!(frame_header_len(125), 2);
        assert_eq!(frame_header_len(126), 4);
        assert_eq!(frame_header_len(65535), 4);
        assert_eq!(frame_header_len(65536), 10);
        // Non-minimal length encodings are accepted: 5 bytes announced in 16 and 64 bits.
        let mut long16 = vec![FIN | 2, 0x80 | 126, 0, 5];
        long16.extend_from_slice(&MASK.unwrap());
        long16.extend_from_slice(&client(FIN | 2, b"abcde")[6..]);
        assert_eq!(
            server_gets(&long16),
            Ok(vec![Got::Binary(b"abcde".to_vec())])
        );
        let mut long64 = vec![FIN | 2, 0x80 | 127, 0, 0, 0, 0, 0, 0, 0, 5];
        long64.extend_from_slice(&MASK.unwrap());
        long64.extend_from_slice(&client(FIN | 2, b"abcde")[6..]);
        assert_eq!(
            server_gets(&long64),
            Ok(vec![Got::Binary(b"abcde".to_vec())])
        );
    }

    #[test]
    fn fragmented_messages_are_assembled() {
        let mut stream = client(2, b"hong");
        stream.extend(client(0, b""));
        stream.extend(client(FIN, b"bao"));
        stream.extend(client(1, "新年".as_bytes()));
        // A character split across fragments is fine: UTF-8 is checked after assembly.
        let kuai = "快".as_bytes();
        stream.extend(client(0, &kuai[..1]));
        stream.extend(client(FIN, &[&kuai[1..], "乐".as_bytes()].concat()));
        assert_eq!(
            server_gets(&stream),
            Ok(vec![
                Got::Binary(b"hongbao".to_vec()),
                Got::Text("新年快乐".into())
            ])
        );
    }

    #[test]
    fn control_frames_inside_a_fragmented_message() {
        let mut stream = client(1, b"he");
        stream.extend(client(FIN | 9, b"p1"));
        stream.extend(client(0, b"ll"));
        stream.extend(client(FIN | 0xa, b"p2"));
        stream.extend(client(FIN, b"o"));
        let (r, got, partial) = run(Role::Server, &stream, LIMITS);
        assert_eq!(r, Ok(stream.len()));
        assert!(partial.is_none());
        assert_eq!(
            got,
            [
                Got::Ping(b"p1".to_vec()),
                Got::Pong(b"p2".to_vec()),
                Got::Text("hello".into())
            ]
        );
        // A close in the middle ends everything, the open message is dropped.
        let mut stream = client(2, b"he");
        stream.extend(client(FIN | 8, &1000u16.to_be_bytes()));
        stream.extend(client(FIN, b"llo"));
        let (r, got, _) = run(Role::Server, &stream, LIMITS);
        assert_eq!(r, Ok(stream.len() - 9));
        assert_eq!(got, [Got::Close(Some(1000), String::new())]);
    }

    #[test]
    fn close_frames() {
        let close = |payload: &[u8]| server_gets(&client(FIN | 8, payload));
        assert_eq!(close(b""), Ok(vec![Got::Close(None, String::new())]));
        let mut p = 1001u16.to_be_bytes().to_vec();
        p.extend_from_slice("再见".as_bytes());
        assert_eq!(close(&p), Ok(vec![Got::Close(Some(1001), "再见".into())]));
        for code in [1000, 1003, 1007, 1011, 1012, 1013, 3000, 3999, 4000, 4999] {
            assert!(close(&u16::to_be_bytes(code)).is_ok(), "{code}");
        }
        assert_eq!(
            close(&[3]),
            Err(Violation::protocol("close payload of one byte"))
        );
        for code in [
            0, 999, 1004, 1005, 1006, 1014, 1015, 1016, 2000, 2999, 5000, 65535,
        ] {
            assert_eq!(
                close(&u16::to_be_bytes(code)),
                Err(Violation::protocol("close code not allowed on the wire")),
                "{code}"
            );
        }
        let mut bad_reason = 1000u16.to_be_bytes().to_vec();
        bad_reason.extend_from_slice(&[0xc3, 0x28]);
        assert_eq!(close(&bad_reason).unwrap_err().code, 1007);

        // What we send decodes back, with the reason cut at a char boundary.
        let mut out = Vec::new();
        close_frame(Role::Server, close_code::POLICY, &"踢".repeat(60), &mut out);
        assert_eq!(out.len(), 2 + 2 + 123 / 3 * 3);
        let (r, got, _) = run(Role::Client, &out, LIMITS);
        assert_eq!(r, Ok(out.len()));
        assert_eq!(got, [Got::Close(Some(1008), "踢".repeat(41))]);
        // Nothing after a close is read.
        let mut stream = client(FIN | 8, b"");
        stream.extend(client(FIN | 2, b"late"));
        let (r, got, _) = run(Role::Server, &stream, LIMITS);
        assert_eq!((r, got.len()), (Ok(6), 1));
    }

    #[test]
    fn header_violations() {
        for rsv in [0x40, 0x20, 0x10] {
            assert_eq!(
                violation(&client(FIN | rsv | 2, b"x")),
                Violation::protocol("reserved bits set")
            );
        }
        for op in [3, 7, 0xb, 0xf] {
            assert_eq!(
                violation(&client(FIN | op, b"")),
                Violation::protocol("unknown opcode"),
                "{op}"
            );
        }
        assert_eq!(
            violation(&client(9, b"")),
            Violation::protocol("fragmented control frame")
        );
        assert_eq!(
            violation(&client(FIN | 9, &[0; 126])),
            Violation::protocol("control frame over 125 bytes")
        );
        assert!(server_gets(&client(FIN | 9, &[0; 125])).is_ok());
        assert_eq!(
            violation(&client(FIN, b"x")),
            Violation::protocol("continuation with no message open")
        );
        let mut two_open = client(1, b"a");
        two_open.extend(client(FIN | 1, b"b"));
        assert_eq!(
            violation(&two_open),
            Violation::protocol("new message before the last one ended")
        );
        // Top bit of a 64-bit length: refused from the header alone.
        let mut huge = vec![FIN | 2, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 0];
        huge.extend_from_slice(&MASK.unwrap());
        assert_eq!(
            violation(&huge),
            Violation::protocol("64-bit length with the top bit set")
        );
    }

    #[test]
    fn size_limits_are_decided_from_the_header() {
        let limits = Limits {
            binary: 10,
            text: 20,
        };
        let too_big = Violation {
            code: 1009,
            reason: "message over the size limit",
        };
        let decode_with = |input: &[u8]| run(Role::Server, input, limits).0;
        assert!(decode_with(&client(FIN | 2, &[0; 10])).is_ok());
        assert!(decode_with(&client(FIN | 1, &[b'a'; 20])).is_ok());
        // Only the header is there, and it already says too much.
        let header_only = &client(FIN | 2, &[0; 11])[..6];
        assert_eq!(decode_with(header_only), Err(too_big));
        assert_eq!(
            decode_with(&client(FIN | 1, &[b'a'; 21])[..6]),
            Err(too_big)
        );
        let mut big = vec![FIN | 2, 0x80 | 127, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        big.extend_from_slice(&MASK.unwrap());
        assert_eq!(decode_with(&big), Err(too_big));
        // Fragments count together; the refusal comes at the header of the one that
        // would go over, before its payload arrives.
        let mut frags = client(2, &[0; 6]);
        frags.extend(client(0, &[0; 4]));
        let ok_len = frags.len();
        frags.extend(client(FIN, &[0; 1]));
        let (r, got, partial) = run(Role::Server, &frags[..ok_len], limits);
        assert_eq!((r, got.len()), (Ok(ok_len), 0));
        assert_eq!(partial.map(|p| p.held()), Some(10));
        assert_eq!(decode_with(&frags[..ok_len + 6]), Err(too_big));
        // Control frames are not messages: a 125-byte ping passes a 10-byte limit.
        assert!(decode_with(&client(FIN | 9, &[0; 125])).is_ok());
        assert_eq!(limits.max_tail(), 14 + 125);
        assert_eq!(Limits::HONGBAO.max_tail(), 14 + MAX_JSON_LEN);
    }

    #[test]
    fn bad_utf8_text() {
        let bad = violation(&client(FIN | 1, &[b'a', 0xff]));
        assert_eq!(bad.code, 1007);
        // Also after assembly.
        let mut frags = client(1, &[0xe4]);
        frags.extend(client(FIN, &[0xb8]));
        assert_eq!(violation(&frags).code, 1007);
        // Binary may be anything.
        assert!(server_gets(&client(FIN | 2, &[0xff])).is_ok());
    }

    /// A client stream using every feature, short enough to split at every offset.
    fn mixed_stream() -> (Vec<u8>, Vec<Got>) {
        let mut s = Vec::new();
        let mut want = Vec::new();
        s.extend(client(FIN | 2, b""));
        want.push(Got::Binary(vec![]));
        s.extend(client(FIN | 1, "红包".as_bytes()));
        want.push(Got::Text("红包".into()));
        let long: Vec<u8> = (0..300).map(|i| i as u8).collect();
        s.extend(client(FIN | 2, &long));
        want.push(Got::Binary(long.clone()));
        s.extend(client(FIN | 9, b"are you there"));
        want.push(Got::Ping(b"are you there".to_vec()));
        s.extend(client(2, &long[..130]));
        s.extend(client(FIN | 0xa, b""));
        want.push(Got::Pong(vec![]));
        s.extend(client(0, &long[130..]));
        s.extend(client(FIN | 9, &[1; 125]));
        want.push(Got::Ping(vec![1; 125]));
        s.extend(client(FIN, b""));
        want.push(Got::Binary(long));
        s.extend(client(1, "拆".as_bytes()));
        s.extend(client(FIN, "红包".as_bytes()));
        want.push(Got::Text("拆红包".into()));
        let mut close = 1000u16.to_be_bytes().to_vec();
        close.extend_from_slice(b"bye");
        s.extend(client(FIN | 8, &close));
        want.push(Got::Close(Some(1000), "bye".into()));
        (s, want)
    }

    /// Decodes `stream` as a connection would, cutting the reads at `cuts`; returns what
    /// came out and asserts the kept tail never outgrows [`Limits::max_tail`].
    fn feed(stream: &[u8], cuts: &[usize], limits: Limits) -> Result<Vec<Got>, Violation> {
        let mut tail = Vec::new();
        let mut partial = None;
        let mut got = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([&stream.len()]) {
            tail.extend_from_slice(&stream[from..cut]);
            from = cut;
            let n = decode(Role::Server, &mut tail, &mut partial, limits, |m| {
                got.push(m.into())
            })?;
            tail.drain(..n);
            assert!(tail.len() < limits.max_tail());
            if matches!(got.last(), Some(Got::Close(..))) {
                break;
            }
        }
        Ok(got)
    }

    #[test]
    fn split_at_every_offset() {
        let (stream, want) = mixed_stream();
        assert_eq!(server_gets(&stream), Ok(want.clone()));
        for cut in 0..=stream.len() {
            assert_eq!(feed(&stream, &[cut], LIMITS), Ok(want.clone()), "cut {cut}");
        }
    }

    #[test]
    fn byte_by_byte() {
        let (stream, want) = mixed_stream();
        let cuts: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(feed(&stream, &cuts, LIMITS), Ok(want));
        // And a 64-bit length frame, a few bytes at a time.
        let big: Vec<u8> = (0..65_600).map(|i| (i % 251) as u8).collect();
        let stream = client(FIN | 2, &big);
        let cuts: Vec<usize> = (1..stream.len()).step_by(997).chain([3, 9, 13]).collect();
        let mut cuts = cuts;
        cuts.sort();
        assert_eq!(feed(&stream, &cuts, LIMITS), Ok(vec![Got::Binary(big)]));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        const SMALL: Limits = Limits {
            binary: 100,
            text: 60,
        };

        /// Feeds `bytes` in reads of the given sizes, as a connection would, for either
        /// role; checks the bounds after every call. Returns whether it ended in a
        /// violation.
        fn feed_checked(role: Role, bytes: &[u8], reads: &[usize]) -> bool {
            let mut tail = Vec::new();
            let mut partial: Option<Box<Partial>> = None;
            let mut from = 0;
            for &n in reads.iter().chain([&bytes.len()]) {
                let to = (from + n).min(bytes.len());
                tail.extend_from_slice(&bytes[from..to]);
                from = to;
                let mut closed = false;
                let result = decode(role, &mut tail, &mut partial, SMALL, |m| match m {
                    Incoming::Binary(b) => assert!(b.len() <= SMALL.binary),
                    Incoming::Text(t) => assert!(t.len() <= SMALL.text),
                    Incoming::Ping(b) | Incoming::Pong(b) => {
                        assert!(b.len() <= MAX_CONTROL_PAYLOAD)
                    }
                    Incoming::Close { .. } => closed = true,
                });
                let Ok(used) = result else { return true };
                assert!(used <= tail.len());
                tail.drain(..used);
                if closed {
                    // Decoding stops at a close: what came after it is not a tail to
                    // keep (the connection is closing), however long it is.
                    break;
                }
                assert!(tail.len() < SMALL.max_tail(), "tail {}", tail.len());
                if let Some(p) = &partial {
                    let limit = SMALL.for_kind(p.text);
                    assert!(p.held() <= limit, "held {}", p.held());
                    assert!(p.data.capacity() <= limit, "reserved {}", p.data.capacity());
                }
                if from == bytes.len() {
                    break;
                }
            }
            false
        }

        /// Bytes that look like frames often enough to get past the first header:
        /// frame-ish chunks mixed with noise.
        fn frameish() -> impl Strategy<Value = Vec<u8>> {
            let chunk = prop_oneof![
                (
                    any::<u8>(),
                    0u8..=130,
                    proptest::collection::vec(any::<u8>(), 0..140)
                )
                    .prop_map(|(first, len, body)| {
                        let mut v = vec![first & 0x8f, 0x80 | len.min(127)];
                        v.extend(body);
                        v
                    }),
                proptest::collection::vec(any::<u8>(), 0..20),
            ];
            proptest::collection::vec(chunk, 0..8).prop_map(|c| c.concat())
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic_or_overgrow(
                bytes in proptest::collection::vec(any::<u8>(), 0..600),
                reads in proptest::collection::vec(0usize..64, 0..20),
            ) {
                feed_checked(Role::Server, &bytes, &reads);
                feed_checked(Role::Client, &bytes, &reads);
            }

            #[test]
            fn frameish_bytes_never_panic_or_overgrow(
                bytes in frameish(),
                reads in proptest::collection::vec(0usize..64, 0..20),
            ) {
                feed_checked(Role::Server, &bytes, &reads);
            }

            #[test]
            fn any_chunking_gives_the_same_messages(
                reads in proptest::collection::vec(1usize..200, 0..40),
            ) {
                let (stream, want) = mixed_stream();
                let mut cuts = Vec::new();
                let mut at = 0;
                for n in reads {
                    at += n;
                    if at >= stream.len() {
                        break;
                    }
                    cuts.push(at);
                }
                prop_assert_eq!(feed(&stream, &cuts, LIMITS), Ok(want));
            }

            #[test]
            fn handshakes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = accept(&bytes);
                let _ = check_response(&bytes, &[0; 16]);
            }
        }
    }

    // --- handshake ---

    const RFC_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    fn upgrade_request(extra: &str) -> String {
        format!(
            "GET /ws HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: {RFC_KEY}\r\n\
             Sec-WebSocket-Version: 13\r\n{extra}\r\n"
        )
    }

    fn reason_of(h: Handshake) -> &'static str {
        match h {
            Handshake::Reject { reason, .. } => reason,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn accepts_the_rfc_sample() {
        let req = upgrade_request("Origin: http://example.com\r\n");
        let mut bytes = req.clone().into_bytes();
        bytes.extend_from_slice(b"\x81\x85"); // a frame already following
        let Handshake::Upgrade { consumed, response } = accept(&bytes) else {
            panic!("not an upgrade");
        };
        assert_eq!(consumed, req.len());
        assert_eq!(
            String::from_utf8(response).unwrap(),
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
        );
        // Every strict prefix is partial.
        for cut in 0..req.len() {
            assert_eq!(accept(&bytes[..cut]), Handshake::Partial, "cut {cut}");
        }
    }

    #[test]
    fn header_tokens_are_case_insensitive_lists() {
        let req = "GET / HTTP/1.1\r\nhost: x\r\nupgrade: WebSocket\r\n\
                   CONNECTION: keep-alive, upgrade\r\nsec-websocket-key:  dGhlIHNhbXBsZSBub25jZQ== \r\n\
                   sec-websocket-version: 13\r\n\r\n";
        assert!(matches!(accept(req.as_bytes()), Handshake::Upgrade { .. }));
    }

    #[test]
    fn rejects_bad_upgrades() {
        let swap = |from: &str, to: &str| accept(upgrade_request("").replace(from, to).as_bytes());
        assert_eq!(
            reason_of(swap("GET", "POST")),
            "a WebSocket upgrade must be a GET"
        );
        assert_eq!(
            reason_of(swap("HTTP/1.1", "HTTP/1.0")),
            "a WebSocket upgrade needs HTTP/1.1"
        );
        assert_eq!(
            reason_of(swap("Connection: Upgrade", "Connection: keep-alive")),
            "the Connection header does not name Upgrade"
        );
        assert_eq!(
            reason_of(swap(&format!("Sec-WebSocket-Key: {RFC_KEY}\r\n"), "")),
            "no Sec-WebSocket-Key"
        );
        for bad_key in [
            "dGhlIHNhbXBsZSBub25jZQ",
            "dGhlIHNhbXBsZSBub25jZXg=",
            "!!",
            "",
        ] {
            assert_eq!(
                reason_of(swap(RFC_KEY, bad_key)),
                "Sec-WebSocket-Key is not the base64 of 16 bytes",
                "{bad_key}"
            );
        }
        let twice =
            accept(upgrade_request(&format!("Sec-WebSocket-Key: {RFC_KEY}\r\n")).as_bytes());
        assert_eq!(reason_of(twice), "more than one Sec-WebSocket-Key");
        for version in ["Sec-WebSocket-Version: 8\r\n", ""] {
            let h = swap("Sec-WebSocket-Version: 13\r\n", version);
            let Handshake::Reject { response, .. } = h else {
                panic!("not rejected");
            };
            let text = String::from_utf8(response).unwrap();
            assert!(
                text.starts_with("HTTP/1.1 426 Upgrade Required\r\n"),
                "{text}"
            );
            assert!(text.contains("\r\nSec-WebSocket-Version: 13\r\n"));
        }
        // A rejection is a whole response that says why and closes.
        let Handshake::Reject { response, .. } = swap("GET", "PUT") else {
            panic!("not rejected");
        };
        let text = String::from_utf8(response).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n"));
        assert!(text.ends_with("\r\n\r\na WebSocket upgrade must be a GET\n"));
        assert!(text.contains("\r\nContent-Length: 34\r\n"));
    }

    #[test]
    fn plain_http_and_garbage() {
        let h = accept(b"GET /?x=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /next");
        assert_eq!(
            h,
            Handshake::NotWebSocket {
                consumed: 31,
                method: "GET".into(),
                path: "/?x=1".into()
            }
        );
        assert_eq!(
            reason_of(accept(b"\x16\x03\x01hello\r\n\r\n")),
            "malformed HTTP request"
        );
        // A head that never ends is refused at the limit, not buffered forever.
        let mut endless = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
        endless.resize(MAX_HANDSHAKE_LEN - 10, b'a');
        assert_eq!(accept(&endless), Handshake::Partial);
        endless.extend_from_slice(&[b'a'; 20]);
        assert_eq!(reason_of(accept(&endless)), "request head too large");
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: 1\r\n"))
            .collect();
        assert_eq!(
            reason_of(accept(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes())),
            "request head too large"
        );
    }

    #[test]
    fn client_and_server_agree() {
        let key = *b"0123456789abcdef";
        let req = client_request("127.0.0.1:9000", "/ws", &key);
        let Handshake::Upgrade { consumed, response } = accept(&req) else {
            panic!("not an upgrade");
        };
        assert_eq!(consumed, req.len());
        let mut reply = response.clone();
        reply.extend_from_slice(&[0x82, 0x00]);
        assert_eq!(check_response(&reply, &key), Ok(Some(response.len())));
        for cut in 0..response.len() {
            assert_eq!(check_response(&response[..cut], &key), Ok(None));
        }
        // Another key's accept is not ours.
        assert_eq!(
            check_response(&response, b"fedcba9876543210"),
            Err(HandshakeError::BadAccept)
        );
        let refused = http_response("404 Not Found", "text/plain", b"no");
        assert_eq!(
            check_response(&refused, &key),
            Err(HandshakeError::Status { code: 404 })
        );
        let bare = b"HTTP/1.1 101 Switching Protocols\r\n\r\n";
        assert_eq!(check_response(bare, &key), Err(HandshakeError::NotUpgraded));
        assert!(matches!(
            check_response(b"HTTP/1.1 abc\r\n\r\n", &key),
            Err(HandshakeError::Malformed(_))
        ));
        let long = vec![b'H'; MAX_HANDSHAKE_LEN];
        assert!(check_response(&long, &key).is_err());
    }
}
