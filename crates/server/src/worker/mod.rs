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
//! This file: the worker's record, its start, the event loop and the read path. The rest:
//! - `accept`: taking connections in, and the limits on those not yet logged in;
//! - `ready`: the connections reported readable and not yet read, and the order they
//!   are read in (oldest first; newest first while a queue stands);
//! - `conn`: the connection record, and writing, kicking, closing;
//! - `codec`: the wire seam — binary frames, WebSocket;
//! - `http`: HTTP on the listener — the API, the browser page, WebSocket upgrades;
//! - `wire`: what a decode step is made of, shared by `codec` and `http`;
//! - `handler`: requests → logins, admission, the shake pool, the link;
//! - `cap`: the shake cap under overload;
//! - `broadcast`: operator broadcasts, a slice of connections per turn, paced;
//! - `core_link`: this worker's end of the link — the welcome, the core's messages, ours;
//! - `tick`: once a second — the report, and the sweep of connections past their deadline.

mod accept;
mod broadcast;
mod cap;
mod codec;
mod conn;
mod core_link;
mod handler;
mod http;
mod ready;
mod tick;
mod wire;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hongbao_money::{ConnId, WorkerId};
use hongbao_sys::{limits, net};
use mio::net::{TcpListener, UnixStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::config::ReadyOrder;
use crate::link::{self, ToCore, WorkerConfig};
use crate::stats::WorkerStats;
use broadcast::{BroadcastJob, Pacer};
use codec::Codec;
use conn::{Conn, State};
use core_link::read_welcome;
use handler::{Admission, Backoff};
use ready::Ready;
use tick::until_next_second;
use wire::{Cx, Then};

const LINK: Token = Token(usize::MAX - 1);
/// Listener `i` has token `LISTENERS - i`.
const LISTENERS: usize = usize::MAX - 2;
/// Bytes read per `read` call into the worker's shared buffer.
const READ_BUF: usize = 64 * 1024;
/// Events taken from epoll a call.
const EVENTS: usize = 1024;
/// The largest worker buffer kept for reuse once emptied (`scratch`, `corked`): a rare
/// large answer's is dropped.
const KEPT_BUFFER: usize = 64 * 1024;
/// Reads one connection may do per readiness event before others get a turn.
const READS_PER_TURN: usize = 4;

pub struct WorkerOptions {
    pub index: WorkerId,
    pub link: String,
    pub listen: SocketAddr,
    pub ws_listen: Option<SocketAddr>,
    pub http_listen: Option<SocketAddr>,
}

/// A listening socket and what its connections speak first.
struct Listener {
    socket: TcpListener,
    /// Binary frames, or HTTP (then perhaps WebSocket).
    http: bool,
    /// Connections whose handshake finished before the listener had receive timestamps
    /// on (a client may connect between our listen() and the supervisor's Welcome) did
    /// not inherit them: turn them on one by one until the first drain of the accept
    /// queue.
    stamp_backlog: bool,
}

struct Worker {
    index: WorkerId,
    poll: Poll,
    listeners: Vec<Listener>,
    conns: Slab<Conn>,
    broadcasts: VecDeque<BroadcastJob>,
    pacer: Pacer,
    /// This worker's wait for a CPU, which paces broadcasts while shakes are served.
    cpu_wait: hongbao_sys::usage::CpuWait,
    /// Connections reported readable and not yet read.
    ready: Ready,
    /// Connections that hit `READS_PER_TURN` and still have input waiting. Not in
    /// `ready`: epoll will not report them again until more arrives, so they are read on
    /// to "would block" (right after the batch that left them), not up to a short read.
    again: Vec<usize>,
    link: UnixStream,
    link_in: Vec<u8>,
    link_out: Vec<u8>,
    pool: VecDeque<(u64, u64)>,
    cfg: WorkerConfig,
    started: Instant,
    /// The clock as of the read being handled (time since `started`), for everything the
    /// read's requests need of it: the turn's one reading (`polled`) for the connections
    /// epoll reported, one reading for those read on from `again` — a clock read costs
    /// ~0.1 µs on a VM, and a shake once needed six (docs/BENCHMARKS.md).
    read_now: Duration,
    /// The clock (since `started`) when the last poll returned: what the rest of the turn
    /// needs of it (its reads, the pacer, the tick, the next poll's timeout) without
    /// reading it again. A turn is a batch of reads, about a millisecond.
    polled: Duration,
    /// The Unix time at `started`, set again each tick (so it follows the wall clock):
    /// `unix_at_start + read_now` is the read's Unix time without another clock read.
    unix_at_start: Duration,
    next_generation: u32,
    admission: Admission,
    backoff: Backoff,
    cap: cap::Cap,
    accept_paused: bool,
    stats: WorkerStats,
    /// Shake latency of the current second (µs).
    latency: Histogram<u64>,
    /// When each shake waiting on the core for a win was read, by (connection, request).
    claims: HashMap<(ConnId, u32), Instant>,
    /// When the kernel received the newest bytes of the current read (wall clock).
    received: Option<Duration>,
    /// The encoding buffer, reused: a decode step's transport answers, a reply, a push
    /// (`take_scratch`, `give_scratch`).
    scratch: Vec<u8>,
    /// The connection whose read is being handled: what is written to it meanwhile is
    /// held in `corked` and written once the read's requests are all answered, one
    /// `write` for them all (conn.rs).
    cork: Option<usize>,
    corked: Vec<u8>,
    /// Connections not yet logged in (binary frames, upgraded WebSockets), by slab key,
    /// with their source address; and how many each source has.
    unauthenticated: HashMap<usize, IpAddr>,
    per_source: HashMap<IpAddr, u32>,
    /// The connections the once-a-second sweep looks at: those that can expire (tick.rs).
    watched: HashSet<usize>,
    shutdown: bool,
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Runs a worker until the supervisor tells it to stop or the link closes.
pub fn run(opts: WorkerOptions) -> anyhow::Result<()> {
    limits::raise_nofile_limit();
    // Listen before saying hello: the supervisor announces "ready" once every worker has
    // said hello, and a client connecting then must find a listener.
    let mut listeners = vec![Listener {
        socket: TcpListener::from_std(net::reuseport_listener(opts.listen, true)?),
        http: false,
        stamp_backlog: false,
    }];
    // Both speak HTTP: the WebSocket address upgrades, the HTTP address serves the API,
    // and each does what the other does too.
    for addr in opts.ws_listen.into_iter().chain(opts.http_listen) {
        listeners.push(Listener {
            socket: TcpListener::from_std(net::reuseport_listener(addr, true)?),
            http: true,
            stamp_backlog: false,
        });
    }
    let addr = net::abstract_addr(&opts.link)?;
    let std_link = std::os::unix::net::UnixStream::connect_addr(&addr)
        .map_err(|e| anyhow::anyhow!("worker {}: connecting to the core: {e}", opts.index))?;
    let mut hello = Vec::new();
    link::encode(
        &ToCore::Hello {
            worker: opts.index,
            pid: std::process::id(),
        },
        &mut hello,
    );
    (&std_link).write_all(&hello)?;
    let (cfg, early, link_in) = read_welcome(&std_link)?;
    let ready = Ready::new(cfg.ready_order);
    if cfg.stamps() {
        for l in &mut listeners {
            net::enable_receive_timestamps(&l.socket)?;
            l.stamp_backlog = true;
        }
    }
    std_link.set_nonblocking(true)?;

    let poll = Poll::new()?;
    for (i, l) in listeners.iter_mut().enumerate() {
        poll.registry()
            .register(&mut l.socket, Token(LISTENERS - i), Interest::READABLE)?;
    }
    let mut link = UnixStream::from_std(std_link);
    poll.registry()
        .register(&mut link, LINK, Interest::READABLE | Interest::WRITABLE)?;
    let mut worker = Worker {
        index: opts.index,
        poll,
        listeners,
        conns: Slab::new(),
        broadcasts: VecDeque::new(),
        pacer: Pacer::new(Instant::now()),
        cpu_wait: hongbao_sys::usage::CpuWait::open(),
        ready,
        again: Vec::new(),
        link,
        link_in,
        link_out: Vec::new(),
        pool: VecDeque::new(),
        cfg,
        started: Instant::now(),
        read_now: Duration::ZERO,
        polled: Duration::ZERO,
        unix_at_start: unix_now(),
        next_generation: 1,
        admission: Admission::default(),
        backoff: Backoff::default(),
        cap: cap::Cap::default(),
        accept_paused: false,
        stats: WorkerStats {
            worker: opts.index,
            pid: std::process::id(),
            ..Default::default()
        },
        latency: hongbao_telemetry::sample::new_coarse_histogram(),
        claims: HashMap::new(),
        received: None,
        scratch: Vec::new(),
        cork: None,
        corked: Vec::new(),
        unauthenticated: HashMap::new(),
        per_source: HashMap::new(),
        watched: HashSet::new(),
        shutdown: false,
    };
    for msg in early {
        worker.on_core_message(msg);
    }
    worker.event_loop()
}

impl Worker {
    fn now_s(&self) -> u32 {
        self.started.elapsed().as_secs() as u32
    }

    fn event_loop(&mut self) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(EVENTS);
        let mut read_buf = vec![0u8; READ_BUF];
        // Ticks fall just after each whole wall-clock second, in every worker alike, so the
        // per-second counters of all workers describe the same second.
        let mut next_tick = Instant::now() + until_next_second();
        while !self.shutdown {
            // As of the last poll: a tick falls at most a turn late.
            let until_tick = next_tick.saturating_duration_since(self.started + self.polled);
            let timeout = if self.again.is_empty() && self.ready.is_empty() {
                self.broadcast_wait()
                    .map_or(until_tick, |w| w.min(until_tick))
            } else {
                Duration::ZERO
            };
            self.poll_all(&mut events, timeout, &mut read_buf)?;
            self.read_ready(&mut read_buf)?;
            if !self.again.is_empty() {
                let now = self.started.elapsed();
                for key in std::mem::take(&mut self.again) {
                    self.read_then_ask(key, &mut read_buf, true, now)?;
                }
            }
            let polled = self.started + self.polled;
            self.broadcast_slice(polled);
            if polled >= next_tick {
                next_tick = polled + until_next_second();
                self.tick();
            }
            self.flush_link()?;
        }
        // A last report, so the counts of this partial second are not lost.
        self.tick();
        let deadline = Instant::now() + Duration::from_secs(1);
        while !self.link_out.is_empty() && Instant::now() < deadline {
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
    ) -> anyhow::Result<()> {
        let mut timeout = timeout;
        loop {
            match self.poll.poll(events, Some(timeout)) {
                Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(()),
                other => other?,
            }
            // One clock read a poll: the events of one poll were reported together.
            let reported = self.started.elapsed();
            self.polled = reported;
            let mut taken = 0;
            for event in events.iter() {
                taken += 1;
                match event.token() {
                    LINK => self.on_link(event.is_readable())?,
                    Token(t) if t > LISTENERS - self.listeners.len() && t <= LISTENERS => {
                        self.accept(LISTENERS - t)
                    }
                    Token(key) => {
                        if event.is_writable() {
                            self.flush_conn(key);
                        }
                        if event.is_read_closed() || event.is_error() {
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

    // ----- the read path --------------------------------------------------------------

    /// Reads the connections `ready` gives, in its order, as many as `ready::read_batch`
    /// says: a batch in the adaptive order (four while a broadcast is being written: the
    /// shakes first, a slice of the broadcast after), so that what epoll reports meanwhile
    /// is seen between batches; all of them in FIFO order. The whole batch goes by the
    /// poll's clock (`polled`): one clock read a turn, not one a read — at a million
    /// connections most turns read one connection.
    fn read_ready(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        let batch = ready::read_batch(self.cfg.ready_order, !self.broadcasts.is_empty());
        let now = self.polled;
        for _ in 0..batch {
            let Some(key) = self.ready.pop(now) else {
                return Ok(());
            };
            self.read_then_ask(key, buf, false, now)?;
        }
        Ok(())
    }

    /// Reads a connection (`on_readable`); what that read asked of the core — a claim, a
    /// send, a login — goes up the link at once, not at the end of the turn: a won shake
    /// waits for the ledger's next commit, and a turn of reads is long enough (~1 ms, more
    /// on a busy machine) to miss one. A read that asked nothing writes nothing, even while
    /// the link holds a backlog the core has not taken (the turn's end retries that).
    fn read_then_ask(
        &mut self,
        key: usize,
        buf: &mut [u8],
        drain: bool,
        now: Duration,
    ) -> anyhow::Result<()> {
        let queued = self.link_out.len();
        self.on_readable(key, buf, drain, now);
        if self.link_out.len() > queued {
            self.flush_link()?;
        }
        Ok(())
    }

    /// Reads what a connection sent, at most `READS_PER_TURN` buffers a turn. A short
    /// read emptied the socket and ends it (epoll, edge-triggered, says when more
    /// arrives: reading on only to hear "would block" would cost a system call per
    /// request) — unless `drain`: the event said the peer closed or the socket failed, or
    /// the connection is back from `again`; then it reads on to "would block". `now`:
    /// the clock (since `started`) read just before, for everything the reads need.
    fn on_readable(&mut self, key: usize, buf: &mut [u8], drain: bool, now: Duration) {
        self.read_now = now;
        for _ in 0..READS_PER_TURN {
            let Some(conn) = self
                .conns
                .get_mut(key)
                .filter(|c| c.state != State::Draining)
            else {
                return; // the peer sent all it will; only answers go out
            };
            let read = if self.cfg.stamps() {
                net::read_stamped(conn.stream.as_raw_fd(), buf)
            } else {
                conn.stream.read(buf).map(|n| (n, None))
            };
            let n = match read {
                Ok((0, _)) => return self.peer_done(key),
                Ok((n, received)) => {
                    self.received = received;
                    n
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return self.close(key),
            };
            self.stats.counters.bytes_in += n as u64;
            if conn.state == State::Closing {
                continue; // discard until the peer closes
            }
            // Before a session's login the clock runs from the connect (or the WebSocket
            // upgrade): what the client sends meanwhile does not buy it time.
            if conn.user.is_some() || matches!(conn.codec, Codec::Http(_)) {
                conn.last_seen = now.as_secs() as u32;
            }
            let mut partial = conn.take_partial();
            // The answers to what this read brought go out in one write: after a wait
            // a read brings many requests, and a write each cost the most of each.
            self.cork = Some(key);
            let rest = if partial.is_empty() {
                let used = self.input(key, &mut buf[..n]);
                buf[used..n].to_vec()
            } else {
                partial.extend_from_slice(&buf[..n]);
                let used = self.input(key, &mut partial);
                partial.drain(..used);
                partial
            };
            self.uncork();
            if let Some(conn) = self.conns.get_mut(key).filter(|c| c.state == State::Open) {
                conn.keep_partial(rest);
            }
            if n < buf.len() && !drain {
                return;
            }
        }
        self.again.push(key);
    }

    /// The one read path: decodes what a connection sent a request at a time, writes what
    /// the transport answers by itself, and dispatches each request. Returns how many
    /// bytes it used (the rest is an incomplete request, kept for the next read).
    fn input(&mut self, key: usize, data: &mut [u8]) -> usize {
        let mut at = 0;
        while at < data.len() && self.is_open(key) {
            let http = matches!(self.conns[key].codec, Codec::Http(_));
            let may_upgrade = http && self.may_upgrade(key);
            let mut out = self.take_scratch();
            let mut cx = Cx {
                out: &mut out,
                stats: &mut self.stats.counters,
                cfg: &self.cfg,
                now: self.read_now.as_secs() as u32,
                may_upgrade,
            };
            let step = self.conns[key].codec.decode(&mut data[at..], &mut cx);
            at += step.used;
            if http && matches!(self.conns[key].codec, Codec::WebSocket(_)) {
                // Upgraded: a session, to log in from now.
                if let Ok(peer) = self.conns[key].stream.peer_addr() {
                    self.hold_unauthenticated(key, peer.ip());
                }
            }
            if !out.is_empty() {
                self.write(key, &out);
            }
            self.give_scratch(out);
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

    /// The worker's encoding buffer, empty (a fresh one if it is already taken): a reply
    /// encoded into a new `Vec` each cost an allocation and a free per shake.
    fn take_scratch(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.scratch)
    }

    /// Gives the encoding buffer back, emptied; a rare large one is not kept.
    fn give_scratch(&mut self, bytes: Vec<u8>) {
        if let Some(bytes) = reusable(bytes) {
            self.scratch = bytes;
        }
    }
}

/// A worker buffer (`scratch`, `corked`) emptied for reuse, or none if it grew past
/// `KEPT_BUFFER` for a rare large answer.
fn reusable(mut bytes: Vec<u8>) -> Option<Vec<u8>> {
    bytes.clear();
    (bytes.capacity() <= KEPT_BUFFER).then_some(bytes)
}
