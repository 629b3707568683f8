//! The lab's Redis Cluster: Debian's `redis-server`, one node per host, three masters and
//! three replicas made into a cluster by `redis-cli --cluster create`, with a fresh
//! `nodes.conf` every run. No persistence: the cluster is the hot store, the ledger is
//! PostgreSQL (docs/scale-out.md says what a lost write can and cannot cost).
//! `cluster-node-timeout` is two seconds so that a replica takes over a killed master
//! within a few seconds.
//!
//! Deployed as it must be: the default user is off, one ACL user (`USER`) with a password
//! the lab makes, replicas authenticate to their masters as that user, and the password
//! is in each node's `redis.conf` (mode 0600) and given to `redis-cli` in its
//! environment — never on a command line. Every connection is TLS: clients (the gateways
//! with `rediss://`, `redis-cli --tls`), the cluster bus and replication, with a
//! certificate of the lab's own CA; no plain port is open.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::proc::Proc;
use hongbao_sys::netns::Host;

pub const PORT: u16 = 6379;
/// The lab's Redis ACL user: the gateways and `redis-cli` log in as it.
pub const USER: &str = "hongbao";
/// How long a master may be unreachable before its replica is promoted.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// How the lab logs in to its Redis: the ACL user's password, and the TLS files (the
/// nodes' certificate and key, the CA clients trust).
#[derive(Debug, Clone)]
pub struct Auth {
    pub password: String,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// `redis-cli` as the lab's user, over TLS.
fn redis_cli(auth: &Auth) -> Command {
    let mut command = Command::new("redis-cli");
    command
        .env("REDISCLI_AUTH", &auth.password)
        .args(["--user", USER, "--no-auth-warning", "--tls", "--cacert"])
        .arg(&auth.ca);
    command
}

/// `redis-server` for `host`, its files in `dir`.
pub fn start_node(host: &Host, dir: &Path, auth: &Auth) -> Result<Proc> {
    // A fresh node: no nodes.conf of an earlier cluster, no dump.rdb (a replica writes
    // the RDB it syncs from, and would load its keys at the next start).
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    run_node(host, dir, auth)
}

/// The node of `host` started again after it was killed: its `nodes.conf` kept, so it
/// rejoins the cluster (as a replica of the master that took its slots), its dump.rdb
/// dropped (the master's data is synced afresh).
pub fn start_node_again(host: &Host, dir: &Path, auth: &Auth) -> Result<Proc> {
    let _ = std::fs::remove_file(dir.join("dump.rdb"));
    run_node(host, dir, auth)
}

fn run_node(host: &Host, dir: &Path, auth: &Auth) -> Result<Proc> {
    let password = &auth.password;
    // The users, in a file only root reads: the default user off, ours on, and what a
    // replica logs in to its master as.
    let conf = dir.join("redis.conf");
    hongbao_server::access::write_secret_file(
        &conf,
        &format!(
            "user default off\nuser {USER} on >{password} ~* &* +@all\nmasteruser {USER}\nmasterauth {password}\n\
             tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients no\ntls-cluster yes\ntls-replication yes\n",
            auth.cert.display(),
            auth.key.display(),
            auth.ca.display()
        ),
    )
    .map_err(|e| Error::io(format!("writing {}", conf.display()), e))?;
    let mut command = host.command("redis-server");
    command.current_dir(dir).arg(&conf).args([
        "--bind",
        &host.addr.to_string(),
        // TLS only: no plain port.
        "--port",
        "0",
        "--tls-port",
        &PORT.to_string(),
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &NODE_TIMEOUT_MS.to_string(),
        // A replica may be promoted however long it was cut off from its master: in the
        // lab a master is killed on purpose.
        "--cluster-replica-validity-factor",
        "0",
        "--save",
        "",
        "--appendonly",
        "no",
        "--maxclients",
        "10000",
        // A replica started again syncs at once: Redis waits 5 s by default to gather
        // replicas for a diskless sync, and a master failing in those seconds left its
        // slots to a replica with nothing in them.
        "--repl-diskless-sync-delay",
        "0",
    ]);
    Proc::spawn(
        &format!("redis {}", host.name),
        command,
        &dir.join("redis.log"),
    )
}

/// `redis-cli -h ADDR -p PORT ARGS…` as the lab's user, from the machine's own
/// namespace: its output.
pub fn cli(auth: &Auth, addr: Ipv4Addr, args: &[&str]) -> Result<String> {
    let out = redis_cli(auth)
        .args(["-h", &addr.to_string(), "-p", &PORT.to_string()])
        .args(args)
        .output()
        .map_err(|e| Error::io("running redis-cli", e))?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "redis-cli {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn wait_until(
    what: &str,
    timeout: Duration,
    mut ok: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !ok() {
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!(
                "timed out after {timeout:?} waiting for {what}"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Makes the nodes at `addrs` (first half masters, second half their replicas) one
/// cluster and waits until every node says it is whole.
pub fn create_cluster(auth: &Auth, addrs: &[Ipv4Addr]) -> Result<()> {
    for &addr in addrs {
        wait_until(&format!("redis at {addr}"), Duration::from_secs(10), || {
            cli(auth, addr, &["PING"]).is_ok_and(|s| s.trim() == "PONG")
        })?;
    }
    let nodes: Vec<String> = addrs.iter().map(|a| format!("{a}:{PORT}")).collect();
    let out = redis_cli(auth)
        .args(["--cluster", "create"])
        .args(&nodes)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .map_err(|e| Error::io("running redis-cli --cluster create", e))?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    for &addr in addrs {
        wait_until(
            &format!("the cluster as {addr} sees it"),
            Duration::from_secs(30),
            || cli(auth, addr, &["CLUSTER", "INFO"]).is_ok_and(|s| s.contains("cluster_state:ok")),
        )?;
    }
    Ok(())
}

/// One line of `CLUSTER NODES`, as much of it as the lab needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub addr: Ipv4Addr,
    pub master: bool,
    /// Whether the node is failed or unreachable as the asked node sees it.
    pub failed: bool,
    /// Slot ranges a master serves.
    pub slots: Vec<String>,
}

/// Whether a master's slot ranges (`CLUSTER NODES`' "0-5460", "12189", or
/// "[5461->-…]" for a slot being moved, which it does not serve yet) hold `slot`.
pub fn serves(ranges: &[String], slot: u16) -> bool {
    ranges.iter().any(|r| {
        let mut ends = r.splitn(2, '-');
        let first = ends.next().and_then(|a| a.parse::<u16>().ok());
        let last = ends.next().map_or(first, |b| b.parse::<u16>().ok());
        matches!((first, last), (Some(a), Some(b)) if a <= slot && slot <= b)
    })
}

/// `CLUSTER NODES` as `addr` sees it.
pub fn nodes(auth: &Auth, addr: Ipv4Addr) -> Result<Vec<Node>> {
    let text = cli(auth, addr, &["CLUSTER", "NODES"])?;
    Ok(parse_nodes(&text))
}

fn parse_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            // "198.18.3.11:6379@16379"
            let addr = fields[1].split(':').next()?.parse().ok()?;
            let flags = fields[2];
            Some(Node {
                addr,
                master: flags.contains("master"),
                failed: flags.contains("fail"),
                slots: fields[8..].iter().map(|s| s.to_string()).collect(),
            })
        })
        .collect()
}

