//! The client side of TLS, for every hongbao client in Rust (the client library, the
//! load generator, the tools): rustls on aws-lc-rs, TLS 1.3 and 1.2, trusting only the
//! CA certificates given (a deployment's own CA, or a public one's chain).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// ALPN names: what each listener says it speaks.
pub const ALPN_HTTP: &[u8] = b"http/1.1";
/// The binary protocol (version 2).
pub const ALPN_FRAMES: &[u8] = b"hongbao/2";

/// TLS material that does not make a config, or cannot be had: which, and what rustls
/// (or the PEM reader, or the file system) said.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file that does not read: which, where, why.
    #[error("reading the TLS {what} {path}: {source}")]
    File {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the certificates: {0}")]
    Certificates(String),
    #[error("no certificate in the PEM")]
    NoCertificate,
    #[error("a CA certificate rustls cannot use: {0}")]
    Ca(String),
    #[error("reading the private key: {0}")]
    Key(String),
    #[error("the certificate and key do not make a server: {0}")]
    NotAServer(String),
    #[error("a ticket key: {0}")]
    TicketKey(String),
    /// rustls refused the config itself (its protocol versions).
    #[error("{0}")]
    Config(String),
    /// A development certificate could not be made (`DevCerts`).
    #[error("making a certificate: {0}")]
    Making(String),
}

/// The certificates in `pem`, in order (leaf first).
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificates(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    Ok(certs)
}

/// The provider every hongbao TLS config uses: aws-lc-rs's, with TLS 1.3's
/// AES-128-GCM-SHA256 first. Its handshake hashes with SHA-256, which this machine's CPU
/// does in hardware (SHA-NI); the default's first, AES-256-GCM-SHA384, hashes with
/// SHA-384, in software: in a login storm that was 11% of the machine's CPU, both ends
/// (docs/benchmarks/diary.md, issue 51). A client's preference decides (rustls's
/// server follows it), so a client that asks for SHA-384 still gets it.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    let first = TLS13_AES_128_GCM_SHA256.suite();
    provider.cipher_suites.sort_by_key(|s| s.suite() != first);
    Arc::new(provider)
}

/// A client config trusting the CA certificates in `ca_pem` (only them), saying `alpn`.
pub fn client_config(ca_pem: &[u8], alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca_pem)? {
        roots.add(cert).map_err(|e| TlsError::Ca(e.to_string()))?;
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(Arc::new(config))
}

pub mod session;
