//! The embedded backend's error: what kind of failure, and what we were doing. Its
//! `kind` is the money side's (`hongbao_money::ErrorKind`): a configuration refused, a
//! ledger or I/O failure that may pass if tried again, or ours (a ledger that does not
//! read back) — so callers, and the money seam's, match on kinds, not on text.

use hongbao_money::ErrorKind;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("ledger, while {doing}: {source}")]
    Ledger {
        doing: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("ledger is inconsistent: {0}")]
    Corrupt(String),
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// The money side failed (the ledger writer's thread).
    #[error(transparent)]
    Money(#[from] hongbao_money::Error),
}

impl Error {
    pub fn config(msg: impl Into<String>) -> Error {
        Error::Config(msg.into())
    }

    pub fn ledger(doing: &'static str, source: rusqlite::Error) -> Error {
        Error::Ledger { doing, source }
    }

    pub fn io(doing: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            doing: doing.into(),
            source,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config(_) => ErrorKind::Refused,
            Error::Ledger { .. } | Error::Io { .. } => ErrorKind::Unavailable,
            Error::Corrupt(_) => ErrorKind::Bug,
            Error::Money(e) => e.kind(),
        }
    }

    /// Whether trying again, unchanged, may succeed.
    pub fn retryable(&self) -> bool {
        self.kind().retryable()
    }
}

/// What the money seam says of a ledger error: its kind, its words, its cause.
impl From<Error> for hongbao_money::Error {
    fn from(e: Error) -> hongbao_money::Error {
        match e {
            Error::Money(e) => e,
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
        let corrupt = Error::Corrupt("event 7 is stored as a win but is a send".into());
        assert_eq!(corrupt.kind(), ErrorKind::Bug);
        let money: hongbao_money::Error = corrupt.into();
        assert_eq!(money.kind(), ErrorKind::Bug);
        let io = Error::io(
            "reading the ledger",
            std::io::Error::other("disk I/O error"),
        );
        assert!(io.retryable());
        let money: hongbao_money::Error = io.into();
        assert!(money.retryable());
        assert_eq!(
            money.to_string(),
            "SQLite: reading the ledger: disk I/O error"
        );
        assert_eq!(Error::config("workers").kind(), ErrorKind::Refused);
    }
}
