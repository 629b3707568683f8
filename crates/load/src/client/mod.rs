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
//! - this file: the per-user record and the one loop;
//! - `ask`: what the users ask and when (the shakes fired, opens, notice polls);
//! - `connect`: opening connections at a bounded rate, timeouts, retries and back-off;
//! - `login`: from connected to ready (TLS, the upgrade, the login, tokens);
//! - `send`: writing to a user's connection;
//! - `receive`: reading what the server sent and what each reply means for the counts;
//! - `stdio`: the coordinator's commands in, the reports out;
//! - `timers`: every deadline of the loop, in one table.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::time::Duration;

use hongbao_sys::clock::UnixTime;

use hdrhistogram::Histogram;
use hongbao_proto::tls::session::ClientSession;
use hongbao_proto::ws;
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

mod ask;
mod connect;
mod login;
mod options;
mod receive;
mod send;
mod stdio;
mod timers;

pub use options::{
    start_process, ClientOptions, Command, Signer, DEFAULT_NOTICE_POLL_SECS,
    DEFAULT_OVERLOAD_BACKOFF_SECS,
};

use crate::broadcast::Receipts;
use crate::report::{self, Counters, History, UserTotals};
use crate::schedule::{partition, Firing, Schedule};
use crate::transport::Transport;
use timers::{Timers, UnixMs};

const STDIN: Token = Token(usize::MAX - 1);
/// How long a connection (or an HTTP request on one of its own) may take by default:
/// its TCP connect, TLS handshake and WebSocket upgrade together (`connect_timeout_ms`).
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 30_000;

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
    /// When it was meant to go out: its latency is measured from then.
    intended: UnixTime,
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
    /// Connecting or upgrading: when the attempt began (for the connect timeout).
    /// Ready: until when the user backs off after an "overloaded" (in the past: not).
    since: UnixMs,
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
    /// Every deadline of the loop (`timers.rs`).
    timers: Timers,
    connect_tokens: f64,
    last_refill: UnixTime,
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
    time_wait: (UnixTime, u64),
    stdin_buf: Vec<u8>,
    stop: bool,
}

