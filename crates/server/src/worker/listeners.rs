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
//!
//! This file: the listeners and the bounds on what is taken in (`Listeners`,
//! `QueueBound`); the worker's accepting is `accept.rs`.

use std::collections::HashMap;
use std::net::IpAddr;

use hongbao_sys::net;
use mio::net::TcpListener;

/// A listening socket and what its connections speak first.
pub(super) struct Listener {
    pub socket: TcpListener,
    /// Binary frames, or HTTP (then perhaps WebSocket).
    pub http: bool,
    /// Connections whose handshake finished before the listener had receive timestamps
    /// on (a client may connect between our listen() and the supervisor's Welcome) did
    /// not inherit them: turn them on one by one until the first drain of the accept
    /// queue.
    pub stamp_backlog: bool,
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

    /// Accepting failed (out of files): paused until the next tick.
    pub(super) fn pause(&mut self) {
        self.paused = true;
    }

    /// Listener `i`, open and accepting (none while paused, or once closed by a drain).
    pub(super) fn accepting(&mut self, i: usize) -> Option<&mut Listener> {
        match self.paused {
            true => None,
            false => self.sockets.get_mut(i),
        }
    }

    /// The listeners are left with connections waiting, at a bound: whether they were
    /// not already (a new pause).
    pub(super) fn hold_back(&mut self) -> bool {
        !std::mem::replace(&mut self.held, true)
    }

    /// Whether the listeners were left at a bound.
    pub(super) fn is_held(&self) -> bool {
        self.held
    }

    /// Below the bound again: accepted from again.
    pub(super) fn let_in(&mut self) {
        self.held = false;
    }

    /// TLS handshakes under way.
    pub(super) fn handshaking(&self) -> u32 {
        self.handshaking
    }

    pub(super) fn handshake_began(&mut self) {
        self.handshaking += 1;
    }

    pub(super) fn handshake_ended(&mut self) {
        self.handshaking -= 1;
    }

    /// Connections not yet logged in.
    pub(super) fn unauthenticated(&self) -> usize {
        self.unauthenticated.len()
    }

    /// Connections not yet logged in from `source`.
    pub(super) fn held_from(&self, source: IpAddr) -> u32 {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    /// Whether any source holds a connection not yet logged in.
    pub(super) fn any_source(&self) -> bool {
        !self.per_source.is_empty()
    }

    /// Once a second, the TLS handshakes `finished` so far: the accept queues sized to
    /// those of the second past (`QueueBound`); the queue's length now, on a TLS worker.
    pub(super) fn second(&mut self, finished: u64) -> Option<u32> {
        let queue = self.queue.as_mut()?;
        if let Some(backlog) = queue.second(finished) {
            for l in &self.sockets {
                if let Err(e) = net::set_listen_backlog(&l.socket, backlog) {
                    tracing::warn!(error = %e, backlog, "could not set the accept queue's length");
                }
            }
        }
        Some(queue.backlog())
    }

    /// Whether one more connection not yet logged in, from `source`, is within limits of
    /// `most` in all and `most_per_source` from one source.
    pub(super) fn may_hold(&self, source: IpAddr, most: u32, most_per_source: u32) -> bool {
        self.unauthenticated.len() < most as usize
            && self.per_source.get(&source).copied().unwrap_or(0) < most_per_source
    }

    /// Connection `key`, from `source`, counted as not logged in.
    pub(super) fn hold(&mut self, key: usize, source: IpAddr) {
        if self.unauthenticated.insert(key, source).is_none() {
            *self.per_source.entry(source).or_default() += 1;
        }
    }

    /// Connection `key` no longer counted as not logged in.
    pub(super) fn release(&mut self, key: usize) {
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
