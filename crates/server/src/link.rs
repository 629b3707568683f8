//! The link between a gateway worker and the supervisor: one Unix stream per worker,
//! carrying length-prefixed bincode messages both ways. It is our own processes talking, so the
//! format is private; the length is still checked so a confused peer cannot make us
//! allocate without bound.

use hongbao_money::seam::Op;
use hongbao_money::{ConnId, Push, Reply, UserId, WorkerId};

use crate::config::{ReadyOrder, TlsPem};
use crate::stats::WorkerStats;
use hongbao_proto::token::{KeySpec, Rules};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Largest link message (a deal of many packets, a batch of bytes for a connection).
pub const MAX_LINK_MSG: usize = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToSupervisor {
    Hello {
        worker: WorkerId,
        pid: u32,
    },
    /// `user`'s token checked out on `conn`; presence answers the login (`req`) once the
    /// route is its, so that of two logins the one answered first is the one replaced.
    /// `issued`: the token's `iat`, checked once more against the revocations (one may
    /// have reached the supervisor before the worker).
    Online {
        conn: ConnId,
        req: u32,
        user: UserId,
        issued: u64,
    },
    Offline {
        conn: ConnId,
        user: UserId,
    },
    /// The session on `conn` took a fresh token, issued at `issued`: a revocation
    /// between the two kicks it only if it is older than that.
    Refreshed {
        conn: ConnId,
        user: UserId,
        issued: u64,
    },
    /// A request for the money side, answered with `ToWorker::Reply`.
    Op {
        conn: ConnId,
        req: u32,
        user: UserId,
        op: Op,
    },
    Chat {
        conn: ConnId,
        req: u32,
        user: UserId,
        to_user: u64,
        text: String,
    },
    /// Cumulative counters, once a second.
    Stats(Box<WorkerStats>),
    /// Broadcast `id` is being written to `connections` connections.
    BroadcastTaken {
        id: u64,
        connections: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToWorker {
    Welcome(Box<WorkerConfig>),
    Deal {
        packets: Vec<(u64, u64)>,
    },
    /// The answer to request `req` of `conn`.
    Reply {
        conn: ConnId,
        req: u32,
        reply: Reply,
    },
    /// Sent unasked; the connection closes after it when `close`.
    Push {
        conn: ConnId,
        push: Push,
        close: bool,
    },
    /// Push `Broadcast { server_time_us, text }` to every open connection, in slices.
    Broadcast {
        id: u64,
        server_time_us: u64,
        text: String,
    },
    /// The login on `conn` was refused after the worker let it in (over the user's limit
    /// of logins): the connection is not logged in any more, and may try again.
    LoginRefused {
        conn: ConnId,
    },
    /// Tokens of `user` issued before `at` (Unix seconds) are refused from now on.
    Revoke {
        user: UserId,
        at: u64,
    },
    /// Stop accepting and let every connection go over `window_ms`, each told to come
    /// back in `retry_after_ms` (`worker/drain.rs`); then stop.
    Drain {
        window_ms: u32,
        retry_after_ms: u32,
    },
    /// In an upgrade's drain: let the first `count` go now, ahead of the window (the new
    /// server keeps up).
    DrainTo {
        count: u32,
    },
    Shutdown,
}

/// How a worker checks logins: the keys by `kid`, the rules, and the rest. Sent in the
/// welcome, and again (in a new welcome) when the configuration is reloaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoginSetup {
    pub keys: Vec<KeySpec>,
    pub rules: Rules,
    /// A session is asked for a fresh token this long before its own ends.
    pub refresh_before_secs: u32,
    /// The secret of the old HMAC tokens, when version-1 logins may use them.
    pub hmac_secret: Option<Vec<u8>>,
    /// The HS256 key demo tokens are minted with (`GET /token`), when that is on.
    pub demo_key: Option<KeySpec>,
    /// Revocations still in force: (user, Unix second before which its tokens are
    /// refused).
    pub revoked: Vec<(u64, u64)>,
}

/// What a worker needs to know, sent by the supervisor on connect so that restarts pick up the
/// same settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    pub login: LoginSetup,
    /// TLS on every client listener, when given.
    pub tls: Option<TlsPem>,
    /// Each user's shakes (on a session, or over HTTP with its bearer).
    pub shake_limit: crate::limits::Rate,
    /// Proxies whose connections name their clients (`ServeConfig::trusted_proxies`).
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// This worker's share of the server's `max_shake_qps`.
    pub max_shakes_per_sec: u32,
    pub max_connections: u32,
    /// Connections not yet logged in (binary frames, upgraded WebSockets) this worker
    /// holds at most...
    pub max_unauthenticated: u32,
    /// ...and at most this many from one source address.
    pub max_unauthenticated_per_source: u32,
    /// TLS handshakes under way in this worker at most: at the bound the listeners are
    /// not accepted from, and the rest wait in the kernel's accept queue.
    pub max_tls_handshakes: u32,
    /// A TLS handshake not done this long after the accept is closed.
    pub tls_handshake_timeout_secs: u32,
    /// A TLS listener's accept queue holds this many seconds of handshakes.
    pub tls_accept_queue_secs: u32,
    /// Counted from the connect, or from the TLS handshake's end.
    pub login_timeout_secs: u32,
    /// 0 disables.
    pub idle_timeout_secs: u32,
    /// An HTTP connection with no request under way is closed after this; 0 never.
    pub http_keepalive_secs: u32,
    pub max_output_bytes: u32,
    /// See `ServeConfig::max_queue_ms`.
    pub max_queue_ms: u32,
    /// See `ServeConfig::ready_order`.
    pub ready_order: ReadyOrder,
    /// See `ServeConfig::broadcast_yield_ms`.
    pub broadcast_yield_ms: u32,
}

