//! Shaking: a claim wins once, a dead worker's pool dealt again, the pool and the workers.

use super::*;

#[test]
fn shake_claim_wins_once_and_credits_the_user() {
    let mut sim = Sim::new(8);
    sim.worker_up(0);
    let campaign = sim.shake_campaign(&shake_request(5, 1000, 10, 20));
    sim.advance(5);
    assert_eq!(sim.dealt.len(), 5);
    let (worker, packet, amount) = sim.dealt[0];
    assert_eq!(worker, 0);
    assert!((10..=20).contains(&amount));
    let reply = sim.claim(0, 42, 7, packet);
    assert_eq!(result_of_shake(&reply), (ResultCode::Won, packet, amount));
    assert_eq!(sim.core.balance(7), amount);
    assert_eq!(sim.core.pool_len(0), 4);
    // The same packet again (a confused or malicious worker): nothing, no money.
    let reply = sim.claim(0, 43, 8, packet);
    assert_eq!(result_of_shake(&reply), (ResultCode::Nothing, 0, 0));
    assert_eq!(sim.core.balance(8), 0);
    // A packet never dealt to this worker: nothing.
    let never = shake_packet_id(campaign, 4000);
    assert_eq!(
        result_of_shake(&sim.claim(0, 43, 8, never)).0,
        ResultCode::Nothing
    );
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(
        (status.won, status.won_cents, status.state),
        (1, amount, CampaignState::Running)
    );
    sim.check();
}

#[test]
fn a_dead_workers_pool_is_dealt_again_and_can_be_won() {
    let mut sim = Sim::new(9);
    sim.worker_up(0);
    sim.worker_up(1);
    let campaign = sim.shake_campaign(&shake_request(10, 1000, 1, 100));
    sim.advance(10);
    let pool0: Vec<(u64, u64)> = sim
        .dealt
        .iter()
        .filter(|d| d.0 == 0)
        .map(|d| (d.1, d.2))
        .collect();
    assert_eq!(pool0.len(), 5, "round-robin over two workers");
    assert_eq!(sim.core.pool_len(1), 5);
    sim.worker_down(0);
    // A claim from the dead worker that arrives late is not a win.
    assert_eq!(
        result_of_shake(&sim.claim(0, 1, 1, pool0[0].0)).0,
        ResultCode::Nothing
    );
    let mark = sim.dealt.len();
    sim.advance(1);
    let redealt: Vec<(WorkerId, u64, u64)> = sim.dealt[mark..].to_vec();
    assert_eq!(redealt.len(), 5);
    assert!(redealt.iter().all(|d| d.0 == 1));
    let mut redealt_packets: Vec<(u64, u64)> = redealt.iter().map(|d| (d.1, d.2)).collect();
    redealt_packets.sort();
    let mut expected = pool0.clone();
    expected.sort();
    assert_eq!(redealt_packets, expected, "same packets, same amounts");
    let mut total = 0;
    let all: Vec<(WorkerId, u64, u64)> = sim.dealt.iter().filter(|d| d.0 == 1).copied().collect();
    for (worker, packet, amount) in all {
        let reply = sim.claim(worker, 2, 2, packet);
        assert_eq!(result_of_shake(&reply), (ResultCode::Won, packet, amount));
        total += amount;
    }
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!((status.won, status.state), (10, CampaignState::Done));
    assert_eq!(status.won_cents, total);
    assert_eq!(status.minted_cents, total);
    assert_eq!(sim.core.audit().unclaimed_cents, 0);
    sim.check();
}

#[test]
fn nothing_is_dealt_while_no_worker_is_up() {
    let mut sim = Sim::new(10);
    sim.shake_campaign(&shake_request(10, 1000, 1, 1));
    sim.advance(5);
    assert!(sim.dealt.is_empty());
    sim.worker_up(3);
    sim.advance(1);
    assert!(!sim.dealt.is_empty());
    assert!(sim.dealt.iter().all(|d| d.0 == 3));
}

/// `worker_up` for a worker the core already counts as live replaces its pool with an
/// empty one: the packets in the old pool are neither returned nor claimable, so the
/// campaign can never finish until a restart. The supervisor's "second Hello for the same
/// worker" path reaches this (see the report).
#[test]
fn a_second_worker_up_keeps_or_returns_the_pool() {
    let mut sim = Sim::new(11);
    sim.worker_up(0);
    let campaign = sim.shake_campaign(&shake_request(4, 1000, 5, 5));
    sim.advance(4);
    assert_eq!(sim.core.pool_len(0), 4);
    sim.worker_up(0);
    sim.advance(1000);
    let claimable: Vec<u64> = sim.dealt.iter().map(|d| d.1).collect();
    for packet in claimable {
        sim.claim(0, 1, 1, packet);
    }
    assert_eq!(sim.core.campaign(campaign).unwrap().won, 4);
}
