//! The load lab's users: `hongbao load`, a coordinator and client processes holding many
//! simulated users at an exact, coordinated QPS. The experiments that drive a server and
//! judge it (`hongbao bench`, `hongbao capacity`) are the crate above, `hongbao-bench`.
//!
//! The pieces, from the clock up: `schedule` decides who fires when; a `client` process
//! fires, over a `transport`, and tells its coordinator in a `report`; the `coordinator`
//! merges those reports and `cli` shows them; `broadcast` follows broadcasts from receipt
//! to summary.
//!
//! - `agent`: `hongbao load-agent`, a client on another machine run over the agent link;
//! - `backoff`: when a user comes back after its connection ended (full jitter, hints);
//! - `broadcast`: broadcast delivery times, from a client's receipts to the bench's summary;
//! - `cli`: `hongbao load` on the command line (control endpoint, progress, totals);
//! - `client`: one client process's event loop over its slice of the users;
//! - `coordinator`: starts clients, merges their reports, changes QPS live;
//! - `error`: the crate's error: what failed, and what we were doing;
//! - `report`: what a client tells its coordinator, once a second;
//! - `schedule`: which users fire when, computed alike in every process;
//! - `transport`: a client's bytes ↔ frames over TCP, WebSocket or HTTP.

pub mod agent;
pub mod backoff;
pub mod broadcast;
pub mod cli;
pub mod client;
pub mod coordinator;
pub mod error;
pub mod report;
pub mod schedule;
pub mod transport;

pub use error::{Error, Result};
