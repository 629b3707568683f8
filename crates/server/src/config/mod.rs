//! `hongbao serve` settings: defaults, then the TOML file, then command-line flags.
//!
//! Each option has one spelling: a field of its section, the same name in the TOML file,
//! and `--the-same-name` as a flag (`ServeFlags`, `flags.rs`). The settings come in
//! sections (`SECTIONS`), each with its defaults, what it derives, and whether a reload
//! (SIGHUP) applies it: `tokens.rs` is the login's, `sections.rs` the others'. In the file
//! a setting may sit at the top or in its section's table (`[overload]` with
//! `max_queue_ms = 200` under it). The flags are laid over the file as one more TOML
//! table (`ServeConfig::load`), and rendered back into a command line by one function
//! (`ServeFlags::to_args`), which the bench, the lab and the scripts (through `hongbao
//! bench --print-serve-args`) start `serve` with.

mod flags;
mod sections;
mod tokens;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use flags::ServeFlags;
pub use sections::{
    Admission, Cluster, Ledger, Listeners, Overload, Processes, ReadyOrder, Telemetry, Tls, TlsPem,
    DEFAULT_DRAIN_SECS, DEFAULT_TLS_ACCEPT_QUEUE_SECS, TLS_HANDSHAKES_PER_CORE,
    UPGRADE_ADMIT_PER_CORE,
};
pub use tokens::{secret_from, LoginKeyConfig, Tokens, DEV_SECRET};

/// Whether a reload (SIGHUP) applies a section's settings to the running server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// At once: the workers take them in a new welcome.
    Live,
    /// At the next start (or upgrade); a reload that finds them changed names them.
    NextStart,
}

/// Every section: its table's name in the file, and whether a reload applies it.
pub const SECTIONS: [(&str, Reload); 10] = [
    ("listeners", Reload::NextStart),
    ("tokens", Reload::Live),
    ("tls", Reload::Live),
    ("admission", Reload::NextStart),
    ("limits", Reload::Live),
    ("overload", Reload::Live),
    ("ledger", Reload::NextStart),
    ("cluster", Reload::NextStart),
    ("processes", Reload::NextStart),
    ("telemetry", Reload::NextStart),
];

/// Every option of `hongbao serve`, by section; the file names each as a flat key (or
/// under its section's table).
#[derive(Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct ServeConfig {
    #[serde(flatten)]
    pub listeners: Listeners,
    #[serde(flatten)]
    pub tokens: Tokens,
    #[serde(flatten)]
    pub tls: Tls,
    #[serde(flatten)]
    pub admission: Admission,
    #[serde(flatten)]
    pub limits: Limits,
    #[serde(flatten)]
    pub overload: Overload,
    #[serde(flatten)]
    pub ledger: Ledger,
    #[serde(flatten)]
    pub cluster: Cluster,
    #[serde(flatten)]
    pub processes: Processes,
    #[serde(flatten)]
    pub telemetry: Telemetry,
    /// The flags this was loaded with: a reload (SIGHUP) reads the file again under them.
    #[serde(skip)]
    pub flags: Option<ServeFlags>,
}

pub use sections::Limits;

