//! `summary.json`'s audit: each campaign kind's counts as the server and the clients saw
//! them (a phase's, and the run's totals), the discrepancies found, and the run's verdict.

use hongbao_money::Audit;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShakeAudit {
    pub packets: u64,
    pub released: u64,
    pub won_server: u64,
    pub won_clients: u64,
    pub amount_minted: u64,
    pub amount_won_server: u64,
    pub amount_won_clients: u64,
}

impl ShakeAudit {
    pub fn add(&mut self, s: &ShakeAudit) {
        self.packets += s.packets;
        self.released += s.released;
        self.won_server += s.won_server;
        self.won_clients += s.won_clients;
        self.amount_minted += s.amount_minted;
        self.amount_won_server += s.amount_won_server;
        self.amount_won_clients += s.amount_won_clients;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendAudit {
    pub packets: u64,
    pub shares: u64,
    pub opened_server: u64,
    pub opened_clients: u64,
    pub amount_sent: u64,
    pub amount_opened_server: u64,
    pub amount_opened_clients: u64,
}

impl SendAudit {
    pub fn add(&mut self, s: &SendAudit) {
        self.packets += s.packets;
        self.shares += s.shares;
        self.opened_server += s.opened_server;
        self.opened_clients += s.opened_clients;
        self.amount_sent += s.amount_sent;
        self.amount_opened_server += s.amount_opened_server;
        self.amount_opened_clients += s.amount_opened_clients;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Discrepancy {
    pub kind: String,
    pub user: Option<u64>,
    pub phase: Option<String>,
    pub server: u64,
    pub clients: u64,
}

impl Discrepancy {
    pub fn new(kind: &str, phase: Option<&str>, server: u64, clients: u64) -> Discrepancy {
        Discrepancy {
            kind: kind.into(),
            user: None,
            phase: phase.map(str::to_string),
            server,
            clients,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSummary {
    pub ok: bool,
    pub discrepancies: Vec<Discrepancy>,
    pub users_checked: u64,
    /// After a `--fault`: cents the ledger credited that no client was told of (a reply
    /// lost after its commit). Without a fault any such cent is a discrepancy.
    #[serde(default)]
    pub unacknowledged_cents: u64,
    /// The server's final `GET /v1/audit`.
    pub server: Audit,
}
