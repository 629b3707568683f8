use std::collections::BTreeMap;

use super::*;
use hongbao_telemetry::sample::{NetCounters, RoleSample};

fn role(name: &str, shakes: u64, cpu_ms: u64, connections: u64) -> RoleSample {
    RoleSample {
        role: name.into(),
        processes: 1,
        cpu_ms,
        counters: BTreeMap::from([("shakes".to_string(), shakes)]),
        levels: BTreeMap::from([("connections".to_string(), connections)]),
        latency_us: vec![(100, 3), (2000, 1)],
    }
}

fn sample(instance: &str, second: u64, roles: Vec<RoleSample>) -> Sample {
    Sample {
        instance: instance.into(),
        host: "h".into(),
        unix_second: second,
        roles,
        net: None,
    }
}

/// Parses series CSV into rows of column → text.
fn rows(csv: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header, COLUMNS);
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split(','))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn sum(rows: &[BTreeMap<String, String>], role: &str, column: &str) -> u64 {
    rows.iter()
        .filter(|r| r["role"] == role)
        .map(|r| r[column].parse::<u64>().unwrap_or(0))
        .sum()
}

#[test]
fn counts_of_two_instances_add_up_with_lost_and_late_reports_and_no_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collector::new(Some(dir.path())).unwrap();
    c.mark(100_000, "warmup");
    c.mark(103_000, "qps-10");
    // Instance a reports every second; b loses second 102 and reports 104 late.
    let mut shakes_a = 0;
    let mut shakes_b = 0;
    for s in 100..=106u64 {
        shakes_a += 10;
        c.add(&sample("a", s, vec![role("load", shakes_a, s * 10, 5)]));
        shakes_b += 7;
        if s != 102 && s != 104 {
            c.add(&sample("b", s, vec![role("load", shakes_b, s * 20, 3)]));
        }
        if s == 105 {
            c.close_before(s + 1).unwrap(); // closes through 102
        }
    }
    c.close_before(110).unwrap(); // closes through 106; the late report lands in 107
    c.add(&sample(
        "b",
        104,
        vec![role("load", shakes_b - 14, 2080, 3)],
    ));
    c.finish().unwrap();
    let written = std::fs::read_to_string(dir.path().join("series.csv")).unwrap();
    assert_eq!(written, c.csv());
    let rows = rows(&written);
    let seconds: Vec<u64> = rows
        .iter()
        .map(|r| r["unix_second"].parse().unwrap())
        .collect();
    assert_eq!(
        seconds,
        (100..=107).collect::<Vec<_>>(),
        "one row a second, no gaps"
    );
    assert_eq!(sum(&rows, "load", "shakes"), shakes_a + shakes_b);
    // The lost second carries b's levels; the phase follows the marks.
    let r102 = &rows[2];
    assert_eq!(r102["connections"], "8");
    assert_eq!(r102["instances"], "2");
    assert_eq!(r102["phase"], "warmup");
    assert_eq!(rows[3]["phase"], "qps-10");
    assert_eq!(r102["latency_p50_ms"], "0.1");
    assert!(rows[0]["net_rx_packets"].is_empty(), "not reported: empty");
}

#[test]
fn roles_start_at_their_first_report_and_net_counts_from_a_baseline() {
    let mut c = Collector::new(None).unwrap();
    let net = |p| NetCounters {
        interface: "lo".into(),
        rx_packets: p,
        tx_packets: p,
        rx_bytes: p * 100,
        tx_bytes: p * 100,
    };
    for s in 10..15u64 {
        let mut roles = vec![role("server", s, 0, 1)];
        if s >= 12 {
            roles.push(role("core", 0, 0, 0));
        }
        // The machine's busy time counts from boot; both instances report it.
        let machine = RoleSample {
            role: "host".into(),
            cpu_ms: 9_000_000 + s * 1_500,
            ..Default::default()
        };
        roles.push(machine.clone());
        let mut one = sample("serve", s, roles);
        one.net = Some(net(1_000 + s * 5));
        c.add(&one);
        // A second instance on the same host reports the same interface and machine.
        let mut two = sample("load", s, vec![machine]);
        two.net = Some(net(1_000 + s * 5));
        c.add(&two);
    }
    c.finish().unwrap();
    let rows = rows(c.csv());
    let core: Vec<&BTreeMap<String, String>> =
        rows.iter().filter(|r| r["role"] == "core").collect();
    assert_eq!(core.len(), 3);
    assert_eq!(
        sum(&rows, "host", "net_rx_packets"),
        20,
        "4 seconds × 5 after the baseline"
    );
    assert_eq!(rows.iter().filter(|r| r["role"] == "host").count(), 5);
    let host_cpu: Vec<&str> = rows
        .iter()
        .filter(|r| r["role"] == "host")
        .map(|r| r["cpu_seconds"].as_str())
        .collect();
    assert_eq!(
        host_cpu,
        ["0.0", "1.5", "1.5", "1.5", "1.5"],
        "once per host, from a baseline"
    );
    assert!(rows
        .iter()
        .all(|r| r["role"] != "host" || r["instances"] == "1"));
    let metrics = c.metrics();
    assert!(metrics.contains("hongbao_network_rx_packets_total{role=\"host\"} 20"));
    // One server instance: no rows of its own.
    assert!(rows.iter().all(|r| !r["role"].contains('@')));
}

/// Several gateway hosts (a lab): the server and core rows sum them, and each also gets
/// rows of its own, with its own interface's traffic; /metrics stays per role.
#[test]
fn several_gateways_get_rows_of_their_own() {
    let mut c = Collector::new(None).unwrap();
    for s in 20..24u64 {
        for (name, per_sec) in [("gw1", 10), ("gw2", 30)] {
            let mut one = sample(
                name,
                s,
                vec![
                    role("server", s * per_sec, s * 100, per_sec),
                    role("core", 0, s, 0),
                ],
            );
            one.net = Some(NetCounters {
                interface: format!("e1-{name}"),
                rx_packets: s * per_sec,
                tx_packets: s * per_sec,
                rx_bytes: 0,
                tx_bytes: 0,
            });
            c.add(&one);
        }
    }
    c.finish().unwrap();
    let rows = rows(c.csv());
    for role in [
        "server",
        "core",
        "server@gw1",
        "server@gw2",
        "core@gw1",
        "core@gw2",
    ] {
        assert_eq!(
            rows.iter().filter(|r| r["role"] == role).count(),
            4,
            "{role}"
        );
    }
    // Counters count from the instance's start; interface counters from a baseline.
    assert_eq!(sum(&rows, "server@gw1", "shakes"), 230);
    assert_eq!(sum(&rows, "server@gw2", "shakes"), 690);
    assert_eq!(sum(&rows, "server", "shakes"), 920);
    assert_eq!(
        sum(&rows, "server@gw2", "net_rx_packets"),
        90,
        "3 seconds × 30"
    );
    assert_eq!(sum(&rows, "host", "net_rx_packets"), 120);
    let last_gw1 = rows.iter().rfind(|r| r["role"] == "server@gw1").unwrap();
    assert_eq!(
        (&*last_gw1["instances"], &*last_gw1["connections"]),
        ("1", "10")
    );
    let last = rows.iter().rfind(|r| r["role"] == "server").unwrap();
    assert_eq!((&*last["instances"], &*last["connections"]), ("2", "40"));
    assert!(!c.metrics().contains('@'));
}
