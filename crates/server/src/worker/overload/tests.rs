//! The overload rules on a simulated clock: each rule alone, then the gate that orders
//! them.

use super::*;

// ----- rule 2: the back-off wait -----------------------------------------------------

fn at(secs: u64, ms: u64) -> UnixTime {
    UnixTime::from_millis(secs * 1000 + ms)
}

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(7)
}

/// `n` shakes in second `s` from 100 users (an interval under the base wait), `shed`
/// of them shed, each having waited `queued_ms` longer than the second before's;
/// the mean waits asked.
fn second(b: &mut Backoff, s: u64, n: u32, shed: u32) -> Vec<u32> {
    let queued = Duration::from_millis(s % 1000);
    let mut waits = Vec::new();
    let mut rng = rng();
    for i in 0..n {
        b.shake(at(s, u64::from(i) * 999 / u64::from(n)), queued, 100);
        if i < shed {
            b.shed(&mut rng);
            waits.push(b.wait_ms());
        }
    }
    waits
}

#[test]
fn a_moments_shedding_asks_for_the_base_wait() {
    let mut b = Backoff::default();
    second(&mut b, 100, 1000, 0);
    let waits = second(&mut b, 101, 1000, 300);
    assert!(waits.iter().all(|&w| w == BACKOFF_BASE_MS), "{waits:?}");
    // Calm again: a later moment's shedding still asks for about a second.
    for s in 102..102 + u64::from(BACKOFF_CALM_SECS) {
        second(&mut b, s, 1000, 0);
    }
    let waits = second(&mut b, 110, 1000, 10);
    assert!(waits.iter().all(|&w| w == BACKOFF_BASE_MS), "{waits:?}");
}

#[test]
fn lasting_shedding_doubles_the_wait_up_to_the_limit() {
    let mut b = Backoff::default();
    let mut asked = Vec::new();
    for s in 0..10 {
        asked.push(second(&mut b, 1000 + s, 1000, 500)[0]);
    }
    assert_eq!(
        asked,
        [1000, 2000, 4000, 8000, 16000, 32000, 64000, 64000, 64000, 64000]
    );
}

/// 100 shakes in second `s`, each having waited `queued_ms`, half of them shed.
fn at_queue(b: &mut Backoff, s: u64, queued_ms: u64) {
    let mut rng = rng();
    for i in 0..100 {
        b.shake(at(s, i * 9), Duration::from_millis(queued_ms), 100);
        if i < 50 {
            b.shed(&mut rng);
        }
    }
}

#[test]
fn the_wait_is_raised_again_only_once_the_last_could_be_heard() {
    let mut b = Backoff::default();
    // Second 10 closes with a queue of 2.5 s: raised once, then held through 11 and
    // 12 though the queue still grows; 13 closes past the hold and raises again.
    at_queue(&mut b, 10, 2500);
    at_queue(&mut b, 11, 2600);
    assert_eq!(b.wait_ms(), 2000);
    at_queue(&mut b, 12, 2700);
    at_queue(&mut b, 13, 2800);
    assert_eq!(b.wait_ms(), 2000, "held for 3 s after second 10");
    at_queue(&mut b, 14, 2900);
    assert_eq!(b.wait_ms(), 4000);
}

#[test]
fn late_shakes_are_shed_by_a_share_rising_to_all_at_twice_the_limit() {
    let mut b = Overload::default();
    let max = Duration::from_millis(200);
    let shed = |b: &mut Overload, ms: u64| {
        (0..10_000)
            .filter(|_| b.late(Duration::from_millis(ms), max))
            .count()
    };
    assert_eq!(shed(&mut b, 0), 0);
    assert_eq!(shed(&mut b, 200), 0);
    assert_eq!(shed(&mut b, 400), 10_000);
    assert_eq!(shed(&mut b, 5000), 10_000);
    // A quarter of the limit over it: about a quarter shed.
    let quarter = shed(&mut b, 250);
    assert!((2_200..2_800).contains(&quarter), "{quarter}");
}

