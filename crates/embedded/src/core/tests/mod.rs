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

// ----- open ----------------------------------------------------------------------------

#[test]
fn open_pays_each_recipient_once_and_repeats_return_the_same_amount() {
    let mut sim = Sim::new(1);
    sim.fund(1, 1000);
    let (result, packet, balance) = sim.send(1, 900, 3, &[2, 3, 4]);
    assert_eq!((result, balance), (ResultCode::Ok, 100));
    let mut total = 0;
    for user in [2, 3, 4] {
        let (result, amount) = sim.open(user, packet);
        assert_eq!(result, ResultCode::Opened);
        assert!(amount >= 1);
        assert_eq!(sim.core.balance(user), amount);
        let records_before = sim.ledger.len();
        assert_eq!(sim.open(user, packet), (ResultCode::AlreadyOpened, amount));
        assert_eq!(
            sim.ledger.len(),
            records_before,
            "a repeat must not touch the ledger"
        );
        assert_eq!(sim.core.balance(user), amount);
        total += amount;
    }
    assert_eq!(total, 900, "shares add up to the packet");
    let audit = sim.core.audit();
    assert_eq!((audit.unopened_cents, audit.live_packets), (0, 0));
    sim.check();
}

#[test]
fn open_is_empty_once_all_shares_are_taken() {
    let mut sim = Sim::new(2);
    sim.fund(1, 500);
    let (_, packet, _) = sim.send(1, 500, 2, &[2, 3, 4]);
    assert_eq!(sim.open(3, packet).0, ResultCode::Opened);
    assert_eq!(sim.open(4, packet).0, ResultCode::Opened);
    assert_eq!(sim.open(2, packet), (ResultCode::Empty, 0));
    assert_eq!(sim.core.balance(3) + sim.core.balance(4), 500);
    // Fully opened: nothing to refund when its time-to-live runs out.
    sim.advance(TTL_MS + 1);
    assert!(!sim
        .ledger
        .iter()
        .any(|r| matches!(r.event, Event::PacketExpired { .. })));
    sim.check();
}

#[test]
fn open_refuses_non_recipients_and_unknown_packets() {
    let mut sim = Sim::new(3);
    sim.fund(1, 100);
    let (_, packet, _) = sim.send(1, 100, 1, &[2]);
    assert_eq!(sim.open(1, packet), (ResultCode::NotARecipient, 0));
    assert_eq!(sim.open(9, packet), (ResultCode::NotARecipient, 0));
    assert_eq!(sim.open(2, packet + 1000), (ResultCode::NoSuchPacket, 0));
    assert_eq!(sim.open(2, 0), (ResultCode::NoSuchPacket, 0));
    assert_eq!(sim.open(2, packet), (ResultCode::Opened, 100));
    sim.check();
}

#[test]
fn open_after_the_time_to_live_is_expired_and_the_rest_goes_back_to_the_sender() {
    let mut sim = Sim::new(4);
    sim.fund(1, 1000);
    let (_, packet, _) = sim.send(1, 1000, 3, &[2, 3, 4]);
    let sent_at = sim.now_ms;
    let (_, first) = sim.open(2, packet);
    // At the expiry instant, before any tick has expired it, opening is already refused.
    sim.now_ms = sent_at + TTL_MS;
    assert_eq!(sim.open(3, packet), (ResultCode::Expired, 0));
    assert_eq!(sim.core.balance(1), 0);
    sim.tick_to(sent_at + TTL_MS);
    assert_eq!(
        sim.core.balance(1),
        1000 - first,
        "refund of the unopened rest"
    );
    assert_eq!(sim.open(4, packet), (ResultCode::Expired, 0));
    // Whoever opened before the expiry still gets their answer.
    assert_eq!(sim.open(2, packet), (ResultCode::AlreadyOpened, first));
    let audit = sim.core.audit();
    assert_eq!((audit.unopened_cents, audit.live_packets), (0, 0));
    sim.check();
    // Expiry happens once.
    sim.advance(TTL_MS);
    let expiries = sim
        .ledger
        .iter()
        .filter(|r| matches!(r.event, Event::PacketExpired { .. }))
        .count();
    assert_eq!(expiries, 1);
}

// ----- send ----------------------------------------------------------------------------

#[test]
fn send_debits_the_sender_and_notifies_online_recipients() {
    let mut sim = Sim::new(5);
    sim.fund(1, 1000);
    sim.online(0, 20, 2);
    let mark = sim.sent.len();
    let (result, packet, balance) = sim.send(1, 300, 2, &[2, 3]);
    assert_eq!((result, balance), (ResultCode::Ok, 700));
    assert_ne!(packet, 0);
    assert_eq!(sim.core.balance(1), 700);
    let notices = sim.pushes(mark, 0, 20);
    assert_eq!(notices.len(), 1);
    match &notices[0].0 {
        Push::Notice(n) => {
            assert_eq!(
                (n.packet_id, n.from_user, n.amount_cents, n.shares),
                (packet, Some(uid(1)), 300, 2)
            );
            assert_eq!(n.expires_at_ms, sim.now_ms + TTL_MS);
        }
        other => panic!("expected a notice, got {other:?}"),
    }
    assert_eq!(sim.core.audit().unopened_cents, 300);
    sim.check();
}