/// Runs one client process until told to stop (or its stdin closes).
pub fn run(opts: ClientOptions) -> crate::Result<()> {
    let _span = tracing::info_span!("load_client", proc = opts.proc_index).entered();
    hongbao_sys::limits::raise_nofile_limit();
    let range = partition(opts.users, opts.procs, opts.proc_index);
    let poll = Poll::new().map_err(|e| crate::Error::io("making the poll", e))?;
    let users = (range.start..range.end)
        .map(|_| User {
            stream: None,
            state: State::Idle,
            attempt: 0,
            ended: None,
            next_request: 1,
            since: UnixMs::default(),
            partial: Vec::new(),
            out: Vec::new(),
            inflight: Vec::new(),
            fragment: None,
            tls: None,
        })
        .collect();
    stdio::set_nonblocking(0);
    poll.registry()
        .register(&mut SourceFd(&0), STDIN, Interest::READABLE)
        .map_err(|e| crate::Error::io("polling stdin", e))?;
    let minter = opts.signer.minter(&opts.secret)?;
    // Each listener says what it speaks: binary frames, or HTTP (and WebSocket upgrades).
    let alpn = match opts.transport {
        Transport::Tcp => hongbao_proto::tls::ALPN_FRAMES,
        Transport::Ws | Transport::Http => hongbao_proto::tls::ALPN_HTTP,
    };
    let tls = match &opts.tls_ca {
        Some(ca) => Some(hongbao_proto::tls::client_config(ca.as_bytes(), &[alpn])?),
        None => None,
    };
    // The clock's one reading before the loop's: where the schedule and the connects
    // start from.
    let now = UnixTime::now();
    let timers = Timers::new(
        epoch(&opts),
        UnixTime::from_millis(opts.connect_from_ms),
        now,
    );
    let mut client = Client {
        schedule: Schedule::new(opts.users, opts.qps),
        first_index: range.start,
        opts,
        poll,
        users,
        next_initial: 0,
        timers,
        connect_tokens: 0.0,
        last_refill: now,
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
        time_wait: (UnixTime::default(), 0),
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
    /// The one loop. A turn reads the clock once, when the poll returns, and everything
    /// the turn does is as of then: what arrived, then what the schedule and the
    /// connects have due. A firing falls at most a turn late, and is measured so.
    pub(super) fn event_loop(&mut self) -> crate::Result<()> {
        let mut events = Events::with_capacity(4096);
        let mut read_buf = vec![0u8; 64 * 1024];
        let mut timeout = Duration::ZERO;
        while !self.stop {
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(crate::Error::io("waiting for events", e));
                }
            }
            let now = UnixTime::now();
            for event in events.iter() {
                match event.token() {
                    STDIN => self.read_commands(),
                    Token(i) => {
                        if event.is_writable() {
                            self.on_writable(i, now);
                        }
                        let closing = event.is_read_closed() || event.is_error();
                        if event.is_readable() || closing {
                            self.on_readable(i, &mut read_buf, closing, now);
                        }
                    }
                }
            }
            self.check_connect_timeouts(now);
            if self.stop {
                break;
            }
            self.on_schedule(now);
            if self.timers.connecting(now) {
                self.start_connects(now);
            } else {
                self.last_refill = now;
            }
            timeout = self.timers.timeout(now);
        }
        self.say_unanswered_opens();
        // The last report is a turn of its own.
        self.report(self.timers.second(), true, UnixTime::now());
        Ok(())
    }

    /// What the schedule has due at `now`: the second that ended finished and reported,
    /// then the firings and notice polls whose time has come.
    fn on_schedule(&mut self, now: UnixTime) {
        self.timers.set_epoch(epoch(&self.opts));
        if let Some(current) = self.timers.second_ended(now) {
            self.next_second(current, now);
        }
        while let Some((f, intended)) = self.timers.firing_due(now) {
            self.fire(f, intended, now);
        }
        while let Some(i) = self.timers.poll_due(now) {
            self.poll_notices(i, now);
        }
    }

    /// The loop is in second `current`: what is left of the second it was in goes out
    /// (late, and measured so) and is reported, and `current`'s firings are loaded.
    fn next_second(&mut self, current: u64, now: UnixTime) {
        let first = !self.timers.loaded();
        if !first {
            while let Some((f, intended)) = self.timers.firing_left() {
                self.fire(f, intended, now);
            }
            while let Some(i) = self.timers.poll_left() {
                self.poll_notices(i, now);
            }
            let ended = self.timers.second();
            self.report(ended, false, now);
            // Seconds skipped entirely (a long stall) are fired late, not dropped.
            for skipped in ended + 1..current {
                self.load_second(skipped, false);
                while let Some((f, intended)) = self.timers.firing_left() {
                    self.fire(f, intended, now);
                }
                self.report(skipped, false, now);
            }
        }
        // Polls of seconds skipped in a stall are not made up: they only look.
        let second = self.timers.second().max(current);
        self.load_second(second, !first);
    }

    /// Loads `second`'s firings into the table, and its notice polls if `polls`.
    fn load_second(&mut self, second: u64, polls: bool) {
        let (mut firings, mut notice_polls) = self.timers.spare();
        self.load_firings(second, &mut firings);
        if polls {
            self.load_polls(second, &mut notice_polls);
        }
        self.timers.load(second, firings, notice_polls);
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

    /// HTTP with a connection per request: users connect when they have something to ask.
    pub(super) fn on_demand(&self) -> bool {
        self.opts.transport == Transport::Http && self.opts.http_connection.per_request()
    }
}

/// Schedule second 0 on this machine's clock: the coordinator's epoch less the offset.
fn epoch(opts: &ClientOptions) -> UnixTime {
    UnixTime::from_micros((opts.epoch_ms as i64 * 1000 - opts.clock_offset_us).max(0) as u64)
}

/// A latency for the histograms: µs from `from` to `now`, at least 1 (a clock stepped
/// back counts as the fastest).
fn micros_since(now: UnixTime, from: UnixTime) -> u64 {
    (now.since(from).as_micros() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Half a million users per process is the C1M plan on two cores: what a user holds
    /// while idle must stay a small fixed record (buffers live on the heap only while in
    /// use). WebSocket adds 8 bytes (`fragment`), its key lives in a side map only during
    /// the upgrade.
    ///
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
