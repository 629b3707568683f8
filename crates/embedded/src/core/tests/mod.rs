//! Tests of the core as a pure state machine: every reply code of shake, send and open,
//! notices at login and by push, the release schedules, replies held back until the
//! ledger has committed what they depend on, and a property test of the money invariants
//! across random operations and restarts (a fresh core replaying the ledger).
//!
//! `Sim` plays the supervisor: it takes the core's records into an in-memory ledger,
//! treats everything as committed at once (unless a test drives the core by hand), routes
//! logins, chat and notices through a real `Presence`, and keeps what the outside world
//! was told (deals, replies and pushes to connections).

use proptest::prelude::*;

use hongbao_money::api::{CampaignKind, CampaignState, CampaignStatus};
use hongbao_money::rules::{
    shake_packet_id, SendCampaignRequest, ShakeCampaignRequest, MAX_CAMPAIGN_PACKETS,
    MAX_PACKET_CENTS,
};
use hongbao_money::{ConnId, Push};
use hongbao_proto::message::MAX_RECIPIENTS;
use hongbao_proto::KickReason;

use super::*;
use hongbao_money::presence::{Delivery, Presence};

const TTL_MS: u64 = 10_000;
const START_MS: u64 = 1_700_000_000_000;

fn config(seed: u64) -> CoreConfig {
    CoreConfig {
        packet_ttl_ms: TTL_MS,
        rng_seed: Some(seed),
    }
}

fn shake_request(
    packets: u32,
    rate_per_sec: u32,
    amount_min: u64,
    amount_max: u64,
) -> ShakeCampaignRequest {
    ShakeCampaignRequest {
        packets,
        rate_per_sec,
        amount_min,
        amount_max,
    }
}

/// Connection number `n` of the tests.
fn cid(n: u64) -> ConnId {
    ConnId {
        key: n as u32,
        generation: 1,
    }
}

fn uid(user: u64) -> UserId {
    UserId::new(user).expect("test users start at 1")
}

fn origin(worker: WorkerId, conn: u64, request: u32, user: u64) -> Origin {
    Origin {
        worker,
        conn: cid(conn),
        request,
        user: uid(user),
    }
}

/// What a connection was told: the reply to a request, or a push.
#[derive(Debug, Clone, PartialEq)]
enum Said {
    Reply(u32, Reply),
    Push(Push),
}

/// One thing said to a client connection.
#[derive(Debug, Clone)]
struct Sent {
    worker: WorkerId,
    conn: ConnId,
    said: Said,
    close: bool,
}

