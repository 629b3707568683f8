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
//!
//! - `options`: what the coordinator tells a client process (options, commands);
//! - this file: the per-user record and the one loop, firing and reporting;
//! - `connect`: opening connections at a bounded rate, timeouts, retries and back-off;
//! - `receive`: reading what the server sent and what each reply means for the counts.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::time::Duration;

use hongbao_sys::clock::unix_us;

use hdrhistogram::Histogram;
use hongbao_proto::tls::session::ClientSession;
use hongbao_proto::{ws, Frame, Message};
use hongbao_sys::net::write_nonblocking;
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

mod connect;
mod options;
mod receive;

pub use options::{
    start_process, ClientOptions, Command, Signer, DEFAULT_NOTICE_POLL_SECS,
    DEFAULT_OVERLOAD_BACKOFF_SECS,
};

use crate::broadcast::Receipts;
use crate::report::{self, Counters, History, Report, UserTotals};
use crate::schedule::{partition, Firing, Schedule};
use crate::transport::{self, HttpConnection, Transport};

const STDIN: Token = Token(usize::MAX - 1);
/// How long a connection (or an HTTP request on one of its own) may take by default:
/// its TCP connect, TLS handshake and WebSocket upgrade together (`connect_timeout_ms`).
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 30_000;
/// A user's unsent output past this means the server is not reading: drop and reconnect.
const MAX_OUTPUT: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Connecting,
    /// WebSocket only: connected, the upgrade request sent, waiting for the 101.
    Upgrading,
    /// TLS: connected, the handshake under way.
    Handshaking,
    LoggingIn,
    Ready,
    /// HTTP with `Connection: close`: the answer is in; reading on to the server's close,
    /// so that the TIME_WAIT stays on its side, as a client that honours the header does.
    Draining,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shake,
    Open,
    /// HTTP: a `GET /v1/notices`.
    Poll,
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
    /// Failed attempts since its last login (`backoff.rs`).
    attempt: u8,
    /// How the connection under way ended, when the server said (a kick, a refused
    /// upgrade's `Retry-After`): what the user does next.
    ended: Option<crate::backoff::Ended>,
    next_request: u32,
    /// Unix ms. Connecting or upgrading: when the attempt began (for the connect timeout).
    /// Ready: until when the user backs off after an "overloaded" (in the past: not).
    since_ms: u64,
    partial: Vec<u8>,
    out: Vec<u8>,
    inflight: Vec<Inflight>,
    /// A fragmented WebSocket message being assembled (the gateway never fragments).
    fragment: Option<Box<ws::Partial>>,
    /// The connection's TLS session, when the run speaks TLS: rustls's unbuffered one,
    /// which holds no buffers between reads (`hongbao_proto::tls::session`).
    tls: Option<Box<ClientSession>>,
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
    /// Signs the users' login tokens.
    minter: hongbao_proto::token::Minter,
    /// TLS to the server, when the run speaks it.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// HTTP: each user's bearer token and the Unix second it was made, made again once
    /// half its life is gone.
    token_cache: HashMap<u64, (String, u64)>,
    /// Opens asked for, per (user, packet): the amount once the open is counted (an
    /// `already-opened` with another amount is told again in `history`).
    opens: HashMap<(u64, u64), Option<u64>>,
    totals: HashMap<u64, UserTotals>,
    /// Wins and opens told since the last report (this process's part of the history).
    history: History,
    counters: Counters,
    /// WebSocket keys of the upgrades in flight, by user index: only until the 101.
    handshakes: HashMap<u32, [u8; 16]>,
    receipts: Receipts,
    shake_hist: Histogram<u64>,
    /// The same of the shakes served (won or nothing): without those shed `overloaded`.
    served_hist: Histogram<u64>,
    open_hist: Histogram<u64>,
    /// How late shakes went out against their intended send time (this process's lag).
    lag_hist: Histogram<u64>,
    connected: u64,
    logged_in: u64,
    /// Ports of a source address, and the last reading of sockets in TIME_WAIT (when, how
    /// many), to tell the short-connection wall from running out of ports.
    port_range: u64,
    time_wait: (u64, u64),
    stdin_buf: Vec<u8>,
    stop: bool,
}

