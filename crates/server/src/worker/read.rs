//! The read path, a step at a time: the connections to read and their order (`ready`
//! gives them), then for each read the socket, a trusted proxy's PROXY header, TLS
//! (`tls.rs`), and the codec (`codec.rs`, `http.rs`) with what the last read left of a
//! cut request; each request it decodes goes to its handler (`handler.rs`).

use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;

use hongbao_sys::clock::Uptime;
use hongbao_sys::net;

use super::codec::Codec;
use super::conn::Phase;
use super::tls::{self, Opened};
use super::wire::{Cx, Then};
use super::{ready, Worker};
use crate::error::Result;

/// Reads one connection may do per readiness event before others get a turn.
pub(super) const READS_PER_TURN: usize = 4;

/// What one read of a socket came to.
enum Got {
    /// Bytes to go through the steps.
    Bytes(usize),
    /// Nothing to use from this read (interrupted, or a closing connection's): read on.
    Again,
    /// Nothing more to read now: the socket is empty, or the connection is done with.
    Stop,
}

/// What the codec reads of a read.
enum Plain {
    /// The bytes as read.
    AsRead,
    /// What TLS decrypted them to.
    Decrypted(Vec<u8>),
}

impl Worker {
    /// Reads the connections `ready` gives, in its order, as many as `ready::read_batch`
    /// says: a batch in the adaptive order (four while a broadcast is being written: the
    /// shakes first, a slice of the broadcast after), so that what epoll reports meanwhile
    /// is seen between batches; all of them in FIFO order. The whole batch goes by the
    /// poll's clock (`polled`): one clock read a turn, not one a read — at a million
    /// connections most turns read one connection.
    pub(super) fn read_ready(&mut self, buf: &mut [u8]) -> Result<()> {
        let batch = ready::read_batch(self.cfg.ready_order, self.broadcasts.under_way());
        let now = self.time.polled;
        for _ in 0..batch {
            let Some(key) = self.ready.pop(now) else {
                return Ok(());
            };
            self.read_then_ask(key, buf, false, now)?;
        }
        Ok(())
    }

    /// Reads a connection (`on_readable`); what that read asked of the supervisor — a claim, a
    /// send, a login — goes up the link at once, not at the end of the turn: a won shake
    /// waits for the ledger's next commit, and a turn of reads is long enough (~1 ms, more
    /// on a busy machine) to miss one. A read that asked nothing writes nothing, even while
    /// the link holds a backlog the supervisor has not taken (the turn's end retries that).
    pub(super) fn read_then_ask(
        &mut self,
        key: usize,
        buf: &mut [u8],
        drain: bool,
        now: Uptime,
    ) -> Result<()> {
        let queued = self.link.queued();
        self.on_readable(key, buf, drain, now);
        if self.link.queued() > queued {
            self.flush_link()?;
        }
        Ok(())
    }

    /// Reads what a connection sent, at most `READS_PER_TURN` buffers a turn, each
    /// through the steps: the socket (`read_socket`), a trusted proxy's PROXY header
    /// (`proxy_header`), TLS (`decrypt`), the codec (`decode_read`). A short read
    /// emptied the socket and ends it (epoll, edge-triggered, says when more arrives:
    /// reading on only to hear "would block" would cost a system call per request) —
    /// unless `drain`: the event said the peer closed or the socket failed, or the
    /// connection is back from `again`; then it reads on to "would block". `now`: the
    /// clock (since `started`) read just before, for everything the reads need.
    pub(super) fn on_readable(&mut self, key: usize, buf: &mut [u8], drain: bool, now: Uptime) {
        self.time.read = now;
        for _ in 0..READS_PER_TURN {
            let n = match self.read_socket(key, buf, now) {
                Got::Bytes(n) => n,
                Got::Again => continue,
                Got::Stop => return,
            };
            let Some(start) = self.proxy_header(key, &buf[..n]) else {
                return;
            };
            let Some(plain) = self.decrypt(key, &mut buf[start..n]) else {
                return;
            };
            self.decode_read(key, &mut buf[start..n], plain);
            if n < buf.len() && !drain {
                return;
            }
        }
        self.again.push(key);
    }

