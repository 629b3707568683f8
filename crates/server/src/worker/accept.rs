//! Taking connections in: accepting what the listeners hold (the transport each
//! connection starts with, the cap on connections), and counting the connections not yet
//! logged in, in all and per source address, so that sockets that never log in cannot
//! fill the worker.

use std::io::ErrorKind;
use std::net::IpAddr;

use hongbao_sys::net;
use mio::{Interest, Token};

use super::codec::Codec;
use super::conn::Conn;
use super::http::HttpCodec;
use super::Worker;

impl Worker {
    /// Takes in what listener `i` holds, until it would block (nothing while accepts are
    /// paused after a failure).
    pub(super) fn accept(&mut self, i: usize) {
        if self.accept_paused {
            return;
        }
        loop {
            let listener = &mut self.listeners[i];
            match listener.socket.accept() {
                Ok((mut stream, peer)) => {
                    self.stats.counters.accepted += 1;
                    if self.conns.len() >= self.cfg.max_connections as usize {
                        self.stats.counters.rejected += 1;
                        continue; // dropped: closes at once
                    }
                    let http = self.listeners[i].http;
                    if !http && !self.may_hold_unauthenticated(peer.ip()) {
                        self.stats.counters.rejected_unauthenticated += 1;
                        continue; // dropped: closes at once
                    }
                    let listener = &mut self.listeners[i];
                    let _ = stream.set_nodelay(true);
                    if listener.stamp_backlog {
                        let _ = net::enable_receive_timestamps(&stream);
                    }
                    let now = self.started.elapsed().as_secs() as u32;
                    let codec = if listener.http {
                        Codec::Http(Box::new(HttpCodec::new(now)))
                    } else {
                        Codec::Frames
                    };
                    let entry = self.conns.vacant_entry();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(entry.key()), interest)
                        .is_err()
                    {
                        continue;
                    }
                    let generation = self.next_generation;
                    self.next_generation = self.next_generation.wrapping_add(1).max(1);
                    let key = entry.key();
                    entry.insert(Conn::new(stream, generation, now, codec));
                    self.watched.insert(key);
                    if !http {
                        self.hold_unauthenticated(key, peer.ip());
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // Everything accepted from now on was born with the listener's option.
                    listener.stamp_backlog = false;
                    return;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of files (or similar): stop accepting until the next tick rather
                    // than spin; the backlog waits in the kernel.
                    eprintln!(
                        "worker {}: accept: {e}; pausing accepts for a second",
                        self.index
                    );
                    self.accept_paused = true;
                    return;
                }
            }
        }
    }

    // ----- connections not yet logged in -------------------------------------------------

    /// Whether one more connection not yet logged in, from `source`, is within limits.
    fn may_hold_unauthenticated(&self, source: IpAddr) -> bool {
        self.unauthenticated.len() < self.cfg.max_unauthenticated as usize
            && self.per_source.get(&source).copied().unwrap_or(0)
                < self.cfg.max_unauthenticated_per_source
    }

    /// Whether HTTP connection `key` may upgrade to a WebSocket not yet logged in (its
    /// source address is looked up only when some source holds any).
    pub(super) fn may_upgrade(&self, key: usize) -> bool {
        if self.unauthenticated.len() >= self.cfg.max_unauthenticated as usize {
            return false;
        }
        self.per_source.is_empty()
            || (self.conns[key].stream.peer_addr())
                .is_ok_and(|peer| self.may_hold_unauthenticated(peer.ip()))
    }

    pub(super) fn hold_unauthenticated(&mut self, key: usize, source: IpAddr) {
        if self.unauthenticated.insert(key, source).is_none() {
            *self.per_source.entry(source).or_default() += 1;
        }
    }

    /// `key` logged in or closed: no longer counted as not logged in.
    pub(super) fn authenticated(&mut self, key: usize) {
        let Some(source) = self.unauthenticated.remove(&key) else {
            return;
        };
        if let Some(n) = self.per_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&source);
            }
        }
    }
}