/// Runs one client process until told to stop (or its stdin closes).
pub fn run(opts: ClientOptions) -> anyhow::Result<()> {
    let _span = tracing::info_span!("load_client", proc = opts.proc_index).entered();
    hongbao_sys::limits::raise_nofile_limit();
    let range = partition(opts.users, opts.procs, opts.proc_index);
    let poll = Poll::new()?;
    let users = (range.start..range.end)
        .map(|_| User {
            stream: None,
            state: State::Idle,
            attempt: 0,
            ended: None,
            next_request: 1,
            since_ms: 0,
            partial: Vec::new(),
            out: Vec::new(),
            inflight: Vec::new(),
            fragment: None,
            tls: None,
        })
        .collect();
    set_nonblocking(0);
    poll.registry()
        .register(&mut SourceFd(&0), STDIN, Interest::READABLE)?;
    let minter = opts.signer.minter(&opts.secret)?;
    // Each listener says what it speaks: binary frames, or HTTP (and WebSocket upgrades).
    let alpn = match opts.transport {
        Transport::Tcp => hongbao_proto::tls::ALPN_FRAMES,
        Transport::Ws | Transport::Http => hongbao_proto::tls::ALPN_HTTP,
    };
    let tls = match &opts.tls_ca {
        Some(ca) => Some(
            hongbao_proto::tls::client_config(ca.as_bytes(), &[alpn])
                .map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
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
        minter,
        tls,
        token_cache: HashMap::new(),
        opens: HashMap::new(),
        totals: HashMap::new(),
        history: History::default(),
        counters: Counters::default(),
        handshakes: HashMap::new(),
        receipts: Receipts::default(),
        shake_hist: report::new_histogram(),
        served_hist: report::new_histogram(),
        open_hist: report::new_histogram(),
        lag_hist: report::new_histogram(),
        connected: 0,
        logged_in: 0,
        port_range: hongbao_sys::doctor::Limits::read().port_range_size(),
        time_wait: (0, 0),
        stdin_buf: Vec::new(),
        stop: false,
    };
    if client.on_demand() {
        // A connection per request: nothing to open now, and every user can fire.
        client.next_initial = client.users.len();
        client.logged_in = client.users.len() as u64;
    }
    client.event_loop()
}

impl Client {
    pub(super) fn event_loop(&mut self) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(4096);
        let mut read_buf = vec![0u8; 64 * 1024];
        let mut firings: Vec<Firing> = Vec::new();
        let mut next_firing = 0usize;
        let mut polls: Vec<(u64, usize)> = Vec::new();
        let mut next_poll = 0usize;
        let mut epoch_us = self.epoch_us();
        // The second whose firings are loaded; the report for it goes out when it ends.
        let mut second = unix_us().saturating_sub(epoch_us) / 1_000_000;
        let mut firings_loaded = false;
        while !self.stop {
            epoch_us = self.epoch_us();
            let now = unix_us();
            let current = now.saturating_sub(epoch_us) / 1_000_000;
            if now < epoch_us {
                // Before the epoch: nothing fires yet.
            } else {
                if current > second || !firings_loaded {
                    if firings_loaded {
                        // Fire what is left of the second we were in (late, and measured so).
                        self.fire(&firings[next_firing..], epoch_us + second * 1_000_000, now);
                        for &(_, i) in &polls[next_poll..] {
                            self.poll_notices(i, now);
                        }
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
                    // Polls of seconds skipped in a stall are not made up: they only look.
                    let first_second = !firings_loaded;
                    second = second.max(current);
                    self.load_firings(second, &mut firings);
                    next_firing = 0;
                    if first_second {
                        polls.clear();
                    } else {
                        self.load_polls(second, &mut polls);
                    }
                    next_poll = 0;
                    firings_loaded = true;
                }
                let base = epoch_us + second * 1_000_000;
                let due = firings[next_firing..]
                    .iter()
                    .take_while(|f| base + f.offset_ns as u64 / 1000 <= now)
                    .count();
                self.fire(&firings[next_firing..next_firing + due], base, now);
                next_firing += due;
                while let Some(&(offset, i)) = polls.get(next_poll) {
                    if base + offset > now {
                        break;
                    }
                    self.poll_notices(i, now);
                    next_poll += 1;
                }
            }
            if now >= self.opts.connect_from_ms * 1000 {
                self.start_connects(now / 1000);
            } else {
                self.last_refill_ms = now / 1000;
            }

            let now = unix_us();
            let next_at = if !firings_loaded {
                epoch_us.min(now + 10_000)
            } else {
                let base = epoch_us + second * 1_000_000;
                let firing = firings.get(next_firing).map(|f| f.offset_ns as u64 / 1000);
                let poll = polls.get(next_poll).map(|p| p.0);
                base + firing.into_iter().chain(poll).min().unwrap_or(1_000_000)
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
                        let closing = event.is_read_closed() || event.is_error();
                        if event.is_readable() || closing {
                            self.on_readable(i, &mut read_buf, closing);
                        }
                    }
                }
            }
            self.check_connect_timeouts();
        }
        self.say_unanswered_opens();
        self.report(second, true);
        Ok(())
    }

    /// Opens asked and never answered, on stderr (the first few): a share left unopened
    /// at the end of a run is then traceable to its user's state.
    fn say_unanswered_opens(&self) {
        let first = self.opts.first_user + self.first_index;
        let mut unanswered: Vec<&(u64, u64)> = self
            .opens
            .iter()
            .filter(|(_, answered)| answered.is_none())
            .map(|(k, _)| k)
            .collect();
        unanswered.sort();
        for &(user, packet) in unanswered.iter().take(5) {
            let u = &self.users[(user - first) as usize];
            let waiting: Vec<String> = u
                .inflight
                .iter()
                .map(|f| format!("{:?}#{}", f.kind, f.request_id))
                .collect();
            tracing::warn!(
                user,
                packet,
                state = ?u.state,
                stream = if u.stream.is_some() { "open" } else { "none" },
                ?waiting,
                "asked to open a packet and had no answer"
            );
        }
    }

    pub(super) fn load_firings(&self, second: u64, out: &mut Vec<Firing>) {
        out.clear();
        let end = self.first_index + self.users.len() as u64;
        self.schedule.firings(second, self.first_index..end, out);
    }

    pub(super) fn user_id(&self, i: usize) -> u64 {
        self.opts.first_user + self.first_index + i as u64
    }

    // ----- sending ---------------------------------------------------------------------

    /// Sends the shakes of `firings` (offsets from `base_us`) at `now_us`, recording how
    /// late each went out against its intended time.
    pub(super) fn fire(&mut self, firings: &[Firing], base_us: u64, now_us: u64) {
        for f in firings {
            let i = (f.user_index - self.first_index) as usize;
            let intended_us = base_us + f.offset_ns as u64 / 1000;
            if self.on_demand() {
                if self.users[i].stream.is_some() {
                    self.counters.skipped_busy += 1;
                    continue;
                }
            } else if self.users[i].state != State::Ready {
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
            self.request(i, Kind::Shake, intended_us, 0);
        }
    }

    /// HTTP with a connection per request: users connect when they have something to ask.
    pub(super) fn on_demand(&self) -> bool {
        self.opts.transport == Transport::Http && self.opts.http_connection.per_request()
    }

    /// Asks the server something for user `i`, timed from `intended_us`. Over HTTP with a
    /// connection per request, the ask waits for the connection it opens.
    pub(super) fn request(&mut self, i: usize, kind: Kind, intended_us: u64, packet: u64) {
        let user = &mut self.users[i];
        let request_id = user.next_request;
        user.next_request = user.next_request.wrapping_add(1).max(1);
        user.inflight.push(Inflight {
            request_id,
            kind,
            intended_us,
            packet,
        });
        if self.opts.transport != Transport::Http {
            let message = match kind {
                Kind::Shake => Message::Shake,
                Kind::Open => Message::Open { packet_id: packet },
                Kind::Poll => unreachable!("only HTTP users look for notices"),
            };
            return self.send(
                i,
                &Frame {
                    request_id,
                    message,
                },
            );
        }
        // With a connection per request, a connection carries one ask; the others wait
        // for the next connection (`done_asking`).
        match self.users[i].state {
            State::Ready if !self.on_demand() => self.send_http(i, kind, packet),
            State::Idle if self.on_demand() => self.connect(i, intended_us / 1000),
            _ => {}
        }
    }

    /// The HTTP request for an ask, with the user's bearer token.
    pub(super) fn send_http(&mut self, i: usize, kind: Kind, packet: u64) {
        let user_id = self.user_id(i);
        let bearer = self.bearer(user_id);
        let ask = match kind {
            Kind::Shake => transport::HttpAsk::Shake,
            Kind::Open => transport::HttpAsk::Open(packet),
            Kind::Poll => transport::HttpAsk::Notices,
        };
        let mut bytes = Vec::with_capacity(384);
        let server_closes = self.opts.http_connection == HttpConnection::Close;
        match (&self.opts.request, ask) {
            (Some(template), transport::HttpAsk::Shake) => {
                template.write(user_id, &bearer, server_closes, &mut bytes)
            }
            _ => transport::http_request(ask, &bearer, server_closes, &mut bytes),
        }
        self.write(i, &bytes);
    }

    /// The notice polls of `second` (see [`spread_polls`]); none but over HTTP.
    pub(super) fn load_polls(&self, second: u64, out: &mut Vec<(u64, usize)>) {
        out.clear();
        // A user's own requests have no notices to look for.
        if self.opts.transport == Transport::Http && self.opts.request.is_none() {
            let every = self.opts.notice_poll_secs as u64;
            spread_polls(self.first_index, self.users.len(), every, second, out);
        }
    }

    /// User `i` looks for packets to open, if it is free to ask.
    pub(super) fn poll_notices(&mut self, i: usize, now_us: u64) {
        // With a connection per request a busy user's poll waits for its next connection
        // (as an open after a notice does) rather than being skipped: a user's polls and
        // shakes fall at the same offsets every second, so a skipped poll would be skipped
        // every time and the user would never see its packets.
        let user = &self.users[i];
        let ready = if self.on_demand() {
            !user.inflight.iter().any(|f| f.kind == Kind::Poll)
        } else {
            user.state == State::Ready
        };
        if ready {
            self.counters.notice_polls += 1;
            self.request(i, Kind::Poll, now_us, 0);
        }
    }

    pub(super) fn send(&mut self, i: usize, frame: &Frame) {
        let mut bytes = Vec::with_capacity(64);
        transport::encode(self.opts.transport, frame, &mut bytes);
        self.write(i, &bytes);
    }

    /// Writes `bytes` to user `i`'s connection: sealed first over TLS (before the
    /// handshake is done, kept by the session until it is).
    pub(super) fn write(&mut self, i: usize, bytes: &[u8]) {
        if let Some(session) = self.users[i].tls.as_mut() {
            let mut sealed = Vec::with_capacity(bytes.len() + 64);
            session.seal(bytes, &mut sealed);
            if !sealed.is_empty() {
                self.write_raw(i, &sealed);
            }
            return;
        }
        self.write_raw(i, bytes);
    }

    pub(super) fn write_raw(&mut self, i: usize, bytes: &[u8]) {
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

    pub(super) fn on_writable(&mut self, i: usize) {
        let now_ms = unix_us() / 1000;
        let user = &mut self.users[i];
        if user.state == State::Connecting {
            let stream = user.stream.as_ref().expect("connecting has a stream");
            match stream.take_error() {
                Ok(None) if stream.peer_addr().is_ok() && self.tls.is_some() => {
                    self.start_tls(i);
                }
                Ok(None) if stream.peer_addr().is_ok() => self.tls_established(i, now_ms),
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

    /// Connected (over TLS: the handshake done): the protocol begins — for WebSocket its
    /// upgrade, for the others the login.
    pub(super) fn tls_established(&mut self, i: usize, now_ms: u64) {
        match self.opts.transport {
            Transport::Tcp | Transport::Http => self.established(i, now_ms),
            Transport::Ws => {
                // `since_ms` stays: the connect timeout covers the upgrade too.
                self.users[i].state = State::Upgrading;
                let key: [u8; 16] = rand::random();
                self.handshakes.insert(i as u32, key);
                let request = transport::upgrade_request(self.opts.server, &key);
                self.write(i, &request);
            }
        }
    }

    /// Connected: the TLS handshake begins (the connect timeout covers it too).
    fn start_tls(&mut self, i: usize) {
        let config = self.tls.clone().expect("a TLS run");
        let name = rustls::pki_types::ServerName::IpAddress(self.opts.server.ip().into());
        let Ok(session) = rustls::client::UnbufferedClientConnection::new(config, name) else {
            return self.handshake_failed(i);
        };
        let user = &mut self.users[i];
        user.state = State::Handshaking;
        user.tls = Some(Box::new(ClientSession::new(session)));
        // Its ClientHello, sealed from nothing.
        self.write(i, &[]);
    }

    /// The connection is ready for the protocol (TCP connected, or WebSocket upgraded):
    /// count it and log in. An HTTP user needs no login: each request carries its token,
    /// and what it asked before the connection was up goes out now.
    pub(super) fn established(&mut self, i: usize, now_ms: u64) {
        self.counters.connects += 1;
        self.connected += 1;
        if self.opts.transport == Transport::Http {
            self.users[i].state = State::Ready;
            // With a connection per request: when it opened, for the answer's timeout.
            self.users[i].since_ms = if self.on_demand() { now_ms } else { 0 };
            if !self.on_demand() {
                self.users[i].attempt = 0;
                self.logged_in += 1;
                self.counters.logins += 1;
            }
            let take = if self.on_demand() { 1 } else { usize::MAX };
            let waiting: Vec<(Kind, u64)> = self.users[i]
                .inflight
                .iter()
                .take(take)
                .map(|f| (f.kind, f.packet))
                .collect();
            for (kind, packet) in waiting {
                self.send_http(i, kind, packet);
            }
            return;
        }
        let user = &mut self.users[i];
        user.state = State::LoggingIn;
        user.since_ms = now_ms;
        self.log_in(i);
    }

    /// Sends user `i` a login with a fresh token: its first, or a refresh the server
    /// asked for (on the same connection).
    pub(super) fn log_in(&mut self, i: usize) {
        let user_id = self.user_id(i);
        let token = self.mint(user_id);
        let login = Message::Login {
            user_id,
            token: token.into_bytes(),
        };
        self.send(
            i,
            &Frame {
                request_id: 0,
                message: login,
            },
        );
    }

    fn mint(&self, user_id: u64) -> String {
        let now = unix_us() / 1_000_000;
        self.minter
            .mint_for(user_id, now, self.opts.signer.ttl_secs)
    }

    /// HTTP: the user's bearer token, made again once half its life is gone.
    fn bearer(&mut self, user_id: u64) -> String {
        let now = unix_us() / 1_000_000;
        let ttl = self.opts.signer.ttl_secs;
        if let Some((token, made)) = self.token_cache.get(&user_id) {
            if now < made + ttl / 2 {
                return token.clone();
            }
        }
        let token = self.mint(user_id);
        self.token_cache.insert(user_id, (token.clone(), now));
        token
    }

    // ----- coordinator -----------------------------------------------------------------

    pub(super) fn read_commands(&mut self) {
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
                Ok(Command::Clock { offset_us }) => self.opts.clock_offset_us = offset_us,
                Ok(Command::Stop) => self.stop = true,
                Err(e) => tracing::warn!(error = %e, "a bad command from the coordinator"),
            }
        }
    }

    /// Schedule second 0 on this machine's clock, µs.
    fn epoch_us(&self) -> u64 {
        (self.opts.epoch_ms as i64 * 1000 - self.opts.clock_offset_us).max(0) as u64
    }

    pub(super) fn report(&mut self, second: u64, last: bool) {
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
            served_latency_us: report::sparse(&self.served_hist),
            open_latency_us: report::sparse(&self.open_hist),
            send_lag_us: report::sparse(&self.lag_hist),
            broadcasts: self.receipts.drain(),
            users,
            history: std::mem::take(&mut self.history),
            last,
        };
        self.shake_hist.reset();
        self.served_hist.reset();
        self.open_hist.reset();
        self.lag_hist.reset();
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, &report);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }
}

fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on a descriptor we own (stdin) with standard flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// The notice polls of `second` for the `users` users from `first_index`, each polling
/// every `every` seconds (0: never), as (offset µs into the second, user index), spread
/// evenly over the second. (All at the top of the second, a few hundred requests at once
/// queue behind each other and hold up the shakes fired with them.)
fn spread_polls(
    first_index: u64,
    users: usize,
    every: u64,
    second: u64,
    out: &mut Vec<(u64, usize)>,
) {
    out.clear();
    if every == 0 {
        return;
    }
    let due = (0..users).filter(|&i| (first_index + i as u64 + second).is_multiple_of(every));
    out.extend(due.map(|i| (0, i)));
    let n = out.len() as u64;
    for (k, poll) in out.iter_mut().enumerate() {
        poll.0 = k as u64 * 1_000_000 / n;
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
    fn each_user_polls_once_per_period_spread_over_the_second() {
        let mut polls = Vec::new();
        let mut seen = vec![0; 1000];
        for second in 0..5 {
            spread_polls(7, 1000, 5, second, &mut polls);
            assert_eq!(polls.len(), 200);
            assert!(
                polls.windows(2).all(|w| w[1].0 - w[0].0 == 5_000),
                "{polls:?}"
            );
            assert_eq!(polls[0].0, 0);
            polls.iter().for_each(|&(_, i)| seen[i] += 1);
        }
        assert!(
            seen.iter().all(|&n| n == 1),
            "each user once in five seconds"
        );
        spread_polls(7, 1000, 0, 3, &mut polls);
        assert!(polls.is_empty());
    }

    /// 112 before issue 44; a TLS session's box, 8 more (the session itself only on a
    /// TLS run); how its connection ended, for the back-off, 8 more (issue 51).
    #[test]
    pub(super) fn an_idle_user_is_small() {
        assert!(
            std::mem::size_of::<User>() <= 128,
            "{}",
            std::mem::size_of::<User>()
        );
    }
}
