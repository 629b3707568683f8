//! What is done to a lab's hosts on purpose (`hongbao bench --fault`, `--chaos`, the
//! cluster tests): a gateway host killed or cut off from Redis or PostgreSQL for a while,
//! a Redis master found — the first listed, or the one serving a key — killed, started
//! again (rejoining as a replica) or frozen, and PostgreSQL restarted. Methods of `Lab`,
//! apart from its bringing up. The faults of a ledger with a standby are in `failover`.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::{children_of, disk, redis, Error, Host, Lab, Result, GRACE};

impl Lab {
    /// SIGKILLs gateway `i`'s processes: the supervisor, and its workers with it (they
    /// are its children; a worker whose supervisor is gone exits on its own).
    pub fn kill_gateway(&mut self, i: usize) {
        if let Some(mut proc) = self.gateways[i].proc.take() {
            let children = children_of(proc.pid());
            proc.kill();
            for pid in children {
                // SAFETY: kill(2) on ids read a moment ago as the gateway's children.
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
            }
        }
    }

    /// The Redis nodes not killed.
    pub(crate) fn live_redis(&self) -> Vec<Ipv4Addr> {
        self.redis
            .iter()
            .filter(|(_, p)| p.is_some())
            .map(|(h, _)| h.addr)
            .collect()
    }

    /// The address of a Redis master (as the cluster sees it now).
    pub fn redis_master(&self) -> Result<Ipv4Addr> {
        let (first, _) = &self.redis[0];
        let live = self.live_redis();
        let witness = live.first().copied().unwrap_or(first.addr);
        redis::nodes(&self.redis_auth(), witness)?
            .into_iter()
            .find(|n| n.master && !n.failed && live.contains(&n.addr))
            .map(|n| n.addr)
            .ok_or_else(|| Error::Refused("no live Redis master".into()))
    }

    /// Every live master forgets everything it holds (`FLUSHALL`): what a Redis Cluster
    /// restarted without persistence, or a master lost with its replica, comes to. Its
    /// replicas follow. Returns the masters wiped.
    pub fn wipe_redis(&self) -> Result<Vec<Ipv4Addr>> {
        let masters = self.live_masters()?;
        for &addr in &masters {
            redis::cli(&self.redis_auth(), addr, &["FLUSHALL"])?;
        }
        Ok(masters)
    }

    /// The addresses of the Redis masters that are live now, as the cluster sees it.
    pub(crate) fn live_masters(&self) -> Result<Vec<Ipv4Addr>> {
        let live = self.live_redis();
        let witness = *live
            .first()
            .ok_or_else(|| Error::Refused("no live Redis node".into()))?;
        Ok(redis::nodes(&self.redis_auth(), witness)?
            .into_iter()
            .filter(|n| n.master && !n.failed && live.contains(&n.addr))
            .map(|n| n.addr)
            .collect())
    }

    /// The address of the live Redis master that serves `key`'s slot now (for faults
    /// aimed at what a key holds: `{rel}`, the release of campaign packets).
    pub fn redis_master_of(&self, key: &str) -> Result<Ipv4Addr> {
        let (first, _) = &self.redis[0];
        let live = self.live_redis();
        let witness = live.first().copied().unwrap_or(first.addr);
        let slot: u16 = redis::cli(&self.redis_auth(), witness, &["CLUSTER", "KEYSLOT", key])?
            .trim()
            .parse()
            .map_err(|e| Error::Answer(format!("the slot of {key:?}: {e}")))?;
        redis::nodes(&self.redis_auth(), witness)?
            .into_iter()
            .find(|n| {
                n.master && !n.failed && live.contains(&n.addr) && redis::serves(&n.slots, slot)
            })
            .map(|n| n.addr)
            .ok_or_else(|| {
                Error::Refused(format!("no live Redis master serves {key:?} (slot {slot})"))
            })
    }

    /// SIGKILLs the Redis node at `addr`.
    pub fn kill_redis(&mut self, addr: Ipv4Addr) {
        for (host, proc) in &mut self.redis {
            if host.addr == addr {
                if let Some(mut p) = proc.take() {
                    p.kill();
                }
            }
        }
    }

    /// Starts the killed Redis node at `addr` again; it rejoins the cluster as a replica.
    /// Waits until every node is connected, the cluster is whole and the node has synced
    /// its master's data (until then it is no replica to fail over to).
    pub fn restart_redis(&mut self, addr: Ipv4Addr, timeout: Duration) -> Result<()> {
        let dir = self.plan.dir.clone();
        let auth = self.redis_auth();
        let (i, (host, proc)) = self
            .redis
            .iter_mut()
            .enumerate()
            .find(|(_, (h, _))| h.addr == addr)
            .ok_or_else(|| Error::Refused(format!("no Redis node at {addr}")))?;
        if proc.is_none() {
            *proc = Some(redis::start_node_again(
                host,
                &dir.join(format!("redis{}", i + 1)),
                &auth,
            )?);
            self.save()?;
        }
        let addrs: Vec<Ipv4Addr> = self.redis.iter().map(|(h, _)| h.addr).collect();
        redis::wait_whole(&self.redis_auth(), &addrs, None, timeout)?;
        let total = addrs.len();
        redis::wait_until("every Redis node to be connected", timeout, || {
            redis::nodes(&self.redis_auth(), addr)
                .is_ok_and(|ns| ns.len() == total && ns.iter().all(|n| !n.failed))
        })?;
        self.wait_synced(addr, timeout)
    }

