//! The agent link: one TLS connection from a load agent to its coordinator, JSON lines
//! both ways (docs/agents.md).
//!
//! The agent trusts the coordinator by its certificate (the CA file it is given) and proves
//! itself with the run's agent key, sent inside TLS in its first line. The coordinator
//! answers with the agent's slice index, then the clock exchange, the start (the slice's
//! client options), and the run's commands; the agent sends its client's once-a-second
//! reports and its clock readings.
//!
//! The clock is measured NTP's way: the agent stamps a ping with its time t0, the
//! coordinator answers with its own time t1, the agent reads t3 on arrival. Then
//! `offset = t1 − (t0 + t3) / 2` (coordinator minus agent) and `rtt = t3 − t0`, and of
//! the last few samples the one with the shortest round trip is believed: its error is
//! at most half its round trip.

use std::io::{ErrorKind, Read, Write};

use serde::{Deserialize, Serialize};

use crate::client::{ClientOptions, Command};
use crate::report::Report;

/// The link's protocol version; the coordinator refuses another.
pub const PROTOCOL: u32 = 1;
/// The TLS application protocol both ends insist on.
pub const ALPN: &[u8] = b"hongbao-agent/1";
/// The environment variable of the run's agent key; else its file...
pub const KEY_ENV: &str = "HONGBAO_AGENT_KEY";
/// ...named this in the agent directory.
pub const KEY_FILE: &str = "agent.key";
/// The coordinator's CA (what agents trust), its certificate and key, in the agent
/// directory.
pub const CA_FILE: &str = "ca.pem";
pub const CERT_FILE: &str = "cert.pem";
pub const CERT_KEY_FILE: &str = "key.pem";

/// The longest first line a stranger may send before it has proved anything.
pub const HELLO_MAX: usize = 4096;
/// The longest line after that: a final report carries every user's totals.
pub const LINE_MAX: usize = 1 << 30;
/// A joined agent that says nothing for this long (no report, no ping) is lost.
pub const SILENCE_LOST_MS: u64 = 10_000;
/// How often an agent pings while it runs (and so how often its offset is measured).
pub const PING_EVERY_MS: u64 = 2_000;
/// Samples kept for the clock filter; the shortest round trip among them wins.
pub const CLOCK_SAMPLES: usize = 8;
/// A measured offset this far from the one the agent's client runs on is applied.
pub const CLOCK_STEP_US: i64 = 1_000;

/// Agent → coordinator.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Up {
    /// The first line: who it is, and the key.
    Hello {
        protocol: u32,
        key: String,
        name: String,
        /// The slice it asks for (an Indexed Job's completion index); none: any free one.
        index: Option<u32>,
    },
    Ping {
        t0_us: u64,
    },
    Clock(ClockReading),
    /// One of its client's reports, as the client wrote it.
    Report(Box<Report>),
}

/// Coordinator → agent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Down {
    Welcome {
        index: u32,
        agents: u32,
    },
    Refused {
        reason: String,
    },
    Pong {
        t0_us: u64,
        t1_us: u64,
    },
    /// The slice's client options, in the coordinator's clock.
    Start(Box<ClientOptions>),
    Command(Command),
}

/// What an agent tells of its clock: the offset its client runs on, and the newest
/// filtered measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockReading {
    /// Coordinator minus agent, µs, as applied to the agent's schedule.
    pub applied_us: i64,
    /// The best of the last samples: its offset and round trip.
    pub offset_us: i64,
    pub rtt_us: u64,
    /// The agent process's own CPU so far (its client's is in the client's reports), ms.
    #[serde(default)]
    pub cpu_ms: u64,
}

/// One ping's measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// Coordinator minus agent, µs.
    pub offset_us: i64,
    pub rtt_us: u64,
}

impl ClockSample {
    /// From the agent's send time `t0`, the coordinator's answer time `t1` and the
    /// agent's receive time `t3` (µs).
    pub fn of(t0: u64, t1: u64, t3: u64) -> ClockSample {
        let mid = (t0 as i128 + t3 as i128) / 2;
        ClockSample {
            offset_us: (t1 as i128 - mid) as i64,
            rtt_us: t3.saturating_sub(t0),
        }
    }
}

/// The last [`CLOCK_SAMPLES`] samples; the best is the one of the shortest round trip.
#[derive(Debug, Default, Clone)]
pub struct ClockFilter {
    samples: std::collections::VecDeque<ClockSample>,
}

