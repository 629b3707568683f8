//! Taking connections in: accepting what the listeners hold (the transport each
//! connection starts with, the cap on connections), and counting the connections not yet
//! logged in, in all and per source address, so that sockets that never log in cannot
//! fill the worker.
//!
//! Admission at the machine's pace: a TLS handshake, or a connection not yet logged in,
//! is work the worker has started. At `max_tls_handshakes` handshakes under way (or
//! `max_unauthenticated` connections not logged in) the worker stops accepting, and what
//! is past the bound waits in the kernel's accept queue — where a full queue drops SYNs
//! and TCP's own retries are the back-off — until a handshake ends; then it accepts again
//! (`resume_held`). Never accept-and-close, never accept-and-time-out: a connection taken
//! in is one the worker has time for. A client that gave up while it waited in the queue
//! is seen closed at its first event and let go before any handshake work
//! (`tls_abandoned`).

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::IpAddr;

use hongbao_sys::net;
use mio::net::TcpListener;
use mio::{Interest, Token};

use super::codec::Codec;
use super::conn::{conn_id, Conn};
use super::http::HttpCodec;
use super::Worker;

/// A listening socket and what its connections speak first.
pub(super) struct Listener {
    pub socket: TcpListener,
    /// Binary frames, or HTTP (then perhaps WebSocket).
    http: bool,
    /// Connections whose handshake finished before the listener had receive timestamps
    /// on (a client may connect between our listen() and the supervisor's Welcome) did
    /// not inherit them: turn them on one by one until the first drain of the accept
    /// queue.
    stamp_backlog: bool,
}

impl Listener {
    pub(super) fn new(socket: TcpListener, http: bool) -> Listener {
        Listener {
            socket,
            http,
            stamp_backlog: false,
        }
    }

    /// Turns receive timestamps on, for this listener's connections to come and, one by
    /// one, for those already in its backlog.
    pub(super) fn stamp(&mut self) -> std::io::Result<()> {
        net::enable_receive_timestamps(&self.socket)?;
        self.stamp_backlog = true;
        Ok(())
    }
}

/// The worker's listeners, and the connections not yet logged in that it holds.
pub(super) struct Listeners {
    sockets: Vec<Listener>,
    /// Accepting failed (out of files): nothing is accepted until the next tick.
    paused: bool,
    /// The listeners were left with connections waiting, at a bound: accepted from
    /// again once below it (`resume_held`).
    held: bool,
    /// TLS handshakes under way.
    handshaking: u32,
    /// Connections not yet logged in (binary frames, upgraded WebSockets), by slab key,
    /// with their source address; and how many each source has.
    unauthenticated: HashMap<usize, IpAddr>,
    per_source: HashMap<IpAddr, u32>,
}

impl Listeners {
    pub(super) fn new(sockets: Vec<Listener>) -> Listeners {
        Listeners {
            sockets,
            paused: false,
            held: false,
            handshaking: 0,
            unauthenticated: HashMap::new(),
            per_source: HashMap::new(),
        }
    }

    pub(super) fn count(&self) -> usize {
        self.sockets.len()
    }

    /// Accepting resumes (the tick after a pause): whether it had been paused.
    pub(super) fn resume(&mut self) -> bool {
        std::mem::take(&mut self.paused)
    }

    /// Whether one more connection not yet logged in, from `source`, is within limits of
    /// `most` in all and `most_per_source` from one source.
    fn may_hold(&self, source: IpAddr, most: u32, most_per_source: u32) -> bool {
        self.unauthenticated.len() < most as usize
            && self.per_source.get(&source).copied().unwrap_or(0) < most_per_source
    }

    fn hold(&mut self, key: usize, source: IpAddr) {
        if self.unauthenticated.insert(key, source).is_none() {
            *self.per_source.entry(source).or_default() += 1;
        }
    }

