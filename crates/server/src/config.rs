//! `hongbao serve` settings: defaults, then the TOML file, then command-line flags.
//!
//! Each option has one spelling: a field of `ServeConfig`, the same name in the TOML
//! file, and `--the-same-name` as a flag (`ServeFlags`). The flags are laid over the
//! file as one more TOML table (`ServeConfig::load`), and rendered back into a command
//! line by one function (`ServeFlags::to_args`), which the bench, the lab and the
//! scripts (through `hongbao bench --print-serve-args`) start `serve` with.

use std::path::{Path, PathBuf};

use hongbao_proto::token::{Alg, KeySpec, Rules, DEFAULT_KID};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::limits::UserLimits;

/// The flags of `hongbao serve`: each a field of `ServeConfig` under the same name, given
/// when set. Flags win over the config file, which wins over the defaults.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize)]
pub struct ServeFlags {
    /// Client address (TCP, binary frames) [default: 127.0.0.1:7000]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Admin HTTP address [default: 127.0.0.1:7001]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// WebSocket address (same protocol; JSON in text messages; the browser page at /) [default: none]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws_listen: Option<String>,
    /// HTTP API address (docs/http-api.md; also upgrades WebSockets) [default: none]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_listen: Option<String>,
    /// Directory of the ledger [default: hongbao-data]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Gateway worker processes: N or auto [default: auto]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<String>,
    /// Connections to size `--workers auto` for [default: 20000]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// Shakes per second the server admits before answering "overloaded" [default: 100000]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_shake_qps: Option<u32>,
    /// Time-to-live of sent packets, seconds [default: 86400]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packet_ttl_secs: Option<u64>,
    /// Secret for login tokens, for development only: a command line is seen by every
    /// local user (ps). Give it in HONGBAO_SECRET or --secret-file instead
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// A file holding the secret for login tokens (the HS256 key `hongbao` when no
    /// [[login_keys]] are configured)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// Answer GET /token?user=N on the WebSocket and HTTP addresses with any user's token
    /// (a demo: loopback addresses only)
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub demo_login: Option<bool>,
    /// TLS on the client listeners and the admin address: the certificate chain (PEM)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// ...and its private key (PEM); both are read again on SIGHUP
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Cluster mode: the CA (PEM) the engines' (Redis's, PostgreSQL's) TLS is trusted by
    /// — not the clients' — (rediss://, PostgreSQL's sslmode=verify-full) [default:
    /// HONGBAO_TLS_CA's file]
    #[arg(long, alias = "tls-ca")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engines_ca: Option<PathBuf>,
    /// Report per-second counters to the hongbao monitor at this address
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor: Option<String>,
    /// The monitor's key file (HONGBAO_MONITOR_KEY overrides) [default: hongbao-monitor.key]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor_key_file: Option<PathBuf>,
    /// Answer "overloaded" to a shake that waited in the kernel longer than this (a share, all past twice it); 0 never [default: 0]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue_ms: Option<u32>,
    /// Order of reading ready connections: adaptive (newest first while a queue stands, every eighth read the oldest past 1 s) or fifo [default: adaptive]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_order: Option<ReadyOrder>,
    /// Pace a broadcast while shakes wait in the kernel longer than this; 0 never [default: 0]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broadcast_yield_ms: Option<u32>,
    /// Cluster mode: Redis Cluster nodes, redis://HOST:PORT[,…] (docs/scale-out.md)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<String>,
    /// Cluster mode: the PostgreSQL ledger, postgres://USER@HOST:PORT/DB (no password:
    /// that comes from HONGBAO_POSTGRES_PASSWORD or --postgres-password-file)
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres: Option<String>,
    /// Cluster mode: a file holding the PostgreSQL password
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres_password_file: Option<PathBuf>,
    /// Cluster mode: a file holding the Redis ACL user's password (the user is the URL's,
    /// redis://USER@HOST:PORT); or HONGBAO_REDIS_PASSWORD
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_password_file: Option<PathBuf>,
    /// Cluster mode: this host's name, unique among the gateways
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_name: Option<String>,
    /// TOML file giving any of the options above (and the rest: see docs/admin-api.md)
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

impl ServeFlags {
    /// The flags as a `hongbao serve` command line (after `serve`), in name order.
    pub fn to_args(&self) -> Vec<String> {
        let table = self.table().expect("every flag is a TOML string or number");
        let mut args = Vec::with_capacity(2 * table.len() + 2);
        for (name, value) in table {
            args.push(format!("--{}", name.replace('_', "-")));
            args.push(match value {
                toml::Value::String(s) => s,
                other => other.to_string(),
            });
        }
        if let Some(file) = &self.config {
            args.push("--config".into());
            args.push(file.display().to_string());
        }
        args
    }

