//! An upgrade in place, as the supervisor does it: on the old server, a successor
//! connecting, the sockets and the ledger handed over, the drain paced by what the new
//! server takes; on the new one, its progress told to the old, SIGUSR2's successor
//! started, the upgrade socket listened on. The wire and the pacing's arithmetic are
//! `upgrade.rs`; the handover of the money side, `successor.rs`.

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::time::Duration;

use hongbao_money::seam::{Op, Output};
use hongbao_money::WorkerId;
use hongbao_sys::clock::Uptime;
use hongbao_sys::fdpass;
use mio::Interest;

use super::event_loop::Supervisor;
use super::upgrade::{
    decode_all, drain_credit, encode, send_blocking, shares, socket_path, Stage, Successor, ToNew,
    ToOld, GRANT_EVERY, QUIET_WAIT, SUCCESSOR_WORKERS, UPGRADE_LINK, UPGRADE_RETRY_AFTER_MS,
    WORKERS_STOP_WAIT,
};
use crate::link::{self, ToWorker};

impl Supervisor {
    /// An upgrade's last step, once the event loop is over: any worker still linked let
    /// go (its clients are the new server's to take), the ledger closed, the answers it
    /// released last sent, then the ledger handed over. What closing it said.
    pub(super) fn hand_over_last(&mut self) -> hongbao_money::error::Result<()> {
        let linked: Vec<usize> = self.links.iter().map(|(key, _)| key).collect();
        for key in linked {
            self.drop_link(key);
        }
        let flushed = self.money.finish();
        let mut outs = Vec::new();
        self.route_outputs(&mut outs);
        self.hand_over_ledger(self.money.snapshot().committed_seq);
        flushed
    }

