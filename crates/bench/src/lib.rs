//! The experiments on top of the load lab: `hongbao bench` (a server and a load, the
//! seed's phases, the money audit, `summary.json`) and `hongbao capacity` (stages of
//! layers loaded in steps up to their knee). They drive processes — `hongbao serve`, a
//! lab of hosts, the load's coordinator — and judge what those did; `hongbao-load` below
//! them simulates the users and knows nothing of them.
//!
//! - `bench`: `hongbao bench`: the phases, faults and chaos, the money audit, the history
//!   check and `summary.json`;
//! - `capacity`: `hongbao capacity`, stages of layers loaded in steps up to their knee;
//! - `commit_bench`: `hongbao ledger-bench`, what a win's commit costs on this disk, on
//!   the embedded ledger's own writer.

pub mod bench;
pub mod capacity;
pub mod commit_bench;
mod error;

pub use error::{Error, Result};
