//! The double-mean split (二倍均值法), computed at open time in integer cents.
//!
//! With `remaining_cents` left for `remaining_shares` shares, a share that is not the last
//! is drawn uniformly from [1, 2 × remaining / remaining_shares), and also capped so that
//! every share after it can still get at least one cent; the last share takes exactly what
//! is left. Shares therefore always sum to the packet's amount and none is below 1 cent.

use rand::Rng;

/// The next share of a packet with `remaining_cents` left over `remaining_shares` shares.
/// Requires `remaining_shares >= 1` and `remaining_cents >= remaining_shares`.
pub fn next_share<R: Rng + ?Sized>(
    rng: &mut R,
    remaining_cents: u64,
    remaining_shares: u32,
) -> u64 {
    debug_assert!(remaining_shares >= 1 && remaining_cents >= remaining_shares as u64);
    let n = remaining_shares as u64;
    if n == 1 {
        return remaining_cents;
    }
    // Exclusive bound of the double mean, and the most that leaves 1 cent for each other.
    let double_mean_max = (2 * remaining_cents / n).saturating_sub(1);
    let leave_one_each = remaining_cents - (n - 1);
    let hi = double_mean_max.min(leave_one_each).max(1);
    rng.gen_range(1..=hi)
}

/// Split `amount_cents` into `shares` shares, in opening order. For tests and tools; the
/// server draws one share at a time as recipients open.
pub fn split_all<R: Rng + ?Sized>(rng: &mut R, amount_cents: u64, shares: u32) -> Vec<u64> {
    let mut left = amount_cents;
    (0..shares)
        .map(|i| {
            let share = next_share(rng, left, shares - i);
            left -= share;
            share
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    proptest! {
        #[test]
        fn shares_sum_exactly_and_none_below_one_cent(
            shares in 1u32..200,
            extra in prop_oneof![0u64..10, 0u64..10_000, 0u64..100_000_000],
            seed: u64,
        ) {
            let amount = shares as u64 + extra;
            let mut rng = SmallRng::seed_from_u64(seed);
            let split = split_all(&mut rng, amount, shares);
            prop_assert_eq!(split.len(), shares as usize);
            prop_assert_eq!(split.iter().sum::<u64>(), amount);
            prop_assert!(split.iter().all(|&s| s >= 1));
        }

        #[test]
        fn non_last_shares_stay_below_double_the_mean(
            shares in 2u32..50, extra in 0u64..1_000_000, seed: u64,
        ) {
            let amount = shares as u64 + extra;
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut left = amount;
            for i in 0..shares - 1 {
                let n = (shares - i) as u64;
                let s = next_share(&mut rng, left, shares - i);
                prop_assert!(s == 1 || s < 2 * left / n);
                left -= s;
            }
        }
    }

    #[test]
    fn exact_cents_edge_cases() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(split_all(&mut rng, 3, 3), vec![1, 1, 1]);
        assert_eq!(split_all(&mut rng, 1, 1), vec![1]);
        let big = split_all(&mut rng, 1_000_000_000, 100);
        assert_eq!(big.iter().sum::<u64>(), 1_000_000_000);
    }
}