    /// A process connected to the upgrade socket: kept if it is this user and no other
    /// upgrade is under way.
    pub(super) fn accept_successor(&mut self) {
        let Some(listener) = &self.upgrade_listener else {
            return;
        };
        loop {
            let (mut stream, _) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting on the upgrade socket");
                    return;
                }
            };
            let uid = fdpass::peer_uid(&stream);
            if uid.as_ref().ok() != Some(&fdpass::my_uid()) {
                tracing::warn!(peer_uid = ?uid, "upgrade refused: another user");
                continue;
            }
            if self.successor.is_some() || self.stop.requested() {
                let mut out = Vec::new();
                let why = if self.stop.requested() {
                    "this server is stopping"
                } else {
                    "another upgrade is under way"
                };
                encode(&ToNew::Refused(why.into()), &mut out);
                let _ = hongbao_sys::net::write_nonblocking(&mut stream, &out);
                tracing::warn!(why, "upgrade refused");
                continue;
            }
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                UPGRADE_LINK,
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(error = %e, "watching the upgrade link");
                continue;
            }
            self.successor = Some(Successor {
                stream,
                inbuf: Vec::new(),
                outbuf: Vec::new(),
                pid: None,
                workers: Vec::new(),
                tickets: HashMap::new(),
                ready: false,
                finishing: None,
                quiet: false,
                admitted: 0,
                held: Vec::new(),
                held_total: 0,
                granted: 0,
                granted_at: None,
                drain_from: None,
                admit_rate: 0,
                stopping_workers: None,
            });
        }
    }

    /// Reads what the new server sent.
    pub(super) fn read_successor(&mut self, now_ms: u64) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        let mut chunk = [0u8; 64 * 1024];
        let mut closed = false;
        loop {
            match s.stream.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => s.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut msgs = Vec::new();
        if let Err(e) = decode_all::<ToOld>(&mut s.inbuf, |m| msgs.push(m)) {
            tracing::warn!(error = %e, "the upgrade link");
            closed = true;
        }
        for msg in msgs {
            self.on_successor_message(msg, now_ms);
        }
        if closed {
            self.successor_gone();
        }
    }

    fn on_successor_message(&mut self, msg: ToOld, now_ms: u64) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        match msg {
            ToOld::Hello { pid } => {
                s.pid = Some(pid);
                self.hand_over_sockets(pid);
            }
            ToOld::Ready => {
                s.ready = true;
                self.begin_upgrade_drain(self.time.now);
            }
            ToOld::WorkerUp(w) => {
                let ours = SUCCESSOR_WORKERS + w;
                s.workers.push(ours);
                self.money.worker_up(ours);
            }
            ToOld::WorkerDown(w) => {
                let ours = SUCCESSOR_WORKERS + w;
                s.workers.retain(|&x| x != ours);
                self.money.worker_down(ours);
            }
            ToOld::Submit { mut origin, op } => {
                if s.quiet {
                    return; // past its word: never applied, never answered
                }
                origin.worker += SUCCESSOR_WORKERS;
                if op == Op::LoggedIn && s.ready {
                    s.admitted += 1;
                }
                self.money.submit(now_ms, origin, op);
            }
            ToOld::Admin { ticket, request } => {
                let ours = self.next_ticket;
                self.next_ticket += 1;
                s.tickets.insert(ours, ticket);
                self.money.admin(now_ms, ours, request);
            }
            ToOld::Quiet => s.quiet = true,
        }
    }

    /// The first answer: the sockets, the admin socket and the lock, beside a message that
    /// says what they are.
    fn hand_over_sockets(&mut self, pid: u32) {
        let (groups, mut fds) = self.sockets.handover();
        let Some(admin) = &self.admin_socket else {
            return self.refuse_successor("this server's admin socket cannot be handed over");
        };
        let admin_addr = match admin.local_addr() {
            Ok(a) => a,
            Err(e) => return self.refuse_successor(&format!("the admin socket: {e}")),
        };
        fds.push(admin.as_raw_fd());
        fds.push(self.lock_fd.as_raw_fd());
        let mut msg = Vec::new();
        encode(
            &ToNew::Handover {
                groups,
                admin: admin_addr,
                pid: std::process::id(),
                ticket_key: self.worker_cfg.tls.as_ref().map(|t| t.ticket_key),
            },
            &mut msg,
        );
        let s = self.successor.as_mut().expect("connected");
        // A few hundred bytes on a fresh socket: it goes whole.
        if let Err(e) = send_blocking(&s.stream, &msg, &fds) {
            tracing::warn!(error = %e, "handing the sockets over");
            return self.successor_gone();
        }
        tracing::info!(
            new_pid = pid,
            sockets = fds.len() - 2,
            "upgrade: the sockets handed over; the new server's operations are applied here until it has the ledger"
        );
    }

    fn refuse_successor(&mut self, why: &str) {
        if let Some(s) = self.successor.as_mut() {
            encode(&ToNew::Refused(why.into()), &mut s.outbuf);
            let _ = hongbao_sys::net::write_nonblocking(&mut s.stream, &s.outbuf);
        }
        tracing::warn!(why, "upgrade refused");
        self.successor_gone();
    }

    /// The new server's link closed: before it was ready, this one serves on as before;
    /// after, the drain goes on and it is said plainly.
    fn successor_gone(&mut self) {
        let Some(mut s) = self.successor.take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut s.stream);
        for w in s.workers {
            self.money.worker_down(w);
        }
        if s.ready {
            tracing::error!(
                new_pid = s.pid,
                "upgrade: the new server went away after taking the sockets; this one drains on and stops"
            );
        } else {
            tracing::warn!(
                new_pid = s.pid,
                "upgrade: the new server went away before it was ready; serving on"
            );
        }
    }

    /// The new server serves: stop accepting and drain, as SIGTERM does, over a window
    /// sized from the connections held and the rate the new server admits.
    fn begin_upgrade_drain(&mut self, now: Uptime) {
        let by_worker: Vec<(WorkerId, u64)> = self
            .workers
            .iter()
            .filter_map(|(&w, p)| Some((w, p.latest.as_ref()?.levels.connections)))
            .collect();
        let held: u64 = by_worker.iter().map(|&(_, n)| n).sum();
        let tls = self.worker_cfg.tls.is_some();
        if let Some(s) = self.successor.as_mut() {
            s.held = by_worker;
            s.held_total = held;
            s.drain_from = Some(now);
            s.admit_rate = self.cfg.processes.upgrade_admit_rate(tls);
        }
        let window = self.cfg.processes.upgrade_drain_window(held, tls);
        self.shutting_down = true;
        self.sockets.close_all();
        // The new server answers on the admin address now: ours closes its copy, off the
        // loop (its threads take a moment to end, and the new server's operations are
        // still applied here).
        if let Some(admin) = self.admin.take() {
            let _ = std::thread::Builder::new()
                .name("admin-stop".into())
                .spawn(move || drop(admin));
        }
        self.admin_socket.take();
        self.health.stopping(false);
        self.draining = Some((now, now + window + super::drain::DRAIN_LAST_WRITES));
        tracing::info!(
            connections = held,
            window_ms = window.as_millis() as u64,
            "upgrade: the new server is ready; draining here, the clients told to come back"
        );
        if let Some(s) = self.successor.as_mut() {
            let window_ms = window.as_millis() as u64;
            encode(
                &ToNew::Draining {
                    connections: held,
                    window_ms,
                },
                &mut s.outbuf,
            );
        }
        let window_ms = window.as_millis().min(u32::MAX.into()) as u32;
        let drain = ToWorker::Drain {
            window_ms,
            retry_after_ms: UPGRADE_RETRY_AFTER_MS,
        };
        for link in self.links.iter_mut().map(|(_, l)| l) {
            link::encode(&drain, &mut link.outbuf);
        }
    }

    /// An upgrade's turn of the loop: the drain over, the new server told to finish; once
    /// it is quiet and everything it sent is committed, the loop ends (`Stage::HandOver`).
    pub(super) fn upgrade_turn(&mut self, now: Uptime) -> Stage {
        let Some(s) = self.successor.as_ref() else {
            return Stage::Serving;
        };
        if !s.ready {
            return Stage::Serving;
        }
        let Some((_, until)) = self.draining else {
            return Stage::Serving;
        };
        self.grant_drain(now);
        let s = self.successor.as_mut().expect("looked");
        // Past the window, the workers still up are told to stop, and given a moment: the
        // ledger passes over once none is left, so that their ends are not in its pause.
        let drained = match s.stopping_workers {
            _ if self.worker_links.is_empty() => true,
            None if now >= until => {
                s.stopping_workers = Some(now);
                for link in self.links.iter_mut().map(|(_, l)| l) {
                    link::encode(&ToWorker::Shutdown, &mut link.outbuf);
                }
                false
            }
            Some(since) => now.since(since) >= WORKERS_STOP_WAIT,
            None => false,
        };
        let s = self.successor.as_ref().expect("looked");
        let began = self.draining.map(|(began, _)| began).unwrap_or(now);
        match s.finishing {
            None if drained => {
                let s = self.successor.as_mut().expect("looked");
                s.finishing = Some(now);
                let drain_ms = now.since(began).as_millis() as u64;
                encode(&ToNew::Finishing { drain_ms }, &mut s.outbuf);
                tracing::info!("upgrade: drained; asking the new server to stop sending");
                Stage::Serving
            }
            Some(since) if s.quiet || now.since(since) >= QUIET_WAIT => {
                let snap = self.money.snapshot();
                if snap.committed_seq >= snap.ledger_seq || now.since(since) >= QUIET_WAIT {
                    Stage::HandOver
                } else {
                    Stage::Serving
                }
            }
            _ => Stage::Serving,
        }
    }

    /// The drain's credit: while fewer than `in_flight_bound` of the clients let go have
    /// not logged in again at the new server, more are let go now, ahead of the window,
    /// each worker its share (`ToWorker::DrainTo`).
    fn grant_drain(&mut self, now: Uptime) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        if s.held_total == 0 || s.granted >= s.held_total {
            return;
        }
        if s.granted_at.is_some_and(|t| now.since(t) < GRANT_EVERY) {
            return;
        }
        let elapsed = s.drain_from.map_or(Duration::ZERO, |t| now.since(t));
        let target = drain_credit(s.held_total, s.admitted, s.admit_rate, elapsed);
        if target <= s.granted {
            return;
        }
        s.granted = target;
        s.granted_at = Some(now);
        for (w, count) in shares(&s.held, s.held_total, target) {
            if let Some(link) = self
                .worker_links
                .get(&w)
                .and_then(|&k| self.links.get_mut(k))
            {
                let count = count.min(u32::MAX.into()) as u32;
                link::encode(&ToWorker::DrainTo { count }, &mut link.outbuf);
            }
        }
    }

    /// Whether the core's clock stops: once the new server is quiet, nothing new is made
    /// here (its releases resume there, from the ledger).
    pub(super) fn ticking(&self) -> bool {
        !self.successor.as_ref().is_some_and(|s| s.quiet)
    }

    /// An output for the new server, taken (`None`), or left for this one.
    pub(super) fn for_successor(&mut self, out: Output) -> Option<Output> {
        let Some(s) = self.successor.as_mut() else {
            return Some(out);
        };
        let theirs = match out {
            Output::Reply { mut to, reply } if to.worker >= SUCCESSOR_WORKERS => {
                to.worker -= SUCCESSOR_WORKERS;
                Output::Reply { to, reply }
            }
            Output::Deal { worker, packets } if worker >= SUCCESSOR_WORKERS => Output::Deal {
                worker: worker - SUCCESSOR_WORKERS,
                packets,
            },
            Output::Admin { ticket, answer } if s.tickets.contains_key(&ticket) => Output::Admin {
                ticket: s.tickets.remove(&ticket).expect("looked"),
                answer,
            },
            // A notice for a user not connected here may be there (or offline: it waits in
            // the ledger for the next login either way).
            Output::Notice { user, notice } if self.presence.route(user).is_none() => {
                Output::Notice { user, notice }
            }
            other => return Some(other),
        };
        encode(&ToNew::Out(theirs), &mut s.outbuf);
        None
    }

    pub(super) fn flush_successor(&mut self) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        match hongbao_sys::net::write_nonblocking(&mut s.stream, &s.outbuf) {
            Ok(n) => link::consumed(&mut s.outbuf, n),
            Err(_) => self.successor_gone(),
        }
    }

    /// After the loop, with the ledger closed: the last answers and `LedgerYours`, written
    /// whole before this process goes.
    pub(super) fn hand_over_ledger(&mut self, seq: u64) {
        let Some(s) = self.successor.as_mut() else {
            return;
        };
        // The new server makes its own upgrade socket once the ledger is its.
        let _ = std::fs::remove_file(socket_path(&self.cfg.ledger.data_dir));
        encode(&ToNew::LedgerYours { seq }, &mut s.outbuf);
        let out = std::mem::take(&mut s.outbuf);
        match send_blocking(&s.stream, &out, &[]) {
            Ok(()) => tracing::info!(
                ledger_seq = seq,
                "upgrade: the ledger handed over; this server stops"
            ),
            Err(e) => {
                tracing::error!(error = %e, "upgrade: telling the new server the ledger is its")
            }
        }
    }
}

