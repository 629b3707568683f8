//! A gateway worker: one process, one event loop, one SET — its connections, its local
//! shake pool, its admission counter, its stats.
//!
//! Connections live in a slab of small records driven by mio, not in a task each: the
//! read buffer is shared by the whole worker. There is one read/dispatch/write path for
//! every transport: bytes go through the connection's codec (the wire seam, `codec.rs`)
//! into transport-free requests, handlers (`handler.rs`) act on them, and typed replies
//! and pushes go back through the codec into bytes. Losing shakes are answered here at
//! memory speed; winning shakes, sends, opens and chats go to the supervisor over the
//! link, and its answers come back as typed replies addressed to a `ConnId` (slab key +
//! generation, so an answer for a closed connection can never reach the next owner of its
//! slot).
//!
//! This file: the worker's record, its start and the event loop. The rest:
//! - `accept`: taking connections in, and the limits on those not yet logged in;
//! - `ready`: the connections reported readable and not yet read, and the order they
//!   are read in (oldest first; newest first while a queue stands);
//! - `read`: the read path, a step at a time — the socket, a PROXY header, TLS, the codec;
//! - `conn`: the connection record, and writing, kicking, closing;
//! - `codec`: the wire seam — binary frames, WebSocket;
//! - `http`: HTTP on the listener — the API, the browser page, WebSocket upgrades;
//!   `answer`: its answers' statuses and bodies;
//! - `wire`: what a decode step is made of, shared by `codec` and `http`;
//! - `tls`: TLS under the codecs, on every client listener when it is on;
//! - `handler`: requests → logins, the shake pool, the link;
//! - `session`: who a connection is and until when — tokens, revocations, refreshes;
//! - `overload`: a shake's way through overload — late, back-off, cap, rate — in one gate;
//! - `broadcast`: operator broadcasts, a slice of connections per turn, paced;
//! - `supervisor_link`: this worker's end of the link — the welcome, the supervisor's
//!   messages, ours;
//! - `timers`: every deadline of the loop in one table — the tick, each connection's next;
//! - `tick`: once a second — the report, and the connections whose deadline came.
//!
//! The worker's record is made of parts, one per concern, each beside the code that owns
//! it: `Listeners` (accept.rs), `Conns`, the connection table, and `Output` (conn.rs),
//! `SupervisorLink` (supervisor_link.rs), `Shakes` (handler.rs), `Broadcasts`
//! (broadcast.rs), `Timers` (timers.rs), and here the clock as the turn read it
//! (`TurnClock`). Time is typed (`hongbao_sys::clock`): the
//! loop runs on `Uptime`, what it shares with other processes is `UnixTime`.

mod accept;
mod answer;
mod broadcast;
mod codec;
mod conn;
mod drain;
mod supervisor_link;
pub use drain::DRAIN_RETRY_AFTER_MS;
mod handler;
mod http;
mod overload;
mod read;
mod ready;
mod session;
mod tick;
mod timers;
mod tls;
mod wire;

