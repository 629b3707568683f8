use super::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hongbao_money::rules::shake_packet_id;
use hongbao_money::seam::{LedgerOp, LedgerRead, OpsCursor};

use super::writer::next_commit;

fn won(seq: u64, user: u64, cents: u64) -> Record {
    Record {
        seq,
        ts_ms: 1000 + seq,
        event: Event::ShakeWon {
            campaign: 1,
            index: seq as u32,
            user,
            amount_cents: cents,
        },
    }
}

#[test]
fn append_then_read_back_in_order_with_balances() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(dir.path()).unwrap();
    ledger.append(&[won(1, 7, 100), won(2, 8, 50)]).unwrap();
    ledger.append(&[won(3, 7, 25)]).unwrap();
    drop(ledger);
    let ledger = Ledger::open(dir.path()).unwrap();
    let mut seqs = Vec::new();
    assert_eq!(ledger.for_each(|r| seqs.push(r.seq)).unwrap(), 3);
    assert_eq!(seqs, vec![1, 2, 3]);
    let balances = ledger.balances().unwrap();
    assert_eq!(balances["u:7"], 125);
    assert_eq!(balances["u:8"], 50);
    let view = ledger.reader().unwrap().user(7, 10).unwrap();
    assert_eq!(view.balance_cents, 125);
    assert_eq!(view.recent_events.len(), 2);
    assert_eq!(view.recent_events[0]["seq"], 3);
}

#[test]
fn writer_groups_and_publishes_the_committed_seq() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let mut writer = LedgerWriter::spawn(ledger, 0, GroupCommit::default(), || {});
    for seq in 1..=100 {
        writer.submit(vec![won(seq, seq % 5 + 1, 1)]);
    }
    writer.finish().unwrap();
    assert_eq!(writer.committed(), 100);
    let ledger = Ledger::open(dir.path()).unwrap();
    assert_eq!(ledger.balances().unwrap().values().sum::<u64>(), 100);
}

#[test]
fn a_commit_starts_at_once_unless_the_last_began_under_an_interval_ago() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    assert_eq!(next_commit(None, t0, ms(10)), t0, "the first commit");
    assert_eq!(next_commit(Some(t0), t0 + ms(3), ms(10)), t0 + ms(10));
    assert_eq!(next_commit(Some(t0), t0 + ms(10), ms(10)), t0 + ms(10));
    assert_eq!(
        next_commit(Some(t0), t0 + ms(25), ms(10)),
        t0 + ms(25),
        "after a quiet spell, at once"
    );
    assert_eq!(next_commit(Some(t0), t0 + ms(1), ms(0)), t0 + ms(1));
}

#[test]
fn the_writer_commits_at_most_once_an_interval_and_a_lone_event_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let commits = Arc::new(AtomicU64::new(0));
    let counted = commits.clone();
    let interval = Duration::from_millis(50);
    let group = GroupCommit {
        commit_interval: interval,
        max_batch: 4096,
    };
    let start = Instant::now();
    let mut writer = LedgerWriter::spawn(ledger, 0, group, move || {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    // 100 events a millisecond apart: at most one commit began each 50 ms.
    for seq in 1..=100 {
        writer.submit(vec![won(seq, 1, 1)]);
        std::thread::sleep(Duration::from_millis(1));
    }
    while writer.committed() < 100 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let n = commits.load(Ordering::Relaxed);
    let bound = start.elapsed().as_millis() as u64 / 50 + 1;
    assert!(n >= 1 && n <= bound, "{n} commits, at most {bound}");
    writer.finish().unwrap();

    // A long interval: the first event is not held for it; the next one is.
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let group = GroupCommit {
        commit_interval: Duration::from_secs(4),
        max_batch: 4096,
    };
    let mut writer = LedgerWriter::spawn(ledger, 0, group, || {});
    let start = Instant::now();
    writer.submit(vec![won(1, 1, 1)]);
    while writer.committed() < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "a lone event waits"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    writer.submit(vec![won(2, 1, 1)]);
    std::thread::sleep(Duration::from_millis(500));
    // The first commit began after `start`: the second cannot begin before start + 4 s.
    let committed = writer.committed();
    if start.elapsed() < Duration::from_secs(4) {
        assert_eq!(committed, 1, "committed before the interval was up");
    }
    writer.finish().unwrap();
    assert_eq!(writer.committed(), 2);
}

#[test]
fn wins_and_opens_are_read_in_pages_in_ledger_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(dir.path()).unwrap();
    let opened = |seq, packet, user, cents| Record {
        seq,
        ts_ms: 1000 + seq,
        event: Event::ShareOpened {
            packet,
            user,
            amount_cents: cents,
        },
    };
    let sent = Record {
        seq: 3,
        ts_ms: 1003,
        event: Event::PacketSent {
            packet: 12,
            sender: Account::Campaign(2),
            amount_cents: 500,
            shares: 2,
            recipients: vec![7, 8],
            expires_ms: 10_000,
            idempotency_key: None,
        },
    };
    ledger
        .append(&[won(1, 7, 100), won(2, 8, 50), sent])
        .unwrap();
    ledger
        .append(&[opened(4, 12, 8, 300), opened(5, 12, 7, 200)])
        .unwrap();
    let reader = ledger.reader().unwrap();
    let op = |packet, user, amount_cents| LedgerOp {
        packet,
        user,
        amount_cents,
    };
    let all = reader.ops(0, 100).unwrap();
    assert_eq!(
        all.wins,
        [
            op(shake_packet_id(1, 1), 7, 100),
            op(shake_packet_id(1, 2), 8, 50)
        ]
    );
    assert_eq!(all.opens, [op(12, 8, 300), op(12, 7, 200)]);
    assert_eq!(all.next, None, "a short page is the last");

    // Two at a time through the seam, following each page's cursor.
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = LedgerRead::ops(&reader, after, 2).unwrap();
        pages.push((page.wins.len(), page.opens.len()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, [(2, 0), (0, 2), (0, 0)]);
    assert_eq!(
        LedgerRead::ops(&reader, Some(OpsCursor::Seq(2)), 1)
            .unwrap()
            .next,
        Some(OpsCursor::Seq(4)),
        "the packet sent in between is passed over"
    );
    assert!(LedgerRead::ops(&reader, Some(OpsCursor::Win(1)), 2).is_err());
}

#[test]
fn a_duplicate_seq_is_refused_and_nothing_of_its_batch_lands() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(dir.path()).unwrap();
    ledger.append(&[won(1, 7, 100)]).unwrap();
    assert!(ledger.append(&[won(2, 7, 5), won(1, 7, 100)]).is_err());
    assert_eq!(ledger.balances().unwrap()["u:7"], 100);
}

