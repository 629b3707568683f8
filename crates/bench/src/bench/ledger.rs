//! The money audit's third witness: every balance the ledger holds, user by user, against
//! what each user's client was told it won and opened.

use std::collections::BTreeMap;

use hongbao_money::seam::Balances;

use super::summary::Discrepancy;
use hongbao_load::coordinator::LostSlice;
use hongbao_load::report::UserTotals;

/// What the check covered besides the discrepancies it found.
pub(super) struct Checked {
    pub users_checked: u64,
    /// Money the ledger holds that no client was told of (only counted after a fault).
    pub unacknowledged_cents: u64,
}

/// Holds the ledger's `balances` against what the clients were `told`, adding each user
/// whose amounts differ to `discrepancies`. After a `fault` a reply may be lost after its
/// commit: the ledger may hold money the client was not told of (counted, not a
/// discrepancy), but what a client was told must all be there.
pub(super) fn check(
    balances: &Balances,
    told: &BTreeMap<u64, UserTotals>,
    fault: bool,
    discrepancies: &mut Vec<Discrepancy>,
) -> Checked {
    let mut users_checked = 0u64;
    let mut unacknowledged_cents = 0u64;
    for (user, seen) in told {
        users_checked += 1;
        let server_cents = balances.users.get(user).copied().unwrap_or(0);
        let client_cents = seen.won_cents + seen.opened_cents;
        if fault && server_cents > client_cents {
            unacknowledged_cents += server_cents - client_cents;
        } else if server_cents != client_cents {
            discrepancies.push(Discrepancy {
                user: Some(*user),
                ..Discrepancy::new("user_balance", None, server_cents, client_cents)
            });
        }
    }
    for (user, cents) in &balances.users {
        if fault && !told.contains_key(user) {
            unacknowledged_cents += cents;
        } else if !told.contains_key(user) {
            discrepancies.push(Discrepancy {
                user: Some(*user),
                ..Discrepancy::new("user_balance", None, *cents, 0)
            });
        }
    }
    Checked {
        users_checked,
        unacknowledged_cents,
    }
}

/// What each user gained since `before` (a running deployment's balances at the start).
pub(super) fn since(now: &Balances, before: &Balances) -> Balances {
    let users = now
        .users
        .iter()
        .map(|(user, cents)| {
            (
                *user,
                cents - before.users.get(user).copied().unwrap_or(0).min(*cents),
            )
        })
        .filter(|(_, cents)| *cents > 0)
        .collect();
    Balances {
        users,
        campaigns: now.campaigns.clone(),
    }
}

/// The balances without the users of slices lost before their last report (what they
/// were told is not all known), and how many users those slices held.
pub(super) fn without_lost(mut balances: Balances, lost: &[LostSlice]) -> (Balances, u64) {
    let held = |user: &u64| {
        lost.iter()
            .any(|l| (l.first_user..=l.last_user).contains(user))
    };
    balances.users.retain(|user, _| !held(user));
    let users = lost.iter().map(|l| l.last_user + 1 - l.first_user).sum();
    (balances, users)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balances(users: &[(u64, u64)]) -> Balances {
        Balances {
            users: users.iter().copied().collect(),
            campaigns: BTreeMap::new(),
        }
    }

    /// A deployment's earlier money is not this run's: only the gains are checked.
    #[test]
    fn only_this_runs_gains_are_checked() {
        let before = balances(&[(1, 500), (2, 70)]);
        let now = balances(&[(1, 800), (2, 70), (3, 40)]);
        assert_eq!(
            since(&now, &before).users,
            balances(&[(1, 300), (3, 40)]).users
        );
    }

    /// A lost slice's users leave the check; the others stay.
    #[test]
    fn a_lost_slices_users_leave_the_check() {
        let lost = LostSlice {
            index: 1,
            unix_ms: 0,
            why: "cut off".into(),
            first_user: 11,
            last_user: 20,
            last_second: Some(3),
            counters: Default::default(),
        };
        let (kept, n) = without_lost(balances(&[(10, 1), (11, 2), (20, 3), (21, 4)]), &[lost]);
        assert_eq!(kept.users, balances(&[(10, 1), (21, 4)]).users);
        assert_eq!(n, 10);
    }
}
