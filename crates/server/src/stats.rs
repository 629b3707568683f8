//! What a worker counts, as fields: the counters (cumulative since the worker started),
//! the levels (values now), and the report a worker sends once a second. The list of
//! counters is written once, in `counters!`, and everything that adds, subtracts, names
//! or exports them follows from it — a counter cannot be misspelt into reading zero.

use std::collections::BTreeMap;

use hongbao_money::WorkerId;
use serde::{Deserialize, Serialize};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A worker's cumulative counters (they restart at 0 with the worker).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct WorkerCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl WorkerCounters {
            /// Every counter's name, in order (the metric is `hongbao_worker_<name>_total`).
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            pub fn add(&mut self, other: &WorkerCounters) {
                $(self.$name += other.$name;)*
            }

            /// What was counted since `earlier`.
            pub fn since(&self, earlier: &WorkerCounters) -> WorkerCounters {
                WorkerCounters { $($name: self.$name.saturating_sub(earlier.$name),)* }
            }

            /// Counts over `seconds` as rates per second.
            pub fn per(&self, seconds: u64) -> WorkerCounters {
                let seconds = seconds.max(1);
                WorkerCounters { $($name: self.$name / seconds,)* }
            }

            /// (name, value) of every counter, in `NAMES` order.
            pub fn each(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name)),*]
            }
        }
    };
}

counters!(
    accepted,
    /// Turned away over the connection limit.
    rejected,
    /// Turned away over a limit on connections not yet logged in (per worker, per source
    /// address): closed at once, or a WebSocket upgrade answered 503.
    rejected_unauthenticated,
    closed,
    logins,
    /// Logins refused (each kind of refusal is counted in `token_refusals`).
    login_failures,
    /// Logins on a logged-in connection that moved its session's end (a fresh token).
    refreshes,
    /// `refresh` pushes: sessions asked for a fresh token.
    refresh_asked,
    shakes,
    shakes_won_claimed,
    shakes_nothing,
    shakes_overloaded,
    /// Of `shakes_overloaded`: shed because they waited longer than `max_queue_ms` (a
    /// share of those up to twice it, all beyond).
    shakes_shed_late,
    /// Of `shakes_overloaded`: refused by the shake cap a worker sets once a queue past
    /// `max_queue_ms` has drained (at what it was just seen to serve a second), in the
    /// `fifo` read order only.
    shakes_shed_capped,
    sends,
    opens,
    chats,
    pings,
    bad_frames,
    bad_requests,
    not_logged_in,
    kicks_idle,
    kicks_slow_reader,
    /// Sessions whose token ended with no fresh one.
    kicks_expired,
    /// Sessions of a revoked user, or signed by a key no longer configured.
    kicks_revoked,
    /// Requests refused over a per-user limit (`rate-limited`).
    rate_limited,
    bytes_in,
    bytes_out,
    /// `write` calls to connections: one for all the answers to one read's requests
    /// (more where the kernel takes part of them), one per push and per flush.
    writes,
    ws_upgrades,
    ws_rejected,
    /// TLS handshakes refused: a client that does not speak TLS on a TLS listener, or
    /// none of its versions, names or ciphers.
    tls_refused,
    /// TLS handshakes done, full...
    tls_handshakes,
    /// ...and resumed from a ticket.
    tls_resumed,
    /// TLS handshakes not done within `tls_handshake_timeout_secs` of the accept: closed.
    tls_handshake_timeouts,
    /// Connections that left before their TLS handshake was done — among them those the
    /// client gave up on in the accept queue, closed before any handshake work.
    tls_abandoned,
    /// Times the worker stopped accepting for a moment, at `max_tls_handshakes` (or
    /// `max_unauthenticated`): the connections past it waited in the kernel's queue.
    accept_paused,
    http_requests,
    broadcasts,
    broadcast_delivered,
);

/// A worker's levels: values now, not counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLevels {
    pub connections: u64,
    pub logged_in: u64,
    pub pool_packets: u64,
    pub rss_bytes: u64,
    /// Shakes a second the worker's shake cap admits now; 0: no cap (worker/overload.rs).
    #[serde(default)]
    pub shake_cap: u64,
    /// TLS handshakes under way now (at most `max_tls_handshakes`).
    #[serde(default)]
    pub tls_handshaking: u64,
    /// The TLS listeners' accept queue length now (`tls_accept_queue_secs`); 0 without TLS.
    #[serde(default)]
    pub tls_accept_queue: u64,
}