#[test]
fn the_wait_comes_down_one_step_per_calm_spell() {
    let mut b = Backoff::default();
    for s in 0..4 {
        second(&mut b, 1000 + s, 1000, 500);
    }
    assert_eq!(b.wait_ms(), 8000);
    // The fourth second in a row with shedding is over; a few shed shakes (under 1
    // in 100) do not make a shedding second.
    second(&mut b, 1004, 1000, 5);
    assert_eq!(b.wait_ms(), 16000);
    for s in 5..9 {
        second(&mut b, 1000 + s, 1000, 5);
    }
    assert_eq!(b.wait_ms(), 16000, "four calm seconds are not a spell");
    second(&mut b, 1009, 1000, 0);
    assert_eq!(b.wait_ms(), 8000);
    // Seconds with no shakes at all are calm too: 1009 and 1010..=1019.
    second(&mut b, 1020, 1000, 0);
    assert_eq!(b.wait_ms(), 2000);
    for s in 21..25 {
        second(&mut b, 1000 + s, 1000, 0);
    }
    assert_eq!(b.wait_ms(), BACKOFF_BASE_MS);
}

#[test]
fn the_wait_holds_while_the_queue_drains() {
    let mut b = Backoff::default();
    at_queue(&mut b, 10, 300);
    at_queue(&mut b, 11, 600);
    at_queue(&mut b, 12, 900);
    assert_eq!(b.wait_ms(), 4000, "the queue grew: doubled twice");
    at_queue(&mut b, 13, 500);
    at_queue(&mut b, 14, 250);
    assert_eq!(b.wait_ms(), 8000, "one more for second 12; then it drains");
    at_queue(&mut b, 15, 300);
    assert_eq!(b.wait_ms(), 8000, "second 14 drained too");
    at_queue(&mut b, 16, 0);
    assert_eq!(b.wait_ms(), 16000, "second 15 grew again");
}

#[test]
fn the_base_wait_is_a_users_shake_interval() {
    let mut b = Backoff::default();
    // 10,000 users, 2,000 shakes a second: each shakes every 5 s.
    for s in 0..2 {
        for i in 0..2000 {
            b.shake(at(s, i / 2), Duration::ZERO, 10_000);
        }
    }
    assert_eq!(b.wait_ms(), 5000);
    // 100 users shaking 2,000 times a second: the base is the floor, 1 s.
    let mut b = Backoff::default();
    for s in 0..2 {
        for i in 0..2000 {
            b.shake(at(s, i / 2), Duration::ZERO, 100);
        }
    }
    assert_eq!(b.wait_ms(), BACKOFF_BASE_MS);
}

#[test]
fn shed_clients_are_asked_for_waits_spread_around_the_mean() {
    let mut b = Backoff::default();
    for s in 0..3 {
        second(&mut b, 1000 + s, 1000, 500);
    }
    let mean = b.wait_ms();
    assert_eq!(mean, 4000);
    let mut rng = rng();
    let waits: Vec<u32> = (0..20_000).map(|_| b.shed(&mut rng)).collect();
    assert!(waits.iter().all(|&w| (1..=BACKOFF_MAX_MS).contains(&w)));
    let average = waits.iter().map(|&w| f64::from(w)).sum::<f64>() / waits.len() as f64;
    assert!((average / f64::from(mean) - 1.0).abs() < 0.05, "{average}");
    // Exponential: about 39% under half the mean, 14% over twice it.
    let share = |f: &dyn Fn(u32) -> bool| {
        waits.iter().filter(|&&w| f(w)).count() as f64 / waits.len() as f64
    };
    let under_half = share(&|w| w < mean / 2);
    let over_twice = share(&|w| w > mean * 2);
    assert!((0.35..0.43).contains(&under_half), "{under_half}");
    assert!((0.11..0.17).contains(&over_twice), "{over_twice}");
}

// ----- rule 3: the cap ---------------------------------------------------------------

const MAX: Duration = Duration::from_millis(200);

/// `n` shakes spread over tenth `t` (since the epoch), each having waited `waited_ms`;
/// how many were admitted.
fn tenth(c: &mut Cap, t: u64, n: u64, waited_ms: u64) -> u64 {
    (0..n)
        .filter(|i| {
            let us = t * TENTH_US + i * TENTH_US / n;
            c.shake(
                UnixTime::from_micros(us),
                Duration::from_millis(waited_ms),
                MAX,
            );
            c.admit()
        })
        .count() as u64
}

