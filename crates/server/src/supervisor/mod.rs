//! `hongbao serve`: the supervisor process. It hosts the money backend (the embedded
//! core and its ledger), presence, and the admin API, and spawns the gateway workers
//! (this same binary, `hongbao worker`), each holding its own SO_REUSEPORT listeners and
//! one link back here.
//!
//! Its loop reads the links, hands operations to the money side and logins and chat to
//! presence, ticks the money side's clock, and routes whatever comes out of the money
//! side — which it only releases once durable — to the workers. It also watches the
//! worker processes (`workers.rs`): a worker that dies has its pool returned (when its
//! link closes) and is started again. `report.rs` turns what it knows into stats,
//! samples for the monitor and Prometheus text.
//!
//! - `start`: `run` — the backend opened, the sockets bound, the admin address served;
//! - `event_loop`: the supervisor's record and its turn;
//! - `timers`: every deadline of the loop in one table — the tick, the second, the check;
//! - `procs` (worker processes and their links, as kept) and `workers` (what the
//!   supervisor does with them: start, read, restart);
//! - `tallies` (what the report keeps between seconds) and `report` (`/v1/stats`,
//!   monitor samples, `/metrics`);
//! - `reload`: SIGHUP; `broadcast`: an operator's broadcast and its answer;
//! - `drain`: SIGTERM's drain;
//! - an upgrade in place: `upgrade` (its wire, the successor as the old server keeps it,
//!   the drain's arithmetic), `upgrading` (what each server does in it), `successor`
//!   (the new server taking the money side over), `listen` (the sockets handed on).

mod broadcast;
mod drain;
mod event_loop;
mod listen;
mod procs;
mod reload;
mod report;
mod start;
mod successor;
mod tallies;
mod timers;
pub mod upgrade;
mod upgrading;
mod workers;

pub use start::run;
