//! The sections of `hongbao serve`'s settings, each with its defaults, what it derives,
//! and whether a reload takes it (`super::SECTIONS`); the login's own, `[tokens]`, is in
//! `tokens.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::file;
use crate::error::{Error, Result};
use crate::limits::UserLimits;

/// TLS handshakes under way on the machine, a core (`max_tls_handshakes = 0`, the
/// default, shares `cores × 2,048` among the workers, at least 16 each). A handshake under
/// way is mostly waiting for its client's answer (in a storm, the clients' machines are as
/// busy as the server), so the machine needs as many under way as it completes in that
/// wait, and no more: every one more waits its turn for the same cores, towards its
/// deadline. 200,000 TLS clients at once into 12 workers on 2 cores were all in after
/// 51.6 s with 192 under way in all (16 a worker), 41.6 s with 768, 36.0 s with 3,072,
/// 33.9 s with 12,288, and 40.3 s with 49,152, where 24,528 handshakes waited past their
/// 10 s deadline; a million into 56 workers at 256 each (14,336) lost 416,054 handshakes
/// to it (docs/benchmarks/diary.md, issue 51).
pub const TLS_HANDSHAKES_PER_CORE: u32 = 2_048;

/// How many seconds of a worker's handshakes its TLS listeners' accept queues hold
/// (`tls_accept_queue_secs`): 20, two thirds of a client's 30 s patience (`hongbao
/// load`'s connect timeout), so that a client let into the queue is served before it
/// gives up. 200,000 TLS clients at once into 12 workers on 2 cores were all in after
/// 45.7 and 55.9 s with queues of only 2 × `max_tls_handshakes`, 41.2 and 44.0 s with
/// 10 s of handshakes, 36.7 and 38.8 s with 30 s (36.0 s with the kernel's 65,535), and
/// 44.5–48.2 s with 20 s in a later sitting: a storm that fits within the patience
/// gains nothing from a shorter queue, and pays ~25% for it; a million
/// at once does: 571.4 s against 693.9 s with the kernel's backlog (docs/benchmarks/
/// diary.md, issue 51).
pub const DEFAULT_TLS_ACCEPT_QUEUE_SECS: u32 = 20;

/// Seconds a SIGTERM's drain spreads the connections' kicks over (`drain_secs`): 5, so
/// that the drain and the last writes end within the 10 s `podman stop` and the lab give
/// a server before SIGKILL, well within systemd's 90 s and the StatefulSet's grace.
pub const DEFAULT_DRAIN_SECS: u32 = 5;

/// The fastest an upgrade lets its connections go, per core, when `upgrade_admit_per_sec`
/// is 0 (plain, TLS): what a core logs in again while it serves the shakes besides, the
/// clients' side too when the load shares the machine (`supervisor/upgrade.rs`). Under TLS
/// a tenth of the handshakes one core makes alone (5,638 a second, docs/BENCHMARKS.md):
/// at 4,500 a second on 2 cores both were busy and the shakes served fell under 90% for
/// 13 s of the drain (8 of the 30 the bench judges). Plain, the 15,000 a second on 2 cores
/// that cost no second under 90%.
pub const UPGRADE_ADMIT_PER_CORE: [u32; 2] = [7_500, 500];

/// `[listeners]`: Where the server listens, and who may call its admin address.
/// A reload does not apply it: it waits for the next start.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Listeners {
    /// Where clients connect (raw TCP, binary frames).
    pub listen: String,
    /// Where the admin HTTP API listens.
    pub admin: String,
    /// More names the admin address answers to in `Host` (a DNS name, a proxy's), with
    /// or without a port: any other name is refused (DNS rebinding). Address literals and,
    /// on loopback, `localhost` always pass.
    pub admin_hosts: Vec<String>,
    /// Origins (`https://console.example`) whose pages may call the admin API, beside
    /// the admin address's own.
    pub admin_origins: Vec<String>,
    /// Where WebSocket clients connect ("" for none); `GET /` there is the browser page.
    pub ws_listen: String,
    /// Where the HTTP API listens ("" for none); it also upgrades WebSockets and serves
    /// the browser page, like `ws_listen`.
    pub http_listen: String,
    /// Addresses of the proxies in front (nginx): a connection from one of them names
    /// its client — a PROXY protocol header first on the binary-frame address, `X-Real-IP`
    /// on the HTTP and WebSocket ones — and the limits per source count that client.
    pub trusted_proxies: Vec<std::net::IpAddr>,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners {
            listen: "127.0.0.1:7000".into(),
            admin: "127.0.0.1:7001".into(),
            admin_hosts: Vec::new(),
            admin_origins: Vec::new(),
            ws_listen: String::new(),
            http_listen: String::new(),
            trusted_proxies: Vec::new(),
        }
    }
}