#[test]
fn a_retried_send_gets_the_first_answer_and_moves_no_money() {
    let mut sim = Sim::new(21);
    sim.fund(1, 1000);
    let first = sim.send_keyed(1, 300, 2, &[2, 3], Some("order-1"));
    let Reply::Send {
        result: ResultCode::Ok,
        packet_id,
        balance_cents: 700,
    } = first
    else {
        panic!("{first:?}")
    };
    // More money arrives; a retry still gets the first answer, and nothing is written.
    sim.fund(1, 50);
    let records = sim.ledger.len();
    assert_eq!(sim.send_keyed(1, 300, 2, &[2, 3], Some("order-1")), first);
    assert_eq!(sim.ledger.len(), records);
    assert_eq!(sim.core.balance(1), 750);
    // The same key for another packet is refused; another key is another packet; the key
    // is the sender's own.
    assert!(matches!(
        sim.send_keyed(1, 301, 2, &[2, 3], Some("order-1")),
        Reply::Error {
            result: ResultCode::BadRequest,
            ..
        }
    ));
    assert!(matches!(
        sim.send_keyed(1, 300, 2, &[2, 3], Some("order-2")),
        Reply::Send { result: ResultCode::Ok, packet_id: p, .. } if p != packet_id
    ));
    sim.fund(9, 300);
    assert!(matches!(
        sim.send_keyed(9, 300, 2, &[2, 3], Some("order-1")),
        Reply::Send { result: ResultCode::Ok, packet_id: p, .. } if p != packet_id
    ));
    // The key is in the ledger: after a restart the retry is still answered the same.
    sim.restart();
    assert_eq!(sim.send_keyed(1, 300, 2, &[2, 3], Some("order-1")), first);
    sim.check();
}

#[test]
fn send_beyond_the_balance_is_insufficient_funds() {
    let mut sim = Sim::new(6);
    sim.fund(1, 100);
    let records = sim.ledger.len();
    assert_eq!(
        sim.send(1, 101, 1, &[2]),
        (ResultCode::InsufficientFunds, 0, 100)
    );
    assert_eq!(
        sim.send(7, 1, 1, &[2]),
        (ResultCode::InsufficientFunds, 0, 0)
    );
    assert_eq!(sim.ledger.len(), records, "a refused send writes nothing");
    assert_eq!(sim.send(1, 100, 1, &[2]), (ResultCode::Ok, 1, 0));
    sim.check();
}

#[test]
fn send_rejects_malformed_packets() {
    let mut sim = Sim::new(7);
    sim.fund(1, 10_000);
    let records = sim.ledger.len();
    let too_many: Vec<u64> = (1..=MAX_RECIPIENTS as u64 + 1).collect();
    let cases: [(u64, u32, &[u64]); 8] = [
        (100, 0, &[2]),     // no shares
        (2, 3, &[2, 3, 4]), // more shares than cents
        (100, 2, &[2, 2]),  // duplicate recipients
        (100, 1, &[]),      // nobody to send to
        (100, 3, &[2, 3]),  // more shares than recipients
        (0, 1, &[2]),       // nothing to send
        (100, 1, &[0]),     // user 0 does not exist
        (100, 1, too_many.as_slice()),
    ];
    for (amount, shares, recipients) in cases {
        let reply = sim.send(1, amount, shares, recipients);
        assert_eq!(
            reply,
            (ResultCode::BadRequest, 0, 10_000),
            "send of {amount} in {shares} to {} recipients",
            recipients.len()
        );
    }
    assert_eq!(
        sim.send(1, MAX_PACKET_CENTS + 1, 1, &[2]).0,
        ResultCode::BadRequest
    );
    assert_eq!(sim.ledger.len(), records);
    assert_eq!(sim.core.balance(1), 10_000);
    // The boundaries themselves are fine: one cent per share, shares = recipients.
    assert_eq!(sim.send(1, 3, 3, &[2, 3, 4]).0, ResultCode::Ok);
    sim.check();
}

// ----- shake ---------------------------------------------------------------------------

#[test]
fn shake_claim_wins_once_and_credits_the_user() {
    let mut sim = Sim::new(8);
    sim.worker_up(0);
    let campaign = sim.shake_campaign(&shake_request(5, 1000, 10, 20));
    sim.advance(5);
    assert_eq!(sim.dealt.len(), 5);
    let (worker, packet, amount) = sim.dealt[0];
    assert_eq!(worker, 0);
    assert!((10..=20).contains(&amount));
    let reply = sim.claim(0, 42, 7, packet);
    assert_eq!(result_of_shake(&reply), (ResultCode::Won, packet, amount));
    assert_eq!(sim.core.balance(7), amount);
    assert_eq!(sim.core.pool_len(0), 4);
    // The same packet again (a confused or malicious worker): nothing, no money.
    let reply = sim.claim(0, 43, 8, packet);
    assert_eq!(result_of_shake(&reply), (ResultCode::Nothing, 0, 0));
    assert_eq!(sim.core.balance(8), 0);
    // A packet never dealt to this worker: nothing.
    let never = shake_packet_id(campaign, 4000);
    assert_eq!(
        result_of_shake(&sim.claim(0, 43, 8, never)).0,
        ResultCode::Nothing
    );
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(
        (status.won, status.won_cents, status.state),
        (1, amount, CampaignState::Running)
    );
    sim.check();
}

