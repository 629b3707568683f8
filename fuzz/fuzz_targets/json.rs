//! The JSON form: `json::from_json`, fed what a WebSocket text message can carry (valid
//! UTF-8 of at most `MAX_JSON_LEN` bytes; anything else is skipped, the WebSocket layer
//! refuses it first).
//!
//! Properties:
//! - `from_json` never makes one allocation over `MAX_JSON_LEN`, the size of the text
//!   message it reads;
//! - a frame it reads writes back (`to_json`) to JSON of at most `MAX_JSON_LEN` bytes
//!   that reads back to an equal frame, and `to_json` is stable from then on;
//! - the binary codec's limits hold: the same frame encodes (`frame::encode`) to bytes
//!   `check` delimits exactly and `decode` turns back into an equal frame;
//! - an error's result code is `unknown-type` exactly for an unknown `"type"`, and names
//!   it quotes from the input are clipped to 40 bytes.
#![no_main]

use hongbao_fuzz::limited;
use hongbao_proto::frame::{check, decode, encode_to_vec};
use hongbao_proto::json::{from_json, to_json, JsonErrorKind, MAX_JSON_LEN};
use hongbao_proto::message::ResultCode;
use libfuzzer_sys::fuzz_target;

/// The largest single allocation `from_json` may make: the text message it reads is at
/// most `MAX_JSON_LEN` bytes.
const DECODE_LIMIT: usize = MAX_JSON_LEN;

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_JSON_LEN {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match limited(DECODE_LIMIT, || from_json(text)) {
        Ok(frame) => {
            let json = to_json(&frame);
            assert!(json.len() <= MAX_JSON_LEN, "JSON of {} bytes", json.len());
            let again = from_json(&json);
            assert_eq!(again.as_ref(), Ok(&frame), "{json}");
            assert_eq!(to_json(&frame), json);

            let bytes = encode_to_vec(&frame);
            assert_eq!(check(&bytes), Ok(Some(bytes.len())), "{frame:?}");
            assert_eq!(decode(&bytes).as_ref(), Ok(&frame));
        }
        Err(e) => {
            let unknown_type = matches!(e.kind, JsonErrorKind::UnknownType(_));
            assert_eq!(e.result_code() == ResultCode::UnknownType, unknown_type);
            match &e.kind {
                JsonErrorKind::UnknownType(name)
                | JsonErrorKind::UnknownResult(name)
                | JsonErrorKind::UnknownKickReason(name) => {
                    assert!(name.len() <= 40, "quoted name of {} bytes", name.len());
                    assert!(text.contains(name.as_str()) || name.is_empty() || text.contains('\\'));
                }
                _ => {}
            }
            assert!(!e.to_string().is_empty());
        }
    }
});
