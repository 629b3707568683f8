//! The machine's refusals: what we were doing, and what the system said.

/// A call or a command that failed: what we were doing, and why.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// The system answered, but not as asked (a command's own error, a state in the way).
    #[error("{0}")]
    Refused(String),
}

impl Error {
    pub fn io(doing: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            doing: doing.into(),
            source,
        }
    }

    /// This error, with what it was part of in front: `doing: what failed`.
    pub fn within(self, doing: impl std::fmt::Display) -> Error {
        Error::Refused(format!("{doing}: {self}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
