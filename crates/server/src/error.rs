//! The server crate's error: what kind of failure, and what we were doing.

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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
