//! A load client's connections: opened at a bounded rate from many loopback source
//! addresses, timed out, retried with back-off, and every failure counted by its cause.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Interest, Token};
use rand::Rng;
use socket2::{Domain, Socket, Type};

use hongbao_sys::clock::UnixTime;

use super::{Client, Kind, State, UnixMs};
use crate::backoff::{self, Ended};

/// Connect calls a turn of the loop in a storm (~10 µs each).
const STORM_CONNECTS_A_TURN: f64 = 2000.0;

impl Client {
    pub(super) fn start_connects(&mut self, now: UnixTime) {
        let elapsed = now.since(self.last_refill).as_secs_f64();
        self.last_refill = now;
        if self.opts.connect_storm {
            // Everyone at once: only a turn's worth of connect calls at a time, so the
            // loop still reads what the first ones get back.
            self.connect_tokens = STORM_CONNECTS_A_TURN;
        } else {
            let rate = self.opts.connect_rate.max(1) as f64;
            self.connect_tokens = (self.connect_tokens + elapsed * rate).min(rate / 20.0 + 1.0);
        }
        while self.connect_tokens >= 1.0 {
            let i = if self.next_initial < self.users.len() {
                self.next_initial += 1;
                self.next_initial - 1
            } else {
                match self.timers.retry_due(now) {
                    Some(i) => i,
                    None => return,
                }
            };
            self.connect_tokens -= 1.0;
            self.connect(i, now);
        }
    }