    /// Puts these flags on `command` (a `hongbao … serve`), all but the login secret,
    /// which goes in its environment (`HONGBAO_SECRET`): a command line is seen by every
    /// local user.
    pub fn apply(&self, command: &mut std::process::Command) {
        let shown = ServeFlags {
            secret: None,
            ..self.clone()
        };
        command.args(shown.to_args());
        if let Some(secret) = &self.secret {
            command.env("HONGBAO_SECRET", secret);
        }
    }

    /// The flags given, as a TOML table of `ServeConfig` fields.
    fn table(&self) -> Result<toml::Table> {
        toml::Table::try_from(self).map_err(|e| Error::config(format!("flags: {e}")))
    }
}

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

/// The settings a SIGHUP applies to the running server (`Supervisor::reload_config`):
/// the login keys and token rules, the certificate, the user limits and the idle timeout.
/// Any other setting changed in the file takes effect at the next start (or upgrade), and
/// the reload names it.
pub const RELOADED: [&str; 13] = [
    "login_keys",
    "secret",
    "secret_file",
    "token_leeway_secs",
    "token_audience",
    "max_token_lifetime_secs",
    "refresh_before_secs",
    "hmac_login",
    "demo_login",
    "tls_cert",
    "tls_key",
    "user_limits",
    "idle_timeout_secs",
];

/// Every option of `hongbao serve`; each can be given in the TOML file under the same name.
#[derive(Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
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
    /// Answer `GET /token?user=N` on the WebSocket and HTTP addresses so the browser page
    /// can log in as anyone: a demo, only when asked for, only on loopback addresses.
    pub demo_login: bool,
    /// Holds `ledger.sqlite`.
    pub data_dir: PathBuf,
    /// TLS on every client listener and the admin address: the certificate chain (PEM,
    /// leaf first) and its key; "" for none (plain TCP).
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// Cluster mode: the CA certificates (PEM) the engines' TLS (Redis's, PostgreSQL's)
    /// is trusted by; "" for `HONGBAO_TLS_CA`'s file, or none. `tls_ca`, its name before,
    /// is still read.
    #[serde(alias = "tls_ca")]
    pub engines_ca: PathBuf,
    /// `engines_ca` read.
    #[serde(skip)]
    pub engines_ca_pem: Option<Vec<u8>>,
    /// Gateway worker processes: a number, or "auto".
    pub workers: String,
    /// Connections the server should be able to hold (sizes `workers = "auto"`).
    pub connections: u64,
    /// With no `login_keys`, login tokens are JWTs signed HS256 with this secret (kid
    /// `hongbao`). Taken, first found, from `--secret` (development only: it warns),
    /// `HONGBAO_SECRET`, `secret_file`, this.
    pub secret: String,
    /// The keys login tokens are verified with, by `kid` (`[[login_keys]]`); none: the
    /// secret, as HS256 key `hongbao`.
    pub login_keys: Vec<LoginKeyConfig>,
    /// Clock skew allowed on a token's `exp`, `nbf` and `iat`.
    pub token_leeway_secs: u64,
    /// When set, a token's `aud` must name it.
    pub token_audience: String,
    /// The longest a token may live (`exp - iat`); longer ones are refused.
    pub max_token_lifetime_secs: u64,
    /// A session is asked for a fresh token this long before its own expires.
    pub refresh_before_secs: u32,
    /// Accept the old login token, HMAC-SHA256(secret, user id), in a protocol-version-1
    /// login (the shared C floor client's); such a session lasts `max_token_lifetime_secs`.
    pub hmac_login: bool,
    /// Addresses of the proxies in front (nginx): a connection from one of them names
    /// its client — a PROXY protocol header first on the binary-frame address, `X-Real-IP`
    /// on the HTTP and WebSocket ones — and the limits per source count that client.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Limits per user (`[user_limits]`: `shake`, `send`, `open`, `chat`, `login` as
    /// `{ per_sec, burst }`, and `notices_per_minute`); docs/security.md says the defaults.
    pub user_limits: UserLimits,
    /// A file holding `secret` ("" for none).
    pub secret_file: PathBuf,
    /// A file holding the PostgreSQL password ("" for none: `HONGBAO_POSTGRES_PASSWORD`,
    /// or none at all).
    pub postgres_password_file: PathBuf,
    /// A file holding the Redis ACL user's password ("" for none:
    /// `HONGBAO_REDIS_PASSWORD`, or none at all).
    pub redis_password_file: PathBuf,
    /// The engines' passwords, as read from their files or the environment.
    #[serde(skip)]
    pub postgres_password: Option<String>,
    #[serde(skip)]
    pub redis_password: Option<String>,
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
    /// On SIGTERM, the connections are let go over this many seconds, each told to come
    /// back in about a second, not kicked at once (`worker/drain.rs`); 0: at once, as
    /// SIGINT does.
    pub drain_secs: u32,
    /// In an upgrade, the fastest the old server lets its connections go, a second, and
    /// only while the new server logs them in again (at most a hundredth on their way);
    /// its window, the ceiling, is twice `connections / this` seconds (never under
    /// `drain_secs`); 0: `UPGRADE_ADMIT_PER_CORE` (TLS or plain) times the cores.
    pub upgrade_admit_per_sec: u32,
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
    /// The monitor's key: `HONGBAO_MONITOR_KEY`, else this file's (`hongbao monitor`
    /// makes it).
    pub monitor_key_file: PathBuf,
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
    /// The flags this was loaded with: a reload (SIGHUP) reads the file again under them.
    #[serde(skip)]
    pub flags: Option<ServeFlags>,
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

/// One `[[login_keys]]` entry: a key login tokens may be signed with, by `kid`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoginKeyConfig {
    pub kid: String,
    /// `HS256`, `ES256` or `EdDSA`: the only algorithm this key verifies.
    pub alg: String,
    /// HS256: a file holding the secret (its first line).
    #[serde(default)]
    pub secret_file: PathBuf,
    /// ES256 and EdDSA: a file holding the public key (PEM, SubjectPublicKeyInfo).
    #[serde(default)]
    pub public_key_file: PathBuf,
}

