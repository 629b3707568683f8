//! The bench's per-operation check, Jepsen's way: every load client process records each
//! win and open its users were told of (`report::History`, gathered by the coordinator),
//! and after the run the bench holds that history against the ledger's own wins and
//! opened shares (`GET /v1/ledger/ops`, paged).
//!
//! Every acknowledged operation must be in the ledger exactly once, for the same user and
//! the same cents; the ledger must hold no packet won twice and no share opened twice, and
//! no client may have been told of one twice. The three-way audit beside it compares
//! sums (campaign counts, user balances), where two errors can cancel out — a user's win
//! lost and another of the same amount paid to them twice leave the balance right; here
//! each operation is checked by its key (a packet for a win; a packet and its recipient
//! for an open).
//!
//! The ledger may hold more than the clients were told of: a reply lost after its commit
//! (under a fault, a gateway killed between the two) leaves a paid operation nobody heard
//! of. Those are counted in `ledger_only`, never an error here; whether they were allowed
//! is the balance audit's call (after a fault, `unacknowledged_cents`).

use std::collections::BTreeMap;

use hongbao_money::seam::{LedgerOp, OpsPage};

use super::server::Server;
use super::summary::{Discrepancy, Finding, HistorySummary, Operation, Payee};
use crate::{Error, Result};
use hongbao_load::report::{Acked, History};

/// What of a deployment's ledger is the run's (`--target`): the wins of its campaigns,
/// and the opens the ledger did not hold before it began.
pub(super) struct Scope {
    /// The run's shake campaigns (a shake packet's id names its campaign).
    pub campaigns: Vec<u32>,
    /// Opened shares, (packet, user), the ledger held when the run began.
    pub opens_before: std::collections::BTreeSet<(u64, u64)>,
}

impl Scope {
    /// The ledger's operations as the run begins.
    pub(super) fn before(server: &Server) -> Result<Scope> {
        let (_, opens) = read_ledger(|path| server.get(path))?;
        Ok(Scope {
            campaigns: Vec::new(),
            opens_before: opens.iter().map(|o| (o.packet, o.user)).collect(),
        })
    }

    fn ours(&self, win_packet: u64) -> bool {
        self.campaigns
            .contains(&hongbao_money::rules::shake_packet_parts(win_packet).0)
    }
}

/// Reads the ledger's wins and opens through `server` and checks the clients' history
/// `told` against them — only the run's, with a `scope` — ; a failed check is also a
/// `history` discrepancy of the audit.
pub(super) fn check(
    server: &Server,
    told: &History,
    scope: Option<&Scope>,
    discrepancies: &mut Vec<Discrepancy>,
    say: fn(&str),
) -> Result<HistorySummary> {
    let (mut wins, mut opens) = read_ledger(|path| server.get(path))?;
    let mut told = told.clone();
    if let Some(scope) = scope {
        wins.retain(|w| scope.ours(w.packet));
        told.wins.retain(|w| scope.ours(w.packet));
        opens.retain(|o| !scope.opens_before.contains(&(o.packet, o.user)));
    }
    let summary = judge(&told, &wins, &opens);
    let s = &summary;
    say(&format!(
        "bench: history: {} wins and {} opens told, {} as told in the ledger ({} wins, {} opens); {} missing, {} mismatched, {} duplicated; {} only in the ledger ({} cents): {}",
        s.wins_told, s.opens_told, s.confirmed, s.wins_in_ledger, s.opens_in_ledger,
        s.missing.count, s.mismatched.count, s.duplicates.count, s.ledger_only.count,
        s.ledger_only_cents, if s.ok { "ok" } else { "FAILED" }
    ));
    if !summary.ok {
        discrepancies.push(Discrepancy::new(
            "history",
            None,
            summary.wins_in_ledger + summary.opens_in_ledger,
            summary.wins_told + summary.opens_told,
        ));
    }
    Ok(summary)
}

/// Every win and every opened share the ledger holds, page by page through `get`.
fn read_ledger(
    mut get: impl FnMut(&str) -> Result<OpsPage>,
) -> Result<(Vec<LedgerOp>, Vec<LedgerOp>)> {
    let (mut wins, mut opens) = (Vec::new(), Vec::new());
    let mut path = "/v1/ledger/ops".to_string();
    loop {
        let mut page = get(&path)?;
        wins.append(&mut page.wins);
        opens.append(&mut page.opens);
        match page.next {
            Some(next) => {
                let after = format!("/v1/ledger/ops?after={next}");
                if after == path {
                    return Err(Error::Answer(format!(
                        "the ledger's pages do not move on from {next}"
                    )));
                }
                path = after;
            }
            None => return Ok((wins, opens)),
        }
    }
}

