//! hongbao's wire protocol.
//!
//! - `message`: the message enum and its codes (no I/O);
//! - `frame`: bytes ↔ frames (no I/O): `check` whether a whole frame is buffered without
//!   allocating, then `decode` it; `encode` appends one frame to a buffer;
//! - `token`: the login token, HMAC-SHA256(secret, user id);
//! - `client`: a small blocking client over `std::net`, for tests and tools.

pub mod client;
pub mod frame;
pub mod message;
pub mod token;

pub use frame::{check, decode, encode, encode_to_vec, FrameError, PayloadError};
pub use message::{Frame, KickReason, Message, ResultCode, MAX_FRAME_LEN, VERSION};
