//! The bench's load on agents (docs/agents.md): the coordinator's plan from the options,
//! and what the summary says of the agents when the run is over.

use std::time::Duration;

use hongbao_load::coordinator::{AgentSummary, LostSlice, Refusal};

use super::options::{AgentsChoice, BenchOptions};
use super::server::Server;
use super::summary::AgentsSummary;

/// The agents' plan of `--agents`: the coordinator's address (with a lab, on its bridge,
/// where the lab's hosts reach it) and files (OUT/agents unless told).
pub(super) fn plan(
    opts: &BenchOptions,
    server: &Server,
) -> crate::Result<Option<hongbao_load::coordinator::AgentPlan>> {
    let Some(a) = &opts.agents else {
        return Ok(None);
    };
    Ok(Some(hongbao_load::coordinator::AgentPlan {
        listen: a.listen.unwrap_or_else(|| server.agent_listen()),
        count: a.count,
        dir: a.dir.clone().unwrap_or_else(|| opts.out.join("agents")),
        cert_names: a.cert_names.clone(),
        join_timeout: Duration::from_secs(a.join_timeout_secs),
        spawn: a.spawn,
    }))
}

/// The summary's `agents`: each agent, those lost, strangers refused, the largest
/// offset and round trip.
pub(super) fn summarize(
    choice: &AgentsChoice,
    agents: Vec<AgentSummary>,
    lost: &[LostSlice],
    users_incomplete: u64,
    refused: u64,
    refusals: Vec<Refusal>,
) -> AgentsSummary {
    AgentsSummary {
        count: choice.count,
        offset_max_us: agents
            .iter()
            .map(|g| g.offset_us.unsigned_abs())
            .max()
            .unwrap_or(0),
        rtt_max_us: agents.iter().map(|g| g.rtt_us).max().unwrap_or(0),
        agents,
        lost: lost.to_vec(),
        users_incomplete,
        refused,
        refusals,
    }
}

impl AgentsSummary {
    /// The line the bench prints of them.
    pub(super) fn line(&self) -> String {
        let lost: Vec<String> = self
            .lost
            .iter()
            .map(|l| {
                format!(
                    "agent {} (after second {:?}: {})",
                    l.index, l.last_second, l.why
                )
            })
            .collect();
        format!(
            "bench: agents: {} ran, largest clock offset {} µs; lost: {}; strangers refused: {}",
            self.agents.len(),
            self.offset_max_us,
            if lost.is_empty() {
                "none".to_string()
            } else {
                lost.join(", ")
            },
            self.refused
        )
    }
}
