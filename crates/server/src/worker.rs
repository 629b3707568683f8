//! A gateway worker: one process, one event loop, one SET — its connections, its local
//! shake pool, its admission counter, its stats.
//!
//! Connections live in a slab of small records driven by mio, not in a task each: the
//! read buffer is shared by the whole worker, and a connection keeps bytes of its own
//! only while a frame is partial (`partial`) or while the kernel will not take what we
//! write (`out`). Losing shakes are answered here at memory speed; winning shakes, sends,
//! opens and chats go to the core over the link, and the core's answers come back as
//! ready-encoded bytes addressed to a `ConnId` (slab key + generation, so an answer for
//! a closed connection can never reach the next owner of its slot).

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hongbao_proto::ws::{self, Handshake, Incoming, Limits, Opcode, Role};
use hongbao_proto::{json, Frame, KickReason, Message, ResultCode};
use mio::net::{TcpListener, TcpStream, UnixStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::core::{ConnId, WorkerId};
use crate::link::{self, ToCore, ToWorker, WorkerConfig, WorkerStats};
use hongbao_sys::{limits, net, usage};

const LISTENER: Token = Token(usize::MAX - 1);
const LINK: Token = Token(usize::MAX - 2);
const WS_LISTENER: Token = Token(usize::MAX - 3);
/// Connections a broadcast is written to per turn of the loop, so shakes wait at most a
/// slice's worth of writes.
const BROADCAST_SLICE: usize = 256;
/// The browser client, served at `GET /` of the WebSocket address.
const PAGE: &str = include_str!("page.html");
/// Bytes read per `read` call into the worker's shared buffer.
const READ_BUF: usize = 64 * 1024;
/// Reads one connection may do per readiness event before others get a turn.
const READS_PER_TURN: usize = 4;
/// A claim unanswered this long is forgotten (its connection closed).
const CLAIM_FORGET_SECS: u64 = 30;
/// How long a kicked connection may take to read its kick before we close it.
const CLOSING_GRACE_SECS: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// Kick sent and write side shut: waiting for the peer to close, then we close.
    Closing,
}

/// How a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    /// Raw TCP: binary frames.
    Tcp,
    /// WebSocket listener, before the HTTP upgrade.
    WsHandshake,
    /// Upgraded, no message yet: nothing to push (we do not know its form).
    WsNew,
    /// WebSocket whose latest message was binary: frames in binary messages.
    WsBinary,
    /// WebSocket whose latest message was text: the JSON form.
    WsText,
}

/// One client connection. Kept small: this is what a million of cost.
struct Conn {
    stream: TcpStream,
    generation: u32,
    state: State,
    proto: Proto,
    /// A fragmented WebSocket message being assembled.
    ws: Option<Box<ws::Partial>>,
    /// Seconds since worker start of the last frame (or of the connect).
    last_seen: u32,
    user: u64,
    partial: Vec<u8>,
    out: Vec<u8>,
}

pub struct WorkerOptions {
    pub index: WorkerId,
    pub link: String,
    pub listen: SocketAddr,
    pub ws_listen: Option<SocketAddr>,
}

/// A broadcast being written out, a slice of connections at a time.
struct BroadcastJob {
    /// The frame as TCP bytes, in a binary WebSocket message, and in a text one.
    tcp: Vec<u8>,
    ws_binary: Vec<u8>,
    ws_text: Vec<u8>,
    next_key: usize,
    end_key: usize,
}

struct Worker {
    index: WorkerId,
    poll: Poll,
    listener: TcpListener,
    ws_listener: Option<TcpListener>,
    conns: Slab<Conn>,
    broadcasts: VecDeque<BroadcastJob>,
    /// Connections that hit `READS_PER_TURN` and still have input waiting.
    again: Vec<usize>,
    link: UnixStream,
    link_in: Vec<u8>,
    link_out: Vec<u8>,
    pool: VecDeque<(u64, u64)>,
    cfg: WorkerConfig,
    started: Instant,
    next_generation: u32,
    admission_second: u64,
    admission_used: u32,
    accept_paused: bool,
    /// Connections whose handshake finished before the listener had receive timestamps on
    /// (a client may connect between our listen() and the core's Welcome) did not inherit
    /// them: turn them on one by one until the first drain of each listener's accept
    /// queue (indexed by `websocket`).
    stamp_accept_backlog: [bool; 2],
    stats: WorkerStats,
    /// Shake latency of the current second (µs).
    latency: Histogram<u64>,
    /// When each shake waiting on the core for a win was read, by (connection, request).
    claims: HashMap<(ConnId, u32), Instant>,
    /// When the kernel received the newest bytes of the current read (wall clock).
    received: Option<Duration>,
    shutdown: bool,
}

