//! Durability: outputs wait for the ledger, a restart rebuilds the money.

use super::*;

#[test]
fn outputs_wait_until_the_ledger_has_committed_them() {
    let mut core = Core::new(config(18));
    core.worker_up(0);
    let mut outs = Vec::new();
    core.drain_ready(0, &mut outs);
    assert!(outs.is_empty(), "a fresh core has nothing to say");
    let AdminAnswer::Campaign(status) =
        core.create_shake_campaign(START_MS, &shake_request(1, 1000, 50, 50), "test-operator")
    else {
        panic!("a good campaign")
    };
    assert_eq!(core.seq(), 1);
    core.tick(START_MS + 1);
    // The deal depends on the campaign event: held until seq 1 is committed.
    core.drain_ready(0, &mut outs);
    assert!(outs.is_empty());
    core.drain_ready(1, &mut outs);
    let packet = shake_packet_id(status.id, 0);
    assert_eq!(
        outs,
        vec![Output::Deal {
            worker: 0,
            packets: vec![(packet, 50)]
        }]
    );
    outs.clear();
    core.submit(START_MS + 2, origin(0, 5, 1, 5), Op::Claim { packet });
    // Even an answer that depends on nothing new waits behind the uncommitted win.
    core.submit(START_MS + 2, origin(0, 5, 2, 5), Op::Notices);
    core.admin(START_MS + 2, 9, AdminRequest::Audit);
    assert_eq!(core.seq(), 2);
    core.drain_ready(1, &mut outs);
    assert!(outs.is_empty(), "\"you won\" before the win is durable");
    core.drain_ready(2, &mut outs);
    assert_eq!(outs.len(), 3);
    assert_eq!(
        outs[0],
        Output::Reply {
            to: origin(0, 5, 1, 5),
            reply: Reply::Shake {
                result: ResultCode::Won,
                packet_id: packet,
                amount_cents: 50,
                retry_after_ms: 0,
            }
        }
    );
    assert!(matches!(&outs[1], Output::Reply { reply: Reply::Notices(n), .. } if n.is_empty()));
    assert!(matches!(&outs[2], Output::Admin { ticket: 9, answer: AdminAnswer::Audit(a) } if a.ok));
    let mut rest = Vec::new();
    core.drain_ready(u64::MAX, &mut rest);
    assert!(rest.is_empty(), "drained once");
}

/// A deal waits for its campaign's event, not behind the wins queued before it: held
/// there, a campaign's packets reached the workers in bursts right after each commit, and
/// their wins waited a whole commit interval for the next one.
#[test]
fn a_deal_waits_for_its_campaign_and_not_for_the_wins_before_it() {
    let mut core = Core::new(config(19));
    core.worker_up(0);
    core.worker_up(1);
    let AdminAnswer::Campaign(status) =
        core.create_shake_campaign(START_MS, &shake_request(10, 1000, 50, 50), "test-operator")
    else {
        panic!("a good campaign")
    };
    let mut outs = Vec::new();
    core.tick(START_MS + 1);
    core.drain_ready(0, &mut outs);
    assert!(outs.is_empty(), "dealt before the campaign is durable");
    core.drain_ready(1, &mut outs);
    let Some(Output::Deal { worker, packets }) = outs.pop() else {
        panic!("one deal: {outs:?}")
    };
    assert!(outs.is_empty());
    // A win, not yet committed; the next packet is dealt at once all the same.
    let claim = origin(worker, 5, 1, 5);
    core.submit(
        START_MS + 1,
        claim,
        Op::Claim {
            packet: packets[0].0,
        },
    );
    assert_eq!(core.seq(), 2);
    core.tick(START_MS + 2);
    core.drain_ready(1, &mut outs);
    assert!(
        matches!(outs.as_slice(), [Output::Deal { packets, .. }] if packets[0].0 == shake_packet_id(status.id, 1)),
        "{outs:?}"
    );
    outs.clear();
    // The win itself is told only once committed.
    core.drain_ready(1, &mut outs);
    assert!(outs.is_empty(), "\"you won\" before the win is durable");
    core.drain_ready(2, &mut outs);
    assert!(
        matches!(&outs[..], [Output::Reply { to, .. }] if *to == claim),
        "{outs:?}"
    );

    // A deal still held when its worker goes is dropped with the worker's pool.
    let AdminAnswer::Campaign(second) = core.create_shake_campaign(
        START_MS + 3,
        &shake_request(10, 1000, 50, 50),
        "test-operator",
    ) else {
        panic!("a good campaign")
    };
    core.tick(START_MS + 4);
    outs.clear();
    core.drain_ready(2, &mut outs);
    let held: Vec<(u64, WorkerId)> = core
        .deals
        .iter()
        .map(|(tag, d)| match d {
            Output::Deal { worker, packets } => {
                assert_eq!(shake_packet_parts(packets[0].0).0, second.id);
                (*tag, *worker)
            }
            other => panic!("not a deal: {other:?}"),
        })
        .collect();
    assert_eq!(
        held.len(),
        1,
        "the second campaign's deal waits for seq 3: {held:?}"
    );
    assert_eq!(held[0].0, 3);
    core.worker_down(held[0].1);
    outs.clear();
    core.drain_ready(u64::MAX, &mut outs);
    assert!(
        outs.iter()
            .all(|o| !matches!(o, Output::Deal { packets, .. }
            if shake_packet_parts(packets[0].0).0 == second.id)),
        "{outs:?}"
    );
}

