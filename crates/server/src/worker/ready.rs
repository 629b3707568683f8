//! The worker's queue of connections reported readable and not yet read, and the order
//! it reads them in: controlled delay with adaptive LIFO (Facebook, "Fail at Scale", ACM
//! Queue 2015).
//!
//! If the oldest queued connection has waited more than TARGET (100 ms) continuously for
//! INTERVAL (500 ms), the queue is standing: pop the newest first (LIFO) — except that
//! every OLDEST_EVERY-th (8th) pop takes the oldest if it has waited over OLDEST_AFTER (1 s)
//! — until the queue empties or the oldest wait is under TARGET again; otherwise pop the
//! oldest first (FIFO).
//!
//! Why it drains an overload that FIFO never drains: each connection sends a request every
//! few seconds, and edge-triggered epoll reports a connection again whenever new bytes
//! reach it. The event loop (`mod.rs`) queues what epoll reports here and reads a batch at
//! a time. After a stall the kernel holds seconds of requests; read oldest first, every
//! request read is already late, each costs its read and write whether it is served or
//! shed, and the queue never shortens. Read newest first, the connections just reported
//! carry fresh requests and are served at once; a connection left behind is reported
//! again when its next request comes, moves to the newest end (`push` of a queued key),
//! and one read takes its old request(s) with the new one — so the backlog dissolves
//! within one send interval at almost no extra cost. Shakes that waited past
//! `max_queue_ms` are still shed by the handler's share rule; in this order there is no
//! shake cap (`handler.rs`). A short deadline while the queue stands (FB's other half)
//! was tried and dropped: on two cores twelve workers wait for a CPU for tens of ms, and
//! a 20 ms deadline shed most of what each read after such a wait (docs/BENCHMARKS.md).
//!
//! Why one pop in OLDEST_EVERY takes the oldest: newest first alone never reaches a
//! connection that sends nothing more while the queue stands — a client backing off, or
//! one waiting for the answer to what it sent (an open, a login) — for as long as the
//! overload lasts. With one pop in eight from the head, a connection that has waited a
//! second is read within about 8·L pops (L: the connections queued before it) whatever
//! arrives, and the shakes read there, late, are shed — which tells their clients to back
//! off, the signal a queue read newest first never sends — at the cost of at most an
//! eighth of the reads while the queue stands. (The quick bench's opens left unanswered
//! for 40 s and more in a saturated phase were mostly another cause — a write per answer
//! made a backlogged connection's read ever dearer, mod.rs — but this bound is what keeps
//! a silent connection from waiting out the whole overload; docs/BENCHMARKS.md.)
//!
//! The queue holds each connection once: a key pushed again leaves its older entry behind
//! as stale (its push number is no longer the key's), skipped when met, and the deque is
//! compacted when stale entries outnumber live ones. So it is bounded by twice the
//! worker's connections, and each operation is O(1) amortized. Time is passed in (the
//! worker's `Uptime`), never read here, so tests run on a simulated clock.

use std::collections::VecDeque;
use std::time::Duration;

use hongbao_sys::clock::Uptime;

use crate::config::ReadyOrder;

/// A queued connection waiting longer than this is a queue, not a burst (CoDel's target).
/// Not CoDel's 5 ms: on two cores a worker among a dozen waits for a CPU for tens of ms
/// as a matter of course, and at 5 ms (and at 50) the queue stood at a steady 60,000/s
/// that FIFO served with a p99 of 5–16 ms — read newest first for good, it left the
/// oldest seconds behind (docs/BENCHMARKS.md). Half the bench's `max_queue_ms`: a queue
/// whose head is this old is one FIFO would soon be shedding.
pub(super) const TARGET: Duration = Duration::from_millis(100);
/// ...and a queue over TARGET this long is standing (CoDel's interval, scaled alike): a
/// backlog of half a second, not a moment's wait for a CPU.
pub(super) const INTERVAL: Duration = Duration::from_millis(500);

/// While the queue stands, every this-many-th pop takes the oldest (the module header)...
pub(super) const OLDEST_EVERY: u64 = 8;
/// ...if it has waited longer than this: twice INTERVAL, so that a backlog of connections
/// that do send again dissolves by their sending, newest first, as before.
pub(super) const OLDEST_AFTER: Duration = Duration::from_secs(1);

