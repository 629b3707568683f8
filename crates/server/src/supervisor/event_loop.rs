//! The supervisor's record and its loop: the turn (wait for events, read the links,
//! hand operations to the money side, route what comes out of it once durable, answer
//! the admin API, tick), and the clock as the turn read it. What it does for the
//! workers, the report, a reload, a broadcast, a drain and an upgrade is in the files
//! named for each.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use hongbao_http::Response;
use hongbao_money::presence::{Delivery, Presence};
use hongbao_money::seam::{AdminAnswer, AdminRequest as MoneyRequest, Op, Origin, Output};
use hongbao_money::{error as money, ConnId, Money, UserId, WorkerId};
use hongbao_sys::clock::{Clock, UnixTime, Uptime};
use hongbao_sys::notify::Notifier;
use hongbao_sys::{Reload, Stop};
use hongbao_telemetry::Reporter;
use mio::{Events, Poll, Token};
use serde_json::json;
use slab::Slab;

use super::procs::{Link, WorkerProc};
use super::timers::Timers;
use super::{listen, successor, tallies, upgrade};
use crate::access::{self};
use crate::admin::{self, AdminCommand, AdminRequest};
use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::limits::{Action, Users};
use crate::link::{self, ToSupervisor, ToWorker, WorkerConfig};

pub(super) const WAKER: Token = Token(usize::MAX - 2);

pub(super) struct Supervisor {
    pub(super) cfg: ServeConfig,
    pub(super) money: Box<dyn Money>,
    /// The clock, as the turn read it.
    pub(super) time: TurnClock,
    /// Every deadline of the loop (`timers.rs`).
    pub(super) timers: Timers,
    pub(super) presence: Presence,
    /// Each user's sends, opens, chats, notices and logins (`limits.rs`).
    pub(super) users: Users,
    pub(super) poll: Poll,
    pub(super) links: Slab<Link>,
    pub(super) worker_links: HashMap<WorkerId, usize>,
    pub(super) workers: BTreeMap<WorkerId, WorkerProc>,
    pub(super) worker_cfg: WorkerConfig,
    /// The listening sockets the workers inherit (`listen.rs`).
    pub(super) sockets: listen::Sockets,
    /// How many workers this server runs.
    pub(super) workers_wanted: usize,
    pub(super) client_addr: SocketAddr,
    pub(super) ws_addr: Option<SocketAddr>,
    pub(super) http_addr: Option<SocketAddr>,
    pub(super) admin_rx: Receiver<AdminCommand>,
    /// Admin answers held until the ledger has committed what they saw.
    pub(super) deferred_admin: VecDeque<(u64, Sender<Response>, Response)>,
    /// Admin requests handed to the money side, by ticket: where the answer goes, and
    /// whether it creates (201) or reads (200).
    pub(super) tickets: HashMap<u64, (Sender<Response>, bool)>,
    pub(super) next_ticket: u64,
    pub(super) report: tallies::Report,
    pub(super) monitor: Option<Reporter>,
    pub(super) next_broadcast: u64,
    pub(super) broadcasts: BTreeMap<u64, PendingBroadcast>,
    pub(super) shutting_down: bool,
    /// Draining (SIGTERM): when it began, and when it is given up on.
    pub(super) draining: Option<(Uptime, Uptime)>,
    pub(super) stop: Stop,
    pub(super) reload: Reload,
    /// The admin address's TLS config, replaced on reload.
    pub(super) admin_tls: Option<hongbao_http::tls::Reloadable>,
    /// What the probes on the admin address are told, kept by the loop.
    pub(super) health: Arc<Health>,
    /// systemd's notify socket, when it started us (`Type=notify`).
    pub(super) notifier: Option<Notifier>,
    /// The workers linked when systemd was last told, once ready.
    pub(super) told_linked: Option<usize>,
    /// The admin door's refusals, counted for `/metrics`.
    pub(super) admin_refusals: Arc<access::Refusals>,
    /// The admin server, until an upgrade's successor answers on its socket.
    pub(super) admin: Option<admin::AdminServer>,
    /// A copy of the admin socket, to hand over in an upgrade.
    pub(super) admin_socket: Option<std::net::TcpListener>,
    /// A copy of the data directory's lock, to hand over in an upgrade.
    pub(super) lock_fd: std::os::fd::OwnedFd,
    /// `DIR/upgrade.sock`, where `serve --upgrade` asks for this server (`upgrade.rs`).
    pub(super) upgrade_listener: Option<mio::net::UnixListener>,
    /// The server taking this one over, once it has connected.
    pub(super) successor: Option<upgrade::Successor>,
    /// The server this one is taking over, until the ledger is here (`successor.rs`).
    pub(super) predecessor: Option<successor::Predecessor>,
    /// SIGUSR2: start this binary (the file as it is now) with `--upgrade`.
    pub(super) upgrade_signal: Reload,
    pub(super) exe: Option<std::path::PathBuf>,
    /// The upgrade SIGUSR2 started, waited for if it ends first.
    pub(super) spawned: Option<std::process::Child>,
    /// Whether the server being taken over was told this one is ready.
    pub(super) told_predecessor: bool,
}

