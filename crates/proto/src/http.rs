//! HTTP/1.1 requests for the gateway's HTTP codec, with no I/O.
//!
//! [`parse`] looks at the bytes a connection has buffered and says whether one whole
//! request is there: its head is read by `httparse` (the parser hyper uses), its body by
//! `Content-Length` or by `Transfer-Encoding: chunked` (chunk sizes read by
//! `httparse::parse_chunk_size`). Nothing is allocated for a request with a length-framed
//! body; a chunked body is gathered into one buffer, bounded by the body limit. What the
//! gateway needs of the headers is picked out once (`Connection`, `Authorization`,
//! `Idempotency-Key`, `Upgrade`); the rest are not kept.
//!
//! Every way a request can be wrong has an [`HttpError`] with its status: a malformed head
//! 400, a head over the limit 431, a body over the limit 413, a transfer coding we do not
//! speak 501, an ambiguous length (both framings, or two different lengths) 400 — each
//! answered once, after which the connection is closed, because the stream can no longer
//! be trusted to be cut into requests.
//!
//! [`response`] writes a response head and body.

use std::borrow::Cow;

/// Largest request head (request line and headers).
pub const MAX_HEAD_LEN: usize = 8192;
/// Most headers in a request head.
pub const MAX_HEADERS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// One whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The path, without the query string.
    pub path: &'a str,
    pub query: &'a str,
    pub version: Version,
    /// Whether the connection stays open after the answer: HTTP/1.1 unless `Connection:
    /// close`, HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// `Upgrade: websocket` was asked for (the WebSocket handshake checks the rest).
    pub websocket: bool,
    pub authorization: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    /// `X-Real-IP`: the client a proxy in front names (believed only from a trusted one).
    pub real_ip: Option<&'a str>,
    pub body: Cow<'a, [u8]>,
    /// Bytes of the buffer the request took, head, body and chunk framing included.
    pub len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpError {
    /// The request line or a header cannot be read.
    Malformed(&'static str),
    /// The head is over [`MAX_HEAD_LEN`] or has more than [`MAX_HEADERS`] headers.
    HeadTooLarge,
    /// The body is over the limit the caller gave.
    BodyTooLarge,
    /// A transfer coding other than `chunked`.
    UnsupportedTransferEncoding,
}

impl HttpError {
    pub fn status(self) -> u16 {
        match self {
            HttpError::Malformed(_) => 400,
            HttpError::HeadTooLarge => 431,
            HttpError::BodyTooLarge => 413,
            HttpError::UnsupportedTransferEncoding => 501,
        }
    }

    pub fn message(self, max_body: usize) -> String {
        match self {
            HttpError::Malformed(why) => format!("malformed request: {why}"),
            HttpError::HeadTooLarge => {
                format!("request head over {MAX_HEAD_LEN} bytes or {MAX_HEADERS} headers")
            }
            HttpError::BodyTooLarge => format!("request body over {max_body} bytes"),
            HttpError::UnsupportedTransferEncoding => {
                "only the chunked transfer coding is understood".into()
            }
        }
    }
}

/// Whether `buf` starts with a whole request: `Ok(None)` means read more.
pub fn parse(buf: &[u8], max_body: usize) -> Result<Option<Request<'_>>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut head = httparse::Request::new(&mut headers);
    let head_len = match head.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD_LEN => n,
        Ok(httparse::Status::Complete(_)) => return Err(HttpError::HeadTooLarge),
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_LEN => {
            return Err(HttpError::HeadTooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadTooLarge),
        Err(e) => return Err(HttpError::Malformed(parse_error(e))),
    };
    let version = match head.version {
        Some(0) => Version::Http10,
        _ => Version::Http11,
    };
    let target = head.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    let mut websocket = false;
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut authorization = None;
    let mut idempotency_key = None;
    let mut real_ip = None;
    for h in head.headers.iter() {
        let name = h.name;
        let text = || std::str::from_utf8(h.value).map(str::trim);
        if name.eq_ignore_ascii_case("connection") {
            let value = text().map_err(|_| HttpError::Malformed("Connection is not text"))?;
            for token in value.split(',').map(str::trim) {
                connection_close |= token.eq_ignore_ascii_case("close");
                connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("upgrade") {
            websocket |= text().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
            });
        } else if name.eq_ignore_ascii_case("content-length") {
            let length = text()
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or(HttpError::Malformed("Content-Length is not a number"))?;
            if content_length.is_some_and(|l| l != length) {
                return Err(HttpError::Malformed("two different Content-Lengths"));
            }
            content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let value =
                text().map_err(|_| HttpError::Malformed("Transfer-Encoding is not text"))?;
            if !value.eq_ignore_ascii_case("chunked") {
                return Err(HttpError::UnsupportedTransferEncoding);
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("authorization") {
            authorization =
                Some(text().map_err(|_| HttpError::Malformed("Authorization is not text"))?);
        } else if name.eq_ignore_ascii_case("idempotency-key") {
            idempotency_key =
                Some(text().map_err(|_| HttpError::Malformed("Idempotency-Key is not text"))?);
        } else if name.eq_ignore_ascii_case("x-real-ip") {
            real_ip = text().ok();
        }
    }
    if chunked && content_length.is_some() {
        // Two framings: the classic request-smuggling ambiguity.
        return Err(HttpError::Malformed(
            "both Transfer-Encoding and Content-Length",
        ));
    }
    let keep_alive = match version {
        Version::Http11 => !connection_close,
        Version::Http10 => connection_keep_alive && !connection_close,
    };
    let (body, len) = if chunked {
        match read_chunks(&buf[head_len..], max_body)? {
            Some((body, used)) => (Cow::Owned(body), head_len + used),
            None => return Ok(None),
        }
    } else {
        let length = content_length.unwrap_or(0);
        if length > max_body {
            return Err(HttpError::BodyTooLarge);
        }
        if buf.len() - head_len < length {
            return Ok(None);
        }
        (
            Cow::Borrowed(&buf[head_len..head_len + length]),
            head_len + length,
        )
    };
    Ok(Some(Request {
        method: head.method.unwrap_or(""),
        path,
        query,
        version,
        keep_alive,
        websocket,
        authorization,
        idempotency_key,
        real_ip,
        body,
        len,
    }))
}

fn parse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "bad header name",
        httparse::Error::HeaderValue => "bad header value",
        httparse::Error::NewLine => "bad line ending",
        httparse::Error::Status => "bad status",
        httparse::Error::Token => "bad token in the request line",
        httparse::Error::Version => "bad HTTP version",
        httparse::Error::TooManyHeaders => "too many headers",
    }
}

