//! The ledger's hash chain: each event carries the SHA-256 of the one before it and of
//! itself, so no past event can be edited, removed or put in between without every later
//! hash changing (docs/ledger.md). Both backends chain with this one function: the
//! embedded ledger one chain for the whole ledger, the cluster one chain per gateway host
//! (PostgreSQL computes the same formula as it inserts; the audit recomputes it here).
//!
//! `hash(n) = SHA-256("hongbao ledger v1" ‖ hash(n−1) ‖ seq ‖ ts_ms ‖ body)`, the first
//! event's `hash(0)` 32 zero bytes, seq and ts_ms as 8 bytes big-endian, body the event's
//! JSON as stored. The newest (seq, hash) is the *head*: published in `/v1/audit`, so an
//! operator who keeps it elsewhere can later prove the ledger still holds it — the one
//! edit a chain alone cannot show is its newest events cut off.

use sha2::{Digest, Sha256};

/// What the first event chains from.
pub const GENESIS: [u8; 32] = [0; 32];

const DOMAIN: &[u8] = b"hongbao ledger v1";

/// An event's hash, chained from `prev`.
pub fn link(prev: &[u8; 32], seq: u64, ts_ms: u64, body: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    h.update(prev);
    h.update(seq.to_be_bytes());
    h.update(ts_ms.to_be_bytes());
    h.update(body.as_bytes());
    h.finalize().into()
}

/// The newest event's number and hash (`seq` 0 and [`GENESIS`] for an empty ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub hash: [u8; 32],
}

impl Default for Head {
    fn default() -> Head {
        Head {
            seq: 0,
            hash: GENESIS,
        }
    }
}

impl Head {
    pub fn hex(&self) -> String {
        data_encoding::HEXLOWER.encode(&self.hash)
    }

    /// `SEQ:HEX`, as `/v1/audit` and `ledger verify --head` write it.
    pub fn text(&self) -> String {
        format!("{}:{}", self.seq, self.hex())
    }

    /// Reads `SEQ:HEX`.
    pub fn parse(text: &str) -> Option<Head> {
        let (seq, hex) = text.trim().split_once(':')?;
        let bytes = data_encoding::HEXLOWER_PERMISSIVE
            .decode(hex.as_bytes())
            .ok()?;
        Some(Head {
            seq: seq.parse().ok()?,
            hash: bytes.try_into().ok()?,
        })
    }

    /// The head after the event `seq` (its `ts_ms` and `body`).
    pub fn next(&self, seq: u64, ts_ms: u64, body: &str) -> Head {
        Head {
            seq,
            hash: link(&self.hash, seq, ts_ms, body),
        }
    }
}

/// Walks the chain event by event and says where it first breaks.
#[derive(Debug, Default)]
pub struct Walk {
    head: Head,
    /// The first event that does not match, and why.
    pub broken: Option<(u64, String)>,
}

impl Walk {
    /// Takes the next stored event; false once the chain is broken.
    pub fn step(&mut self, seq: u64, ts_ms: u64, body: &str, stored: Option<&[u8]>) -> bool {
        if self.broken.is_some() {
            return false;
        }
        if seq != self.head.seq + 1 {
            self.broken = Some((
                seq,
                format!(
                    "event {seq} follows event {}: events {}..={} are missing",
                    self.head.seq,
                    self.head.seq + 1,
                    seq.saturating_sub(1)
                ),
            ));
            return false;
        }
        let next = self.head.next(seq, ts_ms, body);
        match stored {
            Some(hash) if hash == next.hash => {
                self.head = next;
                true
            }
            Some(_) => {
                self.broken = Some((
                    seq,
                    format!("event {seq}: its hash does not match the chain (the event, or its hash, was changed)"),
                ));
                false
            }
            None => {
                self.broken = Some((seq, format!("event {seq} has no hash")));
                false
            }
        }
    }

    /// The head walked so far (up to the break).
    pub fn head(&self) -> Head {
        self.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(bodies: &[&str]) -> Vec<(u64, u64, String, [u8; 32])> {
        let mut head = Head::default();
        bodies
            .iter()
            .enumerate()
            .map(|(i, body)| {
                let seq = i as u64 + 1;
                head = head.next(seq, 1000 + seq, body);
                (seq, 1000 + seq, body.to_string(), head.hash)
            })
            .collect()
    }

    fn walk(events: &[(u64, u64, String, [u8; 32])]) -> Walk {
        let mut w = Walk::default();
        for (seq, ts, body, hash) in events {
            w.step(*seq, *ts, body, Some(hash));
        }
        w
    }

    /// An untouched chain walks to its head; an edited body, an edited hash, a removed
    /// event each break it at the first event that no longer matches.
    #[test]
    fn every_edit_breaks_the_chain_where_it_is() {
        let events = chain(&["a", "b", "c", "d"]);
        let w = walk(&events);
        assert!(w.broken.is_none());
        assert_eq!(w.head().seq, 4);
        assert_eq!(w.head().hash, events[3].3);

        let mut edited = events.clone();
        edited[1].2 = "B".into();
        assert_eq!(walk(&edited).broken.unwrap().0, 2);

        let mut rehashed = events.clone();
        rehashed[2].3[0] ^= 1;
        assert_eq!(walk(&rehashed).broken.unwrap().0, 3);

        let mut removed = events.clone();
        removed.remove(1);
        let (at, why) = walk(&removed).broken.unwrap();
        assert_eq!(at, 3);
        assert!(why.contains("events 2..=2 are missing"), "{why}");

        // Removed and renumbered to hide the gap: the hashes still tell.
        let mut renumbered = chain(&["a", "c", "d"]);
        renumbered[1].3 = events[2].3;
        assert_eq!(walk(&renumbered).broken.unwrap().0, 2);
    }

    #[test]
    fn a_head_reads_back_from_its_text() {
        let head = Head::default().next(1, 5, "x");
        assert_eq!(Head::parse(&head.text()), Some(head));
        assert_eq!(Head::parse("1:zz"), None);
        assert_eq!(Head::parse("x:00"), None);
    }
}
