//! The lab's ledger with a synchronous standby (the plan's `standby`; docs/scale-out.md,
//! "A standby and failover (the lab)"), kept by pg_auto_failover: a monitor on a host of
//! its own (`pgmon`) and two data nodes (`pg`, `pg2`), each made by `pg_autoctl create`
//! and kept by `pg_autoctl run` — the keeper, which runs PostgreSQL as its child, reports
//! to the monitor every second and does what the monitor assigns. The monitor checks the
//! nodes' health and promotes the standby a few seconds after the primary stops answering
//! (`MONITOR_SETTINGS`); the primary acknowledges a commit only once the standby has its
//! WAL (pg_auto_failover's default replication quorum with one standby).
//!
//! Secured as the single PostgreSQL is (`postgres`): over the network TLS only, every
//! client verifying the lab's CA and the host's address (`verify-full`, the keepers'
//! connections to the monitor and to the primary included); passwords (scram-sha-256)
//! for pg_auto_failover's users — `autoctl_node` on the monitor, the nodes'
//! `pgautofailover_replicator` — and for the gateways' role, each rule for the lab's own
//! addresses only. We write pg_hba.conf ourselves (`--skip-pg-hba`): the rules pg_autoctl
//! would add are `trust`. The keepers read their passwords from a password file of the
//! postgres user's (`pgpass`), never from a command line.
//!
//! Files, under the lab's PostgreSQL directory (`Lab::postgres_dir`): the TLS files and
//! the password file, owned by the postgres user; and for each host `NAME/` (mode 0700):
//! `data`, its socket, and pg_autoctl's `config`, `share` and `run` (its XDG
//! directories, one set per node: the hosts share one filesystem).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::postgres::{self, bin_dir, local_sql, owned, postgres_ids, PORT};
use crate::proc::Proc;
use hongbao_sys::netns::Host;

/// The last byte of the monitor's address, and of the second data node's (the first is
/// the single PostgreSQL's, .20).
pub const MONITOR_LAST: u8 = 22;
pub const STANDBY_LAST: u8 = 21;

const MONITOR_DB: &str = "pg_auto_failover";
const MONITOR_USER: &str = "autoctl_node";
const REPLICATOR: &str = "pgautofailover_replicator";
const PASSFILE: &str = "pgpass";
const TLS: &str = "tls";
/// What marks the settings we add to a postgresql.conf (copied to a standby with the
/// rest of the data directory).
const MARK: &str = "# hongbao lab";

/// The monitor's failure detection, from pg_auto_failover's defaults (a 5 s period, 5 s
/// connect timeout, 2 retries 2 s apart, 20 s without a report, 30 s to wait for a
/// primary to demote: close to a minute) down to seconds:
/// - a health check every second, a connection not answered within one second failed
///   (a frozen host completes the TCP handshake and then says nothing);
/// - one retry half a second later: two checks must fail, so one lost packet does not
///   fail over;
/// - and no report from the node's keeper for two seconds (keepers report every second);
/// - then the monitor waits 3 s for the old primary to confirm it has stopped before it
///   promotes the standby: longer than the keepers' `PARTITION_TIMEOUT_SECS`, after which
///   a primary that can reach neither the monitor nor its standby stops itself. Its
///   standby cannot acknowledge anything meanwhile, so it could not have committed.
/// - after the monitor starts, 2 s of grace (not 10) before it fails anything over.
const MONITOR_SETTINGS: &str = "\
pgautofailover.health_check_period = 1000
pgautofailover.health_check_timeout = 1000
pgautofailover.health_check_max_retries = 1
pgautofailover.health_check_retry_delay = 500
pgautofailover.node_considered_unhealthy_timeout = 2000
pgautofailover.primary_demote_timeout = 3000
pgautofailover.startup_grace_period = 2000
";

/// The keepers' `timeout.network_partition_timeout` (20 s by default): a primary that has
/// reached neither the monitor nor a standby for this long stops its PostgreSQL.
const PARTITION_TIMEOUT_SECS: u32 = 2;

