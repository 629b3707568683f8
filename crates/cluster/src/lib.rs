//! The cluster money backend: any number of equal gateway hosts over a Redis Cluster and
//! one PostgreSQL ledger (docs/scale-out.md).
//!
//! - PostgreSQL is the ledger and the only judge of money: wins, sends, opens and refunds
//!   are PL/pgSQL functions (`schema.sql`) that check every rule under row locks and
//!   append the event. A reply that tells of money goes out only after the transaction
//!   holding it has committed; ops are group-committed, one transaction per batch.
//! - Redis holds what is hot and what crosses hosts: the release of campaign packets at
//!   their exact rate (`release.lua`, one hash tag, Redis's clock), the packets each host
//!   holds (returned when a host dies), a gate per sent packet in front of PostgreSQL
//!   (`gate.lua`), user → host routes, and sharded pub/sub channels per host for notices,
//!   chat and broadcasts. Losing any of it costs speed or a push, never money.
//!
//! The gateways see the same [`Money`] interface as the embedded backend: calls go to a
//! tokio runtime on a thread of its own, outputs come back through `drain` and a waker.

mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_money::seam::{
    AdminRequest, Balances, LedgerRead, MoneySnapshot, Op, OpKind, Origin, Output,
};
use hongbao_money::{Audit, Money, Push, Reply, UserId, UserView, WorkerId};
use hongbao_proto::ResultCode;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

pub use store::Store;

/// What a gateway host needs to join a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Redis Cluster seed nodes, `redis://HOST:PORT`.
    pub redis: Vec<String>,
    /// `postgres://USER@HOST:PORT/DB` (libpq-style key=value strings work too).
    pub postgres: String,
    /// This host's name: unique among the hosts; its pub/sub channel and held packets.
    pub host: String,
    pub packet_ttl_ms: u64,
    /// How long a batch waits for more ops before it commits.
    pub commit_window: Duration,
    pub max_batch: usize,
}

/// A host silent for this long is dead: its held packets are released again.
pub const HOST_DEAD_AFTER_MS: u64 = 3000;
/// How often a host asks Redis for the packets due (and says it is alive).
pub const RELEASE_EVERY: Duration = Duration::from_millis(10);

/// Messages between hosts, on each host's sharded pub/sub channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Mesh {
    Notice {
        user: u64,
        notice: hongbao_money::Notice,
    },
    Chat {
        from: u64,
        to: u64,
        text: String,
    },
    Broadcast {
        server_time_us: u64,
        text: String,
    },
}

fn channel(host: &str) -> String {
    format!("hb:host:{host}")
}

enum Cmd {
    Submit(u64, Origin, Op),
    Admin(u64, AdminRequest),
    WorkerUp(WorkerId),
    WorkerDown(WorkerId),
    Online(UserId),
    Offline(UserId),
    Chat(Origin, u64, String),
    Broadcast(u64, String),
    Read(Read),
    Finish(std::sync::mpsc::Sender<Result<(), String>>),
}

enum Read {
    User(
        u64,
        usize,
        std::sync::mpsc::Sender<Result<UserView, String>>,
    ),
    Balances(std::sync::mpsc::Sender<Result<Balances, String>>),
}

