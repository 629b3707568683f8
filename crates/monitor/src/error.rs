//! The monitor's failures: a file, socket or thread the system refused (series.csv, the
//! listening address, the key file), and TLS files that do not make a server.

/// What went wrong, and what we were doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// The monitor's certificate or key could not be read, or does not make a TLS server.
    #[error(transparent)]
    Tls(#[from] hongbao_http::tls::TlsError),
}

impl Error {
    pub fn io(doing: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            doing: doing.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
