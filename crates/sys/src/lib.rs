//! What hongbao asks of the operating system and the machine, in one place below
//! everything else:
//!
//! - `clock`: time as typed values — time since a process's start, Unix time — and the
//!   helpers that read the wall clock, once;
//! - `dirlock`: one process at a time in a data directory;
//! - `limits`: the open-file limit and how many sockets a process may plan for;
//! - `net`: SO_REUSEPORT listeners, receive timestamps, non-blocking writes, abstract
//!   Unix addresses, loopback in a new namespace;
//! - `netns`: test hosts as network namespaces on a bridge (the lab's, and where the
//!   load runs its clients in one);
//! - `usage`: memory and CPU of a process, from /proc;
//! - `stop`: the stop value every loop is handed;
//! - `notify`: telling systemd a service is ready, reloading, stopping;
//! - `priority`: background work (nice 19, idle I/O) beside a server;
//! - `doctor`: the machine's limits for N connections, and `--netns`.

pub mod clock;
pub mod dirlock;
pub mod doctor;
pub mod error;
pub mod fdpass;
pub mod limits;
pub mod net;
pub mod netns;
pub mod notify;
pub mod priority;
pub mod stop;
pub mod usage;

pub use error::Error;
pub use stop::{Reload, Stop};
