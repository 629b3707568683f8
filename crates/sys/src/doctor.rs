//! `hongbao doctor`: reads the limits that decide how many connections this machine can
//! hold with the server and the load generator on it together, says which binds first and
//! what to change, and with `--apply` (as root) changes the sysctls it can.
//!
//! Each connection costs two sockets here (server end and client end), so the file,
//! memory and conntrack arithmetic is done for `2 × connections`.

use std::fmt::Write as _;

use crate::limits::{planned_sockets_per_process, sockets_per_process};

/// Kernel memory per socket measured on these machines (DESIGN.md §5).
pub const KERNEL_BYTES_PER_SOCKET: u64 = 4_900;
/// Our user-space budget per socket end (server and load generator each).
pub const USER_BYTES_PER_SOCKET: u64 = 1_000;
/// Users per source address the load generator plans for, as a share of the port range.
/// `connect()` takes ephemeral ports of one parity first (the other half is left for
/// `bind()`), and once that half is used up each connect searches slowly through the
/// rest: measured here, 200,000 users over 4 addresses (51K each) connected 130K in 10 s
/// and the remaining 70K at ~300/s. So plan for 80% of half the range.
pub const PORT_RANGE_USE: f64 = 0.4;
/// Users per source address the load generator binds by default. The kernel picks a
/// connecting socket's port by probing ports of one parity from a hashed offset until the
/// 4-tuple is free, so the probes per connect grow with how full that address's ports
/// are: at the port range's 25,804 users per address the last connects of a million
/// probed ~5 ports each and the connect rate fell from ~35,000/s to ~10,000/s. At 2,000 an
/// address's ports stay ~6% used; 127/8 has addresses to spare.
pub const LOAD_USERS_PER_SOURCE_ADDRESS: u64 = 2_000;
/// The kernel's ceiling for `net.ipv4.tcp_child_ehash_entries`.
const MAX_CHILD_EHASH_BUCKETS: u64 = 16 << 20;

