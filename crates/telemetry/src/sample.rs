//! What a `serve` or `load` instance reports to the monitor once a second.
//!
//! Counters are cumulative, so a lost or late report loses no counts: the monitor takes
//! differences. Latency comes as that second's histogram in sparse HDR buckets (µs,
//! count), which merge exactly.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The roles a series row can describe.
pub const ROLES: &[&str] = &["server", "core", "load", "host"];

/// Counters a role may report (cumulative), in the order of the series columns.
pub const COUNTERS: &[&str] = &[
    "shakes",
    "won",
    "nothing",
    "overloaded",
    "opens",
    "opened",
    "sends",
    "errors",
    "packets_released",
    "packets_won",
    "send_packets",
    "shares_opened",
    "broadcasts",
    "broadcast_delivered",
];

/// Levels a role may report (values now, summed over instances).
pub const LEVELS: &[&str] = &["connections", "logged_in", "rss_bytes"];

/// One instance's report for one wall-clock second.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sample {
    /// Names the reporting instance, unique among the monitor's sources (`serve@host:pid`).
    pub instance: String,
    pub host: String,
    /// The second described: counters as of its end.
    pub unix_second: u64,
    pub roles: Vec<RoleSample>,
    /// Cumulative counters of the network interface in use.
    #[serde(default)]
    pub net: Option<NetCounters>,
}

/// One role of one instance: e.g. the server's workers summed, or its core.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RoleSample {
    pub role: String,
    /// Processes behind this role.
    pub processes: u32,
    /// CPU time of those processes since they started (ms, cumulative).
    pub cpu_ms: u64,
    /// Cumulative counters named in `COUNTERS`.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
    /// Levels named in `LEVELS`.
    #[serde(default)]
    pub levels: BTreeMap<String, u64>,
    /// Shake latency of this second: sparse HDR buckets (µs, count).
    #[serde(default)]
    pub latency_us: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetCounters {
    pub interface: String,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// The series columns of the interface counters.
pub const NET_COLUMNS: [&str; 4] = [
    "net_rx_packets",
    "net_tx_packets",
    "net_rx_bytes",
    "net_tx_bytes",
];

impl NetCounters {
    /// The counters in the order of `NET_COLUMNS`.
    pub fn values(&self) -> [u64; 4] {
        [
            self.rx_packets,
            self.tx_packets,
            self.rx_bytes,
            self.tx_bytes,
        ]
    }
}

/// Counters or levels as a sample carries them, from (name, value) pairs.
pub fn named(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// A latency histogram in µs, from 1 µs to 2 minutes at 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

/// The same span at 2 significant digits (within 1%), for a recorder on the hot path that
/// reads and clears its histogram every second (a gateway worker, every shake): its
/// counts are a seventh of `new_histogram`'s (21 KB, not 147), which stay in the cache
/// between shakes and take a seventh of the time to walk and to clear.
pub fn new_coarse_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 2).expect("valid histogram bounds")
}

pub fn sparse(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

pub fn merge_sparse(h: &mut Histogram<u64>, sparse: &[(u64, u64)]) {
    for &(value, count) in sparse {
        h.saturating_record_n(value, count);
    }
}

/// This machine's name, for `Sample::host`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// The interface that carries traffic to `peer`: `lo` for loopback, else the interface
/// of the most specific route that covers it (a lab host's own network, the default
/// route), from this network namespace's /proc/net/route.
pub fn interface_for(peer: IpAddr) -> String {
    if peer.is_loopback() {
        return "lo".to_string();
    }
    std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|table| route_for(&table, peer))
        .unwrap_or_else(|| "lo".to_string())
}

/// The interface of the longest route in `table` (/proc/net/route) covering `peer`.
fn route_for(table: &str, peer: IpAddr) -> Option<String> {
    let IpAddr::V4(peer) = peer else {
        return None;
    };
    let peer = u32::from(peer);
    // Destination and mask are printed as the in-memory (network-order) word read on
    // this little-endian machine.
    let address = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::swap_bytes);
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (dest, mask) = (address(f.get(1)?)?, address(f.get(7)?)?);
            (peer & mask == dest).then(|| (mask.count_ones(), f[0].to_string()))
        })
        .max_by_key(|(bits, _)| *bits)
        .map(|(_, interface)| interface)
}