impl LoginKeyConfig {
    /// The key as the verifier takes it, read from its file.
    pub fn spec(&self) -> Result<KeySpec> {
        let alg: Alg = self
            .alg
            .parse()
            .map_err(|e| Error::config(format!("login key {:?}: {e}", self.kid)))?;
        if self.kid.is_empty() {
            return Err(Error::config("a login key with no kid".to_string()));
        }
        let (file, wrong) = match alg {
            Alg::HS256 => (&self.secret_file, &self.public_key_file),
            Alg::ES256 | Alg::EdDSA => (&self.public_key_file, &self.secret_file),
        };
        let wanted = if alg == Alg::HS256 {
            "secret_file"
        } else {
            "public_key_file"
        };
        if file.as_os_str().is_empty() || !wrong.as_os_str().is_empty() {
            return Err(Error::config(format!(
                "login key {:?} ({}) takes {wanted} and nothing else",
                self.kid,
                alg.name()
            )));
        }
        let material = match alg {
            Alg::HS256 => crate::access::read_secret_file(file).map(String::into_bytes),
            Alg::ES256 | Alg::EdDSA => std::fs::read(file),
        }
        .map_err(|e| {
            Error::config(format!(
                "login key {:?}: reading {}: {e}",
                self.kid,
                file.display()
            ))
        })?;
        let spec = KeySpec {
            kid: self.kid.clone(),
            alg,
            material,
        };
        // A file read but holding no usable key is named too (a reload that finds one
        // keeps the running keys, and the operator must know which file to mend).
        hongbao_proto::token::Verifier::new(std::slice::from_ref(&spec), Default::default())
            .map_err(|e| Error::config(format!("{}: {e}", file.display())))?;
        Ok(spec)
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: "127.0.0.1:7000".into(),
            admin: "127.0.0.1:7001".into(),
            admin_hosts: Vec::new(),
            admin_origins: Vec::new(),
            ws_listen: String::new(),
            http_listen: String::new(),
            demo_login: false,
            data_dir: PathBuf::from("hongbao-data"),
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
            engines_ca: PathBuf::new(),
            engines_ca_pem: None,
            workers: "auto".into(),
            connections: 20_000,
            secret: DEV_SECRET.into(),
            secret_file: PathBuf::new(),
            login_keys: Vec::new(),
            token_leeway_secs: 30,
            token_audience: String::new(),
            max_token_lifetime_secs: 24 * 3600,
            refresh_before_secs: 60,
            hmac_login: false,
            user_limits: UserLimits::default(),
            trusted_proxies: Vec::new(),
            postgres_password_file: PathBuf::new(),
            redis_password_file: PathBuf::new(),
            postgres_password: None,
            redis_password: None,
            max_shake_qps: 100_000,
            packet_ttl_secs: 24 * 3600,
            login_timeout_secs: 10,
            max_unauthenticated: 16_384,
            max_unauthenticated_per_source: 4_096,
            max_tls_handshakes: 0,
            tls_handshake_timeout_secs: 10,
            tls_accept_queue_secs: DEFAULT_TLS_ACCEPT_QUEUE_SECS,
            drain_secs: DEFAULT_DRAIN_SECS,
            upgrade_admit_per_sec: 0,
            idle_timeout_secs: 0,
            http_keepalive_secs: 75,
            max_output_bytes: 256 * 1024,
            commit_window_ms: 2,
            commit_max_batch: 4096,
            commit_interval_ms: 20,
            monitor: String::new(),
            monitor_key_file: PathBuf::from("hongbao-monitor.key"),
            max_queue_ms: 0,
            ready_order: ReadyOrder::Adaptive,
            broadcast_yield_ms: 0,
            redis: String::new(),
            postgres: String::new(),
            host_name: String::new(),
            flags: None,
        }
    }
}