/// A notice reaches a user who logs in once: by push if its packet was created after the
/// notices of the login were gathered, or at the login if before.
#[test]
fn a_login_while_a_notice_is_uncommitted_hears_of_the_packet_once() {
    let mut sim = Sim::new(20);
    sim.fund(1, 100);
    // The send is applied but not committed when user 2 logs in.
    let op = Op::Send {
        amount_cents: 100,
        shares: 1,
        recipients: vec![2],
        idempotency_key: None,
    };
    sim.core.submit(sim.now_ms, origin(0, 1, 77, 1), op);
    let mark = sim.sent.len();
    let login = origin(0, 20, 0, 2);
    for delivery in sim.presence.login(login, 0).expect("no revocations here") {
        sim.delivered(delivery);
    }
    sim.core.submit(sim.now_ms, login, Op::LoggedIn);
    sim.pump();
    let notices = sim
        .pushes(mark, 0, 20)
        .into_iter()
        .filter(|(p, _)| matches!(p, Push::Notice(_)))
        .count();
    assert_eq!(notices, 1);
    // A later login hears of it again, once: it is still waiting.
    sim.offline(0, 20, 2);
    let mark = sim.sent.len();
    sim.online(0, 21, 2);
    assert_eq!(sim.pushes(mark, 0, 21).len(), 1);
}

#[test]
fn a_restart_rebuilds_the_money_and_deals_unwon_packets_again() {
    let mut sim = Sim::new(19);
    sim.worker_up(0);
    let campaign = sim.shake_campaign(&shake_request(10, 1000, 1, 100));
    sim.advance(10);
    let dealt = sim.dealt.clone();
    for &(worker, packet, _) in &dealt[..4] {
        sim.claim(worker, 1, 1, packet);
    }
    let (_, packet, _) = sim.send(1, 3, 3, &[2, 3, 4]);
    sim.open(2, packet);
    sim.restart();
    sim.check();
    // Workers come back; the six packets never won are dealt again, the four won are not.
    sim.worker_up(0);
    sim.advance(1000);
    let mut again: Vec<(u64, u64)> = sim.dealt.iter().map(|d| (d.1, d.2)).collect();
    again.sort();
    let mut unwon: Vec<(u64, u64)> = dealt[4..].iter().map(|d| (d.1, d.2)).collect();
    unwon.sort();
    assert_eq!(again, unwon);
    for (packet, amount) in again {
        let reply = sim.claim(0, 6, 6, packet);
        assert_eq!(result_of_shake(&reply), (ResultCode::Won, packet, amount));
    }
    assert_eq!(
        sim.core.campaign(campaign).unwrap().state,
        CampaignState::Done
    );
    // The packet survives too: its notice, its opened share, its unopened ones.
    let mark = sim.sent.len();
    sim.online(0, 3, 3);
    assert_eq!(sim.pushes(mark, 0, 3).len(), 1);
    assert_eq!(sim.open(2, packet), (ResultCode::AlreadyOpened, 1));
    assert_eq!(sim.open(3, packet), (ResultCode::Opened, 1));
    // New packets do not reuse ids.
    let (_, next, _) = sim.send(1, 1, 1, &[2]);
    assert_eq!(next, packet + 1);
    sim.check();
}