/// Stale entries beyond twice the live ones, plus this, make `push` compact the deque:
/// the slack keeps a small queue from compacting on every push.
const COMPACT_SLACK: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: usize,
    /// The key's push number when this entry was made.
    push: u64,
    /// When it was pushed (µs since the worker started).
    at_us: u64,
}

/// Connections read from `Ready` between two looks at epoll (adaptive order). A read that
/// answers a shake costs a few µs (its read and write calls), so a batch is about a
/// millisecond: connections epoll reports meanwhile join the queue well inside its
/// TARGET, so the newest are known when the queue stands, while one epoll_wait with no
/// timeout per batch costs under 1% of the batch.
pub(super) const READ_BATCH: usize = 128;

/// How many ready connections a turn of the loop reads: every one queued in FIFO order; a
/// batch in the adaptive order, and four while a broadcast is being written. A turn then
/// writes a broadcast slice after its reads, and a batch of 128 left shakes queued behind
/// slice after slice (docs/BENCHMARKS.md: at 20,000 connections, 60,000 shakes/s, a
/// broadcast every 5 s and another process taking CPU meanwhile, the shakes' p99 fell
/// from 31–50 ms to 17–19 reading every ready connection); four batches are more than a
/// busy turn finds there, and still bound a turn when the queue stands, so the broadcast
/// goes on and epoll is seen between turns.
pub(super) fn read_batch(order: ReadyOrder, broadcasting: bool) -> usize {
    match order {
        ReadyOrder::Adaptive if broadcasting => BROADCAST_READ_BATCHES * READ_BATCH,
        ReadyOrder::Adaptive => READ_BATCH,
        ReadyOrder::Fifo => usize::MAX,
    }
}

/// Batches a turn reads while a broadcast is being written (`read_batch`).
const BROADCAST_READ_BATCHES: usize = 4;

/// The queue's room kept once it empties (entries).
const SHRINK_PAST: usize = 4096;

pub(super) struct Ready {
    order: ReadyOrder,
    /// Entries in push order, oldest at the front; some stale.
    entries: VecDeque<Entry>,
    /// By slab key: the push number of its live entry, 0 when it has none.
    live: Vec<u64>,
    /// Live entries.
    len: usize,
    pushes: u64,
    /// Since when the oldest wait has been over TARGET (µs), as the pops saw it.
    over_since_us: Option<u64>,
    standing: bool,
    /// Pops since the queue began to stand.
    standing_pops: u64,
}

fn micros(t: Duration) -> u64 {
    t.as_micros() as u64
}

impl Ready {
    pub(super) fn new(order: ReadyOrder) -> Ready {
        Ready {
            order,
            entries: VecDeque::new(),
            live: Vec::new(),
            len: 0,
            pushes: 0,
            over_since_us: None,
            standing: false,
            standing_pops: 0,
        }
    }

    /// Queues `key`, reported readable at `now`; a key already queued moves to the newest
    /// end, with `now` as its time.
    pub(super) fn push(&mut self, key: usize, now: Uptime) {
        if key >= self.live.len() {
            self.live.resize(key + 1, 0);
        }
        if self.live[key] == 0 {
            self.len += 1;
        }
        self.pushes += 1;
        self.live[key] = self.pushes;
        self.entries.push_back(Entry {
            key,
            push: self.pushes,
            at_us: now.as_micros(),
        });
        if self.entries.len() > 2 * self.len + COMPACT_SLACK {
            let live = &self.live;
            self.entries.retain(|e| live[e.key] == e.push);
        }
    }

    /// Forgets `key` (its connection closed): it is not returned, even if its slot is
    /// taken by a new connection, until that one is pushed.
    pub(super) fn remove(&mut self, key: usize) {
        if let Some(push) = self.live.get_mut(key).filter(|p| **p != 0) {
            *push = 0;
            self.len -= 1;
        }
    }