/// A shake campaign of `n` packets (seq 1) and its wins (seq 2..=n+1, packet i to user
/// i % 3 + 7), as the core writes them: what a replay accepts.
fn campaign_and_wins(n: u32) -> Vec<Record> {
    let amount = |i| hongbao_money::event::shake_amount(7, i, 1, 1000);
    let mut records = vec![Record {
        seq: 1,
        ts_ms: 1000,
        event: Event::ShakeCampaign {
            campaign: 1,
            packets: n,
            rate_per_sec: 100,
            amount_min: 1,
            amount_max: 1000,
            seed: 7,
            minted_cents: (0..n).map(amount).sum(),
            by: Some("ops".into()),
        },
    }];
    records.extend((0..n).map(|i| Record {
        seq: i as u64 + 2,
        ts_ms: 1001 + i as u64,
        event: Event::ShakeWon {
            campaign: 1,
            index: i,
            user: i as u64 % 3 + 7,
            amount_cents: amount(i),
        },
    }));
    records
}

/// A ledger of a campaign and four wins, closed; its directory, head and records.
fn four_wins() -> (tempfile::TempDir, Head, Vec<Record>) {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(dir.path()).unwrap();
    let records = campaign_and_wins(4);
    ledger.append(&records[..3]).unwrap();
    ledger.append(&records[3..]).unwrap();
    let head = ledger.head();
    assert_eq!(head.seq, 5);
    (dir, head, records)
}

fn tamper(dir: &Path, sql: &str) {
    let conn = Connection::open(dir.join("ledger.sqlite")).unwrap();
    conn.execute_batch(sql).unwrap();
}

fn cents(r: &Record) -> u64 {
    match r.event {
        Event::ShakeWon { amount_cents, .. } => amount_cents,
        _ => unreachable!(),
    }
}

/// The chain survives a reopen, and every edit an attacker with the file could make is
/// caught where it is: by reading back (the server's start) and by `verify`.
#[test]
fn verify_names_an_edited_event_a_deleted_one_and_an_edited_balance() {
    let (dir, head, _) = four_wins();
    let ledger = Ledger::open(dir.path()).unwrap();
    assert_eq!(ledger.head(), head);
    assert_eq!(ledger.for_each(|_| {}).unwrap(), 5);
    drop(ledger);
    let v = verify::verify(dir.path(), Some(head)).unwrap();
    assert!(v.ok(), "{:?}", v.problems);
    assert_eq!((v.events, v.head.clone()), (5, head.text()));
    assert!(v.audit.ok);

    // An edited amount (the balances table edited to match, as a careful forger would):
    // event 3 is packet 1's win, for user 8.
    let (dir, _, records) = four_wins();
    let won = cents(&records[2]);
    tamper(
        dir.path(),
        &format!(
            "UPDATE events SET body = replace(body, '\"amount_cents\":{won}', '\"amount_cents\":5000') WHERE seq = 3;
             UPDATE balances SET cents = cents + 5000 - {won} WHERE account = 'u:8';"
        ),
    );
    let v = verify::verify(dir.path(), None).unwrap();
    assert!(
        v.problems[0].contains("event 3: its hash does not match"),
        "{:?}",
        v.problems
    );
    let e = Ledger::open(dir.path())
        .unwrap()
        .for_each(|_| {})
        .unwrap_err();
    assert!(e.to_string().contains("event 3"), "{e}");

    // A deleted event (its balance taken back too).
    let (dir, _, records) = four_wins();
    tamper(
        dir.path(),
        &format!(
            "DELETE FROM events WHERE seq = 4; UPDATE balances SET cents = 0 WHERE account = 'u:9' AND cents = {};",
            cents(&records[3])
        ),
    );
    let v = verify::verify(dir.path(), None).unwrap();
    assert!(
        v.problems[0].contains("events 4..=4 are missing"),
        "{:?}",
        v.problems
    );

    // An edited balance, the events untouched.
    let (dir, _, records) = four_wins();
    tamper(
        dir.path(),
        "UPDATE balances SET cents = 999999 WHERE account = 'u:9';",
    );
    let v = verify::verify(dir.path(), None).unwrap();
    assert_eq!(
        v.problems,
        [format!(
            "balance u:9: the table holds 999999 cents, the events {}",
            cents(&records[3])
        )],
    );

    // The newest event cut off: only the head kept elsewhere shows it.
    let (dir, head, records) = four_wins();
    tamper(
        dir.path(),
        &format!(
            "DELETE FROM events WHERE seq = 5; UPDATE balances SET cents = cents - {} WHERE account = 'u:7';",
            cents(&records[4])
        ),
    );
    assert!(verify::verify(dir.path(), None).unwrap().ok());
    let v = verify::verify(dir.path(), Some(head)).unwrap();
    assert!(
        v.problems[0].contains("events were cut off"),
        "{:?}",
        v.problems
    );
}

