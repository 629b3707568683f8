//! Faults done to the ledger's primary when it has a synchronous standby (the plan's
//! `standby`; its pieces in `standby`): its host lost with its disk, frozen, or cut off
//! from every other host; then waiting for the monitor to promote the standby and for
//! the new primary to take a commit, and bringing the old node back as the new standby.
//! Methods of `Lab`, beside the other faults (`faults`).
//!
//! The single-PostgreSQL faults in standby mode: `restart_postgres` and
//! `fill_postgres_disk` refuse (lose or freeze the primary instead); a gateway's
//! partition from PostgreSQL (`Cut::Postgres`) cuts it off from both data nodes;
//! `psql` and `engine_counters` go to the primary through the multi-host URL (the
//! counters are the primary's own: they start again from the new primary's after a
//! failover).

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::standby::{wait_until, Formation};
use crate::{netns, postgres, Error, Host, Lab, Result};

/// How long `wait_new_primary` gives one commit through the multi-host URL: past the
/// connect timeouts of both hosts (2 s each).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(6);

fn no_standby() -> Error {
    Error::Refused("the lab's ledger has no standby (the lab plan's `standby`)".into())
}

fn no_data_node(addr: Ipv4Addr) -> Error {
    Error::Refused(format!("no data node at {addr}"))
}

impl Lab {
    /// Whether the lab's ledger is a primary with a synchronous standby (the plan's `standby`).
    pub fn has_standby(&self) -> bool {
        self.formation.is_some()
    }

    /// Shard `k`'s formation (shard 0's is the lab's ledger's).
    pub(crate) fn formation_of(&self, k: usize) -> Result<&Formation> {
        match k {
            0 => self.formation.as_ref(),
            k => self.shards.get(k - 1).and_then(|s| s.formation.as_ref()),
        }
        .ok_or_else(no_standby)
    }

    fn formation_of_mut(&mut self, k: usize) -> Result<&mut Formation> {
        match k {
            0 => self.formation.as_mut(),
            k => self
                .shards
                .get_mut(k - 1)
                .and_then(|s| s.formation.as_mut()),
        }
        .ok_or_else(no_standby)
    }

    /// Shard `k`'s data nodes' addresses (none without a standby).
    pub fn formation_addrs(&self, k: usize) -> Vec<Ipv4Addr> {
        self.formation_of(k).map(|f| f.addrs()).unwrap_or_default()
    }

    /// The address of the data node the monitor names primary now.
    pub fn pg_primary(&self) -> Result<Ipv4Addr> {
        self.pg_primary_of(0)
    }

    /// The address of the data node shard `k`'s monitor names primary now.
    pub fn pg_primary_of(&self, k: usize) -> Result<Ipv4Addr> {
        self.formation_of(k)?.primary()
    }

    /// The primary's host lost with its disk: every process on it SIGKILLed (keeper and
    /// postgres), its data directory removed. Returns its address.
    pub fn lose_primary(&mut self) -> Result<Ipv4Addr> {
        self.lose_primary_of(0)
    }