#[test]
fn a_dead_workers_pool_is_dealt_again_and_can_be_won() {
    let mut sim = Sim::new(9);
    sim.worker_up(0);
    sim.worker_up(1);
    let campaign = sim.shake_campaign(&shake_request(10, 1000, 1, 100));
    sim.advance(10);
    let pool0: Vec<(u64, u64)> = sim
        .dealt
        .iter()
        .filter(|d| d.0 == 0)
        .map(|d| (d.1, d.2))
        .collect();
    assert_eq!(pool0.len(), 5, "round-robin over two workers");
    assert_eq!(sim.core.pool_len(1), 5);
    sim.worker_down(0);
    // A claim from the dead worker that arrives late is not a win.
    assert_eq!(
        result_of_shake(&sim.claim(0, 1, 1, pool0[0].0)).0,
        ResultCode::Nothing
    );
    let mark = sim.dealt.len();
    sim.advance(1);
    let redealt: Vec<(WorkerId, u64, u64)> = sim.dealt[mark..].to_vec();
    assert_eq!(redealt.len(), 5);
    assert!(redealt.iter().all(|d| d.0 == 1));
    let mut redealt_packets: Vec<(u64, u64)> = redealt.iter().map(|d| (d.1, d.2)).collect();
    redealt_packets.sort();
    let mut expected = pool0.clone();
    expected.sort();
    assert_eq!(redealt_packets, expected, "same packets, same amounts");
    let mut total = 0;
    let all: Vec<(WorkerId, u64, u64)> = sim.dealt.iter().filter(|d| d.0 == 1).copied().collect();
    for (worker, packet, amount) in all {
        let reply = sim.claim(worker, 2, 2, packet);
        assert_eq!(result_of_shake(&reply), (ResultCode::Won, packet, amount));
        total += amount;
    }
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!((status.won, status.state), (10, CampaignState::Done));
    assert_eq!(status.won_cents, total);
    assert_eq!(status.minted_cents, total);
    assert_eq!(sim.core.audit().unclaimed_cents, 0);
    sim.check();
}

#[test]
fn nothing_is_dealt_while_no_worker_is_up() {
    let mut sim = Sim::new(10);
    sim.shake_campaign(&shake_request(10, 1000, 1, 1));
    sim.advance(5);
    assert!(sim.dealt.is_empty());
    sim.worker_up(3);
    sim.advance(1);
    assert!(!sim.dealt.is_empty());
    assert!(sim.dealt.iter().all(|d| d.0 == 3));
}

/// `worker_up` for a worker the core already counts as live replaces its pool with an
/// empty one: the packets in the old pool are neither returned nor claimable, so the
/// campaign can never finish until a restart. The supervisor's "second Hello for the same
/// worker" path reaches this (see the report).
#[test]
fn a_second_worker_up_keeps_or_returns_the_pool() {
    let mut sim = Sim::new(11);
    sim.worker_up(0);
    let campaign = sim.shake_campaign(&shake_request(4, 1000, 5, 5));
    sim.advance(4);
    assert_eq!(sim.core.pool_len(0), 4);
    sim.worker_up(0);
    sim.advance(1000);
    let claimable: Vec<u64> = sim.dealt.iter().map(|d| d.1).collect();
    for packet in claimable {
        sim.claim(0, 1, 1, packet);
    }
    assert_eq!(sim.core.campaign(campaign).unwrap().won, 4);
}

// ----- logins and notices -------------------------------------------------------------

#[test]
fn chat_moves_no_money_and_a_second_login_is_kicked_through_presence() {
    let mut sim = Sim::new(12);
    sim.online(1, 77, 5);
    let mark = sim.sent.len();
    assert_eq!(sim.chat(4, 5, "新年快乐"), ResultCode::Delivered);
    assert_eq!(
        sim.pushes(mark, 1, 77),
        vec![(
            Push::Chat {
                from_user: uid(4),
                text: "新年快乐".into()
            },
            false
        )]
    );
    let mark = sim.sent.len();
    sim.online(0, 10, 5);
    let kicks = sim.pushes(mark, 1, 77);
    assert!(matches!(
        &kicks[..],
        [(
            Push::Kick {
                reason: KickReason::Replaced,
                ..
            },
            true
        )]
    ));
    assert!(sim.ledger.is_empty(), "chat and logins move no money");
}