/// A queue past the limit in tenth 1000, drained in 1001 (`n` shakes in each); the
/// cap is set as 1002 begins.
fn behind_then_drained(c: &mut Cap, n: u64) {
    tenth(c, 1000, n, 250);
    tenth(c, 1001, n, 10);
    tenth(c, 1002, 1, 10);
}

#[test]
fn a_drained_backlog_caps_at_nine_tenths_of_the_most_served() {
    let mut c = Cap::default();
    assert_eq!(tenth(&mut c, 1000, 500, 10), 500);
    assert_eq!(tenth(&mut c, 1001, 400, 250), 400);
    // Shed as late while it drains: no cap yet.
    tenth(&mut c, 1002, 300, 150);
    tenth(&mut c, 1003, 300, 10);
    assert_eq!(c.per_sec(), 0);
    // Closing 1003, drained: the most served in a tenth was 500, 5,000 a second.
    tenth(&mut c, 1004, 1, 10);
    assert_eq!(c.per_sec(), 4500);
    // What arrives above the cap is refused as it is read.
    let admitted = tenth(&mut c, 1005, 1000, 10);
    assert!((440..=500).contains(&admitted), "{admitted}");
}

#[test]
fn a_queue_formed_under_the_cap_cuts_it_and_one_that_stays_does_not() {
    let mut c = Cap::default();
    behind_then_drained(&mut c, 500);
    assert_eq!(c.per_sec(), 4500);
    let a1 = tenth(&mut c, 1003, 1000, 20);
    let a2 = tenth(&mut c, 1004, 1000, 150);
    let grown = f64::from(c.per_sec());
    assert!((grown - 4545.0).abs() <= 1.0, "{grown}: +1% for refusing");
    // Closing 1004: a queue formed under the cap: cut to nine tenths of the most
    // admitted in a tenth since the cap was set.
    tenth(&mut c, 1005, 1000, 150);
    let cap = f64::from(c.per_sec());
    let served = a1.max(a2) as f64 * 10.0;
    assert!(
        (cap - served * 0.9).abs() <= 1.0,
        "{cap} after serving {served}"
    );
    // The queue stays: no further cut (it is shed as late meanwhile).
    for t in 1006..1016 {
        tenth(&mut c, t, 1000, 300);
    }
    assert_eq!(f64::from(c.per_sec()), cap);
}

#[test]
fn a_cap_that_refuses_grows_and_one_that_does_not_for_30_s_is_dropped() {
    let mut c = Cap::default();
    behind_then_drained(&mut c, 100);
    assert_eq!(c.per_sec(), 900);
    // Refusing, with waits under half the limit: +1% a tenth (the tenth with one
    // shake refused none).
    for t in 1003..1013 {
        tenth(&mut c, t, 1000, 20);
    }
    let grown = c.per_sec();
    assert!((980..=990).contains(&grown), "{grown}");
    // Fewer shakes than the cap: nothing refused (once the tokens spent refusing are
    // back); after 30 s of that the cap goes.
    tenth(&mut c, 1013, 50, 5);
    for t in 1014..1313 {
        assert_eq!(tenth(&mut c, t, 50, 5), 50);
    }
    assert!(c.per_sec() > 0);
    tenth(&mut c, 1400, 1, 5);
    assert_eq!(c.per_sec(), 0);
    assert_eq!(tenth(&mut c, 1401, 5000, 5), 5000);
}

#[test]
fn a_cap_that_refuses_while_shakes_wait_nothing_grows_by_a_tenth_a_tenth() {
    let mut c = Cap::default();
    behind_then_drained(&mut c, 100);
    assert_eq!(c.per_sec(), 900);
    // Refusing, and no shake waited past a twentieth of the limit (10 ms): +10% a
    // tenth, 2.36x in nine tenths (the first tenth after the cap refused none).
    for t in 1003..1013 {
        tenth(&mut c, t, 5000, 10);
    }
    let grown = f64::from(c.per_sec());
    assert!((grown - 900.0 * 1.1f64.powi(9)).abs() <= 2.0, "{grown}");
    // A wait of 11 ms (in 1013, closed as 1014 begins): back to +1%.
    tenth(&mut c, 1013, 5000, 11);
    tenth(&mut c, 1014, 1, 11);
    let slow = f64::from(c.per_sec());
    let expected = grown * 1.1 * 1.01;
    assert!((slow - expected).abs() <= 2.0, "{slow}, not {expected}");
}

