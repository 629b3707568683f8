//! What the lab's engines have done: Redis commands by name over the masters and
//! PostgreSQL's transactions and rows, read before and after a run for its costs per
//! operation (`hongbao bench --hosts`, summary.json's `engines`).

use serde::{Deserialize, Serialize};

use crate::{redis, Error, Lab, Result};

/// What the engines have done so far, summed over the lab: Redis commands by name (over
/// the masters, scripts' inner commands included, as `INFO commandstats` counts them) and PostgreSQL's transactions and rows (`pg_stat_database`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCounters {
    pub redis_calls: std::collections::BTreeMap<String, u64>,
    pub pg_commits: u64,
    pub pg_rows_inserted: u64,
    pub pg_rows_updated: u64,
    /// The CPU time of the engines' processes (every PostgreSQL server of every shard,
    /// with its backends, and the keepers of a formation; every Redis node), in ms: a
    /// process killed by a fault takes its own with it.
    #[serde(default)]
    pub cpu_ms: u64,
}

impl EngineCounters {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &EngineCounters) -> EngineCounters {
        EngineCounters {
            redis_calls: self
                .redis_calls
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.saturating_sub(*earlier.redis_calls.get(k).unwrap_or(&0)),
                    )
                })
                .filter(|(_, v)| *v > 0)
                .collect(),
            pg_commits: self.pg_commits.saturating_sub(earlier.pg_commits),
            pg_rows_inserted: self
                .pg_rows_inserted
                .saturating_sub(earlier.pg_rows_inserted),
            pg_rows_updated: self.pg_rows_updated.saturating_sub(earlier.pg_rows_updated),
            cpu_ms: self.cpu_ms.saturating_sub(earlier.cpu_ms),
        }
    }
}

/// The CPU time of process `pid` and everything under it, in ms: its own, its children's
/// that it waited for (`cutime`, `cstime`), and its live children's, each the same way.
fn tree_cpu_ms(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command's closing parenthesis: utime is the 14th field of the
    // line, the 12th after it (state is the 1st).
    let times: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(4)
                .filter_map(|f| f.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    times * 1000 / ticks
        + crate::children_of(pid)
            .into_iter()
            .map(tree_cpu_ms)
            .sum::<u64>()
}

/// `cmdstat_get:calls=5,usec=…` lines of `INFO commandstats`: (command, calls).
pub fn parse_commandstats(info: &str) -> Vec<(String, u64)> {
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .collect()
}

impl Lab {
    /// The engines' counters now (see [`EngineCounters`]).
    pub fn engine_counters(&self) -> Result<EngineCounters> {
        let mut counters = EngineCounters::default();
        // Masters only: a replica counts again every write it is sent.
        let masters = self.live_masters()?;
        for (host, _) in &self.redis {
            if !masters.contains(&host.addr) {
                continue;
            }
            for (name, calls) in parse_commandstats(&redis::cli(
                &self.redis_auth(),
                host.addr,
                &["INFO", "commandstats"],
            )?) {
                *counters.redis_calls.entry(name).or_insert(0) += calls;
            }
        }
        let engines = self
            .postgres
            .1
            .iter()
            .chain(self.shards.iter().filter_map(|s| s.proc.as_ref()))
            .chain(self.formations().flat_map(|f| f.keepers()))
            .chain(self.redis.iter().filter_map(|(_, p)| p.as_ref()));
        counters.cpu_ms = engines.map(|p| tree_cpu_ms(p.pid())).sum();
        // Every shard's database: the ledger's costs are theirs together.
        for k in 0..self.shard_count() {
            let text = self.psql_shard(
                k,
                "SELECT xact_commit, tup_inserted, tup_updated FROM pg_stat_database WHERE datname = current_database()",
            )?;
            let fields: Vec<u64> = text
                .trim()
                .split('|')
                .filter_map(|f| f.parse().ok())
                .collect();
            if fields.len() != 3 {
                return Err(Error::Answer(format!(
                    "psql: unexpected pg_stat_database row {text:?}"
                )));
            }
            counters.pg_commits += fields[0];
            counters.pg_rows_inserted += fields[1];
            counters.pg_rows_updated += fields[2];
        }
        Ok(counters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_give_calls_by_command() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\ncmdstat_get:calls=3,usec=2\r\nnoise\r\n";
        assert_eq!(
            parse_commandstats(info),
            vec![("evalsha".to_string(), 120), ("get".to_string(), 3)]
        );
        let a = EngineCounters {
            redis_calls: [("get".to_string(), 3)].into(),
            pg_commits: 10,
            ..Default::default()
        };
        let b = EngineCounters {
            redis_calls: [("get".to_string(), 5), ("set".to_string(), 1)].into(),
            pg_commits: 15,
            ..Default::default()
        };
        let d = b.since(&a);
        assert_eq!(d.redis_calls.get("get"), Some(&2));
        assert_eq!(d.pg_commits, 5);
    }
}
