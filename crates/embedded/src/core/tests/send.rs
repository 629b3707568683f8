//! Sending a packet: the debit, a retried send, the balance, malformed packets.

use super::*;

#[test]
fn send_debits_the_sender_and_notifies_online_recipients() {
    let mut sim = Sim::new(5);
    sim.fund(1, 1000);
    sim.online(0, 20, 2);
    let mark = sim.sent.len();
    let (result, packet, balance) = sim.send(1, 300, 2, &[2, 3]);
    assert_eq!((result, balance), (ResultCode::Ok, 700));
    assert_ne!(packet, 0);
    assert_eq!(sim.core.balance(1), 700);
    let notices = sim.pushes(mark, 0, 20);
    assert_eq!(notices.len(), 1);
    match &notices[0].0 {
        Push::Notice(n) => {
            assert_eq!(
                (n.packet_id, n.from_user, n.amount_cents, n.shares),
                (packet, Some(uid(1)), 300, 2)
            );
            assert_eq!(n.expires_at_ms, sim.now_ms + TTL_MS);
        }
        other => panic!("expected a notice, got {other:?}"),
    }
    assert_eq!(sim.core.audit().unopened_cents, 300);
    sim.check();
}

#[test]
fn a_retried_send_gets_the_first_answer_and_moves_no_money() {
    let mut sim = Sim::new(21);
    sim.fund(1, 1000);
    let first = sim.send_keyed(1, 300, 2, &[2, 3], Some("order-1"));
    let Reply::Send {
        result: ResultCode::Ok,
        packet_id,
        balance_cents: 700,
    } = first
    else {
        panic!("{first:?}")
    };
    // More money arrives; a retry still gets the first answer, and nothing is written.
    sim.fund(1, 50);
    let records = sim.ledger.len();
    assert_eq!(sim.send_keyed(1, 300, 2, &[2, 3], Some("order-1")), first);
    assert_eq!(sim.ledger.len(), records);
    assert_eq!(sim.core.balance(1), 750);
    // The same key for another packet is refused; another key is another packet; the key
    // is the sender's own.
    assert!(matches!(
        sim.send_keyed(1, 301, 2, &[2, 3], Some("order-1")),
        Reply::Error {
            result: ResultCode::BadRequest,
            ..
        }
    ));
    assert!(matches!(
        sim.send_keyed(1, 300, 2, &[2, 3], Some("order-2")),
        Reply::Send { result: ResultCode::Ok, packet_id: p, .. } if p != packet_id
    ));
    sim.fund(9, 300);
    assert!(matches!(
        sim.send_keyed(9, 300, 2, &[2, 3], Some("order-1")),
        Reply::Send { result: ResultCode::Ok, packet_id: p, .. } if p != packet_id
    ));
    // The key is in the ledger: after a restart the retry is still answered the same.
    sim.restart();
    assert_eq!(sim.send_keyed(1, 300, 2, &[2, 3], Some("order-1")), first);
    sim.check();
}

#[test]
fn send_beyond_the_balance_is_insufficient_funds() {
    let mut sim = Sim::new(6);
    sim.fund(1, 100);
    let records = sim.ledger.len();
    assert_eq!(
        sim.send(1, 101, 1, &[2]),
        (ResultCode::InsufficientFunds, 0, 100)
    );
    assert_eq!(
        sim.send(7, 1, 1, &[2]),
        (ResultCode::InsufficientFunds, 0, 0)
    );
    assert_eq!(sim.ledger.len(), records, "a refused send writes nothing");
    assert_eq!(sim.send(1, 100, 1, &[2]), (ResultCode::Ok, 1, 0));
    sim.check();
}

#[test]
fn send_rejects_malformed_packets() {
    let mut sim = Sim::new(7);
    sim.fund(1, 10_000);
    let records = sim.ledger.len();
    let too_many: Vec<u64> = (1..=MAX_RECIPIENTS as u64 + 1).collect();
    let cases: [(u64, u32, &[u64]); 8] = [
        (100, 0, &[2]),     // no shares
        (2, 3, &[2, 3, 4]), // more shares than cents
        (100, 2, &[2, 2]),  // duplicate recipients
        (100, 1, &[]),      // nobody to send to
        (100, 3, &[2, 3]),  // more shares than recipients
        (0, 1, &[2]),       // nothing to send
        (100, 1, &[0]),     // user 0 does not exist
        (100, 1, too_many.as_slice()),
    ];
    for (amount, shares, recipients) in cases {
        let reply = sim.send(1, amount, shares, recipients);
        assert_eq!(
            reply,
            (ResultCode::BadRequest, 0, 10_000),
            "send of {amount} in {shares} to {} recipients",
            recipients.len()
        );
    }
    assert_eq!(
        sim.send(1, MAX_PACKET_CENTS + 1, 1, &[2]).0,
        ResultCode::BadRequest
    );
    assert_eq!(sim.ledger.len(), records);
    assert_eq!(sim.core.balance(1), 10_000);
    // The boundaries themselves are fine: one cent per share, shares = recipients.
    assert_eq!(sim.send(1, 3, 3, &[2, 3, 4]).0, ResultCode::Ok);
    sim.check();
}
