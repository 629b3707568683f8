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
//! - `conn`: the connection record and writing, kicking, closing;
//! - `codec`: the wire seam — binary frames, WebSocket; `http`: HTTP on the listener;
//! - `handler`: requests → logins, admission, the shake pool, the link; `cap`: the
//!   shake cap under overload;
//! - `broadcast`: operator broadcasts, a slice of connections per turn.

mod broadcast;
mod cap;
mod codec;
mod conn;
mod handler;
mod http;

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hongbao_money::{ConnId, Reply, WorkerId};
use hongbao_proto::KickReason;
use hongbao_sys::{limits, net, usage};
use mio::net::{TcpListener, UnixStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::link::{self, ToCore, ToWorker, WorkerConfig};
use crate::stats::WorkerStats;
use broadcast::{BroadcastJob, Pacer};
use codec::{Codec, Cx, Idle, Then};
use conn::{Conn, State, CLOSING_GRACE_SECS};
use handler::{Admission, Backoff};
use http::HttpCodec;

const LINK: Token = Token(usize::MAX - 1);
/// Listener `i` has token `LISTENERS - i`.
const LISTENERS: usize = usize::MAX - 2;
/// Bytes read per `read` call into the worker's shared buffer.
const READ_BUF: usize = 64 * 1024;
/// Reads one connection may do per readiness event before others get a turn.
const READS_PER_TURN: usize = 4;
/// A claim unanswered this long is forgotten (its connection closed).
const CLAIM_FORGET_SECS: u64 = 30;

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
    /// Connections that hit `READS_PER_TURN` and still have input waiting.
    again: Vec<usize>,
    link: UnixStream,
    link_in: Vec<u8>,
    link_out: Vec<u8>,
    pool: VecDeque<(u64, u64)>,
    cfg: WorkerConfig,
    started: Instant,
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
    /// Transport answers of the current decode step (reused).
    scratch: Vec<u8>,
    /// Connections not yet logged in (binary frames, upgraded WebSockets), by slab key,
    /// with their source address; and how many each source has.
    unauthenticated: HashMap<usize, IpAddr>,
    per_source: HashMap<IpAddr, u32>,
    shutdown: bool,
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Time until 20 ms past the next whole Unix second.
fn until_next_second() -> Duration {
    let into = unix_now().subsec_millis() as u64;
    Duration::from_millis((1000 - into) + 20)
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
        again: Vec::new(),
        link,
        link_in,
        link_out: Vec::new(),
        pool: VecDeque::new(),
        cfg,
        started: Instant::now(),
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
        latency: hongbao_telemetry::sample::new_histogram(),
        claims: HashMap::new(),
        received: None,
        scratch: Vec::new(),
        unauthenticated: HashMap::new(),
        per_source: HashMap::new(),
        shutdown: false,
    };
    for msg in early {
        worker.on_core_message(msg);
    }
    worker.event_loop()
}

/// Waits for the supervisor's welcome. Returns it with whatever came right behind it in
/// the same reads (packets may already be dealt to us): the messages, and the bytes of
/// one not yet whole.
fn read_welcome(
    mut stream: &std::os::unix::net::UnixStream,
) -> anyhow::Result<(WorkerConfig, Vec<ToWorker>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut welcome = None;
    let mut early = Vec::new();
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            anyhow::bail!("the core closed the link before welcoming this worker");
        }
        buf.extend_from_slice(&chunk[..n]);
        link::decode_all::<ToWorker>(&mut buf, |m| match m {
            ToWorker::Welcome(cfg) if welcome.is_none() => welcome = Some(cfg),
            other => early.push(other),
        })
        .map_err(anyhow::Error::msg)?;
        if let Some(cfg) = welcome {
            return Ok((cfg, early, buf));
        }
    }
}

impl Worker {
    fn now_s(&self) -> u32 {
        self.started.elapsed().as_secs() as u32
    }