impl WorkerLevels {
    pub fn add(&mut self, other: &WorkerLevels) {
        self.connections += other.connections;
        self.logged_in += other.logged_in;
        self.pool_packets += other.pool_packets;
        self.rss_bytes += other.rss_bytes;
        self.shake_cap += other.shake_cap;
        self.tls_handshaking += other.tls_handshaking;
        self.tls_accept_queue += other.tls_accept_queue;
    }
}

/// A worker's report, once a second.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerStats {
    pub worker: WorkerId,
    pub pid: u32,
    pub unix_second: u64,
    pub levels: WorkerLevels,
    /// CPU time since the worker started (ms).
    pub cpu_ms: u64,
    pub counters: WorkerCounters,
    /// Tokens refused, by refusal (`hongbao_proto::token::Refusal::index`): cumulative.
    #[serde(default)]
    pub token_refusals: Vec<u64>,
    /// Shake latency of the second just ended, from reading the shake to writing its
    /// reply: sparse HDR buckets (µs, count).
    pub shake_latency_us: Vec<(u64, u64)>,
}

impl WorkerStats {
    /// Counts a refused token under its refusal.
    pub fn count_refusal(&mut self, refusal: hongbao_proto::token::Refusal) {
        let all = hongbao_proto::token::Refusal::ALL.len();
        if self.token_refusals.len() < all {
            self.token_refusals.resize(all, 0);
        }
        self.token_refusals[refusal.index()] += 1;
    }
}

/// `GET /v1/stats`: totals are counters, levels and CPU together in one flat object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    #[serde(flatten)]
    pub counters: WorkerCounters,
    #[serde(flatten)]
    pub levels: WorkerLevels,
    pub cpu_ms: u64,
}

/// One worker in `GET /v1/stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerView {
    pub worker: WorkerId,
    pub pid: u32,
    pub restarts: u32,
    #[serde(flatten)]
    pub levels: WorkerLevels,
    pub cpu_ms: u64,
    pub per_sec: WorkerCounters,
}

/// The supervisor process in `GET /v1/stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CoreView {
    pub ledger_seq: u64,
    pub ledger_committed_seq: u64,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
}

/// `GET /v1/stats`: written by the supervisor (`supervisor/report.rs`), read by the bench
/// through this same type. Every field has a default, so a server a build older or newer
/// (a rolling upgrade's) still reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    pub unix_ms: u64,
    pub connections: u64,
    pub logged_in: u64,
    pub online_users: u64,
    pub per_sec: WorkerCounters,
    /// Replies of the last whole second, keyed `{op}_{result}`.
    pub core_per_sec: BTreeMap<String, u64>,
    pub totals: Totals,
    pub workers: Vec<WorkerView>,
    pub core: CoreView,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_subtract_and_name_themselves() {
        let mut a = WorkerCounters {
            shakes: 5,
            bytes_in: 9,
            ..Default::default()
        };
        let b = WorkerCounters {
            shakes: 2,
            ..Default::default()
        };
        a.add(&b);
        assert_eq!(a.shakes, 7);
        assert_eq!(a.since(&b).shakes, 5);
        assert_eq!(b.since(&a).shakes, 0);
        let named: BTreeMap<_, _> = a.each().into_iter().collect();
        assert_eq!(named["shakes"], 7);
        assert_eq!(named.len(), WorkerCounters::NAMES.len());
        // The JSON names are the field names.
        let json = serde_json::to_value(&a).unwrap();
        for name in WorkerCounters::NAMES {
            assert!(json.get(name).is_some(), "{name}");
        }
    }

    #[test]
    fn totals_are_one_flat_object() {
        let totals = Totals {
            cpu_ms: 3,
            ..Default::default()
        };
        let json = serde_json::to_value(&totals).unwrap();
        for key in ["shakes", "connections", "pool_packets", "cpu_ms"] {
            assert!(json.get(key).is_some(), "{key} in {json}");
        }
    }
}
