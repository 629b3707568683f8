//! `hongbao serve`: gateway workers, the core that owns the money, its ledger, and the
//! admin API.
//!
//! - `supervisor`: the serve process — core loop, worker processes, links, admin glue;
//! - `worker`: one gateway worker process (mio event loop, slab of connections);
//! - `core`: money state and routes, plain code; `split`: the double-mean split;
//! - `event`: what the ledger stores; `ledger`: SQLite, group commit;
//! - `link`: worker ↔ core messages; `admin`: HTTP API; `metrics`: rates and Prometheus;
//! - `config`: settings.

pub mod admin;
pub mod config;
pub mod core;
pub mod error;
pub mod event;
pub mod ledger;
pub mod link;
pub mod metrics;
pub mod split;
pub mod supervisor;
pub mod worker;

pub use config::ServeConfig;