#[test]
fn packets_sent_while_offline_are_noticed_at_login_until_opened() {
    let mut sim = Sim::new(14);
    sim.fund(1, 600);
    let (_, first, _) = sim.send(1, 300, 1, &[8]);
    let (_, second, _) = sim.send(1, 300, 2, &[8, 9]);
    let mark = sim.sent.len();
    sim.online(2, 80, 8);
    let noticed: Vec<u64> = sim
        .pushes(mark, 2, 80)
        .iter()
        .map(|(push, _)| match push {
            Push::Notice(n) => n.packet_id,
            other => panic!("expected notices, got {other:?}"),
        })
        .collect();
    assert_eq!(noticed, vec![first, second]);
    sim.open(8, first);
    sim.offline(2, 80, 8);
    let mark = sim.sent.len();
    sim.online(2, 81, 8);
    let noticed = sim.pushes(mark, 2, 81);
    assert_eq!(noticed.len(), 1, "opened packets are not noticed again");
    assert!(matches!(noticed[0].0, Push::Notice(n) if n.packet_id == second));
    // Expired packets are not noticed either.
    sim.advance(TTL_MS);
    sim.offline(2, 81, 8);
    let mark = sim.sent.len();
    sim.online(2, 82, 8);
    assert!(sim.pushes(mark, 2, 82).is_empty());
}

// ----- campaigns -----------------------------------------------------------------------

#[test]
fn a_shake_campaign_releases_at_its_rate() {
    let mut sim = Sim::new(15);
    sim.worker_up(0);
    sim.worker_up(1);
    let campaign = sim.shake_campaign(&shake_request(10_000, 200, 1, 1000));
    let mut per_100ms = Vec::new();
    for _ in 0..10 {
        let before = sim.dealt.len();
        sim.advance_in_ticks(100, 5);
        per_100ms.push(sim.dealt.len() - before);
    }
    let dealt = sim.dealt.len();
    assert!(
        (199..=201).contains(&dealt),
        "{dealt} packets in one second at 200/s"
    );
    assert!(
        per_100ms.iter().all(|n| (19..=21).contains(n)),
        "release is even: {per_100ms:?}"
    );
    let to_worker0 = sim.dealt.iter().filter(|d| d.0 == 0).count();
    assert!(
        to_worker0.abs_diff(dealt - to_worker0) <= 1,
        "fair across workers"
    );
    let distinct: HashSet<u64> = sim.dealt.iter().map(|d| d.1).collect();
    assert_eq!(distinct.len(), dealt, "no packet is dealt twice");
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(status.released as usize, dealt);
    assert_eq!(status.released_all_ms, None);
    sim.check();
}

#[test]
fn a_send_campaign_creates_packets_at_its_rate_for_distinct_users_in_range() {
    let mut sim = Sim::new(16);
    let request = SendCampaignRequest {
        packets: 50,
        rate_per_sec: 100,
        recipients: 3,
        user_min: 10,
        user_max: 20,
        amount_min: 300,
        amount_max: 500,
    };
    let campaign = sim.send_campaign(&request);
    sim.advance_in_ticks(250, 5);
    let created = sim.sent_packets();
    assert!(
        (24..=26).contains(&created.len()),
        "{} packets in 250 ms at 100/s",
        created.len()
    );
    sim.advance_in_ticks(1000, 5);
    let created = sim.sent_packets();
    assert_eq!(created.len(), 50);
    for (_, sender, amount, shares, recipients) in &created {
        assert_eq!(*sender, Account::Campaign(campaign));
        assert!((300..=500).contains(amount));
        assert_eq!(*shares, 3);
        assert_eq!(recipients.len(), 3);
        assert!(recipients.iter().all(|u| (10..=20).contains(u)));
        let distinct: HashSet<&u64> = recipients.iter().collect();
        assert_eq!(distinct.len(), 3, "recipients are distinct: {recipients:?}");
    }
    let minted: u64 = created.iter().map(|p| p.2).sum();
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(
        (status.state, status.released, status.shares),
        (CampaignState::Done, 50, 150)
    );
    assert_eq!(status.minted_cents, minted);
    assert!(status.released_all_ms.is_some());
    let audit = sim.core.audit();
    assert_eq!((audit.minted_cents, audit.unopened_cents), (minted, minted));
    // Open one packet fully; the rest expire back to the campaign's account.
    let (packet, _, amount, _, recipients) = created[0].clone();
    for user in recipients {
        assert_eq!(sim.open(user, packet).0, ResultCode::Opened);
    }
    sim.advance(TTL_MS);
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(
        (status.shares_opened, status.amount_opened_cents),
        (3, amount)
    );
    assert_eq!(status.refunded_cents, minted - amount);
    let audit = sim.core.audit();
    assert_eq!(audit.campaign_balances_cents, minted - amount);
    assert_eq!(audit.unopened_cents, 0);
    sim.check();
}