impl WorkerConfig {
    /// Whether reads carry the kernel's receive time: shedding and broadcast pacing both
    /// judge by how long a shake waited.
    pub fn stamps(&self) -> bool {
        self.max_queue_ms > 0 || self.broadcast_yield_ms > 0
    }
}

pub fn encode<T: Serialize>(msg: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    bincode::serialize_into(&mut *out, msg).expect("link messages serialize");
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Decodes every whole message at the front of `buf`, removing them from it.
pub fn decode_all<T: DeserializeOwned>(
    buf: &mut Vec<u8>,
    mut f: impl FnMut(T),
) -> crate::error::Result<()> {
    use crate::error::Error;
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
        if len > MAX_LINK_MSG {
            return Err(Error::Link(format!(
                "a message of {len} bytes over limit {MAX_LINK_MSG}"
            )));
        }
        if buf.len() - at - 4 < len {
            break;
        }
        let msg = bincode::deserialize(&buf[at + 4..at + 4 + len])
            .map_err(|e| Error::Link(format!("a message that does not decode: {e}")))?;
        f(msg);
        at += 4 + len;
    }
    consumed(buf, at);
    Ok(())
}

/// The room a link buffer keeps once emptied: a storm's backlog (a million logins up the
/// link) is let go, not kept for good.
const KEPT_LINK_BUFFER: usize = 64 * 1024;

/// Drops the first `n` bytes of a link buffer (read or written), and its room past
/// `KEPT_LINK_BUFFER` once it is empty.
pub fn consumed(buf: &mut Vec<u8>, n: usize) {
    buf.drain(..n);
    if buf.is_empty() && buf.capacity() > KEPT_LINK_BUFFER {
        buf.shrink_to(KEPT_LINK_BUFFER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_split_anywhere() {
        let mut bytes = Vec::new();
        let conn = ConnId {
            key: 5,
            generation: 1,
        };
        let user = UserId::new(9).unwrap();
        encode(
            &ToSupervisor::Online {
                conn,
                req: 1,
                user,
                issued: 0,
            },
            &mut bytes,
        );
        encode(
            &ToSupervisor::Chat {
                conn,
                req: 2,
                user,
                to_user: 4,
                text: "hi".into(),
            },
            &mut bytes,
        );
        for cut in 0..bytes.len() {
            let mut buf = bytes[..cut].to_vec();
            let mut got = Vec::new();
            decode_all::<ToSupervisor>(&mut buf, |m| got.push(m)).unwrap();
            buf.extend_from_slice(&bytes[cut..]);
            decode_all::<ToSupervisor>(&mut buf, |m| got.push(m)).unwrap();
            assert_eq!(got.len(), 2);
            assert!(buf.is_empty());
        }
    }

    /// A user's view travels as JSON text inside the link's binary encoding: its events
    /// are the ledger's JSON, which bincode alone cannot read back.
    #[test]
    fn typed_replies_cross_the_link() {
        let view = hongbao_money::UserView {
            user: 3,
            balance_cents: 120,
            recent_events: vec![serde_json::json!({"kind": "shake_won", "seq": 4})],
        };
        let conn = ConnId {
            key: 1,
            generation: 2,
        };
        let mut bytes = Vec::new();
        encode(
            &ToWorker::Reply {
                conn,
                req: 8,
                reply: Reply::Me(view.clone()),
            },
            &mut bytes,
        );
        let mut got = Vec::new();
        decode_all::<ToWorker>(&mut bytes, |m| got.push(m)).unwrap();
        match &got[..] {
            [ToWorker::Reply {
                reply: Reply::Me(back),
                req: 8,
                ..
            }] => assert_eq!(back, &view),
            other => panic!("{other:?}"),
        }
    }
}