    fn release(&mut self, key: usize) {
        let Some(source) = self.unauthenticated.remove(&key) else {
            return;
        };
        if let Some(n) = self.per_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&source);
            }
        }
        // A storm's thousands not logged in at once, all logged in: their tables' room
        // is let go (a map never shrinks by itself, and a million idle sessions would pay
        // for the storm's peak for good).
        if self.unauthenticated.is_empty() && self.unauthenticated.capacity() > 1024 {
            self.unauthenticated.shrink_to_fit();
            self.per_source.shrink_to_fit();
        }
    }
}

impl Worker {
    /// Whether the worker is at a bound of the work it admits: as many TLS handshakes
    /// under way as it may hold, or (on a binary-frame listener) as many connections not
    /// yet logged in.
    fn at_bound(&self, http: bool) -> bool {
        (self.tls.is_some() && self.listeners.handshaking >= self.cfg.max_tls_handshakes)
            || (!http
                && self.listeners.unauthenticated.len() >= self.cfg.max_unauthenticated as usize)
    }

    /// Takes in what listener `i` holds, until it would block or a bound is reached
    /// (nothing while accepts are paused after a failure).
    pub(super) fn accept(&mut self, i: usize) {
        if self.listeners.paused {
            return;
        }
        loop {
            if self.at_bound(self.listeners.sockets[i].http) {
                // Left in the kernel's queue: accepted once a handshake or login ends.
                if !self.listeners.held {
                    self.listeners.held = true;
                    self.stats.counters.accept_paused += 1;
                }
                return;
            }
            let listener = &mut self.listeners.sockets[i];
            match listener.socket.accept() {
                Ok((mut stream, peer)) => {
                    self.stats.counters.accepted += 1;
                    if self.conns.len() >= self.cfg.max_connections as usize {
                        self.stats.counters.rejected += 1;
                        continue; // dropped: closes at once
                    }
                    let http = self.listeners.sockets[i].http;
                    // A trusted proxy's connection is counted as its client's once its
                    // PROXY header names it (`proxy_read`): here only in all.
                    let proxied = !http && self.cfg.trusted_proxies.contains(&peer.ip());
                    // In all the bound holds it (`at_bound`); one source over its own
                    // share is closed: it must not hold the listener for everyone.
                    let allowed = proxied || http || self.may_hold_source(peer.ip());
                    if !allowed {
                        self.stats.counters.rejected_unauthenticated += 1;
                        continue; // dropped: closes at once
                    }
                    let listener = &mut self.listeners.sockets[i];
                    let _ = stream.set_nodelay(true);
                    if listener.stamp_backlog {
                        let _ = net::enable_receive_timestamps(&stream);
                    }
                    let now = self.time.polled.secs();
                    let codec = if listener.http {
                        Codec::Http(Box::new(HttpCodec::new(now)))
                    } else {
                        Codec::Frames
                    };
                    let tls = self.tls.as_ref().map(|t| t.session(http));
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
                    let handshaking = tls.is_some();
                    let mut conn = Conn::new(stream, generation, now, codec);
                    conn.tls = tls;
                    conn.proxied = proxied;
                    entry.insert(conn);
                    let first = match handshaking {
                        true => {
                            self.listeners.handshaking += 1;
                            now.after(self.cfg.tls_handshake_timeout_secs)
                        }
                        false => self.first_visit(http, now),
                    };
                    self.timers.file(first, conn_id(key, generation));
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
                    tracing::warn!(error = %e, "accept failed; pausing accepts for a second");
                    self.listeners.paused = true;
                    return;
                }
            }
        }
    }

    /// Accepts what every listener holds (after a pause).
    pub(super) fn accept_all(&mut self) {
        for i in 0..self.listeners.count() {
            self.accept(i);
        }
    }

    /// Listeners left at a bound are accepted from again once the worker is below it:
    /// edge-triggered epoll says nothing of connections already queued.
    pub(super) fn resume_held(&mut self) {
        if !self.listeners.held || self.at_bound(true) {
            return;
        }
        self.listeners.held = false;
        self.accept_all();
        // Held again at once (the frames listener at `max_unauthenticated`, say): still
        // the same pause, not a new one.
        if self.listeners.held {
            self.stats.counters.accept_paused -= 1;
        }
    }

