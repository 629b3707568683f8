//! The connection table, one client connection (its state, and the I/O it is read and
//! written with), and the worker's reused output buffers. What the worker does to
//! connections (write, flush, kick, hang up, close) is `write.rs`.
//!
//! The record is what a million connections cost, so it is kept small: the transport is
//! a small enum (`codec.rs`), and the bytes of a request cut by a read (`partial`) or of
//! output the kernel would not take (`out`) live in a box that exists only while there
//! are any.

use hongbao_money::{ConnId, UserId};
use hongbao_sys::clock::UptimeSecs;
use mio::net::TcpStream;
use slab::Slab;

use super::codec::Codec;
use super::session::Checked;
use super::tls;

/// How long a kicked connection may take to read its kick before we close it.
pub(super) const CLOSING_GRACE_SECS: u32 = 2;
/// The largest worker buffer kept for reuse once emptied (`scratch`, `corked`): a rare
/// large answer's is dropped.
const KEPT_BUFFER: usize = 64 * 1024;

/// How far a connection's life has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Open,
    /// The peer shut its write side (`shutdown(SHUT_WR)`): nothing more is read, but the
    /// answers to what it sent are still written; closed once none is awaited and all
    /// are written (or after `CLAIM_FORGET_SECS`).
    Draining,
    /// Goodbye sent and write side shut: waiting for the peer to close, then we close.
    Closing,
}

/// Bytes a connection holds between reads or writes.
#[derive(Default)]
pub(super) struct Buffers {
    /// A request cut by a read.
    pub partial: Vec<u8>,
    /// Output the kernel would not take yet.
    pub out: Vec<u8>,
}

/// One connection: its state, and the I/O it is read and written with (the socket, its
/// TLS session, the codec its transport speaks, the bytes held between reads and writes).
pub(super) struct Conn {
    pub stream: TcpStream,
    pub generation: u32,
    /// When the last bytes were read (or the connect); before a session's login, the
    /// connect (or the WebSocket upgrade) only: what the idle clocks (`tick.rs`) run from.
    pub last_seen: UptimeSecs,
    pub state: ConnState,
    /// The connection's TLS session, on a TLS listener (`tls.rs`).
    pub tls: Option<Box<tls::Session>>,
    pub codec: Codec,
    pub buffers: Option<Box<Buffers>>,
}

/// A connection's state in one place, the way hyper keeps an HTTP/1 connection's
/// (`proto::h1::conn::State`): how far its life has come, what it reads first, what it
/// is owed, who it is and its session. What the transport itself has come to (a
/// WebSocket's upgrade, a TLS handshake) is the I/O's, beside it in `Conn`; when it was
/// last heard from is the idle clocks', beside it too (kept out so the record stays 64
/// bytes: inside, the alignment cost 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ConnState {
    pub phase: Phase,
    /// From a trusted proxy, its PROXY header not read yet (it comes first, whole).
    pub proxy_header: bool,
    /// Requests handed to the supervisor and not yet answered.
    pub awaiting: u16,
    pub user: Option<UserId>,
    /// The logged-in session's token: when it ends, its key.
    pub session: Session,
}

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            phase: Phase::Open,
            proxy_header: false,
            awaiting: 0,
            user: None,
            session: Session::default(),
        }
    }

    /// Open both ways: neither the peer's half-close nor our goodbye has come.
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }
}

/// What a connection keeps of its session (`session.rs`): eleven bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Session {
    /// When the session ends, in Unix seconds (good to 2106); 0 before a login.
    pub ends: u32,
    /// The user's shake bucket (`limits.rs`): when it is full again, in ms of the
    /// worker's uptime, modulo 2^32.
    pub shakes: u32,
    /// The key its token was signed with (`Sessions::kids`).
    pub kid: u16,
    /// A fresh token was asked for (a `refresh` push) and has not come.
    pub asked: bool,
}

impl Session {
    pub(super) fn of(checked: &Checked) -> Session {
        Session {
            ends: checked.ends.min(u64::from(u32::MAX)) as u32,
            shakes: 0,
            kid: checked.kid,
            asked: false,
        }
    }
}

impl Conn {
    pub(super) fn new(stream: TcpStream, generation: u32, now: UptimeSecs, codec: Codec) -> Conn {
        Conn {
            stream,
            generation,
            last_seen: now,
            state: ConnState::new(),
            tls: None,
            codec,
            buffers: None,
        }
    }

    pub(super) fn has_output(&self) -> bool {
        self.buffers.as_ref().is_some_and(|b| !b.out.is_empty())
    }

    /// The partial request, taken out (empty if none).
    pub(super) fn take_partial(&mut self) -> Vec<u8> {
        self.buffers
            .as_mut()
            .map(|b| std::mem::take(&mut b.partial))
            .unwrap_or_default()
    }

    /// Keeps `rest` for the next read.
    pub(super) fn keep_partial(&mut self, rest: Vec<u8>) {
        if !rest.is_empty() {
            self.buffers.get_or_insert_with(Box::default).partial = rest;
        }
        self.drop_empty_buffers();
    }

    pub(super) fn drop_empty_buffers(&mut self) {
        if self
            .buffers
            .as_ref()
            .is_some_and(|b| b.partial.is_empty() && b.out.is_empty())
        {
            self.buffers = None;
        }
    }
}

/// The worker's encoding buffers, reused: a reply encoded into a new `Vec` each cost an
/// allocation and a free per shake.
#[derive(Default)]
pub(super) struct Output {
    /// A decode step's transport answers, a reply, a push (`take_scratch`,
    /// `give_scratch`).
    scratch: Vec<u8>,
    /// The connection whose read is being handled: what is written to it meanwhile is
    /// held in `corked` and written once the read's requests are all answered, one
    /// `write` for them all.
    cork: Option<usize>,
    corked: Vec<u8>,
    /// What a TLS read decrypts to, before the codec reads it (`take_plain`).
    plain: Vec<u8>,
}

