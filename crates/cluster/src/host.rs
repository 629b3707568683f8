//! This host's loop, on the runtime thread: it takes the gateway's commands, deals the
//! shake packets Redis releases to this host among the workers, hands ops to the
//! committer, and turns messages from other hosts into pushes. Reads, routes and
//! deliveries are spawned off the loop.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hongbao_money::seam::{AdminRequest, Balances, Op, OpKind, OpsCursor, OpsPage, Origin, Output};
use hongbao_money::Error;
use hongbao_money::{Push, Reply, UserId, UserView, WorkerId};
use hongbao_proto::ResultCode;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::campaign::{campaign_packet, CampaignRow};
use crate::commit::Commit;
use crate::committer::Committers;
use crate::mesh::Mesh;
use crate::shared::Shared;
use crate::store::Store;
use crate::{admin, committer, relay, standby, ClusterConfig, RELEASE_EVERY};
use hongbao_sys::clock::unix_ms;

/// What the gateway's calls become, for this host's loop.
pub(crate) enum Cmd {
    Submit(u64, Origin, Op),
    Admin(u64, AdminRequest),
    WorkerUp(WorkerId),
    WorkerDown(WorkerId),
    Online(UserId),
    Offline(UserId),
    Chat(Origin, u64, String),
    Broadcast(u64, String),
    Read(Read),
    Finish(std::sync::mpsc::Sender<Result<(), Error>>),
}

/// A read for the admin API's threads, answered on the std channel it carries.
pub(crate) enum Read {
    User(u64, usize, std::sync::mpsc::Sender<Result<UserView, Error>>),
    Balances(std::sync::mpsc::Sender<Result<Balances, Error>>),
    Ops(
        Option<OpsCursor>,
        usize,
        std::sync::mpsc::Sender<Result<OpsPage, Error>>,
    ),
}

/// This host's side of the cluster, on the runtime thread.
pub(crate) struct Host {
    cfg: ClusterConfig,
    store: Store,
    shared: Arc<Shared>,
    /// Dealt shake packets by worker: a worker's claim takes one out; a worker gone puts
    /// its packets back in `undealt`.
    workers: BTreeMap<WorkerId, HashSet<u64>>,
    undealt: Vec<(u64, u64)>,
    deal_cursor: usize,
    campaigns: HashMap<u32, CampaignRow>,
    /// Where ops go: the committer of their packet's shard.
    commits: Option<Committers>,
    committers: Vec<tokio::task::JoinHandle<()>>,
    rng: rand::rngs::SmallRng,
    /// The number of the last batch of released packets received from each release
    /// tag (release.lua; each tag numbers its own).
    release_batch: Vec<u64>,
    /// Release ticks so far: each asks one tag, in turn (`tags::tag_in_turn`).
    release_turn: u64,
    /// Released packets of campaigns not read yet (PostgreSQL unreachable): dealt or
    /// created at the next release.
    unread: Vec<(u32, u32)>,
    /// Told when this host's waiting notices should be told again.
    renewed: Arc<tokio::sync::Notify>,
    /// The users logged in on this host (the supervisor says `offline` once a user has
    /// no connection left here).
    online: HashSet<u64>,
}

impl Host {
    pub(crate) fn new(cfg: ClusterConfig, store: Store, shared: Arc<Shared>) -> Host {
        use rand::SeedableRng;
        let release_batch = vec![0; cfg.release_tags as usize];
        Host {
            cfg,
            store,
            shared,
            workers: BTreeMap::new(),
            undealt: Vec::new(),
            deal_cursor: 0,
            campaigns: HashMap::new(),
            commits: None,
            committers: Vec::new(),
            rng: rand::rngs::SmallRng::from_entropy(),
            release_batch,
            release_turn: 0,
            unread: Vec::new(),
            renewed: Arc::new(tokio::sync::Notify::new()),
            online: HashSet::new(),
        }
    }

