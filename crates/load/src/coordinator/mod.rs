//! The coordinator of a load run: starts the client processes, tells them the plan (users,
//! QPS, a shared epoch), merges their once-a-second reports into one row per second, and
//! changes the QPS live for all of them at once (from the next whole second).
//!
//! The clients never talk to each other: each computes its own firings from the plan and
//! the clock (`schedule.rs`). The coordinator only relays QPS changes and listens.
//!
//! Broadcast receipts arrive in the same reports and are merged per broadcast, across
//! processes and seconds (`broadcast.rs`): [`Load::broadcasts`].
//!
//! The clients are local processes fed through pipes, or, with [`AgentPlan`], load agents
//! on any machine that joined over the agent link (`agents.rs`): each takes one slice, and
//! its reports merge the same way. A slice lost before its last report (an agent cut off,
//! a client that died) is recorded with what it had sent; the others go on.
//!
//! - this file: starting the clients, merging their reports, changing the QPS;
//! - `agents`: the agents' door, their joins, clocks and links;
//! - `monitor`: the running load's once-a-second feed to the hongbao monitor;
//! - `rows`: the merged row of each second, what the report readers share, and the
//!   progress record read from the rows.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, Command};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hongbao_sys::clock::unix_ms;

use serde::Serialize;

mod agents;
mod link_files;
mod monitor;
mod rows;

use crate::agent::link::Down;
use crate::broadcast::BroadcastStats;
use crate::client::{self, ClientOptions};
use crate::error::{Error, Result};
use crate::report::{Counters, History, Report, UserTotals};
use crate::schedule::{partition, Schedule};
use crate::transport::{HttpConnection, Transport};
pub use agents::{AgentHub, AgentPlan, AgentSummary, Refusal};
use monitor::LoadMonitor;
pub use rows::{progress, Progress, Row};
use rows::{Lost, Shared};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The address the clients connect to: the server's `--listen` for TCP, its
    /// `--ws-listen` for WebSocket.
    pub server: SocketAddr,
    pub transport: Transport,
    pub users: u64,
    pub first_user: u64,
    pub qps: u64,
    /// Client processes; 0 = auto (enough to stay under the open-file limit, at least 2).
    pub procs: u32,
    /// Inclusive range of source addresses; `None` picks enough from 127.0.100.1 onward.
    pub source_ips: Option<(Ipv4Addr, Ipv4Addr)>,
    /// New connections per second, all processes together...
    pub connect_rate: u64,
    /// ...or every user at once, each coming back on its own back-off
    /// (`ClientOptions::connect_storm`).
    pub connect_storm: bool,
    /// `ClientOptions::connect_timeout_ms`.
    pub connect_timeout_ms: u64,
    pub secret: String,
    /// How the users' login tokens are signed.
    pub signer: crate::client::Signer,
    /// TLS to the server (binary frames), trusting this CA (PEM).
    pub tls_ca: Option<String>,
    /// Hold connecting until the epoch (the bench reads an idle memory baseline first);
    /// otherwise connecting starts at once and firing at the epoch.
    pub connect_at_epoch: bool,
    /// Report each second to the `hongbao monitor` at this address...
    pub monitor: Option<String>,
    /// ...with this key; none: `HONGBAO_MONITOR_KEY`, else the monitor's key file...
    pub monitor_key: Option<String>,
    /// ...this one (none: `hongbao-monitor.key`).
    pub monitor_key_file: Option<std::path::PathBuf>,
    /// See `ClientOptions::overload_backoff_secs`.
    pub overload_backoff_secs: u32,
    /// See `ClientOptions::http_connection`.
    pub http_connection: HttpConnection,
    /// See `ClientOptions::notice_poll_secs`.
    pub notice_poll_secs: u32,
    /// Lab hosts to run the client processes on (process `p` on host `p mod n`, entered
    /// between fork and exec); none: this machine's own namespace.
    pub hosts: Vec<hongbao_sys::netns::Host>,
    /// See `ClientOptions::request`.
    pub request: Option<crate::transport::RequestTemplate>,
    /// Run the clients on load agents (none: local client processes).
    pub agents: Option<AgentPlan>,
}

