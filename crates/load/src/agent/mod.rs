//! `hongbao load-agent`: a load client on any machine, run by a coordinator elsewhere
//! (`hongbao bench --agents N`) over the agent link (`link.rs`, docs/agents.md).
//!
//! The agent dials the coordinator, proves itself with the run's key, measures its clock
//! against the coordinator's, and waits for its slice. Then it starts one ordinary load
//! client process (`hongbao load-client`) with the slice's options — its schedule moved
//! onto this machine's clock by the measured offset — and relays: the coordinator's
//! commands to the client's stdin, the client's once-a-second reports to the coordinator
//! as they are. It keeps measuring the offset (a ping every two seconds) and moves the
//! client's schedule when the offset moves by more than a millisecond.
//!
//! - this file: joining, the relay, the clock kept;
//! - `link`: the wire (messages, framing) and the clock's arithmetic.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command as Process};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hongbao_sys::clock::unix_us;
use hongbao_sys::Stop;

pub mod link;

use crate::client::Command;
use crate::error::{Error, Result};
use link::{ClockFilter, ClockReading, ClockSample, Down, Link, Up};

/// What `hongbao load-agent` is told.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The coordinator's agent address, `HOST:PORT` (HOST as its certificate names it).
    pub coordinator: String,
    /// The CA the coordinator's certificate is signed by (PEM).
    pub ca_file: PathBuf,
    /// The run's agent key (unless `HONGBAO_AGENT_KEY` is set).
    pub key_file: PathBuf,
    /// The slice to ask for (an Indexed Job's completion index); none: any free one.
    pub index: Option<u32>,
    pub name: String,
    /// How long to keep trying to reach the coordinator.
    pub join_timeout: Duration,
}

/// How long the coordinator has to answer the TLS handshake and the hello.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The read timeout of the running link: how long one turn of the relay waits.
pub const TURN: Duration = Duration::from_millis(100);
/// Pings when joining; the best of them sets the first offset.
const JOIN_PINGS: usize = link::CLOCK_SAMPLES;
/// What the agent was doing when the link failed under it.
const PINGING: &str = "pinging the coordinator";
const TELLING_THE_CLOCK: &str = "telling the coordinator its clock";

/// Runs an agent until its client has finished (or the coordinator is gone: an error).
pub fn run(opts: AgentOptions, stop: &Stop) -> Result<()> {
    let key = hongbao_http::access::run_key(link::KEY_ENV, &opts.key_file, false)
        .map_err(|e| {
            Error::io(
                format!("reading the agent key {}", opts.key_file.display()),
                e,
            )
        })?
        .ok_or_else(|| {
            Error::Config(format!(
                "no agent key: {} is not set and {} does not exist (the coordinator makes it)",
                link::KEY_ENV,
                opts.key_file.display()
            ))
        })?;
    let ca = std::fs::read(&opts.ca_file).map_err(|e| {
        Error::io(
            format!("reading the coordinator's CA {}", opts.ca_file.display()),
            e,
        )
    })?;
    let config = hongbao_proto::tls::client_config(&ca, &[link::ALPN])?;
    let mut link = dial(&opts.coordinator, config, opts.join_timeout, stop)?;
    link.send(&Up::Hello {
        protocol: link::PROTOCOL,
        key,
        name: opts.name.clone(),
        index: opts.index,
    })
    .map_err(|e| Error::io("saying hello to the coordinator", e))?;
    let (index, agents) = match next_message(&mut link, ANSWER_TIMEOUT)? {
        Down::Welcome { index, agents } => (index, agents),
        Down::Refused { reason } => {
            return Err(Error::Refused(format!(
                "the coordinator refused this agent: {reason}"
            )))
        }
        other => {
            return Err(Error::Refused(format!(
                "the coordinator answered the hello with {other:?}"
            )))
        }
    };
    let _span = tracing::info_span!("load_agent", index).entered();
    let mut clock = Clock::default();
    for _ in 0..JOIN_PINGS {
        let t0_us = unix_us();
        link.send(&Up::Ping { t0_us })
            .map_err(|e| Error::io(PINGING, e))?;
        match next_message(&mut link, ANSWER_TIMEOUT)? {
            Down::Pong { t0_us, t1_us } => clock.pong(t0_us, t1_us),
            other => {
                return Err(Error::Refused(format!(
                    "the coordinator answered a ping with {other:?}"
                )))
            }
        }
    }
    clock.applied_us = clock.filter.best().map_or(0, |s| s.offset_us);
    link.send(&Up::Clock(clock.reading()))
        .map_err(|e| Error::io(TELLING_THE_CLOCK, e))?;
    tracing::info!(
        index,
        agents,
        offset_us = clock.applied_us,
        rtt_us = clock.filter.best().map_or(0, |s| s.rtt_us),
        "joined; waiting for the start"
    );
    // Until the start: pings keep the link and the clock alive.
    let mut last_ping = Instant::now();
    let options = loop {
        if stop.requested() {
            return Ok(());
        }
        let mut start = None;
        for line in link
            .lines()
            .map_err(|e| Error::io("the coordinator went away before the start", e))?
        {
            match serde_json::from_slice::<Down>(&line)? {
                Down::Pong { t0_us, t1_us } => clock.pong(t0_us, t1_us),
                Down::Start(options) => start = Some(options),
                Down::Refused { reason } => {
                    return Err(Error::Refused(format!(
                        "the coordinator sent this agent away: {reason}"
                    )))
                }
                other => tracing::warn!(message = ?other, "unexpected before the start"),
            }
        }
        if let Some(options) = start {
            break options;
        }
        if last_ping.elapsed().as_millis() as u64 >= link::PING_EVERY_MS {
            link.send(&Up::Ping { t0_us: unix_us() })
                .map_err(|e| Error::io(PINGING, e))?;
            last_ping = Instant::now();
        }
    };
    // The schedule, on this machine's clock.
    clock.applied_us = clock.filter.best().map_or(0, |s| s.offset_us);
    let mut options = *options;
    options.clock_offset_us = clock.applied_us;
    if options.connect_from_ms > 0 {
        options.connect_from_ms = (options.connect_from_ms as i64 - clock.applied_us / 1000) as u64;
    }
    let mut client = Relay::start(&options)?;
    let result = client.relay(&mut link, &mut clock, stop);
    client.finish();
    result
}