struct Sim {
    cfg: CoreConfig,
    core: Core,
    presence: Presence,
    /// Every record ever taken from the core, across restarts.
    ledger: Vec<Record>,
    /// Balances derived from the ledger alone, as the ledger's `balances` table keeps them.
    ledger_balances: HashMap<Account, i64>,
    /// Recipients of every sent packet, from the ledger.
    recipients: BTreeMap<u64, Vec<u64>>,
    /// Shares opened, from the ledger: (packet, user) → amount.
    opened: HashMap<(u64, u64), u64>,
    /// Shake packets won, from the ledger: (campaign, index).
    won: HashSet<(u32, u32)>,
    now_ms: u64,
    live_workers: BTreeSet<WorkerId>,
    /// Shake packets dealt since the last restart, in order: (worker, packet, amount).
    dealt: Vec<(WorkerId, u64, u64)>,
    /// Everything said to a connection since the last restart.
    sent: Vec<Sent>,
    /// Send packets the clients have heard of (notices and send replies).
    packets: BTreeSet<u64>,
    next_request: u32,
    next_ticket: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let cfg = config(seed);
        Sim {
            core: Core::new(cfg.clone()),
            presence: Presence::default(),
            cfg,
            ledger: Vec::new(),
            ledger_balances: HashMap::new(),
            recipients: BTreeMap::new(),
            opened: HashMap::new(),
            won: HashSet::new(),
            now_ms: START_MS,
            live_workers: BTreeSet::new(),
            dealt: Vec::new(),
            sent: Vec::new(),
            packets: BTreeSet::new(),
            next_request: 0,
            next_ticket: 0,
        }
    }

    /// Takes new records into the ledger, then drains every output (all is committed).
    fn pump(&mut self) -> Vec<AdminAnswer> {
        for record in self.core.take_records() {
            let last = self.ledger.last().map_or(0, |r| r.seq);
            assert_eq!(record.seq, last + 1, "ledger sequence has a gap");
            self.learn(&record);
            self.ledger.push(record);
        }
        let mut outs = Vec::new();
        self.core.drain_ready(self.core.seq(), &mut outs);
        let mut answers = Vec::new();
        for out in outs {
            match out {
                Output::Admin { answer, .. } => answers.push(answer),
                other => self.observe(other),
            }
        }
        answers
    }

    fn learn(&mut self, record: &Record) {
        for (account, delta) in record.event.balance_deltas() {
            *self.ledger_balances.entry(account).or_default() += delta;
        }
        match &record.event {
            Event::PacketSent {
                packet, recipients, ..
            } => {
                self.recipients.insert(*packet, recipients.clone());
            }
            Event::ShareOpened {
                packet,
                user,
                amount_cents,
            } => {
                let first = self.opened.insert((*packet, *user), *amount_cents);
                assert!(first.is_none(), "user {user} opened packet {packet} twice");
            }
            Event::ShakeWon {
                campaign, index, ..
            } => {
                assert!(
                    self.won.insert((*campaign, *index)),
                    "shake packet {index} of campaign {campaign} won twice"
                );
            }
            _ => {}
        }
    }

    fn observe(&mut self, out: Output) {
        match out {
            Output::Deal { worker, packets } => {
                assert!(
                    self.live_workers.contains(&worker),
                    "dealt to dead worker {worker}"
                );
                self.dealt
                    .extend(packets.into_iter().map(|(id, amount)| (worker, id, amount)));
            }
            Output::Reply { to, reply } => {
                if let Reply::Send {
                    result: ResultCode::Ok,
                    packet_id,
                    ..
                } = reply
                {
                    self.packets.insert(packet_id);
                }
                self.sent.push(Sent {
                    worker: to.worker,
                    conn: to.conn,
                    said: Said::Reply(to.request, reply),
                    close: false,
                });
            }
            Output::Notice { user, notice } => {
                self.packets.insert(notice.packet_id);
                if let Some(delivery) = self.presence.notice(user, notice) {
                    self.delivered(delivery);
                }
            }
            Output::Admin { .. } => unreachable!("taken by pump"),
            Output::Push { .. } | Output::Broadcast { .. } => {
                unreachable!("only the cluster backend has other hosts")
            }
        }
    }

    fn delivered(&mut self, delivery: Delivery) {
        self.sent.push(match delivery {
            Delivery::Reply { to, request, reply } => Sent {
                worker: to.worker,
                conn: to.conn,
                said: Said::Reply(request, reply),
                close: false,
            },
            Delivery::Push { to, push, close } => Sent {
                worker: to.worker,
                conn: to.conn,
                said: Said::Push(push),
                close,
            },
        });
    }

    fn request_id(&mut self) -> u32 {
        self.next_request += 1;
        self.next_request
    }

    /// The one reply to request `req` on (worker, conn) among what was said since `mark`.
    fn reply(&self, mark: usize, worker: WorkerId, conn: u64, req: u32) -> Reply {
        let mut replies = self.sent[mark..].iter().filter_map(|s| match &s.said {
            Said::Reply(r, reply) if s.worker == worker && s.conn == cid(conn) && *r == req => {
                Some(reply)
            }
            _ => None,
        });
        let reply = replies.next().expect("every request is answered");
        assert!(replies.next().is_none(), "two replies to request {req}");
        reply.clone()
    }

    /// Pushes to (worker, conn) since `mark`.
    fn pushes(&self, mark: usize, worker: WorkerId, conn: u64) -> Vec<(Push, bool)> {
        self.sent[mark..]
            .iter()
            .filter_map(|s| match &s.said {
                Said::Push(push) if s.worker == worker && s.conn == cid(conn) => {
                    Some((push.clone(), s.close))
                }
                _ => None,
            })
            .collect()
    }

    fn worker_up(&mut self, worker: WorkerId) {
        self.core.worker_up(worker);
        self.live_workers.insert(worker);
        self.pump();
    }

    fn worker_down(&mut self, worker: WorkerId) {
        self.core.worker_down(worker);
        self.presence.worker_down(worker);
        self.live_workers.remove(&worker);
        self.pump();
    }

    /// A login, as the supervisor handles it: presence answers, the core pushes what
    /// waits for the user.
    fn online(&mut self, worker: WorkerId, conn: u64, user: u64) {
        let origin = origin(worker, conn, 0, user);
        for delivery in self.presence.login(origin, 0).expect("no revocations here") {
            self.delivered(delivery);
        }
        self.core.submit(self.now_ms, origin, Op::LoggedIn);
        self.pump();
    }

    fn offline(&mut self, worker: WorkerId, conn: u64, user: u64) {
        self.presence.offline(worker, cid(conn), uid(user));
    }

    fn tick_to(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.core.tick(now_ms);
        self.pump();
    }

    /// Moves the clock on by `ms` in one tick.
    fn advance(&mut self, ms: u64) {
        self.tick_to(self.now_ms + ms);
    }

    /// Moves the clock on by `ms`, ticking every `step_ms` as the supervisor does.
    fn advance_in_ticks(&mut self, ms: u64, step_ms: u64) {
        let end = self.now_ms + ms;
        while self.now_ms < end {
            self.tick_to((self.now_ms + step_ms).min(end));
        }
    }

    fn claim(&mut self, worker: WorkerId, conn: u64, user: u64, packet: u64) -> Reply {
        let (mark, req) = (self.sent.len(), self.request_id());
        let origin = origin(worker, conn, req, user);
        self.core.submit(self.now_ms, origin, Op::Claim { packet });
        self.pump();
        self.reply(mark, worker, conn, req)
    }

    /// Returns (result, packet id, balance after).
    fn send(
        &mut self,
        user: u64,
        amount_cents: u64,
        shares: u32,
        recipients: &[u64],
    ) -> (ResultCode, u64, u64) {
        match self.send_keyed(user, amount_cents, shares, recipients, None) {
            Reply::Send {
                result,
                packet_id,
                balance_cents,
            } => (result, packet_id, balance_cents),
            other => panic!("send answered with {other:?}"),
        }
    }

    fn send_keyed(
        &mut self,
        user: u64,
        amount_cents: u64,
        shares: u32,
        recipients: &[u64],
        key: Option<&str>,
    ) -> Reply {
        let (mark, req) = (self.sent.len(), self.request_id());
        let op = Op::Send {
            amount_cents,
            shares,
            recipients: recipients.to_vec(),
            idempotency_key: key.map(str::to_string),
        };
        self.core
            .submit(self.now_ms, origin(0, user, req, user), op);
        self.pump();
        self.reply(mark, 0, user, req)
    }

    /// Returns (result, amount).
    fn open(&mut self, user: u64, packet: u64) -> (ResultCode, u64) {
        let (mark, req) = (self.sent.len(), self.request_id());
        let op = Op::Open { packet };
        self.core
            .submit(self.now_ms, origin(0, user, req, user), op);
        self.pump();
        match self.reply(mark, 0, user, req) {
            Reply::Open {
                result,
                packet_id,
                amount_cents,
            } => {
                assert_eq!(packet_id, packet);
                (result, amount_cents)
            }
            other => panic!("open answered with {other:?}"),
        }
    }

    fn chat(&mut self, user: u64, to_user: u64, text: &str) -> ResultCode {
        let (mark, req) = (self.sent.len(), self.request_id());
        let origin = origin(0, user, req, user);
        for delivery in self.presence.chat(origin, to_user, text.into()) {
            self.delivered(delivery);
        }
        match self.reply(mark, 0, user, req) {
            Reply::Chat { result } => result,
            other => panic!("chat answered with {other:?}"),
        }
    }

    fn admin(&mut self, request: AdminRequest) -> AdminAnswer {
        self.next_ticket += 1;
        self.core.admin(self.now_ms, self.next_ticket, request);
        let mut answers = self.pump();
        assert_eq!(answers.len(), 1, "one answer per admin request");
        answers.remove(0)
    }

    fn shake_campaign(&mut self, req: &ShakeCampaignRequest) -> u32 {
        let by = "test-operator".to_string();
        match self.admin(AdminRequest::CreateShake {
            request: req.clone(),
            by,
        }) {
            AdminAnswer::Campaign(status) => status.id,
            other => panic!("a valid campaign: {other:?}"),
        }
    }

    fn send_campaign(&mut self, req: &SendCampaignRequest) -> u32 {
        let by = "test-operator".to_string();
        match self.admin(AdminRequest::CreateSend {
            request: req.clone(),
            by,
        }) {
            AdminAnswer::Campaign(status) => status.id,
            other => panic!("a valid campaign: {other:?}"),
        }
    }

    /// Gives `user` exactly `cents` by letting them win a one-packet shake campaign.
    fn fund(&mut self, user: u64, cents: u64) {
        if self.live_workers.is_empty() {
            self.worker_up(0);
        }
        let before = self.core.balance(user);
        let campaign = self.shake_campaign(&shake_request(1, 1000, cents, cents));
        self.advance(1);
        let id = shake_packet_id(campaign, 0);
        let &(worker, _, _) = self
            .dealt
            .iter()
            .find(|d| d.1 == id)
            .expect("the packet was dealt");
        let reply = self.claim(worker, user, user, id);
        assert!(matches!(
            reply,
            Reply::Shake {
                result: ResultCode::Won,
                ..
            }
        ));
        assert_eq!(self.core.balance(user), before + cents);
    }

    /// Send packets created since the start, from the ledger: (packet, sender, amount,
    /// shares, recipients).
    fn sent_packets(&self) -> Vec<(u64, Account, u64, u32, Vec<u64>)> {
        self.ledger
            .iter()
            .filter_map(|r| match &r.event {
                Event::PacketSent {
                    packet,
                    sender,
                    amount_cents,
                    shares,
                    recipients,
                    ..
                } => Some((*packet, *sender, *amount_cents, *shares, recipients.clone())),
                _ => None,
            })
            .collect()
    }

    /// The invariants that must hold after every step.
    fn check(&self) {
        let audit = self.core.audit();
        assert!(audit.ok, "money not conserved: {audit:?}");
        assert_eq!(audit.ledger_seq, self.ledger.last().map_or(0, |r| r.seq));
        let from_ledger: HashMap<String, u64> = self
            .ledger_balances
            .iter()
            .filter(|(_, c)| **c != 0)
            .map(|(a, c)| {
                assert!(*c > 0, "{a:?} went negative in the ledger");
                (a.key(), *c as u64)
            })
            .collect();
        assert_eq!(
            self.core.balances_by_key(),
            from_ledger,
            "core balances differ from the ledger's"
        );
    }

    /// A crash and restart: a fresh core replays the whole ledger, then resumes. Workers
    /// and logins are gone until they come back.
    fn restart(&mut self) {
        self.pump();
        let before = self.core.audit();
        let balances_before = self.core.balances_by_key();
        let campaigns_before: Vec<_> = self
            .core
            .campaign_ids()
            .into_iter()
            .map(|id| money_of(&self.core.campaign(id).unwrap()))
            .collect();
        self.core = Core::new(self.cfg.clone());
        self.presence = Presence::default();
        for record in &self.ledger {
            self.core.replay(record);
        }
        self.core.resume(self.now_ms);
        assert_eq!(
            self.core.audit(),
            before,
            "the audit changed across a restart"
        );
        assert_eq!(self.core.balances_by_key(), balances_before);
        let campaigns_after: Vec<_> = self
            .core
            .campaign_ids()
            .into_iter()
            .map(|id| money_of(&self.core.campaign(id).unwrap()))
            .collect();
        assert_eq!(campaigns_after, campaigns_before);
        self.live_workers.clear();
        self.dealt.clear();
        self.sent.clear();
    }
}

/// The money figures of a campaign status (not its release progress, which a restart
/// rewinds to what was won).
#[allow(clippy::type_complexity)]
fn money_of(s: &CampaignStatus) -> (u32, CampaignKind, u32, u32, u64, u64, u64, u64, u64) {
    (
        s.id,
        s.kind,
        s.packets,
        s.won,
        s.won_cents,
        s.minted_cents,
        s.shares_opened,
        s.amount_opened_cents,
        s.refunded_cents,
    )
}

fn result_of_shake(reply: &Reply) -> (ResultCode, u64, u64) {
    match reply {
        Reply::Shake {
            result,
            packet_id,
            amount_cents,
            ..
        } => (*result, *packet_id, *amount_cents),
        other => panic!("shake answered with {other:?}"),
    }
}

mod campaigns;
mod durability;
mod logins;
mod open;
mod property;
mod send;
mod shake;
