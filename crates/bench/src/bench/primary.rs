//! Faults done to the ledger's primary, in a lab whose ledger has a synchronous standby
//! (docs/scale-out.md, "A standby and failover"): the primary lost with its disk, frozen,
//! or cut off from every other host. Each is timed from the fault to the ledger's first
//! commit after it: the newest event's timestamp (the gateway's clock as its batch
//! began) read on each data node at once, every 100 ms, on a thread of its own that needs
//! no lock on the lab — a freeze or a cut is still under way when the standby has taken
//! over. A sharded lab's shard frozen or cut off (`inject_shard`) is timed the same way,
//! on that shard's one PostgreSQL.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hongbao_lab::Lab;
use hongbao_sys::clock::unix_ms;

use super::injected::Injected;
use super::options::{Fault, PRIMARY_OUT};

/// How long after it is asked for a freeze or a cut is taken to have landed.
const LANDING: Duration = Duration::from_secs(2);

/// How long a failover, the first commit after it, or a standby's rejoining may take
/// before the fault is written down as not healed.
const HEAL_TIMEOUT: Duration = Duration::from_secs(120);

/// `fault` done to the primary now; with `heal`, the old primary is a synchronous
/// standby again before this returns.
pub(crate) fn inject(lab: &Arc<Mutex<Lab>>, fault: Fault, heal: bool) -> Injected {
    let mut lab = lab.lock().unwrap();
    let k = fault.shard().unwrap_or(0);
    let whose = if lab.shard_count() > 1 {
        format!("shard {k}'s")
    } else {
        "the ledger's".to_string()
    };
    let newest = NewestCommit::of(&lab, k);
    let started = Instant::now();
    let out = PRIMARY_OUT.as_secs();
    let (done, watch) = match fault {
        Fault::PrimaryLost(_) => {
            let done = lab.lose_primary_of(k).map(|addr| {
                (addr, format!(
                    "lost {whose} primary {addr} with its disk (every process of its host SIGKILLed, its data directory removed)"
                ))
            });
            // Its processes are gone when this returns: a batch that began later did
            // not commit there.
            let fault_ms = unix_ms();
            (done, newest.watch_from(fault_ms, fault_ms))
        }
        Fault::PrimaryFreeze(_) | Fault::PrimaryIsolate(_) => {
            // The lab's call blocks for the whole freeze or cut, so the watch starts
            // before it, and the fault lands a moment after (the monitor is asked which
            // node is primary first): a batch begun in its first LANDING is not counted.
            // No failover is that fast (the monitor's detection and demote timeout alone
            // take 5 s), and a batch sent again is stamped anew.
            let fault_ms = unix_ms();
            let watch = newest.watch_from(fault_ms, fault_ms + LANDING.as_millis() as u64);
            let done = if matches!(fault, Fault::PrimaryFreeze(_)) {
                lab.freeze_primary_of(k, PRIMARY_OUT).map(|addr| {
                    (addr, format!(
                        "froze {whose} primary {addr} for {out} s (every process of its host SIGSTOPped, then SIGCONTed)"
                    ))
                })
            } else {
                lab.isolate_primary_of(k, PRIMARY_OUT).map(|addr| {
                    (
                        addr,
                        format!("cut {whose} primary {addr} off from every other host for {out} s"),
                    )
                })
            };
            (done, watch)
        }
        _ => unreachable!("not a fault to the primary"),
    };
    match done {
        Ok((old, what)) => finish(&mut lab, k, old, what, watch, started, heal),
        // Nothing was done: the watch, left to itself, ends at the next commit it sees.
        Err(e) => format!("no fault done to the primary: {e:#}").into(),
    }
}

/// `fault` (`shard-freeze:K` or `shard-isolate:K`) done to shard K's one PostgreSQL now,
/// and let go after [`PRIMARY_OUT`]: when that shard committed again.
pub(crate) fn inject_shard(lab: &Arc<Mutex<Lab>>, fault: Fault) -> Injected {
    let k = fault.shard().expect("a shard's fault");
    let lab = lab.lock().unwrap();
    let newest = NewestCommit::of_shard(&lab, k);
    let out = PRIMARY_OUT.as_secs();
    // As for the primary's freeze: the lab's call blocks for the whole of it, so the
    // watch starts first, and a batch begun in the fault's first LANDING is not counted.
    let fault_ms = unix_ms();
    let watch = newest.watch_from(fault_ms, fault_ms + LANDING.as_millis() as u64);
    let done = match fault {
        Fault::ShardFreeze(_) => lab.freeze_shard(k, PRIMARY_OUT).map(|addr| {
            format!("froze shard {k}'s PostgreSQL {addr} for {out} s (every process of its host SIGSTOPped, then SIGCONTed)")
        }),
        _ => lab.isolate_shard(k, PRIMARY_OUT).map(|addr| {
            format!("cut shard {k}'s PostgreSQL {addr} off from every other host for {out} s")
        }),
    };
    let mut what = match done {
        Ok(what) => what,
        Err(e) => return format!("no fault done to shard {k}: {e:#}").into(),
    };
    let first_commit_ms = watch.join().ok().flatten();
    match first_commit_ms {
        Some(ms) => what.push_str(&format!(
            "; shard {k} committed again {:.1} s after the fault",
            ms as f64 / 1000.0
        )),
        None => what.push_str(&format!(
            "; no commit on shard {k} after the fault within {} s",
            HEAL_TIMEOUT.as_secs()
        )),
    }
    Injected {
        what,
        first_commit_ms,
    }
}

