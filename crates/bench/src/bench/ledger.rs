//! The money audit's third witness: every balance the ledger holds, user by user, against
//! what each user's client was told it won and opened.

use std::collections::BTreeMap;

use hongbao_money::seam::Balances;

use super::summary::Discrepancy;
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
