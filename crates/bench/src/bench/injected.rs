//! What a fault did, as the bench reports it (`inject.rs` does the faults, `primary.rs`
//! those of the ledger's primary).

/// What a fault did: the line the bench prints, and for a fault to the ledger's primary,
/// how long after the fault the ledger first committed again.
#[derive(Debug, Clone, Default)]
pub struct Injected {
    pub what: String,
    pub first_commit_ms: Option<u64>,
}

impl From<String> for Injected {
    fn from(what: String) -> Injected {
        Injected {
            what,
            first_commit_ms: None,
        }
    }
}