/// A ledger that replays into nonsense (a win of a campaign it never started, its hash
/// rewritten to fit) is a problem named by its event, not a crash of the check.
#[test]
fn an_event_that_cannot_be_replayed_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(dir.path()).unwrap();
    ledger.append(&[won(1, 7, 100)]).unwrap();
    drop(ledger);
    let v = verify::verify(dir.path(), None).unwrap();
    assert!(
        v.problems
            .iter()
            .any(|p| p.contains("event 1 cannot be replayed")),
        "{:?}",
        v.problems
    );
}

/// A ledger written before the chain (no hash column) is chained at its first open, and
/// reads back whole.
#[test]
fn a_ledger_from_before_the_chain_is_chained_once() {
    let dir = tempfile::tempdir().unwrap();
    let records = campaign_and_wins(3);
    {
        let conn = Connection::open(dir.path().join("ledger.sqlite")).unwrap();
        conn.execute_batch(
            "CREATE TABLE events (seq INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL, kind TEXT NOT NULL, user INTEGER, body TEXT NOT NULL);
             CREATE TABLE balances (account TEXT PRIMARY KEY, cents INTEGER NOT NULL);",
        )
        .unwrap();
        for r in &records[..3] {
            conn.execute(
                "INSERT INTO events (seq, ts_ms, kind, user, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    r.seq as i64,
                    r.ts_ms as i64,
                    r.event.kind(),
                    r.event.user().map(|u| u as i64),
                    serde_json::to_string(&r.event).unwrap()
                ],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO balances VALUES ('u:7', ?1), ('u:8', ?2)",
            params![cents(&records[1]) as i64, cents(&records[2]) as i64],
        )
        .unwrap();
    }
    let mut ledger = Ledger::open(dir.path()).unwrap();
    assert_eq!(ledger.head().seq, 3);
    ledger.append(&records[3..]).unwrap();
    assert_eq!(ledger.for_each(|_| {}).unwrap(), 4);
    drop(ledger);
    let v = verify::verify(dir.path(), None).unwrap();
    assert!(v.ok(), "{:?}", v.problems);
}

/// A backup of a ledger being written is whole and checks out; restore refuses a
/// ledger in place without --force, and moves it aside with it.
#[test]
fn a_backup_while_writing_checks_out_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let mut writer = LedgerWriter::spawn(ledger, 0, GroupCommit::default(), || {});
    let out = tempfile::tempdir().unwrap();
    let mut taken = Vec::new();
    for (n, r) in campaign_and_wins(3000).into_iter().enumerate() {
        writer.submit(vec![r]);
        if n > 0 && n % 1000 == 0 {
            let to = out.path().join(format!("b{n}"));
            let done = verify::backup(dir.path(), &to).unwrap();
            assert!(done.verified.ok(), "{:?}", done.verified.problems);
            taken.push(done.verified.events);
        }
    }
    writer.finish().unwrap();
    assert!(taken.windows(2).all(|w| w[0] <= w[1]), "{taken:?}");
    assert!(
        verify::backup(dir.path(), &out.path().join("b1000")).is_err(),
        "never over a backup"
    );

    let target = tempfile::tempdir().unwrap();
    let r = verify::restore(&out.path().join("b2000"), target.path(), false).unwrap();
    assert!(r.replaced.is_none());
    assert!(verify::restore(&out.path().join("b3000"), target.path(), false).is_err());
    let r = verify::restore(&out.path().join("b3000"), target.path(), true).unwrap();
    assert!(r.replaced.unwrap().exists(), "the one replaced is kept");
    let restored = Ledger::open(target.path()).unwrap();
    assert_eq!(restored.head().seq, taken[2]);
}
