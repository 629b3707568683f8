//! The money side of hongbao, as plain code both backends share — the embedded core with
//! its SQLite ledger, and the cluster backend on Redis and PostgreSQL:
//!
//! - `ids`: users, workers, connections;
//! - `event`: what a ledger stores, and how each event moves balances;
//! - `split`: the double-mean split of a sent packet, in integer cents;
//! - `rules`: limits and the checks a send or a campaign must pass;
//! - `api`: what operators and clients read (campaign status, the audit, a user's view,
//!   a packet notice);
//! - `gateway`: what the gateways and the money side say to each other, free of any
//!   transport (requests, replies, pushes);
//! - `seam`: the one interface the gateways reach money through;
//! - `chain`: the ledger's hash chain (one per embedded ledger, one per cluster host);
//! - `error`: what kind of failure (refused, unavailable, a bug), and its cause;
//! - `access`: admin keys and the admin log as the ledger keeps them, and the store
//!   each backend gives them;
//! - `presence`: which connection each logged-in user is on, beside the money side:
//!   logins, chat, and where a notice goes.

pub mod access;
pub mod api;
pub mod chain;
pub mod error;
pub mod event;
pub mod gateway;
pub mod ids;
pub mod presence;
pub mod rules;
pub mod seam;
pub mod split;

pub use api::{Audit, CampaignStatus, Notice, UserView};
pub use error::{Error, ErrorKind};
pub use event::{Account, Event, Record};
pub use gateway::{Push, Reply, Request};
pub use ids::{ConnId, UserId, WorkerId};
pub use seam::{AdminAnswer, AdminRequest, Money, Op, Origin, Output};