impl Output {
    /// The decrypted bytes' buffer, empty.
    pub(super) fn take_plain(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.plain)
    }

    /// Gives it back once the codec has read it.
    pub(super) fn give_plain(&mut self, mut bytes: Vec<u8>) {
        bytes.clear();
        if let Some(bytes) = reusable(bytes) {
            self.plain = bytes;
        }
    }

    /// The encoding buffer, empty (a fresh one if it is already taken).
    pub(super) fn take_scratch(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.scratch)
    }

    /// Gives the encoding buffer back, emptied; a rare large one is not kept.
    pub(super) fn give_scratch(&mut self, bytes: Vec<u8>) {
        if let Some(bytes) = reusable(bytes) {
            self.scratch = bytes;
        }
    }

    /// Holds what is written to `key` until `uncork`.
    pub(super) fn cork(&mut self, key: usize) {
        self.cork = Some(key);
    }

    /// Whether what is written to `key` is being held.
    pub(super) fn is_corked(&self, key: usize) -> bool {
        self.cork == Some(key)
    }

    /// Holds `bytes` for `key` if it is corked; false if it is not (write them now).
    pub(super) fn hold(&mut self, key: usize, bytes: &[u8]) -> bool {
        if self.cork != Some(key) {
            return false;
        }
        self.corked.extend_from_slice(bytes);
        true
    }

    /// Uncorks: the corked connection and what was held for it (empty if nothing), its
    /// buffer to be given back (`give_corked`).
    pub(super) fn uncork(&mut self) -> Option<(usize, Vec<u8>)> {
        let key = self.cork.take()?;
        Some((key, std::mem::take(&mut self.corked)))
    }

    /// Gives the held bytes' buffer back once written.
    pub(super) fn give_corked(&mut self, bytes: Vec<u8>) {
        self.corked = reusable(bytes).unwrap_or_default();
    }

    /// Uncorks `key` without writing what was held (it is closing).
    pub(super) fn drop_cork(&mut self, key: usize) {
        if self.cork == Some(key) {
            self.cork = None;
            self.corked.clear();
        }
    }
}

/// A worker buffer emptied for reuse, or none if it grew past `KEPT_BUFFER` for a rare
/// large answer.
fn reusable(mut bytes: Vec<u8>) -> Option<Vec<u8>> {
    bytes.clear();
    (bytes.capacity() <= KEPT_BUFFER).then_some(bytes)
}

/// The connection table: the records in a slab, and the generation the next one gets.
/// A `ConnId` is a slot and its generation, so an answer for a closed connection can
/// never reach the next owner of its slot.
pub(super) struct Conns {
    slab: Slab<Conn>,
    next_generation: u32,
}

impl Conns {
    /// Room for `capacity`, reserved, not touched: only the records in use become
    /// resident. A slab grown by doubling kept up to twice the records' memory resident
    /// (its new half is written as it moves the old).
    pub(super) fn with_capacity(capacity: usize) -> Conns {
        Conns {
            slab: Slab::with_capacity(capacity),
            next_generation: 1,
        }
    }

    /// The slot the next connection will take.
    pub(super) fn next_key(&self) -> usize {
        self.slab.vacant_key()
    }

    /// Files a new connection in the slot `next_key` named, with the next generation.
    pub(super) fn insert(&mut self, conn: impl FnOnce(u32) -> Conn) -> ConnId {
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        let key = self.slab.insert(conn(generation));
        conn_id(key, generation)
    }

    pub(super) fn get(&self, key: usize) -> Option<&Conn> {
        self.slab.get(key)
    }

    pub(super) fn get_mut(&mut self, key: usize) -> Option<&mut Conn> {
        self.slab.get_mut(key)
    }

    pub(super) fn contains(&self, key: usize) -> bool {
        self.slab.contains(key)
    }

    pub(super) fn remove(&mut self, key: usize) -> Conn {
        self.slab.remove(key)
    }

    pub(super) fn iter(&self) -> slab::Iter<'_, Conn> {
        self.slab.iter()
    }

    pub(super) fn len(&self) -> usize {
        self.slab.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// How many slots there are room for: every key is below it.
    pub(super) fn capacity(&self) -> usize {
        self.slab.capacity()
    }
}

impl std::ops::Index<usize> for Conns {
    type Output = Conn;
    fn index(&self, key: usize) -> &Conn {
        &self.slab[key]
    }
}

impl std::ops::IndexMut<usize> for Conns {
    fn index_mut(&mut self, key: usize) -> &mut Conn {
        &mut self.slab[key]
    }
}

pub(super) fn conn_id(key: usize, generation: u32) -> ConnId {
    ConnId {
        key: key as u32,
        generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a million idle connections cost in the worker, beyond the kernel's share:
    /// our part of the record (the socket handle is 4 bytes in a release build, more in
    /// a debug one, where mio adds a selector id). It was 76 before the wire seam (80
    /// with the handle), 48 before sessions ended (issue 44: their end, key and shake
    /// bucket, 11 bytes, cost 8 with the alignment; a TLS session's box, 8 more: the
    /// session itself is measured in docs/BENCHMARKS.md).
    #[test]
    fn an_idle_connection_is_small() {
        let ours = std::mem::size_of::<Conn>() - std::mem::size_of::<TcpStream>();
        assert!(ours <= 64, "{ours}");
    }
}
