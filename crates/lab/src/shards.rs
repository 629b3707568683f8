//! The ledger's other shards (`lab up --shards N`, docs/scale-out.md "Shards"): shard 0
//! is the lab's PostgreSQL — or its formation, with a standby —, and shards 1 to N-1 are
//! one PostgreSQL each, at .24 onward, made like shard 0's plain server (TLS, the
//! gateways' role and password); with a standby, each a formation of its own too (a
//! primary, its synchronous standby and their monitor: three hosts a shard, from .24). A fault aimed at one shard leaves the others carrying
//! on: shard 0's primary lost, frozen or cut off (`failover`), or any shard's one
//! PostgreSQL frozen or cut off (`freeze_shard`, `isolate_shard`).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::netns::{self, Host};
use crate::postgres;
use crate::proc::Proc;
use crate::standby::Formation;
use crate::Lab;

/// The last address byte of shard 1's host; shard k's is this + k - 1.
const FIRST_LAST: u8 = 24;
/// The most shards a lab holds: their hosts end before the gateways' (.31).
pub const MOST: usize = 8;
/// The most with a standby, each shard after the first three hosts.
pub const MOST_WITH_STANDBY: usize = 3;

/// A shard after the first: its host (with a standby, its first data node's), its
/// server or its formation, its data.
pub struct Shard {
    pub host: Host,
    pub proc: Option<Proc>,
    pub formation: Option<Formation>,
    pub dir: PathBuf,
}

/// The last address bytes of shard `k`'s hosts: its PostgreSQL, or with a standby its
/// two data nodes and its monitor.
fn lasts(k: usize, standby: bool) -> Vec<u8> {
    if standby {
        let base = FIRST_LAST + 3 * (k as u8 - 1);
        vec![base, base + 1, base + 2]
    } else {
        vec![FIRST_LAST + k as u8 - 1]
    }
}

/// The addresses of shards 1.. of lab `lab` with `shards` in all (for the engines'
/// certificate).
pub(crate) fn extra_addrs(lab: u8, shards: usize, standby: bool) -> Vec<Ipv4Addr> {
    (1..shards.max(1))
        .flat_map(|k| lasts(k, standby))
        .map(|last| Ipv4Addr::new(198, 18, lab, last))
        .collect()
}

impl Lab {
    /// Shards 1.. of the plan, each started and its role made.
    pub(crate) fn bring_up_shards(&mut self) -> Result<()> {
        if self.plan.shards > MOST {
            return Err(Error::Refused(format!(
                "a lab holds at most {MOST} shards, not {}",
                self.plan.shards
            )));
        }
        if self.plan.standby && self.plan.shards > MOST_WITH_STANDBY {
            return Err(Error::Refused(format!(
                "a lab with a standby holds at most {MOST_WITH_STANDBY} shards (each a \
                 formation of three hosts), not {}",
                self.plan.shards
            )));
        }
        if self.plan.standby {
            return self.bring_up_shard_formations();
        }
        for k in 1..self.plan.shards.max(1) {
            let host = self.host(&format!("pgs{k}"), FIRST_LAST + k as u8 - 1, &[])?;
            let dir = PathBuf::from(format!("{}-shard{k}", self.postgres_dir.display()));
            let _ = std::fs::remove_dir_all(&dir);
            self.state.shard_dirs.push(dir.clone());
            self.save()?;
            postgres::init(&dir, netns::bridge_addr(self.plan.lab), &self.tls_dir())?;
            let proc = postgres::start(&host, &dir, false)?;
            self.shards.push(Shard {
                host,
                proc: Some(proc),
                formation: None,
                dir: dir.clone(),
            });
            self.save()?;
            postgres::make_role(&dir, &self.secrets.postgres)
                .map_err(|e| e.within(format!("shard {k}")))?;
        }
        Ok(())
    }

    /// Every formation of the ledger (with a standby): shard 0's, then the other shards'.
    pub(crate) fn formations(&self) -> impl Iterator<Item = &Formation> {
        self.formation
            .iter()
            .chain(self.shards.iter().filter_map(|s| s.formation.as_ref()))
    }

    pub(crate) fn formations_mut(&mut self) -> impl Iterator<Item = &mut Formation> {
        self.formation
            .iter_mut()
            .chain(self.shards.iter_mut().filter_map(|s| s.formation.as_mut()))
    }

    /// Shards 1.. each a formation: its monitor, its primary, its synchronous standby.
    fn bring_up_shard_formations(&mut self) -> Result<()> {
        for k in 1..self.plan.shards.max(1) {
            let hosts: Vec<Host> = ["", "b", "m"]
                .into_iter()
                .zip(lasts(k, true))
                .map(|(end, last)| self.host(&format!("pgs{k}{end}"), last, &[]))
                .collect::<Result<_>>()?;
            let dir = PathBuf::from(format!("{}-shard{k}", self.postgres_dir.display()));
            let _ = std::fs::remove_dir_all(&dir);
            self.state.shard_dirs.push(dir.clone());
            self.save()?;
            let [first, second, monitor]: [Host; 3] = hosts
                .try_into()
                .map_err(|_| Error::Failed("three hosts".into()))?;
            let mut formation = Formation::new(
                &dir,
                &self.tls_dir(),
                &self.plan.dir,
                monitor,
                [first.clone(), second],
            )?;
            formation
                .bring_up(&self.secrets.postgres)
                .map_err(|e| e.within(format!("shard {k}")))?;
            self.shards.push(Shard {
                host: first,
                proc: None,
                formation: Some(formation),
                dir,
            });
            self.save()?;
        }
        Ok(())
    }

