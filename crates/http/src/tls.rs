//! TLS for hongbao's listeners and clients: rustls on aws-lc-rs, TLS 1.3 and 1.2, one
//! certificate chain and key (PEM) per server.
//!
//! A server's config sits in a `Reloadable`: a new certificate (SIGHUP) replaces it for
//! the connections that come after, and the ones already open keep the config they began
//! with, so a reload drops nothing. Session resumption: TLS 1.3 tickets, stateless (each
//! process's own ticket key), and a session cache for TLS 1.2.
//!
//! `DevCerts` makes a throwaway CA and a certificate it signed, for tests, the lab and
//! trying TLS out; real deployments bring their own.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::ServerConfig;

pub use hongbao_proto::tls::{
    certificates, client_config, provider, TlsError, ALPN_FRAMES, ALPN_HTTP,
};

/// Sessions a server process remembers for TLS 1.2 resumption.
const SESSION_CACHE: usize = 64 * 1024;

/// A certificate chain and its key, as files (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// Both files' bytes: the chain, then the key.
    pub fn read(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        let read = |path: &Path, what: &'static str| {
            std::fs::read(path).map_err(|source| TlsError::File {
                what,
                path: path.display().to_string(),
                source,
            })
        };
        Ok((read(&self.cert, "certificate")?, read(&self.key, "key")?))
    }
}

/// A server config of the chain `cert_pem` and the key `key_pem`, saying `alpn` (the
/// names it speaks; a client offering others is refused, one offering none is served).
/// TLS 1.3 tickets are this process's own.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with(cert_pem, key_pem, alpn, None)
}

/// As `server_config`, the TLS 1.3 tickets sealed with `ticket_key` when given: every
/// process holding it (a server's workers) resumes the others' sessions.
pub fn server_config_with(
    cert_pem: &[u8],
    key_pem: &[u8],
    alpn: &[&[u8]],
    ticket_key: Option<&[u8; 32]>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = certificates(cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::NotAServer(e.to_string()))?;
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
    config.ticketer = match ticket_key {
        Some(key) => Arc::new(SharedTickets::new(key)),
        None => rustls::crypto::aws_lc_rs::Ticketer::new()
            .map_err(|e| TlsError::TicketKey(e.to_string()))?,
    };
    // No 0-RTT: a replayed early shake or send is not worth the round trip saved.
    config.max_early_data_size = 0;
    Ok(Arc::new(config))
}

/// Makes aws-lc-rs the process's rustls provider, for the libraries that ask rustls for
/// the process default (Redis's TLS). Once is enough; again does nothing.
pub fn install_provider() {
    let _ = (*provider()).clone().install_default();
}

/// The environment variable naming the CA file (PEM) our HTTP clients trust for an
/// `https://` address: the monitor's reporters, `load --set-qps`, the bench's admin calls.
pub const CA_ENV: &str = "HONGBAO_TLS_CA";

/// An HTTP client (ureq) that speaks TLS to `https://` addresses with our rustls config,
/// trusting the CA file `HONGBAO_TLS_CA` names (plain `http://` as before).
pub fn agent_builder() -> ureq::AgentBuilder {
    let builder = ureq::AgentBuilder::new();
    let Some(file) = std::env::var_os(CA_ENV) else {
        return builder;
    };
    match std::fs::read(&file)
        .map_err(|e| e.to_string())
        .and_then(|ca| client_config(&ca, &[ALPN_HTTP]).map_err(|e| e.to_string()))
    {
        Ok(config) => builder.tls_connector(Arc::new(UreqTls(config))),
        Err(e) => {
            tracing::warn!(file = ?file, error = %e, "{CA_ENV}: no CA read; https:// addresses will fail");
            builder
        }
    }
}

/// ureq's TLS through our rustls config.
struct UreqTls(Arc<rustls::ClientConfig>);

