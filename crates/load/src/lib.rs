//! The load lab: `hongbao load` (a coordinator and client processes holding many simulated
//! users at an exact, coordinated QPS) and `hongbao bench` (server + load + audit).
//!
//! The pieces, from the clock up: `schedule` decides who fires when; a `client` process
//! fires, over a `transport`, and tells its coordinator in a `report`; the `coordinator`
//! merges those reports and `cli` shows them; `bench` and `capacity` drive whole
//! experiments on top, and `broadcast` follows broadcasts from receipt to summary.
//!
//! - `bench`: `hongbao bench`: the phases, the money audit and `summary.json`;
//! - `broadcast`: broadcast delivery times, from a client's receipts to the bench's summary;
//! - `capacity`: `hongbao capacity`, stages of layers loaded in steps up to their knee;
//! - `cli`: `hongbao load` on the command line (control endpoint, progress, totals);
//! - `client`: one client process's event loop over its slice of the users;
//! - `coordinator`: starts clients, merges their reports, changes QPS live;
//! - `report`: what a client tells its coordinator, once a second;
//! - `schedule`: which users fire when, computed alike in every process;
//! - `transport`: a client's bytes ↔ frames over TCP, WebSocket or HTTP.

pub mod bench;
pub mod broadcast;
pub mod capacity;
pub mod cli;
pub mod client;
pub mod coordinator;
pub mod report;
pub mod schedule;
pub mod transport;