/// What a finished run hands back.
#[derive(Debug, Clone)]
pub struct Finished {
    pub totals: Counters,
    pub users: BTreeMap<u64, UserTotals>,
    /// Every win and open the users were told of, all processes together.
    pub history: History,
    pub peak_rss_bytes: u64,
    pub cpu_ms: u64,
    /// Slices lost before their last report.
    pub lost: Vec<LostSlice>,
    /// What coordinating cost this process.
    pub coordinator: CoordinatorCost,
}

/// The coordinator's own part of a run: how long the agents took to join, how long the
/// last reports took to come once asked to stop, and this process's CPU meanwhile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct CoordinatorCost {
    /// From listening for agents until every one had joined (0 without agents).
    pub join_ms: u64,
    /// From the stop until every slice's last report was in (or the slice lost).
    pub final_reports_ms: u64,
    /// From the start until the last reports were in.
    pub run_ms: u64,
    /// This process's CPU over `run_ms` (all of it: the bench's own work too).
    pub cpu_ms: u64,
}

/// A slice (an agent, a client process) lost before its last report: when, why, whose
/// users it held, and what it had reported by then.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct LostSlice {
    pub index: u32,
    pub unix_ms: u64,
    pub why: String,
    /// Its users' ids, first and last: what they were told after its last report is not
    /// known (their history is incomplete, not missing).
    pub first_user: u64,
    pub last_user: u64,
    /// Its last second reported (none: it never reported), and its counters then.
    pub last_second: Option<u64>,
    pub counters: Counters,
}

/// Where a client's commands go: its stdin, or its agent's link.
enum Input {
    Pipe(ChildStdin),
    Agent(Sender<Down>),
}

impl Input {
    /// Sends `command`; a failure says it was `doing` that.
    fn send(&mut self, command: &client::Command, doing: &str) -> Result<()> {
        match self {
            Input::Pipe(stdin) => {
                let line = serde_json::to_string(command)
                    .map_err(|e| Error::Json(e).within(doing))?
                    + "\n";
                stdin
                    .write_all(line.as_bytes())
                    .map_err(|e| Error::io(doing, e))?;
            }
            // An agent lost meanwhile is the merge's to report, not the command's.
            Input::Agent(tx) => {
                let _ = tx.send(Down::Command(command.clone()));
            }
        }
        Ok(())
    }
}

/// A running load: client processes plus the threads that read their reports.
pub struct Load {
    opts: LoadOptions,
    procs: u32,
    epoch_ms: u64,
    /// The local client processes, or the agents started here.
    children: Mutex<Vec<Child>>,
    inputs: Mutex<Vec<Input>>,
    hub: Option<AgentHub>,
    /// When it started, this process's CPU then, and how long the agents took to join.
    started: (Instant, u64),
    join_ms: u64,
    /// Shared with the report readers, so each row's target follows `set_qps`.
    schedule: Arc<Mutex<Schedule>>,
    shared: Arc<Mutex<Shared>>,
    monitor: Option<LoadMonitor>,
}

/// Client processes needed for `users` under an open-file limit of `nofile` (at least 2
/// when there are that many users, so both cores get work).
pub fn auto_procs(users: u64, nofile: u64) -> u32 {
    let per = hongbao_sys::limits::sockets_per_process(nofile);
    (users.div_ceil(per).max(users.min(2))).max(1) as u32
}

/// Default source addresses: 127.0.100.1 onward, at most
/// `doctor::LOAD_USERS_PER_SOURCE_ADDRESS` users each (fewer if the local port range is
/// small).
pub fn default_source_ips(users: u64) -> Vec<Ipv4Addr> {
    let per_address = hongbao_sys::doctor::Limits::read().load_users_per_source_address();
    let n = users.div_ceil(per_address).max(1);
    (0..n)
        .map(|i| Ipv4Addr::new(127, 0, 100 + (i / 250) as u8, 1 + (i % 250) as u8))
        .collect()
}

