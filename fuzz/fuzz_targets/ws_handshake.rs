//! The WebSocket opening handshake: `ws::accept` (the gateway reading a client's upgrade
//! request) and, on the same bytes, `ws::check_response` (the load client reading the
//! server's answer).
//!
//! Properties:
//! - neither makes one allocation over `MAX_HANDSHAKE_LEN`, the most of a head they read;
//! - `Partial` (or `Ok(None)`) only while fewer than `MAX_HANDSHAKE_LEN` bytes are in;
//! - a complete request (`Upgrade` or `NotWebSocket`) used at most the bytes given and
//!   at most `MAX_HANDSHAKE_LEN`; it depends on those bytes alone (the same answer for
//!   exactly them) and one byte fewer is `Partial`;
//! - an `Upgrade` answers `101 Switching Protocols`, and the client's own check of that
//!   answer accepts it for the key the request carried (server and client agree on the
//!   `Sec-WebSocket-Accept`);
//! - a `Reject` is a whole `4xx` response with `Connection: close` whose
//!   `Content-Length` is its body's length.
#![no_main]

use data_encoding::BASE64;
use hongbao_fuzz::limited;
use hongbao_proto::ws::{accept, check_response, Handshake, MAX_HANDSHAKE_LEN};
use libfuzzer_sys::fuzz_target;

/// The largest single allocation a handshake may make: the head it reads is at most
/// `MAX_HANDSHAKE_LEN` bytes; method, path and key are parts of it, the responses are
/// short.
const DECODE_LIMIT: usize = MAX_HANDSHAKE_LEN;

/// A fixed client nonce for `check_response`.
const KEY: [u8; 16] = *b"the sample nonce";

fuzz_target!(|data: &[u8]| {
    let answer = limited(DECODE_LIMIT, || accept(data));
    match &answer {
        Handshake::Partial => {
            assert!(data.len() < MAX_HANDSHAKE_LEN, "Partial at {}", data.len());
        }
        Handshake::Upgrade { consumed, response } => {
            complete_head(data, *consumed, &answer);
            let text = std::str::from_utf8(response).expect("an ASCII response");
            assert!(text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
            assert!(text.ends_with("\r\n\r\n"));
            if let Some(key) = sole_key(&data[..*consumed]) {
                assert_eq!(
                    check_response(response, &key),
                    Ok(Some(response.len())),
                    "the client refuses the server's answer"
                );
            }
        }
        Handshake::NotWebSocket {
            consumed,
            method,
            path,
        } => {
            complete_head(data, *consumed, &answer);
            assert!(!method.is_empty());
            assert!(method.len() + path.len() < *consumed);
        }
        Handshake::Reject { response, reason } => {
            let text = std::str::from_utf8(response).expect("an ASCII response");
            let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
            assert!(
                head.starts_with("HTTP/1.1 4"),
                "{}",
                head.lines().next().unwrap()
            );
            assert!(head.contains("\r\nConnection: close"));
            assert!(head.contains(&format!("\r\nContent-Length: {}", body.len())));
            assert_eq!(body, format!("{reason}\n"));
        }
    }

    match limited(DECODE_LIMIT, || check_response(data, &KEY)) {
        Ok(Some(n)) => assert!(n <= data.len().min(MAX_HANDSHAKE_LEN), "used {n}"),
        Ok(None) => assert!(data.len() < MAX_HANDSHAKE_LEN, "Partial at {}", data.len()),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});

/// The head of a complete request was the first `consumed` bytes.
fn complete_head(data: &[u8], consumed: usize, answer: &Handshake) {
    assert!(consumed > 0);
    assert!(
        consumed <= data.len().min(MAX_HANDSHAKE_LEN),
        "used {consumed}"
    );
    assert_eq!(&accept(&data[..consumed]), answer, "depends on later bytes");
    assert_eq!(accept(&data[..consumed - 1]), Handshake::Partial);
}

/// The 16-byte nonce of the only `Sec-WebSocket-Key` header of `head`, if it is the
/// canonical base64 of 16 bytes (what a client sends). Read independently of `accept`.
fn sole_key(head: &[u8]) -> Option<[u8; 16]> {
    let mut keys = head.split(|&b| b == b'\n').skip(1).filter_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        name.eq_ignore_ascii_case(b"sec-websocket-key")
            .then(|| value.trim_ascii())
    });
    let (Some(text), None) = (keys.next(), keys.next()) else {
        return None;
    };
    let raw = BASE64.decode(text).ok()?;
    let key: [u8; 16] = raw.try_into().ok()?;
    (BASE64.encode(&key).as_bytes() == text).then_some(key)
}