use std::io::{ErrorKind, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::time::Duration;

use hdrhistogram::Histogram;
use hongbao_money::WorkerId;
use hongbao_sys::clock::{Clock, UnixTime, Uptime};
use hongbao_sys::limits;
use mio::net::{TcpListener, UnixStream};
use mio::{Events, Interest, Poll, Token};

use crate::config::ReadyOrder;
use crate::error::{Error, Result};
use crate::link::{self, ToSupervisor, WorkerConfig};
use crate::stats::WorkerStats;
use accept::{Listener, Listeners, QueueBound};
use broadcast::Broadcasts;
use conn::{Conns, Output};
use drain::Drain;
use handler::Shakes;
use ready::Ready;
use session::Sessions;
use supervisor_link::{read_welcome, SupervisorLink};
use timers::Timers;

const LINK: Token = Token(usize::MAX - 1);
/// Listener `i` has token `LISTENERS - i`.
const LISTENERS: usize = usize::MAX - 2;
/// Bytes read per `read` call into the worker's shared buffer.
const READ_BUF: usize = 64 * 1024;
/// Events taken from epoll a call.
const EVENTS: usize = 1024;

pub struct WorkerOptions {
    pub index: WorkerId,
    /// The descriptor of this worker's end of its link, inherited from the supervisor.
    pub link_fd: RawFd,
    /// Its listening sockets for the client protocol, inherited from the supervisor.
    pub listeners: Vec<RawFd>,
    /// Its listening sockets that speak HTTP (WebSocket, the HTTP API), inherited.
    pub http_listeners: Vec<RawFd>,
}

/// A listening socket the supervisor left this process under `fd`.
fn inherited_listener(fd: RawFd, index: WorkerId) -> Result<TcpListener> {
    // SAFETY: the supervisor made this descriptor a listening socket for this process
    // (inherited at exec) and nothing else here owns or closes it.
    let socket = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    // Make sure it is a listening TCP socket before trusting it.
    socket.local_addr().map_err(|e| {
        Error::io(
            format!("worker {index}: descriptor {fd} is not a listener"),
            e,
        )
    })?;
    socket
        .set_nonblocking(true)
        .map_err(|e| Error::io("making a listener non-blocking", e))?;
    Ok(TcpListener::from_std(socket))
}

struct Worker {
    cfg: WorkerConfig,
    poll: Poll,
    time: TurnClock,
    listeners: Listeners,
    conns: Conns,
    /// Connections reported readable and not yet read.
    ready: Ready,
    /// Connections that hit `READS_PER_TURN` and still have input waiting. Not in
    /// `ready`: epoll will not report them again until more arrives, so they are read on
    /// to "would block" (right after the batch that left them), not up to a short read.
    again: Vec<usize>,
    timers: Timers,
    link: SupervisorLink,
    sessions: Sessions,
    /// TLS on the client listeners, when it is on.
    tls: Option<tls::Tls>,
    shakes: Shakes,
    broadcasts: Broadcasts,
    stats: WorkerStats,
    /// Shake latency of the current second (µs).
    latency: Histogram<u64>,
    output: Output,
    /// Draining (SIGTERM): the pacing, and the connections still to let go, in turn.
    drain: Option<Drain>,
    drain_order: Vec<usize>,
    shutdown: bool,
}

/// The worker's clock as the turn read it. One reading a poll, not one a read: a clock
/// read costs ~0.1 µs on a VM, and a shake once needed six (docs/BENCHMARKS.md).
struct TurnClock {
    clock: Clock,
    /// When the last poll returned: what the rest of the turn needs of the time (its
    /// reads, the pacer, the tick, the next poll's timeout) without reading it again. A
    /// turn is a batch of reads, about a millisecond.
    polled: Uptime,
    /// As of the read being handled, for everything its requests need of it: the
    /// turn's `polled` for the connections epoll reported, a reading of its own for
    /// those read on from `again`.
    read: Uptime,
    /// When the kernel received the newest bytes of the current read.
    received: Option<UnixTime>,
}

impl TurnClock {
    /// The Unix time of the read being handled (no clock read).
    fn read_unix(&self) -> UnixTime {
        self.clock.unix(self.read)
    }
}

/// Runs a worker until the supervisor tells it to stop or the link closes.
pub fn run(opts: WorkerOptions) -> Result<()> {
    let _span = tracing::info_span!("worker", worker = opts.index).entered();
    limits::raise_nofile_limit();
    // The listening sockets are the supervisor's, inherited (`supervisor/listen.rs`):
    // they listen before this worker says hello, so a client connecting once "ready" is
    // said finds them. The client sockets first, then those that speak HTTP (the
    // WebSocket address upgrades, the HTTP address serves the API, and each does what
    // the other does too).
    let mut listeners = Vec::new();
    for (fds, http) in [(&opts.listeners, false), (&opts.http_listeners, true)] {
        for &fd in fds {
            listeners.push(Listener::new(inherited_listener(fd, opts.index)?, http));
        }
    }
    // SAFETY: the supervisor made this descriptor for this process alone (one end of a
    // socketpair, inherited at exec) and nothing else here owns or closes it.
    let std_link = unsafe { std::os::unix::net::UnixStream::from_raw_fd(opts.link_fd) };
    // Make sure it is a socket before trusting it with anything.
    std_link.peer_addr().map_err(|e| {
        Error::io(
            format!(
                "worker {}: descriptor {} is not a link",
                opts.index, opts.link_fd
            ),
            e,
        )
    })?;
    let mut hello = Vec::new();
    link::encode(
        &ToSupervisor::Hello {
            worker: opts.index,
            pid: std::process::id(),
        },
        &mut hello,
    );
    (&std_link)
        .write_all(&hello)
        .map_err(|e| Error::io("saying hello on the link", e))?;
    let (cfg, early, link_in) = read_welcome(&std_link)?;
    let sessions = Sessions::new(cfg.login.clone())?;
    let tls = cfg.tls.as_ref().map(tls::Tls::new).transpose()?;
    let ready = Ready::new(cfg.ready_order);
    if cfg.stamps() {
        for l in &mut listeners {
            l.stamp()
                .map_err(|e| Error::io("turning on receive timestamps", e))?;
        }
    }
    std_link
        .set_nonblocking(true)
        .map_err(|e| Error::io("making the link non-blocking", e))?;

    let poll = Poll::new().map_err(|e| Error::io("making the poll", e))?;
    for (i, l) in listeners.iter_mut().enumerate() {
        poll.registry()
            .register(&mut l.socket, Token(LISTENERS - i), Interest::READABLE)
            .map_err(|e| Error::io("polling a listener", e))?;
    }
    let mut link = UnixStream::from_std(std_link);
    poll.registry()
        .register(&mut link, LINK, Interest::READABLE | Interest::WRITABLE)
        .map_err(|e| Error::io("polling the link", e))?;
    let clock = Clock::start();
    let timers = Timers::new(Uptime::ZERO, clock.unix(Uptime::ZERO));
    let capacity = cfg.max_connections as usize;
    let queue = (tls.is_some() && cfg.tls_accept_queue_secs > 0)
        .then(|| QueueBound::new(cfg.tls_accept_queue_secs, cfg.max_tls_handshakes));
    let mut worker = Worker {
        cfg,
        poll,
        time: TurnClock {
            clock,
            polled: Uptime::ZERO,
            read: Uptime::ZERO,
            received: None,
        },
        listeners: Listeners::new(listeners, queue),
        conns: Conns::with_capacity(capacity),
        ready,
        again: Vec::new(),
        timers,
        link: SupervisorLink::new(link, link_in),
        sessions,
        tls,
        shakes: Shakes::default(),
        broadcasts: Broadcasts::new(Uptime::ZERO),
        stats: WorkerStats {
            worker: opts.index,
            pid: std::process::id(),
            ..Default::default()
        },
        latency: hongbao_telemetry::sample::new_coarse_histogram(),
        output: Output::default(),
        drain: None,
        drain_order: Vec::new(),
        shutdown: false,
    };
    for msg in early {
        worker.on_supervisor_message(msg);
    }
    worker.event_loop()
}

impl Worker {
    /// The clock read now (not the turn's reading).
    fn now(&self) -> Uptime {
        self.time.clock.now()
    }

    fn event_loop(&mut self) -> Result<()> {
        let mut events = Events::with_capacity(EVENTS);
        let mut read_buf = vec![0u8; READ_BUF];
        while !self.shutdown {
            // As of the last poll: a tick falls at most a turn late.
            let timeout = if self.again.is_empty() && self.ready.is_empty() {
                let sooner = match (self.broadcast_wait(), self.drain_wait()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                self.timers.timeout(self.time.polled, sooner)
            } else {
                Duration::ZERO
            };
            self.poll_all(&mut events, timeout, &mut read_buf)?;
            self.read_ready(&mut read_buf)?;
            if !self.again.is_empty() {
                let now = self.now();
                for key in std::mem::take(&mut self.again) {
                    self.read_then_ask(key, &mut read_buf, true, now)?;
                }
            }
            // Handshakes or logins ended this turn: what waits in the accept queue next.
            self.resume_held();
            let polled = self.time.polled;
            self.broadcast_slice(polled);
            self.drain_step(polled);
            if self.timers.tick_due(polled) {
                // Ticks fall just after each whole wall-clock second, in every worker
                // alike, so the per-second counters of all workers describe the same
                // second; the tick follows the wall clock if it was set meanwhile.
                let unix = self.time.clock.resync();
                self.timers.ticked(polled, unix);
                self.tick(unix);
            }
            self.flush_link()?;
        }
        // A last report, so the counts of this partial second are not lost.
        self.tick(UnixTime::now());
        let deadline = self.now() + Duration::from_secs(1);
        while self.link.has_output() && self.now() < deadline {
            self.flush_link()?;
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Polls once, waiting up to `timeout`, and takes what epoll reports: the link,
    /// listeners, writable connections at once, readable ones into `ready`. In the
    /// adaptive order it then polls on without waiting while a poll comes back full:
    /// epoll gives the longest-ready connections first, `EVENTS` at a time, and after a
    /// stall it holds a backlog of them — the newest connections are known only once all
    /// of it is in `ready` (a few µs a thousand).
    fn poll_all(
        &mut self,
        events: &mut Events,
        timeout: Duration,
        read_buf: &mut [u8],
    ) -> Result<()> {
        let mut timeout = timeout;
        loop {
            match self.poll.poll(events, Some(timeout)) {
                Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(()),
                other => other.map_err(|e| Error::io("waiting for events", e))?,
            }
            // One clock read a poll: the events of one poll were reported together.
            let reported = self.now();
            self.time.polled = reported;
            let mut taken = 0;
            for event in events.iter() {
                taken += 1;
                match event.token() {
                    LINK => self.on_link(event.is_readable())?,
                    Token(t) if t > LISTENERS - self.listeners.count() && t <= LISTENERS => {
                        self.accept(LISTENERS - t)
                    }
                    Token(key) => {
                        if event.is_writable() {
                            self.flush_conn(key);
                        }
                        if (event.is_read_closed() || event.is_error()) && self.is_handshaking(key)
                        {
                            // Gone before its handshake was done (a client that gave up
                            // while it waited in the accept queue): its ClientHello is
                            // not worth a signature.
                            self.stats.counters.tls_abandoned += 1;
                            self.close(key);
                        } else if event.is_read_closed() || event.is_error() {
                            // The last of what it sent, then the close: at once, as
                            // there is nothing newer to come from it.
                            self.on_readable(key, read_buf, true, reported);
                        } else if event.is_readable() {
                            self.ready.push(key, reported);
                        }
                    }
                }
            }
            if taken < EVENTS || self.cfg.ready_order == ReadyOrder::Fifo || self.shutdown {
                return Ok(());
            }
            timeout = Duration::ZERO;
        }
    }
}
