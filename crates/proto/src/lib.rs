//! hongbao's wire protocol.
//!
//! - `message`: the message enum and its codes (no I/O);
//! - `frame`: bytes ↔ frames (no I/O): `check` whether a whole frame is buffered without
//!   allocating, then `decode` it; `encode` appends one frame to a buffer;
//! - `token`: the login token, HMAC-SHA256(secret, user id);
//! - `ws`: WebSocket (RFC 6455) handshakes and frames (no I/O), for the gateway's
//!   browser-facing listener and the load client;
//! - `json`: the JSON form of every message, carried in WebSocket text messages;
//! - `http`: HTTP/1.1 requests for the gateway's REST API (no I/O);
//! - `api`: the HTTP API's answers, typed (what the gateway writes and the load reads);
//! - `client`: a small blocking client over `std::net`, for tests and tools.

pub mod api;
pub mod client;
pub mod frame;
pub mod http;
pub mod json;
pub mod message;
pub mod tls;
pub mod token;
pub mod ws;

pub use frame::{check, decode, encode, encode_to_vec, FrameError, PayloadError};
pub use message::{Frame, KickReason, Message, ResultCode, MAX_FRAME_LEN, VERSION};