    /// The connection to read next at `now`, in the order the module header states.
    pub(super) fn pop(&mut self, now: Uptime) -> Option<usize> {
        self.drop_stale_front();
        let Some(oldest) = self.entries.front() else {
            self.over_since_us = None;
            self.standing = false;
            // A storm's backlog read: its room let go, so a worker of idle sessions does
            // not keep the storm's peak.
            if self.entries.capacity() > SHRINK_PAST {
                self.entries.shrink_to(SHRINK_PAST);
            }
            return None;
        };
        let now_us = now.as_micros();
        let oldest_wait_us = now_us.saturating_sub(oldest.at_us);
        if self.order == ReadyOrder::Adaptive {
            if oldest_wait_us > micros(TARGET) {
                let since = *self.over_since_us.get_or_insert(now_us);
                self.standing = now_us - since >= micros(INTERVAL);
            } else {
                self.over_since_us = None;
                self.standing = false;
            }
        }
        self.standing_pops = if self.standing {
            self.standing_pops + 1
        } else {
            0
        };
        let head_turn = self.standing_pops.is_multiple_of(OLDEST_EVERY)
            && oldest_wait_us > micros(OLDEST_AFTER);
        let entry = if self.standing && !head_turn {
            loop {
                let e = self.entries.pop_back().expect("a live entry is queued");
                if self.is_live(e) {
                    break e;
                }
            }
        } else {
            self.entries.pop_front().expect("the front is live")
        };
        self.live[entry.key] = 0;
        self.len -= 1;
        Some(entry.key)
    }

    /// Connections queued.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the last `pop` found the queue standing (and so popped the newest).
    #[cfg(test)]
    pub(super) fn standing(&self) -> bool {
        self.standing
    }

    fn is_live(&self, e: Entry) -> bool {
        self.live[e.key] == e.push
    }

