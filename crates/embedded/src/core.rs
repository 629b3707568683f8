//! The core: single-threaded owner of all money state — campaigns, packets, balances —
//! in the embedded backend.
//!
//! It is plain code with no sockets. Every change of money is an `Event`: an operation
//! validates, builds the event, applies it to memory at once (so the next operation sees
//! it) and queues it for the ledger. Everything the core says to the outside world (a
//! reply, a notice, a deal of shake packets, an admin answer) is queued in `outbox`
//! tagged with the ledger sequence number current when it was said; `drain_ready`
//! releases it only once the ledger has committed that far. So a client is never told
//! anything — "you won", "already opened", "sent" — that a crash could take back. A
//! restart replays the ledger through `apply`, the same function the live path uses.
//!
//! Deals of shake packets are the one exception to that order: they tell a worker
//! nothing a crash could take back, only which packets it may claim for its shakers, so
//! a deal waits for its campaign's own event to be committed and not behind the wins
//! and sends queued before it (`deals`). A win is still told only once its own event is
//! committed, which is after its campaign's. Held behind every queued win, the packets
//! of a campaign reached the workers in bursts right after each commit, and their wins
//! then waited a whole commit interval for the next one.
//!
//! Who is connected where is not the core's business (presence, beside it): a notice
//! leaves as `Output::Notice` for a user. At login the core pushes the notices of packets
//! whose own notice has already been drained (it could not have reached the new
//! connection); later ones reach it by the normal route, so none arrives twice.

mod apply;
mod campaigns;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use hongbao_money::api::{Notice, MAKER_UNKNOWN};
use hongbao_money::event::{Account, Event, Record};
use hongbao_money::rules::{check_send, shake_packet_parts};
use hongbao_money::seam::{AdminAnswer, AdminRequest, MoneySnapshot, Op, OpKind, Origin, Output};
use hongbao_money::split::next_share;
use hongbao_money::{Audit, Reply, UserId, WorkerId};
use hongbao_proto::ResultCode;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use campaigns::{SendCampaign, ShakeCampaign};

/// How often the core wants `tick` called for an even release (ms).
pub const TICK_INTERVAL_MS: u64 = 5;

#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// How long a sent packet stays openable before its remainder is refunded.
    pub packet_ttl_ms: u64,
    /// Seed for splits and system campaigns; `None` draws one from the OS.
    pub rng_seed: Option<u64>,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            packet_ttl_ms: 24 * 3600 * 1000,
            rng_seed: None,
        }
    }
}

/// A send as asked for.
struct Send {
    amount_cents: u64,
    shares: u32,
    recipients: Vec<u64>,
    idempotency_key: Option<String>,
}

#[derive(Debug)]
struct Packet {
    sender: Account,
    amount_cents: u64,
    shares: u32,
    recipients: Vec<u64>,
    opened: Vec<(u64, u64)>,
    remaining_cents: u64,
    expires_ms: u64,
    expired: bool,
    /// The ledger sequence number of its `PacketSent`.
    created_seq: u64,
}

impl Packet {
    fn remaining_shares(&self) -> u32 {
        self.shares - self.opened.len() as u32
    }

    fn opened_by(&self, user: u64) -> Option<u64> {
        self.opened
            .iter()
            .find(|(u, _)| *u == user)
            .map(|(_, a)| *a)
    }

    fn is_live(&self) -> bool {
        !self.expired && self.remaining_shares() > 0
    }
}

pub struct Core {
    cfg: CoreConfig,
    rng: SmallRng,
    seq: u64,
    /// Every output tagged at or below this has been drained.
    drained_seq: u64,
    new_records: Vec<Record>,
    outbox: VecDeque<(u64, Output)>,
    /// Deals, each tagged with its campaign's sequence number (see the module header).
    deals: Vec<(u64, Output)>,
    minted_cents: u64,
    balances: HashMap<Account, u64>,
    shake: BTreeMap<u32, ShakeCampaign>,
    send: BTreeMap<u32, SendCampaign>,
    packets: HashMap<u64, Packet>,
    expiries: BTreeSet<(u64, u64)>,
    /// Users named in live packets they have not opened: told again at each login.
    pending_notices: HashMap<u64, Vec<u64>>,
    /// Sends made under an idempotency key: (sender, key) → the packet and the sender's
    /// balance right after it (the first answer, given again to a retry).
    idempotent: HashMap<(u64, String), (u64, u64)>,
    next_campaign: u32,
    next_packet: u64,
    /// Live workers and the shake packets sitting in each one's pool.
    workers: BTreeMap<WorkerId, HashSet<u64>>,
    deal_cursor: usize,
    counters: MoneySnapshot,
}