/// `[tls]`: TLS on every client listener and the admin address: the certificate, read again on
/// SIGHUP (TLS itself cannot be turned on or off by a reload).
/// A reload applies it.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Tls {
    /// TLS on every client listener and the admin address: the certificate chain (PEM,
    /// leaf first) and its key; "" for none (plain TCP).
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

impl Default for Tls {
    fn default() -> Self {
        Tls {
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
        }
    }
}

/// `[admission]`: What a connection may cost before it has logged in: the login deadline, the
/// unauthenticated connections a worker holds, the TLS handshakes under way and the
/// accept queue behind them, and what an HTTP or slow client may hold.
/// A reload does not apply it: it waits for the next start.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Admission {
    /// A connection must log in this long after it connected (after its WebSocket
    /// upgrade), whatever it sends before; else `kick{idle}`.
    pub login_timeout_secs: u32,
    /// Connections not yet logged in that one worker holds at most; more are closed at
    /// once (a WebSocket upgrade is answered 503).
    pub max_unauthenticated: u32,
    /// The same, from one source address (per worker).
    pub max_unauthenticated_per_source: u32,
    /// TLS handshakes under way in one worker at most; the connections past it wait in
    /// the kernel's accept queue (the listener is not polled meanwhile). 0: the machine's
    /// share (`tls_handshakes_per_worker`).
    pub max_tls_handshakes: u32,
    /// A TLS handshake not done this long after the accept is closed; the login
    /// deadline counts from the handshake's end.
    pub tls_handshake_timeout_secs: u32,
    /// A TLS listener's accept queue holds this many seconds of the worker's handshakes
    /// (its last second's, and never fewer than `2 × max_tls_handshakes`); the SYNs past
    /// it are dropped, and TCP's retries wait for the server at no cost to it. 0: the
    /// kernel's backlog (`net.core.somaxconn`), unbounded by the worker.
    pub tls_accept_queue_secs: u32,
    /// Close an HTTP connection idle between requests this long; 0 never.
    pub http_keepalive_secs: u32,
    /// A client whose unread output passes this is closed.
    pub max_output_bytes: u32,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            login_timeout_secs: 10,
            max_unauthenticated: 16_384,
            max_unauthenticated_per_source: 4_096,
            max_tls_handshakes: 0,
            tls_handshake_timeout_secs: 10,
            tls_accept_queue_secs: DEFAULT_TLS_ACCEPT_QUEUE_SECS,
            http_keepalive_secs: 75,
            max_output_bytes: 256 * 1024,
        }
    }
}

/// `[limits]`: What a logged-in user may do: the limits per user, and how long a session may be
/// silent.
/// A reload applies it.
#[derive(Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct Limits {
    /// Limits per user (`[user_limits]`: `shake`, `send`, `open`, `chat`, `login` as
    /// `{ per_sec, burst }`, and `notices_per_minute`); docs/security.md says the defaults.
    pub user_limits: UserLimits,
    /// Close a logged-in connection silent this long; 0 never.
    pub idle_timeout_secs: u32,
}

