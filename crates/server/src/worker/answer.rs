//! What the HTTP API answers a reply with: its status (`status_of`), its `Retry-After`,
//! and its JSON body through the API's types (`hongbao_proto::api`).

use hongbao_money::Reply;
use hongbao_proto::{api, ResultCode};

pub(super) fn error_body(result: ResultCode, text: &str) -> Vec<u8> {
    let refused = api::Refused {
        error: text.to_string(),
        result,
        retry_after_ms: 0,
    };
    api::to_body(&refused).into_bytes()
}

/// The HTTP status of a result: success for outcomes a client asked for and got
/// (including `nothing`, `already-opened` and `offline`), the nearest client or server
/// error for the rest.
pub(super) fn status_of(result: ResultCode) -> u16 {
    use ResultCode::*;
    match result {
        Ok | Won | Nothing | Opened | AlreadyOpened | Delivered | Offline => 200,
        Overloaded | RateLimited => 429,
        Empty => 409,
        NotARecipient => 403,
        Expired => 410,
        InsufficientFunds => 402,
        BadRequest => 400,
        BadToken | NotLoggedIn => 401,
        UnknownType | NoSuchPacket => 404,
        Unavailable => 503,
    }
}

/// An `overloaded` or `rate-limited` answer's `Retry-After`: whole seconds (HTTP has no
/// finer unit), rounded up from the reply's `retry_after_ms`, at least 1.
pub(super) fn retry_after_secs(reply: &Reply) -> Option<String> {
    if !matches!(
        reply.result(),
        ResultCode::Overloaded | ResultCode::RateLimited
    ) {
        return None;
    }
    let ms = match reply {
        Reply::Shake { retry_after_ms, .. } | Reply::RateLimited { retry_after_ms, .. } => {
            *retry_after_ms
        }
        _ => 0,
    };
    Some(ms.div_ceil(1000).max(1).to_string())
}

/// A reply's status and JSON body (`hongbao_proto::api`'s answers).
pub(super) fn reply_json(reply: &Reply) -> (u16, String) {
    let result = reply.result();
    let mut status = status_of(result);
    let body = match reply {
        Reply::Shake {
            result,
            packet_id,
            amount_cents,
            retry_after_ms,
        } => api::to_body(&api::Taken {
            amount_cents: *amount_cents,
            packet_id: *packet_id,
            result: *result,
            retry_after_ms: *retry_after_ms,
        }),
        Reply::Open {
            result,
            packet_id,
            amount_cents,
        } => api::to_body(&api::Taken {
            amount_cents: *amount_cents,
            packet_id: *packet_id,
            result: *result,
            retry_after_ms: 0,
        }),
        Reply::Send {
            result,
            packet_id,
            balance_cents,
        } => {
            if *result == ResultCode::Ok {
                status = 201;
            }
            api::to_body(&api::Sent {
                balance_cents: *balance_cents,
                packet_id: *packet_id,
                result: *result,
            })
        }
        Reply::Chat { result } => api::to_body(&api::Done { result: *result }),
        Reply::Login { result, user_id } => api::to_body(&api::LoggedIn {
            result: *result,
            user_id: *user_id,
        }),
        Reply::Pong {
            client_time_us,
            server_time_us,
        } => api::to_body(&api::Pong {
            client_time_us: *client_time_us,
            result: ResultCode::Ok,
            server_time_us: *server_time_us,
        }),
        Reply::Me(view) => api::to_body(&api::Me {
            balance_cents: view.balance_cents,
            recent_events: view.recent_events.clone(),
            result: ResultCode::Ok,
            user: view.user,
        }),
        Reply::Notices(notices) => api::to_body(&api::Notices {
            notices: notices
                .iter()
                .map(|n| api::PacketNotice {
                    amount_cents: n.amount_cents,
                    expires_at_ms: n.expires_at_ms,
                    from_user: n.from_user.map(|u| u.get()),
                    packet_id: n.packet_id,
                    shares: n.shares,
                })
                .collect(),
            result: ResultCode::Ok,
        }),
        Reply::Error { result, text } => api::to_body(&api::Refused {
            error: text.clone(),
            result: *result,
            retry_after_ms: 0,
        }),
        Reply::RateLimited {
            retry_after_ms,
            text,
        } => api::to_body(&api::Refused {
            error: text.clone(),
            result: ResultCode::RateLimited,
            retry_after_ms: *retry_after_ms,
        }),
    };
    (status, body)
}
