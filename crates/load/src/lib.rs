//! The load lab: `hongbao load` (a coordinator and client processes holding many simulated
//! users at an exact, coordinated QPS) and `hongbao bench` (server + load + audit).
//!
//! - `schedule`: which users fire when, computed alike in every process;
//! - `client`: one client process's event loop; `transport`: its bytes ↔ frames over TCP
//!   or WebSocket; `report`: what it tells its coordinator;
//! - `broadcast`: broadcast delivery times, from a client's receipts to the bench's summary;
//! - `coordinator`: starts clients, merges their reports, changes QPS live;
//! - `cli`: `hongbao load` on the command line (control endpoint, progress, totals);
//! - `bench`: the phases, the money audit and `summary.json`;
//! - `capacity`: `hongbao capacity`, stages of layers loaded in steps up to their knee.

pub mod bench;
pub mod broadcast;
pub mod capacity;
pub mod cli;
pub mod client;
pub mod coordinator;
pub mod report;
pub mod schedule;
pub mod transport;
