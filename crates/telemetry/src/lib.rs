//! What every hongbao process says about itself, below the server, the load and the
//! monitor alike:
//!
//! - `sample`: the once-a-second report (cumulative counters, levels, that second's
//!   latency as sparse HDR buckets, the host's CPU and network counters);
//! - `reporter`: sends samples to a monitor from a thread of its own;
//! - `prom`: Prometheus text, built as metric families and written by the `prometheus`
//!   crate's text encoder;
//! - `log`: log lines through `tracing`, human or JSON, for every process alike.

pub mod log;
pub mod prom;
pub mod reporter;
pub mod sample;

pub use reporter::Reporter;
pub use sample::{RoleSample, Sample};
