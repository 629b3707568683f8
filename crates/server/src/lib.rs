//! `hongbao serve`: gateway workers, the core that owns the money, its ledger, and the
//! admin API.
//!
//! - `supervisor`: the serve process — its loop, worker processes, links, admin glue;
//! - `worker`: one gateway worker process (mio event loop, slab of connections);
//! - `embedded`: the default money backend — the core (plain code) and its SQLite ledger;
//! - `presence`: who is connected where; logins, chat, notice delivery;
//! - `link`: worker ↔ supervisor messages; `admin`: HTTP API; `stats`: what workers count;
//! - `config`: settings; `nginx`: `hongbao nginx-conf`, nginx in front of the gateways.

pub mod admin;
pub mod config;
pub mod embedded;
pub mod error;
pub mod link;
pub mod nginx;
pub mod presence;
pub mod stats;
pub mod supervisor;
pub mod worker;

pub use config::ServeConfig;