impl Core {
    pub fn new(cfg: CoreConfig) -> Core {
        let rng = match cfg.rng_seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_entropy(),
        };
        Core {
            cfg,
            rng,
            seq: 0,
            drained_seq: 0,
            new_records: Vec::new(),
            outbox: VecDeque::new(),
            deals: Vec::new(),
            minted_cents: 0,
            balances: HashMap::new(),
            shake: BTreeMap::new(),
            send: BTreeMap::new(),
            packets: HashMap::new(),
            expiries: BTreeSet::new(),
            pending_notices: HashMap::new(),
            idempotent: HashMap::new(),
            next_campaign: 1,
            next_packet: 1,
            workers: BTreeMap::new(),
            deal_cursor: 0,
            counters: MoneySnapshot::default(),
        }
    }

    // ----- ledger side --------------------------------------------------------------

    /// Replay one stored event (at start-up, in ledger order).
    pub fn replay(&mut self, record: &Record) {
        assert!(
            record.seq > self.seq,
            "ledger out of order at seq {}",
            record.seq
        );
        self.seq = record.seq;
        self.apply(&record.event, record.ts_ms);
    }

    /// After replay: everything replayed is durable; campaigns resume their schedules
    /// from `now_ms`, and shake packets released but not won before the stop are released
    /// again.
    pub fn resume(&mut self, now_ms: u64) {
        self.drained_seq = self.seq;
        for c in self.shake.values_mut() {
            c.resume(now_ms);
        }
        for c in self.send.values_mut() {
            c.resume(now_ms);
        }
    }

    /// Events created since the last call, for the ledger to write.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.new_records)
    }

    /// Sequence number of the newest event applied.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Outputs whose state the ledger has made durable (tag ≤ `committed_seq`).
    pub fn drain_ready(&mut self, committed_seq: u64, out: &mut Vec<Output>) {
        let ready = self.deals.extract_if(.., |(tag, _)| *tag <= committed_seq);
        out.extend(ready.map(|(_, deal)| deal));
        while let Some((tag, _)) = self.outbox.front() {
            if *tag > committed_seq {
                break;
            }
            out.push(self.outbox.pop_front().expect("looked at").1);
        }
        self.drained_seq = self.drained_seq.max(committed_seq.min(self.seq));
    }

    fn emit(&mut self, out: Output) {
        self.outbox.push_back((self.seq, out));
    }

    fn reply(&mut self, to: Origin, reply: Reply) {
        self.emit(Output::Reply { to, reply });
    }

    /// Answers `to` in turn with everything else the core says (a reply that is not the
    /// core's own, such as a busy ledger reader's).
    pub fn answer(&mut self, to: Origin, reply: Reply) {
        self.reply(to, reply);
    }

    fn record(&mut self, now_ms: u64, event: Event) {
        self.seq += 1;
        self.apply(&event, now_ms);
        self.new_records.push(Record {
            seq: self.seq,
            ts_ms: now_ms,
            event,
        });
    }

    fn credit(&mut self, account: Account, cents: u64) {
        *self.balances.entry(account).or_default() += cents;
    }

    fn debit(&mut self, account: Account, cents: u64) {
        let balance = self
            .balances
            .get_mut(&account)
            .expect("debit of an empty account");
        *balance = balance.checked_sub(cents).expect("debit beyond balance");
        if *balance == 0 {
            self.balances.remove(&account);
        }
    }

    // ----- reads ----------------------------------------------------------------------

    pub fn balance(&self, user: u64) -> u64 {
        self.balances
            .get(&Account::User(user))
            .copied()
            .unwrap_or(0)
    }

    /// Balances keyed as in the ledger's `balances` table, for the start-up check.
    pub fn balances_by_key(&self) -> HashMap<String, u64> {
        self.balances
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(|(a, c)| (a.key(), *c))
            .collect()
    }

    pub fn snapshot(&self) -> MoneySnapshot {
        MoneySnapshot {
            ledger_seq: self.seq,
            ..self.counters.clone()
        }
    }

    /// Recomputes every total from the state itself (not from running sums).
    pub fn audit(&self) -> Audit {
        let mut audit = Audit {
            minted_cents: self.minted_cents,
            ledger_seq: self.seq,
            ..Audit::default()
        };
        for (account, cents) in &self.balances {
            match account {
                Account::User(_) => {
                    audit.user_balances_cents += cents;
                    audit.users_with_balance += 1;
                }
                Account::Campaign(_) => audit.campaign_balances_cents += cents,
            }
        }
        for p in self.packets.values().filter(|p| !p.expired) {
            audit.unopened_cents += p.remaining_cents;
            if p.remaining_shares() > 0 {
                audit.live_packets += 1;
                audit.unopened_shares += p.remaining_shares() as u64;
            }
        }
        let maker = |by: &Option<String>| by.as_deref().unwrap_or(MAKER_UNKNOWN).to_string();
        for c in self.shake.values() {
            audit.unclaimed_cents += c.minted_cents - c.won_cents;
            audit.unclaimed_packets += (c.packets - c.won) as u64;
            *audit.minted_by.entry(maker(&c.by)).or_default() += c.minted_cents;
        }
        for c in self.send.values().filter(|c| c.amount_sent_cents > 0) {
            *audit.minted_by.entry(maker(&c.by)).or_default() += c.amount_sent_cents;
        }
        audit.checked()
    }

    fn notice(&self, packet_id: u64) -> Notice {
        let p = &self.packets[&packet_id];
        Notice {
            packet_id,
            from_user: p.sender.user().and_then(UserId::new),
            amount_cents: p.amount_cents,
            shares: p.shares,
            expires_at_ms: p.expires_ms,
        }
    }

    /// Live packets naming `user` that it has not opened, oldest first; forgets the rest.
    fn waiting_for(&mut self, user: u64) -> Vec<u64> {
        let Some(mut pending) = self.pending_notices.remove(&user) else {
            return Vec::new();
        };
        pending.retain(|id| {
            self.packets
                .get(id)
                .is_some_and(|p| p.is_live() && p.opened_by(user).is_none())
        });
        if !pending.is_empty() {
            self.pending_notices.insert(user, pending.clone());
        }
        pending
    }

    // ----- operations -----------------------------------------------------------------

    /// An operation from a gateway. `Op::Me` is not the core's (the ledger reader's).
    pub fn submit(&mut self, now_ms: u64, origin: Origin, op: Op) {
        match op {
            Op::Claim { packet } => self.claim(now_ms, origin, packet),
            Op::Send {
                amount_cents,
                shares,
                recipients,
                idempotency_key,
            } => {
                let send = Send {
                    amount_cents,
                    shares,
                    recipients,
                    idempotency_key,
                };
                self.send(now_ms, origin, send)
            }
            Op::Open { packet } => self.open(now_ms, origin, packet),
            Op::Notices => {
                let notices = self
                    .waiting_for(origin.user.get())
                    .into_iter()
                    .map(|id| self.notice(id))
                    .collect();
                self.reply(origin, Reply::Notices(notices));
            }
            Op::LoggedIn => self.logged_in(origin.user),
            Op::Me => unreachable!("the embedded backend reads the ledger for Op::Me"),
        }
    }

    /// The user just logged in: notices of the packets waiting for it whose own notice
    /// was already drained (see the module header).
    fn logged_in(&mut self, user: UserId) {
        let drained = self.drained_seq;
        for id in self.waiting_for(user.get()) {
            if self.packets[&id].created_seq <= drained {
                let notice = self.notice(id);
                self.emit(Output::Notice { user, notice });
            }
        }
    }

    /// A worker popped `packet` from its pool for the caller: commit the win.
    fn claim(&mut self, now_ms: u64, to: Origin, packet: u64) {
        let in_pool = self
            .workers
            .get_mut(&to.worker)
            .is_some_and(|pool| pool.remove(&packet));
        let (campaign, index) = shake_packet_parts(packet);
        let amount = match self.shake.get(&campaign) {
            Some(c) if in_pool && !c.is_won(index) => c.amount_of(index),
            _ => {
                // A stale claim (its worker was declared dead meanwhile): not a win.
                return self.answer_shake(to, ResultCode::Nothing, 0, 0);
            }
        };
        let user = to.user.get();
        self.record(
            now_ms,
            Event::ShakeWon {
                campaign,
                index,
                user,
                amount_cents: amount,
            },
        );
        self.answer_shake(to, ResultCode::Won, packet, amount);
    }

    /// The ledger cannot commit: a worker's claim is refused `unavailable` with nothing
    /// recorded, and its packet is dealt back to that worker. Returned, not queued: the
    /// outbox waits for commits that are not coming.
    pub fn refuse_claim(&mut self, to: Origin, packet: u64, why: &str) -> Vec<Output> {
        let mut out = Vec::new();
        let in_pool = self
            .workers
            .get(&to.worker)
            .is_some_and(|pool| pool.contains(&packet));
        let (campaign, index) = shake_packet_parts(packet);
        if let Some(c) = self
            .shake
            .get(&campaign)
            .filter(|c| in_pool && !c.is_won(index))
        {
            out.push(Output::Deal {
                worker: to.worker,
                packets: vec![(packet, c.amount_of(index))],
            });
        }
        out.push(self.refuse(to, OpKind::Shake, why));
        out
    }

    /// The ledger cannot commit: `op` is refused `unavailable` with nothing recorded;
    /// returned, not queued (see `refuse_claim`).
    pub fn refuse(&mut self, to: Origin, op: OpKind, why: &str) -> Output {
        self.counters.replies.count(op, ResultCode::Unavailable);
        Output::Reply {
            to,
            reply: Reply::Error {
                result: ResultCode::Unavailable,
                text: why.into(),
            },
        }
    }

    fn answer_shake(&mut self, to: Origin, result: ResultCode, packet_id: u64, amount_cents: u64) {
        self.counters.replies.count(OpKind::Shake, result);
        let reply = Reply::Shake {
            result,
            packet_id,
            amount_cents,
            retry_after_ms: 0,
        };
        self.reply(to, reply);
    }

    fn send(&mut self, now_ms: u64, to: Origin, send: Send) {
        let user = to.user.get();
        if let Some(key) = &send.idempotency_key {
            if let Some(&(packet_id, balance_cents)) = self.idempotent.get(&(user, key.clone())) {
                return self.retried_send(to, &send, packet_id, balance_cents);
            }
        }
        let Send {
            amount_cents,
            shares,
            recipients,
            idempotency_key,
        } = send;
        let result = check_send(self.balance(user), amount_cents, shares, &recipients);
        let packet_id = if result == ResultCode::Ok {
            let sender = Account::User(user);
            self.new_packet(
                now_ms,
                sender,
                amount_cents,
                shares,
                recipients,
                idempotency_key,
            )
        } else {
            0
        };
        self.counters.replies.count(OpKind::Send, result);
        let reply = Reply::Send {
            result,
            packet_id,
            balance_cents: self.balance(user),
        };
        self.reply(to, reply);
    }

    /// A send whose key was used before: the first answer if it asks for the same packet,
    /// a refusal if it asks for another one; no money moves either way.
    fn retried_send(&mut self, to: Origin, send: &Send, packet_id: u64, balance_cents: u64) {
        let first = &self.packets[&packet_id];
        let same = first.amount_cents == send.amount_cents
            && first.shares == send.shares
            && first.recipients == send.recipients;
        let reply = if same {
            self.counters.replies.count(OpKind::Send, ResultCode::Ok);
            Reply::Send {
                result: ResultCode::Ok,
                packet_id,
                balance_cents,
            }
        } else {
            self.counters
                .replies
                .count(OpKind::Send, ResultCode::BadRequest);
            Reply::Error {
                result: ResultCode::BadRequest,
                text: "this idempotency key was used for a different send".into(),
            }
        };
        self.reply(to, reply);
    }

    fn new_packet(
        &mut self,
        now_ms: u64,
        sender: Account,
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
        idempotency_key: Option<String>,
    ) -> u64 {
        self.counters.send_packets += 1;
        let packet = self.next_packet;
        let expires_ms = now_ms + self.cfg.packet_ttl_ms;
        let event = Event::PacketSent {
            packet,
            sender,
            amount_cents,
            shares,
            recipients: recipients.clone(),
            expires_ms,
            idempotency_key,
        };
        self.record(now_ms, event);
        let notice = self.notice(packet);
        for user in recipients.into_iter().filter_map(UserId::new) {
            self.emit(Output::Notice { user, notice });
        }
        packet
    }

    fn open(&mut self, now_ms: u64, to: Origin, packet_id: u64) {
        let (result, amount_cents) = self.open_share(now_ms, to.user.get(), packet_id);
        self.counters.replies.count(OpKind::Open, result);
        let reply = Reply::Open {
            result,
            packet_id,
            amount_cents,
        };
        self.reply(to, reply);
    }

    fn open_share(&mut self, now_ms: u64, user: u64, packet_id: u64) -> (ResultCode, u64) {
        let Some(p) = self.packets.get(&packet_id) else {
            return (ResultCode::NoSuchPacket, 0);
        };
        if !p.recipients.contains(&user) {
            return (ResultCode::NotARecipient, 0);
        }
        if let Some(amount) = p.opened_by(user) {
            return (ResultCode::AlreadyOpened, amount);
        }
        if p.expired || now_ms >= p.expires_ms {
            return (ResultCode::Expired, 0);
        }
        if p.remaining_shares() == 0 {
            return (ResultCode::Empty, 0);
        }
        let amount = next_share(&mut self.rng, p.remaining_cents, p.remaining_shares());
        self.record(
            now_ms,
            Event::ShareOpened {
                packet: packet_id,
                user,
                amount_cents: amount,
            },
        );
        (ResultCode::Opened, amount)
    }

    /// An operator's request, answered once what it saw (or made) is durable.
    pub fn admin(&mut self, now_ms: u64, ticket: u64, request: AdminRequest) {
        let answer = match request {
            AdminRequest::CreateShake { request, by } => {
                self.create_shake_campaign(now_ms, &request, &by)
            }
            AdminRequest::CreateSend { request, by } => {
                self.create_send_campaign(now_ms, &request, &by)
            }
            AdminRequest::Campaign(id) => match self.campaign(id) {
                Some(status) => AdminAnswer::Campaign(status),
                None => AdminAnswer::NoCampaign(id),
            },
            AdminRequest::Campaigns => AdminAnswer::Campaigns(
                self.campaign_ids()
                    .into_iter()
                    .filter_map(|id| self.campaign(id))
                    .collect(),
            ),
            AdminRequest::Audit => AdminAnswer::Audit(self.audit()),
        };
        self.emit(Output::Admin { ticket, answer });
    }

    // ----- time -----------------------------------------------------------------------

    /// Release shake packets and create send-campaign packets that are due, and expire
    /// packets whose time-to-live ran out. Call often (every few ms) for an even rate.
    pub fn tick(&mut self, now_ms: u64) {
        self.release_shake_packets(now_ms);
        self.create_campaign_packets(now_ms);
        self.expire_packets(now_ms);
    }

    fn expire_packets(&mut self, now_ms: u64) {
        while let Some(&(expires_ms, packet)) = self.expiries.first() {
            if expires_ms > now_ms {
                break;
            }
            let p = &self.packets[&packet];
            let event = Event::PacketExpired {
                packet,
                sender: p.sender,
                refund_cents: p.remaining_cents,
            };
            self.record(now_ms, event);
        }
    }

    /// The rate the core should tick at so that release stays even: ~1 packet per tick.
    pub fn tick_interval_ms(&self) -> u64 {
        TICK_INTERVAL_MS
    }

    // ----- workers --------------------------------------------------------------------

    pub fn worker_up(&mut self, worker: WorkerId) {
        // A worker that comes up again without having gone down first: its old pool
        // belongs to a process that is gone.
        if self.workers.contains_key(&worker) {
            self.worker_down(worker);
        }
        self.workers.insert(worker, HashSet::new());
    }

    /// A worker's link closed: its pool goes back to the campaigns, and what was waiting
    /// to be said to it is dropped.
    pub fn worker_down(&mut self, worker: WorkerId) {
        if let Some(pool) = self.workers.remove(&worker) {
            for id in pool {
                let (campaign, index) = shake_packet_parts(id);
                if let Some(c) = self.shake.get_mut(&campaign) {
                    c.returned.push(index);
                }
            }
        }
        self.deals
            .retain(|(_, out)| !matches!(out, Output::Deal { worker: w, .. } if *w == worker));
        self.outbox.retain(|(_, out)| match out {
            Output::Reply { to, .. } => to.worker != worker,
            Output::Deal { worker: w, .. } => *w != worker,
            Output::Notice { .. }
            | Output::Admin { .. }
            | Output::Push { .. }
            | Output::Broadcast { .. } => true,
        });
    }

    /// Shake packets currently in a worker's pool.
    pub fn pool_len(&self, worker: WorkerId) -> usize {
        self.workers.get(&worker).map_or(0, |p| p.len())
    }
}

#[cfg(test)]
mod tests;