/// The check itself, on what the clients were `told` and what the ledger holds.
fn judge(told: &History, ledger_wins: &[LedgerOp], ledger_opens: &[LedgerOp]) -> HistorySummary {
    let mut s = HistorySummary {
        wins_told: told.wins.len() as u64,
        wins_in_ledger: ledger_wins.len() as u64,
        opens_in_ledger: ledger_opens.len() as u64,
        ..HistorySummary::default()
    };
    // A win is its packet's: told to two users, it was told twice.
    let wins = by_key(
        &told.wins,
        |a| (a.packet, 0),
        ledger_wins,
        |o| (o.packet, 0),
    );
    // An open is a recipient's share of a packet; the same amount told again is the same
    // open (`already-opened` after a lost reply).
    let key = |a: &Acked| (a.packet, a.user);
    let mut opens = by_key(&told.opens, key, ledger_opens, |o| (o.packet, o.user));
    for (said, _) in opens.values_mut() {
        said.sort();
        said.dedup();
        s.opens_told += said.len() as u64;
    }
    for (op, keyed) in [(Operation::Win, wins), (Operation::Open, opens)] {
        for ((packet, _), (said, held)) in keyed {
            let finding = Finding {
                op,
                packet,
                told: said,
                ledger: held,
            };
            match (finding.told.as_slice(), finding.ledger.as_slice()) {
                ([], held) => {
                    s.ledger_only_cents += held.iter().map(|p| p.amount_cents).sum::<u64>();
                    if held.len() > 1 {
                        s.duplicates.add(finding.clone());
                    }
                    s.ledger_only.add(finding);
                }
                ([_], []) => s.missing.add(finding),
                ([said], [held]) if said == held => s.confirmed += 1,
                ([_], [_]) => s.mismatched.add(finding),
                _ => s.duplicates.add(finding),
            }
        }
    }
    s.ok = s.missing.count == 0 && s.mismatched.count == 0 && s.duplicates.count == 0;
    s
}

/// Told and held operations side by side, by key, in key order.
type Keyed = BTreeMap<(u64, u64), (Vec<Payee>, Vec<Payee>)>;

fn by_key(
    told: &[Acked],
    told_key: impl Fn(&Acked) -> (u64, u64),
    ledger: &[LedgerOp],
    ledger_key: impl Fn(&LedgerOp) -> (u64, u64),
) -> Keyed {
    let mut keyed = Keyed::new();
    for a in told {
        keyed.entry(told_key(a)).or_default().0.push(Payee {
            user: a.user,
            amount_cents: a.amount_cents,
        });
    }
    for o in ledger {
        keyed.entry(ledger_key(o)).or_default().1.push(Payee {
            user: o.user,
            amount_cents: o.amount_cents,
        });
    }
    keyed
}

#[cfg(test)]
mod tests {
    use super::super::summary::FIRST;
    use super::*;
    use hongbao_money::seam::OpsCursor;

    fn acked(user: u64, packet: u64, amount_cents: u64) -> Acked {
        Acked {
            user,
            packet,
            amount_cents,
        }
    }

    fn held(user: u64, packet: u64, amount_cents: u64) -> LedgerOp {
        LedgerOp {
            packet,
            user,
            amount_cents,
        }
    }

    fn payee(user: u64, amount_cents: u64) -> Payee {
        Payee { user, amount_cents }
    }

    /// Two wins and two opens, told and held alike.
    fn agreed() -> (History, Vec<LedgerOp>, Vec<LedgerOp>) {
        let told = History {
            wins: vec![acked(1, 100, 250), acked(2, 101, 90)],
            opens: vec![acked(1, 7, 300), acked(3, 7, 200)],
        };
        let wins = vec![held(2, 101, 90), held(1, 100, 250)];
        let opens = vec![held(3, 7, 200), held(1, 7, 300)];
        (told, wins, opens)
    }

    #[test]
    fn a_history_the_ledger_holds_exactly_is_ok() {
        let (told, wins, opens) = agreed();
        let s = judge(&told, &wins, &opens);
        assert!(s.ok, "{s:?}");
        assert_eq!(
            (
                s.wins_told,
                s.opens_told,
                s.wins_in_ledger,
                s.opens_in_ledger
            ),
            (2, 2, 2, 2)
        );
        assert_eq!(s.confirmed, 4);
        assert_eq!(s.ledger_only.count + s.ledger_only_cents, 0);
        assert!(judge(&History::default(), &[], &[]).ok);
    }

    #[test]
    fn an_acknowledged_win_or_open_not_in_the_ledger_is_missing() {
        let (told, mut wins, mut opens) = agreed();
        wins.retain(|w| w.packet != 100);
        opens.retain(|o| o.user != 3);
        let s = judge(&told, &wins, &opens);
        assert!(!s.ok);
        assert_eq!(s.missing.count, 2);
        assert_eq!(
            s.missing.first[0],
            Finding {
                op: Operation::Win,
                packet: 100,
                told: vec![payee(1, 250)],
                ledger: vec![],
            }
        );
        assert_eq!(s.missing.first[1].op, Operation::Open);
        assert_eq!(s.missing.first[1].told, [payee(3, 200)]);
        assert_eq!(s.confirmed, 2);
    }