/// Every server's settings beside pg_autoctl's (which size shared buffers for a machine
/// of its own): the single PostgreSQL's durability and size; scram for new passwords
/// (pg_autoctl's default is md5); checkpoints written at full speed: a standby is cloned
/// by `pg_basebackup`, which waits for a checkpoint, and a spread one takes minutes; and
/// a replication connection whose peer has gone silent dropped after 3 s (30 s as
/// pg_autoctl sets it): a primary cut off from everything counts its standby as
/// connected until then, and stops itself only once it has neither the monitor nor a
/// standby (`PARTITION_TIMEOUT_SECS`).
const SERVER_SETTINGS: &str = "\
shared_buffers = '128MB'
max_connections = 300
password_encryption = 'scram-sha-256'
fsync = on
synchronous_commit = on
checkpoint_completion_target = 0
wal_sender_timeout = '3s'
wal_receiver_timeout = '3s'
";

/// How long a `pg_autoctl create` may take (a standby's includes its base backup).
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);

/// One host of the formation: the monitor or a data node, and its keeper.
pub struct Node {
    pub host: Host,
    /// Its data, pg_autoctl's files and its socket (`DIR/NAME`).
    pub dir: PathBuf,
    /// `pg_autoctl run`; `None` before it starts and once the host is lost.
    pub keeper: Option<Proc>,
}

/// A data node as the monitor sees it: its states in pg_auto_failover's state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub addr: Ipv4Addr,
    /// What its keeper last reported.
    pub reported: String,
    /// What the monitor assigned it.
    pub goal: String,
}

impl NodeState {
    /// Whether the monitor means it to take writes now.
    pub fn is_primary(&self) -> bool {
        [
            "single",
            "wait_primary",
            "primary",
            "join_primary",
            "apply_settings",
        ]
        .contains(&self.goal.as_str())
    }

    /// Whether it has reached `state` and the monitor asks nothing else of it.
    pub fn settled(&self, state: &str) -> bool {
        self.reported == state && self.goal == state
    }
}

/// The monitor and the two data nodes; the passwords of pg_auto_failover's users.
pub struct Formation {
    pub monitor: Node,
    pub nodes: Vec<Node>,
    /// The lab's PostgreSQL directory (`Lab::postgres_dir`).
    root: PathBuf,
    /// The lab's logs (`pg-keeper.log`, `pg-create.log`, ...).
    logs: PathBuf,
    monitor_password: String,
    replicator_password: String,
}

impl Formation {
    /// Prepares `root` (the TLS files of `tls`, the password file) for a formation on
    /// `monitor` and `nodes`; nothing runs yet.
    pub(crate) fn new(
        root: &Path,
        tls: &Path,
        logs: &Path,
        monitor: Host,
        nodes: [Host; 2],
    ) -> Result<Formation> {
        let ids = postgres_ids()?;
        let own = |path: &Path, mode: u32| owned(path, mode, ids);
        std::fs::create_dir_all(root.join(TLS))
            .map_err(|e| Error::io(format!("creating {}", root.join(TLS).display()), e))?;
        own(root, 0o755)?;
        own(&root.join(TLS), 0o755)?;
        // The postgres user must read them, and it refuses a key others may read.
        for (file, mode) in [("ca.pem", 0o644), ("cert.pem", 0o644), ("key.pem", 0o600)] {
            let to = root.join(TLS).join(file);
            std::fs::copy(tls.join(file), &to)
                .map_err(|e| Error::io(format!("copying {}", tls.join(file).display()), e))?;
            own(&to, mode)?;
        }
        let formation = Formation {
            root: root.to_path_buf(),
            logs: logs.to_path_buf(),
            monitor_password: hongbao_http::access::new_key(),
            replicator_password: hongbao_http::access::new_key(),
            monitor: Node {
                dir: root.join(&monitor.name),
                host: monitor,
                keeper: None,
            },
            nodes: nodes
                .into_iter()
                .map(|host| Node {
                    dir: root.join(&host.name),
                    host,
                    keeper: None,
                })
                .collect(),
        };
        // host:port:database:user:password, the keys in hex (nothing to escape).
        let passfile = root.join(PASSFILE);
        std::fs::write(
            &passfile,
            format!(
                "{}:{PORT}:{MONITOR_DB}:{MONITOR_USER}:{}\n*:{PORT}:*:{REPLICATOR}:{}\n",
                formation.monitor.host.addr,
                formation.monitor_password,
                formation.replicator_password
            ),
        )
        .map_err(|e| Error::io(format!("writing {}", passfile.display()), e))?;
        own(&passfile, 0o600)?;
        Ok(formation)
    }