/// The machine as a role: `cpu_ms` is the CPU time all cores spent busy since boot
/// (user, system, interrupts, steal — everything but idle and I/O wait), whoever spent it:
/// the host row's CPU less the roles' CPU is what other processes and the kernel's own
/// threads took. Every instance on a host reports it; the monitor counts it once per host.
pub fn host_role() -> Option<RoleSample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    Some(RoleSample {
        role: "host".into(),
        cpu_ms: parse_busy_ms(stat.lines().next()?)?,
        ..Default::default()
    })
}

/// Busy milliseconds from /proc/stat's `cpu` line (in USER_HZ ticks of 10 ms).
fn parse_busy_ms(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let ticks: Vec<u64> = fields.map(|f| f.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy = ticks.get(..8)?.iter().sum::<u64>() - ticks[3] - ticks[4];
    Some(busy * 10)
}

/// The kernel's counters for `interface` (from /proc/net/dev).
pub fn read_net(interface: &str) -> Option<NetCounters> {
    let table = std::fs::read_to_string("/proc/net/dev").ok()?;
    parse_net_dev(&table, interface)
}

fn parse_net_dev(table: &str, interface: &str) -> Option<NetCounters> {
    table.lines().skip(2).find_map(|line| {
        let (name, rest) = line.split_once(':')?;
        if name.trim() != interface {
            return None;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets …
        (f.len() >= 10).then(|| NetCounters {
            interface: interface.to_string(),
            rx_bytes: f[0],
            rx_packets: f[1],
            tx_bytes: f[8],
            tx_packets: f[9],
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the coarse histogram's comment says: a seventh of the counts, within 1%.
    #[test]
    fn the_coarse_histogram_is_small_and_within_a_percent() {
        let (fine, mut coarse) = (new_histogram(), new_coarse_histogram());
        let bytes = |h: &Histogram<u64>| h.distinct_values() * 8;
        assert_eq!((bytes(&fine) / 1000, bytes(&coarse) / 1000), (147, 21));
        for v in [1, 99, 1_234, 98_765, 4_321_000, 119_000_000] {
            coarse.reset();
            coarse.record(v).unwrap();
            let got = coarse.value_at_quantile(1.0) as f64;
            assert!((got - v as f64).abs() <= v as f64 / 100.0, "{v}: {got}");
        }
    }

    /// A lab host (its /24 and no default route) and a machine with a default route.
    #[test]
    fn the_interface_is_the_longest_route_to_the_peer() {
        let table =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            e5-gw1\t000512C6\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let at = |ip: &str| route_for(table, ip.parse().unwrap());
        assert_eq!(at("198.18.5.1").as_deref(), Some("e5-gw1"));
        assert_eq!(at("10.1.2.3").as_deref(), Some("eth0"));
        let lab_only = table
            .lines()
            .filter(|l| !l.starts_with("eth0"))
            .collect::<Vec<_>>();
        assert_eq!(
            route_for(&lab_only.join("\n"), "10.1.2.3".parse().unwrap()),
            None
        );
    }

    #[test]
    fn net_dev_lines_are_read_by_interface() {
        let table = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n  eth0: 5 6 0 0 0 0 0 0 7 8 0 0 0 0 0 0\n";
        let lo = parse_net_dev(table, "lo").unwrap();
        assert_eq!(
            (lo.rx_bytes, lo.rx_packets, lo.tx_bytes, lo.tx_packets),
            (1000, 10, 2000, 20)
        );
        assert_eq!(parse_net_dev(table, "eth0").unwrap().tx_packets, 8);
        assert!(parse_net_dev(table, "eth1").is_none());
        // This machine's loopback is there and counting.
        assert!(read_net("lo").is_some());
    }

    #[test]
    fn busy_time_is_everything_but_idle_and_io_wait() {
        let line = "cpu  100 5 50 1000 20 3 7 2 0 0";
        assert_eq!(parse_busy_ms(line), Some((100 + 5 + 50 + 3 + 7 + 2) * 10));
        assert_eq!(parse_busy_ms("cpu0 1 2 3 4 5 6 7 8"), None);
        let host = host_role().expect("/proc/stat");
        assert_eq!(host.role, "host");
        assert!(host.cpu_ms > 0);
    }

    #[test]
    fn sparse_buckets_merge_to_the_same_histogram() {
        let mut a = new_histogram();
        for v in [5, 50, 500, 5000, 5000] {
            a.record(v).unwrap();
        }
        let mut b = new_histogram();
        merge_sparse(&mut b, &sparse(&a));
        assert_eq!(a.len(), b.len());
        assert_eq!(a.value_at_quantile(0.99), b.value_at_quantile(0.99));
    }
}
