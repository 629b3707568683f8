//! The flags of `hongbao serve`: each a setting under its own name, laid over the file
//! (`ServeConfig::load`), and rendered back into a command line (`ServeFlags::to_args`),
//! which the bench, the lab and the scripts start `serve` with.

use std::path::PathBuf;

use serde::Serialize;

use super::ReadyOrder;
use crate::error::{Error, Result};

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
    /// that comes from HONGBAO_POSTGRES_PASSWORD or --postgres-password-file); a sharded
    /// ledger's formations separated by ';', shard 0 first
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres: Option<String>,
    /// Cluster mode: the shard map's version, recorded in every formation [default: 1]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_map_version: Option<u32>,
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
    /// Cluster mode: how many Redis hash tags the release of campaign packets is split
    /// over, the same on every host (docs/scale-out.md) [default: 1]
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_tags: Option<u32>,
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
    pub(super) fn table(&self) -> Result<toml::Table> {
        toml::Table::try_from(self).map_err(|e| Error::config(format!("flags: {e}")))
    }
}