/// Waits until a node other than `gone` sees every slot served by a master that is not
/// failed (after a failover).
pub fn wait_whole(
    auth: &Auth,
    addrs: &[Ipv4Addr],
    gone: Option<Ipv4Addr>,
    timeout: Duration,
) -> Result<()> {
    let witness = addrs
        .iter()
        .copied()
        .find(|a| Some(*a) != gone)
        .expect("more than one node");
    wait_until("the cluster to be whole again", timeout, || {
        cli(auth, witness, &["CLUSTER", "INFO"]).is_ok_and(|s| s.contains("cluster_state:ok"))
            && nodes(auth, witness).is_ok_and(|ns| {
                ns.iter()
                    .filter(|n| n.master && !n.failed && Some(n.addr) != gone)
                    .count()
                    >= 3
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ranges_are_read() {
        let ranges: Vec<String> = ["0-5460", "7000", "[5461->-abc]"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(serves(&ranges, 0) && serves(&ranges, 5460) && serves(&ranges, 7000));
        assert!(!serves(&ranges, 5461) && !serves(&ranges, 6999) && !serves(&ranges, 7001));
    }

    #[test]
    fn cluster_nodes_lines_are_read() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 198.18.3.11:6379@16379 myself,master - 0 1426238317239 4 connected 0-5460
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 198.18.3.14:6379@16379 slave 07c37dfeb235213a872192d90877d0cd55635b91 0 1426238316232 4 connected
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 198.18.3.12:6379@16379 master,fail - 1426238316232 1426238315228 2 connected 5461-10922
";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert!(nodes[0].master && !nodes[0].failed);
        assert_eq!(nodes[0].slots, ["0-5460"]);
        assert!(!nodes[1].master && nodes[1].slots.is_empty());
        assert!(nodes[2].failed);
        assert_eq!(nodes[2].addr, Ipv4Addr::new(198, 18, 3, 12));
    }
}
