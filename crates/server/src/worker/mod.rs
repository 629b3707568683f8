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
//! This file: the worker's start (its sockets inherited, the welcome, its record made).
//! The record and its loop are `event_loop`. The worker is made of parts, each a type
//! in a file of its own that knows nothing of the worker, and owns its state and the
//! code that changes it:
//! - `listeners`: the listening sockets, and the bounds on what is taken in (TLS
//!   handshakes under way, connections not logged in, in all and per source, the accept
//!   queues' length);
//! - `conn`: the connection table, one connection's state (`ConnState`) beside its I/O,
//!   and the worker's reused output buffers;
//! - `ready`: the connections reported readable and not yet read, and the order they
//!   are read in (oldest first; newest first while a queue stands);
//! - `timers`: every deadline of the loop in one table — the tick, each connection's next;
//! - `supervisor_link`: this worker's end of the link — the welcome, the bytes each way;
//! - `session`: who a connection is and until when — tokens, revocations, refreshes;
//! - `shakes` and `overload`: the shake pool, the claims waiting, and a shake's way
//!   through overload — late, back-off, cap, rate — in one gate;
//! - `broadcasts`: the operator broadcasts in flight and their pacing;
//! - `drain`: the pacing of a drain;
//! - `codec` (binary frames, WebSocket), `http` (the API, the browser page, WebSocket
//!   upgrades; `answer`: its answers), `wire` (what a decode step is made of), `tls`:
//!   the wire seam, each a connection's transport.
//!
//! What the worker does with its parts is in files named for the doing, each an `impl
//! Worker` that asks its parts through their methods:
//! - `accept`: taking connections in, under the listeners' bounds;
//! - `read`: the read path, a step at a time — the socket, a PROXY header, TLS, the codec;
//! - `handler`: requests → logins, the shake pool, the link;
//! - `write`: writing, kicking, closing;
//! - `messages`: what the supervisor's messages do here, and ours going up;
//! - `broadcast`: writing a broadcast out, a slice of connections per turn;
//! - `draining`: letting the connections go on SIGTERM or an upgrade;
//! - `tick`: once a second — the report, and the connections whose deadline came.
//!
//! Time is typed (`hongbao_sys::clock`): the loop runs on `Uptime`, what it shares with
//! other processes is `UnixTime`.

mod accept;
mod answer;
mod broadcast;
mod broadcasts;
mod codec;
mod conn;
mod drain;
mod draining;
mod event_loop;
mod handler;
mod http;
mod listeners;
mod messages;
mod overload;
mod read;
mod ready;
mod session;
mod shakes;
mod supervisor_link;
mod tick;
mod timers;
mod tls;
mod wire;
mod write;
pub use drain::DRAIN_RETRY_AFTER_MS;

use std::io::Write;
use std::os::fd::{FromRawFd, RawFd};

use hongbao_money::WorkerId;
use hongbao_sys::clock::{Clock, Uptime};
use hongbao_sys::limits;
use mio::net::{TcpListener, UnixStream};
use mio::{Interest, Poll, Token};

use crate::error::{Error, Result};
use crate::link::{self, ToSupervisor};
use crate::stats::WorkerStats;
use broadcasts::Broadcasts;
use conn::{Conns, Output};
use event_loop::{TurnClock, Worker, LINK, LISTENERS};
use listeners::{Listener, Listeners, QueueBound};
use ready::Ready;
use session::Sessions;
use shakes::Shakes;
use supervisor_link::{read_welcome, SupervisorLink};
use timers::Timers;

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