fn now_s(started: Instant) -> u32 {
    started.elapsed().as_secs() as u32
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

fn conn_id(key: usize, generation: u32) -> ConnId {
    ((generation as u64) << 32) | key as u64
}

/// Runs a worker until the core tells it to stop or the link closes.
pub fn run(opts: WorkerOptions) -> anyhow::Result<()> {
    limits::raise_nofile_limit();
    // Listen before saying hello: the supervisor announces "ready" once every worker has
    // said hello, and a client connecting then must find a listener.
    let listener = TcpListener::from_std(net::reuseport_listener(opts.listen, true)?);
    let ws_listener = match opts.ws_listen {
        Some(addr) => Some(TcpListener::from_std(net::reuseport_listener(addr, true)?)),
        None => None,
    };
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
    let shedding = cfg.max_queue_ms > 0;
    if shedding {
        net::enable_receive_timestamps(&listener)?;
        if let Some(l) = &ws_listener {
            net::enable_receive_timestamps(l)?;
        }
    }
    std_link.set_nonblocking(true)?;

    let poll = Poll::new()?;
    let mut worker = Worker {
        index: opts.index,
        poll,
        listener,
        ws_listener,
        conns: Slab::new(),
        broadcasts: VecDeque::new(),
        again: Vec::new(),
        link: UnixStream::from_std(std_link),
        link_in,
        link_out: Vec::new(),
        pool: VecDeque::new(),
        cfg,
        started: Instant::now(),
        next_generation: 1,
        admission_second: 0,
        admission_used: 0,
        accept_paused: false,
        stamp_accept_backlog: [shedding; 2],
        stats: WorkerStats {
            worker: opts.index,
            pid: std::process::id(),
            ..Default::default()
        },
        latency: hongbao_telemetry::sample::new_histogram(),
        claims: HashMap::new(),
        received: None,
        shutdown: false,
    };
    worker
        .poll
        .registry()
        .register(&mut worker.listener, LISTENER, Interest::READABLE)?;
    if let Some(l) = worker.ws_listener.as_mut() {
        worker
            .poll
            .registry()
            .register(l, WS_LISTENER, Interest::READABLE)?;
    }
    worker.poll.registry().register(
        &mut worker.link,
        LINK,
        Interest::READABLE | Interest::WRITABLE,
    )?;
    for msg in early {
        worker.on_core_message(msg);
    }
    worker.event_loop()
}

/// Waits for the core's welcome. Returns it with whatever came right behind it in the
/// same reads (the core may already be dealing packets to us): the messages, and the
/// bytes of one not yet whole.
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

/// `frame` as a connection speaking `proto` reads it; `None` before a WebSocket's
/// first message, when its form is not known.
fn in_form(proto: Proto, frame: &Frame) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(48);
    match proto {
        Proto::Tcp => hongbao_proto::encode(frame, &mut bytes),
        Proto::WsBinary => {
            let inner = hongbao_proto::encode_to_vec(frame);
            ws::encode(Role::Server, Opcode::Binary, &inner, &mut bytes);
        }
        Proto::WsText => ws::encode(
            Role::Server,
            Opcode::Text,
            json::to_json(frame).as_bytes(),
            &mut bytes,
        ),
        Proto::WsHandshake | Proto::WsNew => return None,
    }
    Some(bytes)
}

impl Conn {
    /// Whether pushes reach this connection (a WebSocket needs its first message first).
    fn pushable(&self) -> bool {
        !matches!(self.proto, Proto::WsHandshake | Proto::WsNew)
    }
}