/// The clock as the agent keeps it: the samples, and the offset its client runs on.
#[derive(Default)]
struct Clock {
    filter: ClockFilter,
    applied_us: i64,
}

impl Clock {
    fn pong(&mut self, t0_us: u64, t1_us: u64) {
        self.filter.add(ClockSample::of(t0_us, t1_us, unix_us()));
    }

    fn reading(&self) -> ClockReading {
        let best = self.filter.best().unwrap_or(ClockSample {
            offset_us: 0,
            rtt_us: 0,
        });
        ClockReading {
            applied_us: self.applied_us,
            offset_us: best.offset_us,
            rtt_us: best.rtt_us,
            cpu_ms: hongbao_sys::usage::self_usage().1,
        }
    }

    /// The offset to move the client's schedule to, when the best sample is more than
    /// a step from the one applied.
    fn step(&mut self) -> Option<i64> {
        let best = self.filter.best()?;
        if (best.offset_us - self.applied_us).abs() > link::CLOCK_STEP_US {
            self.applied_us = best.offset_us;
            Some(best.offset_us)
        } else {
            None
        }
    }
}

/// The agent's one client process, its reports read on a thread of their own.
struct Relay {
    child: Child,
    stdin: Option<ChildStdin>,
    reports: mpsc::Receiver<Vec<u8>>,
}