#[derive(Debug, Clone)]
pub struct Limits {
    pub nofile_soft: u64,
    pub nofile_hard: u64,
    pub file_max: u64,
    pub files_open: u64,
    pub nr_open: u64,
    pub port_range: (u64, u64),
    pub reserved_ports: String,
    pub somaxconn: u64,
    pub syn_backlog: u64,
    /// `net.ipv4.tcp_syncookies`: 0 never, 1 once the SYN queue overflows (the default), 2
    /// always (every connection loses its TCP options).
    pub syncookies: u64,
    /// `None` inside a network namespace other than the first (the file is global).
    pub tcp_mem_max_pages: Option<u64>,
    /// Buckets of the established-socket hash this namespace looks sockets up in.
    pub ehash_buckets: u64,
    pub conntrack_max: Option<u64>,
    /// Entries in the connection tracking table now (0 when it tracks nothing here).
    pub conntrack_count: u64,
    /// Whether a loopback connection shows up in the tracking table (probed).
    pub loopback_tracked: bool,
    pub mem_available: u64,
    pub cores: usize,
    /// Sockets in TIME_WAIT now (`/proc/net/sockstat`).
    pub time_wait: u64,
    /// `net.ipv4.tcp_tw_reuse`: 0 off, 1 on, 2 on for loopback only (the default).
    pub tw_reuse: u64,
    /// `net.ipv4.tcp_max_tw_buckets`: TIME_WAIT sockets beyond this are destroyed at once.
    pub max_tw_buckets: u64,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn num(path: &str) -> u64 {
    read(path)
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

impl Limits {
    pub fn read() -> Limits {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        let range = read("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        let mut r = range.split_whitespace().filter_map(|v| v.parse().ok());
        let port_range = (r.next().unwrap_or(32768), r.next().unwrap_or(60999));
        let mem_available = read("/proc/meminfo")
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemAvailable:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .unwrap_or(0)
            * 1024;
        Limits {
            nofile_soft: lim.rlim_cur,
            nofile_hard: lim.rlim_max,
            file_max: num("/proc/sys/fs/file-max"),
            files_open: num("/proc/sys/fs/file-nr"),
            nr_open: num("/proc/sys/fs/nr_open"),
            port_range,
            reserved_ports: read("/proc/sys/net/ipv4/ip_local_reserved_ports").unwrap_or_default(),
            somaxconn: num("/proc/sys/net/core/somaxconn"),
            syn_backlog: num("/proc/sys/net/ipv4/tcp_max_syn_backlog"),
            syncookies: num("/proc/sys/net/ipv4/tcp_syncookies"),
            tcp_mem_max_pages: read("/proc/sys/net/ipv4/tcp_mem")
                .and_then(|s| s.split_whitespace().nth(2)?.parse().ok()),
            ehash_buckets: ehash_buckets(),
            conntrack_max: read("/proc/sys/net/netfilter/nf_conntrack_max")
                .and_then(|s| s.parse().ok()),
            conntrack_count: num("/proc/sys/net/netfilter/nf_conntrack_count"),
            loopback_tracked: probe_loopback_tracking(),
            mem_available,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            time_wait: read("/proc/net/sockstat")
                .and_then(|s| {
                    let tcp = s.lines().find(|l| l.starts_with("TCP:"))?.to_string();
                    let mut words = tcp.split_whitespace();
                    words.find(|w| *w == "tw")?;
                    words.next()?.parse().ok()
                })
                .unwrap_or(0),
            tw_reuse: num("/proc/sys/net/ipv4/tcp_tw_reuse"),
            max_tw_buckets: num("/proc/sys/net/ipv4/tcp_max_tw_buckets"),
        }
    }

    pub fn port_range_size(&self) -> u64 {
        self.port_range.1.saturating_sub(self.port_range.0) + 1
    }

    /// Connections each loopback source address can carry to one server port.
    pub fn users_per_source_address(&self) -> u64 {
        ((self.port_range_size() as f64 * PORT_RANGE_USE) as u64).max(1)
    }

    /// Users per source address the load binds: the port range's capacity, at most
    /// `LOAD_USERS_PER_SOURCE_ADDRESS`.
    pub fn load_users_per_source_address(&self) -> u64 {
        self.users_per_source_address()
            .min(LOAD_USERS_PER_SOURCE_ADDRESS)
    }
}

/// Buckets of the established-socket hash this network namespace looks sockets up in.
pub fn ehash_buckets() -> u64 {
    // Negative: this namespace shares the first namespace's table.
    read("/proc/sys/net/ipv4/tcp_ehash_entries")
        .and_then(|s| s.parse::<i64>().ok())
        .map_or(0, i64::unsigned_abs)
}

/// Opens one loopback connection and sees whether the conntrack table counts it.
fn probe_loopback_tracking() -> bool {
    let path = "/proc/sys/net/netfilter/nf_conntrack_count";
    if read(path).is_none() {
        return false;
    }
    let before = num(path);
    let probe = (|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
        let client = std::net::TcpStream::connect(listener.local_addr().ok()?).ok()?;
        let server = listener.accept().ok()?;
        Some((client, server))
    })();
    let tracked = probe.is_some() && num(path) > before;
    drop(probe);
    tracked
}

/// One limit, what `connections` needs of it, and how many connections it allows.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub current: String,
    pub needed: String,
    pub allows: u64,
    pub fix: Option<String>,
}

pub fn checks(l: &Limits, connections: u64) -> Vec<Check> {
    let per_proc = sockets_per_process(l.nofile_hard);
    let procs = connections.div_ceil(per_proc);
    let sockets = 2 * connections;
    let per_socket = KERNEL_BYTES_PER_SOCKET + USER_BYTES_PER_SOCKET;
    let mut v = vec![
        Check {
            name: "open files per process (hard)",
            current: format!("soft {} hard {}", l.nofile_soft, l.nofile_hard),
            needed: format!(
                "{} server workers and {procs} load processes of ≤ {per_proc} sockets",
                connections.div_ceil(planned_sockets_per_process(l.nofile_hard))
            ),
            allows: u64::MAX, // processes multiply; the hard limit only sets how many
            fix: (l.nofile_hard < 20_000).then(|| "raise the hard nofile limit (limits.conf / systemd)".into()),
        },
        Check {
            name: "fs.file-max (files, whole system)",
            current: format!("{} ({} open now)", l.file_max, l.files_open),
            needed: format!("> {}", sockets + 100_000),
            allows: l.file_max.saturating_sub(l.files_open + 100_000) / 2,
            fix: (l.file_max < sockets + 100_000).then(|| format!("sysctl -w fs.file-max={}", (sockets + 200_000).max(4_000_000))),
        },
        Check {
            name: "fs.nr_open (per-process ceiling)",
            current: l.nr_open.to_string(),
            needed: format!("≥ {}", l.nofile_hard),
            allows: u64::MAX,
            fix: None,
        },
        Check {
            name: "net.ipv4.ip_local_port_range",
            current: format!("{} {} ({} ports)", l.port_range.0, l.port_range.1, l.port_range_size()),
            needed: format!(
                "{} source addresses × {} users each",
                connections.div_ceil(l.load_users_per_source_address()),
                l.load_users_per_source_address()
            ),
            // With IP_BIND_ADDRESS_NO_PORT and many 127.0.x.y sources, ports only set how
            // many addresses the load spreads over; 127/8 has ~16M of them.
            allows: l.users_per_source_address() * 65_000,
            fix: (l.port_range.0 > 1024 || l.port_range.1 < 65535)
                .then(|| "sysctl -w net.ipv4.ip_local_port_range=\"1024 65535\" (fewer source addresses needed)".into()),
        },
        Check {
            name: "net.ipv4.ip_local_reserved_ports",
            current: if l.reserved_ports.is_empty() { "(none)".into() } else { l.reserved_ports.clone() },
            needed: "the listening ports (serve 7000-7003, monitor 7200 by default)".into(),
            allows: u64::MAX,
            fix: (reserved_ports_wanted(&l.reserved_ports) != l.reserved_ports).then(|| {
                format!(
                    "sysctl -w net.ipv4.ip_local_reserved_ports={}",
                    reserved_ports_wanted(&l.reserved_ports)
                )
            }),
        },
        Check {
            name: "net.core.somaxconn (accept backlog)",
            current: l.somaxconn.to_string(),
            needed: "≥ 65535 for connect storms".into(),
            allows: u64::MAX,
            fix: (l.somaxconn < 65535).then(|| "sysctl -w net.core.somaxconn=65535".into()),
        },
        Check {
            name: "net.ipv4.tcp_max_syn_backlog",
            current: l.syn_backlog.to_string(),
            needed: "≥ 65535 for connect storms".into(),
            allows: u64::MAX,
            fix: (l.syn_backlog < 65535).then(|| "sysctl -w net.ipv4.tcp_max_syn_backlog=65535".into()),
        },
        Check {
            name: "net.ipv4.tcp_syncookies",
            current: l.syncookies.to_string(),
            needed: "1: a storm past the SYN queue still connects, and only then are cookies used".into(),
            allows: u64::MAX,
            fix: (l.syncookies != 1).then(|| "sysctl -w net.ipv4.tcp_syncookies=1".into()),
        },
        Check {
            name: "memory available",
            current: format!("{} MiB", l.mem_available >> 20),
            needed: format!("~{} MiB ({} B per socket, 2 per connection)", (sockets * per_socket) >> 20, per_socket),
            allows: l.mem_available / (2 * per_socket),
            fix: None,
        },
        Check {
            name: "net.ipv4.tcp_mem (max, pages)",
            current: match l.tcp_mem_max_pages {
                Some(pages) => format!("{pages} ({} MiB)", (pages * 4096) >> 20),
                None => "set in the first network namespace (global)".into(),
            },
            needed: "room for queued data only: idle sockets hold no buffers".into(),
            allows: u64::MAX,
            fix: None,
        },
        Check {
            name: "net.ipv4.tcp_ehash_entries",
            current: format!(
                "{} buckets ({:.1} sockets per bucket at this size)",
                l.ehash_buckets,
                sockets as f64 / l.ehash_buckets.max(1) as f64
            ),
            needed: format!("~{} (one per socket): every packet received walks its bucket", ehash_buckets_wanted(connections)),
            // A longer chain costs CPU per packet, not connections.
            allows: u64::MAX,
            fix: (l.ehash_buckets < sockets / 2).then(|| {
                format!(
                    "run in a network namespace with its own table: `hongbao bench --netns`, or \
                     sysctl -w net.ipv4.tcp_child_ehash_entries={} before creating one \
                     (the first namespace's size is set at boot: thash_entries=)",
                    ehash_buckets_wanted(connections)
                )
            }),
        },
    ];
    // Short connections: every connection the client closes first leaves its port in
    // TIME_WAIT for 60 s (fixed in the kernel; tcp_fin_timeout does not shorten it).
    v.push(Check {
        name: "net.ipv4.tcp_tw_reuse",
        current: match l.tw_reuse {
            0 => "0 (off)".into(),
            1 => "1 (on)".into(),
            n => format!("{n} (on for loopback only)"),
        },
        needed: "on for short connections: a new outgoing connection may take a port in TIME_WAIT"
            .into(),
        allows: u64::MAX,
        fix: (l.tw_reuse == 0).then(|| "sysctl -w net.ipv4.tcp_tw_reuse=1".into()),
    });
    v.push(Check {
        name: "TIME_WAIT sockets",
        current: format!("{} now, at most {} (net.ipv4.tcp_max_tw_buckets)", l.time_wait, l.max_tw_buckets),
        needed: format!(
            "new connections/s × 60 s; without reuse ~{} new connections/s per source address to one server port",
            l.port_range_size() / 60
        ),
        allows: u64::MAX,
        fix: None,
    });
    // Connection tracking only binds if it tracks our loopback connections.
    let tracking = l.loopback_tracked;
    if let Some(max) = l.conntrack_max.filter(|_| !tracking) {
        v.push(Check {
            name: "net.netfilter.nf_conntrack_max",
            current: format!("{max} (loopback connections are not tracked here)"),
            needed: "nothing while loopback connections are not tracked".into(),
            allows: u64::MAX,
            fix: None,
        });
    }
    if let Some(max) = l.conntrack_max.filter(|_| tracking) {
        v.push(Check {
            name: "net.netfilter.nf_conntrack_max",
            current: max.to_string(),
            needed: format!("> {sockets} if loopback traffic is tracked"),
            allows: max / 2,
            fix: (max < sockets).then(|| {
                format!(
                    "sysctl -w net.netfilter.nf_conntrack_max={}",
                    sockets + 100_000
                )
            }),
        });
    }
    v
}

/// The report `hongbao doctor` prints.
pub fn report(l: &Limits, connections: u64) -> String {
    let checks = checks(l, connections);
    let mut out = String::new();
    let _ = writeln!(out, "hongbao doctor: {} cores, {} MiB available; planning for {connections} connections (server and load on this machine)", l.cores, l.mem_available >> 20);
    for c in &checks {
        let mark = if c.allows < connections {
            "BINDS"
        } else if c.fix.is_some() {
            "change"
        } else {
            "ok"
        };
        let _ = writeln!(
            out,
            "  [{mark:>6}] {:<36} now: {}; needs: {}",
            c.name, c.current, c.needed
        );
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "           fix: {fix}");
        }
    }
    let _ = writeln!(
        out,
        "Short connections (a connection per request, as with HTTP without keep-alive): the side that \
closes first keeps the port in TIME_WAIT for 60 s. The seed's net.ipv4.tcp_tw_recycle no longer \
exists (removed in Linux 4.12: it broke clients behind NAT). Instead: keep connections alive (and \
`keepalive` on nginx's upstreams), let the connecting side reuse TIME_WAIT ports \
(net.ipv4.tcp_tw_reuse = 1, or 2 for loopback), widen net.ipv4.ip_local_port_range, and connect \
from more source addresses (the load spreads over 127.0.x.y)."
    );
    let binding = checks.iter().min_by_key(|c| c.allows).expect("checks");
    let capacity = binding.allows;
    if capacity >= connections {
        let _ = writeln!(
            out,
            "This machine can hold about {} connections co-located; the first limit to bind is {}.",
            capacity, binding.name
        );
    } else {
        let _ = writeln!(
            out,
            "This machine can hold only about {capacity} connections co-located: {} binds first.",
            binding.name
        );
    }
    out
}

