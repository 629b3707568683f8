//! The bench's failures (`hongbao bench`, `hongbao capacity`): a call to the system that
//! failed (and what we were doing), what it was asked that it cannot do (a fault's name, a
//! plan), a step of the run that did not happen as it must (a server that did not start,
//! answer or stop, users who did not connect), an answer of the server's it refuses, the
//! admin API out of reach; the lab's own errors, and those of the tools it drives; each
//! may say what it was part of (`Error::within`).

/// What went wrong in a bench or capacity run, by kind: what a caller may match on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the system failed: what we were doing, and what it said (a JSON file
    /// that does not read or write is one too: `Error::json`).
    #[error("{doing}: {source}")]
    Io {
        doing: String,
        #[source]
        source: std::io::Error,
    },
    /// What the bench was asked that it cannot do: a fault it does not know, a plan that
    /// does not read or does not hold together, a URL it does not take.
    #[error("{0}")]
    Invalid(String),
    /// A step of the run that did not happen as it must: a server that did not become
    /// ready, answer or stop, users who did not connect, a run interrupted.
    #[error("{0}")]
    Failed(String),
    /// The server answered, but not as we take it: an error status, a line that does not
    /// read, a ledger whose pages do not move on.
    #[error("{0}")]
    Answer(String),
    /// The admin API could not be asked (no connection, a broken transport).
    #[error(transparent)]
    Http(Box<ureq::Error>),
    /// One of the bench's errors, with what it was part of in front.
    #[error("{doing}: {source}")]
    Within {
        doing: String,
        #[source]
        source: Box<Error>,
    },
    /// The lab of hosts (`--hosts`, cluster stages), its faults and its engines.
    #[error(transparent)]
    Lab(#[from] hongbao_lab::Error),
    /// The load it drives (its clients, agents and controls).
    #[error(transparent)]
    Load(#[from] hongbao_load::Error),
    /// The monitor it runs beside the server.
    #[error(transparent)]
    Monitor(#[from] hongbao_monitor::Error),
    /// The report and charts it writes at the end.
    #[error(transparent)]
    Report(#[from] hongbao_report::Error),
}

impl Error {
    pub fn io(doing: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            doing: doing.into(),
            source,
        }
    }

    /// JSON that did not read or write while `doing`: an I/O failure of its kind
    /// (`InvalidData`, serde_json's words).
    pub fn json(doing: impl Into<String>, source: serde_json::Error) -> Error {
        Error::io(doing, source.into())
    }

    /// This error, with what it was part of in front: `doing: what failed`.
    pub fn within(self, doing: impl Into<String>) -> Error {
        Error::Within {
            doing: doing.into(),
            source: Box::new(self),
        }
    }
}

impl From<ureq::Error> for Error {
    fn from(e: ureq::Error) -> Error {
        Error::Http(Box::new(e))
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
        let lab = hongbao_lab::Error::Timeout("waited 1s for the monitor".into());
        let e = Error::from(lab).within("bringing the lab up");
        assert_eq!(
            e.to_string(),
            "bringing the lab up: waited 1s for the monitor"
        );
        assert_eq!(one_line(&e), e.to_string());
        let json = serde_json::from_str::<u32>("x").unwrap_err();
        let e = Error::json("reading summary.json", json);
        assert_eq!(
            e.to_string(),
            "reading summary.json: expected value at line 1 column 1"
        );
        assert_eq!(one_line(&e), e.to_string());
    }

    /// The tools' errors keep every cause, under a context too.
    #[test]
    fn the_tools_errors_keep_their_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let tool = hongbao_report::Error::io("reading series.csv", io);
        let e = Error::from(tool).within("writing the report");
        assert_eq!(
            one_line(&e),
            "writing the report: reading series.csv: no such file"
        );
    }
}
