//! The server crate's error: what kind of failure, and what we were doing. Its
//! `kind` is the money side's (`hongbao_money::ErrorKind`): a configuration refused, an
//! I/O failure that may pass if tried again, a bad link, or the money backend's own —
//! so the supervisor's caller, and the money seam's, match on kinds, not on text.

use hongbao_money::ErrorKind;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    /// A login or signing key that cannot be used (configuration too).
    #[error("configuration: {0}")]
    Key(#[from] hongbao_proto::token::KeyError),
    /// A certificate or key that does not read or make a TLS config (configuration too).
    #[error("configuration: {0}")]
    Tls(#[from] hongbao_http::tls::TlsError),
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// A peer on the worker link sent what does not read as a link message: the link is
    /// dropped.
    #[error("link: {0}")]
    Link(String),
    /// The embedded backend failed (its SQLite ledger, a ledger that does not read back).
    #[error(transparent)]
    Embedded(#[from] hongbao_embedded::Error),
    /// The money side failed (cluster mode's engines, the ledger writer).
    #[error(transparent)]
    Money(#[from] hongbao_money::Error),
}

impl Error {
    pub fn config(msg: impl Into<String>) -> Error {
        Error::Config(msg.into())
    }

    pub fn io(doing: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            doing: doing.into(),
            source,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config(_) | Error::Key(_) | Error::Tls(_) | Error::Link(_) => ErrorKind::Refused,
            Error::Io { .. } => ErrorKind::Unavailable,
            Error::Embedded(e) => e.kind(),
            Error::Money(e) => e.kind(),
        }
    }

    /// Whether trying again, unchanged, may succeed.
    pub fn retryable(&self) -> bool {
        self.kind().retryable()
    }
}

/// What the money seam says of a server error: its kind, its words, its cause.
impl From<Error> for hongbao_money::Error {
    fn from(e: Error) -> hongbao_money::Error {
        match e {
            Error::Money(e) => e,
            Error::Embedded(e) => e.into(),
            e => match e.kind() {
                ErrorKind::Refused => hongbao_money::Error::refused(e.to_string()),
                ErrorKind::Unavailable => hongbao_money::Error::unavailable("SQLite", e),
                ErrorKind::Bug => hongbao_money::Error::bug(e.to_string()),
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_cross_the_money_seam() {
        let corrupt = hongbao_embedded::Error::Corrupt("event 7 is a send".into());
        let corrupt: Error = corrupt.into();
        assert_eq!(corrupt.kind(), ErrorKind::Bug);
        let money: hongbao_money::Error = corrupt.into();
        assert_eq!(money.kind(), ErrorKind::Bug);
        assert_eq!(
            money.to_string(),
            "ledger is inconsistent: event 7 is a send"
        );
        assert_eq!(Error::config("workers").kind(), ErrorKind::Refused);
        assert_eq!(Error::Link("short".into()).kind(), ErrorKind::Refused);
    }
}
