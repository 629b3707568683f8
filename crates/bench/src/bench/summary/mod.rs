//! `summary.json`: what a bench run measured and what its audit found, as typed structs
//! (docs/bench.md describes every field; a test holds the two together, and the bench
//! tests read every summary back through these types, refusing unknown fields).
//!
//! This file holds the top of the document and its small sections; beside it:
//! - `phase`: each steady phase's figures — medians, latency quantiles, measured
//!   campaign rates — and the checks of the campaigns' counts against the clients';
//! - `audit`: the campaigns' counts, the discrepancies found, and the run's audit;
//! - `fault`: a `--fault`'s cost, read off the load's seconds around it;
//! - `history`: the per-operation history check's result (`../history.rs` does it).

mod audit;
mod fault;
mod history;
mod phase;

use serde::{Deserialize, Serialize};

use hongbao_load::broadcast;
use hongbao_load::report::Counters;

pub use audit::{AuditSummary, Discrepancy, SendAudit, ShakeAudit};
pub use fault::{FaultSecond, FaultSummary, ShardCarried, FAULT_WINDOW_SECS};
/// The history check's tests hold its findings to the summary's limit.
#[cfg(test)]
pub(super) use history::FIRST;
pub use history::{Finding, Findings, HistorySummary, Operation, Payee};
pub use phase::{campaign_done, judge_target_wins, median, LatencyMs, Phase, PhaseSummary};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub preset_connections: u64,
    pub connections: ConnectionsSummary,
    pub phases: Vec<PhaseSummary>,
    pub shake: ShakeAudit,
    pub send: SendAudit,
    pub broadcast: broadcast::Summary,
    pub audit: AuditSummary,
    pub resources: Resources,
    pub load: LoadSummary,
    pub options: OptionsSummary,
    pub network: NetworkSummary,
    /// With `--hosts`: what Redis and PostgreSQL did over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines: Option<EngineSummary>,
    /// With `--fault`: what was done and what the clients saw of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultSummary>,
    /// With `--chaos`: every fault done and what each cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chaos: Option<super::chaos::ChaosSummary>,
    /// Every win and open the clients were told of, against the ledger's, op by op.
    #[serde(default)]
    pub history: HistorySummary,
    /// With `--agents`: each agent, its clock, those lost, strangers refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentsSummary>,
    /// With `--target-*`: the deployment loaded (its clients' address and admin URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// With `--tls`: the handshakes, on both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSummary>,
}

/// The TLS handshakes of a `--tls` run: the server's (its workers' counters over the
/// run) and what the clients saw. A TLS connection's memory is `resources`'
/// `server_bytes_per_connection` and `load_bytes_per_connection` of the same run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSummary {
    /// Handshakes done: full, and resumed from a ticket.
    pub handshakes_full: u64,
    pub handshakes_resumed: u64,
    /// Failed, by why: refused (not TLS, nothing in common), not done within the
    /// server's handshake deadline, and clients that left before theirs was done (among
    /// them those that gave up in the accept queue, let go before any handshake work).
    pub refused: u64,
    pub timed_out: u64,
    pub abandoned: u64,
    /// The most under way at once in the once-a-second samples (every worker's), and the
    /// times a worker stopped accepting at its bound (`max_tls_handshakes`).
    pub in_progress_max: u64,
    pub accept_paused: u64,
    /// The clients' side: connections whose handshake (or upgrade) failed, and attempts
    /// that timed out (connect, handshake, upgrade: 10 s), each tried again on the
    /// back-off.
    pub client_handshake_failures: u64,
    pub client_timeouts: u64,
}

/// The agents of a run (docs/agents.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsSummary {
    pub count: u32,
    pub agents: Vec<hongbao_load::coordinator::AgentSummary>,
    /// Agents lost before their last report: their counters are what they had reported,
    /// and their users' history is incomplete (their users are left out of the balance
    /// check and counted in `users_incomplete`).
    pub lost: Vec<hongbao_load::coordinator::LostSlice>,
    pub users_incomplete: u64,
    /// Would-be agents refused at the door, and the newest of them.
    pub refused: u64,
    pub refusals: Vec<hongbao_load::coordinator::Refusal>,
    /// The largest |offset| and round trip measured, µs.
    pub offset_max_us: u64,
    pub rtt_max_us: u64,
}

/// The engines' work over a `--hosts` run (from the lab's first phase to its end), and
/// the operations it served, for costs per operation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSummary {
    /// Redis commands by name, over every node (commands run inside scripts included).
    pub redis_calls: std::collections::BTreeMap<String, u64>,
    pub pg_commits: u64,
    pub pg_rows_inserted: u64,
    pub pg_rows_updated: u64,
    /// The engines' processes' CPU time over the span, in seconds (lab::EngineCounters).
    #[serde(default)]
    pub cpu_seconds: f64,
    /// Over the same span: shake replies, wins, opens answered (from the clients), and
    /// packets sent (campaigns').
    pub shake_replies: u64,
    pub wins: u64,
    pub opens: u64,
    pub packets_sent: u64,
    /// A sharded ledger (`--shards`): the credits relayed between shards over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox: Option<OutboxSummary>,
}

