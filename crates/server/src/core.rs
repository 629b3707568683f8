//! The core: single-threaded owner of all money state — campaigns, packets, balances —
//! and of the user → connection routes.
//!
//! It is plain code with no sockets. Every change of money is an `Event`: an operation
//! validates, builds the event, applies it to memory at once (so the next operation sees
//! it) and queues it for the ledger. Everything the core says to the outside world (a
//! reply, a notice, a deal of shake packets) is queued in `outbox` tagged with the ledger
//! sequence number current when it was said; `drain_ready` releases it only once the
//! ledger has committed that far. So a client is never told anything — "you won", "already
//! opened", "sent" — that a crash could take back. A restart replays the ledger through
//! `apply`, the same function the live path uses.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use hongbao_proto::message::MAX_RECIPIENTS;
use hongbao_proto::{Frame, KickReason, Message, ResultCode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::event::{shake_amount, Account, Event, Record};
use crate::split::next_share;

/// Identifies a worker process (its index, stable across restarts of that worker).
pub type WorkerId = u16;
/// Identifies one connection inside a worker: slab key in the low 32 bits, generation in
/// the high 32, so a reply for a closed connection never reaches its slot's next owner.
pub type ConnId = u64;

/// Largest amount of a single packet or campaign packet, in cents (10 million yuan).
pub const MAX_PACKET_CENTS: u64 = 1_000_000_000;
/// Most packets a campaign may mint.
pub const MAX_CAMPAIGN_PACKETS: u32 = 100_000_000;

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

/// What the core wants sent somewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// Encoded frames for one client connection; close it after writing when `close`.
    ToConn {
        worker: WorkerId,
        conn: ConnId,
        bytes: Vec<u8>,
        close: bool,
    },
    /// Shake packets `(packet_id, amount_cents)` for a worker's local pool.
    Deal {
        worker: WorkerId,
        packets: Vec<(u64, u64)>,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShakeCampaignRequest {
    pub packets: u32,
    pub rate_per_sec: u32,
    pub amount_min: u64,
    pub amount_max: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendCampaignRequest {
    pub packets: u32,
    pub rate_per_sec: u32,
    pub recipients: u32,
    pub user_min: u64,
    pub user_max: u64,
    pub amount_min: u64,
    pub amount_max: u64,
}

/// `GET /v1/campaigns/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CampaignStatus {
    pub id: u32,
    pub kind: &'static str,
    pub packets: u32,
    pub rate_per_sec: u32,
    /// "running" while packets remain to release/create, then "done".
    pub state: &'static str,
    /// Shake: packets put into play (dealt to workers). Send: packets created.
    pub released: u32,
    pub started_ms: u64,
    pub released_all_ms: Option<u64>,
    /// Shake only: packets won and their amount; the amount minted.
    pub won: u32,
    pub won_cents: u64,
    pub minted_cents: u64,
    /// Send only: shares created and opened, amounts sent, opened and refunded.
    pub shares: u64,
    pub shares_opened: u64,
    pub amount_opened_cents: u64,
    pub refunded_cents: u64,
}

/// `GET /v1/audit`: the conservation check, recomputed from the state itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Audit {
    pub ok: bool,
    pub minted_cents: u64,
    pub user_balances_cents: u64,
    pub campaign_balances_cents: u64,
    pub unopened_cents: u64,
    pub unclaimed_cents: u64,
    pub users_with_balance: u64,
    pub live_packets: u64,
    pub unopened_shares: u64,
    pub unclaimed_packets: u64,
    pub ledger_seq: u64,
}

#[derive(Debug)]
struct ShakeCampaign {
    packets: u32,
    rate_per_sec: u32,
    amount_min: u64,
    amount_max: u64,
    seed: u64,
    minted_cents: u64,
    won_bits: Vec<u64>,
    won: u32,
    won_cents: u64,
    /// Release schedule: `released` reaches `release_base + elapsed × rate`.
    released: u32,
    release_base: u32,
    release_start_ms: u64,
    released_all_ms: Option<u64>,
    started_ms: u64,
    /// Next index to scan for a never-dealt packet.
    scan: u32,
    /// Packets that were dealt to a worker that died: dealt again first.
    returned: Vec<u32>,
}

impl ShakeCampaign {
    fn is_won(&self, index: u32) -> bool {
        self.won_bits[(index / 64) as usize] & (1 << (index % 64)) != 0
    }
}

#[derive(Debug)]
struct SendCampaign {
    packets: u32,
    rate_per_sec: u32,
    recipients: u32,
    user_min: u64,
    user_max: u64,
    amount_min: u64,
    amount_max: u64,
    created: u32,
    release_base: u32,
    release_start_ms: u64,
    released_all_ms: Option<u64>,
    started_ms: u64,
    shares: u64,
    shares_opened: u64,
    amount_sent_cents: u64,
    amount_opened_cents: u64,
    refunded_cents: u64,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    worker: WorkerId,
    conn: ConnId,
}

/// Replies by operation and result, for `/v1/stats` and `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct CoreCounters {
    pub by_result: BTreeMap<(&'static str, &'static str), u64>,
    pub logins: u64,
    pub kicks_replaced: u64,
    pub notices: u64,
    /// Shake packets put into play (again, after a restart).
    pub packets_released: u64,
    /// Sent packets created, by users and by send campaigns.
    pub send_packets: u64,
}