impl ClockFilter {
    pub fn add(&mut self, sample: ClockSample) {
        if self.samples.len() == CLOCK_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    pub fn best(&self) -> Option<ClockSample> {
        self.samples.iter().copied().min_by_key(|s| s.rtt_us)
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// A byte stream both ends talk over (rustls's stream on a TCP socket).
pub trait Io: Read + Write + Send {}
impl<T: Read + Write + Send> Io for T {}

/// JSON lines over an established TLS stream whose socket has a short read timeout:
/// [`Link::lines`] returns what arrived within it.
pub struct Link {
    io: Box<dyn Io>,
    buf: Vec<u8>,
    /// Lines read by [`Link::line_within`] beyond the one it returned.
    pending: std::collections::VecDeque<Vec<u8>>,
    max_line: usize,
}

impl Link {
    pub fn new(io: Box<dyn Io>, max_line: usize) -> Link {
        Link {
            io,
            buf: Vec::new(),
            pending: Default::default(),
            max_line,
        }
    }

    pub fn set_max_line(&mut self, max_line: usize) {
        self.max_line = max_line;
    }

    pub fn send(&mut self, message: &impl Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.send_raw(&line)
    }

    /// A line already encoded (ending in `\n`).
    pub fn send_raw(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.io.write_all(line)?;
        self.io.flush()
    }

    /// The complete lines that arrived within the read timeout (none: nothing came);
    /// an error once the link is closed or a line is longer than allowed.
    pub fn lines(&mut self) -> std::io::Result<Vec<Vec<u8>>> {
        if !self.pending.is_empty() {
            return Ok(self.pending.drain(..).collect());
        }
        let mut chunk = [0u8; 64 * 1024];
        match self.io.read(&mut chunk) {
            Ok(0) => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed")),
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
        let mut lines = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=end).collect();
            line.pop();
            lines.push(line);
        }
        if self.buf.len() > self.max_line {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("a line longer than {} bytes", self.max_line),
            ));
        }
        Ok(lines)
    }
}

impl Link {
    /// The next line within `timeout` (none: nothing came).
    pub fn line_within(
        &mut self,
        timeout: std::time::Duration,
    ) -> std::io::Result<Option<Vec<u8>>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Ok(Some(line));
            }
            if std::time::Instant::now() > deadline {
                return Ok(None);
            }
            let lines = self.lines()?;
            self.pending.extend(lines);
        }
    }
}

/// A report line as an [`Up::Report`] line, without decoding it.
pub fn report_line(report: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(report.len() + 12);
    line.extend_from_slice(b"{\"report\":");
    line.extend_from_slice(report);
    line.extend_from_slice(b"}\n");
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path 3 ms out and 5 ms back, the coordinator 40 ms ahead: the estimate is off
    /// by half the asymmetry (1 ms), never more than half the round trip.
    #[test]
    fn the_offset_is_the_midpoint_estimate() {
        let agent_send = 1_000_000u64;
        let true_offset = 40_000i64;
        let t1 = (agent_send as i64 + 3_000 + true_offset) as u64;
        let t3 = agent_send + 8_000;
        let s = ClockSample::of(agent_send, t1, t3);
        assert_eq!(s.rtt_us, 8_000);
        assert_eq!(s.offset_us, true_offset - 1_000);
        assert!((s.offset_us - true_offset).unsigned_abs() <= s.rtt_us / 2);
        // An agent ahead of the coordinator: a negative offset.
        assert_eq!(ClockSample::of(5_000, 1_000, 5_002).offset_us, -4_001);
    }

    /// The filter believes the sample of the shortest round trip of the last eight.
    #[test]
    fn the_filter_keeps_the_shortest_round_trip_of_the_last_samples() {
        let mut f = ClockFilter::default();
        assert!(f.best().is_none());
        f.add(ClockSample {
            offset_us: 100,
            rtt_us: 50,
        });
        for i in 0..7 {
            f.add(ClockSample {
                offset_us: 900 + i,
                rtt_us: 400,
            });
        }
        assert_eq!(f.best().unwrap().offset_us, 100);
        // One more pushes the short one out.
        f.add(ClockSample {
            offset_us: 7,
            rtt_us: 300,
        });
        assert_eq!(f.len(), CLOCK_SAMPLES);
        assert_eq!(f.best().unwrap().offset_us, 7);
    }

    /// Lines split across reads come out whole; a line past the limit is refused.
    #[test]
    fn lines_are_framed_and_bounded() {
        struct Chunks(Vec<Vec<u8>>);
        impl Read for Chunks {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() {
                    return Err(ErrorKind::WouldBlock.into());
                }
                let c = self.0.remove(0);
                buf[..c.len()].copy_from_slice(&c);
                Ok(c.len())
            }
        }
        impl Write for Chunks {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let chunks = vec![
            b"{\"a\":".to_vec(),
            b"1}\n{\"b\"".to_vec(),
            b":2}\n".to_vec(),
        ];
        let mut link = Link::new(Box::new(Chunks(chunks)), 16);
        assert!(link.lines().unwrap().is_empty());
        assert_eq!(link.lines().unwrap(), vec![b"{\"a\":1}".to_vec()]);
        assert_eq!(link.lines().unwrap(), vec![b"{\"b\":2}".to_vec()]);
        assert!(link.lines().unwrap().is_empty(), "nothing more: no lines");
        let long = Chunks(vec![vec![b'x'; 17]]);
        let mut link = Link::new(Box::new(long), 16);
        assert_eq!(
            link.lines().unwrap_err().kind(),
            ErrorKind::InvalidData,
            "a stranger's endless line is cut off"
        );
    }

    /// A client's report line relayed as it is reads back as the same report.
    #[test]
    fn a_relayed_report_reads_back() {
        let report = Report {
            proc_index: 3,
            second: 9,
            shake_latency_us: vec![(1000, 2)],
            ..Report::default()
        };
        let line = report_line(&serde_json::to_vec(&report).unwrap());
        match serde_json::from_slice::<Up>(&line[..line.len() - 1]).unwrap() {
            Up::Report(r) => {
                assert_eq!((r.proc_index, r.second), (3, 9));
                assert_eq!(r.shake_latency_us, vec![(1000, 2)]);
            }
            other => panic!("{other:?}"),
        }
    }
}