/// After fault `what` to the primary `old`: when the ledger committed again, the new
/// primary, and with `heal` the old node back as its synchronous standby.
fn finish(
    lab: &mut Lab,
    k: usize,
    old: std::net::Ipv4Addr,
    mut what: String,
    watch: std::thread::JoinHandle<Option<u64>>,
    started: Instant,
    heal: bool,
) -> Injected {
    let first_commit_ms = watch.join().ok().flatten();
    match first_commit_ms {
        Some(ms) => what.push_str(&format!(
            "; {} committed again {:.1} s after the fault",
            if k == 0 {
                "the ledger".to_string()
            } else {
                format!("shard {k}")
            },
            ms as f64 / 1000.0
        )),
        None => what.push_str(&format!(
            "; no commit after the fault within {} s",
            HEAL_TIMEOUT.as_secs()
        )),
    }
    match lab.wait_new_primary_of(k, old, HEAL_TIMEOUT) {
        Ok(new) => what.push_str(&format!("; {new} is the primary")),
        Err(e) => {
            what.push_str(&format!("; no new primary: {e:#}"));
            return Injected {
                what,
                first_commit_ms,
            };
        }
    }
    if heal {
        match lab.rejoin_standby_of(k, old, HEAL_TIMEOUT) {
            Ok(()) => what.push_str(&format!(
                "; {old} was its synchronous standby {:.1} s after the fault",
                started.elapsed().as_secs_f64()
            )),
            Err(e) => what.push_str(&format!("; {old} not a standby again: {e:#}")),
        }
    }
    Injected {
        what,
        first_commit_ms,
    }
}

/// How to read the ledger's newest event on each data node, without the lab. Each node
/// is asked on its own and at once: through the multi-host URL, a frozen first host
/// would hold every reading for its connect timeout. What a node shows is committed
/// (a standby shows only what the primary's synchronous commit waited for).
#[derive(Clone)]
struct NewestCommit {
    psql: std::path::PathBuf,
    urls: Vec<String>,
    password: String,
    ca: std::path::PathBuf,
}

impl NewestCommit {
    /// Shard `k`'s data nodes.
    fn of(lab: &Lab, k: usize) -> NewestCommit {
        let nodes = lab.formation_addrs(k);
        NewestCommit {
            psql: hongbao_lab::postgres::bin_dir()
                .map(|d| d.join("psql"))
                .unwrap_or_else(|_| "psql".into()),
            urls: nodes
                .into_iter()
                .map(|addr| format!("{}?sslmode=verify-full", hongbao_lab::postgres::url(addr)))
                .collect(),
            password: lab.secrets.postgres.clone(),
            ca: lab.tls_dir().join("ca.pem"),
        }
    }

    /// Shard `k`'s one PostgreSQL (a shard without a standby).
    fn of_shard(lab: &Lab, k: usize) -> NewestCommit {
        NewestCommit {
            urls: lab
                .shard_addr(k)
                .map(|addr| {
                    let url = hongbao_lab::postgres::url(addr);
                    vec![format!("{url}?sslmode=verify-full")]
                })
                .unwrap_or_default(),
            ..NewestCommit::of(lab, k)
        }
    }

    /// The gateway timestamp of the newest event node `url` shows, if it answers.
    fn newest_ms(&self, url: &str) -> Option<u64> {
        let out = std::process::Command::new(&self.psql)
            .env("PGPASSWORD", &self.password)
            .env("PGSSLROOTCERT", &self.ca)
            .env("PGCONNECT_TIMEOUT", "2")
            .args(["-X", "-At", "-d", url, "-c"])
            .arg("SELECT coalesce((SELECT at_ms FROM hb_events ORDER BY seq DESC LIMIT 1), 0)")
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    /// On a thread: milliseconds from `fault_ms` until an event of a batch begun after
    /// `after_ms` is seen committed on any node, or `None` past [`HEAL_TIMEOUT`]. Each
    /// node is watched by a thread of its own (one that does not answer holds up only
    /// its own), every 100 ms: seen within a poll and a psql connection of its commit.
    fn watch_from(self, fault_ms: u64, after_ms: u64) -> std::thread::JoinHandle<Option<u64>> {
        std::thread::spawn(move || {
            let (seen, first) = std::sync::mpsc::channel();
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let deadline = Instant::now() + HEAL_TIMEOUT;
            for url in self.urls.clone() {
                let (me, seen, done) = (self.clone(), seen.clone(), done.clone());
                std::thread::spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::SeqCst)
                        && Instant::now() < deadline
                    {
                        if me.newest_ms(&url).is_some_and(|at| at > after_ms) {
                            let _ = seen.send(unix_ms().saturating_sub(fault_ms));
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                });
            }
            drop(seen);
            let first = first.recv_timeout(HEAL_TIMEOUT).ok();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            first
        })
    }
}