/// `[overload]`: How the server sheds load it cannot serve: the shakes it admits a second, the
/// queue it answers "overloaded" past, the broadcasts it paces.
/// A reload applies it.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Overload {
    /// Shakes per second the whole server admits; above it shakes get "overloaded".
    pub max_shake_qps: u32,
    /// A shake that waited in the kernel (arrival to read) longer than this may be
    /// answered "overloaded" — a share rising from none at this wait to all at twice it:
    /// the machine is behind, and well-behaved clients back off. 0 never (the default;
    /// `hongbao bench` sets it).
    pub max_queue_ms: u32,
    /// While a broadcast is being written, a worker whose shakes waited in the kernel
    /// longer than this halves the rate it writes the broadcast at (per 10 ms; it grows
    /// back while they do not), so a broadcast does not take the shakes' CPU. 0 never:
    /// broadcasts go out as fast as the machine allows (the default; `hongbao bench`
    /// sets it).
    pub broadcast_yield_ms: u32,
}

impl Default for Overload {
    fn default() -> Self {
        Overload {
            max_shake_qps: 100_000,
            max_queue_ms: 0,
            broadcast_yield_ms: 0,
        }
    }
}

/// `[ledger]`: The money's record: where the embedded ledger lives, how long a sent packet stays
/// openable, and the group commit's batches.
/// A reload does not apply it: it waits for the next start.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Ledger {
    /// Holds `ledger.sqlite`.
    pub data_dir: PathBuf,
    /// How long a sent packet stays openable.
    pub packet_ttl_secs: u64,
    /// Cluster mode's group commit: wait at most this long to fill a batch...
    pub commit_window_ms: u64,
    /// ...or until this many events (both modes).
    pub commit_max_batch: usize,
    /// The embedded ledger's group commit: a commit begins as soon as there is an event,
    /// but no sooner than this after the previous commit began.
    pub commit_interval_ms: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            data_dir: PathBuf::from("hongbao-data"),
            packet_ttl_secs: 24 * 3600,
            commit_window_ms: 2,
            commit_max_batch: 4096,
            commit_interval_ms: 20,
        }
    }
}

/// `[cluster]`: Cluster mode (docs/scale-out.md): the engines, their passwords and CA, this host's
/// name.
/// A reload does not apply it: it waits for the next start.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Cluster {
    /// Cluster mode (docs/scale-out.md): Redis Cluster seed nodes, comma-separated
    /// `redis://HOST:PORT`. With `postgres`, the ledger is PostgreSQL, not `data_dir`.
    pub redis: String,
    /// Cluster mode: the PostgreSQL ledger, `postgres://USER@HOST:PORT/DB`; a sharded
    /// ledger's formations separated by `;`, shard 0 first (docs/scale-out.md, "Shards").
    pub postgres: String,
    /// Cluster mode: the shard map's version, recorded in every formation; a host whose
    /// map (this version, the formations in `postgres`, their order) disagrees with
    /// theirs refuses to start [default: 1].
    pub shard_map_version: u32,
    /// Cluster mode: this host's name, unique among the gateways [default: the hostname
    /// and the client port].
    pub host_name: String,
    /// Cluster mode: the CA certificates (PEM) the engines' TLS (Redis's, PostgreSQL's)
    /// is trusted by; "" for `HONGBAO_TLS_CA`'s file, or none. `tls_ca`, its name before,
    /// is still read.
    #[serde(alias = "tls_ca")]
    pub engines_ca: PathBuf,
    /// `engines_ca` read.
    #[serde(skip)]
    pub engines_ca_pem: Option<Vec<u8>>,
    /// A file holding the PostgreSQL password ("" for none: `HONGBAO_POSTGRES_PASSWORD`,
    /// or none at all).
    pub postgres_password_file: PathBuf,
    /// A file holding the Redis ACL user's password ("" for none:
    /// `HONGBAO_REDIS_PASSWORD`, or none at all).
    pub redis_password_file: PathBuf,
    /// Cluster mode: how many Redis hash tags (slots) the release of campaign packets is
    /// split over (docs/scale-out.md, "The release over several slots"); 1 is `{rel}`
    /// alone, as before; 0 is refused. The same on every host.
    pub release_tags: u32,
    /// The engines' passwords, as read from their files or the environment.
    #[serde(skip)]
    pub postgres_password: Option<String>,
    #[serde(skip)]
    pub redis_password: Option<String>,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            redis: String::new(),
            postgres: String::new(),
            shard_map_version: 1,
            host_name: String::new(),
            engines_ca: PathBuf::new(),
            engines_ca_pem: None,
            postgres_password_file: PathBuf::new(),
            redis_password_file: PathBuf::new(),
            release_tags: 1,
            postgres_password: None,
            redis_password: None,
        }
    }
}