    /// One read of connection `key`'s socket into `buf`.
    fn read_socket(&mut self, key: usize, buf: &mut [u8], now: Uptime) -> Got {
        let Some(conn) = self
            .conns
            .get_mut(key)
            .filter(|c| c.state.phase != Phase::Draining)
        else {
            return Got::Stop; // the peer sent all it will; only answers go out
        };
        let read = if self.cfg.stamps() {
            net::read_stamped(conn.stream.as_raw_fd(), buf)
        } else {
            conn.stream.read(buf).map(|n| (n, None))
        };
        let n = match read {
            Ok((0, _)) => {
                self.peer_done(key);
                return Got::Stop;
            }
            Ok((n, received)) => {
                self.time.received = received;
                n
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Got::Stop,
            Err(e) if e.kind() == ErrorKind::Interrupted => return Got::Again,
            Err(_) => {
                self.close(key);
                return Got::Stop;
            }
        };
        self.stats.counters.bytes_in += n as u64;
        if conn.state.phase == Phase::Closing {
            return Got::Again; // discard until the peer closes
        }
        // Before a session's login the clock runs from the connect (or the WebSocket
        // upgrade): what the client sends meanwhile does not buy it time.
        if conn.state.user.is_some() || matches!(conn.codec, Codec::Http(_)) {
            conn.last_seen = now.secs();
        }
        Got::Bytes(n)
    }

    /// From a trusted proxy, its PROXY header first, naming the client (nginx writes it
    /// whole before anything of the client's): where the client's bytes start in `read`,
    /// or none when the connection was closed for it.
    fn proxy_header(&mut self, key: usize, read: &[u8]) -> Option<usize> {
        let conn = &mut self.conns[key];
        if !conn.state.proxy_header {
            return Some(0);
        }
        conn.state.proxy_header = false;
        match net::proxy_header(read) {
            Ok(Some((client, len))) => {
                if !self.proxied_client(key, client) {
                    self.stats.counters.rejected_unauthenticated += 1;
                    self.close(key);
                    return None;
                }
                Some(len)
            }
            _ => {
                self.stats.counters.bad_frames += 1;
                self.close(key);
                None
            }
        }
    }

    /// Over TLS, what the codec reads is what the bytes read decrypt to; none when the
    /// connection is done with (refused, the peer said goodbye, or writing the
    /// handshake's answer found the peer gone and closed it).
    fn decrypt(&mut self, key: usize, read: &mut [u8]) -> Option<Plain> {
        let plain = match self.conns[key].tls.is_some() {
            true => Plain::Decrypted(self.tls_read(key, read)?),
            false => Plain::AsRead,
        };
        self.conns.contains(key).then_some(plain)
    }

    /// Decodes what this read brought (`read` itself, or what it decrypted to), after
    /// what the last read left of a request it cut (`partial`), and keeps what is left
    /// of a request this read cut.
    fn decode_read(&mut self, key: usize, read: &mut [u8], plain: Plain) {
        let mut partial = self.conns[key].take_partial();
        // The answers to what this read brought go out in one write: after a wait
        // a read brings many requests, and a write each cost the most of each.
        self.output.cork(key);
        let rest = match plain {
            Plain::Decrypted(mut plain) => {
                if partial.is_empty() {
                    // Read where it was decrypted; what is left of it is kept.
                    let used = self.input(key, &mut plain);
                    let rest = plain[used..].to_vec();
                    self.output.give_plain(plain);
                    rest
                } else {
                    partial.extend_from_slice(&plain);
                    self.output.give_plain(plain);
                    let used = self.input(key, &mut partial);
                    partial.drain(..used);
                    partial
                }
            }
            Plain::AsRead if partial.is_empty() => {
                let used = self.input(key, read);
                read[used..].to_vec()
            }
            Plain::AsRead => {
                partial.extend_from_slice(read);
                let used = self.input(key, &mut partial);
                partial.drain(..used);
                partial
            }
        };
        self.uncork();
        if let Some(conn) = self.conns.get_mut(key).filter(|c| c.state.is_open()) {
            conn.keep_partial(rest);
        }
    }

    /// Reads `cipher` (bytes read from TLS connection `key`) through its session: the
    /// plaintext, or none when the connection is done with — refused (not TLS, a bad
    /// record: counted, sent rustls's alert and closed) or said goodbye (close_notify).
    /// Writing what the session answers may find the peer gone and close the connection
    /// too: the caller looks before it goes on.
    fn tls_read(&mut self, key: usize, cipher: &mut [u8]) -> Option<Vec<u8>> {
        let session = self.conns.get_mut(key)?.tls.as_mut()?;
        let handshaking = session.is_handshaking();
        let (mut plain, mut out) = (self.output.take_plain(), Vec::new());
        let opened = tls::open(session, cipher, &mut plain, &mut out);
        if handshaking && !session.is_handshaking() && opened.is_ok() {
            self.handshake_over(key, true);
        }
        if !out.is_empty() {
            self.write_raw(key, &out);
        }
        match opened {
            Ok(Opened::Data) => Some(plain),
            Ok(Opened::PeerClosed) if !plain.is_empty() => Some(plain),
            Ok(Opened::PeerClosed) => {
                if self.is_handshaking(key) {
                    self.stats.counters.tls_abandoned += 1;
                }
                self.peer_done(key);
                None
            }
            Err(e) => {
                if handshaking {
                    self.stats.counters.tls_refused += 1;
                    tracing::debug!(error = %e, "a TLS handshake refused");
                } else {
                    self.stats.counters.bad_frames += 1;
                }
                self.close(key);
                None
            }
        }
    }

    /// The one read path: decodes what a connection sent a request at a time, writes what
    /// the transport answers by itself, and dispatches each request. Returns how many
    /// bytes it used (the rest is an incomplete request, kept for the next read).
    fn input(&mut self, key: usize, data: &mut [u8]) -> usize {
        let mut at = 0;
        while at < data.len() && self.is_open(key) {
            let http = matches!(self.conns[key].codec, Codec::Http(_));
            let may_upgrade = http && self.may_upgrade(key);
            let trusted_peer = http && self.is_from_trusted_proxy(key);
            let mut out = self.output.take_scratch();
            let mut cx = Cx {
                out: &mut out,
                stats: &mut self.stats.counters,
                cfg: &self.cfg,
                sessions: &self.sessions,
                now: self.time.read.secs(),
                may_upgrade,
                trusted_peer,
                client: None,
            };
            let step = self.conns[key].codec.decode(&mut data[at..], &mut cx);
            let client = cx.client;
            at += step.used;
            if http && matches!(self.conns[key].codec, Codec::WebSocket(_)) {
                // Upgraded: a session, to log in from now, counted as its client's.
                let peer = self.conns[key].stream.peer_addr().map(|p| p.ip());
                if let Some(source) = client.or(peer.ok()) {
                    if client.is_some() && !self.may_hold_source(source) {
                        self.stats.counters.rejected_unauthenticated += 1;
                        self.output.give_scratch(out);
                        self.close(key);
                        return data.len();
                    }
                    self.hold_unauthenticated(key, source);
                }
            }
            if !out.is_empty() {
                self.write(key, &out);
            }
            self.output.give_scratch(out);
            match step.then {
                Then::Read => {}
                Then::Kick(reason, text) => {
                    self.kick(key, reason, &text);
                    return data.len();
                }
                Then::HangUp => {
                    self.hang_up(key);
                    return data.len();
                }
            }
            match step.inbound {
                Some(inbound) => self.dispatch(key, inbound),
                None if step.used == 0 => break,
                None => {}
            }
        }
        if self.is_open(key) {
            at
        } else {
            data.len()
        }
    }
}
