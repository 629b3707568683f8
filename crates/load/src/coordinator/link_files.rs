//! The agent link's key and TLS files (docs/agents.md): the coordinator's door serves
//! with the certificate, and agents join with the key and trust the CA.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::agent::link;
use crate::error::{Error, Result};

/// The key and TLS files of the agent link in a directory: used when there, made when
/// not (a key of 256 bits, a throwaway CA and a certificate for the listen address).
pub(super) struct LinkFiles {
    pub(super) key: String,
    pub(super) key_file: PathBuf,
    pub(super) ca_file: PathBuf,
    cert: Vec<u8>,
    cert_key: Vec<u8>,
}

impl LinkFiles {
    pub(super) fn ensure(dir: &Path, listen: SocketAddr, names: &[String]) -> Result<LinkFiles> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let key_file = dir.join(link::KEY_FILE);
        let key = hongbao_http::access::run_key(link::KEY_ENV, &key_file, true)
            .map_err(|e| Error::io(format!("the agent key {}", key_file.display()), e))?
            .expect("made when missing");
        let (ca_file, cert_file, cert_key_file) = (
            dir.join(link::CA_FILE),
            dir.join(link::CERT_FILE),
            dir.join(link::CERT_KEY_FILE),
        );
        if !cert_file.exists() || !cert_key_file.exists() {
            let mut all = vec!["localhost".to_string(), "127.0.0.1".to_string()];
            if !listen.ip().is_unspecified() {
                all.push(listen.ip().to_string());
            }
            all.extend(names.iter().cloned());
            all.dedup();
            let names: Vec<&str> = all.iter().map(String::as_str).collect();
            let certs = hongbao_http::tls::DevCerts::make(&names)?;
            certs.write(dir).map_err(|e| {
                Error::io(
                    format!("writing the agent link's certificate in {}", dir.display()),
                    e,
                )
            })?;
            tracing::info!(dir = %dir.display(), names = ?all, "made the agent link's CA and certificate");
        }
        Ok(LinkFiles {
            key,
            key_file,
            cert: read(&cert_file)?,
            cert_key: read(&cert_key_file)?,
            ca_file,
        })
    }

    pub(super) fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        Ok(hongbao_http::tls::server_config(
            &self.cert,
            &self.cert_key,
            &[link::ALPN],
        )?)
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))
}
