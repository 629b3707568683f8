//! Faults done to the bench's server: what each fault does, and, for the chaos schedule
//! (`chaos`), how it is healed before the next — a killed gateway host or Redis node
//! started again, a killed worker replaced (by the supervisor), a killed supervisor
//! started again over its ledger, a full disk given its room back — so that faults one
//! after another each meet a whole system. The faults of one local server heal whether
//! or not they are asked to: the bench cannot go on without them healed.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::admin::{admin_request, stats};
use super::disk;
pub use super::injected::Injected;
use super::local::Local;
use super::options::{Fault, RedisAim, DISK_FULL_HOLD, WORKER_STALL};
use super::primary;
use super::rolling::{self, RolledGateway};

/// How long a killed gateway host stays down before chaos starts it again.
const GATEWAY_DOWN: Duration = Duration::from_secs(5);
/// How long a heal may take before the fault is written down as not healed.
const HEAL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long an upgrade may take, from the new binary's start to the old one's exit: its
/// drain window (twice the connections over the rate admitted: a million over TLS at
/// 1,000 a second on 2 cores, 2,000 s) and more.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(2_400);

/// What can do faults to the server: its lab (with `--hosts`), the local server's child
/// (without), and its admin API (the workers' ids). Cheap to clone, for a thread of its
/// own.
#[derive(Clone)]
pub(crate) struct Injector {
    pub(super) lab: Option<Arc<Mutex<hongbao_lab::Lab>>>,
    pub(super) local: Option<Arc<Local>>,
    pub(super) admin: String,
    /// The server's admin key.
    pub(super) key: String,
    /// A lab's rolling upgrade: the binary it starts, and where its steps are kept.
    pub(super) upgrade_to: std::path::PathBuf,
    pub(super) rolled: Arc<Mutex<Vec<RolledGateway>>>,
}

impl Injector {
    /// Does `fault` now and says what was done. `target` picks the worker or gateway
    /// host (modulo their number); with `heal`, what the fault took down is brought back
    /// before this returns.
    pub fn inject(&self, fault: Fault, target: usize, heal: bool) -> Injected {
        if fault.needs_standby() || fault.shard().is_some() {
            return match &self.lab {
                Some(lab) if fault.needs_standby() => primary::inject(lab, fault, heal),
                Some(lab) => primary::inject_shard(lab, fault),
                None => format!("{}: needs --hosts", fault.name()).into(),
            };
        }
        let what = match fault {
            Fault::WorkerStall => self.stall_worker(target),
            Fault::WorkerKill => self.kill_worker(target),
            Fault::SupervisorKill => match &self.local {
                Some(local) => local.kill_and_restart(HEAL_TIMEOUT),
                None => "supervisor-kill: one local server only (no --hosts)".to_string(),
            },
            Fault::Upgrade => match (&self.local, &self.lab) {
                (Some(local), _) => local.upgrade(UPGRADE_TIMEOUT),
                (None, Some(lab)) => {
                    let (what, steps) = rolling::roll(lab, &self.upgrade_to, &self.key);
                    *self.rolled.lock().unwrap() = steps;
                    what
                }
                (None, None) => "upgrade: no server of the bench's own to upgrade".to_string(),
            },
            Fault::DiskFull => match &self.local {
                Some(local) => self.fill_disk(&local.data_dir),
                None => "disk-full: one local server only (no --hosts)".to_string(),
            },
            _ => match &self.lab {
                Some(lab) => in_lab(&mut lab.lock().unwrap(), fault, target, heal),
                None => format!("{}: needs --hosts", fault.name()),
            },
        };
        what.into()
    }

    /// The ids of the server's workers (`/v1/stats`), in their order.
    fn worker_pids(&self) -> Vec<u64> {
        stats(&self.admin, &self.key)
            .map(|s| s.workers.iter().map(|w| u64::from(w.pid)).collect())
            .unwrap_or_default()
    }

