//! The WebSocket opening handshake (RFC 6455 §4), both sides: the gateway's `accept` of
//! a client's HTTP upgrade request, and the load client's request and its check of the
//! answer. HTTP heads are read with `httparse`.

use data_encoding::BASE64;
use tungstenite::handshake::derive_accept_key;

/// Longest HTTP request or response head we read during a handshake. Browsers send well
/// under 2 KiB; a peer still not done after this many bytes is refused.
pub const MAX_HANDSHAKE_LEN: usize = 8192;

/// Headers we make room for when parsing a handshake (on the stack). More is refused.
pub(super) const MAX_HEADERS: usize = 64;

// ---------------------------------------------------------------------------------------
// Server handshake
// ---------------------------------------------------------------------------------------

/// What [`accept`] made of the bytes a new connection sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    /// The request head is not complete yet: read more and call again. Never returned
    /// once [`MAX_HANDSHAKE_LEN`] bytes are in; that is a [`Handshake::Reject`].
    Partial,
    /// A valid upgrade. Write `response` (101 Switching Protocols); the first `consumed`
    /// bytes were the request, anything after them is already WebSocket frames.
    Upgrade { consumed: usize, response: Vec<u8> },
    /// A complete HTTP request that does not ask for a WebSocket (no `Upgrade:
    /// websocket`). The gateway may answer it itself, e.g. serve a page at `GET /`.
    /// `consumed` covers the head only; a body, if any, follows it.
    NotWebSocket {
        consumed: usize,
        method: String,
        path: String,
    },
    /// A bad upgrade or a malformed request. Write `response` (400, 426 or 431 with a
    /// short text body and `Connection: close`) and close. `reason` is for logs.
    Reject {
        response: Vec<u8>,
        reason: &'static str,
    },
}

/// Reads a client's opening handshake (RFC 6455 §4.2.1).
///
/// A request asks for a WebSocket when an `Upgrade` header names `websocket`; anything
/// else that parses is [`Handshake::NotWebSocket`]. An upgrade must be `GET` over
/// HTTP/1.1, with `Connection` naming `Upgrade`, `Sec-WebSocket-Version: 13` (else 426
/// with `Sec-WebSocket-Version: 13`), and a `Sec-WebSocket-Key` that is the base64 of 16
/// bytes. Any path upgrades. No subprotocol and no extension is ever agreed, so frames
/// never carry compressed data.
pub fn accept(request: &[u8]) -> Handshake {
    let head = &request[..request.len().min(MAX_HANDSHAKE_LEN)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let consumed = match req.parse(head) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if request.len() < MAX_HANDSHAKE_LEN => {
            return Handshake::Partial
        }
        Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
            return reject(
                431,
                "Request Header Fields Too Large",
                "request head too large",
            )
        }
        Err(_) => return reject(400, "Bad Request", "malformed HTTP request"),
    };
    let method = req.method.unwrap_or_default();
    let headers = &*req.headers;
    if !has_token(headers, "upgrade", "websocket") {
        return Handshake::NotWebSocket {
            consumed,
            method: method.to_owned(),
            path: req.path.unwrap_or_default().to_owned(),
        };
    }
    if method != "GET" {
        return bad_request("a WebSocket upgrade must be a GET");
    }
    if req.version != Some(1) {
        return bad_request("a WebSocket upgrade needs HTTP/1.1");
    }
    if !has_token(headers, "connection", "upgrade") {
        return bad_request("the Connection header does not name Upgrade");
    }
    match single(headers, "sec-websocket-version") {
        Ok(Some(v)) if v.trim_ascii() == b"13" => {}
        _ => return reject_version(),
    }
    let key = match single(headers, "sec-websocket-key") {
        Ok(Some(key)) => key.trim_ascii(),
        Ok(None) => return bad_request("no Sec-WebSocket-Key"),
        Err(()) => return bad_request("more than one Sec-WebSocket-Key"),
    };
    if !BASE64.decode(key).is_ok_and(|raw| raw.len() == 16) {
        return bad_request("Sec-WebSocket-Key is not the base64 of 16 bytes");
    }
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\n\
         Upgrade: websocket\r\n\
         Connection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        derive_accept_key(key)
    );
    Handshake::Upgrade {
        consumed,
        response: response.into_bytes(),
    }
}

