//! Who and where: users, gateway workers, and connections inside a worker.

use std::fmt;
use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

/// A user who can log in. Ids start at 1: on the wire 0 stands for "nobody" (the sender
/// of a system campaign's packets), so it is never a `UserId`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserId(NonZeroU64);

impl UserId {
    /// `None` for 0.
    pub fn new(id: u64) -> Option<UserId> {
        NonZeroU64::new(id).map(UserId)
    }

    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A gateway worker process: its index, stable across restarts of that worker.
pub type WorkerId = u16;

/// One connection inside a worker: its slab key and a generation, so an answer for a
/// closed connection can never reach the next owner of its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConnId {
    pub key: u32,
    pub generation: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_zero_is_nobody_and_costs_no_space() {
        assert_eq!(UserId::new(0), None);
        assert_eq!(UserId::new(42).unwrap().get(), 42);
        assert_eq!(std::mem::size_of::<Option<UserId>>(), 8);
        assert_eq!(serde_json::to_string(&UserId::new(7)).unwrap(), "7");
        assert!(serde_json::from_str::<UserId>("0").is_err());
    }
}
