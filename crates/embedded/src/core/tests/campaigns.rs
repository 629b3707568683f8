//! Campaigns: released at their rate, refused when malformed.

use super::*;

#[test]
fn a_shake_campaign_releases_at_its_rate() {
    let mut sim = Sim::new(15);
    sim.worker_up(0);
    sim.worker_up(1);
    let campaign = sim.shake_campaign(&shake_request(10_000, 200, 1, 1000));
    let mut per_100ms = Vec::new();
    for _ in 0..10 {
        let before = sim.dealt.len();
        sim.advance_in_ticks(100, 5);
        per_100ms.push(sim.dealt.len() - before);
    }
    let dealt = sim.dealt.len();
    assert!(
        (199..=201).contains(&dealt),
        "{dealt} packets in one second at 200/s"
    );
    assert!(
        per_100ms.iter().all(|n| (19..=21).contains(n)),
        "release is even: {per_100ms:?}"
    );
    let to_worker0 = sim.dealt.iter().filter(|d| d.0 == 0).count();
    assert!(
        to_worker0.abs_diff(dealt - to_worker0) <= 1,
        "fair across workers"
    );
    let distinct: HashSet<u64> = sim.dealt.iter().map(|d| d.1).collect();
    assert_eq!(distinct.len(), dealt, "no packet is dealt twice");
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(status.released as usize, dealt);
    assert_eq!(status.released_all_ms, None);
    sim.check();
}

#[test]
fn a_send_campaign_creates_packets_at_its_rate_for_distinct_users_in_range() {
    let mut sim = Sim::new(16);
    let request = SendCampaignRequest {
        packets: 50,
        rate_per_sec: 100,
        recipients: 3,
        user_min: 10,
        user_max: 20,
        amount_min: 300,
        amount_max: 500,
    };
    let campaign = sim.send_campaign(&request);
    sim.advance_in_ticks(250, 5);
    let created = sim.sent_packets();
    assert!(
        (24..=26).contains(&created.len()),
        "{} packets in 250 ms at 100/s",
        created.len()
    );
    sim.advance_in_ticks(1000, 5);
    let created = sim.sent_packets();
    assert_eq!(created.len(), 50);
    for (_, sender, amount, shares, recipients) in &created {
        assert_eq!(*sender, Account::Campaign(campaign));
        assert!((300..=500).contains(amount));
        assert_eq!(*shares, 3);
        assert_eq!(recipients.len(), 3);
        assert!(recipients.iter().all(|u| (10..=20).contains(u)));
        let distinct: HashSet<&u64> = recipients.iter().collect();
        assert_eq!(distinct.len(), 3, "recipients are distinct: {recipients:?}");
    }
    let minted: u64 = created.iter().map(|p| p.2).sum();
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(
        (status.state, status.released, status.shares),
        (CampaignState::Done, 50, 150)
    );
    assert_eq!(status.minted_cents, minted);
    assert!(status.released_all_ms.is_some());
    let audit = sim.core.audit();
    assert_eq!((audit.minted_cents, audit.unopened_cents), (minted, minted));
    // Open one packet fully; the rest expire back to the campaign's account.
    let (packet, _, amount, _, recipients) = created[0].clone();
    for user in recipients {
        assert_eq!(sim.open(user, packet).0, ResultCode::Opened);
    }
    sim.advance(TTL_MS);
    let status = sim.core.campaign(campaign).unwrap();
    assert_eq!(
        (status.shares_opened, status.amount_opened_cents),
        (3, amount)
    );
    assert_eq!(status.refunded_cents, minted - amount);
    let audit = sim.core.audit();
    assert_eq!(audit.campaign_balances_cents, minted - amount);
    assert_eq!(audit.unopened_cents, 0);
    sim.check();
}

#[test]
fn campaigns_with_bad_shapes_are_refused_and_write_nothing() {
    let mut core = Core::new(config(17));
    let shakes = [
        shake_request(0, 10, 1, 1),
        shake_request(MAX_CAMPAIGN_PACKETS + 1, 10, 1, 1),
        shake_request(10, 0, 1, 1),
        shake_request(10, 1_000_001, 1, 1),
        shake_request(10, 10, 0, 1),
        shake_request(10, 10, 5, 4),
        shake_request(10, 10, 1, MAX_PACKET_CENTS + 1),
    ];
    for req in &shakes {
        assert!(
            matches!(
                core.create_shake_campaign(START_MS, req, "test-operator"),
                AdminAnswer::Refused(_)
            ),
            "{req:?}"
        );
    }
    let good = SendCampaignRequest {
        packets: 10,
        rate_per_sec: 10,
        recipients: 3,
        user_min: 1,
        user_max: 100,
        amount_min: 3,
        amount_max: 10,
    };
    let sends = [
        SendCampaignRequest {
            recipients: 0,
            ..good.clone()
        },
        SendCampaignRequest {
            recipients: MAX_RECIPIENTS as u32 + 1,
            amount_min: 2000,
            amount_max: 2000,
            ..good.clone()
        },
        SendCampaignRequest {
            amount_min: 2,
            ..good.clone()
        },
        SendCampaignRequest {
            user_min: 0,
            ..good.clone()
        },
        SendCampaignRequest {
            user_min: 50,
            user_max: 49,
            ..good.clone()
        },
        SendCampaignRequest {
            user_min: 50,
            user_max: 51,
            ..good.clone()
        },
        SendCampaignRequest {
            packets: 0,
            ..good.clone()
        },
    ];
    for req in &sends {
        assert!(
            matches!(
                core.create_send_campaign(START_MS, req, "test-operator"),
                AdminAnswer::Refused(_)
            ),
            "{req:?}"
        );
    }
    assert!(core.take_records().is_empty());
    assert_eq!(core.seq(), 0);
    let AdminAnswer::Campaign(status) = core.create_send_campaign(START_MS, &good, "test-operator")
    else {
        panic!("a good campaign")
    };
    assert_eq!(
        (status.id, status.kind, status.state),
        (1, CampaignKind::Send, CampaignState::Running)
    );
    let AdminAnswer::Campaign(status) =
        core.create_shake_campaign(START_MS, &shake_request(3, 1, 7, 7), "test-operator")
    else {
        panic!("a good campaign")
    };
    assert_eq!((status.id, status.minted_cents), (2, 21));
    assert_eq!(core.take_records().len(), 2);
}