/// A complete HTTP/1.1 response with `Connection: close`, for the gateway's answers to
/// [`Handshake::NotWebSocket`] requests and for our own rejections. `status` is the
/// status line's tail, e.g. `"404 Not Found"`.
pub fn http_response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    http_response_with(status, "", content_type, body)
}

fn http_response_with(status: &str, extra: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\n{extra}Content-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn reject(code: u16, phrase: &str, reason: &'static str) -> Handshake {
    let body = format!("{reason}\n");
    Handshake::Reject {
        response: http_response(
            &format!("{code} {phrase}"),
            "text/plain; charset=utf-8",
            body.as_bytes(),
        ),
        reason,
    }
}

fn bad_request(reason: &'static str) -> Handshake {
    reject(400, "Bad Request", reason)
}

fn reject_version() -> Handshake {
    let reason = "only Sec-WebSocket-Version 13 is supported";
    Handshake::Reject {
        response: http_response_with(
            "426 Upgrade Required",
            "Sec-WebSocket-Version: 13\r\n",
            "text/plain; charset=utf-8",
            format!("{reason}\n").as_bytes(),
        ),
        reason,
    }
}

/// Whether any `name` header's comma-separated value list holds `token` (both
/// case-insensitive), as `Connection: keep-alive, Upgrade` does for `upgrade`.
fn has_token(headers: &[httparse::Header<'_>], name: &str, token: &str) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// The value of the only `name` header; `Err` when there are several.
fn single<'h>(headers: &[httparse::Header<'h>], name: &str) -> Result<Option<&'h [u8]>, ()> {
    let mut found = headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name));
    match (found.next(), found.next()) {
        (None, _) => Ok(None),
        (Some(h), None) => Ok(Some(h.value)),
        (Some(_), Some(_)) => Err(()),
    }
}

// ---------------------------------------------------------------------------------------
// Client handshake
// ---------------------------------------------------------------------------------------

/// Why a server's answer to [`client_request`] is not a WebSocket upgrade.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake response head over {MAX_HANDSHAKE_LEN} bytes")]
    TooLong,
    #[error("malformed handshake response: {0}")]
    Malformed(String),
    #[error("handshake answered with HTTP status {code}, not 101")]
    Status { code: u16 },
    #[error("handshake response lacks Upgrade: websocket or Connection: Upgrade")]
    NotUpgraded,
    #[error("handshake response has a wrong or missing Sec-WebSocket-Accept")]
    BadAccept,
}

/// The opening handshake a client sends, with `key` as its nonce (16 random bytes).
pub fn client_request(host: &str, path: &str, key: &[u8; 16]) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\n\
         Host: {host}\r\n\
         Upgrade: websocket\r\n\
         Connection: Upgrade\r\n\
         Sec-WebSocket-Key: {}\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n",
        BASE64.encode(key)
    )
    .into_bytes()
}

/// Checks the server's answer to [`client_request`] sent with `key`.
///
/// `Ok(None)`: the head is not complete, read more. `Ok(Some(n))`: the first `n` bytes
/// were a valid 101 response; frames may follow them in the same read.
pub fn check_response(response: &[u8], key: &[u8; 16]) -> Result<Option<usize>, HandshakeError> {
    let head = &response[..response.len().min(MAX_HANDSHAKE_LEN)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let consumed = match res.parse(head) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if response.len() < MAX_HANDSHAKE_LEN => return Ok(None),
        Ok(httparse::Status::Partial) => return Err(HandshakeError::TooLong),
        Err(e) => return Err(HandshakeError::Malformed(e.to_string())),
    };
    let code = res.code.unwrap_or_default();
    if code != 101 {
        return Err(HandshakeError::Status { code });
    }
    let headers = &*res.headers;
    if !has_token(headers, "upgrade", "websocket") || !has_token(headers, "connection", "upgrade") {
        return Err(HandshakeError::NotUpgraded);
    }
    let expected = derive_accept_key(BASE64.encode(key).as_bytes());
    match single(headers, "sec-websocket-accept") {
        Ok(Some(accept)) if accept.trim_ascii() == expected.as_bytes() => Ok(Some(consumed)),
        _ => Err(HandshakeError::BadAccept),
    }
}