/// What the runtime thread shares with the gateway's loop.
struct Shared {
    outputs: Mutex<Vec<Output>>,
    snapshot: Mutex<MoneySnapshot>,
    failure: Mutex<Option<String>>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl Shared {
    fn emit(&self, out: Output) {
        self.outputs.lock().unwrap().push(out);
        (self.wake)();
    }

    fn emit_all(&self, outs: Vec<Output>) {
        if outs.is_empty() {
            return;
        }
        self.outputs.lock().unwrap().extend(outs);
        (self.wake)();
    }

    fn count(&self, op: OpKind, result: ResultCode) {
        self.snapshot.lock().unwrap().replies.count(op, result);
    }
}

/// The backend, as the supervisor holds it.
pub struct Cluster {
    tx: UnboundedSender<Cmd>,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Cluster {
    /// Connects to Redis and PostgreSQL (creating the schema if it is not there) and
    /// starts this host's part: releasing, committing, listening on its channel.
    pub fn open(cfg: ClusterConfig, wake: Arc<dyn Fn() + Send + Sync>) -> Result<Cluster, String> {
        let shared = Arc::new(Shared {
            outputs: Mutex::default(),
            snapshot: Mutex::default(),
            failure: Mutex::default(),
            wake,
        });
        let (tx, rx) = unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let runtime_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("hongbao-cluster".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("a tokio runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let store = match Store::connect(&cfg).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    Host::new(cfg, store, runtime_shared).run(rx).await;
                });
            })
            .map_err(|e| e.to_string())?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Cluster {
                tx,
                shared,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the cluster runtime ended while starting".into()),
        }
    }

    /// Reads of the ledger for the admin API's threads.
    pub fn reader(&self) -> Box<dyn LedgerRead> {
        Box::new(Reader {
            tx: Mutex::new(self.tx.clone()),
        })
    }

    fn send(&self, cmd: Cmd) {
        if self.tx.send(cmd).is_err() {
            self.shared
                .failure
                .lock()
                .unwrap()
                .get_or_insert_with(|| "the cluster runtime has ended".into());
        }
    }
}

impl Money for Cluster {
    fn submit(&mut self, now_ms: u64, origin: Origin, op: Op) {
        self.send(Cmd::Submit(now_ms, origin, op));
    }

    fn admin(&mut self, _now_ms: u64, ticket: u64, request: AdminRequest) {
        self.send(Cmd::Admin(ticket, request));
    }

    /// Time is kept by the runtime (and the release by Redis's clock).
    fn tick(&mut self, _now_ms: u64) {}

    fn worker_up(&mut self, worker: WorkerId) {
        self.send(Cmd::WorkerUp(worker));
    }

    fn worker_down(&mut self, worker: WorkerId) {
        self.send(Cmd::WorkerDown(worker));
    }

    fn drain(&mut self, out: &mut Vec<Output>) {
        out.append(&mut self.shared.outputs.lock().unwrap());
    }

    fn snapshot(&self) -> MoneySnapshot {
        self.shared.snapshot.lock().unwrap().clone()
    }

    fn audit_now(&self) -> Option<Audit> {
        None
    }

    fn failure(&self) -> Option<String> {
        self.shared.failure.lock().unwrap().clone()
    }

    fn finish(&mut self) -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(Cmd::Finish(tx));
        let result = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| Err("the cluster runtime did not finish in 30 s".into()));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        result
    }

    fn online(&mut self, user: UserId) {
        self.send(Cmd::Online(user));
    }

    fn offline(&mut self, user: UserId) {
        self.send(Cmd::Offline(user));
    }

    fn chat_elsewhere(&mut self, origin: Origin, to_user: u64, text: String) -> bool {
        self.send(Cmd::Chat(origin, to_user, text));
        true
    }

    fn broadcast_elsewhere(&mut self, server_time_us: u64, text: String) {
        self.send(Cmd::Broadcast(server_time_us, text));
    }
}

struct Reader {
    tx: Mutex<UnboundedSender<Cmd>>,
}

impl Reader {
    fn ask<T>(
        &self,
        make: impl FnOnce(std::sync::mpsc::Sender<Result<T, String>>) -> Read,
    ) -> Result<T, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx
            .lock()
            .unwrap()
            .send(Cmd::Read(make(tx)))
            .map_err(|_| "the cluster runtime has ended".to_string())?;
        rx.recv_timeout(Duration::from_secs(30))
            .map_err(|_| "no answer from the cluster runtime in 30 s".to_string())?
    }
}

impl LedgerRead for Reader {
    fn user(&self, user: u64, limit: usize) -> Result<UserView, String> {
        self.ask(|tx| Read::User(user, limit, tx))
    }

