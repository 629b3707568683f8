//! When a simulated user comes back after its connection is lost, as the client libraries
//! do (docs/clients.md): a crowd dropped together must not come back together.
//!
//! - After a failure (refused, reset, timed out — a server whose accept queue is full
//!   just does not answer — a failed handshake, a come-back kick that names no wait): full
//!   jitter, a delay drawn uniformly from [0, min(cap, base × 2^attempt)), and the attempt
//!   counts (AWS's "full jitter"; gRPC's connection back-off grows the same way).
//! - After a kick that names when to come back (a draining server's `retry_after_ms`, a
//!   refused upgrade's `Retry-After`): ½× to 1½× of that wait; the attempt does not count
//!   (being sent away on purpose is not a failure, and the server spread its kicks).
//! - After a terminal kick (`replaced`, `bad-token`, `expired`, `revoked`): never.
//! - A login ends the trouble: the count starts again (gRPC's rule: its back-off goes
//!   back to the first window after a successful connection). Counting on past a login
//!   until a session had lasted 10 s kept the users of a server restarted every few
//!   seconds away for half a minute, longer than the restarts themselves.
//!
//! Plain arithmetic, the random draw passed in: tested on a simulated clock.

/// The first window.
pub const BASE_MS: u64 = 500;
/// The widest window.
pub const CAP_MS: u64 = 30_000;
/// Why a user's connection ended, as far as coming back goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Failed (or a come-back kick with no wait named): back off.
    Failed,
    /// The server named when to come back, in ms.
    Hinted(u32),
    /// A terminal kick: do not come back.
    Terminal,
}

/// The wait before a user's next attempt, in ms (`None`: none), and its attempt count
/// after it (0 again once it logs in); `unit` a draw uniform in [0, 1).
pub fn next(ended: Ended, attempt: u8, unit: f64) -> (Option<u64>, u8) {
    match ended {
        Ended::Terminal => (None, attempt),
        Ended::Hinted(ms) => {
            let ms = f64::from(ms.max(1));
            (Some((ms * (0.5 + unit)) as u64), attempt)
        }
        Ended::Failed => {
            let window = BASE_MS.saturating_mul(1 << attempt.min(16)).min(CAP_MS);
            (
                Some((window as f64 * unit) as u64),
                attempt.saturating_add(1),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_widen_a_full_jitter_window_to_the_cap() {
        let top = 0.999_999;
        let mut attempt = 0;
        let mut waits = Vec::new();
        for _ in 0..9 {
            let (wait, next) = next(Ended::Failed, attempt, top);
            waits.push(wait.unwrap());
            attempt = next;
        }
        assert_eq!(
            waits,
            [499, 999, 1999, 3999, 7999, 15999, 29999, 29999, 29999]
        );
        // The bottom of every window is now.
        assert_eq!(next(Ended::Failed, 5, 0.0).0, Some(0));
    }

    #[test]
    fn a_hint_is_spread_and_does_not_count() {
        assert_eq!(next(Ended::Hinted(2000), 3, 0.0), (Some(1000), 3));
        assert_eq!(next(Ended::Hinted(2000), 3, 0.999_999).0, Some(2999));
        assert_eq!(next(Ended::Terminal, 3, 0.5), (None, 3));
    }

    /// A thousand users dropped at one instant, on a simulated clock: with full jitter
    /// they come back spread over the window, not in a wave; a hinted drain spreads them
    /// over the hint's half to one and a half.
    #[test]
    fn a_crowd_dropped_at_once_comes_back_spread() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(51);
        let mut buckets = |ended: Ended, attempt: u8| {
            let mut per_100ms = std::collections::BTreeMap::<u64, u32>::new();
            for _ in 0..1000 {
                let wait = next(ended, attempt, rng.gen()).0.unwrap();
                *per_100ms.entry(wait / 100).or_default() += 1;
            }
            per_100ms
        };
        // The fourth failure's window is 4 s: 40 buckets, 25 each on average.
        let failed = buckets(Ended::Failed, 3);
        assert!(failed.keys().all(|b| *b < 40), "{failed:?}");
        assert!(failed.values().all(|n| *n <= 50), "{failed:?}");
        // A drain saying 2.5 s: 1.25 to 3.75 s.
        let hinted = buckets(Ended::Hinted(2500), 0);
        assert!(hinted.keys().all(|b| (12..38).contains(b)), "{hinted:?}");
        assert!(hinted.values().all(|n| *n <= 80), "{hinted:?}");
    }
}