    /// The data nodes' addresses, the first made first.
    pub fn addrs(&self) -> Vec<Ipv4Addr> {
        self.nodes.iter().map(|n| n.host.addr).collect()
    }

    pub(crate) fn node_mut(&mut self, addr: Ipv4Addr) -> Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|n| n.host.addr == addr)
            .ok_or_else(|| Error::Refused(format!("no data node at {addr}")))
    }

    /// The keepers running, for the state file.
    pub(crate) fn keepers(&self) -> impl Iterator<Item = &Proc> {
        self.nodes
            .iter()
            .chain(std::iter::once(&self.monitor))
            .filter_map(|n| n.keeper.as_ref())
    }

    /// `pg_autoctl` as the postgres user inside `node`'s host, with its files in the
    /// node's directory and its passwords in the password file.
    fn pg_autoctl(&self, node: &Node) -> Result<Command> {
        let bin = bin_dir()?;
        let dir = &node.dir;
        let mut command = node
            .host
            .command_as("/usr/bin/pg_autoctl", Some(postgres_ids()?));
        command
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("LANG", "C.UTF-8")
            .env("LC_ALL", "C.UTF-8")
            .env("HOME", dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_DATA_HOME", dir.join("share"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env("PGPASSFILE", self.root.join(PASSFILE))
            // The socket in the node's own directory (pg_autoctl passes this on to
            // postgres as `-k`): every host's server is on port 5432 of one filesystem.
            .env("PG_REGRESS_SOCK_DIR", dir)
            .env("PGHOST", dir)
            .current_dir(dir);
        Ok(command)
    }

    /// The options of `pg_autoctl create` every host shares: TLS with the lab's files,
    /// pg_hba.conf ours.
    fn create_args(&self, node: &Node) -> Result<Vec<String>> {
        let tls = self.root.join(TLS);
        let path = |p: PathBuf| p.display().to_string();
        Ok(vec![
            "--pgctl".into(),
            path(bin_dir()?.join("pg_ctl")),
            "--pgdata".into(),
            path(node.dir.join("data")),
            "--pgport".into(),
            PORT.to_string(),
            "--hostname".into(),
            node.host.addr.to_string(),
            "--skip-pg-hba".into(),
            "--ssl-ca-file".into(),
            path(tls.join("ca.pem")),
            "--server-cert".into(),
            path(tls.join("cert.pem")),
            "--server-key".into(),
            path(tls.join("key.pem")),
            "--ssl-mode".into(),
            "verify-full".into(),
        ])
    }

    /// The monitor's URL as the nodes' keepers use it (the password in the password file).
    /// Bounded: a keeper cut off from the monitor must not hang on a connection it holds
    /// (packets vanishing, no reset) — it would then never notice that it is cut off from
    /// its standby too, and go on as primary. Unacknowledged data fails the connection
    /// after 2 s (`tcp_user_timeout`), an idle one is probed after 2 s.
    fn monitor_url(&self) -> String {
        format!(
            "postgres://{MONITOR_USER}@{}:{PORT}/{MONITOR_DB}?sslmode=verify-full&sslrootcert={}\
             &connect_timeout=2&tcp_user_timeout=2000&keepalives_idle=2&keepalives_interval=1&keepalives_count=2",
            self.monitor.host.addr,
            self.root.join(TLS).join("ca.pem").display()
        )
    }

    /// Makes the monitor, starts its keeper and gives `autoctl_node` its password.
    pub(crate) fn start_monitor(&mut self) -> Result<()> {
        let node = &self.monitor;
        fresh_dir(&node.dir)?;
        let mut create = self.pg_autoctl(node)?;
        create
            .args(["create", "monitor"])
            .args(self.create_args(node)?);
        self.run_to_end("create", node, create)?;
        let data = node.dir.join("data");
        write_owned(&data.join("pg_hba.conf"), &monitor_hba(&self.addrs()))?;
        append_owned(
            &data.join("pg_ident.conf"),
            &format!("keeper postgres {MONITOR_USER}\n"),
        )?;
        append_owned(
            &data.join("postgresql.conf"),
            &format!("{MARK}\n{SERVER_SETTINGS}{MONITOR_SETTINGS}"),
        )?;
        let keeper = self.start_keeper(&self.monitor)?;
        self.monitor.keeper = Some(keeper);
        wait_until("the monitor to accept connections", CREATE_TIMEOUT, || {
            local_sql(&self.monitor.dir, MONITOR_DB, "SELECT 1").is_ok()
        })?;
        local_sql(
            &self.monitor.dir,
            MONITOR_DB,
            &format!(
                "ALTER ROLE {MONITOR_USER} PASSWORD '{}';",
                self.monitor_password
            ),
        )
        .map_err(|e| e.within("setting autoctl_node's password"))?;
        Ok(())
    }

    /// Makes data node `i` and starts its keeper: the first node made becomes the
    /// primary (`single` until it has a standby), a later one is cloned from the primary
    /// as its standby. Returns once its keeper runs.
    pub(crate) fn start_node(&mut self, i: usize) -> Result<()> {
        let node = &self.nodes[i];
        fresh_dir(&node.dir)?;
        let mut create = self.pg_autoctl(node)?;
        create
            .args(["create", "postgres", "--name", &node.host.name])
            .args(["--monitor", &self.monitor_url()])
            .args(self.create_args(node)?);
        self.run_to_end("create", node, create)?;
        let data = node.dir.join("data");
        write_owned(
            &data.join("pg_hba.conf"),
            &node_hba(&self.addrs(), self.monitor.host.addr),
        )?;
        let conf = data.join("postgresql.conf");
        // A standby's copy has them already.
        let settings = std::fs::read_to_string(&conf)
            .map_err(|e| Error::io(format!("reading {}", conf.display()), e))?;
        if !settings.contains(MARK) {
            append_owned(&conf, &format!("{MARK}\n{SERVER_SETTINGS}"))?;
        }
        let mut set = self.pg_autoctl(node)?;
        set.args(["config", "set", "--pgdata"])
            .arg(&data)
            .arg("timeout.network_partition_timeout")
            .arg(PARTITION_TIMEOUT_SECS.to_string());
        self.run_to_end("config", node, set)?;
        let keeper = self.start_keeper(&self.nodes[i])?;
        self.nodes[i].keeper = Some(keeper);
        Ok(())
    }

    /// The first node, once it is `single`: the replication user's password (it made the
    /// user without one) and the gateways' role, which its standby will copy.
    pub(crate) fn prepare_primary(&self, gateway_password: &str) -> Result<()> {
        let first = &self.nodes[0];
        // The monitor knows it `single` from its creation; its keeper starts its server.
        wait_until("the first node to be primary", CREATE_TIMEOUT, || {
            self.states().is_ok_and(|s| {
                s.iter()
                    .any(|n| n.addr == first.host.addr && n.settled("single"))
            }) && local_sql(&first.dir, "postgres", "SELECT 1").is_ok()
        })?;
        local_sql(
            &first.dir,
            "postgres",
            &format!(
                "ALTER ROLE {REPLICATOR} PASSWORD '{}';",
                self.replicator_password
            ),
        )
        .map_err(|e| e.within("setting the replication user's password"))?;
        postgres::make_role(&first.dir, gateway_password)
    }

    /// `pg_autoctl run` for `node`, logging to `NAME-keeper.log` in the lab's directory.
    fn start_keeper(&self, node: &Node) -> Result<Proc> {
        let mut run = self.pg_autoctl(node)?;
        run.arg("run").arg("--pgdata").arg(node.dir.join("data"));
        let log = self.logs.join(format!("{}-keeper.log", node.host.name));
        Proc::spawn(&format!("pg_autoctl {}", node.host.name), run, &log)
    }

    /// Runs a `pg_autoctl` step to its end (at most `CREATE_TIMEOUT`), its output in
    /// `NAME-WHAT.log` in the lab's directory.
    fn run_to_end(&self, what: &str, node: &Node, mut command: Command) -> Result<()> {
        let log = self.logs.join(format!("{}-{what}.log", node.host.name));
        let opening = || format!("opening {}", log.display());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Error::io(opening(), e))?;
        let stdout = file.try_clone().map_err(|e| Error::io(opening(), e))?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(file)
            .spawn()
            .map_err(|e| Error::io("running pg_autoctl (apt-get install pg-auto-failover-cli postgresql-15-auto-failover)", e))?;
        let deadline = Instant::now() + CREATE_TIMEOUT;
        let status = loop {
            let exited = child
                .try_wait()
                .map_err(|e| Error::io(format!("waiting for pg_autoctl {what}"), e))?;
            if let Some(status) = exited {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout(format!(
                    "pg_autoctl {what} on {} did not finish in {CREATE_TIMEOUT:?} (see {})",
                    node.host.name,
                    log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            return Err(Error::Failed(format!(
                "pg_autoctl {what} on {} failed ({status}):\n{}",
                node.host.name,
                lines[lines.len().saturating_sub(15)..].join("\n")
            )));
        }
        Ok(())
    }

    /// The data nodes' states, from the monitor.
    pub fn states(&self) -> Result<Vec<NodeState>> {
        let text = local_sql(
            &self.monitor.dir,
            MONITOR_DB,
            "SELECT nodehost, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid",
        )?;
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|line| {
                let f: Vec<&str> = line.split('|').collect();
                if f.len() != 3 {
                    return Err(Error::Answer(format!("the monitor's node row {line:?}")));
                }
                Ok(NodeState {
                    addr: f[0]
                        .parse()
                        .map_err(|e| Error::Answer(format!("node host {:?}: {e}", f[0])))?,
                    reported: f[1].to_string(),
                    goal: f[2].to_string(),
                })
            })
            .collect()
    }

    /// The data node the monitor names primary now.
    pub fn primary(&self) -> Result<Ipv4Addr> {
        let states = self.states()?;
        states
            .iter()
            .find(|n| n.is_primary())
            .map(|n| n.addr)
            .ok_or_else(|| Error::Refused(format!("the monitor names no primary now: {states:?}")))
    }

    /// Whether the pair is whole: `standby` a synchronous standby, the other node its
    /// primary, both settled.
    pub fn synchronous(&self, standby: Ipv4Addr) -> bool {
        self.states().is_ok_and(|states| {
            states.len() == 2
                && states.iter().all(|n| {
                    n.settled(if n.addr == standby {
                        "secondary"
                    } else {
                        "primary"
                    })
                })
        })
    }

    /// Forgets the data node at `addr` on the monitor (lost with its disk: it will not
    /// report again, hence `--force`).
    pub(crate) fn drop_node(&self, addr: Ipv4Addr) -> Result<()> {
        if !self.states()?.iter().any(|n| n.addr == addr) {
            return Ok(());
        }
        let mut drop = self.pg_autoctl(&self.monitor)?;
        drop.args(["drop", "node", "--force", "--pgdata"])
            .arg(self.monitor.dir.join("data"))
            .args([
                "--hostname",
                &addr.to_string(),
                "--pgport",
                &PORT.to_string(),
            ]);
        self.run_to_end("drop", &self.monitor, drop)
    }
}

impl Formation {
    /// The monitor, the first data node (the primary, with the gateways' role), then the
    /// second cloned from it as its synchronous standby. A formation that fails half up
    /// is dropped by its caller: each keeper stops with its `Proc`, and whatever runs in
    /// the hosts goes with the lab's namespaces.
    pub(crate) fn bring_up(&mut self, gateway_password: &str) -> Result<()> {
        self.start_monitor()?;
        self.start_node(0)?;
        self.prepare_primary(gateway_password)?;
        self.start_node(1)?;
        let standby = self.nodes[1].host.addr;
        wait_until(
            "the second node to be a synchronous standby",
            Duration::from_secs(120),
            || self.synchronous(standby),
        )
        .map_err(|e| e.within(format!("the monitor says {:?}", self.states())))
    }
}

impl crate::Lab {
    /// The ledger with a standby (shard 0's formation), made by `Formation::bring_up`.
    pub(crate) fn bring_up_formation(&mut self) -> Result<()> {
        let monitor = self.host("pgmon", MONITOR_LAST, &[])?;
        let second = self.host("pg2", STANDBY_LAST, &[])?;
        let mut formation = Formation::new(
            &self.postgres_dir,
            &self.tls_dir(),
            &self.plan.dir,
            monitor,
            [self.postgres.0.clone(), second],
        )?;
        formation.bring_up(&self.secrets.postgres)?;
        self.formation = Some(formation);
        self.save()
    }
}

/// The monitor's pg_hba.conf: the data nodes' keepers as `autoctl_node`, each from its
/// own address, over TLS with a password; over the socket the postgres user, and the
/// monitor's own keeper as `autoctl_node` (peer, mapped in pg_ident.conf).
fn monitor_hba(nodes: &[Ipv4Addr]) -> String {
    let mut hba = String::from(
        "local all postgres peer\n\
         local pg_auto_failover autoctl_node peer map=keeper\n",
    );
    for addr in nodes {
        hba.push_str(&format!(
            "hostssl {MONITOR_DB} {MONITOR_USER} {addr}/32 scram-sha-256\n"
        ));
    }
    hba
}

/// A data node's pg_hba.conf: replication and pg_rewind from the two nodes' addresses,
/// the gateways' role from the lab's subnet, every one over TLS with a password; the
/// monitor's health checks refused (the monitor counts a refusal as an answer, which is
/// all it asks; pg_autoctl would let its user in with `trust`).
fn node_hba(nodes: &[Ipv4Addr], monitor: Ipv4Addr) -> String {
    let mut hba = String::from("local all postgres peer\n");
    for addr in nodes {
        hba.push_str(&format!(
            "hostssl replication {REPLICATOR} {addr}/32 scram-sha-256\n\
             hostssl postgres {REPLICATOR} {addr}/32 scram-sha-256\n"
        ));
    }
    let subnet = Ipv4Addr::from(u32::from(monitor) & 0xffff_ff00);
    hba.push_str(&format!(
        "hostssl all pgautofailover_monitor {monitor}/32 reject\n\
         hostssl all {} {subnet}/24 scram-sha-256\n",
        postgres::USER
    ));
    hba
}

/// An empty directory for a host's files, the postgres user's alone.
fn fresh_dir(dir: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    owned(dir, 0o700, postgres_ids()?)
}

/// Writes a server's configuration file (the postgres user's, as pg_autoctl left it).
fn write_owned(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn append_owned(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| Error::io(format!("appending to {}", path.display()), e))
}

/// Polls `done` every 100 ms until it holds or `timeout` has passed.
pub(crate) fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Error::Timeout(format!("waited {timeout:?} for {what}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rule_trusts_and_pg_auto_failovers_users_come_only_from_the_nodes() {
        let nodes = [Ipv4Addr::new(198, 18, 7, 20), Ipv4Addr::new(198, 18, 7, 21)];
        let monitor = Ipv4Addr::new(198, 18, 7, 22);
        for hba in [monitor_hba(&nodes), node_hba(&nodes, monitor)] {
            for rule in hba.lines() {
                let f: Vec<&str> = rule.split_whitespace().collect();
                assert!(!rule.contains("trust"), "{rule}");
                match f[0] {
                    "local" => assert!(f[3] == "peer", "{rule}"),
                    "hostssl" => {
                        let method = f[4];
                        assert!(method == "scram-sha-256" || method == "reject", "{rule}");
                        if f[2] == MONITOR_USER || f[2] == REPLICATOR {
                            let from = f[3].strip_suffix("/32").expect("a /32");
                            assert!(nodes.contains(&from.parse().unwrap()), "{rule}");
                        }
                    }
                    _ => panic!("not TLS: {rule}"),
                }
            }
        }
        assert!(
            node_hba(&nodes, monitor).contains("hostssl all hongbao 198.18.7.0/24 scram-sha-256\n")
        );
    }

    #[test]
    fn the_primary_is_the_node_the_monitor_means_to_take_writes() {
        let node = |goal: &str| NodeState {
            addr: Ipv4Addr::LOCALHOST,
            reported: "primary".into(),
            goal: goal.into(),
        };
        for goal in ["single", "wait_primary", "primary"] {
            assert!(node(goal).is_primary(), "{goal}");
        }
        // Being failed over: what it reports no longer counts.
        for goal in [
            "draining",
            "demote_timeout",
            "demoted",
            "secondary",
            "catchingup",
        ] {
            assert!(!node(goal).is_primary(), "{goal}");
        }
        assert!(node("primary").settled("primary"));
        assert!(!node("demoted").settled("primary"));
    }
}