impl CoreCounters {
    fn count(&mut self, op: &'static str, result: ResultCode) {
        *self.by_result.entry((op, result.name())).or_default() += 1;
    }
}

pub struct Core {
    cfg: CoreConfig,
    rng: SmallRng,
    seq: u64,
    new_records: Vec<Record>,
    outbox: VecDeque<(u64, Out)>,
    minted_cents: u64,
    balances: HashMap<Account, u64>,
    shake: BTreeMap<u32, ShakeCampaign>,
    send: BTreeMap<u32, SendCampaign>,
    packets: HashMap<u64, Packet>,
    expiries: BTreeSet<(u64, u64)>,
    /// Users named in live packets they have not opened: told again at each login.
    pending_notices: HashMap<u64, Vec<u64>>,
    next_campaign: u32,
    next_packet: u64,
    routes: HashMap<u64, Route>,
    /// Live workers and the shake packets sitting in each one's pool.
    workers: BTreeMap<WorkerId, HashSet<u64>>,
    deal_cursor: usize,
    pub counters: CoreCounters,
}

/// The id of a shake packet: campaign in the high half, index in the low half.
pub fn shake_packet_id(campaign: u32, index: u32) -> u64 {
    ((campaign as u64) << 32) | index as u64
}

fn frame(request_id: u32, message: Message) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(48);
    hongbao_proto::encode(
        &Frame {
            request_id,
            message,
        },
        &mut bytes,
    );
    bytes
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
            new_records: Vec::new(),
            outbox: VecDeque::new(),
            minted_cents: 0,
            balances: HashMap::new(),
            shake: BTreeMap::new(),
            send: BTreeMap::new(),
            packets: HashMap::new(),
            expiries: BTreeSet::new(),
            pending_notices: HashMap::new(),
            next_campaign: 1,
            next_packet: 1,
            routes: HashMap::new(),
            workers: BTreeMap::new(),
            deal_cursor: 0,
            counters: CoreCounters::default(),
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

    /// After replay: campaigns resume their schedules from `now_ms`. Shake packets that
    /// were released but not won before the stop are released again.
    pub fn resume(&mut self, now_ms: u64) {
        for c in self.shake.values_mut() {
            c.released = c.won;
            c.release_base = c.won;
            c.release_start_ms = now_ms;
            c.scan = 0;
            c.returned.clear();
            if c.won < c.packets {
                c.released_all_ms = None;
            }
        }
        for c in self.send.values_mut() {
            c.release_base = c.created;
            c.release_start_ms = now_ms;
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
    pub fn drain_ready(&mut self, committed_seq: u64, out: &mut Vec<Out>) {
        while let Some((tag, _)) = self.outbox.front() {
            if *tag > committed_seq {
                break;
            }
            out.push(self.outbox.pop_front().unwrap().1);
        }
    }

    fn emit(&mut self, out: Out) {
        self.outbox.push_back((self.seq, out));
    }

    fn reply(&mut self, worker: WorkerId, conn: ConnId, request_id: u32, message: Message) {
        self.emit(Out::ToConn {
            worker,
            conn,
            bytes: frame(request_id, message),
            close: false,
        });
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

    /// The one state transition, shared by the live path and replay.
    fn apply(&mut self, event: &Event, ts_ms: u64) {
        match event {
            Event::ShakeCampaign {
                campaign,
                packets,
                rate_per_sec,
                amount_min,
                amount_max,
                seed,
                minted_cents,
            } => {
                self.minted_cents += minted_cents;
                self.next_campaign = self.next_campaign.max(campaign + 1);
                self.shake.insert(
                    *campaign,
                    ShakeCampaign {
                        packets: *packets,
                        rate_per_sec: *rate_per_sec,
                        amount_min: *amount_min,
                        amount_max: *amount_max,
                        seed: *seed,
                        minted_cents: *minted_cents,
                        won_bits: vec![0; (*packets as usize).div_ceil(64)],
                        won: 0,
                        won_cents: 0,
                        released: 0,
                        release_base: 0,
                        release_start_ms: ts_ms,
                        released_all_ms: None,
                        started_ms: ts_ms,
                        scan: 0,
                        returned: Vec::new(),
                    },
                );
            }
            Event::ShakeWon {
                campaign,
                index,
                user,
                amount_cents,
            } => {
                let c = self
                    .shake
                    .get_mut(campaign)
                    .expect("win in an unknown campaign");
                c.won_bits[(*index / 64) as usize] |= 1 << (index % 64);
                c.won += 1;
                c.won_cents += amount_cents;
                self.credit(Account::User(*user), *amount_cents);
            }
            Event::SendCampaign {
                campaign,
                packets,
                rate_per_sec,
                recipients,
                user_min,
                user_max,
                amount_min,
                amount_max,
            } => {
                self.next_campaign = self.next_campaign.max(campaign + 1);
                self.send.insert(
                    *campaign,
                    SendCampaign {
                        packets: *packets,
                        rate_per_sec: *rate_per_sec,
                        recipients: *recipients,
                        user_min: *user_min,
                        user_max: *user_max,
                        amount_min: *amount_min,
                        amount_max: *amount_max,
                        created: 0,
                        release_base: 0,
                        release_start_ms: ts_ms,
                        released_all_ms: None,
                        started_ms: ts_ms,
                        shares: 0,
                        shares_opened: 0,
                        amount_sent_cents: 0,
                        amount_opened_cents: 0,
                        refunded_cents: 0,
                    },
                );
            }
            Event::PacketSent {
                packet,
                sender,
                amount_cents,
                shares,
                recipients,
                expires_ms,
            } => {
                match sender {
                    Account::User(_) => self.debit(*sender, *amount_cents),
                    Account::Campaign(id) => {
                        self.minted_cents += amount_cents;
                        let c = self
                            .send
                            .get_mut(id)
                            .expect("packet of an unknown campaign");
                        c.created += 1;
                        c.shares += *shares as u64;
                        c.amount_sent_cents += amount_cents;
                        if c.created == c.packets {
                            c.released_all_ms = Some(ts_ms);
                        }
                    }
                }
                for user in recipients {
                    self.pending_notices.entry(*user).or_default().push(*packet);
                }
                self.next_packet = self.next_packet.max(packet + 1);
                self.expiries.insert((*expires_ms, *packet));
                self.packets.insert(
                    *packet,
                    Packet {
                        sender: *sender,
                        amount_cents: *amount_cents,
                        shares: *shares,
                        recipients: recipients.clone(),
                        opened: Vec::new(),
                        remaining_cents: *amount_cents,
                        expires_ms: *expires_ms,
                        expired: false,
                    },
                );
            }
            Event::ShareOpened {
                packet,
                user,
                amount_cents,
            } => {
                let p = self
                    .packets
                    .get_mut(packet)
                    .expect("open of an unknown packet");
                p.opened.push((*user, *amount_cents));
                p.remaining_cents -= amount_cents;
                if p.remaining_shares() == 0 {
                    self.expiries.remove(&(p.expires_ms, *packet));
                }
                if let Account::Campaign(id) = p.sender {
                    if let Some(c) = self.send.get_mut(&id) {
                        c.shares_opened += 1;
                        c.amount_opened_cents += amount_cents;
                    }
                }
                self.credit(Account::User(*user), *amount_cents);
            }
            Event::PacketExpired {
                packet,
                sender,
                refund_cents,
            } => {
                let p = self
                    .packets
                    .get_mut(packet)
                    .expect("expiry of an unknown packet");
                p.expired = true;
                p.remaining_cents -= refund_cents;
                self.expiries.remove(&(p.expires_ms, *packet));
                if let Account::Campaign(id) = sender {
                    if let Some(c) = self.send.get_mut(id) {
                        c.refunded_cents += refund_cents;
                    }
                }
                if *refund_cents > 0 {
                    self.credit(*sender, *refund_cents);
                }
            }
        }
    }

    // ----- admin --------------------------------------------------------------------

    pub fn create_shake_campaign(
        &mut self,
        now_ms: u64,
        req: &ShakeCampaignRequest,
    ) -> Result<CampaignStatus, String> {
        check_campaign_shape(
            req.packets,
            req.rate_per_sec,
            req.amount_min,
            req.amount_max,
            1,
        )?;
        let seed = self.rng.gen();
        let minted_cents = (0..req.packets)
            .map(|i| shake_amount(seed, i, req.amount_min, req.amount_max))
            .sum();
        let campaign = self.next_campaign;
        self.record(
            now_ms,
            Event::ShakeCampaign {
                campaign,
                packets: req.packets,
                rate_per_sec: req.rate_per_sec,
                amount_min: req.amount_min,
                amount_max: req.amount_max,
                seed,
                minted_cents,
            },
        );
        Ok(self.campaign(campaign).expect("just created"))
    }

    pub fn create_send_campaign(
        &mut self,
        now_ms: u64,
        req: &SendCampaignRequest,
    ) -> Result<CampaignStatus, String> {
        check_campaign_shape(
            req.packets,
            req.rate_per_sec,
            req.amount_min,
            req.amount_max,
            req.recipients as u64,
        )?;
        if req.recipients == 0 || req.recipients as usize > MAX_RECIPIENTS {
            return Err(format!("recipients must be 1..={MAX_RECIPIENTS}"));
        }
        if req.user_min == 0 || req.user_max < req.user_min {
            return Err("user_min must be ≥ 1 and user_max ≥ user_min".into());
        }
        if req.user_max - req.user_min + 1 < req.recipients as u64 {
            return Err("the user range holds fewer users than recipients".into());
        }
        let campaign = self.next_campaign;
        self.record(
            now_ms,
            Event::SendCampaign {
                campaign,
                packets: req.packets,
                rate_per_sec: req.rate_per_sec,
                recipients: req.recipients,
                user_min: req.user_min,
                user_max: req.user_max,
                amount_min: req.amount_min,
                amount_max: req.amount_max,
            },
        );
        Ok(self.campaign(campaign).expect("just created"))
    }

    pub fn campaign(&self, id: u32) -> Option<CampaignStatus> {
        if let Some(c) = self.shake.get(&id) {
            return Some(CampaignStatus {
                id,
                kind: "shake",
                packets: c.packets,
                rate_per_sec: c.rate_per_sec,
                state: if c.won == c.packets {
                    "done"
                } else {
                    "running"
                },
                released: c.released,
                started_ms: c.started_ms,
                released_all_ms: c.released_all_ms,
                won: c.won,
                won_cents: c.won_cents,
                minted_cents: c.minted_cents,
                shares: 0,
                shares_opened: 0,
                amount_opened_cents: 0,
                refunded_cents: 0,
            });
        }
        let c = self.send.get(&id)?;
        Some(CampaignStatus {
            id,
            kind: "send",
            packets: c.packets,
            rate_per_sec: c.rate_per_sec,
            state: if c.created == c.packets {
                "done"
            } else {
                "running"
            },
            released: c.created,
            started_ms: c.started_ms,
            released_all_ms: c.released_all_ms,
            won: 0,
            won_cents: 0,
            minted_cents: c.amount_sent_cents,
            shares: c.shares,
            shares_opened: c.shares_opened,
            amount_opened_cents: c.amount_opened_cents,
            refunded_cents: c.refunded_cents,
        })
    }

    pub fn campaign_ids(&self) -> Vec<u32> {
        self.shake.keys().chain(self.send.keys()).copied().collect()
    }

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

    pub fn online_users(&self) -> usize {
        self.routes.len()
    }

    /// Recomputes every total from the state itself (not from running sums).
    pub fn audit(&self) -> Audit {
        let mut user_balances = 0u64;
        let mut campaign_balances = 0u64;
        let mut users_with_balance = 0u64;
        for (account, cents) in &self.balances {
            match account {
                Account::User(_) => {
                    user_balances += cents;
                    users_with_balance += 1;
                }
                Account::Campaign(_) => campaign_balances += cents,
            }
        }
        let (mut unopened_cents, mut live_packets, mut unopened_shares) = (0u64, 0u64, 0u64);
        for p in self.packets.values().filter(|p| !p.expired) {
            unopened_cents += p.remaining_cents;
            if p.remaining_shares() > 0 {
                live_packets += 1;
                unopened_shares += p.remaining_shares() as u64;
            }
        }
        let (mut unclaimed_cents, mut unclaimed_packets) = (0u64, 0u64);
        for c in self.shake.values() {
            unclaimed_cents += c.minted_cents - c.won_cents;
            unclaimed_packets += (c.packets - c.won) as u64;
        }
        let held = user_balances + campaign_balances + unopened_cents + unclaimed_cents;
        Audit {
            ok: held == self.minted_cents,
            minted_cents: self.minted_cents,
            user_balances_cents: user_balances,
            campaign_balances_cents: campaign_balances,
            unopened_cents,
            unclaimed_cents,
            users_with_balance,
            live_packets,
            unopened_shares,
            unclaimed_packets,
            ledger_seq: self.seq,
        }
    }

    // ----- workers and routes ---------------------------------------------------------

    pub fn worker_up(&mut self, worker: WorkerId) {
        // A worker that comes up again without having gone down first: its old pool and
        // routes belong to a process that is gone.
        if self.workers.contains_key(&worker) {
            self.worker_down(worker);
        }
        self.workers.insert(worker, HashSet::new());
    }

    /// A worker's link closed: its pool goes back to the campaigns, its users are offline.
    pub fn worker_down(&mut self, worker: WorkerId) {
        if let Some(pool) = self.workers.remove(&worker) {
            for id in pool {
                if let Some(c) = self.shake.get_mut(&((id >> 32) as u32)) {
                    c.returned.push(id as u32);
                }
            }
        }
        self.routes.retain(|_, r| r.worker != worker);
        self.outbox.retain(|(_, out)| match out {
            Out::ToConn { worker: w, .. } | Out::Deal { worker: w, .. } => *w != worker,
        });
    }

    /// Shake packets currently in a worker's pool.
    pub fn pool_len(&self, worker: WorkerId) -> usize {
        self.workers.get(&worker).map_or(0, |p| p.len())
    }

    /// A user logged in on `conn`. An older connection of the same user is kicked; the
    /// user is told about every live packet naming them that they have not opened.
    pub fn online(&mut self, worker: WorkerId, conn: ConnId, user: u64) {
        self.counters.logins += 1;
        let new = Route { worker, conn };
        if let Some(old) = self.routes.insert(user, new) {
            if old != new {
                self.counters.kicks_replaced += 1;
                let kick = Message::Kick {
                    reason: KickReason::Replaced,
                    text: "logged in elsewhere".into(),
                };
                let bytes = frame(0, kick);
                self.emit(Out::ToConn {
                    worker: old.worker,
                    conn: old.conn,
                    bytes,
                    close: true,
                });
            }
        }
        let Some(mut pending) = self.pending_notices.remove(&user) else {
            return;
        };
        pending.retain(|id| {
            self.packets
                .get(id)
                .is_some_and(|p| p.is_live() && p.opened_by(user).is_none())
        });
        for id in &pending {
            let notice = self.notice(*id);
            self.counters.notices += 1;
            self.emit(Out::ToConn {
                worker,
                conn,
                bytes: frame(0, notice),
                close: false,
            });
        }
        if !pending.is_empty() {
            self.pending_notices.insert(user, pending);
        }
    }

    /// A worker checked `user`'s token on `conn`: answer the login, then take the route
    /// (`online`). Answering here, not in the worker, orders logins as clients see them.
    pub fn login(&mut self, worker: WorkerId, conn: ConnId, request_id: u32, user: u64) {
        let reply = Message::LoginReply {
            result: ResultCode::Ok,
            user_id: user,
        };
        self.reply(worker, conn, request_id, reply);
        self.online(worker, conn, user);
    }

    pub fn offline(&mut self, worker: WorkerId, conn: ConnId, user: u64) {
        if self.routes.get(&user) == Some(&Route { worker, conn }) {
            self.routes.remove(&user);
        }
    }

    fn notice(&self, packet_id: u64) -> Message {
        let p = &self.packets[&packet_id];
        Message::PacketNotice {
            packet_id,
            from_user: p.sender.user().unwrap_or(0),
            amount_cents: p.amount_cents,
            shares: p.shares,
            expires_at_ms: p.expires_ms,
        }
    }

    // ----- client requests --------------------------------------------------------------

    /// A worker popped `packet_id` from its pool for `user`: commit the win.
    pub fn claim(
        &mut self,
        now_ms: u64,
        worker: WorkerId,
        conn: ConnId,
        request_id: u32,
        user: u64,
        packet_id: u64,
    ) {
        let in_pool = self
            .workers
            .get_mut(&worker)
            .is_some_and(|pool| pool.remove(&packet_id));
        let (campaign, index) = ((packet_id >> 32) as u32, packet_id as u32);
        let amount = match self.shake.get(&campaign) {
            Some(c) if in_pool && !c.is_won(index) => {
                shake_amount(c.seed, index, c.amount_min, c.amount_max)
            }
            _ => {
                // A stale claim (its worker was declared dead meanwhile): not a win.
                self.counters.count("shake", ResultCode::Nothing);
                let reply = Message::ShakeReply {
                    result: ResultCode::Nothing,
                    packet_id: 0,
                    amount_cents: 0,
                };
                return self.reply(worker, conn, request_id, reply);
            }
        };
        self.record(
            now_ms,
            Event::ShakeWon {
                campaign,
                index,
                user,
                amount_cents: amount,
            },
        );
        self.counters.count("shake", ResultCode::Won);
        let reply = Message::ShakeReply {
            result: ResultCode::Won,
            packet_id,
            amount_cents: amount,
        };
        self.reply(worker, conn, request_id, reply);
    }

    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        now_ms: u64,
        worker: WorkerId,
        conn: ConnId,
        request_id: u32,
        user: u64,
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
    ) {
        let result = self.check_send(user, amount_cents, shares, &recipients);
        if result != ResultCode::Ok {
            self.counters.count("send", result);
            let balance_cents = self.balance(user);
            let reply = Message::SendReply {
                result,
                packet_id: 0,
                balance_cents,
            };
            return self.reply(worker, conn, request_id, reply);
        }
        let packet = self.new_packet(
            now_ms,
            Account::User(user),
            amount_cents,
            shares,
            recipients,
        );
        self.counters.count("send", ResultCode::Ok);
        let balance_cents = self.balance(user);
        let reply = Message::SendReply {
            result: ResultCode::Ok,
            packet_id: packet,
            balance_cents,
        };
        self.reply(worker, conn, request_id, reply);
    }

    fn check_send(&self, user: u64, amount: u64, shares: u32, recipients: &[u64]) -> ResultCode {
        let distinct: HashSet<&u64> = recipients.iter().collect();
        let well_formed = (1..=MAX_PACKET_CENTS).contains(&amount)
            && shares >= 1
            && shares as u64 <= amount
            && shares as usize <= recipients.len()
            && recipients.len() <= MAX_RECIPIENTS
            && distinct.len() == recipients.len()
            && !recipients.contains(&0);
        if !well_formed {
            ResultCode::BadRequest
        } else if self.balance(user) < amount {
            ResultCode::InsufficientFunds
        } else {
            ResultCode::Ok
        }
    }

    fn new_packet(
        &mut self,
        now_ms: u64,
        sender: Account,
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
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
        };
        self.record(now_ms, event);
        for user in recipients {
            if let Some(route) = self.routes.get(&user).copied() {
                self.counters.notices += 1;
                let bytes = frame(0, self.notice(packet));
                self.emit(Out::ToConn {
                    worker: route.worker,
                    conn: route.conn,
                    bytes,
                    close: false,
                });
            }
        }
        packet
    }

    pub fn open(
        &mut self,
        now_ms: u64,
        worker: WorkerId,
        conn: ConnId,
        request_id: u32,
        user: u64,
        packet_id: u64,
    ) {
        let (result, amount_cents) = self.open_share(now_ms, user, packet_id);
        self.counters.count("open", result);
        let reply = Message::OpenReply {
            result,
            packet_id,
            amount_cents,
        };
        self.reply(worker, conn, request_id, reply);
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

    pub fn chat(
        &mut self,
        worker: WorkerId,
        conn: ConnId,
        request_id: u32,
        user: u64,
        to_user: u64,
        text: String,
    ) {
        let result = match self.routes.get(&to_user).copied() {
            Some(route) => {
                let bytes = frame(
                    0,
                    Message::ChatMessage {
                        from_user: user,
                        text,
                    },
                );
                self.emit(Out::ToConn {
                    worker: route.worker,
                    conn: route.conn,
                    bytes,
                    close: false,
                });
                ResultCode::Delivered
            }
            None => ResultCode::Offline,
        };
        self.counters.count("chat", result);
        self.reply(worker, conn, request_id, Message::ChatReply { result });
    }

    // ----- time -----------------------------------------------------------------------

    /// Release shake packets and create send-campaign packets that are due, and expire
    /// packets whose time-to-live ran out. Call often (every few ms) for an even rate.
    pub fn tick(&mut self, now_ms: u64) {
        self.release_shake_packets(now_ms);
        self.create_campaign_packets(now_ms);
        self.expire_packets(now_ms);
    }

    fn release_shake_packets(&mut self, now_ms: u64) {
        if self.workers.is_empty() {
            return;
        }
        let workers: Vec<WorkerId> = self.workers.keys().copied().collect();
        let mut deals: BTreeMap<WorkerId, Vec<(u64, u64)>> = BTreeMap::new();
        for (&id, c) in self.shake.iter_mut() {
            let mut due: Vec<u32> = std::mem::take(&mut c.returned);
            let elapsed = now_ms.saturating_sub(c.release_start_ms);
            let target = (c.release_base as u64 + elapsed * c.rate_per_sec as u64 / 1000)
                .min(c.packets as u64) as u32;
            while c.released < target {
                while c.is_won(c.scan) {
                    c.scan += 1;
                }
                due.push(c.scan);
                c.scan += 1;
                c.released += 1;
                self.counters.packets_released += 1;
            }
            if c.released == c.packets && c.released_all_ms.is_none() {
                c.released_all_ms = Some(now_ms);
            }
            for index in due {
                let worker = workers[self.deal_cursor % workers.len()];
                self.deal_cursor = self.deal_cursor.wrapping_add(1);
                let amount = shake_amount(c.seed, index, c.amount_min, c.amount_max);
                deals
                    .entry(worker)
                    .or_default()
                    .push((shake_packet_id(id, index), amount));
            }
        }
        for (worker, packets) in deals {
            let pool = self
                .workers
                .get_mut(&worker)
                .expect("dealt to a live worker");
            pool.extend(packets.iter().map(|(id, _)| *id));
            self.emit(Out::Deal { worker, packets });
        }
    }

    fn create_campaign_packets(&mut self, now_ms: u64) {
        let mut due = Vec::new();
        for (&id, c) in &self.send {
            let elapsed = now_ms.saturating_sub(c.release_start_ms);
            let target = (c.release_base as u64 + elapsed * c.rate_per_sec as u64 / 1000)
                .min(c.packets as u64) as u32;
            if target > c.created {
                due.push((id, target - c.created));
            }
        }
        for (id, count) in due {
            for _ in 0..count {
                let c = &self.send[&id];
                let (k, lo, hi) = (c.recipients as usize, c.user_min, c.user_max);
                let amount = self.rng.gen_range(c.amount_min..=c.amount_max);
                let mut recipients = Vec::with_capacity(k);
                while recipients.len() < k {
                    let user = self.rng.gen_range(lo..=hi);
                    if !recipients.contains(&user) {
                        recipients.push(user);
                    }
                }
                self.new_packet(now_ms, Account::Campaign(id), amount, k as u32, recipients);
            }
        }
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
        5
    }
}

fn check_campaign_shape(
    packets: u32,
    rate_per_sec: u32,
    amount_min: u64,
    amount_max: u64,
    min_amount: u64,
) -> Result<(), String> {
    if packets == 0 || packets > MAX_CAMPAIGN_PACKETS {
        return Err(format!("packets must be 1..={MAX_CAMPAIGN_PACKETS}"));
    }
    if rate_per_sec == 0 || rate_per_sec > 1_000_000 {
        return Err("rate_per_sec must be 1..=1000000".into());
    }
    if amount_min < min_amount.max(1) {
        return Err(format!(
            "amount_min must be at least {} cent(s) (one per share)",
            min_amount.max(1)
        ));
    }
    if amount_max < amount_min || amount_max > MAX_PACKET_CENTS {
        return Err(format!(
            "amount_max must be amount_min..={MAX_PACKET_CENTS}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