#[test]
fn a_cap_admits_at_least_the_floor() {
    let mut c = Cap::default();
    // Everything shed as late: nothing admitted before the queue drained.
    for (ms, waited) in [(100_000, 900), (100_100, 10), (100_200, 10)] {
        c.shake(
            UnixTime::from_millis(ms),
            Duration::from_millis(waited),
            MAX,
        );
    }
    assert_eq!(f64::from(c.per_sec()), MIN_PER_SEC);
}

#[test]
fn no_cap_while_read_in_time_nor_before_the_backlog_drained_nor_without_a_limit() {
    for waited_ms in [150, 5000] {
        let mut c = Cap::default();
        for t in 1000..1100 {
            assert_eq!(tenth(&mut c, t, 500, waited_ms), 500);
        }
        assert_eq!(c.per_sec(), 0, "waits of {waited_ms} ms");
    }
    let mut c = Cap::default();
    for (ms, waited) in [(100_000, 5000), (100_100, 10), (100_200, 10)] {
        let waited = Duration::from_millis(waited);
        c.shake(UnixTime::from_millis(ms), waited, Duration::ZERO);
    }
    assert_eq!(c.per_sec(), 0);
}

// ----- the gate ----------------------------------------------------------------------

const LIMITS: Limits = Limits {
    max_queue: Duration::from_millis(200),
    per_sec: 3,
    cap: false,
};

#[test]
fn the_gate_sheds_late_shakes_first_then_over_the_rate() {
    let mut o = Overload::default();
    let now = UnixTime::from_millis(5_000_000);
    // Past twice the limit: late, whatever the rate has left.
    let late = o.gate(now, Duration::from_millis(500), 100, LIMITS);
    assert!(
        matches!(
            late,
            Verdict::Shed {
                why: Shed::Late,
                ..
            }
        ),
        "{late:?}"
    );
    // In time: admitted up to the rate; the late one took no place in it.
    for _ in 0..3 {
        assert_eq!(o.gate(now, Duration::ZERO, 100, LIMITS), Verdict::Admit);
    }
    let over = o.gate(now, Duration::ZERO, 100, LIMITS);
    let Verdict::Shed {
        why,
        retry_after_ms,
    } = over
    else {
        panic!("{over:?}");
    };
    assert_eq!(why, Shed::Rate);
    assert!((1..=BACKOFF_MAX_MS).contains(&retry_after_ms));
    // The next second has places again.
    let later = now + Duration::from_secs(1);
    assert_eq!(o.gate(later, Duration::ZERO, 100, LIMITS), Verdict::Admit);
    // No limit on the queue: nothing is ever late.
    let unlimited = Limits {
        max_queue: Duration::ZERO,
        ..LIMITS
    };
    let later = later + Duration::from_secs(1);
    assert_eq!(
        o.gate(later, Duration::from_secs(60), 100, unlimited),
        Verdict::Admit
    );
}

#[test]
fn the_gate_caps_only_in_the_fifo_order_and_after_a_drained_queue() {
    let limits = Limits {
        per_sec: u32::MAX,
        ..LIMITS
    };
    let capped = Limits {
        cap: true,
        ..limits
    };
    for (limits, caps) in [(limits, false), (capped, true)] {
        let mut o = Overload::default();
        // A queue past the limit in one tenth, drained in the next.
        for (tenth, waited_ms) in [(1000u64, 250u64), (1001, 10)] {
            for i in 0..100 {
                let at = UnixTime::from_micros(tenth * 100_000 + i * 1000);
                o.gate(at, Duration::from_millis(waited_ms), 100, limits);
            }
        }
        // Then many more than were served: the cap sheds the excess as it is read.
        let shed = (0..1000)
            .filter(|i| {
                let at = UnixTime::from_micros(1002 * 100_000 + i * 100);
                let v = o.gate(at, Duration::from_millis(5), 100, limits);
                matches!(
                    v,
                    Verdict::Shed {
                        why: Shed::Capped,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(shed > 0, caps, "cap {caps}: {shed} shed");
        assert_eq!(o.cap_per_sec() > 0, caps);
    }
}
