//! Taking connections in: what the worker does when a listener is readable (accept,
//! under the bounds `listeners.rs` keeps), when a TLS handshake ends, and when a
//! connection logs in or goes (the counts of those not yet logged in).

use std::io::ErrorKind;
use std::net::IpAddr;

use hongbao_sys::net;
use mio::{Interest, Token};

use super::codec::Codec;
use super::conn::{conn_id, Conn};
use super::event_loop::Worker;
use super::http::HttpCodec;

impl Worker {
    /// Whether the worker is at a bound of the work it admits: as many TLS handshakes
    /// under way as it may hold, or (on a binary-frame listener) as many connections not
    /// yet logged in.
    fn at_bound(&self, http: bool) -> bool {
        (self.tls.is_some() && self.listeners.handshaking() >= self.cfg.max_tls_handshakes)
            || (!http && self.listeners.unauthenticated() >= self.cfg.max_unauthenticated as usize)
    }

    /// Takes in what listener `i` holds, until it would block or a bound is reached
    /// (nothing while accepts are paused after a failure).
    pub(super) fn accept(&mut self, i: usize) {
        let Some(listener) = self.listeners.accepting(i) else {
            return; // paused, or closed by a drain
        };
        let http = listener.http;
        loop {
            if self.at_bound(http) {
                // Left in the kernel's queue: accepted once a handshake or login ends.
                if self.listeners.hold_back() {
                    self.stats.counters.accept_paused += 1;
                }
                return;
            }
            let Some(listener) = self.listeners.accepting(i) else {
                return;
            };
            match listener.socket.accept() {
                Ok((mut stream, peer)) => {
                    self.stats.counters.accepted += 1;
                    if self.conns.len() >= self.cfg.max_connections as usize {
                        self.stats.counters.rejected += 1;
                        continue; // dropped: closes at once
                    }
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
                    let _ = stream.set_nodelay(true);
                    if self.listeners.accepting(i).is_some_and(|l| l.stamp_backlog) {
                        let _ = net::enable_receive_timestamps(&stream);
                    }
                    let now = self.time.polled.secs();
                    let codec = if http {
                        Codec::Http(Box::new(HttpCodec::new(now)))
                    } else {
                        Codec::Frames
                    };
                    let tls = self.tls.as_ref().map(|t| t.session(http));
                    let key = self.conns.next_key();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(key), interest)
                        .is_err()
                    {
                        continue;
                    }
                    let handshaking = tls.is_some();
                    let id = self.conns.insert(|generation| {
                        let mut conn = Conn::new(stream, generation, now, codec);
                        conn.tls = tls;
                        conn.state.proxy_header = proxied;
                        conn
                    });
                    let first = match handshaking {
                        true => {
                            self.listeners.handshake_began();
                            now.after(self.cfg.tls_handshake_timeout_secs)
                        }
                        false => self.first_visit(http, now),
                    };
                    debug_assert_eq!(id.key as usize, key, "the slot next_key named");
                    self.timers.file(first, id);
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
                    self.listeners.pause();
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
        if !self.listeners.is_held() || self.at_bound(true) {
            return;
        }
        self.listeners.let_in();
        self.accept_all();
        // Held again at once (the frames listener at `max_unauthenticated`, say): still
        // the same pause, not a new one.
        if self.listeners.is_held() {
            self.stats.counters.accept_paused -= 1;
        }
    }

    /// Once a second: the TLS listeners' accept queues sized to the handshakes this
    /// worker finished in the second past (`QueueBound`).
    pub(super) fn size_accept_queues(&mut self) {
        let finished = self.stats.counters.tls_handshakes + self.stats.counters.tls_resumed;
        if let Some(backlog) = self.listeners.second(finished) {
            self.stats.levels.tls_accept_queue = backlog.into();
        }
    }

    /// TLS handshakes under way.
    pub(super) fn handshaking(&self) -> u32 {
        self.listeners.handshaking()
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
        self.listeners.handshake_ended();
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
        self.listeners.held_from(source) < self.cfg.max_unauthenticated_per_source
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
        if self.listeners.unauthenticated() >= self.cfg.max_unauthenticated as usize {
            return false;
        }
        if self.is_from_trusted_proxy(key) {
            return true;
        }
        !self.listeners.any_source()
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