impl ureq::TlsConnector for UreqTls {
    fn connect(
        &self,
        dns_name: &str,
        io: Box<dyn ureq::ReadWrite>,
    ) -> Result<Box<dyn ureq::ReadWrite>, ureq::Error> {
        let name = rustls::pki_types::ServerName::try_from(dns_name.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let session =
            rustls::ClientConnection::new(self.0.clone(), name).map_err(std::io::Error::other)?;
        Ok(Box::new(UreqStream(rustls::StreamOwned::new(session, io))))
    }
}

struct UreqStream(rustls::StreamOwned<rustls::ClientConnection, Box<dyn ureq::ReadWrite>>);

impl std::fmt::Debug for UreqStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UreqStream(TLS)")
    }
}

impl std::io::Read for UreqStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl std::io::Write for UreqStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl ureq::ReadWrite for UreqStream {
    fn socket(&self) -> Option<&std::net::TcpStream> {
        self.0.sock.socket()
    }
}

/// How long a ticket is good for, as the server tells its clients.
const TICKET_LIFETIME_SECS: u32 = 12 * 3600;

/// TLS 1.3 session tickets sealed (AES-256-GCM, a random nonce each) with a key that
/// several processes share: a server's workers, so that a client resumes its session
/// whichever worker the kernel hands its next connection to. The key lives as long as
/// the server: a new one at every start, none written anywhere.
pub struct SharedTickets {
    key: aws_lc_rs::aead::LessSafeKey,
}

impl SharedTickets {
    pub fn new(key: &[u8; 32]) -> SharedTickets {
        let unbound = aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, key)
            .expect("a 32-byte AES-256 key");
        SharedTickets {
            key: aws_lc_rs::aead::LessSafeKey::new(unbound),
        }
    }
}

impl std::fmt::Debug for SharedTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedTickets")
    }
}

impl rustls::server::ProducesTickets for SharedTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        TICKET_LIFETIME_SECS
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        use aws_lc_rs::aead::{Aad, Nonce, NONCE_LEN};
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).ok()?;
        let mut sealed = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::empty(),
                &mut sealed,
            )
            .ok()?;
        let mut ticket = nonce.to_vec();
        ticket.extend_from_slice(&sealed);
        Some(ticket)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        use aws_lc_rs::aead::{Aad, Nonce, NONCE_LEN};
        if cipher.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = cipher.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::empty(), &mut sealed)
            .ok()?;
        Some(plain.to_vec())
    }
}

/// A fresh ticket key (the supervisor makes one a start and hands it to its workers).
pub fn new_ticket_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    aws_lc_rs::rand::fill(&mut key).expect("the system's random numbers");
    key
}

/// A server config that a reload replaces: `get` gives the one new connections take.
#[derive(Clone)]
pub struct Reloadable(Arc<RwLock<Arc<ServerConfig>>>);

impl Reloadable {
    pub fn new(config: Arc<ServerConfig>) -> Reloadable {
        Reloadable(Arc::new(RwLock::new(config)))
    }

    pub fn get(&self) -> Arc<ServerConfig> {
        self.0.read().expect("the TLS config lock").clone()
    }

    pub fn set(&self, config: Arc<ServerConfig>) {
        *self.0.write().expect("the TLS config lock") = config;
    }
}

/// A throwaway CA and a server certificate it signed, for tests, the lab and trying TLS
/// out (ECDSA P-256).
pub struct DevCerts {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// Base64 of the SHA-256 of the certificate's public key (SubjectPublicKeyInfo):
    /// what Chromium's `--ignore-certificate-errors-spki-list` takes.
    pub spki_sha256: String,
}

