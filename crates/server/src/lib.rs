//! `hongbao serve`: gateway workers, the supervisor that hosts the money backend (the
//! embedded one is crates/embedded, the cluster one crates/cluster), and the admin API.
//!
//! - `supervisor`: the serve process — its loop, worker processes, links, admin glue;
//! - `worker`: one gateway worker process (mio event loop, slab of connections);
//! - `link`: worker ↔ supervisor messages, length-prefixed on one Unix stream each;
//! - `admin`: the admin HTTP API (JSON), answered from the supervisor's loop;
//! - `health`: what the probes (`/healthz`, `/readyz`) and systemd are told;
//! - `access`: the admin door — keys with roles, the browser checks, the admin log, the
//!   operator console's sessions;
//! - `stats`: what workers count, as fields, and the report each sends once a second;
//! - `config`: `hongbao serve` settings — defaults, then the TOML file, then flags;
//! - `error`: the crate's error — what kind of failure, and what we were doing.

pub mod access;
pub mod admin;
pub mod config;
pub mod error;
pub mod health;
pub mod limits;
pub mod link;
pub mod stats;
pub mod supervisor;
pub mod worker;

pub use config::ServeConfig;
