//! What a load client process reports to its coordinator, once a second, as one JSON line
//! on its stdout: cumulative counters, the latency histograms of the second just ended
//! (sparse HDR buckets, so the coordinator can merge them exactly), the broadcasts
//! received in it (`broadcast.rs`), and the money operations its users were told of in it
//! (the history the bench checks against the ledger, op by op: `bench/history.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::broadcast::BroadcastReport;
pub use hongbao_telemetry::sample::{merge_sparse, new_histogram, sparse};

/// Cumulative counters of one client process (or, summed, of a whole load run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub connect_attempts: u64,
    pub connects: u64,
    pub logins: u64,
    pub login_failures: u64,
    /// Sessions the server asked for a fresh token, and logged in again on the same
    /// connection (the refreshes the server answered `ok`).
    #[serde(default)]
    pub refreshes: u64,
    pub failed_refused: u64,
    pub failed_timeout: u64,
    pub failed_reset: u64,
    pub failed_out_of_ports: u64,
    pub failed_out_of_files: u64,
    pub failed_other: u64,
    /// WebSocket only: the TCP connection opened but the upgrade failed (an HTTP error,
    /// a bad `Sec-WebSocket-Accept`, or the server closing during the handshake).
    pub failed_handshake: u64,
    /// Out of ports (`EADDRNOTAVAIL`) while half a port range or more of sockets sat in
    /// TIME_WAIT: the short-connection wall (`failed_out_of_ports` counts the others).
    #[serde(default)]
    pub failed_time_wait: u64,
    pub disconnects: u64,
    pub kicks: u64,
    /// Users that did not come back: kicked for a terminal reason (`replaced`,
    /// `bad-token`, `expired`, `revoked`).
    #[serde(default)]
    pub stayed_away: u64,
    /// Firings whose user was not connected and logged in at the time.
    pub skipped_not_ready: u64,
    /// Firings skipped because the user was told "overloaded" and is backing off.
    #[serde(default)]
    pub backed_off: u64,
    /// HTTP with a connection per request: firings whose user's previous request was still
    /// under way.
    #[serde(default)]
    pub skipped_busy: u64,
    /// HTTP: `GET /v1/notices` polls sent (HTTP clients get no pushes).
    #[serde(default)]
    pub notice_polls: u64,
    pub shakes_sent: u64,
    pub shake_replies: u64,
    pub won: u64,
    pub won_cents: u64,
    pub nothing: u64,
    pub overloaded: u64,
    pub notices: u64,
    pub opens_sent: u64,
    pub opened: u64,
    pub opened_cents: u64,
    pub open_other: u64,
    pub error_replies: u64,
    /// Broadcast messages received (every delivery, all broadcasts).
    pub broadcast_delivered: u64,
}

/// Calls `$m!` with every counter field: the one list `add` and `since` go over.
macro_rules! counter_fields {
    ($m:ident) => {
        $m!(
            connect_attempts,
            connects,
            logins,
            login_failures,
            refreshes,
            failed_refused,
            failed_timeout,
            failed_reset,
            failed_out_of_ports,
            failed_out_of_files,
            failed_other,
            failed_handshake,
            failed_time_wait,
            disconnects,
            kicks,
            stayed_away,
            skipped_not_ready,
            backed_off,
            skipped_busy,
            notice_polls,
            shakes_sent,
            shake_replies,
            won,
            won_cents,
            nothing,
            overloaded,
            notices,
            opens_sent,
            opened,
            opened_cents,
            open_other,
            error_replies,
            broadcast_delivered
        )
    };
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        macro_rules! sum {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        counter_fields!(sum);
    }

    /// What was counted between `earlier` and `self` (zero where a counter went back).
    pub fn since(&self, earlier: &Counters) -> Counters {
        let mut d = Counters::default();
        macro_rules! sub {
            ($($f:ident),*) => { $( d.$f = self.$f.saturating_sub(earlier.$f); )* };
        }
        counter_fields!(sub);
        d
    }

    pub fn connect_failures(&self) -> u64 {
        self.failed_refused
            + self.failed_timeout
            + self.failed_reset
            + self.failed_out_of_ports
            + self.failed_out_of_files
            + self.failed_other
            + self.failed_handshake
            + self.failed_time_wait
    }

    /// Everything that counts as an error in the progress line and the summary.
    pub fn errors(&self) -> u64 {
        self.connect_failures()
            + self.login_failures
            + self.skipped_not_ready
            + self.skipped_busy
            + self.error_replies
            + self.kicks
    }
}

