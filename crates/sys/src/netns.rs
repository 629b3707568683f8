//! Test hosts as network namespaces on one bridge. Lab `n` is the subnet 198.18.n.0/24
//! (from the benchmarking range 198.18.0.0/15): the bridge `hbn` holds 198.18.n.1 in the
//! machine's own namespace (so the operator and the tests reach every host), and each host
//! is a namespace `hbn-NAME` with one veth on the bridge, its address, and loopback.
//! No host has a default route, so nothing in the lab can reach beyond the bridge.
//!
//! Links and addresses are made with iproute2 (`ip -batch`); processes are started in a
//! host by entering its namespace (setns) between fork and exec, so a process's id is the
//! program's own and it can be stopped by it.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// One test host: a network namespace with one address on the lab's bridge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// What the lab calls it: `redis1`, `pg`, `gw2`, `load1`, `nginx`.
    pub name: String,
    /// The namespace (`hb17-gw2`).
    pub netns: String,
    pub addr: Ipv4Addr,
}

/// The bridge of lab `n`.
/// Host `name`'s network namespace in lab `n`.
pub fn netns_name(lab: u8, name: &str) -> String {
    format!("hb{lab}-{name}")
}

pub fn bridge_name(lab: u8) -> String {
    format!("hb{lab}")
}

/// The machine's own address on lab `n`'s bridge.
pub fn bridge_addr(lab: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, lab, 1)
}

/// Runs `ip -batch -` with `commands`, one per line (inside namespace `netns` if given:
/// a batch line cannot name one itself).
fn ip_batch_in(netns: Option<&str>, commands: &[String]) -> Result<()> {
    use std::io::Write;
    let mut ip = Command::new("ip");
    if let Some(ns) = netns {
        ip.args(["-n", ns]);
    }
    let mut child = ip
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("running ip (iproute2)", e))?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(commands.join("\n").as_bytes())
        .map_err(|e| Error::io("writing to ip -batch", e))?;
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("waiting for ip -batch", e))?;
    if !out.status.success() {
        return Err(Error::Refused(format!(
            "ip -batch failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn ip_batch(commands: &[String]) -> Result<()> {
    ip_batch_in(None, commands)
}

/// Creates lab `n`'s bridge. Fails if it exists: another lab holds this subnet.
pub fn create_bridge(lab: u8) -> Result<()> {
    let br = bridge_name(lab);
    if Path::new(&format!("/sys/class/net/{br}")).exists() {
        return Err(Error::Refused(format!(
            "the bridge {br} exists already: lab {lab} is in use (hongbao lab down, or another --lab)"
        )));
    }
    ip_batch(&[
        format!("link add {br} type bridge"),
        format!("addr add {}/24 dev {br}", bridge_addr(lab)),
        format!("link set {br} up"),
    ])
    .map_err(|e| e.within(format!("creating the bridge {br}")))
}

/// Creates host `name` with address `198.18.n.last` on lab `n`'s bridge, and applies
/// `sysctls` (`name=value`, net.* only: they are per namespace) inside it.
pub fn create_host(lab: u8, name: &str, last: u8, sysctls: &[&str]) -> Result<Host> {
    let host = Host {
        name: name.to_string(),
        netns: netns_name(lab, name),
        addr: Ipv4Addr::new(198, 18, lab, last),
    };
    let (ns, outer, inner) = (
        &host.netns,
        format!("v{lab}-{name}"),
        format!("e{lab}-{name}"),
    );
    ip_batch(&[
        format!("netns add {ns}"),
        format!("link add {outer} type veth peer name {inner} netns {ns}"),
        format!("link set {outer} master {} up", bridge_name(lab)),
    ])
    .and_then(|()| {
        ip_batch_in(
            Some(ns),
            &[
                format!("addr add {}/24 dev {inner}", host.addr),
                format!("link set {inner} up"),
                "link set lo up".to_string(),
            ],
        )
    })
    .map_err(|e| e.within(format!("creating the host {ns}")))?;
    for sysctl in sysctls {
        let (key, value) = sysctl.split_once('=').expect("name=value");
        let status = host
            .command("sysctl")
            .args(["-qw", &format!("{key}={value}")])
            .status()
            .map_err(|e| Error::io(format!("running sysctl in {ns}"), e))?;
        if !status.success() {
            return Err(Error::Refused(format!("sysctl {sysctl} in {ns} failed")));
        }
    }
    Ok(host)
}

/// Removes lab `n`'s hosts (`netns` names) and bridge; what is already gone is skipped.
/// Stops every process still running inside the namespaces `netns` — those the lab did
/// not record too, such as a PostgreSQL started again by hand: SIGTERM to all, SIGKILL
/// to those left after `grace`. (A namespace removed under a process would leave it
/// running, unreachable, holding its files.)
pub fn stop_inside(netns: &[String], grace: std::time::Duration) {
    let mut left: Vec<(u32, u64)> = Vec::new();
    for ns in netns {
        if !Path::new(&format!("/run/netns/{ns}")).exists() {
            continue;
        }
        let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
            continue;
        };
        for pid in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            if let Some(ticks) = crate::usage::start_ticks(pid) {
                left.push((pid, ticks));
            }
        }
    }
    let ours = |&(pid, ticks): &(u32, u64)| crate::usage::start_ticks(pid) == Some(ticks);
    let signal = |left: &[(u32, u64)], sig: i32| {
        for &(pid, _) in left {
            // SAFETY: kill(2) on ids read a moment ago inside the lab's namespaces.
            unsafe { libc::kill(pid as i32, sig) };
        }
    };
    signal(&left, libc::SIGTERM);
    let deadline = std::time::Instant::now() + grace;
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        left.retain(ours);
    }
    left.retain(ours);
    signal(&left, libc::SIGKILL);
}

pub fn remove(lab: u8, netns: &[String]) {
    for ns in netns {
        if Path::new(&format!("/run/netns/{ns}")).exists() {
            let _ = ip_batch(&[format!("netns del {ns}")]);
        }
    }
    let br = bridge_name(lab);
    if Path::new(&format!("/sys/class/net/{br}")).exists() {
        let _ = ip_batch(&[format!("link del {br}")]);
    }
}

impl Host {
    /// `program` to be run inside this host's namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.command_as(program, None)
    }

    /// `program` inside this host's namespace, as user `ids` (uid, gid) when given (the
    /// namespace is entered first: that needs root).
    pub fn command_as(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
        ids: Option<(u32, u32)>,
    ) -> Command {
        let mut command = Command::new(program);
        let path = format!("/run/netns/{}", self.netns);
        let ns = File::open(&path);
        // SAFETY: between fork and exec the closure calls only setns, setgroups, setgid and
        // setuid, which are async-signal-safe; the namespace file was opened before the
        // fork and is moved in (closed in the parent when the Command is dropped).
        unsafe {
            command.pre_exec(move || {
                let ns = ns
                    .as_ref()
                    .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?;
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some((uid, gid)) = ids {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        command
    }
}