    fn balances(&self) -> Result<Balances, String> {
        self.ask(Read::Balances)
    }
}

/// A campaign as this host needs it to hand out its packets.
#[derive(Debug, Clone)]
pub struct CampaignRow {
    pub id: u32,
    pub send: bool,
    pub packets: u32,
    pub rate: u32,
    pub amount_min: u64,
    pub amount_max: u64,
    pub recipients: u32,
    pub user_min: u64,
    pub user_max: u64,
    pub seed: u64,
    pub minted: u64,
    pub started_ms: u64,
}

/// An op for the ledger, waiting for its batch.
#[derive(Debug, Clone)]
pub enum Commit {
    Win {
        to: Origin,
        campaign: u32,
        packet: u64,
        cents: u64,
    },
    Send {
        to: Origin,
        packet: u64,
        cents: u64,
        recipients: Vec<u64>,
        shares: Vec<u64>,
        expires_ms: u64,
        key: Option<String>,
    },
    Open {
        to: Origin,
        packet: u64,
    },
    CampaignPacket {
        campaign: u32,
        packet: u64,
        cents: u64,
        recipients: Vec<u64>,
        shares: Vec<u64>,
        expires_ms: u64,
    },
}

impl Commit {
    /// The order a batch runs its ops in. Only packet rows are locked by two hosts at
    /// once (opens of one packet by users on different hosts; a user's balance row is
    /// touched by its own host only, and by expiry), so every batch locks packets first,
    /// in id order: two hosts' batches then cannot wait on each other in a cycle (which
    /// PostgreSQL would break only after `deadlock_timeout`, a second).
    fn lock_order(&self) -> (u8, u64) {
        match self {
            Commit::Open { packet, .. } => (0, *packet),
            Commit::Win { to, .. } | Commit::Send { to, .. } => (1, to.user.get()),
            Commit::CampaignPacket { packet, .. } => (2, *packet),
        }
    }
}

/// This host's side of the cluster, on the runtime thread.
struct Host {
    cfg: ClusterConfig,
    store: Store,
    shared: Arc<Shared>,
    /// Dealt shake packets by worker: a worker's claim takes one out; a worker gone puts
    /// its packets back in `undealt`.
    workers: BTreeMap<WorkerId, HashSet<u64>>,
    undealt: Vec<(u64, u64)>,
    deal_cursor: usize,
    campaigns: HashMap<u32, CampaignRow>,
    commits: Option<UnboundedSender<Commit>>,
    committer: Option<tokio::task::JoinHandle<()>>,
    rng: rand::rngs::SmallRng,
    /// The number of the last batch of released packets received (release.lua).
    release_batch: u64,
    /// The users logged in on this host (the supervisor says `offline` once a user has
    /// no connection left here).
    online: HashSet<u64>,
}

impl Host {
    fn new(cfg: ClusterConfig, store: Store, shared: Arc<Shared>) -> Host {
        use rand::SeedableRng;
        Host {
            cfg,
            store,
            shared,
            workers: BTreeMap::new(),
            undealt: Vec::new(),
            deal_cursor: 0,
            campaigns: HashMap::new(),
            commits: None,
            committer: None,
            rng: rand::rngs::SmallRng::from_entropy(),
            release_batch: 0,
            online: HashSet::new(),
        }
    }