/// The ports hongbao listens on by default (serve's TCP, admin and WebSocket; monitor).
const LISTENING_PORTS: [(u16, u16); 2] = [(7000, 7003), (7200, 7200)];

/// `current` (the kernel's `ip_local_reserved_ports` list, e.g. "8900,9000-9010") with
/// our listening ports added where it does not cover them already; what others reserved
/// stays reserved. Equal to `current` when nothing is missing.
fn reserved_ports_wanted(current: &str) -> String {
    let ranges: Vec<(u16, u16)> = current
        .split(',')
        .filter_map(|part| {
            let part = part.trim();
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            Some((lo.parse().ok()?, hi.parse().ok()?))
        })
        .collect();
    let covered = |port: u16| ranges.iter().any(|&(lo, hi)| lo <= port && port <= hi);
    let missing: Vec<String> = LISTENING_PORTS
        .into_iter()
        .filter(|&(lo, hi)| !(lo..=hi).all(covered))
        .map(|(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect();
    if missing.is_empty() {
        return current.to_string();
    }
    let kept = Some(current.trim())
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    kept.into_iter()
        .chain(missing)
        .collect::<Vec<_>>()
        .join(",")
}

/// Writes the sysctls `checks` suggests (needs root). Returns one line per change.
pub fn apply(l: &Limits, connections: u64) -> Vec<String> {
    let sockets = 2 * connections;
    let mut wanted: Vec<(&str, String)> = vec![
        (
            "/proc/sys/net/ipv4/ip_local_port_range",
            "1024 65535".into(),
        ),
        (
            "/proc/sys/net/ipv4/ip_local_reserved_ports",
            reserved_ports_wanted(&l.reserved_ports),
        ),
        ("/proc/sys/net/core/somaxconn", "65535".into()),
        ("/proc/sys/net/ipv4/tcp_max_syn_backlog", "65535".into()),
        ("/proc/sys/net/ipv4/tcp_syncookies", "1".into()),
    ];
    if l.tw_reuse == 0 {
        wanted.push(("/proc/sys/net/ipv4/tcp_tw_reuse", "1".into()));
    }
    if l.file_max < sockets + 100_000 {
        wanted.push((
            "/proc/sys/fs/file-max",
            (sockets + 200_000).max(4_000_000).to_string(),
        ));
    }
    if l.conntrack_max.is_some_and(|m| m < sockets) && l.loopback_tracked {
        wanted.push((
            "/proc/sys/net/netfilter/nf_conntrack_max",
            (sockets + 100_000).to_string(),
        ));
    }
    let mut lines = Vec::new();
    for (path, value) in wanted {
        let before = read(path).unwrap_or_default();
        if before.split_whitespace().collect::<Vec<_>>()
            == value.split_whitespace().collect::<Vec<_>>()
        {
            continue;
        }
        match std::fs::write(path, &value) {
            Ok(()) => lines.push(format!("set {path}: {before} -> {value}")),
            Err(e) => lines.push(format!(
                "could not set {path} to {value}: {e} (run as root)"
            )),
        }
    }
    if l.nofile_hard < 20_000 {
        lines.push(format!(
            "the hard open-file limit is {}: raise it in limits.conf or the service unit; doctor cannot",
            l.nofile_hard
        ));
    } else {
        lines.push(format!(
            "the open-file hard limit ({}) stays: serve and load split into processes under it",
            l.nofile_hard
        ));
    }
    lines
}

/// Established-hash buckets that `connections` want: one per socket (both ends), a power
/// of two, within what the kernel accepts for a new namespace.
pub fn ehash_buckets_wanted(connections: u64) -> u64 {
    (2 * connections)
        .next_power_of_two()
        .clamp(1 << 16, MAX_CHILD_EHASH_BUCKETS)
}

/// Moves this process into a new network namespace with an established-socket hash sized
/// for `connections` and its loopback up, then applies doctor's per-namespace sysctls
/// there. The size of the first namespace's hash is fixed at boot (262,144 buckets on
/// these machines: eight sockets per bucket at a million connections, and `perf` shows
/// 10% of the machine in `__inet_lookup_established`); a namespace created after
/// `net.ipv4.tcp_child_ehash_entries` is set gets a table of that size. The host's
/// setting is put back at once: only this namespace is affected.
///
/// Only the calling thread moves (and the processes it starts after): call it before any
/// other thread exists. Needs root. Returns what it did, a line each.
pub fn enter_network_namespace(connections: u64) -> crate::error::Result<Vec<String>> {
    use crate::error::Error;
    use std::os::unix::fs::FileExt;
    let path = "/proc/sys/net/ipv4/tcp_child_ehash_entries";
    let host_buckets = ehash_buckets();
    // The file stays bound to the namespace it was opened in, so the host's value can be
    // put back after the move.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("opening {path} (needs root and a kernel ≥ 6.1)"), e))?;
    let mut before = [0u8; 32];
    let n = file
        .read_at(&mut before, 0)
        .map_err(|e| Error::io(format!("reading {path}"), e))?;
    let buckets = ehash_buckets_wanted(connections);
    file.write_at(buckets.to_string().as_bytes(), 0)
        .map_err(|e| Error::io(format!("writing {path}"), e))?;
    // SAFETY: unshare takes flags only; it moves the calling thread.
    let moved = unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0;
    let error = std::io::Error::last_os_error();
    file.write_at(&before[..n], 0)
        .map_err(|e| Error::io(format!("restoring {path}"), e))?;
    if !moved {
        return Err(Error::io("unshare(CLONE_NEWNET)", error));
    }
    crate::net::bring_loopback_up()
        .map_err(|e| Error::io("bringing lo up in the new namespace", e))?;
    let mut lines = vec![format!(
        "a network namespace of its own: established hash {} buckets (the host's: {host_buckets})",
        ehash_buckets()
    )];
    lines.extend(apply(&Limits::read(), connections));
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Limits {
        Limits {
            nofile_soft: 1024,
            nofile_hard: 20_000,
            file_max: 2_466_170,
            files_open: 400,
            nr_open: 1_048_576,
            port_range: (32768, 60999),
            reserved_ports: String::new(),
            somaxconn: 4096,
            syn_backlog: 2048,
            syncookies: 1,
            tcp_mem_max_pages: Some(575_796),
            ehash_buckets: 262_144,
            conntrack_max: Some(262_144),
            conntrack_count: 12,
            loopback_tracked: true,
            mem_available: 23 << 30,
            cores: 2,
            time_wait: 3,
            tw_reuse: 2,
            max_tw_buckets: 262_144,
        }
    }

    #[test]
    fn a_million_on_this_machine_is_bound_by_conntrack_then_fits_once_fixed() {
        let mut l = machine();
        let text = report(&l, 1_000_000);
        assert!(text.contains("nf_conntrack_max binds first"), "{text}");
        l.conntrack_max = Some(2_200_000);
        l.port_range = (1024, 65535);
        let text = report(&l, 1_000_000);
        assert!(text.contains("can hold about"), "{text}");
        // An empty table with many sockets open means loopback is not tracked at all.
        l.conntrack_max = Some(262_144);
        l.loopback_tracked = false;
        assert!(report(&l, 1_000_000).contains("can hold about"));
    }

    #[test]
    fn a_small_established_hash_is_a_change_not_a_limit() {
        let mut l = machine();
        let ehash = |l: &Limits| {
            checks(l, 1_000_000)
                .into_iter()
                .find(|c| c.name == "net.ipv4.tcp_ehash_entries")
                .unwrap()
        };
        let c = ehash(&l);
        assert_eq!(c.allows, u64::MAX);
        assert!(
            c.current.contains("7.6 sockets per bucket"),
            "{}",
            c.current
        );
        assert!(c.fix.unwrap().contains("--netns"));
        l.ehash_buckets = ehash_buckets_wanted(1_000_000);
        assert_eq!(l.ehash_buckets, 2_097_152);
        assert!(ehash(&l).fix.is_none());
        // Within what the kernel takes for a new namespace, and never tiny.
        assert_eq!(ehash_buckets_wanted(100), 65_536);
        assert_eq!(ehash_buckets_wanted(100_000_000), 16 << 20);
    }

    #[test]
    fn short_connections_are_explained() {
        let mut l = machine();
        let text = report(&l, 1000);
        assert!(text.contains("tcp_tw_recycle no longer"), "{text}");
        assert!(text.contains("TIME_WAIT sockets"), "{text}");
        assert!(
            text.contains("~470 new connections/s per source address"),
            "{text}"
        );
        l.tw_reuse = 0;
        let reuse = checks(&l, 1000)
            .into_iter()
            .find(|c| c.name == "net.ipv4.tcp_tw_reuse")
            .unwrap();
        assert_eq!(
            reuse.fix.as_deref(),
            Some("sysctl -w net.ipv4.tcp_tw_reuse=1")
        );
        assert!(Limits::read().max_tw_buckets > 0);
    }

    #[test]
    fn memory_binds_on_a_small_machine() {
        let mut l = machine();
        l.conntrack_max = None;
        l.mem_available = 2 << 30;
        assert!(report(&l, 1_000_000).contains("memory available binds first"));
    }

    #[test]
    fn reserved_ports_keep_what_others_reserved() {
        assert_eq!(reserved_ports_wanted(""), "7000-7003,7200");
        assert_eq!(reserved_ports_wanted("8900"), "8900,7000-7003,7200");
        assert_eq!(reserved_ports_wanted("7000-7003,7200"), "7000-7003,7200");
        // An older reservation without the HTTP port gets it added.
        assert_eq!(
            reserved_ports_wanted("7000-7002,7200"),
            "7000-7002,7200,7000-7003"
        );
        assert_eq!(
            reserved_ports_wanted("7000-7010,7200,8900"),
            "7000-7010,7200,8900"
        );
        assert_eq!(reserved_ports_wanted("7000,7200"), "7000,7200,7000-7003");
    }

    #[test]
    fn users_per_source_address_follow_the_port_range() {
        let mut l = machine();
        assert_eq!(l.users_per_source_address(), 11_292);
        l.port_range = (1024, 65535);
        assert_eq!(l.users_per_source_address(), 25_804);
    }
}