    /// A gateway worker stopped for [`WORKER_STALL`] (SIGSTOP, then SIGCONT).
    fn stall_worker(&self, target: usize) -> String {
        let pids = self.worker_pids();
        let Some(&pid) = pids.get(target % pids.len().max(1)) else {
            return "no worker to stop: /v1/stats named none".to_string();
        };
        // SAFETY: signals to a process of our own server, by its id.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        std::thread::sleep(WORKER_STALL);
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        format!(
            "stopped gateway worker {pid} for {} ms (SIGSTOP, then SIGCONT)",
            WORKER_STALL.as_millis()
        )
    }

    /// A gateway worker SIGKILLed; healed when the supervisor has started its
    /// replacement (a new id in its place in `/v1/stats`).
    fn kill_worker(&self, target: usize) -> String {
        let pids = self.worker_pids();
        let Some(&pid) = pids.get(target % pids.len().max(1)) else {
            return "no worker to kill: /v1/stats named none".to_string();
        };
        let t = Instant::now();
        // SAFETY: a signal to a process of our own server, by its id.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        while t.elapsed() < HEAL_TIMEOUT {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.worker_pids();
            if now.len() == pids.len() && !now.contains(&pid) {
                return format!(
                    "killed gateway worker {pid} (SIGKILL); its replacement was up after {:.1} s",
                    t.elapsed().as_secs_f64()
                );
            }
        }
        format!("killed gateway worker {pid} (SIGKILL); no replacement in {HEAL_TIMEOUT:?}")
    }

    /// The ledger's tmpfs filled until ENOSPC and held full for [`DISK_FULL_HOLD`], the
    /// filler deleted; healed when the server answers `/v1/stats` again, which it does
    /// only once the ledger has committed everything up to the question.
    fn fill_disk(&self, data_dir: &std::path::Path) -> String {
        let filled = match disk::fill(data_dir, DISK_FULL_HOLD) {
            Ok(filled) => filled,
            Err(e) => return format!("no disk filled: {e:#}"),
        };
        let filled = format!(
            "filled the ledger's tmpfs with {:.1} MiB until ENOSPC, held it full for {} s, deleted the filler",
            filled.bytes as f64 / f64::from(1 << 20),
            DISK_FULL_HOLD.as_secs()
        );
        let t = Instant::now();
        let url = format!("{}/v1/stats", self.admin);
        while t.elapsed() < HEAL_TIMEOUT {
            if admin_request("GET", &url, &self.key)
                .timeout(Duration::from_secs(5))
                .call()
                .is_ok()
            {
                return format!(
                    "{filled}; the ledger committed again {:.1} s later",
                    t.elapsed().as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        format!("{filled}; the ledger did not commit again in {HEAL_TIMEOUT:?}")
    }
}

/// The faults of a lab.
fn in_lab(lab: &mut hongbao_lab::Lab, fault: Fault, target: usize, heal: bool) -> String {
    match fault {
        Fault::Gateway => {
            // Without a target (a single --fault) the last host, as always.
            let i = if heal {
                target % lab.gateways.len()
            } else {
                lab.gateways.len() - 1
            };
            lab.kill_gateway(i);
            let name = lab.gateways[i].host.name.clone();
            if !heal {
                return format!("killed every process of gateway host {name}");
            }
            std::thread::sleep(GATEWAY_DOWN);
            match lab.start_gateway(i) {
                Ok(()) => format!(
                    "killed every process of gateway host {name}; started it again {} s later",
                    GATEWAY_DOWN.as_secs()
                ),
                Err(e) => format!("killed gateway host {name}; starting it again: {e:#}"),
            }
        }
        Fault::RedisMaster(aim) => match aimed_master(lab, aim) {
            Ok(addr) => {
                let t = Instant::now();
                lab.kill_redis(addr);
                let failover = match lab.wait_redis_whole(Some(addr), HEAL_TIMEOUT) {
                    Ok(()) => format!(
                        "killed the Redis master {addr}; the cluster was whole again after {:.1} s",
                        t.elapsed().as_secs_f64()
                    ),
                    Err(e) => return format!("killed the Redis master {addr}; {e:#}"),
                };
                if !heal {
                    return failover;
                }
                match lab.restart_redis(addr, HEAL_TIMEOUT) {
                    Ok(()) => format!(
                        "{failover}; the node rejoined as a replica after {:.1} s",
                        t.elapsed().as_secs_f64()
                    ),
                    Err(e) => format!("{failover}; starting the node again: {e:#}"),
                }
            }
            Err(e) => format!("no Redis master to kill: {e:#}"),
        },
        Fault::RedisFreeze(aim) => match aimed_master(lab, aim) {
            Ok(addr) => {
                lab.freeze_redis(addr, Duration::from_secs(8));
                let t = Instant::now();
                let whole = match lab.wait_redis_whole(Some(addr), HEAL_TIMEOUT) {
                    Ok(()) => format!(
                        "froze the Redis master {addr} for 8 s (SIGSTOP, then SIGCONT); the cluster was whole without it as master {:.1} s after",
                        t.elapsed().as_secs_f64()
                    ),
                    Err(e) => return format!("froze the Redis master {addr} for 8 s; {e:#}"),
                };
                if !heal {
                    return whole;
                }
                // Healed once the old master, now a replica, holds its new master's data.
                match lab.wait_synced(addr, HEAL_TIMEOUT) {
                    Ok(()) => format!(
                        "{whole}; it had synced as a replica {:.1} s after",
                        t.elapsed().as_secs_f64()
                    ),
                    Err(e) => format!("{whole}; {e:#}"),
                }
            }
            Err(e) => format!("no Redis master to freeze: {e:#}"),
        },
        Fault::Partition(to) => {
            // Alone, the last host for 8 s; by chaos, a host and 5-15 s drawn with it.
            let (i, secs) = if heal {
                (target % lab.gateways.len(), 5 + target as u64 % 11)
            } else {
                (lab.gateways.len() - 1, 8)
            };
            let name = lab.gateways[i].host.name.clone();
            let what = match to {
                hongbao_lab::Cut::Redis => "Redis",
                hongbao_lab::Cut::Postgres => "PostgreSQL",
            };
            match lab.partition(i, to, Duration::from_secs(secs)) {
                Ok(()) => format!("cut gateway host {name} off from {what} for {secs} s"),
                Err(e) => format!("cutting gateway host {name} off from {what}: {e:#}"),
            }
        }
        Fault::RedisWipe => match lab.wipe_redis() {
            Ok(masters) => format!(
                "every Redis master ({}) flushed: the cluster forgot everything it held",
                masters.len()
            ),
            Err(e) => format!("flushing Redis: {e:#}"),
        },
        Fault::Postgres => match lab.restart_postgres(Duration::from_secs(2)) {
            Ok(()) => "stopped PostgreSQL and started it again 2 s later".to_string(),
            Err(e) => format!("restarting PostgreSQL: {e:#}"),
        },
        Fault::PostgresDiskFull => match lab.fill_postgres_disk(DISK_FULL_HOLD) {
            Ok(did) => did,
            Err(e) => format!("no PostgreSQL disk filled: {e:#}"),
        },
        Fault::WorkerStall | Fault::WorkerKill | Fault::SupervisorKill | Fault::DiskFull => {
            unreachable!("a local server's fault needs no lab")
        }
        Fault::Upgrade => {
            unreachable!("a lab's upgrade is rolling::roll's")
        }
        Fault::PrimaryLost(_) | Fault::PrimaryFreeze(_) | Fault::PrimaryIsolate(_) => {
            unreachable!("the primary's faults are primary::inject's")
        }
        Fault::ShardFreeze(_) | Fault::ShardIsolate(_) => {
            unreachable!("a shard's faults are primary::inject_shard's")
        }
    }
}

/// The Redis master a fault aims at, as the cluster sees it now.
fn aimed_master(lab: &hongbao_lab::Lab, aim: RedisAim) -> hongbao_lab::Result<Ipv4Addr> {
    match aim.key() {
        Some(key) => lab.redis_master_of(key),
        None => lab.redis_master(),
    }
}