    #[test]
    fn another_amount_or_another_winner_is_a_mismatch() {
        let (told, mut wins, mut opens) = agreed();
        wins[0].user = 9; // packet 101 paid to user 9, not user 2
        opens[1].amount_cents = 301;
        let s = judge(&told, &wins, &opens);
        assert!(!s.ok);
        assert_eq!(s.mismatched.count, 2);
        let win = &s.mismatched.first[0];
        assert_eq!(
            (win.packet, win.told[0], win.ledger[0]),
            (101, payee(2, 90), payee(9, 90))
        );
        let open = &s.mismatched.first[1];
        assert_eq!(
            (open.told[0], open.ledger[0]),
            (payee(1, 300), payee(1, 301))
        );
        assert_eq!(s.missing.count + s.duplicates.count, 0);
    }

    #[test]
    fn a_packet_paid_twice_or_told_twice_is_a_duplicate() {
        // The ledger pays packet 100 twice, and user 3's share twice.
        let (told, mut wins, mut opens) = agreed();
        wins.push(held(4, 100, 250));
        opens.push(held(3, 7, 200));
        let s = judge(&told, &wins, &opens);
        assert!(!s.ok);
        assert_eq!(s.duplicates.count, 2);
        assert_eq!(s.duplicates.first[0].ledger, [payee(1, 250), payee(4, 250)]);
        assert_eq!(s.duplicates.first[1].ledger, [payee(3, 200), payee(3, 200)]);

        // Two users told they won packet 101; user 1 told two amounts for one share.
        let (mut told, wins, opens) = agreed();
        told.wins.push(acked(5, 101, 90));
        told.opens.push(acked(1, 7, 350));
        let s = judge(&told, &wins, &opens);
        assert!(!s.ok);
        assert_eq!(s.duplicates.count, 2);
        assert_eq!(s.duplicates.first[0].told, [payee(2, 90), payee(5, 90)]);
        assert_eq!(s.duplicates.first[1].told, [payee(1, 300), payee(1, 350)]);
        assert_eq!(s.wins_told, 3);
        assert_eq!(s.opens_told, 3);

        // A share paid twice that nobody was told of is still a duplicate.
        let (told, wins, mut opens) = agreed();
        opens.extend([held(6, 8, 40), held(6, 8, 40)]);
        let s = judge(&told, &wins, &opens);
        assert_eq!(
            (s.ok, s.duplicates.count, s.ledger_only.count),
            (false, 1, 1)
        );
    }

    #[test]
    fn the_same_open_told_again_is_one_open() {
        let (mut told, wins, opens) = agreed();
        told.opens.push(acked(3, 7, 200));
        let s = judge(&told, &wins, &opens);
        assert!(s.ok, "{s:?}");
        assert_eq!((s.opens_told, s.confirmed), (2, 4));
    }

    /// Under a fault a reply can be lost after its commit: the ledger holds operations
    /// nobody was told of. Counted, with their cents; not an error.
    #[test]
    fn what_only_the_ledger_holds_is_counted_not_an_error() {
        let (told, mut wins, mut opens) = agreed();
        wins.push(held(8, 102, 500));
        opens.push(held(2, 7, 100));
        let s = judge(&told, &wins, &opens);
        assert!(s.ok, "{s:?}");
        assert_eq!((s.ledger_only.count, s.ledger_only_cents), (2, 600));
        assert_eq!(s.ledger_only.first[0].ledger, [payee(8, 500)]);
        assert!(s.ledger_only.first[1].told.is_empty());
        assert_eq!(s.confirmed, 4);
    }

    #[test]
    fn findings_are_counted_all_and_listed_first_few() {
        let told = History {
            wins: (0..25).map(|p| acked(1, p, 10)).collect(),
            opens: Vec::new(),
        };
        let s = judge(&told, &[], &[]);
        assert_eq!((s.missing.count, s.missing.first.len()), (25, FIRST));
        assert_eq!(s.missing.first[0].packet, 0);
    }

    #[test]
    fn the_ledger_is_read_page_by_page_to_the_end() {
        let mut asked = Vec::new();
        let (wins, opens) = read_ledger(|path| {
            asked.push(path.to_string());
            Ok(match asked.len() {
                1 => OpsPage {
                    wins: vec![held(1, 100, 5), held(2, 101, 6)],
                    opens: vec![],
                    next: Some(OpsCursor::Win(101)),
                },
                2 => OpsPage {
                    wins: vec![],
                    opens: vec![held(3, 7, 8)],
                    next: Some(OpsCursor::Open { packet: 7, user: 3 }),
                },
                _ => OpsPage::default(),
            })
        })
        .unwrap();
        assert_eq!(
            asked,
            [
                "/v1/ledger/ops",
                "/v1/ledger/ops?after=win.101",
                "/v1/ledger/ops?after=open.7.3"
            ]
        );
        assert_eq!((wins.len(), opens.len()), (2, 1));

        // A ledger whose pages never move on is an error, not a loop forever.
        let stuck = read_ledger(|_| {
            Ok(OpsPage {
                next: Some(OpsCursor::Seq(4)),
                ..OpsPage::default()
            })
        });
        assert!(stuck.is_err());
    }
}
