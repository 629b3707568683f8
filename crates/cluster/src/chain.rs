//! The cluster ledger's hash chains, as the audit walks them: one chain per gateway host,
//! each event linked to the one before it *of the same host* (by `seq`, which all hosts
//! draw from one sequence, so a host's events are not numbered one after another; each
//! drawn under a lock on its host's row, so `seq` order is the chain's order).
//! PostgreSQL hashes each event as it is inserted (`hb_chain` in `schema.sql`); here the
//! same formula, `hongbao_money::chain::link`, recomputes every host's chain from the
//! stored events and compares: the first event of a host whose stored hash differs is
//! where the chain breaks. As in the embedded ledger, the newest events cut off leave a
//! shorter chain that holds: only a head kept elsewhere shows that.
//!
//! Events up to `hb_chain_since` were written before the chain and are not walked.

use std::collections::BTreeMap;

use hongbao_money::chain::Head;

/// Every host's chain, walked in one pass over the events in `seq` order.
#[derive(Debug, Default)]
pub struct Chains {
    /// The newest event from before the chain.
    since: u64,
    hosts: BTreeMap<String, HostChain>,
    /// Events walked (those after `since`).
    pub events: u64,
}

#[derive(Debug, Default)]
struct HostChain {
    /// Where the walk is: the host's newest chained event so far.
    walked: Head,
    /// The first event that does not match, and why.
    broken: Option<(u64, String)>,
}

/// What the walk found: each sound host's head, and each break.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walked {
    pub heads: BTreeMap<String, String>,
    pub problems: Vec<String>,
}

impl Chains {
    /// A walk of the events after `since`.
    pub fn new(since: u64) -> Chains {
        Chains {
            since,
            ..Chains::default()
        }
    }

    /// Takes the next stored event (in `seq` order, every host's together).
    pub fn step(&mut self, host: &str, seq: u64, at_ms: u64, body: &str, stored: Option<&[u8]>) {
        if seq <= self.since {
            return;
        }
        self.events += 1;
        // The host's name is copied once, at its first event.
        let chain = match self.hosts.get_mut(host) {
            Some(chain) => chain,
            None => self.hosts.entry(host.to_string()).or_default(),
        };
        if chain.broken.is_some() {
            return;
        }
        let next = chain.walked.next(seq, at_ms, body);
        match stored {
            Some(hash) if hash == next.hash => chain.walked = next,
            Some(_) => {
                chain.broken = Some((
                    seq,
                    format!(
                        "event {seq}: its hash does not match the chain (the event or its \
                         hash was changed, or an event of this host before it removed)"
                    ),
                ))
            }
            None => chain.broken = Some((seq, format!("event {seq} has no hash"))),
        }
    }

    /// Each host's head, or where its chain breaks: its first event that does not match.
    pub fn finish(self) -> Walked {
        let mut walked = Walked::default();
        for (host, chain) in self.hosts {
            match chain.broken {
                Some((_, why)) => walked.problems.push(format!("host {host}: {why}")),
                None => {
                    walked.heads.insert(host, chain.walked.text());
                }
            }
        }
        walked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event as stored: (host, seq, at_ms, body, hash — empty for NULL).
    type Stored = (String, u64, u64, String, Vec<u8>);

    /// Hosts' events interleaved in one numbering, each host's chained on its own, as
    /// `hb_chain` chains them; and each host's newest event.
    fn ledger(hosts: &[&str]) -> (Vec<Stored>, BTreeMap<String, Head>) {
        let mut heads: BTreeMap<String, Head> = BTreeMap::new();
        let events = hosts
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let seq = 10 + i as u64;
                let body = format!(r#"{{"n": {i}}}"#);
                let head = heads.entry(host.to_string()).or_default();
                *head = head.next(seq, 1000 + seq, &body);
                (host.to_string(), seq, 1000 + seq, body, head.hash.to_vec())
            })
            .collect();
        (events, heads)
    }

    fn walk(since: u64, events: &[Stored]) -> Walked {
        let mut chains = Chains::new(since);
        for (host, seq, at, body, hash) in events {
            let hash = (!hash.is_empty()).then_some(hash.as_slice());
            chains.step(host, *seq, *at, body, hash);
        }
        chains.finish()
    }

    #[test]
    fn untouched_chains_give_one_head_a_host() {
        let (events, heads) = ledger(&["a", "b", "a", "a", "b"]);
        let w = walk(0, &events);
        assert_eq!(w.problems, Vec::<String>::new());
        assert_eq!(w.heads.len(), 2);
        assert_eq!(heads["a"].seq, 13);
        assert_eq!(w.heads["a"], heads["a"].text());
        assert_eq!(heads["b"].seq, 14);
        assert_eq!(w.heads["b"], heads["b"].text());
    }

    /// An edited body breaks its host's chain at that event, and only that host's.
    #[test]
    fn an_edit_is_named_by_host_and_seq() {
        let (mut events, _) = ledger(&["a", "b", "a", "a", "b"]);
        events[2].3 = r#"{"n": 99}"#.into();
        let w = walk(0, &events);
        assert_eq!(w.problems.len(), 1, "{:?}", w.problems);
        assert!(
            w.problems[0].starts_with("host a: event 12: its hash does not match"),
            "{:?}",
            w.problems
        );
        assert!(w.heads.contains_key("b") && !w.heads.contains_key("a"));
    }

    /// A removed event shows at the host's next one; a wiped hash at that event; the
    /// newest event removed leaves a shorter chain (only a head kept elsewhere tells).
    #[test]
    fn removals_and_wiped_hashes_break_the_chain() {
        let (events, _) = ledger(&["a", "b", "a", "a", "b"]);
        let mut removed = events.clone();
        removed.remove(2);
        let w = walk(0, &removed);
        assert!(
            w.problems[0].starts_with("host a: event 13:"),
            "{:?}",
            w.problems
        );

        let mut wiped = events.clone();
        wiped[1].4.clear();
        let w = walk(0, &wiped);
        assert_eq!(w.problems, ["host b: event 11 has no hash"]);

        let mut cut = events.clone();
        cut.pop();
        let w = walk(0, &cut);
        assert!(w.problems.is_empty());
        assert!(w.heads["b"].starts_with("11:"));
    }

    /// Events from before the chain (hash NULL, at or below `since`) are not walked; the
    /// chain starts after them from 32 zero bytes.
    #[test]
    fn events_before_the_chain_are_left_out() {
        let (mut events, _) = ledger(&["a", "b", "a"]);
        events.insert(0, ("a".into(), 3, 5, "{}".into(), Vec::new()));
        events.insert(0, ("c".into(), 2, 5, "{}".into(), Vec::new()));
        let w = walk(9, &events);
        assert_eq!(w.problems, Vec::<String>::new());
        assert_eq!(w.heads.keys().collect::<Vec<_>>(), ["a", "b"]);
    }
}
