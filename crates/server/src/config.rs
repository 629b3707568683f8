//! `hongbao serve` settings: defaults, then the TOML file, then command-line flags.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Every option of `hongbao serve`; each can be given in the TOML file under the same name.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Where clients connect (raw TCP, binary frames).
    pub listen: String,
    /// Where the admin HTTP API listens.
    pub admin: String,
    /// Where WebSocket clients connect ("" for none); `GET /` there is the browser page.
    pub ws_listen: String,
    /// Where the HTTP API listens ("" for none); it also upgrades WebSockets and serves
    /// the browser page, like `ws_listen`.
    pub http_listen: String,
    /// Answer `GET /token?user=N` on the WebSocket address so the browser page can log
    /// in as anyone: a demo, on by default only with the development secret.
    pub demo_login: Option<bool>,
    /// Holds `ledger.sqlite`.
    pub data_dir: PathBuf,
    /// Gateway worker processes: a number, or "auto".
    pub workers: String,
    /// Connections the server should be able to hold (sizes `workers = "auto"`).
    pub connections: u64,
    /// Login tokens are HMAC-SHA256(secret, user id).
    pub secret: String,
    /// Shakes per second the whole server admits; above it shakes get "overloaded".
    pub max_shake_qps: u32,
    /// How long a sent packet stays openable.
    pub packet_ttl_secs: u64,
    /// A connection must log in this long after it connected (after its WebSocket
    /// upgrade), whatever it sends before; else `kick{idle}`.
    pub login_timeout_secs: u32,
    /// Connections not yet logged in that one worker holds at most; more are closed at
    /// once (a WebSocket upgrade is answered 503).
    pub max_unauthenticated: u32,
    /// The same, from one source address (per worker).
    pub max_unauthenticated_per_source: u32,
    /// Close a logged-in connection silent this long; 0 never.
    pub idle_timeout_secs: u32,
    /// Close an HTTP connection idle between requests this long; 0 never.
    pub http_keepalive_secs: u32,
    /// A client whose unread output passes this is closed.
    pub max_output_bytes: u32,
    /// Cluster mode's group commit: wait at most this long to fill a batch...
    pub commit_window_ms: u64,
    /// ...or until this many events (both modes).
    pub commit_max_batch: usize,
    /// The embedded ledger's group commit: a commit begins as soon as there is an event,
    /// but no sooner than this after the previous commit began.
    pub commit_interval_ms: u64,
    /// Report per-second counters to the `hongbao monitor` at this address ("" for none).
    pub monitor: String,
    /// A shake that waited in the kernel (arrival to read) longer than this may be
    /// answered "overloaded" — a share rising from none at this wait to all at twice it:
    /// the machine is behind, and well-behaved clients back off. 0 never (the default;
    /// `hongbao bench` sets it).
    pub max_queue_ms: u32,
    /// The order a worker reads the connections epoll reported: "adaptive" (oldest first,
    /// newest first while a queue stands; no shake cap; worker/ready.rs) or "fifo"
    /// (oldest first always, with the shake cap, as before there was a choice; for A/B
    /// measurement).
    pub ready_order: ReadyOrder,
    /// While a broadcast is being written, a worker whose shakes waited in the kernel
    /// longer than this halves the rate it writes the broadcast at (per 10 ms; it grows
    /// back while they do not), so a broadcast does not take the shakes' CPU. 0 never:
    /// broadcasts go out as fast as the machine allows (the default; `hongbao bench`
    /// sets it).
    pub broadcast_yield_ms: u32,
    /// Cluster mode (docs/scale-out.md): Redis Cluster seed nodes, comma-separated
    /// `redis://HOST:PORT`. With `postgres`, the ledger is PostgreSQL, not `data_dir`.
    pub redis: String,
    /// Cluster mode: the PostgreSQL ledger, `postgres://USER@HOST:PORT/DB`.
    pub postgres: String,
    /// Cluster mode: this host's name, unique among the gateways [default: the hostname
    /// and the client port].
    pub host_name: String,
}

/// The order a gateway worker reads the connections epoll reported readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadyOrder {
    /// Oldest first; newest first while a queue stands (controlled delay, adaptive LIFO);
    /// no shake cap.
    #[default]
    Adaptive,
    /// Oldest first always, all of them before epoll is asked again, and the shake cap
    /// (worker/cap.rs) after a queue past `max_queue_ms`.
    Fifo,
}

