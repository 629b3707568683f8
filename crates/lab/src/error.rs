//! The lab's failures: a call to the system that failed (and what we were doing), a
//! program the lab runs that failed or did not come up (ip, initdb, psql, redis-cli,
//! pg_autoctl, nginx, a gateway), an answer of one it could not read, a wait that ran
//! out, or what the lab cannot do as asked; each may say what it was part of
//! (`Error::within`). The namespaces' errors are hongbao_sys's, the ledger's access
//! (its first operator key) hongbao_money's.

/// What went wrong in the lab, by kind: what a caller may match on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the system failed: what we were doing, and what it said.
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// A program the lab runs failed, or did not come up: its own words, or its log's
    /// last lines.
    #[error("{0}")]
    Failed(String),
    /// A program answered, but not in a form we read (a row of psql's, a slot, an
    /// address).
    #[error("{0}")]
    Answer(String),
    /// Waited for longer than we give it.
    #[error("{0}")]
    Timeout(String),
    /// What the lab cannot do as asked, or not now: its plan does not allow it, or what
    /// it needs is not there (a standby, a data node, a live Redis master, PostgreSQL).
    #[error("{0}")]
    Refused(String),
    /// One of the lab's errors, with what it was part of in front.
    #[error("{doing}: {source}")]
    Within {
        doing: String,
        #[source]
        source: Box<Error>,
    },
    /// The network namespaces and the bridge (hongbao_sys::netns).
    #[error(transparent)]
    Sys(#[from] hongbao_sys::Error),
    /// The ledger, as the lab's tools reach it (its first operator key).
    #[error(transparent)]
    Money(#[from] hongbao_money::Error),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What `one_line` (the binary's) prints of an error: its chain, a cause left out
    /// when the text before it holds it already.
    fn one_line(e: &dyn std::error::Error) -> String {
        let mut line = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            cause = c.source();
        }
        line
    }

    #[test]
    fn what_it_was_part_of_comes_first_and_the_cause_once() {
        let gone = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = Error::io("opening /lab/pg.log", gone).within("starting nginx");
        assert_eq!(
            e.to_string(),
            "starting nginx: opening /lab/pg.log: no such file"
        );
        assert_eq!(one_line(&e), e.to_string());
        assert!(matches!(
            e,
            Error::Within { ref source, .. } if matches!(**source, Error::Io { .. })
        ));
        let sys: Error = hongbao_sys::Error::Refused("ip -batch failed: busy".into()).into();
        assert_eq!(sys.to_string(), "ip -batch failed: busy");
    }
}