/// `None` for an empty path (a file not given).
fn file(path: &Path) -> Option<&Path> {
    (!path.as_os_str().is_empty()).then_some(path)
}

/// A secret from the environment variable `env`, else from `file` (its first line,
/// trimmed), else none. The variable wins, so a deployment can override a file.
pub fn secret_from(env: &str, file: Option<&Path>) -> Result<Option<String>> {
    if let Some(value) = std::env::var_os(env) {
        let value = value
            .into_string()
            .map_err(|_| Error::config(format!("{env} is not UTF-8")))?;
        return Ok(Some(value));
    }
    match file {
        Some(path) => crate::access::read_secret_file(path)
            .map(Some)
            .map_err(|e| Error::config(format!("reading {}: {e}", path.display()))),
        None => Ok(None),
    }
}

impl ServeConfig {
    /// The defaults, overlaid with the flags' `--config` file when given, then with the
    /// flags: one TOML table laid over another, read as one.
    pub fn load(flags: &ServeFlags) -> Result<ServeConfig> {
        let mut table = match &flags.config {
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| Error::config(format!("reading {}: {e}", file.display())))?;
                toml::from_str::<toml::Table>(&text)
                    .map_err(|e| Error::config(format!("{}: {e}", file.display())))?
            }
            None => toml::Table::new(),
        };
        table.extend(flags.table()?);
        let what = flags.config.as_ref().map_or("flags".to_string(), |f| {
            format!("{} and flags", f.display())
        });
        let mut cfg: ServeConfig = table
            .try_into()
            .map_err(|e| Error::config(format!("{what}: {e}")))?;
        cfg.read_secrets(flags.secret.is_some())?;
        cfg.flags = Some(flags.clone());
        Ok(cfg)
    }

    /// The secrets, from where they are kept out of sight: the login secret from
    /// `HONGBAO_SECRET` or `secret_file` (unless `--secret` gave it, which warns), the
    /// engines' passwords from their files or the environment.
    fn read_secrets(&mut self, from_flag: bool) -> Result<()> {
        if from_flag {
            tracing::warn!(
                "--secret puts the login secret on a command line every local user can read \
                 (ps): for development only; use HONGBAO_SECRET or secret_file"
            );
        } else if let Some(secret) = secret_from("HONGBAO_SECRET", file(&self.secret_file))? {
            self.secret = secret;
        }
        self.postgres_password = secret_from(
            "HONGBAO_POSTGRES_PASSWORD",
            file(&self.postgres_password_file),
        )?;
        self.redis_password =
            secret_from("HONGBAO_REDIS_PASSWORD", file(&self.redis_password_file))?;
        let ca = match file(&self.engines_ca) {
            Some(path) => Some(path.to_path_buf()),
            None => std::env::var_os(hongbao_http::tls::CA_ENV).map(PathBuf::from),
        };
        self.engines_ca_pem = match ca {
            Some(path) => Some(std::fs::read(&path).map_err(|e| {
                Error::config(format!("reading the CA file {}: {e}", path.display()))
            })?),
            None => None,
        };
        Ok(())
    }

    /// The defaults overlaid with TOML file `file`.
    pub fn from_file(file: &Path) -> Result<ServeConfig> {
        ServeConfig::load(&ServeFlags {
            config: Some(file.to_path_buf()),
            ..Default::default()
        })
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

    /// The login keys, read from their files: `login_keys`, or with none the secret as
    /// HS256 key `hongbao`. Each is checked usable (a verifier is made of them).
    pub fn login_specs(&self) -> Result<Vec<KeySpec>> {
        let specs = if self.login_keys.is_empty() {
            vec![KeySpec {
                kid: DEFAULT_KID.into(),
                alg: Alg::HS256,
                material: self.secret.as_bytes().to_vec(),
            }]
        } else {
            self.login_keys
                .iter()
                .map(LoginKeyConfig::spec)
                .collect::<Result<_>>()?
        };
        hongbao_proto::token::Verifier::new(&specs, self.token_rules()).map_err(Error::config)?;
        Ok(specs)
    }

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

    /// The settings, by name, that `next` gives other values than this one does and that
    /// a reload does not apply (not in [`RELOADED`]): they wait for the next start.
    pub fn changed_for_next_start(&self, next: &ServeConfig) -> Vec<String> {
        let table = |cfg: &ServeConfig| match serde_json::to_value(cfg) {
            Ok(serde_json::Value::Object(map)) => map,
            other => {
                tracing::warn!(?other, "the settings could not be compared");
                serde_json::Map::new()
            }
        };
        let (now, then) = (table(self), table(next));
        now.iter()
            .filter(|(name, value)| {
                !RELOADED.contains(&name.as_str()) && then.get(name.as_str()) != Some(value)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The TLS certificate and key read (and checked usable), when TLS is on.
    pub fn tls_pem(&self) -> Result<Option<TlsPem>> {
        let Some(files) = self.tls_files()? else {
            return Ok(None);
        };
        let (cert, key) = files.read().map_err(Error::config)?;
        hongbao_http::tls::server_config(&cert, &key, &[]).map_err(Error::config)?;
        Ok(Some(TlsPem {
            cert,
            key,
            ticket_key: hongbao_http::tls::new_ticket_key(),
        }))
    }

    /// What a token must satisfy beyond its signature.
    pub fn token_rules(&self) -> Rules {
        Rules {
            leeway_secs: self.token_leeway_secs,
            audience: (!self.token_audience.is_empty()).then(|| self.token_audience.clone()),
            max_lifetime_secs: self.max_token_lifetime_secs,
        }
    }

    /// Whether the built-in development secret signs anything here: the login key made
    /// of it, or the old HMAC tokens.
    pub fn dev_secret_in_use(&self) -> bool {
        self.secret == DEV_SECRET && (self.login_keys.is_empty() || self.hmac_login)
    }

    /// Refuses what would hand out logins to the network: the development secret (which
    /// anyone can read in our source) on a listener beyond loopback, and the demo
    /// login (any user's token for the asking) beyond loopback.
    pub fn check_exposure(&self) -> Result<()> {
        let listeners = [
            ("listen", &self.listen, false),
            ("ws_listen", &self.ws_listen, true),
            ("http_listen", &self.http_listen, true),
            ("admin", &self.admin, false),
        ];
        for (name, addr, serves_demo) in listeners {
            if addr.is_empty() {
                continue;
            }
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return Err(Error::config(format!(
                    "{name} = {addr:?} is not an IP address and port: give one such as \
                     127.0.0.1:7000 (names such as localhost are not looked up)"
                )));
            }
            let local = hongbao_sys::net::is_loopback_address(addr);
            if !local && self.dev_secret_in_use() {
                return Err(Error::config(format!(
                    "{name} = {addr:?} is not a loopback address, and login tokens are \
                     signed with the built-in development secret, which anyone can read: \
                     give a secret (HONGBAO_SECRET or secret_file) or [[login_keys]], or \
                     listen on 127.0.0.1"
                )));
            }
            if !local && serves_demo && self.demo_login {
                return Err(Error::config(format!(
                    "demo_login hands anyone any user's token: {name} = {addr:?} must be a \
                     loopback address for it"
                )));
            }
        }
        Ok(())
    }

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

    /// `max_tls_handshakes` for each of `workers` on `cores`: as given, or (0) an even
    /// share of `cores × TLS_HANDSHAKES_PER_CORE`, at least 16.
    pub fn tls_handshakes_per_worker(&self, workers: usize, cores: usize) -> u32 {
        if self.max_tls_handshakes > 0 {
            return self.max_tls_handshakes;
        }
        let machine = TLS_HANDSHAKES_PER_CORE as usize * cores.max(1);
        (machine / workers.max(1)).max(16) as u32
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

    /// A reload names every setting it does not apply that the file changed, and none
    /// that it applies or that stayed.
    #[test]
    fn a_reload_names_the_settings_that_wait_for_the_next_start() {
        let now = ServeConfig::default();
        let next = ServeConfig {
            listen: "127.0.0.1:1".into(),
            max_queue_ms: now.max_queue_ms + 1,
            idle_timeout_secs: now.idle_timeout_secs + 1,
            token_leeway_secs: now.token_leeway_secs + 1,
            ..now.clone()
        };
        let mut waiting = now.changed_for_next_start(&next);
        waiting.sort();
        assert_eq!(waiting, ["listen", "max_queue_ms"]);
        assert!(now.changed_for_next_start(&now.clone()).is_empty());
        // Every name a reload applies is a setting.
        let names = serde_json::to_value(&now).unwrap();
        for name in RELOADED {
            assert!(names.get(name).is_some(), "{name}");
        }
    }

    #[test]
    fn auto_workers_follow_the_file_limit_and_cores() {
        let mut cfg = ServeConfig {
            connections: 1_000_000,
            ..Default::default()
        };
        assert_eq!(cfg.worker_count(20_000, 2).unwrap(), 56);
        // A million over TLS: 4,096 handshakes under way on 2 cores, 73 in each of 56.
        assert_eq!(cfg.tls_handshakes_per_worker(56, 2), 73);
        assert_eq!(cfg.tls_handshakes_per_worker(12, 2), 341);
        assert_eq!(cfg.tls_handshakes_per_worker(1024, 2), 16);
        cfg.max_tls_handshakes = 256;
        assert_eq!(cfg.tls_handshakes_per_worker(56, 2), 256);
        cfg.max_tls_handshakes = 0;
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
        let cfg = ServeConfig::from_file(&path).unwrap();
        assert_eq!((cfg.workers.as_str(), cfg.max_shake_qps), ("4", 500));
        std::fs::write(&path, "ready_order = \"fifo\"\n").unwrap();
        let cfg = ServeConfig::from_file(&path).unwrap();
        assert_eq!(cfg.ready_order, ReadyOrder::Fifo);
        assert_eq!(ServeConfig::default().ready_order, ReadyOrder::Adaptive);
        std::fs::write(&path, "ready_order = \"lifo\"\n").unwrap();
        assert!(ServeConfig::from_file(&path).is_err());
        assert_eq!("fifo".parse(), Ok(ReadyOrder::Fifo));
        assert!("lifo".parse::<ReadyOrder>().is_err());
        std::fs::write(&path, "wrokers = 4\n").unwrap();
        assert!(ServeConfig::from_file(&path).is_err());
    }

    #[test]
    fn flags_win_over_the_file_and_render_back_as_they_parse() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            flags: ServeFlags,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hongbao.toml");
        std::fs::write(
            &path,
            "workers = \"4\"\nmax_shake_qps = 500\nidle_timeout_secs = 9\n",
        )
        .unwrap();
        let args = [
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--max-shake-qps",
            "700",
            "--ready-order",
            "fifo",
            "--data-dir",
            "/tmp/x y",
            "--connections",
            "30000",
        ];
        let flags = Cli::parse_from(args).flags;
        let cfg = ServeConfig::load(&flags).unwrap();
        assert_eq!(cfg.workers, "4", "from the file");
        assert_eq!(cfg.idle_timeout_secs, 9, "a file-only option");
        assert_eq!(cfg.max_shake_qps, 700, "the flag wins");
        assert_eq!(cfg.ready_order, ReadyOrder::Fifo);
        assert_eq!(cfg.data_dir, PathBuf::from("/tmp/x y"));
        assert_eq!(cfg.connections, 30_000);
        assert_eq!(cfg.listen, ServeConfig::default().listen, "a default");
        // Rendered and parsed again: the same flags.
        let rendered = flags.to_args();
        let again =
            Cli::parse_from(std::iter::once("serve".to_string()).chain(rendered.clone())).flags;
        assert_eq!(again, flags, "{rendered:?}");
        assert!(rendered.windows(2).any(|w| w == ["--max-shake-qps", "700"]));
        // Nothing given: the defaults.
        let none = ServeConfig::load(&ServeFlags::default()).unwrap();
        assert_eq!(none.listen, ServeConfig::default().listen);
        assert!(ServeFlags::default().to_args().is_empty());
    }
}
