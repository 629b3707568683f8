//! What the worker does to connections: write (queueing what the kernel will not take),
//! flush, kick, hang up, close — and the half-close and drain of a connection whose
//! peer is done.

use std::net::Shutdown;

use hongbao_money::{ConnId, Push};
use hongbao_proto::KickReason;
use hongbao_sys::net;

use super::conn::{conn_id, Phase};
use super::event_loop::Worker;
use super::tls;
use crate::link::ToSupervisor;

impl Worker {
    pub(super) fn is_open(&self, key: usize) -> bool {
        self.conns.get(key).is_some_and(|c| c.state.is_open())
    }

    /// The connection `id` names, if it is still the one it named and still takes
    /// answers (open, or draining after the peer's half-close).
    pub(super) fn key_of(&self, id: ConnId) -> Option<usize> {
        let key = id.key as usize;
        self.conns
            .get(key)
            .is_some_and(|c| c.generation == id.generation && c.state.phase != Phase::Closing)
            .then_some(key)
    }

    /// The peer will send no more (a read returned 0). A connection still owed answers,
    /// or with output queued, drains first: a client that half-closes gets a reply to
    /// everything it sent, then the server closes.
    pub(super) fn peer_done(&mut self, key: usize) {
        let now = self.now().secs();
        match self.conns.get_mut(key) {
            Some(c) if c.state.is_open() && (c.state.awaiting > 0 || c.has_output()) => {
                c.state.phase = Phase::Draining;
                c.last_seen = now;
                if let Some(b) = c.buffers.as_mut() {
                    b.partial = Vec::new();
                }
                self.visit_soon(key);
            }
            _ => self.close(key),
        }
    }

    /// Closes a draining connection once nothing more is owed to it.
    pub(super) fn finish_draining(&mut self, key: usize) {
        if self.conns.get(key).is_some_and(|c| {
            c.state.phase == Phase::Draining && c.state.awaiting == 0 && !c.has_output()
        }) {
            self.close(key);
        }
    }

    /// Writes `bytes` to connection `key`: sealed first over TLS (`tls.rs`), then as
    /// `write_raw` writes. While `key` is corked (its read is being answered), only adds
    /// to what `uncork` writes.
    pub(super) fn write(&mut self, key: usize, bytes: &[u8]) {
        if self.output.hold(key, bytes) {
            return;
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Some(session) = conn.tls.as_mut() {
            let mut sealed = Vec::with_capacity(bytes.len() + 64);
            tls::seal(session, bytes, &mut sealed);
            return self.write_raw(key, &sealed);
        }
        self.write_raw(key, bytes);
    }

    /// Writes at once when nothing is queued; queues what the kernel will not take;
    /// closes a connection whose queue grows past the limit (a client that does not read).
    pub(super) fn write_raw(&mut self, key: usize, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let mut written = 0;
        if !conn.has_output() {
            self.stats.counters.writes += 1;
            match net::write_nonblocking(&mut conn.stream, bytes) {
                Ok(n) => written = n,
                Err(_) => return self.close(key),
            }
        }
        self.stats.counters.bytes_out += written as u64;
        if written < bytes.len() {
            let buffers = conn.buffers.get_or_insert_with(Box::default);
            buffers.out.extend_from_slice(&bytes[written..]);
            if buffers.out.len() > self.cfg.max_output_bytes as usize {
                self.stats.counters.kicks_slow_reader += 1;
                self.close(key);
            }
        }
    }

    /// Writes what was held for the corked connection, in one write, and holds no more.
    pub(super) fn uncork(&mut self) {
        let Some((key, bytes)) = self.output.uncork() else {
            return;
        };
        if !bytes.is_empty() {
            self.write(key, &bytes);
        }
        self.output.give_corked(bytes);
    }

    pub(super) fn flush_conn(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Some(buffers) = conn.buffers.as_mut().filter(|b| !b.out.is_empty()) else {
            return;
        };
        self.stats.counters.writes += 1;
        let Ok(written) = net::write_nonblocking(&mut conn.stream, &buffers.out) else {
            return self.close(key);
        };
        self.stats.counters.bytes_out += written as u64;
        buffers.out.drain(..written);
        if buffers.out.is_empty() {
            buffers.out = Vec::new();
            conn.drop_empty_buffers();
            match conn.state.phase {
                Phase::Closing => {
                    let _ = conn.stream.shutdown(Shutdown::Write);
                }
                Phase::Draining => self.finish_draining(key),
                Phase::Open => {}
            }
        }
    }

    /// Tells the client why, then closes once it has read that (or after a grace period).
    pub(super) fn kick(&mut self, key: usize, reason: KickReason, text: &str) {
        self.kick_after(key, reason, text, 0);
    }

    /// `kick`, telling the client to come back after about `retry_after_ms` (0: the
    /// reason says whether to come back, the client's back-off when).
    pub(super) fn kick_after(
        &mut self,
        key: usize,
        reason: KickReason,
        text: &str,
        retry_after_ms: u32,
    ) {
        let push = Push::Kick {
            reason,
            text: text.to_string(),
            retry_after_ms,
        };
        self.push(key, &push);
        self.leave(key);
        self.goodbye(key, reason);
    }

    /// After a kick's push: the transport's goodbye, then closing.
    pub(super) fn goodbye(&mut self, key: usize, reason: KickReason) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let mut bytes = Vec::new();
        conn.codec.close(reason, &mut bytes);
        if !bytes.is_empty() {
            self.write(key, &bytes);
        }
        self.closing(key);
    }

    /// Closes once what is queued is written (the codec wrote its own goodbye).
    pub(super) fn hang_up(&mut self, key: usize) {
        self.leave(key);
        self.closing(key);
    }

    fn closing(&mut self, key: usize) {
        // What it was answered goes out before the goodbye.
        if self.output.is_corked(key) {
            self.uncork();
        }
        let now = self.now().secs();
        let Some(conn) = self.conns.get_mut(key) else {
            return; // the write before this closed it
        };
        conn.state.phase = Phase::Closing;
        conn.last_seen = now;
        // Over TLS, its goodbye (close_notify) is the last it is sent.
        if let Some(session) = conn.tls.as_mut() {
            let mut bye = Vec::new();
            tls::close(session, &mut bye);
            self.write_raw(key, &bye);
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return; // the write closed it
        };
        if let Some(b) = conn.buffers.as_mut() {
            b.partial = Vec::new();
        }
        conn.drop_empty_buffers();
        if !conn.has_output() {
            let _ = conn.stream.shutdown(Shutdown::Write);
        }
        self.visit_soon(key);
    }

    /// The connection's user goes offline (its socket may linger in `Closing`).
    pub(super) fn leave(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Some(user) = conn.state.user.take() {
            let conn = conn_id(key, conn.generation);
            self.stats.levels.logged_in -= 1;
            self.tell_supervisor(&ToSupervisor::Offline { conn, user });
        }
    }

    pub(super) fn close(&mut self, key: usize) {
        if !self.conns.contains(key) {
            return;
        }
        self.output.drop_cork(key);
        self.leave(key);
        self.authenticated(key);
        self.handshake_over(key, false);
        self.ready.remove(key);
        let mut conn = self.conns.remove(key);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.stats.counters.closed += 1;
    }
}
