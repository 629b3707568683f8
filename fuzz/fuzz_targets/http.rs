//! HTTP/1.1 requests: `http::parse(buf, max_body)`, the gateway's REST codec.
//!
//! Properties:
//! - without a `chunked` anywhere in the input (so no chunked body), `parse` allocates
//!   nothing at all; with one, no single allocation over twice `MAX_BODY` (see
//!   `DECODE_LIMIT`);
//! - a whole request used at most the bytes given, its body is within `max_body`, its
//!   path has no query; a `Content-Length` body is the last bytes of the request;
//! - it depends on its own bytes alone (the same request for exactly them), one byte
//!   fewer is incomplete, and the body limit is exact: the same request with
//!   `max_body` = its body's length, `BodyTooLarge` with one byte less;
//! - an error is final: more bytes after it give the same error (except a head over the
//!   size limit, which more bytes may also make malformed); its status is one of 400,
//!   413, 431, 501;
//! - pipelined requests are cut one after the other with the same properties.
#![no_main]

use std::borrow::Cow;

use hongbao_fuzz::limited;
use hongbao_proto::http::{parse, HttpError};
use libfuzzer_sys::fuzz_target;

/// The body limit we pass. Smaller than the gateway's 64 KiB so that inputs of a few KiB
/// reach it; the code paths are the same.
const MAX_BODY: usize = 4096;

/// The largest single allocation `parse` may make: a chunked body is gathered into one
/// `Vec` of at most `MAX_BODY` bytes, and a `Vec` growing by doubling may reserve up to
/// twice what it holds; so `MAX_BODY` plus a margin of `MAX_BODY`. Nothing else in
/// `parse` allocates.
const DECODE_LIMIT: usize = 2 * MAX_BODY;

fn has_chunked(data: &[u8]) -> bool {
    data.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"))
}

fuzz_target!(|data: &[u8]| {
    let limit = if has_chunked(data) { DECODE_LIMIT } else { 0 };
    let mut at = 0;
    loop {
        let buf = &data[at..];
        match limited(limit, || parse(buf, MAX_BODY)) {
            Ok(Some(request)) => {
                whole_request(buf, request.len);
                at += request.len;
            }
            Ok(None) => break,
            Err(e) => {
                assert!(
                    matches!(e.status(), 400 | 413 | 431 | 501),
                    "status {}",
                    e.status()
                );
                assert!(!e.message(MAX_BODY).is_empty());
                // (Not for a head or trailer section still open at the size limit: more
                // bytes may end it, or make it malformed; it is over the limit anyway.)
                if e != HttpError::HeadTooLarge {
                    let more = [buf, b"\r\n\r\n0\r\n\r\n".as_slice()].concat();
                    assert_eq!(
                        parse(&more, MAX_BODY),
                        Err(e),
                        "an error undone by more bytes"
                    );
                }
                break;
            }
        }
    }
});

/// `buf` starts with a whole request of `len` bytes.
fn whole_request(buf: &[u8], len: usize) {
    let request = parse(buf, MAX_BODY).unwrap().unwrap();
    assert!(len > 0 && len <= buf.len(), "used {len} of {}", buf.len());
    assert!(
        request.body.len() <= MAX_BODY,
        "body of {}",
        request.body.len()
    );
    assert!(request.body.len() < len);
    assert!(!request.path.contains('?'));
    assert!(!request.method.is_empty());
    if let Cow::Borrowed(body) = request.body {
        assert_eq!(body, &buf[len - body.len()..len]);
    }
    assert_eq!(
        parse(&buf[..len], MAX_BODY).as_ref(),
        Ok(&Some(request.clone())),
        "depends on later bytes"
    );
    assert_eq!(parse(&buf[..len - 1], MAX_BODY), Ok(None), "one byte short");
    let body = request.body.len();
    assert_eq!(parse(buf, body).as_ref(), Ok(&Some(request.clone())));
    if body > 0 {
        assert_eq!(parse(buf, body - 1), Err(HttpError::BodyTooLarge));
    }
}
