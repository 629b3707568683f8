//! The money side's error: what kind of failure — which tells a caller what it may do
//! about it without reading text — what was being done, and the cause.
//!
//! - `Refused`: the request broke a rule or named what is not there; nothing was done,
//!   and asking the same again fails the same way (an admin API answers 400 or 404);
//! - `Unavailable`: the ledger or an engine could not be reached or failed; nothing was
//!   done, or its outcome is unknown and safe to ask again (every money operation is
//!   keyed, so a retry pays nothing twice); an admin API answers 503;
//! - `Bug`: ours — an invariant broken, a ledger that does not read back; asking again
//!   does not help (500).

use std::borrow::Cow;
use std::fmt;

/// Which kind of failure an `Error` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Refused,
    Unavailable,
    Bug,
}

impl ErrorKind {
    /// Whether asking again, unchanged, may succeed.
    pub fn retryable(self) -> bool {
        self == ErrorKind::Unavailable
    }

    /// The HTTP status an API answers with for this kind.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::Refused => 400,
            ErrorKind::Unavailable => 503,
            ErrorKind::Bug => 500,
        }
    }
}

type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A failure of the money side. Displays as "what was being done: the cause".
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    what: Cow<'static, str>,
    cause: Option<Cause>,
}

impl Error {
    /// A rule broken: `why` says which, in words for whoever asked.
    pub fn refused(why: impl Into<Cow<'static, str>>) -> Error {
        Error {
            kind: ErrorKind::Refused,
            what: why.into(),
            cause: None,
        }
    }

    /// The ledger or an engine failed while `doing`.
    pub fn unavailable(doing: impl Into<Cow<'static, str>>, cause: impl Into<Cause>) -> Error {
        Error {
            kind: ErrorKind::Unavailable,
            what: doing.into(),
            cause: Some(cause.into()),
        }
    }

    /// Ours: `what` went wrong that never should.
    pub fn bug(what: impl Into<Cow<'static, str>>) -> Error {
        Error {
            kind: ErrorKind::Bug,
            what: what.into(),
            cause: None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn retryable(&self) -> bool {
        self.kind.retryable()
    }

    /// The same failure, said to have happened while `doing` (outermost first).
    pub fn context(self, doing: impl fmt::Display) -> Error {
        Error {
            what: format!("{doing}: {}", self.what).into(),
            ..self
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Some(cause) => write!(f, "{}: {cause}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_say_what_a_caller_may_do() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let down = Error::unavailable("reading balances", io).context("GET /v1/balances");
        assert_eq!(down.kind(), ErrorKind::Unavailable);
        assert!(down.retryable());
        assert_eq!(down.kind().http_status(), 503);
        assert_eq!(
            down.to_string(),
            "GET /v1/balances: reading balances: refused"
        );
        assert!(std::error::Error::source(&down).is_some());
        let no = Error::refused("a cursor of another kind of ledger");
        assert!(!no.retryable());
        assert_eq!(no.kind().http_status(), 400);
        assert_eq!(no.to_string(), "a cursor of another kind of ledger");
        assert_eq!(Error::bug("x").kind().http_status(), 500);
    }
}
