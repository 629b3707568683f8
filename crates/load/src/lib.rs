//! hongbao's load lab: the coordinated-QPS load generator and the bench that drives it.
//!
//! - `schedule`: which simulated users fire in which second and when within it, computed
//!   by each client process from the user count, the QPS plan and the clock alone.

pub mod schedule;
