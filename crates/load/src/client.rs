//! One load client process: holds the connections of its slice of the simulated users and
//! fires their shakes when the shared schedule says so.
//!
//! Like the server's workers it is one mio loop over a vector of small per-user records,
//! with one read buffer for the whole process. Connections are opened at a bounded rate
//! from many loopback source addresses (IP_BIND_ADDRESS_NO_PORT, so the kernel picks the
//! port per 4-tuple and one address is not limited to ~64K connections overall). Latency
//! is measured from each firing's intended send time, so a stall in this process or in
//! the server shows up as latency instead of silently thinning the load. Commands arrive
//! as JSON lines on stdin; reports leave as JSON lines on stdout, once a second.
//!
//! The transport is a parameter of the one loop (`transport.rs`): over WebSocket a
//! connection first upgrades, then carries the same frames in masked binary messages;
//! everything after the upgrade (login, shakes, opens, counters) is the same code.
//! Broadcasts are timed against the server's stamp and reported per broadcast
//! (`broadcast.rs`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use hongbao_proto::{ws, Frame, Message, ResultCode};
use hongbao_sys::net::write_nonblocking;
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rand::Rng;
use serde::{Deserialize, Serialize};
use socket2::{Domain, Socket, Type};

use crate::broadcast::Receipts;
use crate::report::{self, Counters, Report, UserTotals};
use crate::schedule::{partition, Firing, Schedule};
use crate::transport::{self, Inbound, Transport};

const STDIN: Token = Token(usize::MAX - 1);
const CONNECT_TIMEOUT_MS: u64 = 10_000;
const MAX_BACKOFF_MS: u64 = 5_000;
/// A user's unsent output past this means the server is not reading: drop and reconnect.
const MAX_OUTPUT: usize = 64 * 1024;

/// Everything a client process needs, passed by the coordinator on its command line as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientOptions {
    pub proc_index: u32,
    pub procs: u32,
    pub server: SocketAddr,
    /// All users of the run (U) and the id of user index 0.
    pub users: u64,
    pub first_user: u64,
    pub qps: u64,
    /// Unix time (ms) of schedule second 0, shared by all processes.
    pub epoch_ms: u64,
    /// Source addresses this process binds its connections to, round-robin.
    pub source_ips: Vec<Ipv4Addr>,
    /// New connections per second for this process.
    pub connect_rate: u64,
    pub secret: String,
    /// Unix ms from which to start connecting (0: at once).
    pub connect_from_ms: u64,
    /// Raw TCP, or WebSocket to the server's `--ws-listen` address.
    #[serde(default)]
    pub transport: Transport,
    /// A user answered "overloaded" skips its shakes for this many seconds (±50%), as the
    /// app does ("too many people, try again shortly"); 0 keeps shaking.
    #[serde(default)]
    pub overload_backoff_secs: u32,
}

/// Commands from the coordinator, one JSON object per stdin line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    SetQps { from_second: u64, qps: u64 },
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Connecting,
    /// WebSocket only: connected, the upgrade request sent, waiting for the 101.
    Upgrading,
    LoggingIn,
    Ready,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Shake,
    Open,
}

#[derive(Debug, Clone, Copy)]
struct Inflight {
    request_id: u32,
    kind: Kind,
    intended_us: u64,
    packet: u64,
}

/// One simulated user. Kept small: a client process holds up to hundreds of thousands of
/// these, and a user keeps bytes in `partial` (a message cut by a read; during an
/// upgrade, the answer so far) and `out` only while there is something in them.
struct User {
    stream: Option<TcpStream>,
    state: State,
    attempt: u8,
    next_request: u32,
    /// Unix ms. Connecting or upgrading: when the attempt began (for the connect timeout).
    /// Ready: until when the user backs off after an "overloaded" (in the past: not).
    since_ms: u64,
    partial: Vec<u8>,
    out: Vec<u8>,
    inflight: Vec<Inflight>,
    /// A fragmented WebSocket message being assembled (the gateway never fragments).
    fragment: Option<Box<ws::Partial>>,
}

