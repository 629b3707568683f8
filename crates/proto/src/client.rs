//! A small blocking client over `std::net::TcpStream`, for tests and tools.
//!
//! It speaks frames through `frame.rs` and keeps one queue of frames that arrived but
//! were not asked for yet: [`Client::request`] skips over pushes (and stray replies) while
//! it waits for its own reply, and [`Client::next_push`] skips over replies while it waits
//! for a push; whatever was skipped is queued, in arrival order, and handed out later by
//! `recv`, `request` or `next_push`. Nothing received is dropped. The queue is unbounded,
//! which is fine for a test client whose peer is the server under test.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::frame::{check, decode, encode};
use crate::message::{Frame, Message, ResultCode};

/// What a client reads and writes: the TCP stream, or TLS over it.
trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

/// The app's callback for a fresh login token: called with the session's expiry (ms
/// since the Unix epoch) when the server asks for one; `None` lets the session lapse.
pub type Refresher = Box<dyn FnMut(u64) -> Option<String> + Send>;

pub struct Client {
    /// The socket (for timeouts and shutdown)...
    stream: TcpStream,
    /// ...and what the frames go through: the socket itself, or a TLS session over it.
    io: Box<dyn Io>,
    /// Bytes read from the socket that do not make a whole frame yet.
    inbuf: Vec<u8>,
    /// Frames received but not yet returned to the caller, oldest first.
    queued: VecDeque<Frame>,
    next_request_id: u32,
    refresher: Option<Refresher>,
}

