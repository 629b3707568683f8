//! WebSocket frames: `ws::decode` (header parse, unmasking in place, fragment assembly,
//! control frames, close payloads).
//!
//! Input: byte 0 chooses the role (bit 0: 0 = `Server`, reading masked client frames;
//! 1 = `Client`) and the limits (bit 1: 0 = `Limits::HONGBAO`, 1 = small limits so the
//! size checks and fragment assembly are reached with short inputs); byte 1 seeds the
//! sizes of the reads; the rest is the byte stream.
//!
//! Properties:
//! - `decode` never makes one allocation over the larger of the two message limits
//!   (`4 + MAX_FRAME_LEN` binary, `MAX_JSON_LEN` text, for `Limits::HONGBAO`);
//! - it uses no more bytes than it is given, and every message it hands over is within
//!   its limit (control payloads within 125 bytes, close reasons within 123);
//! - fed the stream in reads of any sizes, keeping the unused tail as a connection does,
//!   it hands over the same messages and ends in the same violation (or none) as fed the
//!   whole stream at once, and the tail kept between reads is always shorter than
//!   `Limits::max_tail()`;
//! - every message it hands over, encoded again by the peer's role (`ws::encode`,
//!   `ws::close_frame`), decodes to the same message.
#![no_main]

use hongbao_fuzz::{limited, unlimited};
use hongbao_proto::ws::{
    close_frame, decode, encode, Incoming, Limits, Opcode, Partial, Role, Violation,
    MAX_CONTROL_PAYLOAD,
};
use libfuzzer_sys::fuzz_target;

/// Small limits: assembly and the size checks with inputs of a few hundred bytes.
const SMALL: Limits = Limits {
    binary: 100,
    text: 60,
};

/// An owned copy of an [`Incoming`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Binary(Vec<u8>),
    Text(String),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>, String),
}

impl Got {
    fn of(m: Incoming<'_>, limits: Limits) -> Got {
        match m {
            Incoming::Binary(b) => {
                assert!(b.len() <= limits.binary, "binary message of {}", b.len());
                Got::Binary(b.to_vec())
            }
            Incoming::Text(t) => {
                assert!(t.len() <= limits.text, "text message of {}", t.len());
                Got::Text(t.to_owned())
            }
            Incoming::Ping(b) => {
                assert!(b.len() <= MAX_CONTROL_PAYLOAD, "ping of {}", b.len());
                Got::Ping(b.to_vec())
            }
            Incoming::Pong(b) => {
                assert!(b.len() <= MAX_CONTROL_PAYLOAD, "pong of {}", b.len());
                Got::Pong(b.to_vec())
            }
            Incoming::Close { code, reason } => {
                assert!(reason.len() <= MAX_CONTROL_PAYLOAD - 2);
                assert!(code.is_some() || reason.is_empty());
                Got::Close(code, reason.to_owned())
            }
        }
    }
}

/// The largest single allocation `decode` may make with `limits`: a fragmented message
/// is gathered into one buffer of at most its limit, in a `Box<Partial>`.
fn alloc_limit(limits: Limits) -> usize {
    limits
        .binary
        .max(limits.text)
        .max(std::mem::size_of::<Partial>())
}

/// One `decode` call on `buf`, under the allocation limit; messages are copied out
/// (outside the limit: the copies are ours).
fn decode_once(
    role: Role,
    buf: &mut [u8],
    partial: &mut Option<Box<Partial>>,
    limits: Limits,
    got: &mut Vec<Got>,
) -> Result<usize, Violation> {
    limited(alloc_limit(limits), || {
        decode(role, buf, partial, limits, |m| {
            unlimited(|| got.push(Got::of(m, limits)))
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let [mode, seed, stream @ ..] = data else {
        return;
    };
    let role = if mode & 1 == 0 {
        Role::Server
    } else {
        Role::Client
    };
    let limits = if mode & 2 == 0 {
        Limits::HONGBAO
    } else {
        SMALL
    };

    // The whole stream at once.
    let mut whole = stream.to_vec();
    let mut partial = None;
    let mut got_whole = Vec::new();
    let result = decode_once(role, &mut whole, &mut partial, limits, &mut got_whole);
    if let Ok(used) = result {
        assert!(used <= stream.len(), "used {used} of {}", stream.len());
    }
    let closed = matches!(got_whole.last(), Some(Got::Close(..)));

    // The same stream in reads, as a connection sees it.
    let mut rng = u32::from(*seed).wrapping_mul(0x9e37_79b9) | 1;
    let max_read = 1 + usize::from(*seed) * 64;
    let mut tail: Vec<u8> = Vec::new();
    let mut partial = None;
    let mut got_reads = Vec::new();
    let mut violation = None;
    let mut from = 0;
    loop {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        let to = (from + 1 + rng as usize % max_read).min(stream.len());
        tail.extend_from_slice(&stream[from..to]);
        from = to;
        match decode_once(role, &mut tail, &mut partial, limits, &mut got_reads) {
            Ok(used) => {
                assert!(used <= tail.len());
                tail.drain(..used);
            }
            Err(v) => {
                violation = Some(v);
                break;
            }
        }
        if matches!(got_reads.last(), Some(Got::Close(..))) {
            break;
        }
        assert!(
            tail.len() < limits.max_tail(),
            "kept a tail of {} bytes",
            tail.len()
        );
        if let Some(p) = &partial {
            assert!(p.held() <= limits.binary.max(limits.text));
        }
        if from == stream.len() {
            break;
        }
    }
    assert_eq!(got_reads, got_whole, "reads and whole stream disagree");
    assert_eq!(violation, result.err(), "reads and whole stream disagree");
    if let (Ok(used), false) = (result, closed) {
        assert_eq!(tail, stream[used..], "different tails");
    }

    // Every message survives the peer's encoder and our decoder.
    let peer = match role {
        Role::Server => Role::Client,
        Role::Client => Role::Server,
    };
    for m in got_whole {
        let mut out = Vec::new();
        match &m {
            Got::Binary(b) => encode(peer, Opcode::Binary, b, &mut out),
            Got::Text(t) => encode(peer, Opcode::Text, t.as_bytes(), &mut out),
            Got::Ping(b) => encode(peer, Opcode::Ping, b, &mut out),
            Got::Pong(b) => encode(peer, Opcode::Pong, b, &mut out),
            Got::Close(Some(code), reason) => close_frame(peer, *code, reason, &mut out),
            Got::Close(None, _) => encode(peer, Opcode::Close, &[], &mut out),
        }
        let len = out.len();
        let mut again = Vec::new();
        let used = decode_once(role, &mut out, &mut None, limits, &mut again);
        assert_eq!(used, Ok(len), "{m:?} re-encoded");
        assert_eq!(again, [m]);
    }
});
