//! The coordinator's end of the agent link (docs/agents.md): a TLS listener that agents
//! join with the run's key, each given a slice index; once the run starts, each agent's
//! reports come in on its own thread and go to the merge as a local client's would.
//!
//! A stranger (no TLS, a wrong key, another protocol, an index taken or out of range,
//! a join after the start) is refused, logged, and counted in the run's refusals; it
//! holds nothing. An agent that closes, errs or says nothing for
//! [`link::SILENCE_LOST_MS`] before its last report is lost: the merge is told, and the
//! others go on. Before the start a lost agent's slot is free again (a restarted pod
//! joins in its place).

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use hongbao_sys::clock::{unix_ms, unix_us};
use serde::{Deserialize, Serialize};

use crate::agent::link::{self, ClockReading, Down, Link, Up};
use crate::client::ClientOptions;
use crate::report::Report;

use super::link_files::LinkFiles;

/// How a run's load goes out to agents.
#[derive(Debug, Clone)]
pub struct AgentPlan {
    /// Where agents dial in.
    pub listen: SocketAddr,
    /// Agents to wait for; each takes one slice of the users and of the rate.
    pub count: u32,
    /// The run's agent key and the link's TLS files, made where missing (docs/agents.md).
    pub dir: PathBuf,
    /// Names the coordinator's certificate is made for, besides the listen address,
    /// `localhost` and 127.0.0.1 (when it is made here).
    pub cert_names: Vec<String>,
    /// How long to wait for all of them to join.
    pub join_timeout: Duration,
    /// Start the agents here as `hongbao load-agent` processes (on `LoadOptions::hosts`
    /// round robin when there are some); otherwise they are started elsewhere.
    pub spawn: bool,
}

/// What the merge hears from the agents.
#[derive(Debug)]
pub(super) enum Event {
    Report(Box<Report>),
    Lost { index: u32, why: String },
}

/// One agent as the run's summary tells it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSummary {
    pub index: u32,
    pub name: String,
    pub peer: String,
    pub joined_unix_ms: u64,
    /// Coordinator minus agent (µs) when the run started, and its round trip.
    pub offset_us: i64,
    pub rtt_us: u64,
    /// The last offset it measured, and the farthest any measurement was from the first.
    pub last_offset_us: i64,
    pub drift_max_us: u64,
    /// Times its schedule was moved to a new measurement.
    pub clock_steps: u32,
    pub clock_readings: u32,
    /// The agent process's own CPU (the relay; its client's is in the load's), ms.
    pub relay_cpu_ms: u64,
    /// Its client's last counters (what it reported last, if it was lost).
    pub counters: crate::report::Counters,
}

/// A stranger refused at the door.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    pub unix_ms: u64,
    pub peer: String,
    pub reason: String,
}

/// The newest refusals kept for the summary (all are logged).
const REFUSALS_KEPT: usize = 100;

#[derive(Default)]
struct State {
    count: u32,
    started: bool,
    joined: BTreeMap<u32, Joined>,
    refusals: Vec<Refusal>,
    refused: u64,
}

struct Joined {
    tx: Sender<Down>,
    summary: AgentSummary,
    first: Option<ClockReading>,
}

/// The agents' door and the joined agents.
pub struct AgentHub {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    /// Where the started agents' reports and losses go (taken by the merge).
    events: Mutex<Option<Receiver<Event>>>,
    /// The CA file agents trust, and the key file.
    pub ca_file: PathBuf,
    pub key_file: PathBuf,
}

