//! The load's failures: a file, process, socket or thread the system refused; options,
//! keys or certificates it cannot run with; the other end (the coordinator, an agent, a
//! running load's control endpoint) refusing us or not answering in time; and a load that
//! reached too few of its users, which `hongbao load` exits 3 for.

/// What went wrong, and what we were doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// Options, keys or certificates a load cannot run with (no users, a bad range of
    /// source addresses, more connections than the open-file limit, a CA or signing key
    /// that does not read, no key file).
    #[error("{0}")]
    Config(String),
    /// TLS material that does not make a config (a CA, the link's certificate).
    #[error(transparent)]
    Tls(#[from] hongbao_http::tls::TlsError),
    /// The other end refused us or answered what we do not take (the coordinator, an
    /// agent, the control endpoint), or a state is in the way (an agent gone, a hub
    /// started twice).
    #[error("{0}")]
    Refused(String),
    /// A wait that ran out: agents that did not join, a coordinator that did not answer.
    #[error("{0}")]
    Timeout(String),
    /// A JSON line that does not encode or decode (a command, the coordinator's line).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The control endpoint could not be asked (`hongbao load --set-qps`).
    #[error(transparent)]
    Http(#[from] Box<ureq::Error>),
    /// A load that reached too few of its users: `hongbao load` exits
    /// [`Unreached::EXIT_CODE`].
    #[error(transparent)]
    Unreached(#[from] Unreached),
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

/// A load that reached no one, or most of whose users never logged in: what `hongbao
/// load` fails with (exit code 3, `Unreached::EXIT_CODE`), saying why and what to do.
#[derive(Debug)]
pub struct Unreached(pub String);

impl Unreached {
    pub const EXIT_CODE: u8 = 3;
}

impl std::fmt::Display for Unreached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreached {}