    async fn run(mut self, mut rx: UnboundedReceiver<Cmd>) {
        let (commit_tx, commit_rx) = unbounded_channel();
        self.commits = Some(commit_tx);
        self.committer = Some(tokio::spawn(store::committer(
            self.store.clone(),
            self.cfg.clone(),
            self.shared.clone(),
            commit_rx,
        )));
        let mut pushes = self.store.take_pushes();
        let mut release = tokio::time::interval(RELEASE_EVERY);
        release.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut expire = tokio::time::interval(Duration::from_secs(1));
        expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let renewed = Arc::new(tokio::sync::Notify::new());
        tokio::spawn(
            self.store
                .clone()
                .keep_subscribed(self.cfg.host.clone(), renewed.clone()),
        );
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Finish(done)) => {
                        let _ = done.send(self.finish().await);
                        return;
                    }
                    Some(cmd) => self.command(cmd).await,
                    None => {
                        let _ = self.finish().await;
                        return;
                    }
                },
                _ = release.tick() => self.release().await,
                _ = expire.tick() => {
                    let store = self.store.clone();
                    let host = self.cfg.host.clone();
                    tokio::spawn(async move {
                        if let Err(e) = store.expire(now_ms(), &host).await {
                            eprintln!("hongbao cluster: expiring packets: {e}");
                        }
                    });
                }
                Some(push) = pushes.recv() => self.on_push(push),
                _ = renewed.notified() => self.renew_notices(),
            }
        }
    }

    async fn finish(&mut self) -> Result<(), String> {
        self.commits = None; // the committer commits what it has, then ends
        if let Some(task) = self.committer.take() {
            let _ = task.await;
        }
        self.store.forget_host(&self.cfg.host).await;
        match self.shared.failure.lock().unwrap().clone() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    fn commit(&self, op: Commit) {
        if let Some(tx) = &self.commits {
            let _ = tx.send(op);
        }
    }

    async fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Submit(now, origin, op) => self.submit(now, origin, op).await,
            Cmd::Admin(ticket, request) => {
                let (store, shared, host) = (
                    self.store.clone(),
                    self.shared.clone(),
                    self.cfg.host.clone(),
                );
                tokio::spawn(async move {
                    let answer = store::admin(&store, &host, request).await;
                    shared.emit(Output::Admin { ticket, answer });
                });
            }
            Cmd::WorkerUp(w) => {
                self.workers.entry(w).or_default();
                let undealt = std::mem::take(&mut self.undealt);
                self.deal(undealt);
            }
            Cmd::WorkerDown(w) => {
                if let Some(pool) = self.workers.remove(&w) {
                    let back: Vec<(u64, u64)> = pool
                        .into_iter()
                        .filter_map(|p| self.shake_amount(p).map(|a| (p, a)))
                        .collect();
                    self.deal(back);
                }
            }
            // Off the loop: a login costs this host no round trip of its own.
            Cmd::Online(user) => {
                self.online.insert(user.get());
                let (store, host) = (self.store.clone(), self.cfg.host.clone());
                tokio::spawn(async move { store.set_route(user.get(), &host).await });
            }
            Cmd::Offline(user) => {
                self.online.remove(&user.get());
                let (store, host) = (self.store.clone(), self.cfg.host.clone());
                tokio::spawn(async move { store.clear_route(user.get(), &host).await });
            }
            Cmd::Chat(origin, to_user, text) => {
                let (store, shared, host) = (
                    self.store.clone(),
                    self.shared.clone(),
                    self.cfg.host.clone(),
                );
                tokio::spawn(async move {
                    let route = store.route(to_user).await;
                    let result = match route {
                        Some(there) if there != host => {
                            let msg = Mesh::Chat {
                                from: origin.user.get(),
                                to: to_user,
                                text,
                            };
                            store.publish(&there, &msg).await;
                            ResultCode::Delivered
                        }
                        _ => ResultCode::Offline,
                    };
                    shared.count(OpKind::Chat, result);
                    shared.emit(Output::Reply {
                        to: origin,
                        reply: Reply::Chat { result },
                    });
                });
            }
            Cmd::Broadcast(server_time_us, text) => {
                let (store, host) = (self.store.clone(), self.cfg.host.clone());
                tokio::spawn(async move {
                    let msg = Mesh::Broadcast {
                        server_time_us,
                        text,
                    };
                    for other in store.live_hosts().await {
                        if other != host {
                            store.publish(&other, &msg).await;
                        }
                    }
                });
            }
            Cmd::Read(read) => {
                let store = self.store.clone();
                tokio::spawn(async move {
                    match read {
                        Read::User(user, limit, tx) => {
                            let _ = tx.send(store.user_view(user, limit).await);
                        }
                        Read::Balances(tx) => {
                            let _ = tx.send(store.balances().await);
                        }
                    }
                });
            }
            Cmd::Finish(_) => unreachable!("handled by the loop"),
        }
    }

    async fn submit(&mut self, now: u64, to: Origin, op: Op) {
        match op {
            Op::Claim { packet } => {
                // Dealt here (or dealt back after a batch failed): the ledger's one win per
                // packet is what keeps a packet from paying twice.
                if let Some(pool) = self.workers.get_mut(&to.worker) {
                    pool.remove(&packet);
                }
                match self.shake_amount(packet) {
                    Some(cents) => self.commit(Commit::Win {
                        to,
                        campaign: (packet >> 32) as u32,
                        packet,
                        cents,
                    }),
                    None => {
                        self.shared.count(OpKind::Shake, ResultCode::Nothing);
                        self.shared.emit(Output::Reply {
                            to,
                            reply: Reply::Shake {
                                result: ResultCode::Nothing,
                                packet_id: 0,
                                amount_cents: 0,
                                retry_after_ms: 0,
                            },
                        });
                    }
                }
            }
            Op::Send {
                amount_cents,
                shares,
                recipients,
                idempotency_key,
            } => {
                if !hongbao_money::rules::send_is_well_formed(amount_cents, shares, &recipients) {
                    self.shared.count(OpKind::Send, ResultCode::BadRequest);
                    let balance_cents = self.store.balance(to.user.get()).await.unwrap_or(0);
                    self.shared.emit(Output::Reply {
                        to,
                        reply: Reply::Send {
                            result: ResultCode::BadRequest,
                            packet_id: 0,
                            balance_cents,
                        },
                    });
                    return;
                }
                let packet = match self.store.next_packet_id().await {
                    Ok(id) => id,
                    Err(e) => return self.unavailable(to, OpKind::Send, e),
                };
                let split = hongbao_money::split::split_all(&mut self.rng, amount_cents, shares);
                self.commit(Commit::Send {
                    to,
                    packet,
                    cents: amount_cents,
                    recipients,
                    shares: split,
                    expires_ms: now + self.cfg.packet_ttl_ms,
                    key: idempotency_key,
                });
            }
            Op::Open { packet } => {
                let (store, shared, commits) = (
                    self.store.clone(),
                    self.shared.clone(),
                    self.commits.clone(),
                );
                tokio::spawn(async move {
                    match store.gate(packet, to.user.get()).await {
                        Some(result) => {
                            shared.count(OpKind::Open, result);
                            shared.emit(Output::Reply {
                                to,
                                reply: Reply::Open {
                                    result,
                                    packet_id: packet,
                                    amount_cents: 0,
                                },
                            });
                        }
                        None => {
                            if let Some(tx) = commits {
                                let _ = tx.send(Commit::Open { to, packet });
                            }
                        }
                    }
                });
            }
            Op::Me => {
                let (store, shared) = (self.store.clone(), self.shared.clone());
                tokio::spawn(async move {
                    let reply = match store.user_view(to.user.get(), 20).await {
                        Ok(view) => Reply::Me(view),
                        Err(text) => Reply::Error {
                            result: ResultCode::Unavailable,
                            text,
                        },
                    };
                    shared.emit(Output::Reply { to, reply });
                });
            }
            Op::Notices | Op::LoggedIn => {
                let (store, shared) = (self.store.clone(), self.shared.clone());
                let logged_in = matches!(op, Op::LoggedIn);
                tokio::spawn(async move {
                    let waiting = store.waiting_notices(to.user.get(), now).await;
                    let out = match (waiting, logged_in) {
                        (Ok(notices), true) => notices
                            .into_iter()
                            .map(|notice| Output::Notice {
                                user: to.user,
                                notice,
                            })
                            .collect(),
                        (Ok(notices), false) => vec![Output::Reply {
                            to,
                            reply: Reply::Notices(notices),
                        }],
                        (Err(_), true) => Vec::new(),
                        (Err(text), false) => vec![Output::Reply {
                            to,
                            reply: Reply::Error {
                                result: ResultCode::Unavailable,
                                text,
                            },
                        }],
                    };
                    shared.emit_all(out);
                });
            }
        }
    }

    fn unavailable(&self, to: Origin, op: OpKind, why: String) {
        eprintln!("hongbao cluster: {why}");
        self.shared.count(op, ResultCode::Unavailable);
        self.shared.emit(Output::Reply {
            to,
            reply: Reply::Error {
                result: ResultCode::Unavailable,
                text: "the ledger is unavailable; nothing was done".into(),
            },
        });
    }

    /// The amount of shake packet `packet`, if its campaign is known here.
    fn shake_amount(&self, packet: u64) -> Option<u64> {
        let (campaign, index) = hongbao_money::rules::shake_packet_parts(packet);
        let c = self.campaigns.get(&campaign)?;
        (!c.send)
            .then(|| hongbao_money::event::shake_amount(c.seed, index, c.amount_min, c.amount_max))
    }

    async fn campaign(&mut self, id: u32) -> Option<CampaignRow> {
        if let Some(c) = self.campaigns.get(&id) {
            return Some(c.clone());
        }
        let row = self.store.campaign_row(id).await.ok()??;
        self.campaigns.insert(id, row.clone());
        Some(row)
    }

    /// Asks Redis for the packets now due to this host: shake packets go to the workers'
    /// pools, send-campaign packets are created.
    async fn release(&mut self) {
        let due = match self.store.release(&self.cfg.host, self.release_batch).await {
            Ok((batch, due)) => {
                self.release_batch = batch;
                due
            }
            Err(e) => {
                eprintln!("hongbao cluster: release: {e}");
                return;
            }
        };
        if due.is_empty() {
            return;
        }
        let mut deal = Vec::new();
        let now = now_ms();
        for (campaign, index) in due {
            let Some(c) = self.campaign(campaign).await else {
                continue;
            };
            let packet = hongbao_money::rules::shake_packet_id(campaign, index);
            self.shared.snapshot.lock().unwrap().packets_released += 1;
            if c.send {
                self.commit(campaign_packet(&c, index, now + self.cfg.packet_ttl_ms));
            } else {
                let cents =
                    hongbao_money::event::shake_amount(c.seed, index, c.amount_min, c.amount_max);
                deal.push((packet, cents));
            }
        }
        self.deal(deal);
    }

    fn deal(&mut self, packets: Vec<(u64, u64)>) {
        if packets.is_empty() {
            return;
        }
        if self.workers.is_empty() {
            self.undealt.extend(packets);
            return;
        }
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        let mut deals: BTreeMap<WorkerId, Vec<(u64, u64)>> = BTreeMap::new();
        for (packet, cents) in packets {
            let w = ids[self.deal_cursor % ids.len()];
            self.deal_cursor = self.deal_cursor.wrapping_add(1);
            self.workers.get_mut(&w).expect("listed").insert(packet);
            deals.entry(w).or_default().push((packet, cents));
        }
        self.shared.emit_all(
            deals
                .into_iter()
                .map(|(worker, packets)| Output::Deal { worker, packets })
                .collect(),
        );
    }

    /// This host's channel was lost for a while (a master failed over or hung): a
    /// notice published to it meanwhile may be gone, so every user logged in here is
    /// told its waiting notices again, from the ledger. A client drops a notice of a
    /// packet it already knows (docs/protocol.md).
    fn renew_notices(&self) {
        if self.online.is_empty() {
            return;
        }
        let users: Vec<u64> = self.online.iter().copied().collect();
        let (store, shared) = (self.store.clone(), self.shared.clone());
        tokio::spawn(async move {
            match store.waiting_notices_of(&users, now_ms()).await {
                Ok(waiting) => {
                    eprintln!(
                        "hongbao cluster: this host's channel was renewed; {} waiting notices told again to {} users",
                        waiting.len(),
                        users.len()
                    );
                    shared.emit_all(
                        waiting
                            .into_iter()
                            .filter_map(|(user, notice)| {
                                UserId::new(user).map(|user| Output::Notice { user, notice })
                            })
                            .collect(),
                    );
                }
                Err(e) => eprintln!("hongbao cluster: telling waiting notices again: {e}"),
            }
        });
    }

    fn on_push(&mut self, payload: String) {
        let Ok(msg) = serde_json::from_str::<Mesh>(&payload) else {
            return;
        };
        let out = match msg {
            Mesh::Notice { user, notice } => {
                UserId::new(user).map(|user| Output::Notice { user, notice })
            }
            Mesh::Chat { from, to, text } => match (UserId::new(from), UserId::new(to)) {
                (Some(from_user), Some(user)) => Some(Output::Push {
                    user,
                    push: Push::Chat { from_user, text },
                }),
                _ => None,
            },
            Mesh::Broadcast {
                server_time_us,
                text,
            } => Some(Output::Broadcast {
                server_time_us,
                text,
            }),
        };
        if let Some(out) = out {
            self.shared.emit(out);
        }
    }
}