impl std::str::FromStr for ReadyOrder {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<ReadyOrder, String> {
        match s {
            "adaptive" => Ok(ReadyOrder::Adaptive),
            "fifo" => Ok(ReadyOrder::Fifo),
            _ => Err(format!(
                "ready order must be \"adaptive\" or \"fifo\", not {s:?}"
            )),
        }
    }
}

pub use hongbao_proto::token::DEV_SECRET;

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: "127.0.0.1:7000".into(),
            admin: "127.0.0.1:7001".into(),
            ws_listen: String::new(),
            http_listen: String::new(),
            demo_login: None,
            data_dir: PathBuf::from("hongbao-data"),
            workers: "auto".into(),
            connections: 20_000,
            secret: DEV_SECRET.into(),
            max_shake_qps: 100_000,
            packet_ttl_secs: 24 * 3600,
            login_timeout_secs: 10,
            max_unauthenticated: 16_384,
            max_unauthenticated_per_source: 4_096,
            idle_timeout_secs: 0,
            http_keepalive_secs: 75,
            max_output_bytes: 256 * 1024,
            commit_window_ms: 2,
            commit_max_batch: 4096,
            commit_interval_ms: 20,
            monitor: String::new(),
            max_queue_ms: 0,
            ready_order: ReadyOrder::Adaptive,
            broadcast_yield_ms: 0,
            redis: String::new(),
            postgres: String::new(),
            host_name: String::new(),
        }
    }
}

impl ServeConfig {
    /// Defaults overlaid with `file` when given.
    pub fn load(file: Option<&Path>) -> Result<ServeConfig> {
        let Some(file) = file else {
            return Ok(ServeConfig::default());
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| Error::config(format!("reading {}: {e}", file.display())))?;
        toml::from_str(&text).map_err(|e| Error::config(format!("{}: {e}", file.display())))
    }

    /// Cluster mode is on when both engines are named; one alone is a mistake.
    pub fn cluster(&self) -> Result<bool> {
        match (self.redis.is_empty(), self.postgres.is_empty()) {
            (true, true) => Ok(false),
            (false, false) => Ok(true),
            _ => Err(Error::config(
                "cluster mode needs both --redis and --postgres".to_string(),
            )),
        }
    }

    pub fn demo_login(&self) -> bool {
        self.demo_login.unwrap_or(self.secret == DEV_SECRET)
    }

    /// The worker count: as given, or for "auto" enough workers to hold `connections`
    /// under the open-file limit with room for an uneven spread, and never fewer than
    /// the cores.
    pub fn worker_count(&self, nofile_limit: u64, cores: usize) -> Result<usize> {
        if self.workers == "auto" {
            let per = hongbao_sys::limits::planned_sockets_per_process(nofile_limit);
            return Ok((self.connections.div_ceil(per) as usize).max(cores).max(1));
        }
        match self.workers.parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(Error::config(format!(
                "workers must be 1..=1024 or \"auto\", not {:?}",
                self.workers
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_workers_follow_the_file_limit_and_cores() {
        let mut cfg = ServeConfig {
            connections: 1_000_000,
            ..Default::default()
        };
        assert_eq!(cfg.worker_count(20_000, 2).unwrap(), 56);
        cfg.connections = 1000;
        assert_eq!(cfg.worker_count(20_000, 2).unwrap(), 2);
        cfg.workers = "3".into();
        assert_eq!(cfg.worker_count(20_000, 2).unwrap(), 3);
        cfg.workers = "lots".into();
        assert!(cfg.worker_count(20_000, 2).is_err());
    }

    #[test]
    fn toml_gives_options_and_rejects_unknown_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hongbao.toml");
        std::fs::write(&path, "workers = \"4\"\nmax_shake_qps = 500\n").unwrap();
        let cfg = ServeConfig::load(Some(&path)).unwrap();
        assert_eq!((cfg.workers.as_str(), cfg.max_shake_qps), ("4", 500));
        std::fs::write(&path, "ready_order = \"fifo\"\n").unwrap();
        let cfg = ServeConfig::load(Some(&path)).unwrap();
        assert_eq!(cfg.ready_order, ReadyOrder::Fifo);
        assert_eq!(ServeConfig::default().ready_order, ReadyOrder::Adaptive);
        std::fs::write(&path, "ready_order = \"lifo\"\n").unwrap();
        assert!(ServeConfig::load(Some(&path)).is_err());
        assert_eq!("fifo".parse(), Ok(ReadyOrder::Fifo));
        assert!("lifo".parse::<ReadyOrder>().is_err());
        std::fs::write(&path, "wrokers = 4\n").unwrap();
        assert!(ServeConfig::load(Some(&path)).is_err());
    }
}
