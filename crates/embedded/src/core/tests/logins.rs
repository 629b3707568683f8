//! Logins and notices: chat, a second login, packets noticed at login.

use super::*;

#[test]
fn chat_moves_no_money_and_a_second_login_is_kicked_through_presence() {
    let mut sim = Sim::new(12);
    sim.online(1, 77, 5);
    let mark = sim.sent.len();
    assert_eq!(sim.chat(4, 5, "新年快乐"), ResultCode::Delivered);
    assert_eq!(
        sim.pushes(mark, 1, 77),
        vec![(
            Push::Chat {
                from_user: uid(4),
                text: "新年快乐".into()
            },
            false
        )]
    );
    let mark = sim.sent.len();
    sim.online(0, 10, 5);
    let kicks = sim.pushes(mark, 1, 77);
    assert!(matches!(
        &kicks[..],
        [(
            Push::Kick {
                reason: KickReason::Replaced,
                ..
            },
            true
        )]
    ));
    assert!(sim.ledger.is_empty(), "chat and logins move no money");
}

#[test]
fn packets_sent_while_offline_are_noticed_at_login_until_opened() {
    let mut sim = Sim::new(14);
    sim.fund(1, 600);
    let (_, first, _) = sim.send(1, 300, 1, &[8]);
    let (_, second, _) = sim.send(1, 300, 2, &[8, 9]);
    let mark = sim.sent.len();
    sim.online(2, 80, 8);
    let noticed: Vec<u64> = sim
        .pushes(mark, 2, 80)
        .iter()
        .map(|(push, _)| match push {
            Push::Notice(n) => n.packet_id,
            other => panic!("expected notices, got {other:?}"),
        })
        .collect();
    assert_eq!(noticed, vec![first, second]);
    sim.open(8, first);
    sim.offline(2, 80, 8);
    let mark = sim.sent.len();
    sim.online(2, 81, 8);
    let noticed = sim.pushes(mark, 2, 81);
    assert_eq!(noticed.len(), 1, "opened packets are not noticed again");
    assert!(matches!(noticed[0].0, Push::Notice(n) if n.packet_id == second));
    // Expired packets are not noticed either.
    sim.advance(TTL_MS);
    sim.offline(2, 81, 8);
    let mark = sim.sent.len();
    sim.online(2, 82, 8);
    assert!(sim.pushes(mark, 2, 82).is_empty());
}