#[test]
fn campaigns_with_bad_shapes_are_refused_and_write_nothing() {
    let mut core = Core::new(config(17));
    let shakes = [
        shake_request(0, 10, 1, 1),
        shake_request(MAX_CAMPAIGN_PACKETS + 1, 10, 1, 1),
        shake_request(10, 0, 1, 1),
        shake_request(10, 1_000_001, 1, 1),
        shake_request(10, 10, 0, 1),
        shake_request(10, 10, 5, 4),
        shake_request(10, 10, 1, MAX_PACKET_CENTS + 1),
    ];
    for req in &shakes {
        assert!(
            matches!(
                core.create_shake_campaign(START_MS, req, "test-operator"),
                AdminAnswer::Refused(_)
            ),
            "{req:?}"
        );
    }
    let good = SendCampaignRequest {
        packets: 10,
        rate_per_sec: 10,
        recipients: 3,
        user_min: 1,
        user_max: 100,
        amount_min: 3,
        amount_max: 10,
    };
    let sends = [
        SendCampaignRequest {
            recipients: 0,
            ..good.clone()
        },
        SendCampaignRequest {
            recipients: MAX_RECIPIENTS as u32 + 1,
            amount_min: 2000,
            amount_max: 2000,
            ..good.clone()
        },
        SendCampaignRequest {
            amount_min: 2,
            ..good.clone()
        },
        SendCampaignRequest {
            user_min: 0,
            ..good.clone()
        },
        SendCampaignRequest {
            user_min: 50,
            user_max: 49,
            ..good.clone()
        },
        SendCampaignRequest {
            user_min: 50,
            user_max: 51,
            ..good.clone()
        },
        SendCampaignRequest {
            packets: 0,
            ..good.clone()
        },
    ];
    for req in &sends {
        assert!(
            matches!(
                core.create_send_campaign(START_MS, req, "test-operator"),
                AdminAnswer::Refused(_)
            ),
            "{req:?}"
        );
    }
    assert!(core.take_records().is_empty());
    assert_eq!(core.seq(), 0);
    let AdminAnswer::Campaign(status) = core.create_send_campaign(START_MS, &good, "test-operator")
    else {
        panic!("a good campaign")
    };
    assert_eq!(
        (status.id, status.kind, status.state),
        (1, CampaignKind::Send, CampaignState::Running)
    );
    let AdminAnswer::Campaign(status) =
        core.create_shake_campaign(START_MS, &shake_request(3, 1, 7, 7), "test-operator")
    else {
        panic!("a good campaign")
    };
    assert_eq!((status.id, status.minted_cents), (2, 21));
    assert_eq!(core.take_records().len(), 2);
}

// ----- durability ----------------------------------------------------------------------

#[test]
fn outputs_wait_until_the_ledger_has_committed_them() {
    let mut core = Core::new(config(18));
    core.worker_up(0);
    let mut outs = Vec::new();
    core.drain_ready(0, &mut outs);
    assert!(outs.is_empty(), "a fresh core has nothing to say");
    let AdminAnswer::Campaign(status) =
        core.create_shake_campaign(START_MS, &shake_request(1, 1000, 50, 50), "test-operator")
    else {
        panic!("a good campaign")
    };
    assert_eq!(core.seq(), 1);
    core.tick(START_MS + 1);
    // The deal depends on the campaign event: held until seq 1 is committed.
    core.drain_ready(0, &mut outs);
    assert!(outs.is_empty());
    core.drain_ready(1, &mut outs);
    let packet = shake_packet_id(status.id, 0);
    assert_eq!(
        outs,
        vec![Output::Deal {
            worker: 0,
            packets: vec![(packet, 50)]
        }]
    );
    outs.clear();
    core.submit(START_MS + 2, origin(0, 5, 1, 5), Op::Claim { packet });
    // Even an answer that depends on nothing new waits behind the uncommitted win.
    core.submit(START_MS + 2, origin(0, 5, 2, 5), Op::Notices);
    core.admin(START_MS + 2, 9, AdminRequest::Audit);
    assert_eq!(core.seq(), 2);
    core.drain_ready(1, &mut outs);
    assert!(outs.is_empty(), "\"you won\" before the win is durable");
    core.drain_ready(2, &mut outs);
    assert_eq!(outs.len(), 3);
    assert_eq!(
        outs[0],
        Output::Reply {
            to: origin(0, 5, 1, 5),
            reply: Reply::Shake {
                result: ResultCode::Won,
                packet_id: packet,
                amount_cents: 50,
                retry_after_ms: 0,
            }
        }
    );
    assert!(matches!(&outs[1], Output::Reply { reply: Reply::Notices(n), .. } if n.is_empty()));
    assert!(matches!(&outs[2], Output::Admin { ticket: 9, answer: AdminAnswer::Audit(a) } if a.ok));
    let mut rest = Vec::new();
    core.drain_ready(u64::MAX, &mut rest);
    assert!(rest.is_empty(), "drained once");
}

