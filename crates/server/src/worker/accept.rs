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
//!
//! The queue itself is kept short enough to be served within a client's patience
//! (`QueueBound`): a TLS listener's backlog is `tls_accept_queue_secs` of the handshakes
//! the worker finished in its last second. A queue of a storm's whole million, served at
//! a few thousand a second, would be served only to clients that had long given up (each
//! back again with a fresh socket and a fresh ClientHello, to wait again); a SYN dropped
//! at a short queue costs the server nothing, and TCP sends it again.

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

/// The backlog of a TLS listener: `secs` seconds of the handshakes the worker finished
/// in its last second, never under `floor` (what a quiet worker starts a storm with) nor
/// over what the kernel allows. Raised at once; lowered only once a quarter too long, so
/// that a second's noise does not call listen(2) every second.
#[derive(Debug)]
pub(super) struct QueueBound {
    secs: u32,
    floor: u32,
    /// The backlog the listeners have now.
    now: u32,
    /// Handshakes finished, as counted at the last second.
    counted: u64,
}

/// The longest backlog asked for (`net.core.somaxconn`'s own ceiling).
const MOST_BACKLOG: u32 = 65_535;

impl QueueBound {
    pub(super) fn new(secs: u32, max_tls_handshakes: u32) -> QueueBound {
        let floor = max_tls_handshakes.saturating_mul(2).clamp(16, MOST_BACKLOG);
        QueueBound {
            secs,
            floor,
            now: floor,
            counted: 0,
        }
    }

    /// The backlog to start with.
    pub(super) fn backlog(&self) -> u32 {
        self.now
    }

    /// A second has passed and `finished` handshakes in all are done: the backlog the
    /// listeners should have from now, if it changes.
    pub(super) fn second(&mut self, finished: u64) -> Option<u32> {
        let last = finished.saturating_sub(self.counted);
        self.counted = finished;
        let want = last
            .saturating_mul(u64::from(self.secs))
            .clamp(u64::from(self.floor), u64::from(MOST_BACKLOG)) as u32;
        let change = want > self.now || u64::from(want) * 4 < u64::from(self.now) * 3;
        change.then(|| {
            self.now = want;
            want
        })
    }
}

/// The worker's listeners, and the connections not yet logged in that it holds.
pub(super) struct Listeners {
    sockets: Vec<Listener>,
    tokens: usize,
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
    /// The TLS listeners' backlog (`None` when the worker speaks no TLS).
    queue: Option<QueueBound>,
}

impl Listeners {
    /// `queue`: a TLS worker's bound on its accept queues, set on its listeners now.
    pub(super) fn new(sockets: Vec<Listener>, queue: Option<QueueBound>) -> Listeners {
        if let Some(q) = &queue {
            for l in &sockets {
                if let Err(e) = net::set_listen_backlog(&l.socket, q.backlog()) {
                    tracing::warn!(error = %e, "could not set the accept queue's length");
                }
            }
        }
        Listeners {
            queue,
            tokens: sockets.len(),
            sockets,
            paused: false,
            held: false,
            handshaking: 0,
            unauthenticated: HashMap::new(),
            per_source: HashMap::new(),
        }
    }

    /// The listeners' tokens (`LISTENERS` down): as many as it started with, closed or
    /// not, so that an event a closed one left in the batch is still known for one.
    pub(super) fn count(&self) -> usize {
        self.tokens
    }

    /// Every listener closed (a drain): the kernel refuses the connections that come
    /// next, and resets those still in the accept queues, so that they try elsewhere at
    /// once rather than wait for a worker that will not take them.
    pub(super) fn close_all(&mut self, registry: &mio::Registry) {
        for mut l in self.sockets.drain(..) {
            let _ = registry.deregister(&mut l.socket);
        }
        self.held = false;
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
        if self.listeners.paused || i >= self.listeners.sockets.len() {
            return; // paused, or closed by a drain
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
                            self.listeners.handshaking += 1;
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

    /// Once a second: the TLS listeners' accept queues sized to the handshakes this
    /// worker finished in the second past (`QueueBound`).
    pub(super) fn size_accept_queues(&mut self) {
        let finished = self.stats.counters.tls_handshakes + self.stats.counters.tls_resumed;
        let Some(queue) = self.listeners.queue.as_mut() else {
            return;
        };
        if let Some(backlog) = queue.second(finished) {
            for l in &self.listeners.sockets {
                if let Err(e) = net::set_listen_backlog(&l.socket, backlog) {
                    tracing::warn!(error = %e, backlog, "could not set the accept queue's length");
                }
            }
        }
        self.stats.levels.tls_accept_queue = queue.backlog().into();
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

#[cfg(test)]
mod tests {
    use super::QueueBound;

    /// Seconds of a storm, each with the handshakes finished in it: the backlog a TLS
    /// listener is given after each.
    fn backlogs(secs: u32, per_second: &[u64]) -> Vec<u32> {
        let mut q = QueueBound::new(secs, 256);
        let mut finished = 0;
        per_second
            .iter()
            .map(|n| {
                finished += n;
                q.second(finished);
                q.backlog()
            })
            .collect()
    }

    #[test]
    fn a_storm_gets_ten_seconds_of_its_handshakes_and_a_quiet_worker_twice_its_bound() {
        // Quiet: the floor. A storm begins: its first second's 300 make 3,000 at once;
        // it climbs as the worker does; 8,000 a second would be 80,000, past the kernel's
        // ceiling.
        assert_eq!(
            backlogs(10, &[0, 3, 300, 480, 450, 8_000]),
            [512, 512, 3_000, 4_800, 4_800, 65_535]
        );
        // Lowered only once a quarter too long: 4,800 stays at 3,700 a second's worth,
        // and goes to 3,500 once it is that far off; the storm over, back to the floor.
        assert_eq!(
            backlogs(10, &[480, 370, 350, 0]),
            [4_800, 4_800, 3_500, 512]
        );
        // Five seconds' worth, and a bound of 1,000 under way: a floor of 2,000.
        let mut q = QueueBound::new(5, 1_000);
        assert_eq!(q.backlog(), 2_000);
        assert_eq!(q.second(1_000), Some(5_000));
        assert_eq!(q.second(1_990), None);
    }
}