/// A chunked body from the front of `buf`: the body and the bytes used, or `None` while
/// incomplete. Trailers are skipped.
fn read_chunks(buf: &[u8], max_body: usize) -> Result<Option<(Vec<u8>, usize)>, HttpError> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let (start, size) = match httparse::parse_chunk_size(&buf[at..]) {
            Ok(httparse::Status::Complete((start, size))) => (start, size),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(HttpError::Malformed("bad chunk size")),
        };
        at += start;
        let size = usize::try_from(size).map_err(|_| HttpError::BodyTooLarge)?;
        if body.len().saturating_add(size) > max_body {
            return Err(HttpError::BodyTooLarge);
        }
        if size == 0 {
            // Optional trailers, then an empty line.
            loop {
                let rest = &buf[at..];
                let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
                    if rest.len() > MAX_HEAD_LEN {
                        return Err(HttpError::HeadTooLarge);
                    }
                    return Ok(None);
                };
                at += end + 2;
                if end == 0 {
                    return Ok(Some((body, at)));
                }
            }
        }
        if buf.len() - at < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size;
        if &buf[at..at + 2] != b"\r\n" {
            return Err(HttpError::Malformed("a chunk does not end in CRLF"));
        }
        at += 2;
    }
}

/// The reason phrase of the statuses the gateway uses.
pub fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Appends a response: status line, `Content-Type` and `Content-Length`, `extra` headers,
/// `Connection: close` when `close`, then the body.
pub fn response(
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    close: bool,
    out: &mut Vec<u8>,
) {
    use std::io::Write;
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n",
        reason(status),
        body.len()
    );
    for (name, value) in extra {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 64;

    fn whole(bytes: &[u8]) -> Request<'_> {
        parse(bytes, MAX).unwrap().expect("a whole request")
    }

    #[test]
    fn heads_bodies_and_what_is_picked_out() {
        let raw = b"POST /v1/packets?x=1 HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer 7.ab\r\nIdempotency-Key: k-1\r\nContent-Length: 5\r\n\r\nhelloGET";
        let r = whole(raw);
        assert_eq!((r.method, r.path, r.query), ("POST", "/v1/packets", "x=1"));
        assert_eq!(r.authorization, Some("Bearer 7.ab"));
        assert_eq!(r.idempotency_key, Some("k-1"));
        assert_eq!(&*r.body, b"hello");
        assert_eq!(r.len, raw.len() - 3);
        assert!(r.keep_alive && !r.websocket);
    }

    #[test]
    fn every_cut_is_partial_until_the_request_is_whole() {
        let raw: &[u8] = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-T: 1\r\n\r\n";
        for cut in 0..raw.len() {
            assert_eq!(parse(&raw[..cut], MAX), Ok(None), "cut at {cut}");
        }
        let r = whole(raw);
        assert_eq!(&*r.body, b"abcde");
        assert_eq!(r.len, raw.len());
    }

    #[test]
    fn keep_alive_by_version_and_connection() {
        let r = |raw: &'static [u8]| whole(raw).keep_alive;
        assert!(r(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!r(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"));
        assert!(!r(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(r(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        assert!(
            whole(b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n").websocket
        );
    }

    #[test]
    fn every_bad_request_has_its_status() {
        let status = |raw: &[u8]| parse(raw, MAX).unwrap_err().status();
        assert_eq!(status(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"), 400);
        assert_eq!(status(b"GET\x01 / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"),
            501
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 65\r\n\r\n"),
            413
        );
        let big_chunks = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n";
        let mut raw = big_chunks.to_vec();
        raw.extend_from_slice(&[b'x'; 64]);
        raw.extend_from_slice(b"\r\n1\r\n");
        assert_eq!(status(&raw), 413);
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_HEAD_LEN));
        assert_eq!(status(&long), 431);
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("H{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(status(&many), 431);
    }

    #[test]
    fn responses_say_their_length_and_whether_they_close() {
        let mut out = Vec::new();
        response(
            429,
            "application/json",
            &[("Retry-After", "1")],
            b"{}",
            true,
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(text.contains("Content-Length: 2\r\n"));
        assert!(text.contains("Retry-After: 1\r\n"));
        assert!(text.ends_with("Connection: close\r\n\r\n{}"));
    }
}