/// A deal waits for its campaign's event, not behind the wins queued before it: held
/// there, a campaign's packets reached the workers in bursts right after each commit, and
/// their wins waited a whole commit interval for the next one.
#[test]
fn a_deal_waits_for_its_campaign_and_not_for_the_wins_before_it() {
    let mut core = Core::new(config(19));
    core.worker_up(0);
    core.worker_up(1);
    let AdminAnswer::Campaign(status) =
        core.create_shake_campaign(START_MS, &shake_request(10, 1000, 50, 50), "test-operator")
    else {
        panic!("a good campaign")
    };
    let mut outs = Vec::new();
    core.tick(START_MS + 1);
    core.drain_ready(0, &mut outs);
    assert!(outs.is_empty(), "dealt before the campaign is durable");
    core.drain_ready(1, &mut outs);
    let Some(Output::Deal { worker, packets }) = outs.pop() else {
        panic!("one deal: {outs:?}")
    };
    assert!(outs.is_empty());
    // A win, not yet committed; the next packet is dealt at once all the same.
    let claim = origin(worker, 5, 1, 5);
    core.submit(
        START_MS + 1,
        claim,
        Op::Claim {
            packet: packets[0].0,
        },
    );
    assert_eq!(core.seq(), 2);
    core.tick(START_MS + 2);
    core.drain_ready(1, &mut outs);
    assert!(
        matches!(outs.as_slice(), [Output::Deal { packets, .. }] if packets[0].0 == shake_packet_id(status.id, 1)),
        "{outs:?}"
    );
    outs.clear();
    // The win itself is told only once committed.
    core.drain_ready(1, &mut outs);
    assert!(outs.is_empty(), "\"you won\" before the win is durable");
    core.drain_ready(2, &mut outs);
    assert!(
        matches!(&outs[..], [Output::Reply { to, .. }] if *to == claim),
        "{outs:?}"
    );

    // A deal still held when its worker goes is dropped with the worker's pool.
    let AdminAnswer::Campaign(second) = core.create_shake_campaign(
        START_MS + 3,
        &shake_request(10, 1000, 50, 50),
        "test-operator",
    ) else {
        panic!("a good campaign")
    };
    core.tick(START_MS + 4);
    outs.clear();
    core.drain_ready(2, &mut outs);
    let held: Vec<(u64, WorkerId)> = core
        .deals
        .iter()
        .map(|(tag, d)| match d {
            Output::Deal { worker, packets } => {
                assert_eq!(shake_packet_parts(packets[0].0).0, second.id);
                (*tag, *worker)
            }
            other => panic!("not a deal: {other:?}"),
        })
        .collect();
    assert_eq!(
        held.len(),
        1,
        "the second campaign's deal waits for seq 3: {held:?}"
    );
    assert_eq!(held[0].0, 3);
    core.worker_down(held[0].1);
    outs.clear();
    core.drain_ready(u64::MAX, &mut outs);
    assert!(
        outs.iter()
            .all(|o| !matches!(o, Output::Deal { packets, .. }
            if shake_packet_parts(packets[0].0).0 == second.id)),
        "{outs:?}"
    );
}

/// A notice reaches a user who logs in once: by push if its packet was created after the
/// notices of the login were gathered, or at the login if before.
#[test]
fn a_login_while_a_notice_is_uncommitted_hears_of_the_packet_once() {
    let mut sim = Sim::new(20);
    sim.fund(1, 100);
    // The send is applied but not committed when user 2 logs in.
    let op = Op::Send {
        amount_cents: 100,
        shares: 1,
        recipients: vec![2],
        idempotency_key: None,
    };
    sim.core.submit(sim.now_ms, origin(0, 1, 77, 1), op);
    let mark = sim.sent.len();
    let login = origin(0, 20, 0, 2);
    for delivery in sim.presence.login(login, 0).expect("no revocations here") {
        sim.delivered(delivery);
    }
    sim.core.submit(sim.now_ms, login, Op::LoggedIn);
    sim.pump();
    let notices = sim
        .pushes(mark, 0, 20)
        .into_iter()
        .filter(|(p, _)| matches!(p, Push::Notice(_)))
        .count();
    assert_eq!(notices, 1);
    // A later login hears of it again, once: it is still waiting.
    sim.offline(0, 20, 2);
    let mark = sim.sent.len();
    sim.online(0, 21, 2);
    assert_eq!(sim.pushes(mark, 0, 21).len(), 1);
}

#[test]
fn a_restart_rebuilds_the_money_and_deals_unwon_packets_again() {
    let mut sim = Sim::new(19);
    sim.worker_up(0);
    let campaign = sim.shake_campaign(&shake_request(10, 1000, 1, 100));
    sim.advance(10);
    let dealt = sim.dealt.clone();
    for &(worker, packet, _) in &dealt[..4] {
        sim.claim(worker, 1, 1, packet);
    }
    let (_, packet, _) = sim.send(1, 3, 3, &[2, 3, 4]);
    sim.open(2, packet);
    sim.restart();
    sim.check();
    // Workers come back; the six packets never won are dealt again, the four won are not.
    sim.worker_up(0);
    sim.advance(1000);
    let mut again: Vec<(u64, u64)> = sim.dealt.iter().map(|d| (d.1, d.2)).collect();
    again.sort();
    let mut unwon: Vec<(u64, u64)> = dealt[4..].iter().map(|d| (d.1, d.2)).collect();
    unwon.sort();
    assert_eq!(again, unwon);
    for (packet, amount) in again {
        let reply = sim.claim(0, 6, 6, packet);
        assert_eq!(result_of_shake(&reply), (ResultCode::Won, packet, amount));
    }
    assert_eq!(
        sim.core.campaign(campaign).unwrap().state,
        CampaignState::Done
    );
    // The packet survives too: its notice, its opened share, its unopened ones.
    let mark = sim.sent.len();
    sim.online(0, 3, 3);
    assert_eq!(sim.pushes(mark, 0, 3).len(), 1);
    assert_eq!(sim.open(2, packet), (ResultCode::AlreadyOpened, 1));
    assert_eq!(sim.open(3, packet), (ResultCode::Opened, 1));
    // New packets do not reuse ids.
    let (_, next, _) = sim.send(1, 1, 1, &[2]);
    assert_eq!(next, packet + 1);
    sim.check();
}