/// A broadcast handed to the workers, answered once each has said how many connections
/// it is writing it to (`broadcast.rs`).
pub(super) struct PendingBroadcast {
    pub(super) reply: Sender<Response>,
    pub(super) server_time_us: u64,
    pub(super) waiting: Vec<WorkerId>,
    pub(super) workers: usize,
    pub(super) connections: u64,
    pub(super) deadline: Uptime,
}

pub(super) fn origin(worker: WorkerId, conn: ConnId, request: u32, user: UserId) -> Origin {
    Origin {
        worker,
        conn,
        request,
        user,
    }
}

/// The supervisor's clock as the turn read it: once a poll, and everything the turn does
/// (a login's rate limit, a commit's time, a campaign's) is as of then.
pub(super) struct TurnClock {
    pub(super) clock: Clock,
    pub(super) now: Uptime,
}

impl TurnClock {
    /// The Unix time of the turn (no clock read).
    pub(super) fn unix(&self) -> UnixTime {
        self.clock.unix(self.now)
    }
}

impl Supervisor {
    pub(super) fn event_loop(&mut self, admin_addr: SocketAddr, replayed: u64) -> Result<()> {
        let mut events = Events::with_capacity(256);
        let mut ready_said = false;
        let mut outs = Vec::new();
        self.time.now = self.time.clock.now();
        self.timers.restart(self.time.now, self.time.unix());
        loop {
            let timeout = self.timers.timeout(self.time.now);
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(Error::io("waiting for events", e));
                }
            }
            // One clock read a turn: what the turn does is as of when the poll returned.
            self.time.now = self.time.clock.now();
            let now = self.time.now;
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    upgrade::UPGRADE_LISTENER => self.accept_successor(),
                    upgrade::UPGRADE_LINK => self.read_successor(self.time.unix().as_millis()),
                    Token(key) => self.read_link(key),
                }
            }
            while let Ok(cmd) = self.admin_rx.try_recv() {
                self.admin(cmd);
            }
            if self.reload.take() {
                self.tell_systemd(|n| n.reloading());
                self.reload_config();
                let status = self.status_line();
                self.tell_systemd(|n| n.ready(&status));
            }
            if self.timers.tick_due(now) && self.ticking() {
                self.money.tick(self.time.unix().as_millis());
            }
            if self.timers.second_due(now) {
                // The round follows the wall clock if it was set meanwhile.
                let unix = self.time.clock.resync();
                self.timers.seconded(now, unix);
                self.report.roll_rates(&self.replies());
                self.log_token_refusals();
                let horizon = self.cfg.tokens.revocation_horizon();
                self.presence.forget_revocations(unix.second(), horizon);
                self.users.forget_full(unix.as_micros());
                if let Some(monitor) = self.monitor.clone() {
                    monitor.send(self.sample(unix.second().saturating_sub(1)));
                }
                self.answer_broadcasts(true, now);
            }
            if self.timers.check_due(now) {
                self.check_workers(now)?;
            }
            self.health.turn(
                self.time.clock.instant(now),
                self.worker_links.len(),
                self.workers.len(),
            );
            self.health
                .ledger_failing(self.money.commits_failing().is_some());
            if !ready_said && self.worker_links.len() == self.workers.len() {
                ready_said = true;
                self.health.serving();
                let ws = self.ws_addr.map_or(String::new(), |a| format!(" ws={a}"));
                let http = self
                    .http_addr
                    .map_or(String::new(), |a| format!(" http={a}"));
                println!(
                    "hongbao serve ready: listen={} admin={}{ws}{http} workers={} data_dir={} replayed_events={}",
                    self.client_addr,
                    admin_addr,
                    self.workers.len(),
                    self.cfg.ledger.data_dir.display(),
                    replayed
                );
                let _ = std::io::stdout().flush();
                // Every worker has bound its listeners and was welcomed: systemd may start
                // what is ordered after us.
                let status = self.status_line();
                self.tell_systemd(|n| n.ready(&status));
                self.told_linked = Some(self.worker_links.len());
            } else if self
                .told_linked
                .is_some_and(|told| told != self.worker_links.len())
            {
                self.told_linked = Some(self.worker_links.len());
                let status = self.status_line();
                self.tell_systemd(|n| n.status(&status));
            }
            self.route_outputs(&mut outs);
            self.flush_links();
            self.flush_successor();
            if let Some(why) = self.money.failure() {
                return Err(money::Error::unavailable("the ledger", why).into());
            }
            if self.stop.requested() && !self.draining(now) {
                return Ok(());
            }
            if self.upgrade_signal.take() {
                self.start_successor();
            }
            self.upgrade_progress(ready_said);
            if self.upgrade_turn(now) == upgrade::Stage::HandOver {
                return Ok(());
            }
        }
    }

    /// What `systemctl status` shows while serving: where, and the workers up.
    pub(super) fn status_line(&self) -> String {
        format!(
            "serving: listen={} workers {} of {} up",
            self.client_addr,
            self.worker_links.len(),
            self.workers.len()
        )
    }

    /// Sends systemd what `say` says, when it is listening; a failure is logged (a
    /// manager that cannot be told is no reason to stop serving).
    pub(super) fn tell_systemd(&self, say: impl FnOnce(&Notifier) -> std::io::Result<()>) {
        if let Some(notifier) = &self.notifier {
            if let Err(e) = say(notifier) {
                tracing::warn!(socket = notifier.address(), error = %e, "telling systemd failed");
            }
        }
    }

    /// Whatever the money side has made durable goes out: replies and deals to their
    /// workers, notices through presence, answers to the operators who asked.
    pub(super) fn route_outputs(&mut self, outs: &mut Vec<Output>) {
        self.money.drain(outs);
        for out in outs.drain(..) {
            let Some(out) = self.for_successor(out) else {
                continue;
            };
            match out {
                Output::Reply { to, reply } => {
                    let msg = ToWorker::Reply {
                        conn: to.conn,
                        req: to.request,
                        reply,
                    };
                    self.tell_worker(to.worker, &msg);
                }
                Output::Notice { user, notice } => {
                    if let Some(delivery) = self.presence.notice(user, notice) {
                        self.deliver(delivery);
                    }
                }
                Output::Deal { worker, packets } => {
                    self.tell_worker(worker, &ToWorker::Deal { packets });
                }
                Output::Admin { ticket, answer } => {
                    if let Some((reply, creates)) = self.tickets.remove(&ticket) {
                        let _ = reply.send(admin_answer(answer, creates));
                    }
                }
                Output::Push { user, push } => {
                    if let Some(to) = self.presence.route(user) {
                        self.deliver(Delivery::Push {
                            to,
                            push,
                            close: false,
                        });
                    }
                }
                Output::Broadcast {
                    server_time_us,
                    text,
                } => {
                    // From another host: every worker here sends it; nobody waits for a count.
                    let msg = ToWorker::Broadcast {
                        id: 0,
                        server_time_us,
                        text,
                    };
                    for &key in self.worker_links.values() {
                        link::encode(&msg, &mut self.links[key].outbuf);
                    }
                }
            }
        }
        let committed = self.money.snapshot().committed_seq;
        while let Some((tag, _, _)) = self.deferred_admin.front() {
            if *tag > committed {
                break;
            }
            let (_, reply, response) = self.deferred_admin.pop_front().expect("looked at");
            let _ = reply.send(response);
        }
    }

    pub(super) fn tell_worker(&mut self, worker: WorkerId, msg: &ToWorker) {
        if let Some(link) = self
            .worker_links
            .get(&worker)
            .and_then(|k| self.links.get_mut(*k))
        {
            link::encode(msg, &mut link.outbuf);
        }
    }

    pub(super) fn deliver(&mut self, delivery: Delivery) {
        let (worker, msg) = match delivery {
            Delivery::Reply { to, request, reply } => (
                to.worker,
                ToWorker::Reply {
                    conn: to.conn,
                    req: request,
                    reply,
                },
            ),
            Delivery::Push { to, push, close } => (
                to.worker,
                ToWorker::Push {
                    conn: to.conn,
                    push,
                    close,
                },
            ),
        };
        self.tell_worker(worker, &msg);
    }

    pub(super) fn on_worker_message(&mut self, w: WorkerId, msg: ToSupervisor, now: u64) {
        match msg {
            ToSupervisor::Hello { .. } => {}
            ToSupervisor::Online {
                conn,
                req,
                user,
                issued,
            } => {
                let origin = origin(w, conn, req, user);
                if let Err(refused) =
                    self.users
                        .take(user, Action::Login, self.time.unix().as_micros())
                {
                    // Its worker let it in: it is not logged in after all.
                    self.refuse(origin, refused);
                    self.tell_worker(w, &ToWorker::LoginRefused { conn });
                    return;
                }
                match self.presence.login(origin, issued) {
                    Ok(deliveries) => {
                        for delivery in deliveries {
                            self.deliver(delivery);
                        }
                        self.money.online(user);
                        self.money.submit(now, origin, Op::LoggedIn);
                    }
                    Err(refused) => {
                        for delivery in refused {
                            self.deliver(delivery);
                        }
                    }
                }
            }
            ToSupervisor::Refreshed { conn, user, issued } => {
                self.presence.refreshed(w, conn, user, issued);
            }
            ToSupervisor::Offline { conn, user } => {
                self.presence.offline(w, conn, user);
                if self.presence.route(user).is_none() {
                    self.money.offline(user);
                }
            }
            ToSupervisor::Op {
                conn,
                req,
                user,
                op,
            } => {
                let origin = origin(w, conn, req, user);
                let action = match &op {
                    Op::Send { recipients, .. } => Some(Action::Send {
                        recipients: recipients.len() as u32,
                    }),
                    Op::Open { .. } => Some(Action::Open),
                    _ => None,
                };
                if let Some(action) = action {
                    if let Err(refused) =
                        self.users.take(user, action, self.time.unix().as_micros())
                    {
                        return self.refuse(origin, refused);
                    }
                }
                self.money.submit(now, origin, op);
            }
            ToSupervisor::Chat {
                conn,
                req,
                user,
                to_user,
                text,
            } => {
                let from = origin(w, conn, req, user);
                if let Err(refused) =
                    self.users
                        .take(user, Action::Chat, self.time.unix().as_micros())
                {
                    return self.refuse(from, refused);
                }
                let here = UserId::new(to_user).and_then(|u| self.presence.route(u));
                if here.is_none() && self.money.chat_elsewhere(from, to_user, text.clone()) {
                    return; // answered through the money side's outputs
                }
                for delivery in self.presence.chat(from, to_user, text) {
                    self.deliver(delivery);
                }
            }
            ToSupervisor::BroadcastTaken { id, connections } => {
                if let Some(b) = self.broadcasts.get_mut(&id) {
                    b.waiting.retain(|&x| x != w);
                    b.connections += connections;
                }
                self.answer_broadcasts(false, self.time.now);
            }
            ToSupervisor::Stats(stats) => {
                self.report.worker_latency(&stats.shake_latency_us);
                if let Some(proc_) = self.workers.get_mut(&w) {
                    proc_.previous = proc_.latest.take();
                    proc_.latest = Some(*stats);
                }
            }
        }
    }

    // ----- admin -------------------------------------------------------------------------

    pub(super) fn admin(&mut self, cmd: AdminCommand) {
        let response = match cmd.request {
            AdminRequest::Money(request) => {
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                let creates = matches!(
                    request,
                    MoneyRequest::CreateShake { .. } | MoneyRequest::CreateSend { .. }
                );
                self.tickets.insert(ticket, (cmd.reply, creates));
                self.money
                    .admin(self.time.unix().as_millis(), ticket, request);
                return;
            }
            AdminRequest::Broadcast(req) => return self.broadcast(req.text, cmd.reply),
            AdminRequest::Revoked { user, at } => self.revoked(user, at),
            AdminRequest::Stats => Response::json(200, &self.stats()),
            AdminRequest::Metrics => {
                Response::new(200, hongbao_telemetry::prom::CONTENT_TYPE, self.metrics())
            }
        };
        // Reads are answered once what they saw is durable, like everything else.
        let seq = self.money.snapshot().ledger_seq;
        self.deferred_admin.push_back((seq, cmd.reply, response));
    }

    /// Tokens of `user` issued before `at` are refused from now on: presence refuses
    /// them at login and kicks the user's connection here; every worker refuses them
    /// (logins, bearers) from its next read of the link. Applied twice (the API, then
    /// the store's watcher), it kicks once.
    pub(super) fn revoked(&mut self, user: u64, at: u64) -> Response {
        let Some(user_id) = UserId::new(user) else {
            return Response::error(400, "user 0 has no tokens");
        };
        let mut kicked = 0;
        if let Some(kick) = self.presence.revoke(user_id, at) {
            kicked += 1;
            self.deliver(kick);
            self.money.offline(user_id);
        }
        let msg = ToWorker::Revoke { user: user_id, at };
        for &key in self.worker_links.values() {
            link::encode(&msg, &mut self.links[key].outbuf);
        }
        tracing::info!(user, revoked_before = at, kicked, "tokens revoked");
        Response::json(
            200,
            &json!({"user": user, "revoked_before": at, "kicked": kicked}),
        )
    }

    /// Answers `origin`'s request `rate-limited`: over one of its user's limits.
    pub(super) fn refuse(&mut self, origin: Origin, refused: crate::limits::Refused) {
        let reply = ToWorker::Reply {
            conn: origin.conn,
            req: origin.request,
            reply: hongbao_money::Reply::RateLimited {
                retry_after_ms: refused.retry_after_ms,
                text: refused.text,
            },
        };
        self.tell_worker(origin.worker, &reply);
    }

    /// The welcome a worker gets: the configuration, with the revocations in force.
    pub(super) fn welcome(&self) -> WorkerConfig {
        let mut cfg = self.worker_cfg.clone();
        cfg.login.revoked = self.presence.revocations();
        cfg
    }
}

/// The HTTP answer to what the money side said.
pub(super) fn admin_answer(answer: AdminAnswer, creates: bool) -> Response {
    match answer {
        AdminAnswer::Campaign(status) => Response::json(if creates { 201 } else { 200 }, &status),
        AdminAnswer::NoCampaign(id) => Response::error(404, format!("no campaign {id}")),
        AdminAnswer::Campaigns(all) => Response::json(200, &all),
        AdminAnswer::Audit(audit) => Response::json(200, &audit),
        AdminAnswer::Refused(why) => Response::error(400, why),
        AdminAnswer::Unavailable(why) => Response::error(503, why),
    }
}