    /// User `i` connects, its attempt begun at `now`.
    pub(super) fn connect(&mut self, i: usize, now: UnixTime) {
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
                    return self.connect_failed_before(i, &e, now);
                }
                let user = &mut self.users[i];
                user.stream = Some(stream);
                user.state = State::Connecting;
                user.since = UnixMs::of(now);
            }
            Err(e) => self.connect_failed_before(i, &e, now),
        }
    }

    pub(super) fn classify(&mut self, e: &std::io::Error, now: UnixTime) {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => self.counters.failed_refused += 1,
            Some(libc::ETIMEDOUT) => self.counters.failed_timeout += 1,
            Some(libc::ECONNRESET) => self.counters.failed_reset += 1,
            Some(libc::EADDRNOTAVAIL) | Some(libc::EADDRINUSE) => {
                if self.ports_held_in_time_wait(now) {
                    self.counters.failed_time_wait += 1
                } else {
                    self.counters.failed_out_of_ports += 1
                }
            }
            Some(libc::EMFILE) | Some(libc::ENFILE) => self.counters.failed_out_of_files += 1,
            _ => self.counters.failed_other += 1,
        }
    }

    pub(super) fn connect_failed_before(&mut self, i: usize, e: &std::io::Error, now: UnixTime) {
        self.classify(e, now);
        self.schedule_retry(i, now);
    }

    pub(super) fn connect_failed(&mut self, i: usize, e: &std::io::Error, now: UnixTime) {
        self.classify(e, now);
        self.drop_stream(i);
        self.schedule_retry(i, now);
    }

    /// Drops the connections that took too long at `now`, when the table says it is time
    /// to look (`Timers::timeouts_due`).
    pub(super) fn check_connect_timeouts(&mut self, now: UnixTime) {
        // Cheap: only looked at while initial connects are still being made or retried.
        if self.next_initial < self.users.len()
            || self.timers.retrying()
            || self.connected < self.users.len() as u64
        {
            if !self.timers.timeouts_due(now) {
                return;
            }
            let on_demand = self.on_demand();
            let timeout = Duration::from_millis(self.opts.connect_timeout_ms);
            for i in 0..self.users.len() {
                let u = &self.users[i];
                let age = UnixMs::of(now).since(u.since);
                if matches!(
                    u.state,
                    State::Connecting | State::Upgrading | State::Handshaking
                ) && age > timeout
                {
                    self.counters.failed_timeout += 1;
                    self.drop_stream(i);
                    self.schedule_retry(i, now);
                } else if on_demand
                    && matches!(u.state, State::Ready | State::Draining)
                    && age > timeout
                {
                    // A connection per request that has neither its answer nor (with
                    // `close`) the server's close after 10 s: given up, as an HTTP
                    // client's timeout would; an open it carried is asked again at the
                    // next notice.
                    if self.counters.failed_timeout < 5 {
                        tracing::warn!(
                            user = self.user_id(i),
                            age_ms = age.as_millis() as u64,
                            state = ?u.state,
                            waiting = u.inflight.len(),
                            "no answer or close in time; connection dropped"
                        );
                    }
                    self.counters.failed_timeout += 1;
                    self.drop_stream(i);
                }
            }
        }
    }

    /// The connection failed: before the upgrade completed that is a failed handshake,
    /// after it a disconnect.
    pub(super) fn lost(&mut self, i: usize, now: UnixTime) {
        if matches!(self.users[i].state, State::Upgrading | State::Handshaking) {
            self.handshake_failed(i, now);
        } else {
            self.disconnect(i, now);
        }
    }

    pub(super) fn handshake_failed(&mut self, i: usize, now: UnixTime) {
        self.counters.failed_handshake += 1;
        self.drop_stream(i);
        self.schedule_retry(i, now);
    }

    /// A connection that was up went away: count it and come back later.
    pub(super) fn disconnect(&mut self, i: usize, now: UnixTime) {
        if self.users[i].stream.is_none() {
            return;
        }
        self.counters.disconnects += 1;
        self.drop_stream(i);
        self.schedule_retry(i, now);
    }

    /// Whether the sockets in TIME_WAIT on this machine (`/proc/net/sockstat`, read at
    /// most every 100 ms) hold half a source address's port range or more: then running
    /// out of ports is the short-connection wall, not the number of connections open.
    fn ports_held_in_time_wait(&mut self, now: UnixTime) -> bool {
        if now.since(self.time_wait.0) > Duration::from_millis(100) {
            self.time_wait = (now, sockets_in_time_wait());
        }
        self.time_wait.1 * 2 >= self.port_range
    }

    pub(super) fn drop_stream(&mut self, i: usize) {
        let user_id = self.user_id(i);
        for f in std::mem::take(&mut self.users[i].inflight) {
            if let Kind::Open = f.kind {
                // Not answered: forget we asked, so the next notice opens it again.
                if self.opens.get(&(user_id, f.packet)) == Some(&None) {
                    self.opens.remove(&(user_id, f.packet));
                }
            }
        }
        let on_demand = self.on_demand();
        let user = &mut self.users[i];
        user.tls = None;
        if let Some(mut stream) = user.stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        match user.state {
            State::Ready | State::Draining => {
                if !on_demand {
                    self.logged_in -= 1;
                }
                self.connected -= 1;
            }
            State::LoggingIn => self.connected -= 1,
            State::Upgrading => {
                self.handshakes.remove(&(i as u32));
            }
            State::Idle | State::Connecting | State::Handshaking => {}
        }
        user.state = State::Idle;
        user.partial = Vec::new();
        user.out = Vec::new();
        user.inflight = Vec::new();
        user.fragment = None;
    }

    /// When user `i` comes back (`backoff.rs`): after the server's wait, after a
    /// full-jitter back-off, or — a terminal kick — never.
    pub(super) fn schedule_retry(&mut self, i: usize, now: UnixTime) {
        if self.on_demand() {
            return; // the ask failed with its connection; the next firing connects anew
        }
        let user = &mut self.users[i];
        let ended = user.ended.take().unwrap_or(Ended::Failed);
        let (wait, attempt) = backoff::next(ended, user.attempt, rand::thread_rng().gen());
        user.attempt = attempt;
        match wait {
            Some(wait_ms) => self
                .timers
                .retry_at(now + Duration::from_millis(wait_ms), i),
            None => self.counters.stayed_away += 1,
        }
    }
}

/// A non-blocking socket bound to `source` (port chosen at connect time) and connecting.
pub(super) fn open_socket(source: Ipv4Addr, server: SocketAddr) -> std::io::Result<TcpStream> {
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

/// Sockets in TIME_WAIT on this machine, from `/proc/net/sockstat` (`TCP: inuse 5 orphan
/// 0 tw 3 …`).
fn sockets_in_time_wait() -> u64 {
    std::fs::read_to_string("/proc/net/sockstat")
        .ok()
        .and_then(|s| {
            let tcp = s.lines().find(|l| l.starts_with("TCP:"))?;
            let mut words = tcp.split_whitespace();
            words.find(|w| *w == "tw")?;
            words.next()?.parse().ok()
        })
        .unwrap_or(0)
}