    fn event_loop(&mut self) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut read_buf = vec![0u8; READ_BUF];
        // Ticks fall just after each whole wall-clock second, in every worker alike, so the
        // per-second counters of all workers describe the same second.
        let mut next_tick = Instant::now() + until_next_second();
        while !self.shutdown {
            let until_tick = next_tick.saturating_duration_since(Instant::now());
            let timeout = if self.again.is_empty() {
                self.broadcast_wait()
                    .map_or(until_tick, |w| w.min(until_tick))
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            for event in events.iter() {
                match event.token() {
                    LINK => self.on_link(event.is_readable())?,
                    Token(t) if t > LISTENERS - self.listeners.len() && t <= LISTENERS => {
                        self.accept(LISTENERS - t)
                    }
                    Token(key) => {
                        if event.is_writable() {
                            self.flush_conn(key);
                        }
                        let closing = event.is_read_closed() || event.is_error();
                        if event.is_readable() || closing {
                            self.on_readable(key, &mut read_buf, closing);
                        }
                    }
                }
            }
            for key in std::mem::take(&mut self.again) {
                self.on_readable(key, &mut read_buf, true);
            }
            self.broadcast_slice();
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + until_next_second();
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

    // ----- connections ----------------------------------------------------------------

    fn accept(&mut self, i: usize) {
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

    /// Reads what a connection sent, at most `READS_PER_TURN` buffers a turn. A short
    /// read emptied the socket and ends it (epoll, edge-triggered, says when more
    /// arrives: reading on only to hear "would block" would cost a system call per
    /// request) — unless `drain`: the event said the peer closed or the socket failed, or
    /// the connection is back from `again`; then it reads on to "would block".
    fn on_readable(&mut self, key: usize, buf: &mut [u8], drain: bool) {
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
                conn.last_seen = self.started.elapsed().as_secs() as u32;
            }
            let mut partial = conn.take_partial();
            let rest = if partial.is_empty() {
                let used = self.input(key, &mut buf[..n]);
                buf[used..n].to_vec()
            } else {
                partial.extend_from_slice(&buf[..n]);
                let used = self.input(key, &mut partial);
                partial.drain(..used);
                partial
            };
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
            let mut out = std::mem::take(&mut self.scratch);
            let mut cx = Cx {
                out: &mut out,
                stats: &mut self.stats.counters,
                cfg: &self.cfg,
                now: self.started.elapsed().as_secs() as u32,
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
                out.clear();
            }
            self.scratch = out;
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

    // ----- the link to the supervisor ---------------------------------------------------

    fn tell_core(&mut self, msg: &ToCore) {
        link::encode(msg, &mut self.link_out);
    }

    fn on_link(&mut self, readable: bool) -> anyhow::Result<()> {
        if !readable {
            return Ok(());
        }
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.link.read(&mut chunk) {
                Ok(0) => {
                    // The core is gone: nothing we could acknowledge any more.
                    self.shutdown = true;
                    return Ok(());
                }
                Ok(n) => self.link_in.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let mut inbox = Vec::new();
        link::decode_all::<ToWorker>(&mut self.link_in, |m| inbox.push(m))
            .map_err(anyhow::Error::msg)?;
        for msg in inbox {
            self.on_core_message(msg);
        }
        Ok(())
    }

    fn on_core_message(&mut self, msg: ToWorker) {
        match msg {
            ToWorker::Deal { packets } => self.pool.extend(packets),
            ToWorker::Reply { conn, req, reply } => {
                if matches!(reply, Reply::Shake { .. }) {
                    if let Some(read_at) = self.claims.remove(&(conn, req)) {
                        self.record_latency(read_at);
                    }
                }
                if let Some(key) = self.key_of(conn) {
                    self.reply(key, req, &reply);
                    if let Some(c) = self.conns.get_mut(key) {
                        c.awaiting = c.awaiting.saturating_sub(1);
                    }
                    self.finish_draining(key);
                }
            }
            ToWorker::Push { conn, push, close } => {
                let Some(key) = self.key_of(conn) else {
                    return;
                };
                self.push(key, &push);
                if close {
                    // Presence already routed the user elsewhere: just close.
                    if self.conns[key].user.take().is_some() {
                        self.stats.levels.logged_in -= 1;
                    }
                    let reason = match push {
                        hongbao_money::Push::Kick { reason, .. } => reason,
                        _ => KickReason::Replaced,
                    };
                    self.goodbye(key, reason);
                }
            }
            ToWorker::Welcome(cfg) => self.cfg = cfg,
            ToWorker::Broadcast {
                id,
                server_time_us,
                text,
            } => self.start_broadcast(id, server_time_us, text),
            ToWorker::Shutdown => {
                // Tell every client why its connection is about to close.
                let open: Vec<usize> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.state == State::Open)
                    .map(|(key, _)| key)
                    .collect();
                for key in open {
                    self.kick(key, KickReason::Shutdown, "server shutting down");
                }
                self.shutdown = true;
            }
        }
    }

    fn flush_link(&mut self) -> anyhow::Result<()> {
        match net::write_nonblocking(&mut self.link, &self.link_out) {
            Ok(n) => {
                self.link_out.drain(..n);
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                self.shutdown = true;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    // ----- once a second --------------------------------------------------------------

    fn tick(&mut self) {
        if self.accept_paused {
            self.accept_paused = false;
            for i in 0..self.listeners.len() {
                self.accept(i);
            }
        }
        self.sweep();
        self.stats.unix_second = unix_now().as_secs();
        self.stats.levels.connections = self.conns.len() as u64;
        self.stats.levels.pool_packets = self.pool.len() as u64;
        self.stats.levels.shake_cap = self.cap.per_sec().into();
        let (rss, cpu) = usage::self_usage();
        self.stats.levels.rss_bytes = rss;
        self.stats.cpu_ms = cpu;
        self.stats.shake_latency_us = hongbao_telemetry::sample::sparse(&self.latency);
        self.latency.reset();
        // A claim whose connection went away is never answered.
        self.claims
            .retain(|_, read_at| read_at.elapsed() < Duration::from_secs(CLAIM_FORGET_SECS));
        let stats = ToCore::Stats(Box::new(self.stats.clone()));
        self.tell_core(&stats);
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
    fn may_upgrade(&self, key: usize) -> bool {
        if self.unauthenticated.len() >= self.cfg.max_unauthenticated as usize {
            return false;
        }
        self.per_source.is_empty()
            || (self.conns[key].stream.peer_addr())
                .is_ok_and(|peer| self.may_hold_unauthenticated(peer.ip()))
    }

    fn hold_unauthenticated(&mut self, key: usize, source: IpAddr) {
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

    /// Closes connections that never logged in, went silent, took too long with an HTTP
    /// request, or were kicked and linger.
    fn sweep(&mut self) {
        let now = self.now_s();
        let login_timeout = self.cfg.login_timeout_secs;
        let idle_timeout = self.cfg.idle_timeout_secs;
        let keepalive = self.cfg.http_keepalive_secs;
        let mut expired = Vec::new();
        for (key, c) in self.conns.iter() {
            let quiet = now.saturating_sub(c.last_seen);
            if c.state == State::Closing {
                if quiet >= CLOSING_GRACE_SECS {
                    expired.push((key, None));
                }
                continue;
            }
            if c.state == State::Draining {
                // Answers owed to a half-closed client that never came.
                if quiet as u64 >= CLAIM_FORGET_SECS {
                    expired.push((key, None));
                }
                continue;
            }
            // A request already waiting in the socket is not the client's delay but ours
            // (a starved worker during a connect storm): it will be read next turn.
            let unread = || net::has_input(c.stream.as_raw_fd());
            let why = match c.codec.idle() {
                // Counted from the connect: a request waiting unread may be ours to read,
                // but not for long.
                Idle::Session if c.user.is_none() => (quiet >= login_timeout
                    && (quiet >= 2 * login_timeout || !unread()))
                .then_some("no login"),
                Idle::Session => (idle_timeout > 0 && quiet >= idle_timeout).then_some("idle"),
                Idle::Http {
                    request_since: Some(since),
                    ..
                } => (now.saturating_sub(since) >= login_timeout && !unread())
                    .then_some("request not complete in time"),
                Idle::Http {
                    request_since: None,
                    answers_due,
                } => (!answers_due && keepalive > 0 && quiet >= keepalive).then_some("idle"),
            };
            if let Some(why) = why {
                expired.push((key, Some(why)));
            }
        }
        for (key, why) in expired {
            match why {
                Some(text) => {
                    self.stats.counters.kicks_idle += 1;
                    self.kick(key, KickReason::Idle, text);
                }
                None => self.close(key),
            }
        }
    }
}