pub fn ip_range(first: Ipv4Addr, last: Ipv4Addr) -> Result<Vec<Ipv4Addr>> {
    let (a, b) = (u32::from(first), u32::from(last));
    if b < a || b - a > 65_536 || first.octets()[0] != 127 || last.octets()[0] != 127 {
        return Err(Error::Config(
            "source addresses must be a range within 127.0.0.0/8, first ≤ last, at most 65536"
                .into(),
        ));
    }
    Ok((a..=b).map(Ipv4Addr::from).collect())
}

impl Load {
    /// Starts the client processes (or waits for the agents to join and starts them).
    /// Connecting begins at once; firing starts at the epoch (about two seconds from now).
    pub fn start(opts: LoadOptions) -> Result<Load> {
        if opts.users == 0 {
            return Err(Error::Config("--users must be at least 1".into()));
        }
        let nofile = hongbao_sys::limits::raise_nofile_limit();
        let procs = match (&opts.agents, opts.procs) {
            (Some(plan), _) => plan.count,
            (None, 0) => auto_procs(opts.users, nofile),
            (None, procs) => procs,
        };
        let per_proc = partition(opts.users, procs, 0).end;
        if opts.agents.is_none() && per_proc + 100 > nofile {
            return Err(Error::Config(format!("{per_proc} connections per client process exceed the open-file limit {nofile}; use more --procs")));
        }
        let source_ips = match opts.source_ips {
            Some((a, b)) => ip_range(a, b)?,
            // Loopback sources reach only loopback: elsewhere (a lab host) the kernel picks.
            None if !opts.server.ip().is_loopback() => vec![Ipv4Addr::UNSPECIFIED],
            None => default_source_ips(opts.users),
        };
        let shared = Arc::new(Mutex::new(Shared::new(procs)));
        let schedule = Arc::new(Mutex::new(Schedule::new(opts.users, opts.qps)));
        let exe = std::env::current_exe().map_err(|e| Error::io("finding this executable", e))?;
        let mut children = Vec::new();
        let started = (Instant::now(), hongbao_sys::usage::self_usage().1);
        let hub = match &opts.agents {
            Some(plan) => {
                let hub = AgentHub::listen(plan)?;
                if plan.spawn {
                    children = agents::spawn_agents(&exe, &hub, plan.count, &opts.hosts)?;
                }
                hub.wait_joined(plan.join_timeout)?;
                Some(hub)
            }
            None => None,
        };
        let join_ms = started.0.elapsed().as_millis() as u64;
        let epoch_ms = (unix_ms() / 1000 + 2) * 1000;
        let client_options = |p: u32| ClientOptions {
            proc_index: p,
            procs,
            server: opts.server,
            users: opts.users,
            first_user: opts.first_user,
            qps: opts.qps,
            epoch_ms,
            clock_offset_us: 0,
            source_ips: rotate(&source_ips, p as usize),
            connect_rate: opts.connect_rate.div_ceil(procs as u64).max(1),
            connect_storm: opts.connect_storm,
            connect_timeout_ms: opts.connect_timeout_ms,
            secret: opts.secret.clone(),
            signer: opts.signer.clone(),
            tls_ca: opts.tls_ca.clone(),
            connect_from_ms: if opts.connect_at_epoch { epoch_ms } else { 0 },
            transport: opts.transport,
            overload_backoff_secs: opts.overload_backoff_secs,
            http_connection: opts.http_connection,
            notice_poll_secs: opts.notice_poll_secs,
            request: opts.request.clone(),
        };
        let mut inputs = Vec::new();
        match &hub {
            Some(hub) => {
                let (senders, events) = hub.start(client_options)?;
                inputs.extend(senders.into_iter().map(Input::Agent));
                let (shared, plan) = (shared.clone(), Arc::clone(&schedule));
                std::thread::Builder::new()
                    .name("agent-reports".into())
                    .spawn(move || {
                        for event in events {
                            match event {
                                agents::Event::Report(report) => merge(&shared, *report, &plan),
                                agents::Event::Lost { index, why } => lose(&shared, index, why),
                            }
                        }
                    })
                    .map_err(|e| Error::io("starting the agents' report reader", e))?;
            }
            None => {
                for p in 0..procs {
                    let command = match opts.hosts.get(p as usize % opts.hosts.len().max(1)) {
                        Some(host) => host.command(&exe),
                        None => Command::new(&exe),
                    };
                    let (child, stdin, stdout) =
                        client::start_process(command, &client_options(p))?;
                    inputs.push(Input::Pipe(stdin));
                    let shared = shared.clone();
                    let plan = Arc::clone(&schedule);
                    std::thread::Builder::new()
                        .name(format!("load-client-{p}"))
                        .spawn(move || {
                            for line in BufReader::new(stdout).lines() {
                                let Ok(line) = line else { break };
                                match serde_json::from_str::<Report>(&line) {
                                    Ok(report) => merge(&shared, report, &plan),
                                    Err(e) => tracing::warn!(proc = p, error = %e, "unreadable report from a load client"),
                                }
                            }
                            let finished = shared.lock().unwrap().finals[p as usize].is_some();
                            if !finished {
                                lose(&shared, p, "the client process ended without its last report".into());
                            }
                        })
                        .map_err(|e| Error::io(format!("starting the reader of load client {p}"), e))?;
                    children.push(child);
                }
            }
        }
        let monitor = match &opts.monitor {
            Some(addr) => Some(LoadMonitor::start(
                addr,
                opts.monitor_key.clone(),
                opts.monitor_key_file.clone(),
                shared.clone(),
                epoch_ms / 1000,
                opts.server,
            )?),
            None => None,
        };
        Ok(Load {
            opts,
            procs,
            epoch_ms,
            children: Mutex::new(children),
            inputs: Mutex::new(inputs),
            join_ms: if hub.is_some() { join_ms } else { 0 },
            hub,
            started,
            schedule,
            shared,
            monitor,
        })
    }

