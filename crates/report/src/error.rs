//! The report's failures: a file it could not read or write, an input that does not read
//! (series.csv, broadcasts.json), a chart plotters could not draw.

/// What went wrong, and what we were doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// series.csv does not read as the monitor writes it (its header, a row).
    #[error("{0}")]
    BadInput(String),
    /// A JSON input that does not read (broadcasts.json, summary.json).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// plotters could not draw a chart, or finish its file.
    #[error("{0}")]
    Draw(String),
    /// One of the above, with what it was part of in front: `doing: what failed`.
    #[error("{doing}: {source}")]
    Within {
        doing: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    pub fn io(doing: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            doing: doing.into(),
            source,
        }
    }

    /// This error, with what it was part of in front: `doing: what failed`.
    pub fn within(self, doing: impl Into<String>) -> Error {
        Error::Within {
            doing: doing.into(),
            source: Box::new(self),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