// ----- the property --------------------------------------------------------------------

/// Users 1..=USERS exist; recipients may also name USERS + 1..=USERS + 2, who never log in.
const USERS: u64 = 8;

#[derive(Debug, Clone)]
enum Action {
    ShakeCampaign {
        packets: u32,
        rate_per_sec: u32,
        amount_min: u64,
        spread: u64,
    },
    SendCampaign {
        packets: u32,
        rate_per_sec: u32,
        recipients: u32,
        user_min: u64,
        amount_extra: u64,
        spread: u64,
    },
    WorkerUp(WorkerId),
    WorkerDown(WorkerId),
    Online {
        worker: WorkerId,
        conn: u64,
        user: u64,
    },
    Offline {
        user: u64,
    },
    Tick {
        ms: u64,
    },
    Claim {
        pick: usize,
        user: u64,
    },
    Send {
        /// None: whoever has the most money, so that sends often succeed.
        user: Option<u64>,
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
    },
    Open {
        /// Picks among the packets the clients know of; None: a packet that does not exist.
        pick: Option<usize>,
        /// Some: the i-th recipient (mod count); None: `user`, likely not a recipient.
        recipient: Option<usize>,
        user: u64,
    },
    Chat {
        user: u64,
        to_user: u64,
    },
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    let user = 1..=USERS;
    prop_oneof![
        2 => (1u32..40, 1u32..3000, 1u64..200, 0u64..300).prop_map(
            |(packets, rate_per_sec, amount_min, spread)| Action::ShakeCampaign {
                packets,
                rate_per_sec,
                amount_min,
                spread,
            }
        ),
        1 => (1u32..8, 1u32..200, 1u32..4, 1u64..USERS, 0u64..500, 0u64..500).prop_map(
            |(packets, rate_per_sec, recipients, user_min, amount_extra, spread)| {
                Action::SendCampaign {
                    packets,
                    rate_per_sec,
                    recipients,
                    user_min,
                    amount_extra,
                    spread,
                }
            }
        ),
        3 => (0u16..3).prop_map(Action::WorkerUp),
        1 => (0u16..3).prop_map(Action::WorkerDown),
        3 => (0u16..3, 0u64..3, user.clone())
            .prop_map(|(worker, conn, user)| Action::Online { worker, conn, user }),
        1 => user.clone().prop_map(|user| Action::Offline { user }),
        6 => prop_oneof![4 => 0u64..30, 2 => 0u64..2000, 1 => TTL_MS..2 * TTL_MS]
            .prop_map(|ms| Action::Tick { ms }),
        8 => (any::<usize>(), user.clone()).prop_map(|(pick, user)| Action::Claim { pick, user }),
        5 => (
            prop::option::weighted(0.7, user.clone()),
            prop_oneof![3 => 1u64..400, 1 => 1u64..100_000, 1 => Just(0u64)],
            prop_oneof![4 => 1u32..4, 1 => 0u32..6],
            prop_oneof![
                4 => prop::sample::subsequence((1..=USERS + 2).collect::<Vec<_>>(), 1..5),
                1 => prop::collection::vec(1..=USERS + 2, 0..5),
            ],
        )
            .prop_map(|(user, amount_cents, shares, recipients)| Action::Send {
                user,
                amount_cents,
                shares,
                recipients,
            }),
        8 => (
            prop::option::weighted(0.95, any::<usize>()),
            prop::option::weighted(0.8, 0usize..10),
            user.clone(),
        )
            .prop_map(|(pick, recipient, user)| Action::Open {
                pick,
                recipient,
                user,
            }),
        1 => (user.clone(), 1..=USERS + 2).prop_map(|(user, to_user)| Action::Chat { user, to_user }),
        1 => Just(Action::Restart),
    ]
}

impl Sim {
    fn route(&self, user: u64) -> (WorkerId, u64) {
        match self.presence.route(uid(user)) {
            Some(route) => (route.worker, route.conn.key as u64),
            None => (0, user << 8),
        }
    }