/// `[processes]`: The processes and their loops: how many workers for how many connections, the order
/// a worker reads in, and how a stop or an upgrade lets the connections go.
/// A reload does not apply it: it waits for the next start.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Processes {
    /// Gateway worker processes: a number, or "auto".
    pub workers: String,
    /// Connections the server should be able to hold (sizes `workers = "auto"`).
    pub connections: u64,
    /// The order a worker reads the connections epoll reported: "adaptive" (oldest first,
    /// newest first while a queue stands; no shake cap; worker/ready.rs) or "fifo"
    /// (oldest first always, with the shake cap, as before there was a choice; for A/B
    /// measurement).
    pub ready_order: ReadyOrder,
    /// On SIGTERM, the connections are let go over this many seconds, each told to come
    /// back in about a second, not kicked at once (`worker/drain.rs`); 0: at once, as
    /// SIGINT does.
    pub drain_secs: u32,
    /// In an upgrade, the fastest the old server lets its connections go, a second, and
    /// only while the new server logs them in again (at most a hundredth on their way);
    /// its window, the ceiling, is twice `connections / this` seconds (never under
    /// `drain_secs`); 0: `UPGRADE_ADMIT_PER_CORE` (TLS or plain) times the cores.
    pub upgrade_admit_per_sec: u32,
}

impl Default for Processes {
    fn default() -> Self {
        Processes {
            workers: "auto".into(),
            connections: 20_000,
            ready_order: ReadyOrder::Adaptive,
            drain_secs: DEFAULT_DRAIN_SECS,
            upgrade_admit_per_sec: 0,
        }
    }
}

/// `[telemetry]`: Where the per-second counters are reported.
/// A reload does not apply it: it waits for the next start.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Telemetry {
    /// Report per-second counters to the `hongbao monitor` at this address ("" for none).
    pub monitor: String,
    /// The monitor's key: `HONGBAO_MONITOR_KEY`, else this file's (`hongbao monitor`
    /// makes it).
    pub monitor_key_file: PathBuf,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            monitor: String::new(),
            monitor_key_file: PathBuf::from("hongbao-monitor.key"),
        }
    }
}

impl Tls {
    /// The TLS certificate and key, when both are given (one alone is a mistake).
    pub fn tls_files(&self) -> Result<Option<hongbao_http::tls::TlsFiles>> {
        match (file(&self.tls_cert), file(&self.tls_key)) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(hongbao_http::tls::TlsFiles {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
            })),
            _ => Err(Error::config(
                "TLS needs both tls_cert and tls_key".to_string(),
            )),
        }
    }
    /// The TLS certificate and key read (and checked usable), when TLS is on.
    pub fn tls_pem(&self) -> Result<Option<TlsPem>> {
        let Some(files) = self.tls_files()? else {
            return Ok(None);
        };
        let (cert, key) = files.read()?;
        hongbao_http::tls::server_config(&cert, &key, &[])?;
        Ok(Some(TlsPem {
            cert,
            key,
            ticket_key: hongbao_http::tls::new_ticket_key(),
        }))
    }
}

impl Admission {
    /// `max_tls_handshakes` for each of `workers` on `cores`: as given, or (0) an even
    /// share of `cores × TLS_HANDSHAKES_PER_CORE`, at least 16.
    pub fn tls_handshakes_per_worker(&self, workers: usize, cores: usize) -> u32 {
        if self.max_tls_handshakes > 0 {
            return self.max_tls_handshakes;
        }
        let machine = TLS_HANDSHAKES_PER_CORE as usize * cores.max(1);
        (machine / workers.max(1)).max(16) as u32
    }
}

