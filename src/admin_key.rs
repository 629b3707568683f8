//! `hongbao admin-key`: make, list and remove the admin keys of a server's ledger — the
//! embedded one in `--data-dir`, or cluster mode's PostgreSQL — while the server runs or
//! not. A key made here works on the server within a second, a removed one stops
//! working within a second (docs/security.md).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use hongbao_money::access::{AccessStore, Role};
use hongbao_server::access::make_key;

#[derive(Subcommand)]
pub enum AdminKeyCommand {
    /// Make a key: prints it once (only its hash is kept)
    Add {
        /// The key's name: what the admin log and the money it mints name
        name: String,
        /// metrics (/metrics, /v1/stats), viewer (every read) or operator (everything)
        #[arg(long)]
        role: Role,
        #[command(flatten)]
        at: Ledger,
    },
    /// List the keys: names, roles, when and by whom made (never the keys)
    List {
        #[command(flatten)]
        at: Ledger,
    },
    /// Remove a key: it stops working within a second (the last operator key stays)
    Remove {
        /// The key's name (as `list` shows it)
        name: String,
        #[command(flatten)]
        at: Ledger,
    },
}

/// Which ledger holds the keys.
#[derive(Args)]
pub struct Ledger {
    /// The embedded ledger's directory (serve's --data-dir)
    #[arg(long, default_value = "hongbao-data")]
    data_dir: PathBuf,
    /// Cluster mode: the PostgreSQL ledger, postgres://USER@HOST:PORT/DB (its password
    /// from HONGBAO_POSTGRES_PASSWORD or --postgres-password-file, never in the URL)
    #[arg(long)]
    postgres: Option<String>,
    /// A file holding the PostgreSQL password
    #[arg(long)]
    postgres_password_file: Option<PathBuf>,
}

impl Ledger {
    fn open(&self) -> Result<Arc<dyn AccessStore>> {
        Ok(match &self.postgres {
            Some(url) => {
                let password = hongbao_server::config::secret_from(
                    "HONGBAO_POSTGRES_PASSWORD",
                    self.postgres_password_file.as_deref(),
                )?;
                let ca = match std::env::var_os(hongbao_http::tls::CA_ENV) {
                    Some(file) => Some(std::fs::read(&file).map_err(|e| {
                        anyhow::anyhow!("reading {}: {e}", std::path::Path::new(&file).display())
                    })?),
                    None => None,
                };
                let target = hongbao_cluster::PgTarget {
                    url: url.clone(),
                    password,
                    ca,
                };
                Arc::new(hongbao_cluster::PgAccess::connect(&target)?)
            }
            None => Arc::new(hongbao_embedded::access::SqliteAccess::open(
                &self.data_dir,
            )?),
        })
    }
}

pub fn run(command: AdminKeyCommand) -> Result<()> {
    match command {
        AdminKeyCommand::Add { name, role, at } => {
            let key = make_key(at.open()?.as_ref(), &name, role, "cli")?;
            eprintln!("admin key {name:?} ({role}) made; it is shown this once:");
            println!("{key}");
        }
        AdminKeyCommand::List { at } => {
            for k in at.open()?.keys()? {
                println!(
                    "{:<24} {:<9} made {} by {}",
                    k.name,
                    k.role,
                    hongbao_sys::clock::utc_text(k.created_ms),
                    k.created_by
                );
            }
        }
        AdminKeyCommand::Remove { name, at } => {
            let store = at.open()?;
            let keys = store.keys()?;
            let Some(key) = keys.iter().find(|k| k.name == name) else {
                bail!("no key named {name:?}");
            };
            let operators = keys.iter().filter(|k| k.role == Role::Operator).count();
            if key.role == Role::Operator && operators == 1 {
                bail!("{name:?} is the last operator key: add another before removing it");
            }
            store.remove_key(&name)?;
            eprintln!("admin key {name:?} removed");
        }
    }
    Ok(())
}