    /// The agents, their clocks (with agents).
    /// The agents, their clocks and their clients' newest counters (with agents).
    pub fn agents(&self) -> Vec<AgentSummary> {
        let mut agents = self
            .hub
            .as_ref()
            .map(AgentHub::summaries)
            .unwrap_or_default();
        let shared = self.shared.lock().unwrap();
        for a in &mut agents {
            let p = a.index as usize;
            let newest = shared.finals[p].as_ref().or(shared.latest[p].as_ref());
            a.counters = newest.map(|r| r.counters.clone()).unwrap_or_default();
        }
        agents
    }

    /// Would-be agents refused: the count, and the newest few.
    pub fn agent_refusals(&self) -> (u64, Vec<Refusal>) {
        self.hub
            .as_ref()
            .map(AgentHub::refusals)
            .unwrap_or_default()
    }

    pub fn procs(&self) -> u32 {
        self.procs
    }

    /// The load's processes on this machine: the client processes, or the agents started
    /// here and their clients.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .children
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.id())
            .collect();
        if self.hub.is_some() {
            let clients: Vec<u32> = pids.iter().flat_map(|&p| agents::children_of(p)).collect();
            pids.extend(clients);
        }
        pids
    }

    pub fn epoch_ms(&self) -> u64 {
        self.epoch_ms
    }

    /// The schedule second now running.
    pub fn current_second(&self) -> u64 {
        unix_ms().saturating_sub(self.epoch_ms) / 1000
    }

    /// Changes the QPS of every client from the next whole second; returns that second.
    pub fn set_qps(&self, qps: u64) -> Result<u64> {
        let from_second = if unix_ms() < self.epoch_ms {
            0
        } else {
            self.current_second() + 1
        };
        self.schedule.lock().unwrap().set_qps(from_second, qps);
        let command = client::Command::SetQps { from_second, qps };
        for input in self.inputs.lock().unwrap().iter_mut() {
            input.send(&command, "telling a load client the new QPS")?;
        }
        Ok(from_second)
    }

    pub fn qps_at(&self, second: u64) -> u64 {
        self.schedule.lock().unwrap().qps_at(second)
    }

    /// Rows of complete seconds (every process reported), oldest first.
    pub fn rows(&self) -> Vec<Row> {
        let shared = self.shared.lock().unwrap();
        shared
            .rows
            .values()
            .filter(|r| shared.complete(r))
            .cloned()
            .collect()
    }

    /// The newest complete second as a progress record.
    pub fn progress(&self) -> Option<Progress> {
        let shared = self.shared.lock().unwrap();
        let mut complete = shared.rows.values().rev().filter(|r| shared.complete(r));
        let row = complete.next()?;
        let previous = complete
            .next()
            .map(|r| r.counters.clone())
            .unwrap_or_default();
        Some(progress(row, &previous, self.opts.users))
    }

    /// Totals right now (newest report of each process).
    pub fn totals(&self) -> Counters {
        let shared = self.shared.lock().unwrap();
        let mut sum = Counters::default();
        for r in shared.latest.iter().flatten() {
            sum.add(&r.counters);
        }
        sum
    }

    /// Every broadcast received so far, merged over the clients, oldest stamp first.
    /// Complete up to the clients' last reports (once a second; after [`Load::stop`],
    /// everything).
    pub fn broadcasts(&self) -> Vec<BroadcastStats> {
        self.shared.lock().unwrap().deliveries.stats()
    }

    /// Messages received per broadcast so far, by stamp: [`Load::broadcasts`] without the
    /// histograms, cheap enough to poll.
    pub fn broadcasts_delivered(&self) -> BTreeMap<u64, u64> {
        self.shared.lock().unwrap().deliveries.delivered_by_stamp()
    }

    /// Slices lost so far.
    pub fn lost(&self) -> u32 {
        self.shared.lock().unwrap().lost.iter().flatten().count() as u32
    }

    pub fn logged_in(&self) -> u64 {
        let shared = self.shared.lock().unwrap();
        shared.latest.iter().flatten().map(|r| r.logged_in).sum()
    }

    /// Waits until every user is logged in; returns false on timeout.
    pub fn wait_logged_in(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.logged_in() >= self.opts.users {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Stops the clients and collects their final reports (a lost slice: what it had
    /// reported).
    pub fn stop(&self) -> Result<Finished> {
        let stopping = Instant::now();
        for input in self.inputs.lock().unwrap().iter_mut() {
            let _ = input.send(&client::Command::Stop, "telling a load client to stop");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for child in self.children.lock().unwrap().iter_mut() {
            loop {
                let ended = child
                    .try_wait()
                    .map_err(|e| Error::io("waiting for a load client to end", e))?;
                if ended.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // The reader threads finish when the pipes close; give them a moment to merge.
        // Agents report over the network: their last reports may take longer.
        let wait = if self.hub.is_some() { 30 } else { 5 };
        let deadline = Instant::now() + Duration::from_secs(wait);
        loop {
            let done = {
                let s = self.shared.lock().unwrap();
                s.finals
                    .iter()
                    .zip(&s.lost)
                    .all(|(fin, lost)| fin.is_some() || lost.is_some())
            };
            if done || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let coordinator = CoordinatorCost {
            join_ms: self.join_ms,
            final_reports_ms: stopping.elapsed().as_millis() as u64,
            run_ms: self.started.0.elapsed().as_millis() as u64,
            cpu_ms: hongbao_sys::usage::self_usage().1 - self.started.1,
        };
        if let Some(m) = &self.monitor {
            m.stop_sending();
        }
        let mut shared = self.shared.lock().unwrap();
        let history = std::mem::take(&mut shared.history);
        let mut totals = Counters::default();
        let mut users = BTreeMap::new();
        let mut cpu_ms = 0;
        let mut lost = Vec::new();
        // The last, partial second of every process: its counts, levels and latencies.
        let mut last = Row {
            reports: self.procs,
            broadcasts_seen: shared.deliveries.seen(),
            ..Row::default()
        };
        for (p, fin) in shared.finals.iter().enumerate() {
            let Some(fin) = fin else {
                // Lost (or silent past the wait): what it had reported stands for it.
                let why = match &shared.lost[p] {
                    Some(l) => l.clone(),
                    None => Lost {
                        unix_ms: unix_ms(),
                        why: "no last report within the wait".into(),
                    },
                };
                let latest = shared.latest[p].clone();
                let counters = latest
                    .as_ref()
                    .map(|r| r.counters.clone())
                    .unwrap_or_default();
                totals.add(&counters);
                cpu_ms += latest.as_ref().map_or(0, |r| r.cpu_ms);
                let range = partition(self.opts.users, self.procs, p as u32);
                lost.push(LostSlice {
                    index: p as u32,
                    unix_ms: why.unix_ms,
                    why: why.why,
                    first_user: self.opts.first_user + range.start,
                    last_user: self.opts.first_user + range.end.saturating_sub(1),
                    last_second: latest.map(|r| r.second),
                    counters,
                });
                continue;
            };
            totals.add(&fin.counters);
            cpu_ms += fin.cpu_ms;
            users.extend(fin.users.clone().unwrap_or_default());
            last.connected += fin.connected;
            last.logged_in += fin.logged_in;
            last.rss_bytes += fin.rss_bytes;
            last.shake_latency.extend_from_slice(&fin.shake_latency_us);
            last.served_latency
                .extend_from_slice(&fin.served_latency_us);
            last.open_latency.extend_from_slice(&fin.open_latency_us);
            last.send_lag.extend_from_slice(&fin.send_lag_us);
        }
        last.cpu_ms = cpu_ms;
        last.counters = totals.clone();
        if let Some(m) = &self.monitor {
            m.send_final(&last, unix_ms() / 1000);
        }
        Ok(Finished {
            totals,
            users,
            history,
            peak_rss_bytes: shared.peak_rss_bytes,
            cpu_ms,
            lost,
            coordinator,
        })
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in self.children.lock().unwrap().iter_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn rotate(ips: &[Ipv4Addr], by: usize) -> Vec<Ipv4Addr> {
    let mut v = ips.to_vec();
    v.rotate_left(by % ips.len().max(1));
    v
}

/// Slice `p` is lost: the seconds after its last report are complete without it.
fn lose(shared: &Mutex<Shared>, p: u32, why: String) {
    let mut s = shared.lock().unwrap();
    if s.lost.get(p as usize).is_none_or(Option::is_some) {
        return;
    }
    s.retire(p as usize);
    s.lost[p as usize] = Some(Lost {
        unix_ms: unix_ms(),
        why,
    });
}

fn merge(shared: &Mutex<Shared>, mut report: Report, plan: &Mutex<Schedule>) {
    // The schedule's lock is never held while taking the shared one, nor the other way.
    let target_qps = plan.lock().unwrap().qps_at(report.second);
    let mut s = shared.lock().unwrap();
    let p = report.proc_index as usize;
    s.deliveries.merge(&report.broadcasts);
    s.history.append(&mut report.history);
    if report.last {
        s.finals[p] = Some(report);
        // An agent stopped before the others: the seconds after are complete without it.
        s.retire(p);
        return;
    }
    let seen = s.deliveries.seen();
    // A new second starts from the counters of the slices gone before it.
    let frozen = if s.rows.contains_key(&report.second) {
        Counters::default()
    } else {
        s.frozen(report.second)
    };
    let row = s.rows.entry(report.second).or_insert_with(|| Row {
        second: report.second,
        unix_ms: report.unix_ms,
        target_qps,
        counters: frozen,
        ..Row::default()
    });
    row.reports += 1;
    // Every process reports second s before s + 1, so a row's last merge comes after
    // the previous row's: the count never goes backwards from row to row.
    row.broadcasts_seen = row.broadcasts_seen.max(seen);
    row.connected += report.connected;
    row.logged_in += report.logged_in;
    row.rss_bytes += report.rss_bytes;
    row.cpu_ms += report.cpu_ms;
    row.counters.add(&report.counters);
    row.shake_latency
        .extend_from_slice(&report.shake_latency_us);
    row.served_latency
        .extend_from_slice(&report.served_latency_us);
    row.open_latency.extend_from_slice(&report.open_latency_us);
    row.send_lag.extend_from_slice(&report.send_lag_us);
    let rss = row.rss_bytes;
    s.peak_rss_bytes = s.peak_rss_bytes.max(rss);
    s.latest[p] = Some(report);
}

#[cfg(test)]
mod tests;
