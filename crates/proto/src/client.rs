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
use crate::token;

pub struct Client {
    stream: TcpStream,
    /// Bytes read from the socket that do not make a whole frame yet.
    inbuf: Vec<u8>,
    /// Frames received but not yet returned to the caller, oldest first.
    queued: VecDeque<Frame>,
    next_request_id: u32,
}

impl Client {
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        // Requests are small and latency matters more than packing them.
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            inbuf: Vec::with_capacity(4096),
            queued: VecDeque::new(),
            next_request_id: 1,
        })
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
        self.stream.write_all(bytes)
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

    /// Logs in with a token minted from `secret` and returns the result (from the
    /// `LoginReply`, or from an `Error` reply).
    pub fn login(&mut self, user_id: u64, secret: &[u8]) -> io::Result<ResultCode> {
        let token = token::token(secret, user_id).to_vec();
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
                    return decoded.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            let n = self.stream.read(&mut chunk)?;
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
        assert_eq!(client.login(42, b"secret").unwrap(), ResultCode::Ok);
        let err = client.recv().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);

        let got = server.join().unwrap();
        let Message::Login { user_id, token } = &got[0].message else {
            panic!("not a login: {got:?}");
        };
        assert_eq!(*user_id, 42);
        assert!(token::verify(b"secret", 42, token));
    }
}
