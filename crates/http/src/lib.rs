//! The one HTTP server stack of hongbao's side doors: the admin API, the monitor, the
//! load's control endpoint. hyper serves HTTP/1.1 (keep-alive, pipelining, a header
//! timeout) on a thread of its own, and each request's handler runs on a blocking-pool
//! thread, so a handler that waits (the admin API waits for the ledger) never holds up the
//! other connections — the pool that left 26 of 30 keep-alive requests unanswered is gone.
//! The request parser underneath is `httparse`, the same the gateway workers use.
//!
//! Handlers are plain functions from a `Request` to a `Response`; `json_object` reads a
//! body that must be a JSON object. `access` holds the checks every door makes before
//! its handler: keys, and the browser checks. With a TLS config (`tls.rs`), a server
//! speaks only TLS: a client that does not is refused in its handshake, and the refusal
//! goes to the server's `on_refused` for the record.

pub mod access;
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;

/// A client this slow to send its request head is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `stop` lets requests under way finish.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// A body over the limit is still read (and dropped) up to this many bytes, for up to
/// `DRAIN_TIME`, before the 413 and the close: a client that sends its whole body before
/// reading (no `Expect: 100-continue`) then reads the 413 instead of a reset, as nginx's
/// lingering close allows. Past either bound the connection is closed as it is.
const DRAIN_MAX: usize = 16 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// One request, its body read whole (up to the server's limit).
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Who sent it (the TCP peer).
    pub peer: SocketAddr,
}

impl Request {
    /// The first header of that name (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path's segments, without empty ones (so `/v1/audit/` is `["v1", "audit"]`).
    pub fn segments(&self) -> Vec<&str> {
        self.path.split('/').filter(|s| !s.is_empty()).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// A refusal's reason, named for counting (`origin`, `no-key`, `role`, ...); never
    /// sent. `None` for everything else.
    pub refusal: Option<&'static str>,
}

impl Response {
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type: content_type.to_string(),
            headers: Vec::new(),
            body: body.into(),
            refusal: None,
        }
    }

    /// Pretty-printed JSON.
    pub fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> Response {
        let body = serde_json::to_vec_pretty(value).expect("responses serialize");
        Response::new(status, "application/json", body)
    }

    /// `{"error": message}`.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(status, &serde_json::json!({ "error": message.into() }))
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// Names why this answer refuses (for the door's counters).
    pub fn refusing(mut self, reason: &'static str) -> Response {
        self.refusal = Some(reason);
        self
    }
}

/// The body as a `T` that must come from a JSON object: anything else (an array, a
/// number, bad JSON, fields of the wrong type) is a 400 that says why.
pub fn json_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, Response> {
    let text = std::str::from_utf8(body)
        .map_err(|_| Response::error(400, "reading the body: it is not UTF-8"))?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Response::error(400, format!("bad JSON: {e}")))?;
    if !value.is_object() {
        return Err(Response::error(
            400,
            "bad JSON: the body must be a JSON object",
        ));
    }
    serde_json::from_value(value).map_err(|e| Response::error(400, format!("bad JSON: {e}")))
}

type Handler = dyn Fn(Request) -> Response + Send + Sync;

/// What a TLS server does with a client refused in its handshake (a plain client, a
/// stranger to its certificate): its address and why.
pub type OnRefused = dyn Fn(SocketAddr, String) + Send + Sync;

/// A server's TLS: the config new connections take, and who hears of refusals.
#[derive(Clone)]
pub struct ServeTls {
    pub config: tls::Reloadable,
    pub on_refused: Arc<OnRefused>,
}