/// Packet `index` of send campaign `c`: its amount, recipients and shares all follow from
/// the campaign's seed, so a packet released twice (its host died) is the same packet.
pub fn campaign_packet(c: &CampaignRow, index: u32, expires_ms: u64) -> Commit {
    use rand::{Rng, SeedableRng};
    let mut rng =
        rand::rngs::SmallRng::seed_from_u64(c.seed ^ ((index as u64) << 20) ^ index as u64);
    let cents = rng.gen_range(c.amount_min..=c.amount_max);
    let k = c.recipients as usize;
    let recipients = hongbao_money::rules::draw_recipients(&mut rng, k, c.user_min, c.user_max);
    let shares = hongbao_money::split::split_all(&mut rng, cents, k as u32);
    Commit::CampaignPacket {
        campaign: c.id,
        packet: hongbao_money::rules::shake_packet_id(c.id, index),
        cents,
        recipients,
        shares,
        expires_ms,
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_campaign() -> CampaignRow {
        CampaignRow {
            id: 3,
            send: true,
            packets: 10,
            rate: 5,
            amount_min: 300,
            amount_max: 900,
            recipients: 3,
            user_min: 1,
            user_max: 20,
            seed: 42,
            minted: 0,
            started_ms: 0,
        }
    }

    #[test]
    fn a_campaign_packet_released_twice_is_the_same_packet() {
        let c = send_campaign();
        let a = format!("{:?}", campaign_packet(&c, 4, 1000));
        let b = format!("{:?}", campaign_packet(&c, 4, 1000));
        assert_eq!(a, b);
        let Commit::CampaignPacket {
            packet,
            cents,
            recipients,
            shares,
            ..
        } = campaign_packet(&c, 4, 1000)
        else {
            unreachable!()
        };
        assert_eq!(packet, (3u64 << 32) | 4);
        assert!((300..=900).contains(&cents));
        assert_eq!(shares.iter().sum::<u64>(), cents);
        let distinct: HashSet<_> = recipients.iter().collect();
        assert_eq!(distinct.len(), 3);
        assert!(recipients.iter().all(|u| (1..=20).contains(u)));
        assert_ne!(a, format!("{:?}", campaign_packet(&c, 5, 1000)));
    }

    #[test]
    fn mesh_messages_read_back() {
        let m = Mesh::Chat {
            from: 1,
            to: 2,
            text: "hi".into(),
        };
        let back: Mesh = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert!(matches!(back, Mesh::Chat { from: 1, to: 2, .. }));
    }
}