/// The settings of a section, by name, as the file spells them.
fn names_of(section: &str) -> Vec<String> {
    let cfg = ServeConfig::default();
    let value = match section {
        "listeners" => serde_json::to_value(&cfg.listeners),
        "tokens" => serde_json::to_value(&cfg.tokens),
        "tls" => serde_json::to_value(&cfg.tls),
        "admission" => serde_json::to_value(&cfg.admission),
        "limits" => serde_json::to_value(&cfg.limits),
        "overload" => serde_json::to_value(&cfg.overload),
        "ledger" => serde_json::to_value(&cfg.ledger),
        "cluster" => serde_json::to_value(&cfg.cluster),
        "processes" => serde_json::to_value(&cfg.processes),
        "telemetry" => serde_json::to_value(&cfg.telemetry),
        _ => Ok(serde_json::Value::Null),
    };
    match value {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Older names still read, and the settings' names now.
const OLDER_NAMES: [(&str, &str); 1] = [("tls_ca", "engines_ca")];

/// The settings a reload applies: those of the `Reload::Live` sections.
pub fn reloaded() -> Vec<String> {
    SECTIONS
        .iter()
        .filter(|(_, reload)| *reload == Reload::Live)
        .flat_map(|(name, _)| names_of(name))
        .collect()
}

/// A configuration file's setting that is none, or is given twice.
#[derive(Debug, thiserror::Error)]
enum BadFile {
    #[error("[{section}] has no setting `{name}`: it takes {takes}")]
    NotInSection {
        section: &'static str,
        name: String,
        takes: String,
    },
    #[error("`{name}` is given twice: at the top and in [{section}]")]
    Twice { name: String, section: &'static str },
    /// Worded as serde's `deny_unknown_fields` was (the docs test reads the list).
    #[error(
        "unknown field `{name}` (a setting may also sit in its section's table: {sections}), \
         expected one of {expected}"
    )]
    Unknown {
        name: String,
        sections: String,
        expected: String,
    },
}

/// `table` (a file's) with every section's table laid out flat: `[overload]
/// max_queue_ms = 200` is `max_queue_ms = 200`. A section's table may hold only its own
/// settings, and a setting given both at the top and in its section is refused.
fn flat(mut table: toml::Table) -> std::result::Result<toml::Table, BadFile> {
    for (section, _) in SECTIONS {
        let Some(toml::Value::Table(inner)) = table.get(section).cloned() else {
            continue;
        };
        table.remove(section);
        let own = names_of(section);
        for (name, value) in inner {
            let known = own.contains(&name)
                || OLDER_NAMES
                    .iter()
                    .any(|(old, new)| *old == name && own.iter().any(|n| n == new));
            if !known {
                let takes = own.join(", ");
                return Err(BadFile::NotInSection {
                    section,
                    name,
                    takes,
                });
            }
            if table.insert(name.clone(), value).is_some() {
                return Err(BadFile::Twice { name, section });
            }
        }
    }
    Ok(table)
}

/// Refuses a name in `table` that is no setting (a typo would otherwise be ignored).
fn unknown(table: &toml::Table) -> std::result::Result<(), BadFile> {
    let all: Vec<String> = SECTIONS.iter().flat_map(|(s, _)| names_of(s)).collect();
    let older = |name: &str| OLDER_NAMES.iter().any(|(old, _)| *old == name);
    match table
        .keys()
        .find(|name| !all.contains(name) && !older(name))
    {
        Some(name) => {
            let sections: Vec<String> = SECTIONS.iter().map(|(s, _)| format!("[{s}]")).collect();
            let expected: Vec<String> = all.iter().map(|n| format!("`{n}`")).collect();
            Err(BadFile::Unknown {
                name: name.clone(),
                sections: sections.join(", "),
                expected: expected.join(", "),
            })
        }
        None => Ok(()),
    }
}

/// `None` for an empty path (a file not given).
pub(super) fn file(path: &Path) -> Option<&Path> {
    (!path.as_os_str().is_empty()).then_some(path)
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
        if let Some(file) = &flags.config {
            table = flat(table).map_err(|e| Error::config(format!("{}: {e}", file.display())))?;
        }
        table.extend(flags.table()?);
        let what = flags.config.as_ref().map_or("flags".to_string(), |f| {
            format!("{} and flags", f.display())
        });
        unknown(&table).map_err(|e| Error::config(format!("{what}: {e}")))?;
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
        } else if let Some(secret) = secret_from("HONGBAO_SECRET", file(&self.tokens.secret_file))?
        {
            self.tokens.secret = secret;
        }
        self.cluster.postgres_password = secret_from(
            "HONGBAO_POSTGRES_PASSWORD",
            file(&self.cluster.postgres_password_file),
        )?;
        self.cluster.redis_password = secret_from(
            "HONGBAO_REDIS_PASSWORD",
            file(&self.cluster.redis_password_file),
        )?;
        let ca = match file(&self.cluster.engines_ca) {
            Some(path) => Some(path.to_path_buf()),
            None => std::env::var_os(hongbao_http::tls::CA_ENV).map(PathBuf::from),
        };
        self.cluster.engines_ca_pem = match ca {
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

    /// The settings, by name, that `next` gives other values than this one does and that
    /// a reload does not apply (not in a `Reload::Live` section): they wait for the next start.
    pub fn changed_for_next_start(&self, next: &ServeConfig) -> Vec<String> {
        let table = |cfg: &ServeConfig| match serde_json::to_value(cfg) {
            Ok(serde_json::Value::Object(map)) => map,
            other => {
                tracing::warn!(?other, "the settings could not be compared");
                serde_json::Map::new()
            }
        };
        let (now, then) = (table(self), table(next));
        let reloaded = reloaded();
        now.iter()
            .filter(|(name, value)| {
                !reloaded.contains(name) && then.get(name.as_str()) != Some(value)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Refuses what would hand out logins to the network: the development secret (which
    /// anyone can read in our source) on a listener beyond loopback, and the demo
    /// login (any user's token for the asking) beyond loopback.
    pub fn check_exposure(&self) -> Result<()> {
        let listeners = [
            ("listen", &self.listeners.listen, false),
            ("ws_listen", &self.listeners.ws_listen, true),
            ("http_listen", &self.listeners.http_listen, true),
            ("admin", &self.listeners.admin, false),
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
            if !local && self.tokens.dev_secret_in_use() {
                return Err(Error::config(format!(
                    "{name} = {addr:?} is not a loopback address, and login tokens are \
                     signed with the built-in development secret, which anyone can read: \
                     give a secret (HONGBAO_SECRET or secret_file) or [[login_keys]], or \
                     listen on 127.0.0.1"
                )));
            }
            if !local && serves_demo && self.tokens.demo_login {
                return Err(Error::config(format!(
                    "demo_login hands anyone any user's token: {name} = {addr:?} must be a \
                     loopback address for it"
                )));
            }
        }
        Ok(())
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
        let mut next = now.clone();
        next.listeners.listen = "127.0.0.1:1".into();
        next.processes.drain_secs += 1;
        // Applied: [overload], [limits], [tokens].
        next.overload.max_queue_ms += 1;
        next.limits.idle_timeout_secs += 1;
        next.tokens.token_leeway_secs += 1;
        let mut waiting = now.changed_for_next_start(&next);
        waiting.sort();
        assert_eq!(waiting, ["drain_secs", "listen"]);
        assert!(now.changed_for_next_start(&now.clone()).is_empty());
        // Every name a reload applies is a setting, of a live section.
        let names = serde_json::to_value(&now).unwrap();
        let reloaded = reloaded();
        for name in &reloaded {
            assert!(names.get(name).is_some(), "{name}");
        }
        for name in [
            "login_keys",
            "tls_cert",
            "user_limits",
            "max_shake_qps",
            "demo_login",
        ] {
            assert!(reloaded.iter().any(|r| r == name), "{name}");
        }
    }

    #[test]
    fn every_setting_is_in_one_section() {
        let all: Vec<String> = SECTIONS.iter().flat_map(|(s, _)| names_of(s)).collect();
        let names = serde_json::to_value(ServeConfig::default()).unwrap();
        let names = names.as_object().unwrap();
        assert_eq!(all.len(), names.len());
        for name in names.keys() {
            assert_eq!(all.iter().filter(|n| *n == name).count(), 1, "{name}");
        }
    }

    #[test]
    fn a_setting_may_sit_in_its_sections_table_and_only_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hongbao.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            ServeConfig::from_file(&path)
        };
        let cfg = load("workers = \"4\"\n[overload]\nmax_queue_ms = 200\n[tls]\n").unwrap();
        assert_eq!(
            (cfg.processes.workers.as_str(), cfg.overload.max_queue_ms),
            ("4", 200)
        );
        // `engines_ca`'s older name, in its section or at the top: read as `engines_ca`
        // (whose file is read at load, and here is not there).
        for text in [
            "[cluster]\ntls_ca = \"/ca.pem\"\n",
            "tls_ca = \"/ca.pem\"\n",
        ] {
            let refused = load(text).err().unwrap().to_string();
            assert!(refused.contains("reading the CA file /ca.pem"), "{refused}");
        }
        let wrong = load("[overload]\nidle_timeout_secs = 5\n").err().unwrap();
        assert!(
            wrong
                .to_string()
                .contains("[overload] has no setting `idle_timeout_secs`"),
            "{wrong}"
        );
        let twice = load("max_queue_ms = 1\n[overload]\nmax_queue_ms = 2\n")
            .err()
            .unwrap();
        assert!(
            twice.to_string().contains("`max_queue_ms` is given twice"),
            "{twice}"
        );
        // [user_limits] is a setting's own table, not a section.
        let cfg = load("[user_limits]\nnotices_per_minute = 7\n").unwrap();
        assert_eq!(cfg.limits.user_limits.notices_per_minute, 7);
    }

    #[test]
    fn toml_gives_options_and_rejects_unknown_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hongbao.toml");
        std::fs::write(&path, "workers = \"4\"\nmax_shake_qps = 500\n").unwrap();
        let cfg = ServeConfig::from_file(&path).unwrap();
        assert_eq!(
            (cfg.processes.workers.as_str(), cfg.overload.max_shake_qps),
            ("4", 500)
        );
        std::fs::write(&path, "ready_order = \"fifo\"\n").unwrap();
        let cfg = ServeConfig::from_file(&path).unwrap();
        assert_eq!(cfg.processes.ready_order, ReadyOrder::Fifo);
        assert_eq!(
            ServeConfig::default().processes.ready_order,
            ReadyOrder::Adaptive
        );
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
        assert_eq!(cfg.processes.workers, "4", "from the file");
        assert_eq!(cfg.limits.idle_timeout_secs, 9, "a file-only option");
        assert_eq!(cfg.overload.max_shake_qps, 700, "the flag wins");
        assert_eq!(cfg.processes.ready_order, ReadyOrder::Fifo);
        assert_eq!(cfg.ledger.data_dir, PathBuf::from("/tmp/x y"));
        assert_eq!(cfg.processes.connections, 30_000);
        assert_eq!(
            cfg.listeners.listen,
            ServeConfig::default().listeners.listen,
            "a default"
        );
        // Rendered and parsed again: the same flags.
        let rendered = flags.to_args();
        let again =
            Cli::parse_from(std::iter::once("serve".to_string()).chain(rendered.clone())).flags;
        assert_eq!(again, flags, "{rendered:?}");
        assert!(rendered.windows(2).any(|w| w == ["--max-shake-qps", "700"]));
        // Nothing given: the defaults.
        let none = ServeConfig::load(&ServeFlags::default()).unwrap();
        assert_eq!(
            none.listeners.listen,
            ServeConfig::default().listeners.listen
        );
        assert!(ServeFlags::default().to_args().is_empty());
    }

    /// The release's tags (cluster mode): 1 unless the file's `[cluster]` or the flag
    /// says otherwise, the flag winning, as every setting.
    #[test]
    fn release_tags_come_from_the_cluster_section_or_the_flag() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            flags: ServeFlags,
        }
        assert_eq!(ServeConfig::default().cluster.release_tags, 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hongbao.toml");
        std::fs::write(&path, "[cluster]\nrelease_tags = 4\n").unwrap();
        assert_eq!(
            ServeConfig::from_file(&path).unwrap().cluster.release_tags,
            4
        );
        let file = path.to_str().unwrap();
        let flags = Cli::parse_from(["serve", "--config", file, "--release-tags", "6"]).flags;
        assert_eq!(ServeConfig::load(&flags).unwrap().cluster.release_tags, 6);
    }
}
