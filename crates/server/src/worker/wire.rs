//! The words every transport shares: what one decode step yields (`Step`: a request or a
//! refusal, `Inbound`, acting for `Auth`; and whether the connection goes on, `Then`) and
//! what a codec may touch meanwhile (`Cx`). Both codec files use them — `codec.rs`
//! (binary frames, WebSocket) and `http.rs` — and this file imports from neither, so the
//! imports run one way: codec → http → wire.

use hongbao_money::Request;
use hongbao_proto::{KickReason, ResultCode};
use hongbao_sys::clock::UptimeSecs;

use super::session::Sessions;
use crate::link::WorkerConfig;
use crate::stats::WorkerCounters;

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Auth {
    /// The connection's login.
    Connection,
    /// The request carries its own token (an HTTP bearer), for the worker to check.
    Bearer(Box<[u8]>),
}

pub(super) enum Inbound {
    /// A request to handle; its reply must carry `id`.
    Request {
        id: u32,
        request: Request,
        auth: Auth,
    },
    /// A request that could not be read: answer it with this error and read on. With a
    /// `bearer` (an HTTP request whose body is bad), the token is judged first: a
    /// stranger is told 401, never what the body got wrong.
    Refused {
        id: u32,
        result: ResultCode,
        text: String,
        bearer: Option<Box<[u8]>>,
    },
}

/// Whether the connection goes on after a step.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Then {
    Read,
    /// The byte stream cannot be read any more: tell the client why, then close.
    Kick(KickReason, String),
    /// Close once what is queued is written (the codec wrote its goodbye).
    HangUp,
}

pub(super) struct Step {
    pub used: usize,
    pub inbound: Option<Inbound>,
    pub then: Then,
}

impl Step {
    pub(super) fn read(used: usize, inbound: Option<Inbound>) -> Step {
        Step {
            used,
            inbound,
            then: Then::Read,
        }
    }
}

/// What a codec may touch while decoding.
pub(super) struct Cx<'a> {
    /// Bytes the transport answers by itself, written before the step's request is handled.
    pub out: &'a mut Vec<u8>,
    pub stats: &'a mut WorkerCounters,
    pub cfg: &'a WorkerConfig,
    /// The demo log-in mints with it (`GET /token`).
    pub sessions: &'a Sessions,
    /// The read's time, in whole seconds.
    pub now: UptimeSecs,
    /// Whether a WebSocket upgrade may be accepted now: not when the worker already
    /// holds as many connections not yet logged in as it may (from this source).
    pub may_upgrade: bool,
    /// The connection comes from a trusted proxy, whose `X-Real-IP` names its client.
    pub trusted_peer: bool,
    /// Set by an upgrade from a trusted proxy: the client it named.
    pub client: Option<std::net::IpAddr>,
}