impl Client {
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        let io = Box::new(stream.try_clone()?);
        Client::over(stream, io)
    }

    /// Connects over TLS, trusting the CA certificates in `ca_pem` (only them), to a
    /// server whose certificate names `server_name` (a DNS name or an IP address). The
    /// handshake is done before this returns (a failed one is its error).
    pub fn connect_tls(
        addr: impl ToSocketAddrs,
        server_name: &str,
        ca_pem: &[u8],
    ) -> io::Result<Client> {
        let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
        let config = crate::tls::client_config(ca_pem, &[crate::tls::ALPN_FRAMES])
            .map_err(|e| invalid(e.to_string()))?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
            .map_err(|e| invalid(format!("server name {server_name:?}: {e}")))?;
        let stream = TcpStream::connect(addr)?;
        let session = rustls::ClientConnection::new(config, name).map_err(io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(session, stream.try_clone()?);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Client::over(stream, Box::new(tls))
    }

    fn over(stream: TcpStream, io: Box<dyn Io>) -> io::Result<Client> {
        // Requests are small and latency matters more than packing them.
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            io,
            inbuf: Vec::with_capacity(4096),
            queued: VecDeque::new(),
            next_request_id: 1,
            refresher: None,
        })
    }

    /// When the server asks for a fresh token (a `refresh` push), call `refresher` and
    /// log in again with what it returns, on this connection: the session goes on with
    /// nothing lost. The push and the login's reply are still handed out like any other
    /// frames.
    pub fn on_refresh(&mut self, refresher: impl FnMut(u64) -> Option<String> + Send + 'static) {
        self.refresher = Some(Box::new(refresher));
    }

    /// Read and write timeout; a `recv` that times out fails with `WouldBlock` or
    /// `TimedOut` (platform-dependent) and can be retried.
    pub fn set_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        self.stream.set_write_timeout(Some(timeout))
    }

    /// The underlying socket, e.g. to shut down one direction.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends `message` under a fresh request id (1, 2, ...; 0 is skipped on wrap since
    /// it marks pushes) and returns that id.
    pub fn send(&mut self, message: &Message) -> io::Result<u32> {
        let request_id = self.next_request_id;
        self.next_request_id = self.next_request_id.wrapping_add(1).max(1);
        self.send_frame(&Frame {
            request_id,
            message: message.clone(),
        })?;
        Ok(request_id)
    }

    /// Sends a frame as given, request id included.
    pub fn send_frame(&mut self, frame: &Frame) -> io::Result<()> {
        let mut out = Vec::new();
        encode(frame, &mut out);
        self.send_raw(&out)
    }

    /// Sends bytes as given, for tests that feed the server garbage.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes)?;
        self.io.flush()
    }

    /// The next frame received: queued ones first, then from the socket. Fails with
    /// `UnexpectedEof` if the server closed the connection, `InvalidData` if it sent
    /// something that does not decode.
    pub fn recv(&mut self) -> io::Result<Frame> {
        match self.queued.pop_front() {
            Some(frame) => Ok(frame),
            None => self.read_frame(),
        }
    }

    /// Sends `message` and waits for the frame answering it (same request id). Anything
    /// else that arrives meanwhile is queued.
    pub fn request(&mut self, message: &Message) -> io::Result<Frame> {
        let request_id = self.send(message)?;
        self.wait_for(|f| f.request_id == request_id)
    }

    /// The next push (request id 0): a queued one, or the next to arrive. Replies that
    /// arrive meanwhile are queued.
    pub fn next_push(&mut self) -> io::Result<Frame> {
        self.wait_for(|f| f.request_id == 0)
    }

    /// Logs in with `token` (a JWT naming the user) and returns the result (from the
    /// `LoginReply`, or from an `Error` reply).
    pub fn login(&mut self, token: &str) -> io::Result<ResultCode> {
        self.login_as(0, token)
    }

    /// Logs in as `user_id`, which must be the token's `sub` (0: whoever it names).
    pub fn login_as(&mut self, user_id: u64, token: &str) -> io::Result<ResultCode> {
        let token = token.as_bytes().to_vec();
        match self.request(&Message::Login { user_id, token })?.message {
            Message::LoginReply { result, .. } | Message::Error { result, .. } => Ok(result),
            other => Err(unexpected(other)),
        }
    }

    /// Shake once; the reply is a `ShakeReply` or an `Error`.
    pub fn shake(&mut self) -> io::Result<Message> {
        Ok(self.request(&Message::Shake)?.message)
    }

    /// Send a packet; the reply is a `SendReply` or an `Error`.
    pub fn send_packet(
        &mut self,
        amount_cents: u64,
        shares: u32,
        recipients: &[u64],
    ) -> io::Result<Message> {
        self.send_idempotent(amount_cents, shares, recipients, None)
    }

    /// Send a packet under an idempotency key: a retry with the same key gets the first
    /// answer and moves no money twice.
    pub fn send_idempotent(
        &mut self,
        amount_cents: u64,
        shares: u32,
        recipients: &[u64],
        idempotency_key: Option<&str>,
    ) -> io::Result<Message> {
        let message = Message::Send {
            amount_cents,
            shares,
            recipients: recipients.to_vec(),
            idempotency_key: idempotency_key.map(str::to_string),
        };
        Ok(self.request(&message)?.message)
    }

    /// Open my share of a packet; the reply is an `OpenReply` or an `Error`.
    pub fn open(&mut self, packet_id: u64) -> io::Result<Message> {
        Ok(self.request(&Message::Open { packet_id })?.message)
    }

    /// Chat to another user; the reply is a `ChatReply` or an `Error`.
    pub fn chat(&mut self, to_user: u64, text: &str) -> io::Result<Message> {
        let message = Message::Chat {
            to_user,
            text: text.to_owned(),
        };
        Ok(self.request(&message)?.message)
    }

    /// The first frame, queued or new, that `wanted` accepts; the others stay queued.
    fn wait_for(&mut self, wanted: impl Fn(&Frame) -> bool) -> io::Result<Frame> {
        if let Some(at) = self.queued.iter().position(&wanted) {
            return Ok(self.queued.remove(at).expect("position is in range"));
        }
        loop {
            let frame = self.read_frame()?;
            if wanted(&frame) {
                return Ok(frame);
            }
            self.queued.push_back(frame);
        }
    }

    /// Reads from the socket until one whole frame is buffered, and decodes it.
    fn read_frame(&mut self) -> io::Result<Frame> {
        let mut chunk = [0u8; 4096];
        loop {
            match check(&self.inbuf) {
                Ok(Some(n)) => {
                    let decoded = decode(&self.inbuf[..n]);
                    // Drop the frame's bytes even if it did not decode: its end is known,
                    // so the next `recv` starts at the next frame.
                    self.inbuf.drain(..n);
                    let frame =
                        decoded.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    if let Message::Refresh { expires_at_ms } = frame.message {
                        self.refresh(expires_at_ms)?;
                    }
                    return Ok(frame);
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            let n = self.io.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "server closed the connection ({} bytes of a frame buffered)",
                        self.inbuf.len()
                    ),
                ));
            }
            self.inbuf.extend_from_slice(&chunk[..n]);
        }
    }
}

impl Client {
    /// Answers a `refresh` push with the app's fresh token, if it gives one.
    fn refresh(&mut self, expires_at_ms: u64) -> io::Result<()> {
        let Some(token) = self.refresher.as_mut().and_then(|f| f(expires_at_ms)) else {
            return Ok(());
        };
        let login = Message::Login {
            user_id: 0,
            token: token.into_bytes(),
        };
        self.send(&login).map(|_| ())
    }
}