/// What one user saw over the run (only users that received money are listed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserTotals {
    pub won: u64,
    pub won_cents: u64,
    pub opened: u64,
    pub opened_cents: u64,
}

/// A money operation a user was told succeeded: it won shake packet `packet`, or opened
/// its share of sent packet `packet`, for `amount_cents`. On the wire a
/// `[user, packet, amount_cents]` array: a few hundred of these a second must stay small.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "[u64; 3]", into = "[u64; 3]")]
pub struct Acked {
    pub user: u64,
    pub packet: u64,
    pub amount_cents: u64,
}

impl From<[u64; 3]> for Acked {
    fn from([user, packet, amount_cents]: [u64; 3]) -> Acked {
        Acked {
            user,
            packet,
            amount_cents,
        }
    }
}

impl From<Acked> for [u64; 3] {
    fn from(a: Acked) -> [u64; 3] {
        [a.user, a.packet, a.amount_cents]
    }
}

/// What users were told they won and opened, in the order they were told. An open is
/// listed once per (user, packet, amount): `already-opened` with the amount first told
/// is the same open, with another amount it is listed again (and the check flags it).
/// The load's users send no packets of their own, so there are no sends to list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub wins: Vec<Acked>,
    pub opens: Vec<Acked>,
}

impl History {
    pub fn is_empty(&self) -> bool {
        self.wins.is_empty() && self.opens.is_empty()
    }

    /// Moves everything of `other` to the end of this one.
    pub fn append(&mut self, other: &mut History) {
        self.wins.append(&mut other.wins);
        self.opens.append(&mut other.opens);
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub proc_index: u32,
    pub pid: u32,
    /// The schedule second these histograms cover (seconds since the run's epoch).
    pub second: u64,
    pub unix_ms: u64,
    pub connected: u64,
    pub logged_in: u64,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
    pub counters: Counters,
    /// Latency in µs from intended send time to reply: (bucket value, count).
    pub shake_latency_us: Vec<(u64, u64)>,
    /// The same of the shakes served (won or nothing), without those shed `overloaded`:
    /// under overload, what the admitted shakes waited.
    #[serde(default)]
    pub served_latency_us: Vec<(u64, u64)>,
    pub open_latency_us: Vec<(u64, u64)>,
    /// How late this process sent its shakes against their intended time, µs: the part
    /// of the latency that is the load's own (a stall here, not in the server).
    #[serde(default)]
    pub send_lag_us: Vec<(u64, u64)>,
    /// Broadcasts with receipts since the previous report (the final report: since the
    /// last per-second one).
    #[serde(default)]
    pub broadcasts: Vec<BroadcastReport>,
    /// Present in the final report only.
    pub users: Option<BTreeMap<u64, UserTotals>>,
    /// Wins and opens the users were told of since the previous report.
    #[serde(default, skip_serializing_if = "History::is_empty")]
    pub history: History,
    pub last: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_travels_as_arrays_and_only_when_there_is_one() {
        let mut report = Report::default();
        assert!(!serde_json::to_string(&report).unwrap().contains("history"));
        report.history.wins.push(Acked {
            user: 7,
            packet: 4_294_967_296,
            amount_cents: 174,
        });
        let line = serde_json::to_string(&report).unwrap();
        assert!(
            line.contains(r#""history":{"wins":[[7,4294967296,174]],"opens":[]}"#),
            "{line}"
        );
        let back: Report = serde_json::from_str(&line).unwrap();
        assert_eq!(back.history, report.history);
    }
}