impl Worker {
    fn event_loop(&mut self) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut read_buf = vec![0u8; READ_BUF];
        // Ticks fall just after each whole wall-clock second, in every worker alike, so the
        // per-second counters of all workers describe the same second.
        let mut next_tick = Instant::now() + until_next_second();
        while !self.shutdown {
            let timeout = if self.again.is_empty() && self.broadcasts.is_empty() {
                next_tick.saturating_duration_since(Instant::now())
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
                    LISTENER => self.accept(false),
                    WS_LISTENER => self.accept(true),
                    LINK => self.on_link(event.is_readable())?,
                    Token(key) => {
                        if event.is_writable() {
                            self.flush_conn(key);
                        }
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.on_readable(key, &mut read_buf);
                        }
                    }
                }
            }
            for key in std::mem::take(&mut self.again) {
                self.on_readable(key, &mut read_buf);
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

    fn accept(&mut self, websocket: bool) {
        if self.accept_paused {
            return;
        }
        loop {
            let accepted = match (websocket, self.ws_listener.as_ref()) {
                (true, Some(l)) => l.accept(),
                (true, None) => return,
                (false, _) => self.listener.accept(),
            };
            match accepted {
                Ok((mut stream, _)) => {
                    self.stats.accepted += 1;
                    if self.conns.len() >= self.cfg.max_connections as usize {
                        self.stats.rejected += 1;
                        continue; // dropped: closes at once
                    }
                    let _ = stream.set_nodelay(true);
                    if self.stamp_accept_backlog[websocket as usize] {
                        let _ = net::enable_receive_timestamps(&stream);
                    }
                    let entry = self.conns.vacant_entry();
                    let key = entry.key();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(key), interest)
                        .is_err()
                    {
                        continue;
                    }
                    let generation = self.next_generation;
                    self.next_generation = self.next_generation.wrapping_add(1).max(1);
                    entry.insert(Conn {
                        stream,
                        generation,
                        state: State::Open,
                        proto: if websocket {
                            Proto::WsHandshake
                        } else {
                            Proto::Tcp
                        },
                        ws: None,
                        last_seen: now_s(self.started),
                        user: 0,
                        partial: Vec::new(),
                        out: Vec::new(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // Everything accepted from now on was born with the listener's option.
                    self.stamp_accept_backlog[websocket as usize] = false;
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

    fn on_readable(&mut self, key: usize, buf: &mut [u8]) {
        for _ in 0..READS_PER_TURN {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let read = if self.cfg.max_queue_ms > 0 {
                net::read_stamped(conn.stream.as_raw_fd(), buf)
            } else {
                conn.stream.read(buf).map(|n| (n, None))
            };
            let n = match read {
                Ok((0, _)) => return self.close(key),
                Ok((n, received)) => {
                    self.received = received;
                    n
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return self.close(key),
            };
            self.stats.bytes_in += n as u64;
            if conn.state == State::Closing {
                continue; // discard until the peer closes
            }
            conn.last_seen = now_s(self.started);
            if conn.partial.is_empty() {
                let used = self.input(key, &mut buf[..n]);
                if let Some(conn) = self.conns.get_mut(key) {
                    if used < n && conn.state == State::Open {
                        conn.partial.extend_from_slice(&buf[used..n]);
                    }
                }
            } else {
                let mut partial = std::mem::take(&mut conn.partial);
                partial.extend_from_slice(&buf[..n]);
                let used = self.input(key, &mut partial);
                if let Some(conn) = self.conns.get_mut(key) {
                    if used < partial.len() && conn.state == State::Open {
                        partial.drain(..used);
                        partial.shrink_to_fit();
                        conn.partial = partial;
                    }
                }
            }
        }
        self.again.push(key);
    }

    /// Handles what a connection sent; returns how many bytes it used (the rest is an
    /// incomplete frame or request, kept for the next read).
    fn input(&mut self, key: usize, data: &mut [u8]) -> usize {
        match self.conns[key].proto {
            Proto::Tcp => self.frames(key, data),
            Proto::WsHandshake => self.handshake(key, data),
            _ => self.ws_messages(key, data),
        }
    }

    /// Handles every whole frame at the front of `data`; returns how many bytes it used.
    fn frames(&mut self, key: usize, data: &[u8]) -> usize {
        let mut at = 0;
        while at < data.len() {
            match hongbao_proto::check(&data[at..]) {
                Ok(None) => break,
                Ok(Some(len)) => {
                    let bytes = &data[at..at + len];
                    at += len;
                    match hongbao_proto::decode(bytes) {
                        Ok(frame) => self.handle(key, frame),
                        Err(e) => self.bad_payload(key, &e),
                    }
                    if !self.is_open(key) {
                        return data.len();
                    }
                }
                Err(e) => {
                    self.stats.bad_frames += 1;
                    self.kick(key, KickReason::BadFrame, &e.to_string());
                    return data.len();
                }
            }
        }
        at
    }

    fn is_open(&self, key: usize) -> bool {
        self.conns.get(key).is_some_and(|c| c.state == State::Open)
    }

    /// A whole frame whose payload we could not read: an error reply, the connection stays.
    fn bad_payload(&mut self, key: usize, e: &hongbao_proto::FrameError) {
        self.stats.bad_requests += 1;
        let request_id = e.request_id().unwrap_or(0);
        let result = e.result_code().unwrap_or(ResultCode::BadRequest);
        self.reply(
            key,
            request_id,
            Message::Error {
                result,
                text: e.to_string(),
            },
        );
    }

    // ----- WebSocket --------------------------------------------------------------------

    /// The HTTP request on the WebSocket listener: an upgrade, the browser page, or a
    /// refusal.
    fn handshake(&mut self, key: usize, data: &mut [u8]) -> usize {
        match ws::accept(data) {
            Handshake::Partial => 0,
            Handshake::Upgrade { consumed, response } => {
                self.stats.ws_upgrades += 1;
                self.write(key, &response);
                let Some(conn) = self.conns.get_mut(key) else {
                    return data.len();
                };
                conn.proto = Proto::WsNew;
                consumed + self.ws_messages(key, &mut data[consumed..])
            }
            Handshake::NotWebSocket { method, path, .. } => {
                self.stats.http_requests += 1;
                let response = self.http(&method, &path);
                self.write(key, &response);
                self.hang_up(key);
                data.len()
            }
            Handshake::Reject { response, .. } => {
                self.stats.ws_rejected += 1;
                self.write(key, &response);
                self.hang_up(key);
                data.len()
            }
        }
    }

    /// Plain HTTP on the WebSocket address: the browser client and its demo log-in.
    fn http(&self, method: &str, path: &str) -> Vec<u8> {
        let (route, query) = path.split_once('?').unwrap_or((path, ""));
        match (method, route) {
            ("GET", "/") | ("GET", "/index.html") => {
                ws::http_response("200 OK", "text/html; charset=utf-8", PAGE.as_bytes())
            }
            ("GET", "/token") if self.cfg.demo_login => {
                let user = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("user="))
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|&u| u > 0);
                match user {
                    Some(user) => {
                        let token = hongbao_proto::token::token_hex(&self.cfg.secret, user);
                        let body = format!("{{\"user_id\":{user},\"token\":\"{token}\"}}");
                        ws::http_response("200 OK", "application/json", body.as_bytes())
                    }
                    None => ws::http_response(
                        "400 Bad Request",
                        "text/plain",
                        b"user must be a positive integer\n",
                    ),
                }
            }
            ("GET", _) => ws::http_response("404 Not Found", "text/plain", b"not found\n"),
            _ => ws::http_response(
                "405 Method Not Allowed",
                "text/plain",
                b"only GET, or a WebSocket upgrade\n",
            ),
        }
    }

    /// Closes once what is queued is written (for HTTP answers and WebSocket closes).
    fn hang_up(&mut self, key: usize) {
        if !self.conns.contains(key) {
            return; // the write before this closed it
        }
        self.leave(key);
        if let Some(conn) = self.conns.get_mut(key) {
            conn.state = State::Closing;
            conn.last_seen = now_s(self.started);
            conn.partial = Vec::new();
            conn.ws = None;
            if conn.out.is_empty() {
                let _ = conn.stream.shutdown(Shutdown::Write);
            }
        }
    }

    /// Every whole WebSocket message at the front of `data`.
    fn ws_messages(&mut self, key: usize, data: &mut [u8]) -> usize {
        enum In {
            Frame(Result<Frame, hongbao_proto::FrameError>, Proto),
            Json(Result<Frame, json::JsonError>),
            Ping(Vec<u8>),
            Close(Option<u16>),
        }
        let mut inbox = Vec::new();
        let mut partial = self.conns[key].ws.take();
        let decoded = ws::decode(Role::Server, data, &mut partial, Limits::HONGBAO, |m| {
            inbox.push(match m {
                Incoming::Binary(bytes) => In::Frame(hongbao_proto::decode(bytes), Proto::WsBinary),
                Incoming::Text(text) => In::Json(json::from_json(text)),
                Incoming::Ping(payload) => In::Ping(payload.to_vec()),
                Incoming::Pong(_) => return,
                Incoming::Close { code, .. } => In::Close(code),
            })
        });
        if let Some(conn) = self.conns.get_mut(key) {
            conn.ws = partial;
        }
        for m in inbox {
            if !self.is_open(key) {
                return data.len();
            }
            match m {
                In::Frame(frame, form) => {
                    self.conns[key].proto = form;
                    match frame {
                        Ok(frame) => self.handle(key, frame),
                        Err(e) if e.is_fatal() => {
                            self.stats.bad_frames += 1;
                            self.kick(key, KickReason::BadFrame, &e.to_string());
                        }
                        Err(e) => self.bad_payload(key, &e),
                    }
                }
                In::Json(frame) => {
                    self.conns[key].proto = Proto::WsText;
                    match frame {
                        Ok(frame) => self.handle(key, frame),
                        Err(e) => {
                            self.stats.bad_requests += 1;
                            let reply = Message::Error {
                                result: e.result_code(),
                                text: e.to_string(),
                            };
                            self.reply(key, e.request_id.unwrap_or(0), reply);
                        }
                    }
                }
                In::Ping(payload) => {
                    let mut pong = Vec::with_capacity(payload.len() + 2);
                    ws::encode(Role::Server, Opcode::Pong, &payload, &mut pong);
                    self.write(key, &pong);
                }
                In::Close(code) => {
                    let mut close = Vec::new();
                    match code {
                        Some(code) => ws::close_frame(Role::Server, code, "", &mut close),
                        None => ws::encode(Role::Server, Opcode::Close, &[], &mut close),
                    }
                    self.write(key, &close);
                    self.hang_up(key);
                    return data.len();
                }
            }
        }
        match decoded {
            Ok(used) => used,
            Err(v) => {
                self.stats.bad_frames += 1;
                let mut close = Vec::new();
                ws::close_frame(Role::Server, v.code, v.reason, &mut close);
                self.write(key, &close);
                self.hang_up(key);
                data.len()
            }
        }
    }

    // ----- broadcast --------------------------------------------------------------------

    fn start_broadcast(&mut self, id: u64, server_time_us: u64, text: String) {
        self.stats.broadcasts += 1;
        let frame = Frame {
            request_id: 0,
            message: Message::Broadcast {
                server_time_us,
                text,
            },
        };
        let form = |proto| in_form(proto, &frame).expect("an upgraded form");
        let (tcp, ws_binary, ws_text) =
            (form(Proto::Tcp), form(Proto::WsBinary), form(Proto::WsText));
        let connections = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Open && c.pushable())
            .count() as u64;
        self.tell_core(&ToCore::BroadcastTaken { id, connections });
        self.broadcasts.push_back(BroadcastJob {
            tcp,
            ws_binary,
            ws_text,
            next_key: 0,
            end_key: self.conns.capacity(),
        });
    }

    /// Writes the oldest broadcast to the next slice of connections.
    fn broadcast_slice(&mut self) {
        let Some(mut job) = self.broadcasts.pop_front() else {
            return;
        };
        let mut visited = 0;
        while job.next_key < job.end_key && visited < BROADCAST_SLICE {
            let key = job.next_key;
            job.next_key += 1;
            let Some(conn) = self.conns.get(key) else {
                continue;
            };
            visited += 1;
            if conn.state != State::Open {
                continue;
            }
            let bytes = match conn.proto {
                Proto::Tcp => &job.tcp,
                Proto::WsBinary => &job.ws_binary,
                Proto::WsText => &job.ws_text,
                Proto::WsHandshake | Proto::WsNew => continue,
            };
            self.stats.broadcast_delivered += 1;
            self.write(key, bytes);
        }
        if job.next_key < job.end_key {
            self.broadcasts.push_front(job);
        }
    }

    fn handle(&mut self, key: usize, frame: Frame) {
        let req = frame.request_id;
        let (user, generation) = {
            let c = &self.conns[key];
            (c.user, c.generation)
        };
        let conn = conn_id(key, generation);
        match frame.message {
            Message::Ping { client_time_us } => {
                self.stats.pings += 1;
                let server_time_us = unix_now().as_micros() as u64;
                self.reply(
                    key,
                    req,
                    Message::Pong {
                        client_time_us,
                        server_time_us,
                    },
                );
            }
            Message::Login { user_id, token } => self.login(key, req, user_id, &token),
            _ if user == 0 && frame.message.is_client_kind() => {
                self.stats.not_logged_in += 1;
                let text = "log in first".to_string();
                self.reply(
                    key,
                    req,
                    Message::Error {
                        result: ResultCode::NotLoggedIn,
                        text,
                    },
                );
            }
            Message::Shake => self.shake(key, req, user, conn),
            Message::Send {
                amount_cents,
                shares,
                recipients,
            } => {
                self.stats.sends += 1;
                self.tell_core(&ToCore::Send {
                    conn,
                    req,
                    user,
                    amount_cents,
                    shares,
                    recipients,
                });
            }
            Message::Open { packet_id } => {
                self.stats.opens += 1;
                self.tell_core(&ToCore::Open {
                    conn,
                    req,
                    user,
                    packet: packet_id,
                });
            }
            Message::Chat { to_user, text } => {
                self.stats.chats += 1;
                self.tell_core(&ToCore::Chat {
                    conn,
                    req,
                    user,
                    to_user,
                    text,
                });
            }
            other => {
                self.stats.bad_requests += 1;
                let text = format!("message type {:#04x} is sent by servers only", other.kind());
                self.reply(
                    key,
                    req,
                    Message::Error {
                        result: ResultCode::BadRequest,
                        text,
                    },
                );
            }
        }
    }

    fn login(&mut self, key: usize, req: u32, user_id: u64, token: &[u8]) {
        if user_id == 0 || !hongbao_proto::token::verify(&self.cfg.secret, user_id, token) {
            self.stats.login_failures += 1;
            let reply = Message::LoginReply {
                result: ResultCode::BadToken,
                user_id,
            };
            self.reply(key, req, reply);
            return self.kick(key, KickReason::BadToken, "bad token");
        }
        self.stats.logins += 1;
        let conn = &mut self.conns[key];
        let previous = std::mem::replace(&mut conn.user, user_id);
        let id = conn_id(key, conn.generation);
        if previous != 0 && previous != user_id {
            self.tell_core(&ToCore::Offline {
                conn: id,
                user: previous,
            });
        }
        if previous == 0 {
            self.stats.logged_in += 1;
        }
        // The core answers: it must own the route before the client hears "ok", or a
        // second login elsewhere could reach the core first and be the one replaced.
        self.tell_core(&ToCore::Online {
            conn: id,
            req,
            user: user_id,
        });
    }

    fn shake(&mut self, key: usize, req: u32, user: u64, conn: ConnId) {
        let read_at = Instant::now();
        self.stats.shakes += 1;
        let now = unix_now();
        if now.as_secs() != self.admission_second {
            self.admission_second = now.as_secs();
            self.admission_used = 0;
        }
        // A shake that waited in the kernel longer than `max_queue_ms` means the machine
        // is not keeping up: shed it (and the clients back off) rather than let every
        // queue behind it grow.
        let waited = self
            .received
            .map_or(Duration::ZERO, |r| now.saturating_sub(r));
        let late = self.cfg.max_queue_ms > 0
            && waited > Duration::from_millis(self.cfg.max_queue_ms.into());
        if late {
            self.stats.shakes_shed_late += 1;
        }
        if late || self.admission_used >= self.cfg.max_shakes_per_sec {
            self.stats.shakes_overloaded += 1;
            let reply = Message::ShakeReply {
                result: ResultCode::Overloaded,
                packet_id: 0,
                amount_cents: 0,
            };
            self.reply(key, req, reply);
            return self.record_latency(read_at);
        }
        self.admission_used += 1;
        match self.pool.pop_front() {
            Some((packet, _amount)) => {
                // Only the core may say "won": it commits the win to the ledger first.
                self.stats.shakes_won_claimed += 1;
                self.claims.insert((conn, req), read_at);
                self.tell_core(&ToCore::Claim {
                    conn,
                    req,
                    user,
                    packet,
                });
            }
            None => {
                self.stats.shakes_nothing += 1;
                let reply = Message::ShakeReply {
                    result: ResultCode::Nothing,
                    packet_id: 0,
                    amount_cents: 0,
                };
                self.reply(key, req, reply);
                self.record_latency(read_at);
            }
        }
    }

    fn record_latency(&mut self, since: Instant) {
        let us = since.elapsed().as_micros().max(1) as u64;
        self.latency.saturating_record(us);
    }

    fn reply(&mut self, key: usize, request_id: u32, message: Message) {
        let frame = Frame {
            request_id,
            message,
        };
        let Some(conn) = self.conns.get(key) else {
            return;
        };
        if let Some(bytes) = in_form(conn.proto, &frame) {
            self.write(key, &bytes);
        }
    }

    /// Writes a frame the core encoded, in the connection's form.
    fn deliver(&mut self, key: usize, frame_bytes: &[u8]) {
        let Some(conn) = self.conns.get(key) else {
            return;
        };
        match conn.proto {
            Proto::Tcp => self.write(key, frame_bytes),
            Proto::WsBinary => {
                let mut bytes = Vec::with_capacity(frame_bytes.len() + 4);
                ws::encode(Role::Server, Opcode::Binary, frame_bytes, &mut bytes);
                self.write(key, &bytes);
            }
            Proto::WsText => {
                let text = hongbao_proto::decode(frame_bytes)
                    .ok()
                    .and_then(|frame| in_form(Proto::WsText, &frame));
                if let Some(bytes) = text {
                    self.write(key, &bytes);
                }
            }
            Proto::WsHandshake | Proto::WsNew => {}
        }
    }

    /// Writes at once when nothing is queued; queues what the kernel will not take; closes
    /// a connection whose queue grows past the limit (a client that does not read).
    fn write(&mut self, key: usize, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let mut written = 0;
        if conn.out.is_empty() {
            match net::write_nonblocking(&mut conn.stream, bytes) {
                Ok(n) => written = n,
                Err(_) => return self.close(key),
            }
        }
        self.stats.bytes_out += written as u64;
        if written < bytes.len() {
            conn.out.extend_from_slice(&bytes[written..]);
            if conn.out.len() > self.cfg.max_output_bytes as usize {
                self.stats.kicks_slow_reader += 1;
                self.close(key);
            }
        }
    }

    fn flush_conn(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.out.is_empty() {
            return;
        }
        let Ok(written) = net::write_nonblocking(&mut conn.stream, &conn.out) else {
            return self.close(key);
        };
        self.stats.bytes_out += written as u64;
        conn.out.drain(..written);
        if conn.out.is_empty() {
            conn.out = Vec::new();
            if conn.state == State::Closing {
                let _ = conn.stream.shutdown(Shutdown::Write);
            }
        }
    }

    /// Tells the client why, then closes once it has read that (or after a grace period).
    fn kick(&mut self, key: usize, reason: KickReason, text: &str) {
        self.reply(
            key,
            0,
            Message::Kick {
                reason,
                text: text.to_string(),
            },
        );
        self.ws_close_for_kick(key, reason);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.ws = None;
        conn.state = State::Closing;
        conn.last_seen = now_s(self.started);
        conn.partial = Vec::new();
        if conn.out.is_empty() {
            let _ = conn.stream.shutdown(Shutdown::Write);
        }
        self.leave(key);
    }

    /// The connection's user goes offline (its socket may linger in `Closing`).
    fn leave(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let user = std::mem::take(&mut conn.user);
        if user != 0 {
            let id = conn_id(key, conn.generation);
            self.stats.logged_in -= 1;
            self.tell_core(&ToCore::Offline { conn: id, user });
        }
    }

    fn close(&mut self, key: usize) {
        if !self.conns.contains(key) {
            return;
        }
        self.leave(key);
        let mut conn = self.conns.remove(key);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.stats.closed += 1;
    }

    // ----- the link to the core -------------------------------------------------------

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
            ToWorker::ToConn { conn, bytes, close } => {
                if !self.claims.is_empty() {
                    let req = hongbao_proto::frame::request_id_of(&bytes);
                    if let Some(read_at) = self.claims.remove(&(conn, req)) {
                        self.record_latency(read_at);
                    }
                }
                let key = (conn & 0xFFFF_FFFF) as usize;
                let generation = (conn >> 32) as u32;
                if self
                    .conns
                    .get(key)
                    .is_some_and(|c| c.generation == generation && c.state == State::Open)
                {
                    self.deliver(key, &bytes);
                    if close {
                        // The core already routed the user elsewhere; just close.
                        if let Some(c) = self.conns.get_mut(key) {
                            c.user = 0;
                            self.stats.logged_in -= 1;
                        }
                        self.ws_close_for_kick(key, KickReason::Replaced);
                        self.kick_closing(key);
                    }
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

    /// A WebSocket's close frame after its kick: 1001 for a shutdown, 1008 otherwise,
    /// with the kick reason's name.
    fn ws_close_for_kick(&mut self, key: usize, reason: KickReason) {
        let upgraded = self
            .conns
            .get(key)
            .is_some_and(|c| !matches!(c.proto, Proto::Tcp | Proto::WsHandshake));
        if upgraded {
            let code = match reason {
                KickReason::Shutdown => ws::close_code::GOING_AWAY,
                _ => ws::close_code::POLICY,
            };
            let mut close = Vec::new();
            ws::close_frame(Role::Server, code, reason.name(), &mut close);
            self.write(key, &close);
        }
    }

    /// Like `kick`, for a connection whose kick frame is already written.
    fn kick_closing(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.state = State::Closing;
        conn.last_seen = now_s(self.started);
        if conn.out.is_empty() {
            let _ = conn.stream.shutdown(Shutdown::Write);
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
            self.accept(false);
            self.accept(true);
        }
        self.sweep();
        self.stats.unix_second = unix_now().as_secs();
        self.stats.connections = self.conns.len() as u64;
        self.stats.pool_packets = self.pool.len() as u64;
        let (rss, cpu) = usage::self_usage();
        self.stats.rss_bytes = rss;
        self.stats.cpu_ms = cpu;
        self.stats.shake_latency_us = hongbao_telemetry::sample::sparse(&self.latency);
        self.latency.reset();
        // A claim whose connection went away is never answered.
        self.claims
            .retain(|_, read_at| read_at.elapsed() < Duration::from_secs(CLAIM_FORGET_SECS));
        let stats = ToCore::Stats(Box::new(self.stats.clone()));
        self.tell_core(&stats);
    }

    /// Closes connections that never logged in, went silent, or were kicked and linger.
    fn sweep(&mut self) {
        let now = now_s(self.started);
        let login_timeout = self.cfg.login_timeout_secs;
        let idle_timeout = self.cfg.idle_timeout_secs;
        let mut expired = Vec::new();
        for (key, c) in self.conns.iter() {
            let quiet = now.saturating_sub(c.last_seen);
            match c.state {
                State::Closing if quiet >= CLOSING_GRACE_SECS => expired.push((key, None)),
                // A login already waiting in the socket is not the client's delay but ours
                // (a starved worker during a connect storm): it will be read next turn.
                State::Open
                    if c.user == 0
                        && quiet >= login_timeout
                        && !net::has_input(c.stream.as_raw_fd()) =>
                {
                    expired.push((key, Some("no login")))
                }
                State::Open if c.user != 0 && idle_timeout > 0 && quiet >= idle_timeout => {
                    expired.push((key, Some("idle")))
                }
                _ => {}
            }
        }
        for (key, why) in expired {
            match why {
                Some(text) => {
                    self.stats.kicks_idle += 1;
                    self.kick(key, KickReason::Idle, text);
                }
                None => self.close(key),
            }
        }
    }
}
