//! The worker's shake side: its pool of packets to give, the won shakes waiting for the
//! money side, and the overload gate they pass (`overload.rs`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use hongbao_money::{ConnId, UserId};
use hongbao_sys::clock::{UnixTime, Uptime};

use super::overload::{Limits, Overload, Verdict};

/// The worker's shake side: its pool of packets to give (as the money side dealt them), the
/// won shakes waiting for the money side to commit them, and the overload gate.
#[derive(Default)]
pub(super) struct Shakes {
    /// Packets `(id, amount_cents)` dealt to this worker, given out in order.
    pool: VecDeque<(u64, u64)>,
    /// When each shake waiting on the supervisor for a win was read, by (connection, request).
    claims: HashMap<(ConnId, u32), Uptime>,
    /// The shake buckets of users shaking over HTTP (their bearer's), by user: a session
    /// keeps its own on its connection (`limits.rs`). Emptied of full ones each second.
    bearers: HashMap<UserId, u32>,
    overload: Overload,
}

impl Shakes {
    /// Packets the money side dealt this worker, to give after those it holds.
    pub(super) fn deal(&mut self, packets: impl IntoIterator<Item = (u64, u64)>) {
        self.pool.extend(packets);
    }

    /// The packets held, not given yet.
    pub(super) fn pooled(&self) -> usize {
        self.pool.len()
    }

    /// The shake cap's shakes a second now; 0: no cap (`overload.rs`).
    pub(super) fn cap_per_sec(&self) -> u32 {
        self.overload.cap_per_sec()
    }

    /// The overload gate's verdict on a shake read at `now` that waited `waited`
    /// (`Overload::gate`).
    pub(super) fn gate(
        &mut self,
        now: UnixTime,
        waited: Duration,
        users: u64,
        limits: Limits,
    ) -> Verdict {
        self.overload.gate(now, waited, users, limits)
    }

    /// The next packet to give, as a claim of request `req` of `conn` read at `read_at`
    /// (answered by `claimed`); none when the pool is empty.
    pub(super) fn claim(&mut self, conn: ConnId, req: u32, read_at: Uptime) -> Option<u64> {
        let (packet, _amount) = self.pool.pop_front()?;
        self.claims.insert((conn, req), read_at);
        Some(packet)
    }

    /// The shake bucket of `user` shaking over HTTP, filed full at `now_ms` if new.
    pub(super) fn bearer_bucket(&mut self, user: UserId, now_ms: u64) -> &mut u32 {
        self.bearers.entry(user).or_insert(now_ms as u32)
    }

    /// The claim of request `req` of `conn` answered: when its shake was read, if it was
    /// still waiting.
    pub(super) fn claimed(&mut self, conn: ConnId, req: u32) -> Option<Uptime> {
        self.claims.remove(&(conn, req))
    }

    /// Forgets claims older than `after` at `now`: their connection went away, and they
    /// are never answered.
    pub(super) fn forget_claims(&mut self, now: Uptime, after: Duration) {
        self.claims.retain(|_, read_at| now.since(*read_at) < after);
    }

    /// Forgets the HTTP users' shake buckets that are full again at `now`.
    pub(super) fn forget_full_bearers(&mut self, now: Uptime) {
        let now = (now.as_micros() / 1000) as u32;
        self.bearers
            .retain(|_, tat| (tat.wrapping_sub(now) as i32) > 0);
    }
}
