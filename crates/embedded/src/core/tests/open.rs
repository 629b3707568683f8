//! Opening a sent packet: once each, empty, refused, expired.

use super::*;

#[test]
fn open_pays_each_recipient_once_and_repeats_return_the_same_amount() {
    let mut sim = Sim::new(1);
    sim.fund(1, 1000);
    let (result, packet, balance) = sim.send(1, 900, 3, &[2, 3, 4]);
    assert_eq!((result, balance), (ResultCode::Ok, 100));
    let mut total = 0;
    for user in [2, 3, 4] {
        let (result, amount) = sim.open(user, packet);
        assert_eq!(result, ResultCode::Opened);
        assert!(amount >= 1);
        assert_eq!(sim.core.balance(user), amount);
        let records_before = sim.ledger.len();
        assert_eq!(sim.open(user, packet), (ResultCode::AlreadyOpened, amount));
        assert_eq!(
            sim.ledger.len(),
            records_before,
            "a repeat must not touch the ledger"
        );
        assert_eq!(sim.core.balance(user), amount);
        total += amount;
    }
    assert_eq!(total, 900, "shares add up to the packet");
    let audit = sim.core.audit();
    assert_eq!((audit.unopened_cents, audit.live_packets), (0, 0));
    sim.check();
}

#[test]
fn open_is_empty_once_all_shares_are_taken() {
    let mut sim = Sim::new(2);
    sim.fund(1, 500);
    let (_, packet, _) = sim.send(1, 500, 2, &[2, 3, 4]);
    assert_eq!(sim.open(3, packet).0, ResultCode::Opened);
    assert_eq!(sim.open(4, packet).0, ResultCode::Opened);
    assert_eq!(sim.open(2, packet), (ResultCode::Empty, 0));
    assert_eq!(sim.core.balance(3) + sim.core.balance(4), 500);
    // Fully opened: nothing to refund when its time-to-live runs out.
    sim.advance(TTL_MS + 1);
    assert!(!sim
        .ledger
        .iter()
        .any(|r| matches!(r.event, Event::PacketExpired { .. })));
    sim.check();
}

#[test]
fn open_refuses_non_recipients_and_unknown_packets() {
    let mut sim = Sim::new(3);
    sim.fund(1, 100);
    let (_, packet, _) = sim.send(1, 100, 1, &[2]);
    assert_eq!(sim.open(1, packet), (ResultCode::NotARecipient, 0));
    assert_eq!(sim.open(9, packet), (ResultCode::NotARecipient, 0));
    assert_eq!(sim.open(2, packet + 1000), (ResultCode::NoSuchPacket, 0));
    assert_eq!(sim.open(2, 0), (ResultCode::NoSuchPacket, 0));
    assert_eq!(sim.open(2, packet), (ResultCode::Opened, 100));
    sim.check();
}

#[test]
fn open_after_the_time_to_live_is_expired_and_the_rest_goes_back_to_the_sender() {
    let mut sim = Sim::new(4);
    sim.fund(1, 1000);
    let (_, packet, _) = sim.send(1, 1000, 3, &[2, 3, 4]);
    let sent_at = sim.now_ms;
    let (_, first) = sim.open(2, packet);
    // At the expiry instant, before any tick has expired it, opening is already refused.
    sim.now_ms = sent_at + TTL_MS;
    assert_eq!(sim.open(3, packet), (ResultCode::Expired, 0));
    assert_eq!(sim.core.balance(1), 0);
    sim.tick_to(sent_at + TTL_MS);
    assert_eq!(
        sim.core.balance(1),
        1000 - first,
        "refund of the unopened rest"
    );
    assert_eq!(sim.open(4, packet), (ResultCode::Expired, 0));
    // Whoever opened before the expiry still gets their answer.
    assert_eq!(sim.open(2, packet), (ResultCode::AlreadyOpened, first));
    let audit = sim.core.audit();
    assert_eq!((audit.unopened_cents, audit.live_packets), (0, 0));
    sim.check();
    // Expiry happens once.
    sim.advance(TTL_MS);
    let expiries = sim
        .ledger
        .iter()
        .filter(|r| matches!(r.event, Event::PacketExpired { .. }))
        .count();
    assert_eq!(expiries, 1);
}