impl Relay {
    fn start(options: &crate::client::ClientOptions) -> Result<Relay> {
        let exe = std::env::current_exe().map_err(|e| Error::io("finding this executable", e))?;
        let (child, stdin, stdout) = crate::client::start_process(Process::new(exe), options)?;
        let (tx, reports) = mpsc::channel();
        std::thread::Builder::new()
            .name("agent-client-reports".into())
            .spawn(move || {
                for line in BufReader::new(stdout).split(b'\n') {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::io("starting the client's report reader", e))?;
        Ok(Relay {
            child,
            stdin: Some(stdin),
            reports,
        })
    }

    fn command(&mut self, command: &Command) {
        if let Some(stdin) = &mut self.stdin {
            let line = serde_json::to_string(command).expect("a command encodes") + "\n";
            if stdin.write_all(line.as_bytes()).is_err() {
                self.stdin = None;
            }
        }
    }

    /// Relays until the client has sent its last report and ended.
    fn relay(&mut self, link: &mut Link, clock: &mut Clock, stop: &Stop) -> Result<()> {
        let mut last_ping = Instant::now();
        let mut stopping = false;
        loop {
            let lines = match link.lines() {
                Ok(lines) => lines,
                // After the client's last report the coordinator closes: that is the end.
                Err(_) if self.ended_within(Duration::from_secs(2)) => return Ok(()),
                Err(e) => {
                    return Err(Error::io(
                        "the coordinator went away (the client is stopped)",
                        e,
                    ))
                }
            };
            for line in lines {
                match serde_json::from_slice::<Down>(&line) {
                    Ok(Down::Pong { t0_us, t1_us }) => {
                        clock.pong(t0_us, t1_us);
                        if let Some(offset_us) = clock.step() {
                            tracing::info!(offset_us, "the clock moved: the schedule follows");
                            self.command(&Command::Clock { offset_us });
                        }
                        link.send(&Up::Clock(clock.reading()))
                            .map_err(|e| Error::io(TELLING_THE_CLOCK, e))?;
                    }
                    Ok(Down::Command(command)) => self.command(&command),
                    Ok(other) => tracing::warn!(message = ?other, "unexpected while running"),
                    Err(e) => tracing::warn!(error = %e, "a bad line from the coordinator"),
                }
            }
            loop {
                match self.reports.try_recv() {
                    Ok(report) => link
                        .send_raw(&link::report_line(&report))
                        .map_err(|e| Error::io("relaying a report to the coordinator", e))?,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Ok(()),
                }
            }
            if stop.requested() && !stopping {
                // Told to go (SIGTERM from systemd or Kubernetes): the client's last
                // report still goes to the coordinator.
                stopping = true;
                self.command(&Command::Stop);
            }
            if last_ping.elapsed().as_millis() as u64 >= link::PING_EVERY_MS {
                link.send(&Up::Ping { t0_us: unix_us() })
                    .map_err(|e| Error::io(PINGING, e))?;
                last_ping = Instant::now();
            }
        }
    }

    /// Whether the client ends successfully within `wait`.
    fn ended_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return false,
            }
        }
    }

    /// Closes the client's stdin (it stops) and waits for it, killing it after 10 s.
    fn finish(&mut self) {
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The next line, decoded, within `timeout`.
fn next_message(link: &mut Link, timeout: Duration) -> Result<Down> {
    match link
        .line_within(timeout)
        .map_err(|e| Error::io("the coordinator closed the link", e))?
    {
        Some(line) => serde_json::from_slice(&line)
            .map_err(|e| Error::Json(e).within("a bad line from the coordinator")),
        None => Err(Error::Timeout(format!(
            "the coordinator did not answer within {timeout:?}"
        ))),
    }
}

/// Connects to the coordinator and completes the TLS handshake, trying again every
/// second while it cannot be reached (it may start after its agents), up to `timeout`.
fn dial(
    coordinator: &str,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
    stop: &Stop,
) -> Result<Link> {
    let (host, _) = coordinator
        .rsplit_once(':')
        .ok_or_else(|| Error::Config(format!("--coordinator {coordinator:?} is not HOST:PORT")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
        Error::Config(format!(
            "{host:?} is not a name a certificate can have: {e}"
        ))
    })?;
    let deadline = Instant::now() + timeout;
    let tcp = loop {
        let attempt = coordinator
            .to_socket_addrs()
            .and_then(|mut addrs| {
                addrs
                    .next()
                    .ok_or_else(|| std::io::Error::other("the name has no address"))
            })
            .and_then(|addr| TcpStream::connect_timeout(&addr, ANSWER_TIMEOUT));
        match attempt {
            Ok(tcp) => break tcp,
            Err(e) if Instant::now() < deadline && !stop.requested() => {
                tracing::debug!(error = %e, "the coordinator is not there yet");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => {
                return Err(Error::io(
                    format!("reaching the coordinator at {coordinator}"),
                    e,
                ))
            }
        }
    };
    let tls_with = || format!("TLS with the coordinator at {coordinator}");
    tcp.set_nodelay(true)
        .map_err(|e| Error::io(format!("reaching the coordinator at {coordinator}"), e))?;
    let conn =
        rustls::ClientConnection::new(config, name).map_err(|e| Error::Config(e.to_string()))?;
    let mut link = handshake(conn, tcp).map_err(|e| e.within(tls_with()))?;
    // The coordinator's certificate is proved: its lines may be long (a start's options).
    link.set_max_line(link::LINE_MAX);
    Ok(link)
}

/// Completes a TLS handshake (within [`ANSWER_TIMEOUT`]), insists on the agent link's
/// application protocol, and makes the link, its reads waiting at most a [`TURN`].
pub fn handshake<C, S>(mut conn: C, mut tcp: TcpStream) -> Result<Link>
where
    C: std::ops::DerefMut + std::ops::Deref<Target = rustls::ConnectionCommon<S>> + Send + 'static,
    S: rustls::SideData + 'static,
{
    let timing_out = |e| Error::io("setting the link's read timeout", e);
    tcp.set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(timing_out)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)
            .map_err(|e| Error::io("completing the handshake", e))?;
    }
    if conn.alpn_protocol() != Some(link::ALPN) {
        return Err(Error::Refused(
            "the other end does not speak the agent link".into(),
        ));
    }
    tcp.set_read_timeout(Some(TURN)).map_err(timing_out)?;
    Ok(Link::new(
        Box::new(rustls::StreamOwned::new(conn, tcp)),
        link::HELLO_MAX,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(offset_us: i64, rtt_us: u64) -> ClockSample {
        ClockSample { offset_us, rtt_us }
    }

    /// The schedule moves only when the best measurement is more than a step away from
    /// the offset it runs on, and then onto that measurement.
    #[test]
    fn the_schedule_moves_by_whole_steps_only() {
        let mut clock = Clock::default();
        clock.filter.add(sample(40_000, 300));
        assert_eq!(clock.step(), Some(40_000), "the first measurement is taken");
        clock.filter.add(sample(40_900, 200));
        assert_eq!(clock.step(), None, "900 µs: within a step");
        clock.filter.add(sample(43_000, 100));
        assert_eq!(clock.step(), Some(43_000));
        // A noisy sample of a long round trip is not believed over a short one.
        clock.filter.add(sample(90_000, 5_000));
        assert_eq!(clock.step(), None);
        assert_eq!(clock.reading().applied_us, 43_000);
    }
}