    /// Shard `k`'s primary lost with its disk, as `lose_primary`.
    pub fn lose_primary_of(&mut self, k: usize) -> Result<Ipv4Addr> {
        let addr = self.pg_primary_of(k)?;
        let node = self.formation_of_mut(k)?.node_mut(addr)?;
        signal(&pids_inside(&node.host), libc::SIGKILL);
        if let Some(mut keeper) = node.keeper.take() {
            // Killed above with the rest; this reaps it.
            keeper.kill();
        }
        // Again until none is left: a process forked a moment ago (the keeper starts
        // pg_ctl, psql...) is caught on a later round.
        for _ in 0..50 {
            let pids = pids_inside(&node.host);
            if pids.is_empty() {
                break;
            }
            signal(&pids, libc::SIGKILL);
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::remove_dir_all(&node.dir)
            .map_err(|e| Error::io(format!("removing {}", node.dir.display()), e))?;
        self.save()?;
        Ok(addr)
    }

    /// Every process of the primary's host stopped (SIGSTOP) for `frozen`, then let go on
    /// (SIGCONT). Returns its address.
    pub fn freeze_primary(&mut self, frozen: Duration) -> Result<Ipv4Addr> {
        self.freeze_primary_of(0, frozen)
    }

    /// Shard `k`'s primary frozen, as `freeze_primary`.
    pub fn freeze_primary_of(&self, k: usize, frozen: Duration) -> Result<Ipv4Addr> {
        let addr = self.pg_primary_of(k)?;
        freeze_host(&self.data_host(k, addr)?, frozen);
        Ok(addr)
    }

    /// The primary's host cut off from every other lab host (the standby, the monitor,
    /// the gateways, and this machine) for `cut`: blackhole routes inside its namespace,
    /// as `partition` does for a gateway. Returns its address.
    pub fn isolate_primary(&mut self, cut: Duration) -> Result<Ipv4Addr> {
        self.isolate_primary_of(0, cut)
    }

    /// Shard `k`'s primary cut off, as `isolate_primary`.
    pub fn isolate_primary_of(&self, k: usize, cut: Duration) -> Result<Ipv4Addr> {
        let addr = self.pg_primary_of(k)?;
        self.isolate_host(&self.data_host(k, addr)?, cut)?;
        Ok(addr)
    }

    /// `host` cut off from every other lab host and this machine for `cut`.
    pub(crate) fn isolate_host(&self, host: &Host, cut: Duration) -> Result<()> {
        let others: Vec<Ipv4Addr> = std::iter::once(netns::bridge_addr(self.plan.lab))
            .chain(self.hosts().into_iter().map(|h| h.addr))
            .filter(|&a| a != host.addr)
            .collect();
        crate::faults::blackhole(host, &others, cut)
    }

    /// Waits until a node other than `old` is primary and takes a write (a commit through
    /// the multi-host URL); returns its address.
    pub fn wait_new_primary(&self, old: Ipv4Addr, timeout: Duration) -> Result<Ipv4Addr> {
        self.wait_new_primary_of(0, old, timeout)
    }

    /// As `wait_new_primary`, in shard `k`'s formation.
    pub fn wait_new_primary_of(
        &self,
        k: usize,
        old: Ipv4Addr,
        timeout: Duration,
    ) -> Result<Ipv4Addr> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("nothing tried yet");
        while Instant::now() < deadline {
            match self.formation_of(k)?.primary() {
                Ok(primary) if primary != old => match self.commit_through_url(k) {
                    // The write must have landed on the node the monitor names: a
                    // client may still reach the old primary, which has not stopped yet.
                    Ok(at) if at == primary => return Ok(primary),
                    Ok(at) => last = format!("a commit landed on {at}, not on {primary}"),
                    Err(e) => last = format!("{e:#}"),
                },
                Ok(primary) => last = format!("the monitor still names {primary} primary"),
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(Error::Timeout(format!(
            "no new primary in {timeout:?}: {last}"
        )))
    }

    /// Brings the node at `addr` back as a synchronous standby and waits until it is one:
    /// a node lost with its disk is dropped from the monitor and made again, cloned from
    /// the primary; a node frozen or cut off rejoins by itself (its keeper rewinds it
    /// with pg_rewind and follows the new primary). After it returns, the pair can lose
    /// its primary again.
    pub fn rejoin_standby(&mut self, addr: Ipv4Addr, timeout: Duration) -> Result<()> {
        self.rejoin_standby_of(0, addr, timeout)
    }

    /// As `rejoin_standby`, in shard `k`'s formation.
    pub fn rejoin_standby_of(&mut self, k: usize, addr: Ipv4Addr, timeout: Duration) -> Result<()> {
        let formation = self.formation_of_mut(k)?;
        let i = formation
            .nodes
            .iter()
            .position(|n| n.host.addr == addr)
            .ok_or_else(|| no_data_node(addr))?;
        if formation.nodes[i].keeper.is_none() {
            formation.drop_node(addr)?;
            formation.start_node(i)?;
            self.save()?;
        }
        let formation = self.formation_of(k)?;
        wait_until(
            &format!("{addr} to be a synchronous standby"),
            timeout,
            || formation.synchronous(addr),
        )
        .map_err(|e| e.within(format!("the monitor says {:?}", formation.states())))
    }

    /// The host of shard `k`'s data node at `addr`.
    fn data_host(&self, k: usize, addr: Ipv4Addr) -> Result<Host> {
        self.formation_of(k)?
            .nodes
            .iter()
            .find(|n| n.host.addr == addr)
            .map(|n| n.host.clone())
            .ok_or_else(|| no_data_node(addr))
    }

    /// One commit through shard `k`'s URL (`psql`, bounded by `COMMIT_TIMEOUT`): the
    /// address of the server that took it.
    fn commit_through_url(&self, k: usize) -> Result<Ipv4Addr> {
        // txid_current() gives the transaction an id, so its end is a commit written to
        // the WAL (and, with a standby, acknowledged by it).
        let mut child = Command::new(postgres::bin_dir()?.join("psql"))
            .env("PGPASSWORD", &self.secrets.postgres)
            .env("PGSSLROOTCERT", self.tls_dir().join("ca.pem"))
            .args(["-X", "-At", "-d", &self.shard_url(k)])
            .args(["-c", "SELECT txid_current(), host(inet_server_addr())"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io("running psql", e))?;
        let waiting = |e| Error::io("waiting for psql", e);
        let deadline = Instant::now() + COMMIT_TIMEOUT;
        while child.try_wait().map_err(waiting)?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout(format!(
                    "a commit through the ledger's URL took over {COMMIT_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().map_err(waiting)?;
        if !out.status.success() {
            return Err(Error::Failed(format!(
                "psql: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .rsplit('|')
            .next()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::Answer(format!("psql: unexpected answer {text:?}")))
    }
}

/// Every process of `host` stopped (SIGSTOP) for `frozen`, then let go on (SIGCONT).
pub(crate) fn freeze_host(host: &Host, frozen: Duration) {
    let mut stopped: Vec<u32> = Vec::new();
    // Twice: a process forked while the first round was under way.
    for _ in 0..2 {
        let new: Vec<u32> = pids_inside(host)
            .into_iter()
            .filter(|p| !stopped.contains(p))
            .collect();
        signal(&new, libc::SIGSTOP);
        stopped.extend(new);
    }
    std::thread::sleep(frozen);
    signal(&stopped, libc::SIGCONT);
}

/// The ids of every process inside `host`'s namespace.
fn pids_inside(host: &Host) -> Vec<u32> {
    Command::new("ip")
        .args(["netns", "pids", &host.netns])
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn signal(pids: &[u32], signal: i32) {
    for &pid in pids {
        // SAFETY: kill(2) on ids read a moment ago inside one of the lab's namespaces,
        // where only the lab's processes run.
        unsafe {
            libc::kill(pid as i32, signal);
        }
    }
}