/// A running server; stopped when dropped.
pub struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` and serves every request with `handler`. Bodies over `max_body`
    /// bytes are answered 413 before the handler sees them.
    pub fn start(
        addr: &str,
        name: &str,
        max_body: usize,
        handler: impl Fn(Request) -> Response + Send + Sync + 'static,
    ) -> std::io::Result<Server> {
        Server::serve(std::net::TcpListener::bind(addr)?, name, max_body, handler)
    }

    /// As `start`, on a listener already bound (a handler that needs the address it was
    /// bound to is made after the bind).
    pub fn serve(
        listener: std::net::TcpListener,
        name: &str,
        max_body: usize,
        handler: impl Fn(Request) -> Response + Send + Sync + 'static,
    ) -> std::io::Result<Server> {
        Server::serve_tls(listener, name, max_body, None, handler)
    }

    /// As `serve`, speaking TLS only when `tls` is given.
    pub fn serve_tls(
        listener: std::net::TcpListener,
        name: &str,
        max_body: usize,
        tls: Option<ServeTls>,
        handler: impl Fn(Request) -> Response + Send + Sync + 'static,
    ) -> std::io::Result<Server> {
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let handler: Arc<Handler> = Arc::new(handler);
        let (stop, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(format!("{name}-handler"))
            .build()?;
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                runtime.block_on(serve(listener, handler, max_body, tls, stopped));
                runtime.shutdown_timeout(STOP_GRACE);
            })?;
        Ok(Server {
            addr: bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests under way finish (briefly), and returns.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut_down();
    }
}

async fn serve(
    listener: std::net::TcpListener,
    handler: Arc<Handler>,
    max_body: usize,
    tls: Option<ServeTls>,
    mut stopped: oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (stream, peer),
                // Out of files and the like: wait a moment rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stopped => return,
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let Some(tls) = tls else {
                return serve_connection(stream, handler, peer, max_body).await;
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.get());
            match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, handler, peer, max_body).await,
                Ok(Err(e)) => (tls.on_refused)(peer, format!("TLS handshake failed: {e}")),
                Err(_) => (tls.on_refused)(peer, "TLS handshake not done in time".into()),
            }
        });
    }
}

/// HTTP/1.1 on one connection (plain or TLS) until it closes.
async fn serve_connection<S>(stream: S, handler: Arc<Handler>, peer: SocketAddr, max_body: usize)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(respond(&handler, request, peer, max_body).await) }
    });
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn respond(
    handler: &Arc<Handler>,
    request: hyper::Request<Incoming>,
    peer: SocketAddr,
    max_body: usize,
) -> hyper::Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let response = match read_body(body, max_body).await {
        Err(BodyError::TooLong) => {
            let mut r = Response::error(413, format!("body over {max_body} bytes"));
            r.headers.push(("connection", "close".into()));
            r
        }
        Err(BodyError::Read(e)) => Response::error(400, format!("reading the body: {e}")),
        Ok(body) => {
            let request = Request {
                method: parts.method.as_str().to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or("").to_string(),
                headers: parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                    .collect(),
                body,
                peer,
            };
            let handler = handler.clone();
            tokio::task::spawn_blocking(move || handler(request))
                .await
                .unwrap_or_else(|_| Response::error(500, "the handler failed"))
        }
    };
    let mut out = hyper::Response::new(Full::new(Bytes::from(response.body)));
    *out.status_mut() = hyper::StatusCode::from_u16(response.status)
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = out.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&response.content_type) {
        headers.insert(CONTENT_TYPE, v);
    }
    for (name, value) in response.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    out
}

enum BodyError {
    TooLong,
    Read(hyper::Error),
}

/// The whole body, if it is at most `max_body` bytes. A longer one is read on and
/// dropped (`DRAIN_MAX`, `DRAIN_TIME`) so that its 413 is read by its client.
async fn read_body(mut body: Incoming, max_body: usize) -> Result<Bytes, BodyError> {
    let mut kept = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if kept.len() + data.len() > max_body {
            let mut drained = kept.len() + data.len();
            let _ = tokio::time::timeout(DRAIN_TIME, async {
                while drained <= DRAIN_MAX {
                    match body.frame().await {
                        Some(Ok(frame)) => {
                            drained += frame.data_ref().map_or(0, |d| d.len());
                        }
                        _ => break,
                    }
                }
            })
            .await;
            return Err(BodyError::TooLong);
        }
        kept.extend_from_slice(&data);
    }
    Ok(Bytes::from(kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn echo_server() -> Server {
        Server::start("127.0.0.1:0", "test-http", 64, |r: Request| {
            if r.path == "/slow" {
                std::thread::sleep(Duration::from_millis(300));
            }
            Response::json(
                200,
                &serde_json::json!({"path": r.path, "query": r.query, "len": r.body.len()}),
            )
        })
        .unwrap()
    }

    #[test]
    fn bodies_over_the_limit_are_413_and_queries_are_split_off() {
        let server = echo_server();
        let url = format!("http://{}/a/b?x=1", server.addr());
        let ok: serde_json::Value = ureq::post(&url)
            .send_string("hi")
            .unwrap()
            .into_json()
            .unwrap();
        assert_eq!(
            (
                ok["path"].as_str(),
                ok["query"].as_str(),
                ok["len"].as_u64()
            ),
            (Some("/a/b"), Some("x=1"), Some(2))
        );
        match ureq::post(&url).send_string(&"x".repeat(65)) {
            Err(ureq::Error::Status(413, r)) => {
                assert!(r.into_string().unwrap().contains("body over 64 bytes"))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A client that writes a body far over the limit before it reads anything (no
    /// `Expect: 100-continue`, as Python's urllib) reads the 413, not a reset.
    #[test]
    fn a_whole_body_over_the_limit_is_read_before_its_413() {
        let server = echo_server();
        let mut s = std::net::TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = vec![b'x'; 5 << 20];
        let head = format!(
            "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&body).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("body over 64 bytes"), "{answer}");
    }

    /// Thirty keep-alive connections asking at once are all answered, though each
    /// handler takes a while: handlers do not queue behind one another.
    #[test]
    fn concurrent_keep_alive_requests_are_all_answered() {
        let server = echo_server();
        let answered = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..30)
            .map(|_| {
                let (addr, answered) = (server.addr(), answered.clone());
                std::thread::spawn(move || {
                    let mut s = std::net::TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    for _ in 0..2 {
                        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                            .unwrap();
                        let mut buf = [0u8; 512];
                        let n = s.read(&mut buf).unwrap();
                        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(answered.load(Ordering::SeqCst), 60);
    }

    #[test]
    fn only_json_objects_are_bodies() {
        #[derive(serde::Deserialize, Debug)]
        struct Q {
            #[allow(dead_code)]
            qps: u64,
        }
        assert!(json_object::<Q>(br#"{"qps": 5}"#).is_ok());
        for bad in [
            &b"[1,1,1,1]"[..],
            b"5",
            b"\"s\"",
            b"{",
            b"{\"qps\": -1}",
            b"\xff",
        ] {
            let e = json_object::<Q>(bad).unwrap_err();
            assert_eq!(e.status, 400, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