fn unexpected(message: Message) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected reply {message:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_to_vec;
    use crate::message::KickReason;
    use std::net::TcpListener;
    use std::thread;

    /// A one-connection fake server: reads `expect` frames, then writes `reply` bytes
    /// in small pieces (to exercise buffering) and closes.
    fn fake_server(
        expect: usize,
        reply: Vec<u8>,
    ) -> (std::net::SocketAddr, thread::JoinHandle<Vec<Frame>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            let mut got = Vec::new();
            let mut chunk = [0u8; 1024];
            while got.len() < expect {
                while let Some(n) = check(&buf).unwrap() {
                    got.push(decode(&buf[..n]).unwrap());
                    buf.drain(..n);
                }
                if got.len() >= expect {
                    break;
                }
                let n = sock.read(&mut chunk).unwrap();
                assert!(n > 0, "client closed early");
                buf.extend_from_slice(&chunk[..n]);
            }
            for piece in reply.chunks(3) {
                sock.write_all(piece).unwrap();
                sock.flush().unwrap();
            }
            got
        });
        (addr, handle)
    }

    fn push(message: Message) -> Frame {
        Frame {
            request_id: 0,
            message,
        }
    }

    #[test]
    fn request_queues_pushes_and_recv_returns_them() {
        let notice = push(Message::PacketNotice {
            packet_id: 1,
            from_user: 2,
            amount_cents: 3,
            shares: 4,
            expires_at_ms: 5,
        });
        let kick = push(Message::Kick {
            reason: KickReason::Shutdown,
            text: "bye".into(),
            retry_after_ms: 0,
        });
        let reply = Frame {
            request_id: 1,
            message: Message::ShakeReply {
                result: ResultCode::Nothing,
                packet_id: 0,
                amount_cents: 0,
                retry_after_ms: 0,
            },
        };
        let mut bytes = encode_to_vec(&notice);
        bytes.extend(encode_to_vec(&reply));
        bytes.extend(encode_to_vec(&kick));
        let (addr, server) = fake_server(1, bytes);

        let mut client = Client::connect(addr).unwrap();
        client.set_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(client.shake().unwrap(), reply.message);
        assert_eq!(client.recv().unwrap(), notice);
        assert_eq!(client.next_push().unwrap(), kick);
        let eof = client.recv().unwrap_err();
        assert_eq!(eof.kind(), io::ErrorKind::UnexpectedEof);

        let got = server.join().unwrap();
        assert_eq!(
            got,
            vec![Frame {
                request_id: 1,
                message: Message::Shake
            }]
        );
    }

    #[test]
    fn login_sends_the_token_and_garbage_is_invalid_data() {
        let reply = Frame {
            request_id: 1,
            message: Message::LoginReply {
                result: ResultCode::Ok,
                user_id: 42,
            },
        };
        let mut bytes = encode_to_vec(&reply);
        bytes.extend_from_slice(&[0, 0, 0, 6, 9]); // bad version
        let (addr, server) = fake_server(1, bytes);

        let mut client = Client::connect(addr).unwrap();
        client.set_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(client.login_as(42, "a.b.c").unwrap(), ResultCode::Ok);
        let err = client.recv().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);

        let got = server.join().unwrap();
        let want = Message::Login {
            user_id: 42,
            token: b"a.b.c".to_vec(),
        };
        assert_eq!(got[0].message, want);
    }

    /// A `refresh` push is answered with the app's fresh token on the same connection.
    #[test]
    fn a_refresh_push_logs_in_again_with_the_apps_token() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let refresh = push(Message::Refresh {
                expires_at_ms: 1_800_000_000_000,
            });
            sock.write_all(&encode_to_vec(&refresh)).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            loop {
                if let Some(n) = check(&buf).unwrap() {
                    return decode(&buf[..n]).unwrap();
                }
                let n = sock.read(&mut chunk).unwrap();
                assert!(n > 0, "client closed early");
                buf.extend_from_slice(&chunk[..n]);
            }
        });
        let mut client = Client::connect(addr).unwrap();
        client.set_timeout(Duration::from_secs(5)).unwrap();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = asked.clone();
        client.on_refresh(move |expires| {
            seen.lock().unwrap().push(expires);
            Some("fresh.token.here".into())
        });
        let got = client.next_push().unwrap();
        assert_eq!(
            got.message,
            Message::Refresh {
                expires_at_ms: 1_800_000_000_000
            }
        );
        let login = server.join().unwrap();
        assert_eq!(
            login.message,
            Message::Login {
                user_id: 0,
                token: b"fresh.token.here".to_vec()
            }
        );
        assert_eq!(*asked.lock().unwrap(), [1_800_000_000_000]);
    }
}
