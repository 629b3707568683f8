//! The worker's record and its loop: the parts it is made of (each its own type, in its
//! own file: `Listeners`, `Conns` and `Output`, `Ready`, `Timers`, `SupervisorLink`,
//! `Sessions`, `Shakes`, `Broadcasts`, `Drain`), the clock as the turn read it, and the
//! turn itself — wait for events, read what is ready, answer, tick. What the worker does
//! with its parts is in the files named for the doing: `accept`, `read`, `handler`,
//! `write`, `messages`, `broadcast`, `draining`, `tick`.

use std::io::ErrorKind;
use std::time::Duration;

use hdrhistogram::Histogram;
use hongbao_sys::clock::{Clock, UnixTime, Uptime};
use mio::{Events, Poll, Token};

use super::broadcasts::Broadcasts;
use super::conn::{Conns, Output};
use super::drain::Drain;
use super::listeners::Listeners;
use super::ready::Ready;
use super::session::Sessions;
use super::shakes::Shakes;
use super::supervisor_link::SupervisorLink;
use super::timers::Timers;
use super::tls;
use crate::config::ReadyOrder;
use crate::error::{Error, Result};
use crate::link::WorkerConfig;
use crate::stats::WorkerStats;

pub(super) const LINK: Token = Token(usize::MAX - 1);
/// Listener `i` has token `LISTENERS - i`.
pub(super) const LISTENERS: usize = usize::MAX - 2;
/// Bytes read per `read` call into the worker's shared buffer.
pub(super) const READ_BUF: usize = 64 * 1024;
/// Events taken from epoll a call.
pub(super) const EVENTS: usize = 1024;

pub(super) struct Worker {
    pub(super) cfg: WorkerConfig,
    pub(super) poll: Poll,
    pub(super) time: TurnClock,
    pub(super) listeners: Listeners,
    pub(super) conns: Conns,
    /// Connections reported readable and not yet read.
    pub(super) ready: Ready,
    /// Connections that hit `READS_PER_TURN` and still have input waiting. Not in
    /// `ready`: epoll will not report them again until more arrives, so they are read on
    /// to "would block" (right after the batch that left them), not up to a short read.
    pub(super) again: Vec<usize>,
    pub(super) timers: Timers,
    pub(super) link: SupervisorLink,
    pub(super) sessions: Sessions,
    /// TLS on the client listeners, when it is on.
    pub(super) tls: Option<tls::Tls>,
    pub(super) shakes: Shakes,
    pub(super) broadcasts: Broadcasts,
    pub(super) stats: WorkerStats,
    /// Shake latency of the current second (µs).
    pub(super) latency: Histogram<u64>,
    pub(super) output: Output,
    /// Draining (SIGTERM): the pacing, and the connections still to let go, in turn.
    pub(super) drain: Option<Drain>,
    pub(super) drain_order: Vec<usize>,
    pub(super) shutdown: bool,
}

/// The worker's clock as the turn read it. One reading a poll, not one a read: a clock
/// read costs ~0.1 µs on a VM, and a shake once needed six (docs/BENCHMARKS.md).
pub(super) struct TurnClock {
    pub(super) clock: Clock,
    /// When the last poll returned: what the rest of the turn needs of the time (its
    /// reads, the pacer, the tick, the next poll's timeout) without reading it again. A
    /// turn is a batch of reads, about a millisecond.
    pub(super) polled: Uptime,
    /// As of the read being handled, for everything its requests need of it: the
    /// turn's `polled` for the connections epoll reported, a reading of its own for
    /// those read on from `again`.
    pub(super) read: Uptime,
    /// When the kernel received the newest bytes of the current read.
    pub(super) received: Option<UnixTime>,
}

impl TurnClock {
    /// The Unix time of the read being handled (no clock read).
    pub(super) fn read_unix(&self) -> UnixTime {
        self.clock.unix(self.read)
    }
}

impl Worker {
    /// The clock read now (not the turn's reading).
    pub(super) fn now(&self) -> Uptime {
        self.time.clock.now()
    }

    pub(super) fn event_loop(&mut self) -> Result<()> {
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