    /// TLS handshakes under way.
    pub(super) fn handshaking(&self) -> u32 {
        self.listeners.handshaking
    }

    /// Connection `key`'s handshake is no longer under way: done (`done`: counted full or
    /// resumed, and the login deadline counts from now), or its connection closing.
    pub(super) fn handshake_over(&mut self, key: usize, done: bool) {
        let Some(session) = self.conns.get_mut(key).and_then(|c| c.tls.as_mut()) else {
            return;
        };
        if !session.admitted() {
            return;
        }
        self.listeners.handshaking -= 1;
        if !done {
            return;
        }
        match session.resumed() {
            true => self.stats.counters.tls_resumed += 1,
            false => self.stats.counters.tls_handshakes += 1,
        }
        let now = self.time.read.secs();
        let conn = &mut self.conns[key];
        conn.last_seen = now;
        if let super::codec::Codec::Http(http) = &mut conn.codec {
            http.handshake_done(now);
        }
        let http = matches!(conn.codec, super::codec::Codec::Http(_));
        let id = conn_id(key, conn.generation);
        let first = self.first_visit(http, now);
        self.timers.file(first, id);
    }

    /// Whether connection `key`'s TLS handshake is under way.
    pub(super) fn is_handshaking(&self, key: usize) -> bool {
        self.conns
            .get(key)
            .and_then(|c| c.tls.as_ref())
            .is_some_and(|s| s.admitting())
    }

    // ----- connections not yet logged in -------------------------------------------------

    /// Whether one more connection not yet logged in, from `source`, is within limits.
    fn may_hold_unauthenticated(&self, source: IpAddr) -> bool {
        self.listeners.may_hold(
            source,
            self.cfg.max_unauthenticated,
            self.cfg.max_unauthenticated_per_source,
        )
    }

    /// Whether one more connection not yet logged in may come from `source` (the limit
    /// per source only; the total was looked at when it connected or upgraded).
    pub(super) fn may_hold_source(&self, source: IpAddr) -> bool {
        self.listeners.per_source.get(&source).copied().unwrap_or(0)
            < self.cfg.max_unauthenticated_per_source
    }

    /// Whether connection `key` comes from a trusted proxy (which names its client).
    pub(super) fn is_from_trusted_proxy(&self, key: usize) -> bool {
        !self.cfg.trusted_proxies.is_empty()
            && (self.conns[key].stream.peer_addr())
                .is_ok_and(|p| self.cfg.trusted_proxies.contains(&p.ip()))
    }

    /// A trusted proxy's connection named its client (PROXY header): counted as the
    /// client's from now on; false when the client is over its limit.
    pub(super) fn proxied_client(&mut self, key: usize, client: Option<IpAddr>) -> bool {
        let Some(client) = client else {
            return true; // `PROXY UNKNOWN`: the proxy's own (a health check)
        };
        // Counted under the proxy's address until now: that count is let go first.
        self.listeners.release(key);
        if !self.may_hold_source(client) {
            return false;
        }
        self.listeners.hold(key, client);
        true
    }

    /// Whether HTTP connection `key` may upgrade to a WebSocket not yet logged in (its
    /// source address is looked up only when some source holds any; a trusted proxy's
    /// client is looked at once the upgrade names it).
    pub(super) fn may_upgrade(&self, key: usize) -> bool {
        if self.listeners.unauthenticated.len() >= self.cfg.max_unauthenticated as usize {
            return false;
        }
        if self.is_from_trusted_proxy(key) {
            return true;
        }
        self.listeners.per_source.is_empty()
            || (self.conns[key].stream.peer_addr())
                .is_ok_and(|peer| self.may_hold_unauthenticated(peer.ip()))
    }

    pub(super) fn hold_unauthenticated(&mut self, key: usize, source: IpAddr) {
        self.listeners.hold(key, source);
    }

    /// `key` logged in or closed: no longer counted as not logged in.
    pub(super) fn authenticated(&mut self, key: usize) {
        self.listeners.release(key);
    }
}