struct Client {
    opts: ClientOptions,
    poll: Poll,
    schedule: Schedule,
    first_index: u64,
    users: Vec<User>,
    next_initial: usize,
    retry: BinaryHeap<Reverse<(u64, u32)>>,
    connect_tokens: f64,
    last_refill_ms: u64,
    source_cursor: usize,
    token_cache: HashMap<u64, [u8; 32]>,
    /// Opens asked for, per (user, packet): true once counted as opened.
    opens: HashMap<(u64, u64), bool>,
    totals: HashMap<u64, UserTotals>,
    counters: Counters,
    /// WebSocket keys of the upgrades in flight, by user index: only until the 101.
    handshakes: HashMap<u32, [u8; 16]>,
    receipts: Receipts,
    shake_hist: Histogram<u64>,
    open_hist: Histogram<u64>,
    /// How late shakes went out against their intended send time (this process's lag).
    lag_hist: Histogram<u64>,
    connected: u64,
    logged_in: u64,
    stdin_buf: Vec<u8>,
    stop: bool,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

/// Runs one client process until told to stop (or its stdin closes).
pub fn run(opts: ClientOptions) -> anyhow::Result<()> {
    hongbao_sys::limits::raise_nofile_limit();
    let range = partition(opts.users, opts.procs, opts.proc_index);
    let poll = Poll::new()?;
    let users = (range.start..range.end)
        .map(|_| User {
            stream: None,
            state: State::Idle,
            attempt: 0,
            next_request: 1,
            since_ms: 0,
            partial: Vec::new(),
            out: Vec::new(),
            inflight: Vec::new(),
            fragment: None,
        })
        .collect();
    set_nonblocking(0);
    poll.registry()
        .register(&mut SourceFd(&0), STDIN, Interest::READABLE)?;
    let mut client = Client {
        schedule: Schedule::new(opts.users, opts.qps),
        first_index: range.start,
        opts,
        poll,
        users,
        next_initial: 0,
        retry: BinaryHeap::new(),
        connect_tokens: 0.0,
        last_refill_ms: unix_us() / 1000,
        source_cursor: 0,
        token_cache: HashMap::new(),
        opens: HashMap::new(),
        totals: HashMap::new(),
        counters: Counters::default(),
        handshakes: HashMap::new(),
        receipts: Receipts::default(),
        shake_hist: report::new_histogram(),
        open_hist: report::new_histogram(),
        lag_hist: report::new_histogram(),
        connected: 0,
        logged_in: 0,
        stdin_buf: Vec::new(),
        stop: false,
    };
    client.event_loop()
}

impl Client {
    fn event_loop(&mut self) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(4096);
        let mut read_buf = vec![0u8; 64 * 1024];
        let mut firings: Vec<Firing> = Vec::new();
        let mut next_firing = 0usize;
        let epoch_us = self.opts.epoch_ms * 1000;
        // The second whose firings are loaded; the report for it goes out when it ends.
        let mut second = unix_us().saturating_sub(epoch_us) / 1_000_000;
        let mut firings_loaded = false;
        while !self.stop {
            let now = unix_us();
            let current = now.saturating_sub(epoch_us) / 1_000_000;
            if now < epoch_us {
                // Before the epoch: nothing fires yet.
            } else {
                if current > second || !firings_loaded {
                    if firings_loaded {
                        // Fire what is left of the second we were in (late, and measured so).
                        self.fire(&firings[next_firing..], epoch_us + second * 1_000_000, now);
                        self.report(second, false);
                        second += 1;
                        // Seconds skipped entirely (a long stall) are fired late, not dropped.
                        while second < current {
                            self.load_firings(second, &mut firings);
                            self.fire(&firings, epoch_us + second * 1_000_000, now);
                            self.report(second, false);
                            second += 1;
                        }
                    }
                    second = second.max(current);
                    self.load_firings(second, &mut firings);
                    next_firing = 0;
                    firings_loaded = true;
                }
                let base = epoch_us + second * 1_000_000;
                let due = firings[next_firing..]
                    .iter()
                    .take_while(|f| base + f.offset_ns as u64 / 1000 <= now)
                    .count();
                self.fire(&firings[next_firing..next_firing + due], base, now);
                next_firing += due;
            }
            if now >= self.opts.connect_from_ms * 1000 {
                self.start_connects(now / 1000);
            } else {
                self.last_refill_ms = now / 1000;
            }

            let now = unix_us();
            let next_at = if !firings_loaded {
                epoch_us.min(now + 10_000)
            } else if let Some(f) = firings.get(next_firing) {
                epoch_us + second * 1_000_000 + f.offset_ns as u64 / 1000
            } else {
                epoch_us + (second + 1) * 1_000_000
            };
            let wait_us = next_at.saturating_sub(now).min(10_000);
            let timeout = Duration::from_micros(wait_us);
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e.into());
                }
            }
            for event in events.iter() {
                match event.token() {
                    STDIN => self.read_commands(),
                    Token(i) => {
                        if event.is_writable() {
                            self.on_writable(i);
                        }
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.on_readable(i, &mut read_buf);
                        }
                    }
                }
            }
            self.check_connect_timeouts();
        }
        self.report(second, true);
        Ok(())
    }

    fn load_firings(&self, second: u64, out: &mut Vec<Firing>) {
        out.clear();
        let end = self.first_index + self.users.len() as u64;
        self.schedule.firings(second, self.first_index..end, out);
    }

    fn user_id(&self, i: usize) -> u64 {
        self.opts.first_user + self.first_index + i as u64
    }

    // ----- sending ---------------------------------------------------------------------

    /// Sends the shakes of `firings` (offsets from `base_us`) at `now_us`, recording how
    /// late each went out against its intended time.
    fn fire(&mut self, firings: &[Firing], base_us: u64, now_us: u64) {
        for f in firings {
            let i = (f.user_index - self.first_index) as usize;
            let intended_us = base_us + f.offset_ns as u64 / 1000;
            if self.users[i].state != State::Ready {
                self.counters.skipped_not_ready += 1;
                continue;
            }
            if self.users[i].since_ms * 1000 > intended_us {
                self.counters.backed_off += 1;
                continue;
            }
            self.counters.shakes_sent += 1;
            let _ = self
                .lag_hist
                .record(now_us.saturating_sub(intended_us).max(1));
            self.request(i, Message::Shake, Kind::Shake, intended_us, 0);
        }
    }

    fn request(&mut self, i: usize, message: Message, kind: Kind, intended_us: u64, packet: u64) {
        let user = &mut self.users[i];
        let request_id = user.next_request;
        user.next_request = user.next_request.wrapping_add(1).max(1);
        user.inflight.push(Inflight {
            request_id,
            kind,
            intended_us,
            packet,
        });
        self.send(
            i,
            &Frame {
                request_id,
                message,
            },
        );
    }

    fn send(&mut self, i: usize, frame: &Frame) {
        let mut bytes = Vec::with_capacity(64);
        transport::encode(self.opts.transport, frame, &mut bytes);
        self.write(i, &bytes);
    }

    fn write(&mut self, i: usize, bytes: &[u8]) {
        let user = &mut self.users[i];
        let Some(stream) = user.stream.as_mut() else {
            return;
        };
        let mut written = 0;
        if user.out.is_empty() {
            match write_nonblocking(stream, bytes) {
                Ok(n) => written = n,
                Err(_) => return self.lost(i),
            }
        }
        if written < bytes.len() {
            user.out.extend_from_slice(&bytes[written..]);
            if user.out.len() > MAX_OUTPUT {
                self.lost(i);
            }
        }
    }

    fn on_writable(&mut self, i: usize) {
        let now_ms = unix_us() / 1000;
        let user = &mut self.users[i];
        if user.state == State::Connecting {
            let stream = user.stream.as_ref().expect("connecting has a stream");
            match stream.take_error() {
                Ok(None) if stream.peer_addr().is_ok() => match self.opts.transport {
                    Transport::Tcp => self.established(i, now_ms),
                    Transport::Ws => {
                        // `since_ms` stays: the connect timeout covers the upgrade too.
                        user.state = State::Upgrading;
                        let key: [u8; 16] = rand::random();
                        self.handshakes.insert(i as u32, key);
                        let request = transport::upgrade_request(self.opts.server, &key);
                        self.write(i, &request);
                    }
                },
                Ok(None) => {} // spurious wake-up: not connected yet
                Ok(Some(e)) | Err(e) => self.connect_failed(i, &e),
            }
            return;
        }
        let Some(stream) = user.stream.as_mut() else {
            return;
        };
        let Ok(written) = write_nonblocking(stream, &user.out) else {
            return self.lost(i);
        };
        user.out.drain(..written);
        if user.out.is_empty() {
            user.out = Vec::new();
        }
    }

    /// The connection is ready for the protocol (TCP connected, or WebSocket upgraded):
    /// count it and log in.
    fn established(&mut self, i: usize, now_ms: u64) {
        let user = &mut self.users[i];
        user.state = State::LoggingIn;
        user.since_ms = now_ms;
        self.counters.connects += 1;
        self.connected += 1;
        let user_id = self.user_id(i);
        let secret = self.opts.secret.as_bytes();
        let token = *self
            .token_cache
            .entry(user_id)
            .or_insert_with(|| hongbao_proto::token::token(secret, user_id));
        self.token_cache.remove(&user_id);
        let login = Message::Login {
            user_id,
            token: token.to_vec(),
        };
        self.send(
            i,
            &Frame {
                request_id: 0,
                message: login,
            },
        );
    }

    // ----- receiving -------------------------------------------------------------------

    fn on_readable(&mut self, i: usize, buf: &mut [u8]) {
        if self.users[i].state == State::Connecting {
            // An error (refused, reset) shows up as readable too.
            let err = self.users[i]
                .stream
                .as_ref()
                .and_then(|s| s.take_error().ok().flatten());
            if let Some(e) = err {
                self.connect_failed(i, &e);
            }
            return;
        }
        loop {
            let Some(stream) = self.users[i].stream.as_mut() else {
                return;
            };
            let n = match stream.read(buf) {
                Ok(0) => return self.lost(i),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return self.lost(i),
            };
            let mut data = std::mem::take(&mut self.users[i].partial);
            data.extend_from_slice(&buf[..n]);
            let mut at = 0;
            if self.users[i].state == State::Upgrading {
                match self.on_upgrade_answer(i, &data) {
                    Some(head) => at = head,
                    None => {
                        if self.users[i].stream.is_some() {
                            self.users[i].partial = data; // the answer so far
                        }
                        continue;
                    }
                }
            }
            let t = self.opts.transport;
            let mut fragment = self.users[i].fragment.take();
            let decoded =
                transport::decode(t, &mut data[at..], &mut fragment, |m| self.on_inbound(i, m));
            match decoded {
                Ok(used) => at += used,
                Err(_) => {
                    self.counters.error_replies += 1;
                    return self.disconnect(i);
                }
            }
            let user = &mut self.users[i];
            if user.stream.is_none() {
                return; // dropped while handling what arrived
            }
            user.fragment = fragment;
            if at < data.len() {
                data.drain(..at);
                user.partial = data;
            }
        }
    }

    /// Reads the server's answer to the upgrade request: `Some(head length)` once it is a
    /// valid 101 (the user is then logging in), `None` while incomplete or if it failed
    /// (the user is then dropped and will retry).
    fn on_upgrade_answer(&mut self, i: usize, answer: &[u8]) -> Option<usize> {
        let key = self.handshakes.get(&(i as u32)).copied()?;
        match ws::check_response(answer, &key) {
            Ok(None) => None,
            Ok(Some(head)) => {
                self.handshakes.remove(&(i as u32));
                self.established(i, unix_us() / 1000);
                Some(head)
            }
            Err(_) => {
                self.handshake_failed(i);
                None
            }
        }
    }

    fn on_inbound(&mut self, i: usize, m: Inbound<'_>) {
        if self.users[i].stream.is_none() {
            return; // dropped by an earlier message of the same read
        }
        match m {
            Inbound::Frame(frame) => self.on_frame(i, frame),
            Inbound::BadFrame | Inbound::Text => self.counters.error_replies += 1,
            Inbound::Ping(payload) => {
                let mut out = Vec::with_capacity(8 + payload.len());
                transport::pong(payload, &mut out);
                self.write(i, &out);
            }
            Inbound::Close => {
                let mut out = Vec::with_capacity(8);
                transport::close_reply(&mut out);
                self.write(i, &out);
                self.disconnect(i);
            }
        }
    }

    fn take_inflight(&mut self, i: usize, request_id: u32) -> Option<Inflight> {
        let inflight = &mut self.users[i].inflight;
        let at = inflight.iter().position(|f| f.request_id == request_id)?;
        let found = inflight.swap_remove(at);
        if inflight.is_empty() {
            *inflight = Vec::new();
        }
        Some(found)
    }

    fn on_frame(&mut self, i: usize, frame: Frame) {
        let now = unix_us();
        let user_id = self.user_id(i);
        match frame.message {
            Message::LoginReply {
                result: ResultCode::Ok,
                ..
            } => {
                let user = &mut self.users[i];
                user.state = State::Ready;
                user.attempt = 0;
                self.logged_in += 1;
                self.counters.logins += 1;
            }
            Message::LoginReply { .. } => self.counters.login_failures += 1,
            Message::ShakeReply {
                result,
                amount_cents,
                ..
            } => {
                let Some(f) = self.take_inflight(i, frame.request_id) else {
                    return;
                };
                self.counters.shake_replies += 1;
                let _ = self
                    .shake_hist
                    .record(now.saturating_sub(f.intended_us).max(1));
                match result {
                    ResultCode::Won => {
                        self.counters.won += 1;
                        self.counters.won_cents += amount_cents;
                        let t = self.totals.entry(user_id).or_default();
                        t.won += 1;
                        t.won_cents += amount_cents;
                    }
                    ResultCode::Nothing => self.counters.nothing += 1,
                    ResultCode::Overloaded => {
                        self.counters.overloaded += 1;
                        // ±50% jitter, so that users shed together do not all return in
                        // the same second and overload the server again in waves.
                        let backoff = u64::from(self.opts.overload_backoff_secs);
                        if backoff > 0 {
                            let ms = rand::thread_rng().gen_range(backoff * 500..=backoff * 1500);
                            self.users[i].since_ms = now / 1000 + ms;
                        }
                    }
                    _ => self.counters.error_replies += 1,
                }
            }
            Message::PacketNotice { packet_id, .. } => {
                self.counters.notices += 1;
                if let std::collections::hash_map::Entry::Vacant(e) =
                    self.opens.entry((user_id, packet_id))
                {
                    e.insert(false);
                    self.counters.opens_sent += 1;
                    self.request(i, Message::Open { packet_id }, Kind::Open, now, packet_id);
                }
            }
            Message::OpenReply {
                result,
                packet_id,
                amount_cents,
            } => {
                let Some(f) = self.take_inflight(i, frame.request_id) else {
                    return;
                };
                let _ = self
                    .open_hist
                    .record(now.saturating_sub(f.intended_us).max(1));
                match result {
                    ResultCode::Opened | ResultCode::AlreadyOpened => {
                        let counted = self.opens.entry((user_id, packet_id)).or_insert(false);
                        if !*counted {
                            *counted = true;
                            self.counters.opened += 1;
                            self.counters.opened_cents += amount_cents;
                            let t = self.totals.entry(user_id).or_default();
                            t.opened += 1;
                            t.opened_cents += amount_cents;
                        }
                    }
                    _ => self.counters.open_other += 1,
                }
            }
            Message::Error { .. } => {
                self.take_inflight(i, frame.request_id);
                self.counters.error_replies += 1;
            }
            Message::Kick { .. } => self.counters.kicks += 1,
            Message::Broadcast { server_time_us, .. } => {
                self.counters.broadcast_delivered += 1;
                self.receipts.record(server_time_us, now);
            }
            _ => {}
        }
    }

    // ----- connections -----------------------------------------------------------------

    fn start_connects(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_refill_ms) as f64 / 1000.0;
        self.last_refill_ms = now_ms;
        let rate = self.opts.connect_rate.max(1) as f64;
        self.connect_tokens = (self.connect_tokens + elapsed * rate).min(rate / 20.0 + 1.0);
        while self.connect_tokens >= 1.0 {
            let i = if self.next_initial < self.users.len() {
                self.next_initial += 1;
                self.next_initial - 1
            } else {
                match self.retry.peek() {
                    Some(Reverse((due, _))) if *due <= now_ms => {
                        self.retry.pop().unwrap().0 .1 as usize
                    }
                    _ => return,
                }
            };
            self.connect_tokens -= 1.0;
            self.connect(i, now_ms);
        }
    }

    fn connect(&mut self, i: usize, now_ms: u64) {
        self.counters.connect_attempts += 1;
        let ip = self.opts.source_ips[self.source_cursor % self.opts.source_ips.len()];
        self.source_cursor += 1;
        match open_socket(ip, self.opts.server) {
            Ok(mut stream) => {
                let interest = Interest::READABLE | Interest::WRITABLE;
                if let Err(e) = self
                    .poll
                    .registry()
                    .register(&mut stream, Token(i), interest)
                {
                    return self.connect_failed_before(i, &e, now_ms);
                }
                let user = &mut self.users[i];
                user.stream = Some(stream);
                user.state = State::Connecting;
                user.since_ms = now_ms;
            }
            Err(e) => self.connect_failed_before(i, &e, now_ms),
        }
    }

    fn classify(&mut self, e: &std::io::Error) {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => self.counters.failed_refused += 1,
            Some(libc::ETIMEDOUT) => self.counters.failed_timeout += 1,
            Some(libc::ECONNRESET) => self.counters.failed_reset += 1,
            Some(libc::EADDRNOTAVAIL) | Some(libc::EADDRINUSE) => {
                self.counters.failed_out_of_ports += 1
            }
            Some(libc::EMFILE) | Some(libc::ENFILE) => self.counters.failed_out_of_files += 1,
            _ => self.counters.failed_other += 1,
        }
    }

    fn connect_failed_before(&mut self, i: usize, e: &std::io::Error, now_ms: u64) {
        self.classify(e);
        self.schedule_retry(i, now_ms);
    }

    fn connect_failed(&mut self, i: usize, e: &std::io::Error) {
        self.classify(e);
        self.drop_stream(i);
        self.schedule_retry(i, unix_us() / 1000);
    }

    fn check_connect_timeouts(&mut self) {
        // Cheap: only looked at while initial connects are still being made or retried.
        if self.next_initial < self.users.len()
            || !self.retry.is_empty()
            || self.connected < self.users.len() as u64
        {
            let now_ms = unix_us() / 1000;
            if now_ms % 1000 > 20 {
                return; // once a second is plenty
            }
            for i in 0..self.users.len() {
                let u = &self.users[i];
                if matches!(u.state, State::Connecting | State::Upgrading)
                    && now_ms.saturating_sub(u.since_ms) > CONNECT_TIMEOUT_MS
                {
                    self.counters.failed_timeout += 1;
                    self.drop_stream(i);
                    self.schedule_retry(i, now_ms);
                }
            }
        }
    }

    /// The connection failed: before the upgrade completed that is a failed handshake,
    /// after it a disconnect.
    fn lost(&mut self, i: usize) {
        if self.users[i].state == State::Upgrading {
            self.handshake_failed(i);
        } else {
            self.disconnect(i);
        }
    }

    fn handshake_failed(&mut self, i: usize) {
        self.counters.failed_handshake += 1;
        self.drop_stream(i);
        self.schedule_retry(i, unix_us() / 1000);
    }

    /// A connection that was up went away: count it and come back later.
    fn disconnect(&mut self, i: usize) {
        if self.users[i].stream.is_none() {
            return;
        }
        self.counters.disconnects += 1;
        let user_id = self.user_id(i);
        for f in std::mem::take(&mut self.users[i].inflight) {
            if let Kind::Open = f.kind {
                // Not answered: forget we asked, so the notice on re-login opens it again.
                if self.opens.get(&(user_id, f.packet)) == Some(&false) {
                    self.opens.remove(&(user_id, f.packet));
                }
            }
        }
        self.drop_stream(i);
        self.schedule_retry(i, unix_us() / 1000);
    }

    fn drop_stream(&mut self, i: usize) {
        let user = &mut self.users[i];
        if let Some(mut stream) = user.stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        match user.state {
            State::Ready => {
                self.logged_in -= 1;
                self.connected -= 1;
            }
            State::LoggingIn => self.connected -= 1,
            State::Upgrading => {
                self.handshakes.remove(&(i as u32));
            }
            State::Idle | State::Connecting => {}
        }
        user.state = State::Idle;
        user.partial = Vec::new();
        user.out = Vec::new();
        user.inflight = Vec::new();
        user.fragment = None;
    }

    fn schedule_retry(&mut self, i: usize, now_ms: u64) {
        let user = &mut self.users[i];
        user.attempt = user.attempt.saturating_add(1);
        let backoff = (100u64 << user.attempt.min(6)).min(MAX_BACKOFF_MS);
        let jittered = rand::thread_rng().gen_range(backoff / 2..=backoff + backoff / 2);
        self.retry.push(Reverse((now_ms + jittered, i as u32)));
    }

    // ----- coordinator -----------------------------------------------------------------

    fn read_commands(&mut self) {
        let mut chunk = [0u8; 4096];
        loop {
            match std::io::stdin().lock().read(&mut chunk) {
                Ok(0) => {
                    self.stop = true;
                    return;
                }
                Ok(n) => self.stdin_buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.stop = true;
                    return;
                }
            }
        }
        while let Some(end) = self.stdin_buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.stdin_buf.drain(..=end).collect();
            match serde_json::from_slice::<Command>(&line) {
                Ok(Command::SetQps { from_second, qps }) => self.schedule.set_qps(from_second, qps),
                Ok(Command::Stop) => self.stop = true,
                Err(e) => eprintln!("load client {}: bad command: {e}", self.opts.proc_index),
            }
        }
    }

    fn report(&mut self, second: u64, last: bool) {
        let (rss_bytes, cpu_ms) = self_usage();
        let users = last.then(|| self.totals.iter().map(|(k, v)| (*k, v.clone())).collect());
        let report = Report {
            proc_index: self.opts.proc_index,
            pid: std::process::id(),
            second,
            unix_ms: unix_us() / 1000,
            connected: self.connected,
            logged_in: self.logged_in,
            rss_bytes,
            cpu_ms,
            counters: self.counters.clone(),
            shake_latency_us: report::sparse(&self.shake_hist),
            open_latency_us: report::sparse(&self.open_hist),
            send_lag_us: report::sparse(&self.lag_hist),
            broadcasts: self.receipts.drain(),
            users,
            last,
        };
        self.shake_hist.reset();
        self.open_hist.reset();
        self.lag_hist.reset();
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, &report);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }
}

/// A non-blocking socket bound to `source` (port chosen at connect time) and connecting.
fn open_socket(source: Ipv4Addr, server: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    let _ = socket.set_nodelay(true);
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads an int from a valid pointer for the given length.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    socket.bind(&SocketAddr::V4(SocketAddrV4::new(source, 0)).into())?;
    match socket.connect(&server.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on a descriptor we own (stdin) with standard flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

fn self_usage() -> (u64, u64) {
    hongbao_sys::usage::self_usage()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Half a million users per process is the C1M plan on two cores: what a user holds
    /// while idle must stay a small fixed record (buffers live on the heap only while in
    /// use). WebSocket adds 8 bytes (`fragment`), its key lives in a side map only during
    /// the upgrade.
    #[test]
    fn an_idle_user_is_small() {
        assert!(
            std::mem::size_of::<User>() <= 112,
            "{}",
            std::mem::size_of::<User>()
        );
    }
}