    pub(crate) async fn run(mut self, mut rx: UnboundedReceiver<Cmd>) {
        let mut to = Vec::new();
        for shard in 0..self.store.shards().len() {
            let (commit_tx, commit_rx) = unbounded_channel();
            to.push(commit_tx);
            self.committers.push(tokio::spawn(committer::committer(
                self.store.clone(),
                self.cfg.clone(),
                self.shared.clone(),
                commit_rx,
                shard,
            )));
            if self.store.shards().len() > 1 {
                tokio::spawn(relay::relay(self.store.clone(), shard));
            }
        }
        self.commits = Some(Committers::new(self.store.map(), to, self.shared.clone()));
        let mut pushes = self.store.take_pushes();
        let mut release = tokio::time::interval(RELEASE_EVERY);
        release.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut expire = tokio::time::interval(Duration::from_secs(1));
        expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut expiring: Option<tokio::task::JoinHandle<()>> = None;
        let renewed = self.renewed.clone();
        let lost = Arc::new(tokio::sync::Notify::new());
        tokio::spawn(self.store.clone().keep_subscribed(
            self.cfg.host.clone(),
            renewed.clone(),
            lost.clone(),
        ));
        tokio::spawn(standby::watch(self.store.clone(), self.shared.clone()));
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
                // One expiry at a time: a tick while the last is still waiting on a
                // silent primary is skipped, rather than queueing another in front of
                // the committer for this host's chain turn.
                _ = expire.tick(), if expiring.as_ref().is_none_or(|t| t.is_finished()) => {
                    let store = self.store.clone();
                    let host = self.cfg.host.clone();
                    expiring = Some(tokio::spawn(async move {
                        if let Err(e) = store.expire(unix_ms(), &host).await {
                            tracing::warn!("expiring packets: {e}");
                        }
                    }));
                }
                Some(push) = pushes.recv() => self.on_push(push),
                _ = renewed.notified() => self.renew_notices(),
                _ = lost.notified() => self.fresh(),
            }
        }
    }

    async fn finish(&mut self) -> Result<(), Error> {
        self.commits = None; // each committer commits what it has, then ends
        for task in std::mem::take(&mut self.committers) {
            let _ = task.await;
        }
        self.store.forget_host(&self.cfg.host).await;
        match self.shared.failure.lock().unwrap().clone() {
            Some(why) => Err(Error::unavailable("committing to PostgreSQL", why)),
            None => Ok(()),
        }
    }

    fn commit(&self, op: Commit) {
        if let Some(commits) = &self.commits {
            commits.send(op);
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
                    let answer = admin::admin(&store, &host, request).await;
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
                        Read::Ops(after, limit, tx) => {
                            let _ = tx.send(store.ops(after, limit).await);
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
                    Some(cents) => {
                        let op_id = crate::commit::op_id(&mut self.rng);
                        self.commit(Commit::Win {
                            to,
                            campaign: (packet >> 32) as u32,
                            packet,
                            cents,
                            op_id,
                        })
                    }
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
                // On the sender's wallet shard: the debit and the packet, one commit.
                let wallet = self.store.map().wallet(to.user.get());
                let packet = match self.store.next_packet_id_on(wallet).await {
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
                let op_id = crate::commit::op_id(&mut self.rng);
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
                            if let Some(commits) = commits {
                                commits.send(Commit::Open { to, packet, op_id });
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
                        Err(e) => Reply::Error {
                            result: ResultCode::Unavailable,
                            text: e.to_string(),
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
                        (Err(e), false) => vec![Output::Reply {
                            to,
                            reply: Reply::Error {
                                result: ResultCode::Unavailable,
                                text: e.to_string(),
                            },
                        }],
                    };
                    shared.emit_all(out);
                });
            }
        }
    }

    fn unavailable(&self, to: Origin, op: OpKind, why: Error) {
        tracing::warn!(error = %why, kind = ?why.kind(), "an operation found the ledger unavailable");
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

    /// Campaign `id`'s row, read once; `Err` when PostgreSQL could not say.
    async fn campaign(&mut self, id: u32) -> Result<Option<CampaignRow>, Error> {
        if let Some(c) = self.campaigns.get(&id) {
            return Ok(Some(c.clone()));
        }
        let row = self.store.campaign_row(id).await?;
        if let Some(row) = &row {
            self.campaigns.insert(id, row.clone());
        }
        Ok(row)
    }

    /// Asks Redis for the packets now due to this host, on every release tag: shake
    /// packets go to the workers' pools, send-campaign packets are created. A packet of
    /// a campaign this host cannot read yet (PostgreSQL unreachable) waits for the next
    /// call; a tag that did not answer is asked again at the next call.
    async fn release(&mut self) {
        let users = self.online.len();
        let asked = [crate::tags::tag_in_turn(
            &self.cfg.host,
            self.release_turn,
            self.cfg.release_tags,
        )];
        self.release_turn += 1;
        let released = self
            .store
            .release(&self.cfg.host, &asked, &self.release_batch, users)
            .await;
        let mut due = std::mem::take(&mut self.unread);
        let mut fresh = false;
        for (t, released) in released {
            match released {
                Ok(released) => {
                    self.release_batch[t as usize] = released.batch;
                    fresh |= released.fresh;
                    due.extend(released.due);
                }
                Err(e) => tracing::warn!("release: {e}"),
            }
        }
        if fresh {
            self.fresh();
        }
        if due.is_empty() {
            return;
        }
        let mut deal = Vec::new();
        let now = unix_ms();
        for (campaign, index) in due {
            let c = match self.campaign(campaign).await {
                Ok(Some(c)) => c,
                Ok(None) => {
                    tracing::warn!("released packet {campaign}:{index} of no campaign");
                    continue;
                }
                Err(_) => {
                    self.unread.push((campaign, index));
                    continue;
                }
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

    /// This host was not among the hosts alive in Redis (it has just started, it was
    /// found dead and is back, or Redis lost a release tag's keys), or one of its markers on
    /// the masters is gone (`keep_subscribed`): a master lost its data (promoted before
    /// its replica had synced, or restarted empty), and perhaps routes with it. What
    /// Redis should know is told again from what this host and PostgreSQL know: the
    /// release of every campaign Redis lost (restore.lua), the routes of the users
    /// logged in here, and their waiting notices. All of it harmless when nothing was
    /// lost.
    fn fresh(&self) {
        let users: Vec<u64> = self.online.iter().copied().collect();
        let (store, host) = (self.store.clone(), self.cfg.host.clone());
        let renewed = self.renewed.clone();
        tokio::spawn(async move {
            // The routes first: a packet sent once its campaign is released again must
            // find its recipients here.
            for user in &users {
                store.set_route(*user, &host).await;
            }
            match store.restore_releases().await {
                Ok(restored) => {
                    for (campaign, put_back) in restored {
                        tracing::warn!(
                            "Redis had lost the release of campaign {campaign}; started again, {put_back} packets released and not won put back in line"
                        );
                    }
                }
                Err(e) => tracing::warn!("restoring releases: {e}"),
            }
            renewed.notify_one();
        });
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
            match store.waiting_notices_of(&users, unix_ms()).await {
                Ok(waiting) => {
                    tracing::warn!(
                        "this host's channel was renewed; {} waiting notices told again to {} users",
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
                Err(e) => tracing::warn!("telling waiting notices again: {e}"),
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