impl Supervisor {
    /// Once a turn: an upgrade's progress on the new server's side — the old one told
    /// once every worker is up, and the upgrade socket made once the ledger is here (so
    /// that this server can be upgraded in turn); on the old one's, the process SIGUSR2
    /// started waited for if it ended.
    pub(super) fn upgrade_progress(&mut self, ready: bool) {
        if let Some(child) = self.spawned.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                tracing::warn!(%status, "the upgrade SIGUSR2 started ended");
                self.spawned = None;
            }
        }
        let Some(predecessor) = &self.predecessor else {
            return;
        };
        if ready && !self.told_predecessor {
            self.told_predecessor = true;
            predecessor.ready();
            // Under systemd this process is the service now (the unit's NotifyAccess=all).
            let pid = std::process::id();
            self.tell_systemd(|n| n.send(&format!("MAINPID={pid}")));
            tracing::info!(
                "upgrade: every worker is up on the sockets handed over; the old server drains"
            );
        }
        if predecessor.done() {
            println!("{}", predecessor.record().line());
            let _ = std::io::Write::flush(&mut std::io::stdout());
            self.predecessor = None;
            self.listen_for_upgrades();
        }
    }

    /// SIGUSR2: this binary as the file is now (a deploy replaced it) starts with the same
    /// arguments and `--upgrade`, and takes this server over.
    pub(super) fn start_successor(&mut self) {
        if self.successor.is_some() || self.spawned.is_some() || self.predecessor.is_some() {
            tracing::warn!("SIGUSR2: an upgrade is already under way");
            return;
        }
        let Some(exe) = self.exe.clone() else {
            tracing::error!(
                "SIGUSR2: this binary's path is unknown; run `hongbao serve --upgrade` by hand"
            );
            return;
        };
        let mut command = std::process::Command::new(&exe);
        command
            .args(std::env::args_os().skip(1).filter(|a| a != "--upgrade"))
            .arg("--upgrade")
            .stdin(std::process::Stdio::null());
        match command.spawn() {
            Ok(child) => {
                tracing::info!(exe = %exe.display(), pid = child.id(), "SIGUSR2: the new binary started, taking over");
                self.spawned = Some(child);
            }
            Err(e) => {
                tracing::error!(exe = %exe.display(), error = %e, "SIGUSR2: starting the new binary")
            }
        }
    }

    /// The upgrade socket, listening in this server's loop.
    pub(super) fn listen_for_upgrades(&mut self) {
        let Some(mut listener) = super::upgrade::listen(&self.cfg.ledger.data_dir) else {
            return;
        };
        match self.poll.registry().register(
            &mut listener,
            super::upgrade::UPGRADE_LISTENER,
            mio::Interest::READABLE,
        ) {
            Ok(()) => self.upgrade_listener = Some(listener),
            Err(e) => tracing::warn!(error = %e, "watching the upgrade socket"),
        }
    }
}