    /// Shard `k`'s URL as the gateways' role (shard 0's is `postgres_url`): with a
    /// standby, both data nodes' (a client keeps the one that takes writes).
    pub fn shard_url(&self, k: usize) -> String {
        match k {
            0 => self.postgres_url(),
            k => match &self.shards[k - 1].formation {
                Some(f) => format!(
                    "{}&sslmode=verify-full",
                    postgres::multi_host_url(&f.addrs())
                ),
                None => postgres::node_url(self.shards[k - 1].host.addr),
            },
        }
    }

    /// Every shard's URL, shard 0 first, as `--postgres` takes them (`;` between).
    pub fn ledger_urls(&self) -> String {
        (0..=self.shards.len())
            .map(|k| self.shard_url(k))
            .collect::<Vec<_>>()
            .join(";")
    }

    /// `psql` on shard `k` as the gateways' role.
    pub fn psql_shard(&self, k: usize, sql: &str) -> Result<String> {
        self.psql_url(&self.shard_url(k), sql)
    }

    /// Every credit relayed between shards so far: how long each took from its win's or
    /// open's batch to its wallet's shard (`hb_outbox`'s `moved_ms - made_ms`), in ms, with
    /// the credits still waiting. Empty with one shard.
    pub fn outbox_lags(&self) -> Result<(Vec<u64>, u64)> {
        let (mut lags, mut waiting) = (Vec::new(), 0);
        if self.shard_count() < 2 {
            return Ok((lags, waiting));
        }
        for k in 0..self.shard_count() {
            let text =
                self.psql_shard(k, "SELECT coalesce(moved_ms - made_ms, -1) FROM hb_outbox")?;
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                match line.parse::<i64>() {
                    Ok(-1) => waiting += 1,
                    Ok(ms) => lags.push(ms.max(0) as u64),
                    Err(_) => {
                        return Err(Error::Answer(format!(
                            "psql: unexpected outbox row {line:?}"
                        )))
                    }
                }
            }
        }
        lags.sort_unstable();
        Ok((lags, waiting))
    }

    /// Shard `k`'s shake wins by the second their batch was formed in (Unix seconds): a
    /// committer forms its next batch once the last has committed, so a shard whose
    /// commits stall shows a gap here.
    pub fn wins_by_second(&self, k: usize) -> Result<std::collections::BTreeMap<u64, u64>> {
        let text = self.psql_shard(
            k,
            "SELECT at_ms / 1000, count(*) FROM hb_events WHERE body->>'kind' = 'shake_won' \
             GROUP BY 1 ORDER BY 1",
        )?;
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|line| {
                let mut f = line.split('|').map(|f| f.trim().parse::<u64>());
                match (f.next(), f.next()) {
                    (Some(Ok(second)), Some(Ok(n))) => Ok((second, n)),
                    _ => Err(Error::Answer(format!("psql: unexpected wins row {line:?}"))),
                }
            })
            .collect()
    }

    /// The host of shard `k`'s one PostgreSQL. Shard 0 with a standby is a formation,
    /// whose faults are the primary's (`lose_primary`, `freeze_primary`,
    /// `isolate_primary`).
    fn shard_host(&self, k: usize) -> Result<Host> {
        match k {
            k if self.formation_of(k).is_ok() => Err(Error::Refused(format!(
                "shard {k} is a primary with its standby: its faults are the primary's \
                 (primary-lost, primary-freeze, primary-isolate)"
            ))),
            0 => Ok(self.postgres.0.clone()),
            k => self
                .shards
                .get(k - 1)
                .map(|s| s.host.clone())
                .ok_or_else(|| {
                    Error::Refused(format!(
                        "no shard {k}: the ledger has {} shards",
                        self.shard_count()
                    ))
                }),
        }
    }

    /// The address of shard `k`'s one PostgreSQL (refused for a formation).
    pub fn shard_addr(&self, k: usize) -> Result<Ipv4Addr> {
        self.shard_host(k).map(|h| h.addr)
    }

    /// Every process of shard `k`'s PostgreSQL host stopped (SIGSTOP) for `frozen`, then
    /// let go on. Returns its address.
    pub fn freeze_shard(&self, k: usize, frozen: std::time::Duration) -> Result<Ipv4Addr> {
        let host = self.shard_host(k)?;
        crate::failover::freeze_host(&host, frozen);
        Ok(host.addr)
    }

    /// Shard `k`'s PostgreSQL host cut off from every other lab host for `cut`.
    /// Returns its address.
    pub fn isolate_shard(&self, k: usize, cut: std::time::Duration) -> Result<Ipv4Addr> {
        let host = self.shard_host(k)?;
        self.isolate_host(&host, cut)?;
        Ok(host.addr)
    }

    /// How many shards the ledger has.
    pub fn shard_count(&self) -> usize {
        self.shards.len() + 1
    }
}