impl Drop for AgentHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl AgentHub {
    /// Listens for agents (the key and TLS files read from `plan.dir`, made if missing).
    pub fn listen(plan: &AgentPlan) -> Result<AgentHub> {
        if plan.count == 0 {
            return Err(Error::Config("--agents must be at least 1".into()));
        }
        let files = LinkFiles::ensure(&plan.dir, plan.listen, &plan.cert_names)?;
        let binding = || format!("binding the agents' address {}", plan.listen);
        let listener = TcpListener::bind(plan.listen).map_err(|e| Error::io(binding(), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(binding(), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io(binding(), e))?;
        let state = Arc::new(Mutex::new(State {
            count: plan.count,
            ..State::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let door = Door {
            config: files.server_config()?,
            key_hash: hongbao_http::access::key_hash(&files.key),
            state: state.clone(),
            events: tx,
        };
        let accepting = stop.clone();
        std::thread::Builder::new()
            .name("agent-door".into())
            .spawn(move || door.accept(listener, &accepting))
            .map_err(|e| Error::io("starting the agents' door", e))?;
        Ok(AgentHub {
            addr,
            state,
            stop,
            events: Mutex::new(Some(rx)),
            ca_file: files.ca_file,
            key_file: files.key_file,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn joined(&self) -> u32 {
        self.state.lock().unwrap().joined.len() as u32
    }

    /// Waits until every agent has joined (and measured its clock); an error naming how
    /// many did on timeout.
    pub fn wait_joined(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let (joined, count) = {
                let s = self.state.lock().unwrap();
                let ready = s.joined.values().filter(|j| j.first.is_some()).count();
                (ready as u32, s.count)
            };
            if joined == count {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "{joined} of {count} agents joined within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts every joined agent on its slice (`options(index)`); from now on nobody
    /// joins. Each agent's command channel, by index.
    pub(super) fn start(
        &self,
        options: impl Fn(u32) -> ClientOptions,
    ) -> Result<(Vec<Sender<Down>>, Receiver<Event>)> {
        let mut s = self.state.lock().unwrap();
        s.started = true;
        let mut senders = Vec::new();
        for (&index, joined) in &s.joined {
            joined
                .tx
                .send(Down::Start(Box::new(options(index))))
                .map_err(|e| Error::Refused(e.to_string()))?;
            senders.push(joined.tx.clone());
        }
        let events = self
            .events
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| Error::Refused("started twice".into()))?;
        Ok((senders, events))
    }

    /// The agents as they stand.
    pub fn summaries(&self) -> Vec<AgentSummary> {
        let s = self.state.lock().unwrap();
        s.joined.values().map(|j| j.summary.clone()).collect()
    }

    /// Strangers refused so far: the count, and the newest few.
    pub fn refusals(&self) -> (u64, Vec<Refusal>) {
        let s = self.state.lock().unwrap();
        (s.refused, s.refusals.clone())
    }
}

/// The listener's side: every connection on a thread of its own.
struct Door {
    config: Arc<rustls::ServerConfig>,
    key_hash: String,
    state: Arc<Mutex<State>>,
    events: Sender<Event>,
}

impl Door {
    fn accept(self, listener: TcpListener, stop: &AtomicBool) {
        let door = Arc::new(self);
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((tcp, peer)) => {
                    let door = door.clone();
                    let _ = std::thread::Builder::new()
                        .name("agent".into())
                        .spawn(move || door.serve(tcp, peer));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an agent");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn refuse(&self, peer: SocketAddr, reason: String) {
        tracing::warn!(%peer, reason, "refused a would-be agent");
        let mut s = self.state.lock().unwrap();
        s.refused += 1;
        if s.refusals.len() == REFUSALS_KEPT {
            s.refusals.remove(0);
        }
        s.refusals.push(Refusal {
            unix_ms: unix_ms(),
            peer: peer.to_string(),
            reason,
        });
    }

    fn serve(&self, tcp: TcpStream, peer: SocketAddr) {
        let _ = tcp.set_nonblocking(false);
        let _ = tcp.set_nodelay(true);
        let conn = match rustls::ServerConnection::new(self.config.clone()) {
            Ok(conn) => conn,
            Err(e) => return self.refuse(peer, format!("TLS: {e}")),
        };
        let mut link = match crate::agent::handshake(conn, tcp) {
            Ok(link) => link,
            Err(e) => return self.refuse(peer, format!("TLS: {e:#}")),
        };
        let (index, name) = match self.hello(&mut link) {
            Ok(hello) => hello,
            Err(unwelcome) => {
                let reason = unwelcome.to_string();
                let _ = link.send(&Down::Refused {
                    reason: reason.clone(),
                });
                return self.refuse(peer, reason);
            }
        };
        let (tx, rx) = mpsc::channel();
        let count = {
            let mut s = self.state.lock().unwrap();
            let slot = !s.joined.contains_key(&index) && !s.started;
            if !slot {
                drop(s);
                let reason = format!("slice {index} was taken meanwhile");
                let _ = link.send(&Down::Refused {
                    reason: reason.clone(),
                });
                return self.refuse(peer, reason);
            }
            s.joined.insert(
                index,
                Joined {
                    tx,
                    first: None,
                    summary: AgentSummary {
                        index,
                        name: name.clone(),
                        peer: peer.to_string(),
                        joined_unix_ms: unix_ms(),
                        ..AgentSummary::default()
                    },
                },
            );
            s.count
        };
        link.set_max_line(link::LINE_MAX);
        tracing::info!(index, name, %peer, "an agent joined");
        if link
            .send(&Down::Welcome {
                index,
                agents: count,
            })
            .is_err()
        {
            return self.leave(index, "closed at the welcome".into());
        }
        let why = self.run(index, &mut link, &rx);
        self.leave(index, why);
    }

    /// The hello: the right protocol and key, and a slice free; its index and name.
    fn hello(&self, link: &mut Link) -> Result<(u32, String), Unwelcome> {
        let line = match link.line_within(Duration::from_secs(10)) {
            Ok(Some(line)) => line,
            Ok(None) => return Err(Unwelcome::NoHello),
            Err(e) => return Err(Unwelcome::BeforeHello(e.to_string())),
        };
        let Ok(Up::Hello {
            protocol,
            key,
            name,
            index,
        }) = serde_json::from_slice::<Up>(&line)
        else {
            return Err(Unwelcome::NotAHello);
        };
        if hongbao_http::access::key_hash(&key) != self.key_hash {
            return Err(Unwelcome::WrongKey(name));
        }
        if protocol != link::PROTOCOL {
            return Err(Unwelcome::Protocol { name, protocol });
        }
        let s = self.state.lock().unwrap();
        if s.started {
            return Err(Unwelcome::Started(name));
        }
        match index {
            Some(i) if i >= s.count => Err(Unwelcome::NoSuchSlice {
                name,
                slice: i,
                count: s.count,
            }),
            Some(i) if s.joined.contains_key(&i) => Err(Unwelcome::Taken { name, slice: i }),
            Some(i) => Ok((i, name)),
            None => match (0..s.count).find(|i| !s.joined.contains_key(i)) {
                Some(i) => Ok((i, name)),
                None => Err(Unwelcome::AllTaken {
                    name,
                    count: s.count,
                }),
            },
        }
    }

    /// A joined agent's link until it ends: pings answered, clock readings kept, reports
    /// passed on, commands sent. Why it ended.
    fn run(&self, index: u32, link: &mut Link, commands: &Receiver<Down>) -> String {
        let mut heard = Instant::now();
        loop {
            let lines = match link.lines() {
                Ok(lines) => lines,
                Err(e) => return format!("the link failed: {e}"),
            };
            if !lines.is_empty() {
                heard = Instant::now();
            }
            for line in lines {
                match serde_json::from_slice::<Up>(&line) {
                    Ok(Up::Ping { t0_us }) => {
                        if link
                            .send(&Down::Pong {
                                t0_us,
                                t1_us: unix_us(),
                            })
                            .is_err()
                        {
                            return "closed".into();
                        }
                    }
                    Ok(Up::Clock(reading)) => self.clock(index, reading),
                    Ok(Up::Report(mut report)) => {
                        report.proc_index = index;
                        let last = report.last;
                        if self.events.send(Event::Report(report)).is_err() || last {
                            return String::new();
                        }
                    }
                    Ok(Up::Hello { .. }) => tracing::warn!(index, "a second hello"),
                    Err(e) => tracing::warn!(index, error = %e, "a bad line from an agent"),
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(down) => {
                        if let Err(e) = link.send(&down) {
                            return format!("the link failed: {e}");
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return "the run ended".into(),
                }
            }
            if heard.elapsed().as_millis() as u64 > link::SILENCE_LOST_MS {
                return format!("silent for {} s", link::SILENCE_LOST_MS / 1000);
            }
        }
    }

    fn clock(&self, index: u32, reading: ClockReading) {
        let mut s = self.state.lock().unwrap();
        let Some(j) = s.joined.get_mut(&index) else {
            return;
        };
        let first = *j.first.get_or_insert(reading);
        let a = &mut j.summary;
        if a.clock_readings > 0 && reading.applied_us != a.offset_us {
            a.clock_steps += 1;
        }
        a.clock_readings += 1;
        a.offset_us = reading.applied_us;
        a.rtt_us = reading.rtt_us;
        a.last_offset_us = reading.offset_us;
        a.relay_cpu_ms = reading.cpu_ms;
        a.drift_max_us = a
            .drift_max_us
            .max((reading.offset_us - first.offset_us).unsigned_abs());
    }

    /// The agent's link ended: `why` empty after its last report. Before the start its
    /// slice is free again; after, the merge hears it is lost.
    fn leave(&self, index: u32, why: String) {
        let mut s = self.state.lock().unwrap();
        if !s.started {
            s.joined.remove(&index);
            tracing::warn!(
                index,
                why,
                "an agent left before the start; its slice is free"
            );
            return;
        }
        drop(s);
        if !why.is_empty() {
            tracing::warn!(index, why, "an agent was lost");
            let _ = self.events.send(Event::Lost { index, why });
        }
    }
}

/// Starts `count` agents here (on `hosts` round robin when given), each asking for its
/// own slice.
pub(super) fn spawn_agents(
    exe: &std::path::Path,
    hub: &AgentHub,
    count: u32,
    hosts: &[hongbao_sys::netns::Host],
) -> Result<Vec<Child>> {
    let mut children = Vec::new();
    for i in 0..count {
        let mut command = match hosts.get(i as usize % hosts.len().max(1)) {
            Some(host) => host.command(exe),
            None => Command::new(exe),
        };
        let child = command
            .arg("load-agent")
            .arg("--coordinator")
            .arg(hub.addr().to_string())
            .arg("--ca")
            .arg(&hub.ca_file)
            .arg("--key-file")
            .arg(&hub.key_file)
            .arg("--index")
            .arg(i.to_string())
            .arg("--name")
            .arg(format!("agent-{i}"))
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| Error::io("starting a load agent", e))?;
        children.push(child);
    }
    Ok(children)
}

/// A process's children (Linux's `/proc/PID/task/PID/children`).
pub(super) fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Why an agent's hello is refused (the words it is sent, and the log's).
#[derive(Debug, thiserror::Error)]
enum Unwelcome {
    #[error("no hello within 10 s")]
    NoHello,
    #[error("before its hello: {0}")]
    BeforeHello(String),
    #[error("the first line is not a hello")]
    NotAHello,
    #[error("{0:?}: a wrong agent key")]
    WrongKey(String),
    #[error(
        "{name:?}: agent link protocol {protocol}, this coordinator speaks {}",
        link::PROTOCOL
    )]
    Protocol { name: String, protocol: u32 },
    #[error("{0:?}: the run has started")]
    Started(String),
    #[error("{name:?}: slice {slice} asked for, the run has {count} (0..{count})")]
    NoSuchSlice {
        name: String,
        slice: u32,
        count: u32,
    },
    #[error("{name:?}: slice {slice} is taken")]
    Taken { name: String, slice: u32 },
    #[error("{name:?}: all {count} slices are taken")]
    AllTaken { name: String, count: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::path::Path;

    fn hub(dir: &Path, count: u32) -> AgentHub {
        AgentHub::listen(&AgentPlan {
            listen: "127.0.0.1:0".parse().unwrap(),
            count,
            dir: dir.into(),
            cert_names: Vec::new(),
            join_timeout: Duration::from_secs(5),
            spawn: false,
        })
        .unwrap()
    }

    /// A TLS link to the hub, trusting `ca`.
    fn dial(hub: &AgentHub, ca: &[u8]) -> Result<Link> {
        let config = hongbao_proto::tls::client_config(ca, &[link::ALPN]).unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(config, name).unwrap();
        let tcp = TcpStream::connect(hub.addr()).map_err(|e| Error::io("connecting", e))?;
        crate::agent::handshake(conn, tcp)
    }

    fn hello(link: &mut Link, key: &str, index: Option<u32>) -> Down {
        link.send(&Up::Hello {
            protocol: link::PROTOCOL,
            key: key.into(),
            name: "tester".into(),
            index,
        })
        .unwrap();
        let line = link.line_within(Duration::from_secs(10)).unwrap().unwrap();
        serde_json::from_slice(&line).unwrap()
    }

    fn refused(down: Down) -> String {
        match down {
            Down::Refused { reason } => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    /// Every stranger an attacker could send is refused, holds no slice, and is on the
    /// record: a plain client on the TLS port, a wrong key, a slice out of range or taken,
    /// a client that does not trust the coordinator, a join after the start.
    #[test]
    fn strangers_are_refused_on_the_record_and_hold_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let hub = hub(dir.path(), 2);
        let ca = std::fs::read(&hub.ca_file).unwrap();
        let key = hongbao_http::access::read_secret_file(&hub.key_file).unwrap();
        assert!(key.len() >= 32, "a real key was made: {key:?}");

        // A plain client speaking the link's JSON without TLS: cut off, nothing said.
        let mut plain = TcpStream::connect(hub.addr()).unwrap();
        plain
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let line = format!(
            "{{\"hello\":{{\"protocol\":1,\"key\":\"{key}\",\"name\":\"plain\",\"index\":null}}}}\n"
        );
        plain.write_all(line.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = plain.read_to_end(&mut answer);
        assert!(
            !String::from_utf8_lossy(&answer).contains("welcome"),
            "a plain client is never welcomed"
        );

        let mut wrong = dial(&hub, &ca).unwrap();
        assert!(refused(hello(&mut wrong, "hbk_not-the-key", None)).contains("wrong agent key"));
        let mut far = dial(&hub, &ca).unwrap();
        assert!(refused(hello(&mut far, &key, Some(2))).contains("slice 2 asked for"));

        // A client trusting another CA will not finish the handshake.
        let other = hongbao_http::tls::DevCerts::make(&["127.0.0.1"]).unwrap();
        assert!(dial(&hub, other.ca_pem.as_bytes()).is_err());

        let mut first = dial(&hub, &ca).unwrap();
        assert!(matches!(
            hello(&mut first, &key, Some(1)),
            Down::Welcome {
                index: 1,
                agents: 2
            }
        ));
        let mut twin = dial(&hub, &ca).unwrap();
        assert!(refused(hello(&mut twin, &key, Some(1))).contains("slice 1 is taken"));
        let mut any = dial(&hub, &ca).unwrap();
        assert!(matches!(
            hello(&mut any, &key, None),
            Down::Welcome { index: 0, .. }
        ));
        assert_eq!(hub.joined(), 2);

        hub.state.lock().unwrap().started = true;
        let mut late = dial(&hub, &ca).unwrap();
        assert!(refused(hello(&mut late, &key, None)).contains("the run has started"));

        // Refusals are recorded as they happen (the plain one once its TLS fails).
        let deadline = Instant::now() + Duration::from_secs(15);
        let (count, list) = loop {
            let (count, list) = hub.refusals();
            if count >= 6 || Instant::now() > deadline {
                break (count, list);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(count, 6, "{list:#?}");
        let reasons: Vec<&str> = list.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons.iter().filter(|r| r.starts_with("TLS")).count(),
            2,
            "the plain client and the one of another CA: {reasons:?}"
        );
        assert!(list.iter().all(|r| r.peer.starts_with("127.0.0.1:")));
        assert_eq!(hub.joined(), 2, "no stranger holds a slice");
    }

    /// An agent that leaves before the start frees its slice for the next.
    #[test]
    fn a_slice_left_before_the_start_is_free_again() {
        let dir = tempfile::tempdir().unwrap();
        let hub = hub(dir.path(), 1);
        let ca = std::fs::read(&hub.ca_file).unwrap();
        let key = hongbao_http::access::read_secret_file(&hub.key_file).unwrap();
        let mut first = dial(&hub, &ca).unwrap();
        assert!(matches!(
            hello(&mut first, &key, Some(0)),
            Down::Welcome { .. }
        ));
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(10);
        while hub.joined() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut second = dial(&hub, &ca).unwrap();
        assert!(matches!(
            hello(&mut second, &key, Some(0)),
            Down::Welcome { index: 0, .. }
        ));
    }
}
