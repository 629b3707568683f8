//! What a commit of a win costs on this disk, measured alone: `hongbao ledger-bench`
//! hands the very `LedgerWriter` the server uses one `ShakeWon` at a time at an even rate
//! (open loop, as the floor's client sends), and reports each win's latency from its
//! intended time to the commit that made it durable, the commits it took, and the CPU the
//! process spent per win. Issue 28 holds the won shakes' p99 against this commit's p99
//! plus the floor's (docs/BENCHMARKS.md).

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use hongbao_money::event::{Event, Record};

use hongbao_embedded::ledger::{GroupCommit, Ledger, LedgerWriter};
use hongbao_embedded::Result;

/// The campaign every win is drawn from.
const CAMPAIGN: u32 = 1;

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Wins a second.
    pub rate: u32,
    pub duration: Duration,
    pub group: GroupCommit,
}

#[derive(Debug)]
pub struct Outcome {
    pub wins: u64,
    pub commits: u64,
    /// Each win's intended time to its commit, µs.
    pub latency_us: Histogram<u64>,
    /// The process's CPU (user + system) over the run, µs: the writer thread's commits,
    /// and the two threads that hand it wins and watch the commits.
    pub cpu_us: u64,
}

impl Outcome {
    pub fn line(&self, s: &Settings) -> String {
        let ms = |q: f64| self.latency_us.value_at_quantile(q) as f64 / 1000.0;
        format!(
            "ledger-bench rate {} secs {} interval_ms {} wins {} commits {} wins_per_commit {:.2} \
             p50_ms {:.2} p99_ms {:.2} p999_ms {:.2} max_ms {:.2} cpu_us_per_win {:.0}",
            s.rate,
            s.duration.as_secs(),
            s.group.commit_interval.as_millis(),
            self.wins,
            self.commits,
            self.wins as f64 / self.commits.max(1) as f64,
            ms(0.5),
            ms(0.99),
            ms(0.999),
            self.latency_us.max() as f64 / 1000.0,
            self.cpu_us as f64 / self.wins.max(1) as f64,
        )
    }
}

/// Runs the measurement on a ledger created in `dir` (which must not hold one).
pub fn run(dir: &Path, s: Settings) -> Result<Outcome> {
    let wins = (s.rate as u64 * s.duration.as_millis() as u64 / 1000).max(1);
    let mut ledger = Ledger::open(dir)?;
    ledger.append(&[campaign(wins)])?;
    let (commit_tx, commit_rx) = mpsc::channel::<Instant>();
    let mut writer = LedgerWriter::spawn(ledger, 1, s.group, move || {
        let _ = commit_tx.send(Instant::now());
    });
    let interval = Duration::from_secs(1) / s.rate.max(1);
    let cpu_before = process_cpu_us();
    let start = Instant::now() + Duration::from_millis(10);
    let intended = |seq: u64| start + interval * (seq - 2) as u32;
    let mut latency_us = hongbao_telemetry::sample::new_histogram();
    let mut commits = 0;
    std::thread::scope(|scope| {
        let writer = &writer;
        scope.spawn(move || {
            for i in 0..wins {
                let seq = i + 2;
                let at = intended(seq);
                if let Some(wait) = at.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                writer.submit(vec![won(seq, i as u32)]);
            }
        });
        // Each commit's time against every win it made durable; a commit that finds its
        // wins already counted (two commits before this thread woke) adds none.
        let mut counted = 1;
        while counted < wins + 1 {
            let Ok(at) = commit_rx.recv() else { break };
            commits += 1;
            let committed = writer.committed();
            for seq in counted + 1..=committed {
                let us = at.saturating_duration_since(intended(seq)).as_micros() as u64;
                latency_us.saturating_record(us.max(1));
            }
            counted = counted.max(committed);
        }
    });
    let cpu_us = process_cpu_us().saturating_sub(cpu_before);
    writer.finish()?;
    Ok(Outcome {
        wins,
        commits,
        latency_us,
        cpu_us,
    })
}

fn campaign(packets: u64) -> Record {
    Record {
        seq: 1,
        ts_ms: 0,
        event: Event::ShakeCampaign {
            campaign: CAMPAIGN,
            packets: packets as u32,
            rate_per_sec: 0,
            amount_min: 100,
            amount_max: 100,
            seed: 0,
            minted_cents: packets * 100,
            by: Some("ledger-bench".into()),
        },
    }
}

fn won(seq: u64, index: u32) -> Record {
    Record {
        seq,
        ts_ms: seq,
        event: Event::ShakeWon {
            campaign: CAMPAIGN,
            index,
            user: 1 + seq % 200_000,
            amount_cents: 100,
        },
    }
}

/// This process's CPU so far (user + system), µs.
fn process_cpu_us() -> u64 {
    // SAFETY: getrusage writes only into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_win_is_committed_and_timed_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings {
            rate: 200,
            duration: Duration::from_millis(500),
            group: GroupCommit::default(),
        };
        let out = run(dir.path(), s).unwrap();
        assert_eq!(out.wins, 100);
        assert_eq!(out.latency_us.len(), 100, "each win timed once");
        assert!(out.commits >= 1 && out.commits <= 100, "{out:?}");
        // What was timed is on disk: the campaign and every win, and the balances add up.
        let ledger = Ledger::open(dir.path()).unwrap();
        let mut seqs = Vec::new();
        ledger.for_each(|r| seqs.push(r.seq)).unwrap();
        assert_eq!(seqs, (1..=101).collect::<Vec<u64>>());
        let paid: u64 = ledger.balances().unwrap().values().sum();
        assert_eq!(paid, 100 * 100);
        assert!(out.line(&s).contains("wins 100 "));
    }
}