impl Processes {
    /// The fastest an upgrade's drain lets connections go, a second: as given
    /// (`upgrade_admit_per_sec`), or `UPGRADE_ADMIT_PER_CORE` times the cores.
    pub fn upgrade_admit_rate(&self, tls: bool) -> u64 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        match self.upgrade_admit_per_sec {
            0 => u64::from(UPGRADE_ADMIT_PER_CORE[usize::from(tls)]) * cores,
            given => u64::from(given),
        }
    }
    /// How long an upgrade's drain may take to let `held` connections go: twice what they
    /// take at the admit rate (the drain's ceiling: it lets them go at that rate while
    /// the new server keeps up, and at half of it at least), never under `drain_secs`
    /// (nor 1 s).
    pub fn upgrade_drain_window(&self, held: u64, tls: bool) -> std::time::Duration {
        let ms = held.saturating_mul(2000) / self.upgrade_admit_rate(tls).max(1);
        let floor = u64::from(self.drain_secs.max(1)) * 1000;
        std::time::Duration::from_millis(ms.max(floor))
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

impl Cluster {
    /// The ledger's formations, as `postgres` names them (`;` between shards).
    pub fn formations(&self) -> Vec<String> {
        self.postgres
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Cluster mode is on when both engines are named; one alone is a mistake.
    pub fn on(&self) -> Result<bool> {
        match (self.redis.is_empty(), self.postgres.is_empty()) {
            (true, true) => Ok(false),
            (false, false) if self.formations().is_empty() => Err(Error::config(format!(
                "--postgres {:?} names no formation",
                self.postgres
            ))),
            (false, false)
                if !(1..=hongbao_cluster::shard::MAX_VERSION).contains(&self.shard_map_version) =>
            {
                Err(Error::config(format!(
                    "shard_map_version is 1 to {} (the version a packet id carries), not {}",
                    hongbao_cluster::shard::MAX_VERSION,
                    self.shard_map_version
                )))
            }
            (false, false) => Ok(true),
            _ => Err(Error::config(
                "cluster mode needs both --redis and --postgres".to_string(),
            )),
        }
    }
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
    /// (worker/overload.rs) after a queue past `max_queue_ms`.
    Fifo,
}

/// A ready order that is none of ours.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("ready order must be \"adaptive\" or \"fifo\", not {0:?}")]
pub struct UnknownReadyOrder(String);

impl std::str::FromStr for ReadyOrder {
    type Err = UnknownReadyOrder;

    fn from_str(s: &str) -> std::result::Result<ReadyOrder, UnknownReadyOrder> {
        match s {
            "adaptive" => Ok(ReadyOrder::Adaptive),
            "fifo" => Ok(ReadyOrder::Fifo),
            _ => Err(UnknownReadyOrder(s.to_string())),
        }
    }
}

/// A certificate chain and its key (PEM), for the client listeners' TLS: read by the
/// supervisor (at start, and again on SIGHUP) and handed to the workers over their links.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsPem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    /// The key every worker seals its TLS 1.3 tickets with (a client resumes on any).
    pub ticket_key: [u8; 32],
}

impl std::fmt::Debug for TlsPem {
    /// Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPem")
            .field("cert_bytes", &self.cert.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_workers_follow_the_file_limit_and_cores() {
        let mut cfg = Processes {
            connections: 1_000_000,
            ..Default::default()
        };
        let mut admission = Admission::default();
        assert_eq!(cfg.worker_count(20_000, 2).unwrap(), 56);
        // A million over TLS: 4,096 handshakes under way on 2 cores, 73 in each of 56.
        assert_eq!(admission.tls_handshakes_per_worker(56, 2), 73);
        assert_eq!(admission.tls_handshakes_per_worker(12, 2), 341);
        assert_eq!(admission.tls_handshakes_per_worker(1024, 2), 16);
        admission.max_tls_handshakes = 256;
        assert_eq!(admission.tls_handshakes_per_worker(56, 2), 256);
        cfg.connections = 1000;
        assert_eq!(cfg.worker_count(20_000, 2).unwrap(), 2);
        cfg.workers = "3".into();
        assert_eq!(cfg.worker_count(20_000, 2).unwrap(), 3);
        cfg.workers = "lots".into();
        assert!(cfg.worker_count(20_000, 2).is_err());
    }
}