    /// Waits until the Redis replica at `addr` has synced its master's data: until then
    /// it is no replica to fail over to (promoted, it would serve its slots empty).
    pub fn wait_synced(&self, addr: Ipv4Addr, timeout: Duration) -> Result<()> {
        redis::wait_until("the node to sync from its master", timeout, || {
            redis::cli(&self.redis_auth(), addr, &["INFO", "replication"]).is_ok_and(|info| {
                info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
            })
        })
    }

    /// Freezes the Redis node at `addr` (SIGSTOP) for `frozen`, then lets it go on
    /// (SIGCONT): its connections stay open and silent, as a hung machine's would. Longer
    /// than the node timeout, its replica takes over and it comes back as a replica.
    pub fn freeze_redis(&mut self, addr: Ipv4Addr, frozen: Duration) {
        let pid = self
            .redis
            .iter()
            .find(|(h, p)| h.addr == addr && p.is_some())
            .and_then(|(_, p)| p.as_ref().map(|p| p.pid() as i32));
        let Some(pid) = pid else { return };
        // SAFETY: kill(2) on our running child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(frozen);
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }

    /// Waits until the Redis Cluster serves every slot again with three masters none of
    /// which is `gone` (a master killed: its replica has taken over).
    pub fn wait_redis_whole(&self, gone: Option<Ipv4Addr>, timeout: Duration) -> Result<()> {
        let live = self.live_redis();
        redis::wait_whole(&self.redis_auth(), &live, gone, timeout)
    }

    /// Stops PostgreSQL (fast shutdown: SIGINT aborts open transactions, as a crash
    /// would, but cleanly) and starts it again after `down`.
    /// With a standby there is no one PostgreSQL to restart: refused (`lose_primary`,
    /// `freeze_primary`).
    pub fn restart_postgres(&mut self, down: Duration) -> Result<()> {
        if self.formation.is_some() {
            return Err(Error::Refused(
                "the lab's ledger is a primary with a standby: lose or freeze the primary instead of restarting PostgreSQL".into(),
            ));
        }
        if let Some(mut proc) = self.postgres.1.take() {
            // SAFETY: kill(2) on our running child.
            unsafe {
                libc::kill(proc.pid() as i32, libc::SIGINT);
            }
            proc.stop(GRACE);
        }
        std::thread::sleep(down);
        self.postgres.1 = Some(self.start_postgres()?);
        self.save()
    }

    /// Fills PostgreSQL's disk (the plan's `postgres_disk` tmpfs) until ENOSPC, holds it
    /// full for `hold`, and gives the room back; PostgreSQL is started again if it
    /// stopped meanwhile (a WAL segment it could not write is a PANIC). Returns what it
    /// did.
    pub fn fill_postgres_disk(&mut self, hold: Duration) -> Result<String> {
        if self.postgres_disk.is_none() {
            return Err(Error::Refused(
                "PostgreSQL's data is not on a disk of its own (the lab plan's postgres_disk)"
                    .into(),
            ));
        }
        let filled = disk::fill(&self.postgres_dir, hold)?;
        let mut did = format!(
            "filled PostgreSQL's tmpfs with {:.1} MiB until ENOSPC, held it full for {} s, deleted the filler",
            filled.bytes as f64 / f64::from(1 << 20),
            hold.as_secs()
        );
        if !self.postgres.1.as_mut().is_some_and(|p| p.running()) {
            drop(self.postgres.1.take());
            self.postgres.1 = Some(self.start_postgres()?);
            self.save()?;
            did.push_str("; PostgreSQL had stopped and was started again");
        }
        Ok(did)
    }

    /// Cuts gateway host `i` off from `to` (every Redis node, or PostgreSQL: both data
    /// nodes when the ledger has a standby) for
    /// `cut`: a blackhole route to each of their addresses inside the gateway's own
    /// namespace, so its packets to them vanish as across a broken link (no error, no
    /// reset: the connections hang until the route is gone). Nothing outside the lab's
    /// namespaces is touched. The routes are taken away again even if adding one failed.
    pub fn partition(&self, i: usize, to: Cut, cut: Duration) -> Result<()> {
        let addrs: Vec<Ipv4Addr> = match to {
            Cut::Redis => self.redis.iter().map(|(h, _)| h.addr).collect(),
            // With a standby: both data nodes, whichever is primary.
            Cut::Postgres => match &self.formation {
                Some(formation) => formation.addrs(),
                None => vec![self.postgres.0.addr],
            },
        };
        blackhole(&self.gateways[i].host, &addrs, cut)
    }
}

/// Cuts `host` off from `addrs` for `cut`: a blackhole route to each inside the host's
/// own namespace, taken away again even if adding one failed.
pub(crate) fn blackhole(host: &Host, addrs: &[Ipv4Addr], cut: Duration) -> Result<()> {
    let route = |verb: &str, addr: Ipv4Addr| -> Result<()> {
        let status = host
            .command("ip")
            .args(["route", verb, "blackhole", &format!("{addr}/32")])
            .status()
            .map_err(|e| Error::io("running ip route", e))?;
        if !status.success() {
            return Err(Error::Failed(format!(
                "ip route {verb} blackhole {addr} in {}",
                host.netns
            )));
        }
        Ok(())
    };
    let added: Result<()> = addrs.iter().try_for_each(|&a| route("add", a));
    if added.is_ok() {
        std::thread::sleep(cut);
    }
    for &a in addrs {
        let _ = route("del", a);
    }
    added
}

/// What a partition cuts a gateway host off from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    Redis,
    Postgres,
}
