//! Logs. Every hongbao process writes its log lines through `tracing`, to stderr:
//! human-readable by default, or one JSON object a line for operators who ship logs
//! (`--log-format json`, or `HONGBAO_LOG_FORMAT=json`), at the levels `HONGBAO_LOG` asks
//! for (an env-filter such as `info` — the default — or `hongbao_server=debug,info`).
//! A process another starts (a gateway worker, a load client, a lab's gateway) inherits
//! both through its environment, so one flag sets the whole run.
//!
//! What a line is about goes in its fields and spans, not only in its text: a worker's
//! lines carry `worker`, a cluster host's `host`, a load client's `proc`. What the CLI
//! itself tells its user (a bench's phase lines, a usage error) is not a log line.

use std::str::FromStr;

use tracing_subscriber::EnvFilter;

/// The environment variable that carries the format to child processes.
pub const FORMAT_ENV: &str = "HONGBAO_LOG_FORMAT";
/// The environment variable of the level filter.
pub const FILTER_ENV: &str = "HONGBAO_LOG";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line a record: time, level, spans and fields, message.
    #[default]
    Human,
    /// One JSON object a record: `timestamp`, `level`, `fields` (with `message`),
    /// `target`, `span` and `spans`.
    Json,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        }
    }
}

/// A log format that is none of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFormat(pub String);

impl std::fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "log format must be \"human\" or \"json\", not {:?}",
            self.0
        )
    }
}

impl std::error::Error for UnknownFormat {}

impl FromStr for LogFormat {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<LogFormat, UnknownFormat> {
        match s {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

/// Installs this process's log writer and passes `format` on to the processes it starts
/// (call once, first thing, before any thread is started). A filter in `HONGBAO_LOG`
/// that cannot be read falls back to `info`, and says so.
pub fn init(format: LogFormat) {
    // SAFETY (of set_var's contract): called before this process starts any thread.
    std::env::set_var(FORMAT_ENV, format.name());
    let (filter, bad_filter) = match std::env::var(FILTER_ENV) {
        Ok(text) => match EnvFilter::try_new(&text) {
            Ok(f) => (f, None),
            Err(e) => (EnvFilter::new("info"), Some((text, e))),
        },
        Err(_) => (EnvFilter::new("info"), None),
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_target(false);
    let installed = match format {
        LogFormat::Human => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    if installed.is_ok() {
        if let Some((text, e)) = bad_filter {
            tracing::warn!(filter = %text, error = %e, "{FILTER_ENV} not understood; logging at info");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_read_back_by_name() {
        for f in [LogFormat::Human, LogFormat::Json] {
            assert_eq!(f.name().parse(), Ok(f));
        }
        assert!("yaml".parse::<LogFormat>().is_err());
    }
}