impl DevCerts {
    /// A CA named `hongbao dev CA`, and a certificate for `names` (DNS names or IP
    /// addresses) signed by it.
    pub fn make(names: &[&str]) -> Result<DevCerts, TlsError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, PublicKeyData,
        };
        use sha2::Digest;
        let fail = |e: rcgen::Error| TlsError::Making(e.to_string());
        let ca_key = KeyPair::generate().map_err(fail)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "hongbao dev CA");
        let ca_cert = ca.self_signed(&ca_key).map_err(fail)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().map_err(fail)?;
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut leaf = CertificateParams::new(names).map_err(fail)?;
        leaf.distinguished_name.push(DnType::CommonName, "hongbao");
        let cert = leaf.signed_by(&key, &issuer).map_err(fail)?;
        let spki = sha2::Sha256::digest(key.subject_public_key_info());
        Ok(DevCerts {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            spki_sha256: data_encoding::BASE64.encode(&spki),
        })
    }

    /// Writes `ca.pem`, `cert.pem` and `key.pem` (mode 0600) into `dir`; the files.
    pub fn write(&self, dir: &Path) -> std::io::Result<TlsFiles> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("ca.pem"), &self.ca_pem)?;
        std::fs::write(dir.join("cert.pem"), &self.cert_pem)?;
        crate::access::write_secret_file(&dir.join("key.pem"), &self.key_pem)?;
        Ok(TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::ClientConfig;
    use std::io::{Read, Write};

    /// A client trusting the dev CA completes a handshake with a server of its
    /// certificate and they talk; a client trusting another CA is refused.
    #[test]
    fn a_dev_certificate_serves_tls_to_its_ca_only() {
        let certs = DevCerts::make(&["127.0.0.1", "localhost"]).unwrap();
        let server = server_config(
            certs.cert_pem.as_bytes(),
            certs.key_pem.as_bytes(),
            &[ALPN_HTTP],
        )
        .unwrap();
        let talk = |client: Arc<ClientConfig>| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = server.clone();
            let serving = std::thread::spawn(move || {
                let (tcp, _) = listener.accept().unwrap();
                let conn = rustls::ServerConnection::new(server).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut got = [0u8; 5];
                if tls.read_exact(&mut got).is_ok() {
                    let _ = tls.write_all(b"world");
                    let _ = tls.flush();
                }
            });
            let name = "127.0.0.1".try_into().unwrap();
            let conn = rustls::ClientConnection::new(client, name).unwrap();
            let mut tls =
                rustls::StreamOwned::new(conn, std::net::TcpStream::connect(addr).unwrap());
            let said = tls.write_all(b"hello").and_then(|_| {
                let mut back = [0u8; 5];
                tls.read_exact(&mut back).map(|_| back)
            });
            let alpn = tls.conn.alpn_protocol().map(<[u8]>::to_vec);
            serving.join().unwrap();
            said.map(|back| (back, alpn))
        };
        let trusted = client_config(certs.ca_pem.as_bytes(), &[ALPN_HTTP]).unwrap();
        let (back, alpn) = talk(trusted).expect("a trusted handshake");
        assert_eq!(&back, b"world");
        assert_eq!(alpn.as_deref(), Some(ALPN_HTTP));
        let other = DevCerts::make(&["127.0.0.1"]).unwrap();
        let stranger = client_config(other.ca_pem.as_bytes(), &[ALPN_HTTP]).unwrap();
        assert!(talk(stranger).is_err(), "a certificate of another CA");
    }

    #[test]
    fn a_shared_ticket_opens_in_another_process_and_nothing_else_does() {
        use rustls::server::ProducesTickets;
        let key = new_ticket_key();
        let (a, b) = (SharedTickets::new(&key), SharedTickets::new(&key));
        let ticket = a.encrypt(b"session state").unwrap();
        assert_eq!(b.decrypt(&ticket).as_deref(), Some(&b"session state"[..]));
        assert_ne!(a.encrypt(b"session state").unwrap(), ticket, "a nonce each");
        let mut forged = ticket.clone();
        *forged.last_mut().unwrap() ^= 1;
        assert_eq!(b.decrypt(&forged), None);
        assert_eq!(SharedTickets::new(&new_ticket_key()).decrypt(&ticket), None);
        assert_eq!(b.decrypt(&ticket[..5]), None);
    }

    #[test]
    fn bad_pem_is_a_clear_error() {
        let certs = DevCerts::make(&["localhost"]).unwrap();
        assert!(server_config(b"", certs.key_pem.as_bytes(), &[]).is_err());
        let err = server_config(certs.cert_pem.as_bytes(), b"not a key", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("private key"), "{err}");
        let other = DevCerts::make(&["localhost"]).unwrap();
        let err = server_config(certs.cert_pem.as_bytes(), other.key_pem.as_bytes(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("do not make a server"), "{err}");
    }
}
