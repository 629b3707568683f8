//! `summary.json`'s `history`: the result of the per-operation check of what each client
//! was told against the ledger (`../history.rs` does the check).

use serde::{Deserialize, Serialize};

/// Findings listed in the summary per kind; the rest are only counted.
pub(in crate::bench) const FIRST: usize = 10;

/// The history check's result (`history.rs`), `summary.json`'s `history` (docs/bench.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySummary {
    /// Nothing missing, mismatched or duplicated.
    pub ok: bool,
    /// Wins the clients were told of, and opens (once per user, packet and amount).
    pub wins_told: u64,
    pub opens_told: u64,
    /// What the ledger holds.
    pub wins_in_ledger: u64,
    pub opens_in_ledger: u64,
    /// Told operations the ledger holds exactly once, as told.
    pub confirmed: u64,
    /// Told, and not in the ledger at all.
    pub missing: Findings,
    /// Told, and in the ledger once, for another user (a win) or another amount.
    pub mismatched: Findings,
    /// In the ledger more than once, or told more than once (a packet won twice, a share
    /// told at two amounts).
    pub duplicates: Findings,
    /// In the ledger, told to nobody (a reply lost after its commit): not an error.
    pub ledger_only: Findings,
    pub ledger_only_cents: u64,
}

/// How many operations were found so, and the first few.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Findings {
    pub count: u64,
    pub first: Vec<Finding>,
}

impl Findings {
    pub(in crate::bench) fn add(&mut self, finding: Finding) {
        self.count += 1;
        if self.first.len() < FIRST {
            self.first.push(finding);
        }
    }
}

/// One operation, by its key: what the clients were told of it, and what the ledger holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finding {
    pub op: Operation,
    pub packet: u64,
    pub told: Vec<Payee>,
    pub ledger: Vec<Payee>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    #[default]
    Win,
    Open,
}

/// Who was paid for an operation, and how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payee {
    pub user: u64,
    pub amount_cents: u64,
}