    fn run(&mut self, action: &Action) {
        match *action {
            Action::ShakeCampaign {
                packets,
                rate_per_sec,
                amount_min,
                spread,
            } => {
                self.shake_campaign(&shake_request(
                    packets,
                    rate_per_sec,
                    amount_min,
                    amount_min + spread,
                ));
            }
            Action::SendCampaign {
                packets,
                rate_per_sec,
                recipients,
                user_min,
                amount_extra,
                spread,
            } => {
                let amount_min = recipients as u64 + amount_extra;
                self.send_campaign(&SendCampaignRequest {
                    packets,
                    rate_per_sec,
                    recipients,
                    user_min,
                    user_max: (user_min + recipients as u64).max(USERS + 2),
                    amount_min,
                    amount_max: amount_min + spread,
                });
            }
            Action::WorkerUp(worker) => {
                // The supervisor only announces a worker the core does not count as live.
                if !self.live_workers.contains(&worker) {
                    self.worker_up(worker);
                }
            }
            Action::WorkerDown(worker) => self.worker_down(worker),
            Action::Online { worker, conn, user } => {
                if self.live_workers.contains(&worker) {
                    self.online(worker, (user << 8) | conn, user);
                }
            }
            Action::Offline { user } => {
                let (worker, conn) = self.route(user);
                self.offline(worker, conn, user);
            }
            Action::Tick { ms } => self.advance(ms),
            Action::Claim { pick, user } => {
                if self.dealt.is_empty() {
                    return;
                }
                // Any packet dealt since the restart: in a pool, already won, or stranded
                // on a worker that died since.
                let (worker, packet, amount) = self.dealt[pick % self.dealt.len()];
                let (_, conn) = self.route(user);
                let balance = self.core.balance(user);
                let (result, packet_id, amount_cents) =
                    result_of_shake(&self.claim(worker, conn, user, packet));
                match result {
                    ResultCode::Won => {
                        assert_eq!((packet_id, amount_cents), (packet, amount));
                        let last = &self.ledger.last().unwrap().event;
                        let won = Event::ShakeWon {
                            campaign: (packet >> 32) as u32,
                            index: packet as u32,
                            user,
                            amount_cents: amount,
                        };
                        assert_eq!(last, &won, "a win the ledger does not hold");
                        assert_eq!(self.core.balance(user), balance + amount);
                    }
                    ResultCode::Nothing => assert_eq!(self.core.balance(user), balance),
                    other => panic!("claim answered {other:?}"),
                }
            }
            Action::Send {
                user,
                amount_cents,
                shares,
                ref recipients,
            } => {
                let user = user.unwrap_or_else(|| {
                    (1..=USERS)
                        .max_by_key(|u| self.core.balance(*u))
                        .expect("there are users")
                });
                let balance = self.core.balance(user);
                let (result, packet, after) = self.send(user, amount_cents, shares, recipients);
                match result {
                    ResultCode::Ok => {
                        assert_eq!(after, balance - amount_cents);
                        assert_eq!(self.recipients[&packet], *recipients);
                    }
                    ResultCode::InsufficientFunds => {
                        assert!(balance < amount_cents);
                        assert_eq!(after, balance);
                    }
                    ResultCode::BadRequest => assert_eq!(after, balance),
                    other => panic!("send answered {other:?}"),
                }
            }
            Action::Open {
                pick,
                recipient,
                user,
            } => {
                // What the clients heard of; before any notice, whatever the ledger holds
                // (campaign packets for users who were offline).
                let known: Vec<u64> = if self.packets.is_empty() {
                    self.recipients.keys().copied().collect()
                } else {
                    self.packets.iter().copied().collect()
                };
                let packet = match (pick, known.len()) {
                    (Some(pick), n) if n > 0 => known[pick % n],
                    _ => 1 << 40,
                };
                let recipients = self.recipients.get(&packet).cloned().unwrap_or_default();
                let user = match recipient {
                    Some(i) if !recipients.is_empty() => recipients[i % recipients.len()],
                    _ => user,
                };
                let earlier = self.opened.get(&(packet, user)).copied();
                let balance = self.core.balance(user);
                let (result, amount) = self.open(user, packet);
                match result {
                    ResultCode::Opened => {
                        assert!(earlier.is_none());
                        assert_eq!(self.opened.get(&(packet, user)), Some(&amount));
                        assert!(amount >= 1);
                        assert_eq!(self.core.balance(user), balance + amount);
                    }
                    ResultCode::AlreadyOpened => assert_eq!(Some(amount), earlier),
                    ResultCode::NotARecipient => assert!(!recipients.contains(&user)),
                    ResultCode::NoSuchPacket => assert!(!self.recipients.contains_key(&packet)),
                    ResultCode::Expired | ResultCode::Empty => {}
                    other => panic!("open answered {other:?}"),
                }
                if result != ResultCode::Opened {
                    assert_eq!(self.core.balance(user), balance);
                }
            }
            Action::Chat { user, to_user } => {
                let online = self.presence.route(uid(to_user)).is_some();
                let result = self.chat(user, to_user, "hi");
                let expected = if online {
                    ResultCode::Delivered
                } else {
                    ResultCode::Offline
                };
                assert_eq!(result, expected);
            }
            Action::Restart => self.restart(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Money is conserved after every step, shares and wins are paid at most once, and a
    /// restart from the ledger changes no figure.
    #[test]
    fn money_is_conserved_through_any_operations_and_restarts(
        seed: u64,
        actions in prop::collection::vec(action(), 1..200),
    ) {
        let mut sim = Sim::new(seed);
        for action in &actions {
            sim.run(action);
            sim.check();
        }
        // Whatever the history, a last restart rebuilds the same state.
        sim.restart();
        sim.check();
        // And once every campaign has created its packets and every time-to-live has run
        // out, nothing is left unopened.
        sim.advance(2 * TTL_MS);
        sim.advance(TTL_MS);
        let audit = sim.core.audit();
        prop_assert_eq!(audit.unopened_cents, 0);
        prop_assert!(audit.ok);
    }
}
