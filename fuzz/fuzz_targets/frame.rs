//! Binary frames: `frame::check`, `frame::decode`, `frame::decode_message`.
//!
//! Properties, for any bytes:
//! - `check` never allocates, and agrees with `decode`: an error from `check` is fatal
//!   and is exactly what `decode` of the same bytes returns; `Ok(None)` means `decode`
//!   says incomplete; `Ok(Some(n))` means `10 <= n <= buf.len()`, `n` is the length
//!   prefix plus 4 and at most `4 + MAX_FRAME_LEN`, and `decode` of more bytes than `n`
//!   says trailing bytes;
//! - `decode` of the `n` bytes `check` delimited never allocates more than
//!   `MAX_FRAME_LEN` at once, and either gives a frame whose re-encoding (`frame::encode`)
//!   is the very same bytes (decoding is strict, so the encoding is canonical; a frame of
//!   an older version re-encodes as the current one, where a version-1 login's raw token
//!   is refused) and whose
//!   JSON form fits `MAX_JSON_LEN` and reads back to the same frame, or a non-fatal error
//!   naming the frame's request id;
//! - a buffer holding several frames is cut the way a connection cuts it, with the same
//!   properties for every frame;
//! - `decode_message(kind, payload)` knows exactly the 17 message types, and what it
//!   decodes re-encodes to the same payload.
#![no_main]

use hongbao_fuzz::limited;
use hongbao_proto::frame::PayloadError;
use hongbao_proto::frame::{check, decode, decode_message, encode_to_vec, request_id_of};
use hongbao_proto::json::{from_json, to_json, MAX_JSON_LEN};
use hongbao_proto::message::{
    kind, valid_token_bytes, Frame, Message, HEADER_LEN, MAX_FRAME_LEN, VERSION,
};
use hongbao_proto::FrameError;
use libfuzzer_sys::fuzz_target;

/// The largest single allocation `decode` may make: a frame's body is at most
/// `MAX_FRAME_LEN` bytes and no field is bigger than the body.
const DECODE_LIMIT: usize = MAX_FRAME_LEN;

fuzz_target!(|data: &[u8]| {
    // `check` reads the header only: no allocation at all.
    let checked = limited(0, || check(data));
    let whole = limited(DECODE_LIMIT, || decode(data));
    let mut at = 0;
    match &checked {
        Err(e) => {
            assert!(e.is_fatal(), "check gave a recoverable error: {e:?}");
            assert_eq!(e.request_id(), None);
            assert_eq!(e.result_code(), None);
            assert_eq!(whole.as_ref(), Err(e), "decode disagrees with check");
        }
        Ok(None) => {
            assert!(
                matches!(whole, Err(FrameError::Incomplete { have, need }) if have == data.len() && need > have),
                "check says incomplete, decode says {whole:?}"
            );
        }
        Ok(Some(n)) => {
            let n = *n;
            assert!(
                n <= data.len(),
                "check: frame of {n} in {} bytes",
                data.len()
            );
            assert!(
                (HEADER_LEN..=4 + MAX_FRAME_LEN).contains(&n),
                "frame of {n}"
            );
            let prefix = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
            assert_eq!(n, 4 + prefix);
            if n < data.len() {
                assert_eq!(
                    whole,
                    Err(FrameError::TrailingBytes {
                        extra: data.len() - n
                    })
                );
            }
            if n < data.len() {
                one_frame(&data[..n], limited(DECODE_LIMIT, || decode(&data[..n])));
            } else {
                one_frame(data, whole);
            }
            at = n;
        }
    }

    // The way a connection reads: frame after frame from the front of its buffer.
    while let Ok(Some(n)) = limited(0, || check(&data[at..])) {
        let bytes = &data[at..at + n];
        one_frame(bytes, limited(DECODE_LIMIT, || decode(bytes)));
        at += n;
    }

    // A payload on its own, the first byte as its type.
    if let Some((&k, payload)) = data.split_first() {
        match limited(DECODE_LIMIT, || decode_message(k, payload)) {
            Ok(Some(message)) => {
                assert!(kind::ALL.contains(&k), "decoded unknown kind 0x{k:02x}");
                assert_eq!(message.kind(), k);
                let bytes = encode_to_vec(&Frame {
                    request_id: 0,
                    message,
                });
                assert_eq!(&bytes[HEADER_LEN..], payload, "payload does not re-encode");
            }
            Ok(None) => assert!(!kind::ALL.contains(&k), "kind 0x{k:02x} unknown"),
            Err(why) => {
                assert!(
                    kind::ALL.contains(&k),
                    "payload error for unknown kind: {why}"
                );
                assert!(!why.name().is_empty());
            }
        }
    }
});

/// `bytes` is exactly one frame as `check` delimited it, `decoded` what `decode` (under
/// the allocation limit) made of it.
fn one_frame(bytes: &[u8], decoded: Result<Frame, FrameError>) {
    match decoded {
        Ok(frame) => {
            assert_eq!(frame.request_id, request_id_of(bytes));
            assert_eq!(frame.message.kind(), bytes[5]);
            let again = encode_to_vec(&frame);
            if bytes[4] == VERSION {
                assert_eq!(again, bytes, "{frame:?} re-encodes differently");
            } else {
                // An older version reads as the current one; what this side writes is
                // always the current version: the same bytes but for the version byte
                // (and a login's token length, one byte wide before version 2).
                assert_eq!(again[4], VERSION);
                if frame.message.kind() != kind::LOGIN {
                    assert_eq!(again[5..], bytes[5..], "{frame:?} re-encodes differently");
                }
            }
            let raw_token =
                matches!(&frame.message, Message::Login { token, .. } if !valid_token_bytes(token));
            if raw_token {
                // A version-1 login's raw token (the old HMAC) is not a version-2 token.
                assert_eq!(
                    bytes[4], 1,
                    "a version-2 token that is not ASCII: {frame:?}"
                );
                assert!(
                    matches!(
                        decode(&again),
                        Err(FrameError::BadPayload {
                            why: PayloadError::TokenNotAscii,
                            ..
                        })
                    ),
                    "{frame:?}"
                );
            } else {
                assert_eq!(decode(&again).as_ref(), Ok(&frame));
            }
            // The JSON form of any frame the binary codec takes: fits what the gateway
            // reads from a WebSocket text message, and reads back the same; but a
            // version-1 login's raw token, not printable ASCII, has none: refused.
            let json = to_json(&frame);
            assert!(json.len() <= MAX_JSON_LEN, "JSON of {} bytes", json.len());
            if raw_token {
                assert!(from_json(&json).is_err(), "{json}");
            } else {
                assert_eq!(from_json(&json).as_ref(), Ok(&frame), "{json}");
            }
        }
        Err(e) => {
            // Well delimited: recoverable, answered with an error naming the request.
            assert!(!e.is_fatal(), "fatal error in a checked frame: {e:?}");
            assert_eq!(e.request_id(), Some(request_id_of(bytes)));
            assert!(e.result_code().is_some());
            assert!(!e.to_string().is_empty());
        }
    }
}