    fn drop_stale_front(&mut self) {
        while let Some(&e) = self.entries.front() {
            if self.is_live(e) {
                return;
            }
            self.entries.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The worker's clock at `d` after its start.
    fn at(d: Duration) -> Uptime {
        Uptime::from_duration(d)
    }

    fn drain(r: &mut Ready, now: Duration) -> Vec<usize> {
        std::iter::from_fn(|| r.pop(at(now))).collect()
    }

    #[test]
    fn calm_queues_pop_oldest_first() {
        let mut r = Ready::new(ReadyOrder::Adaptive);
        for key in [3, 1, 2] {
            r.push(key, at(ms(10)));
        }
        assert_eq!(r.len(), 3);
        assert_eq!(drain(&mut r, ms(11)), [3, 1, 2]);
        assert!(r.is_empty() && !r.standing());
    }

    #[test]
    fn turns_lifo_only_after_an_interval_over_target_and_fifo_once_drained() {
        let mut r = Ready::new(ReadyOrder::Adaptive);
        for key in 0..10 {
            r.push(key, at(ms(0)));
        }
        // Over TARGET from here, but not yet for INTERVAL: oldest first.
        let over = TARGET + ms(1);
        assert_eq!(r.pop(at(over)), Some(0));
        assert!(!r.standing());
        assert_eq!(r.pop(at(over + INTERVAL - us(1))), Some(1));
        assert!(!r.standing());
        // An INTERVAL over TARGET: newest first.
        assert_eq!(r.pop(at(over + INTERVAL)), Some(9));
        assert!(r.standing());
        assert_eq!(r.pop(at(over + INTERVAL + ms(1))), Some(8));
        assert_eq!(drain(&mut r, over + INTERVAL + ms(1)), [7, 6, 5, 4, 3, 2]);
        assert!(!r.standing(), "an empty queue stands no more");
        // Calm again: oldest first, even with waits over TARGET for a while.
        let later = ms(10_000);
        r.push(20, at(later));
        r.push(21, at(later + ms(1)));
        assert_eq!(r.pop(at(later + TARGET + ms(10))), Some(20));
        assert!(!r.standing());
    }

    #[test]
    fn a_wait_under_target_in_between_restarts_the_interval() {
        let mut r = Ready::new(ReadyOrder::Adaptive);
        let a = TARGET * 2;
        r.push(0, at(ms(0)));
        r.push(1, at(a));
        for key in 2..5 {
            r.push(key, at(a + ms(1)));
        }
        assert_eq!(r.pop(at(TARGET + ms(1))), Some(0), "over TARGET from here");
        // The oldest (1) waited 2 ms: not a queue, and the clock stops.
        assert_eq!(r.pop(at(a + ms(2))), Some(1));
        // Over TARGET again from here, not since the first pop.
        let over = a + ms(1) + TARGET + ms(1);
        assert_eq!(r.pop(at(over)), Some(2));
        assert!(!r.standing());
        assert_eq!(r.pop(at(over + INTERVAL)), Some(4));
        assert!(r.standing());
    }

    #[test]
    fn falls_back_to_fifo_when_the_oldest_wait_is_under_target_again() {
        let mut r = Ready::new(ReadyOrder::Adaptive);
        for key in 0..4 {
            r.push(key, at(ms(0)));
        }
        let over = TARGET + ms(1);
        r.pop(at(over));
        assert_eq!(r.pop(at(over + INTERVAL)), Some(3));
        assert!(r.standing());
        // The old connections are reported again (new bytes): the oldest wait is fresh.
        let t = over + INTERVAL + ms(10);
        r.push(1, at(t));
        r.push(2, at(t + ms(1)));
        assert_eq!(r.pop(at(t + ms(2))), Some(1));
        assert!(!r.standing());
    }

    #[test]
    fn a_key_pushed_again_moves_to_the_newest_end_and_pops_once() {
        let mut r = Ready::new(ReadyOrder::Adaptive);
        for key in [1, 2, 3] {
            r.push(key, at(ms(0)));
        }
        r.push(1, at(ms(1)));
        assert_eq!(r.len(), 3);
        assert_eq!(drain(&mut r, ms(2)), [2, 3, 1]);
        // Newest first under a standing queue: the moved key comes first, once.
        let mut r = Ready::new(ReadyOrder::Adaptive);
        for key in [1, 2, 3] {
            r.push(key, at(ms(0)));
        }
        let over = TARGET + ms(1);
        r.pop(at(over)); // 1, and the clock starts
        r.push(2, at(over + ms(1)));
        r.push(9, at(over + ms(2)));
        r.push(2, at(over + ms(3)));
        assert_eq!(drain(&mut r, over + INTERVAL), [2, 9, 3]);
        assert!(r.is_empty());
    }

    #[test]
    fn removed_and_stale_keys_are_never_returned() {
        for order in [ReadyOrder::Adaptive, ReadyOrder::Fifo] {
            let mut r = Ready::new(order);
            for key in 0..6 {
                r.push(key, at(ms(0)));
            }
            r.remove(2);
            r.remove(2);
            r.remove(99); // never queued
            r.push(4, at(ms(1)));
            r.remove(4);
            assert_eq!(r.len(), 4);
            let mut popped = vec![r.pop(at(ms(10))).unwrap()];
            popped.extend(drain(&mut r, ms(200)));
            popped.sort();
            assert_eq!(popped, [0, 1, 3, 5], "{order:?}");
            // A slot taken by a new connection is returned once that one is pushed.
            r.push(2, at(ms(300)));
            assert_eq!(drain(&mut r, ms(300)), [2]);
        }
    }

    #[test]
    fn fifo_never_stands() {
        let mut r = Ready::new(ReadyOrder::Fifo);
        for key in 0..100 {
            r.push(key, at(ms(0)));
        }
        let popped: Vec<usize> = (0..100).map(|i| r.pop(at(ms(1000 + i))).unwrap()).collect();
        assert_eq!(popped, (0..100).collect::<Vec<_>>());
        assert!(!r.standing());
    }

    #[test]
    fn stale_entries_are_compacted() {
        let mut r = Ready::new(ReadyOrder::Adaptive);
        for i in 0..100_000u64 {
            r.push((i % 10) as usize, at(us(i)));
        }
        assert_eq!(r.len(), 10);
        assert!(r.entries.len() <= 2 * 10 + COMPACT_SLACK + 1);
        assert_eq!(drain(&mut r, us(100_000)).len(), 10);
    }

    /// What each popped key waited in the queue (µs), by when it was popped.
    struct Popped {
        at_us: u64,
        key: usize,
        waited_us: u64,
    }

    /// A stall leaves `backlog` connections queued at t = 0; from then on a connection is
    /// reported every 100 µs (10,000 a second) and one popped right after: the worker reads
    /// exactly as fast as requests come, so the backlog can only go by being read
    /// together with newer requests. With `repeat`, the reported connections are the
    /// backlog's own, each sending once a second (its interval); else new ones.
    fn backlog(order: ReadyOrder, backlog: usize, repeat: bool, secs: u64) -> (Ready, Vec<Popped>) {
        let mut r = Ready::new(order);
        let mut pushed_at = vec![0u64; 2 * backlog + 10_000 * secs as usize];
        for key in 0..backlog {
            r.push(key, Uptime::ZERO);
        }
        let mut popped = Vec::new();
        for i in 0..10_000 * secs {
            let now_us = i * 100;
            let key = if repeat {
                i as usize % backlog
            } else {
                backlog + i as usize
            };
            pushed_at[key] = now_us;
            r.push(key, at(us(now_us)));
            let key = r.pop(at(us(now_us))).unwrap();
            popped.push(Popped {
                at_us: now_us,
                key,
                waited_us: now_us - pushed_at[key],
            });
        }
        (r, popped)
    }

    #[test]
    fn after_a_stall_new_requests_are_served_at_once_and_the_silent_backlog_within_a_bound() {
        let (backlog_len, secs) = (10_000, 12);
        let (r, popped) = backlog(ReadyOrder::Adaptive, backlog_len, false, secs);
        // The first INTERVAL goes oldest first (about TARGET's worth of it before the
        // clock starts); from then on the newest, within a pop of their report, until the
        // backlog has waited OLDEST_AFTER.
        let standing_from = micros(TARGET + INTERVAL) + 100;
        let head_from = micros(OLDEST_AFTER);
        let late = popped
            .iter()
            .filter(|p| p.at_us >= standing_from && p.at_us <= head_from)
            .map(|p| p.waited_us)
            .max();
        assert_eq!(late, Some(0));
        assert!(r.standing());
        let old = |p: &&Popped| p.key < backlog_len;
        let before = micros(TARGET + INTERVAL) / 100;
        let early = popped
            .iter()
            .filter(|p| p.at_us <= head_from)
            .filter(old)
            .count() as u64;
        assert!(
            (before..=before + 60).contains(&early),
            "{early} old ones read"
        );
        // From then on one pop in OLDEST_EVERY takes the oldest, the rest the newest.
        let after: Vec<&Popped> = popped.iter().filter(|p| p.at_us > head_from).collect();
        let fresh = after.iter().filter(|p| p.waited_us == 0).count() as u64;
        let n = after.len() as u64;
        assert!(
            fresh >= n - n / OLDEST_EVERY - 1,
            "{fresh} of {n} read at once"
        );
        // So every connection of the backlog, silent since the stall, is read: within
        // OLDEST_EVERY pops for each connection queued before it.
        let mut read: Vec<usize> = popped.iter().filter(old).map(|p| p.key).collect();
        read.sort();
        read.dedup();
        assert_eq!(read.len(), backlog_len);
        let bound = head_from + backlog_len as u64 * OLDEST_EVERY * 100 + 1_000;
        let worst = popped.iter().map(|p| p.waited_us).max().unwrap();
        assert!(worst <= bound, "a wait of {worst} µs, bound {bound}");
        assert_eq!(
            r.len(),
            backlog_len,
            "as many pops as reports: the queue's length stays"
        );

        // Oldest first, every request read has waited out the stall's second, for good.
        let (r, popped) = backlog(ReadyOrder::Fifo, backlog_len, false, 2);
        assert!(popped
            .iter()
            .all(|p| p.key < backlog_len || p.waited_us >= 1_000_000));
        assert!(popped[backlog_len..]
            .iter()
            .all(|p| p.waited_us == 1_000_000));
        assert_eq!(r.len(), backlog_len);
    }

    #[test]
    fn a_backlog_of_connections_that_send_again_dissolves_in_one_interval() {
        let (r, popped) = backlog(ReadyOrder::Adaptive, 10_000, true, 3);
        // Each old connection is read when it sends again, together with its new
        // request; by the second interval the queue is calm and oldest first again.
        let worst_after = |from_us: u64| {
            popped
                .iter()
                .filter(|p| p.at_us >= from_us)
                .map(|p| p.waited_us)
                .max()
                .unwrap()
        };
        assert_eq!(worst_after(micros(TARGET + INTERVAL) + 100), 0);
        assert_eq!(worst_after(1_200_000), 0);
        assert!(!r.standing());
        assert!(r.len() <= 1, "{}", r.len());

        // Oldest first: each connection is read about a second after it sent, for good.
        let (r, popped) = backlog(ReadyOrder::Fifo, 10_000, true, 3);
        let waited: Vec<u64> = popped[20_000..].iter().map(|p| p.waited_us).collect();
        assert!(waited.iter().all(|&w| w >= 999_000), "{:?}", &waited[..5]);
        assert!(r.len() >= 9_999);
    }

    #[test]
    fn a_broadcast_under_way_has_four_batches_read_before_each_slice() {
        assert_eq!(read_batch(ReadyOrder::Adaptive, false), READ_BATCH);
        assert_eq!(read_batch(ReadyOrder::Adaptive, true), 4 * READ_BATCH);
        assert_eq!(read_batch(ReadyOrder::Fifo, false), usize::MAX);
        assert_eq!(read_batch(ReadyOrder::Fifo, true), usize::MAX);
    }
}