/// Credits moved from a packet's shard to a wallet's (docs/scale-out.md, "Shards"): how
/// many, how long each took from its batch to the wallet's shard, and how many were still
/// waiting at the end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxSummary {
    pub shards: u32,
    pub credits: u64,
    pub lag_p50_ms: u64,
    pub lag_p99_ms: u64,
    pub lag_max_ms: u64,
    pub waiting: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionsSummary {
    pub target: u64,
    pub peak: u64,
    pub connect_seconds: f64,
    pub all_connected: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub server_rss_bytes: u64,
    pub server_rss_baseline_bytes: u64,
    pub server_rss_per_connection_bytes: u64,
    pub server_cpu_seconds: f64,
    pub load_rss_bytes: u64,
    pub load_rss_baseline_bytes: u64,
    pub load_rss_per_connection_bytes: u64,
    pub load_cpu_seconds: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSummary {
    pub procs: u64,
    pub totals: Counters,
    /// The coordinator's part: the agents' join, the last reports' wait, its CPU.
    #[serde(default)]
    pub coordinator: hongbao_load::coordinator::CoordinatorCost,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionsSummary {
    pub workers: String,
    pub phase_qps: Vec<u64>,
    pub shake_packets: u32,
    pub send_packets: u32,
    pub campaign_rate: u32,
    pub recipients: u32,
    pub max_shake_qps: u32,
    pub connect_rate: u64,
    pub transport: String,
    pub http_connection: String,
    pub broadcast_every: f64,
    pub max_queue_ms: u32,
    /// Absent from summaries written before pacing.
    #[serde(default)]
    pub broadcast_yield_ms: u32,
    pub server_nice: i32,
    /// Gateway hosts of a lab in cluster mode; 0 for one local server.
    #[serde(default)]
    pub hosts: usize,
    /// The failure injected (`--fault`), "" for none.
    #[serde(default)]
    pub fault: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSummary {
    pub own_namespace: bool,
    pub ehash_buckets: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A summary with one of everything, so every field shows in its JSON.
    fn example() -> Summary {
        Summary {
            phases: vec![PhaseSummary::default()],
            audit: AuditSummary {
                discrepancies: vec![Discrepancy {
                    user: Some(1),
                    phase: Some("qps-1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
            engines: Some(EngineSummary::default()),
            fault: Some(FaultSummary {
                reconnected_secs: Some(3),
                ..Default::default()
            }),
            agents: None,
            target: None,
            chaos: Some(super::super::chaos::ChaosSummary {
                faults: vec![super::super::chaos::ChaosFault {
                    whole_after_secs: Some(4),
                    ..Default::default()
                }],
                kinds: vec!["worker-kill".into()],
                ..Default::default()
            }),
            history: HistorySummary {
                missing: Findings {
                    first: vec![Finding {
                        told: vec![Payee {
                            user: 1,
                            amount_cents: 1,
                        }],
                        ledger: vec![Payee {
                            user: 1,
                            amount_cents: 2,
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Every leaf of `value` as a dotted path (array elements as `[]`).
    fn leaves(prefix: &str, value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    leaves(&format!("{prefix}{k}."), v, out);
                }
            }
            Value::Array(items) => {
                for v in items.iter().take(1) {
                    leaves(&format!("{}[].", prefix.trim_end_matches('.')), v, out);
                }
            }
            _ => out.push(prefix.trim_end_matches('.').to_string()),
        }
    }

    /// docs/bench.md names every field summary.json has (the load's `totals` and the
    /// server's audit are described with their own endpoints).
    #[test]
    fn docs_describe_every_summary_field() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/bench.md"))
                .expect("docs/bench.md");
        let mut paths = Vec::new();
        leaves("", &serde_json::to_value(example()).unwrap(), &mut paths);
        assert!(paths.len() > 80, "{paths:?}");
        for path in paths {
            if path.starts_with("load.totals.") || path.starts_with("audit.server.") {
                continue;
            }
            let leaf = path.rsplit('.').next().unwrap();
            assert!(
                doc.contains(&format!("`{leaf}`")),
                "docs/bench.md does not describe `{leaf}` ({path})"
            );
        }
    }

    #[test]
    fn a_summary_reads_back_and_refuses_unknown_fields() {
        let json = serde_json::to_value(example()).unwrap();
        assert_eq!(
            serde_json::from_value::<Summary>(json.clone()).unwrap(),
            example()
        );
        let mut extra = json;
        extra["phases"][0]["surprise"] = 1.into();
        assert!(serde_json::from_value::<Summary>(extra).is_err());
    }
}
