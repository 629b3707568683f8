//! The lab's PostgreSQL: Debian's PostgreSQL 15 binaries, a throwaway cluster made by
//! `initdb` in the lab's directory and run as the `postgres` user (initdb refuses root),
//! listening on its host's address. Deployed as it must be: over the network only
//! `scram-sha-256` with a password, the gateways logging in as their own role (`USER`,
//! owner of the `hongbao` database) with a password the lab makes; only the local
//! `postgres` system user (peer authentication, over the socket) is trusted, to make
//! that role.
//! Durability as in production: fsync and synchronous commit on — the ledger's promise
//! depends on them. Over the network TLS only (`hostssl`): the gateways connect with
//! `sslmode=verify-full`, trusting the lab's CA.

use std::net::Ipv4Addr;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::proc::Proc;
use hongbao_sys::netns::Host;

pub const PORT: u16 = 5432;
/// The gateways' role, and their database.
pub const USER: &str = "hongbao";
pub const DATABASE: &str = "hongbao";

/// Where Debian keeps PostgreSQL 15's server binaries.
pub fn bin_dir() -> Result<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| {
            Error::io(
                "PostgreSQL is not installed (/usr/lib/postgresql; apt-get install postgresql)",
                e,
            )
        })?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").exists())
        .collect();
    versions.sort();
    versions.pop().ok_or_else(|| {
        Error::Refused("no PostgreSQL server binaries under /usr/lib/postgresql".into())
    })
}

/// The `postgres` user's (uid, gid).
pub(crate) fn postgres_ids() -> Result<(u32, u32)> {
    let passwd =
        std::fs::read_to_string("/etc/passwd").map_err(|e| Error::io("reading /etc/passwd", e))?;
    passwd
        .lines()
        .find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.first() == Some(&"postgres"))
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
        })
        .ok_or_else(|| {
            Error::Refused("no postgres user (it comes with Debian's postgresql package)".into())
        })
}

/// The connection URL of the lab's database, as the gateways' role (its password apart).
pub fn url(addr: Ipv4Addr) -> String {
    format!("postgres://{USER}@{addr}:{PORT}/{DATABASE}")
}

/// The URL of a ledger served by whichever of `addrs` is primary, as the gateways' role:
/// libpq's multi-host form, which tokio-postgres reads too. A client tries the hosts in
/// turn, each for at most `connect_timeout` seconds, and keeps the first that takes
/// writes (`target_session_attrs=read-write`): after a failover, the new primary.
pub fn multi_host_url(addrs: &[Ipv4Addr]) -> String {
    let hosts: Vec<String> = addrs.iter().map(|a| format!("{a}:{PORT}")).collect();
    format!(
        "postgres://{USER}@{}/{DATABASE}?target_session_attrs=read-write&connect_timeout=2",
        hosts.join(",")
    )
}

/// `initdb` in `dir/data` (owned by the postgres user), passwords over the network. The
/// postgres user must be able to reach `dir`: the lab keeps it under the system's
/// temporary directory rather than in a lab directory that may sit in root's home.
pub fn init(dir: &Path, subnet: Ipv4Addr, tls: &Path) -> Result<()> {
    let (uid, gid) = postgres_ids()?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    owned(dir, 0o755, (uid, gid))?;
    let data = dir.join("data");
    let out = Command::new(bin_dir()?.join("initdb"))
        .uid(uid)
        .gid(gid)
        .arg("-D")
        .arg(&data)
        .args(["--auth-local=peer", "--auth-host=scram-sha-256"])
        .args(["-U", "postgres", "--no-sync", "-E", "UTF8"])
        .output()
        .map_err(|e| Error::io("running initdb", e))?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let hba = format!(
        "local all postgres peer\nhostssl all all {subnet}/24 scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\n"
    );
    let path = data.join("pg_hba.conf");
    std::fs::write(&path, hba).map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    // The server's certificate and key, the postgres user's alone (it refuses a key
    // others may read).
    for (from, to) in [("cert.pem", "server.crt"), ("key.pem", "server.key")] {
        let path = data.join(to);
        std::fs::copy(tls.join(from), &path)
            .map_err(|e| Error::io(format!("copying {}", tls.join(from).display()), e))?;
        owned(&path, 0o600, (uid, gid))?;
    }
    Ok(())
}

/// `path` given `mode` and to the postgres user (`ids`).
pub(crate) fn owned(path: &Path, mode: u32, (uid, gid): (u32, u32)) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("chmod {mode:o} {}", path.display()), e))?;
    chown(path, Some(uid), Some(gid))
        .map_err(|e| Error::io(format!("chown postgres {}", path.display()), e))
}

/// Makes the gateways' role with `password` and its database, as the local `postgres`
/// user over the socket in `dir`.
pub fn make_role(dir: &Path, password: &str) -> Result<()> {
    let quoted = password.replace('\'', "''");
    let sql = format!(
        "CREATE ROLE {USER} LOGIN PASSWORD '{quoted}';\nCREATE DATABASE {DATABASE} OWNER {USER};\n"
    );
    local_sql(dir, "postgres", &sql).map_err(|e| e.within("making the gateways' role"))?;
    Ok(())
}

/// Runs `sql` on `database` as the local `postgres` user over the socket in `dir` (peer
/// authentication): its output, unaligned. The SQL goes on stdin: a password in it would
/// be seen by every local user on a command line.
pub(crate) fn local_sql(dir: &Path, database: &str, sql: &str) -> Result<String> {
    use std::io::Write;
    let (uid, gid) = postgres_ids()?;
    let mut child = Command::new(bin_dir()?.join("psql"))
        .uid(uid)
        .gid(gid)
        .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(dir)
        .args(["-p", &PORT.to_string(), "-U", "postgres", "-d", database])
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("running psql", e))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(sql.as_bytes())
        .map_err(|e| Error::io("writing psql's SQL", e))?;
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("waiting for psql", e))?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "psql: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts the server of `dir/data` in `host` and waits until it accepts connections.
/// `small_disk`: `dir` is a small tmpfs, so the WAL is kept to a few segments.
pub fn start(host: &Host, dir: &Path, small_disk: bool) -> Result<Proc> {
    let ids = postgres_ids()?;
    let mut command = host.command_as(bin_dir()?.join("postgres"), Some(ids));
    command
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-c", &format!("listen_addresses={}", host.addr)])
        .args(["-c", &format!("port={PORT}")])
        .args(["-c", &format!("unix_socket_directories={}", dir.display())])
        .args(["-c", "max_connections=300", "-c", "shared_buffers=128MB"])
        .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
        .args(["-c", "ssl=on", "-c", "ssl_cert_file=server.crt"])
        .args(["-c", "ssl_key_file=server.key"]);
    if small_disk {
        command.args(["-c", "max_wal_size=64MB", "-c", "min_wal_size=32MB"]);
    }
    let mut proc = Proc::spawn("postgres", command, &dir.join("postgres.log"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = Command::new(bin_dir()?.join("pg_isready"))
            .args(["-h", &host.addr.to_string(), "-p", &PORT.to_string(), "-q"])
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            return Ok(proc);
        }
        if !proc.running() || Instant::now() > deadline {
            return Err(Error::Failed(format!(
                "PostgreSQL did not start:\n{}",
                proc.log_tail()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ledger on the node at `addr` alone, as the gateways' role, over TLS verified
/// against the lab's CA.
pub(crate) fn node_url(addr: Ipv4Addr) -> String {
    format!("{}?sslmode=verify-full", url(addr))
}

/// The lab's ledger as its users reach it: the gateways' URL and `psql`.
impl crate::Lab {
    /// The ledger's URL as the gateways' role, over TLS verified against the lab's CA
    /// (the password is in `postgres.password`). With a standby, both data nodes' (libpq's
    /// multi-host form): a client keeps the one that takes writes.
    pub fn postgres_url(&self) -> String {
        match &self.formation {
            Some(formation) => {
                format!("{}&sslmode=verify-full", multi_host_url(&formation.addrs()))
            }
            None => node_url(self.postgres.0.addr),
        }
    }

    pub fn pg_target(&self) -> hongbao_cluster::PgTarget {
        hongbao_cluster::PgTarget {
            url: self.postgres_url(),
            password: Some(self.secrets.postgres.clone()),
            ca: std::fs::read(self.tls_dir().join("ca.pem")).ok(),
        }
    }

    /// `psql` on the ledger as the gateways' role, running `sql`: its output, unaligned.
    pub fn psql(&self, sql: &str) -> Result<String> {
        self.psql_url(&self.postgres_url(), sql)
    }

    /// `psql` on the ledger's node at `addr` alone, whatever its role: reads there see
    /// what that node holds. Unlike the multi-host URL, a node being demoted (its
    /// server closing connections as it stops) is never tried on the way.
    pub fn psql_on(&self, addr: Ipv4Addr, sql: &str) -> Result<String> {
        self.psql_url(&node_url(addr), sql)
    }

    pub(crate) fn psql_url(&self, url: &str, sql: &str) -> Result<String> {
        let out = Command::new(bin_dir()?.join("psql"))
            .env("PGPASSWORD", &self.secrets.postgres)
            .env("PGSSLROOTCERT", self.tls_dir().join("ca.pem"))
            .args(["-X", "-At", "-d", url, "-c", sql])
            .output()
            .map_err(|e| Error::io("running psql", e))?;
        if !out.status.success() {
            return Err(Error::Failed(format!(
                "psql: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_host_url_names_every_node_and_asks_for_the_writable_one() {
        let url = multi_host_url(&[Ipv4Addr::new(198, 18, 3, 20), Ipv4Addr::new(198, 18, 3, 21)]);
        assert_eq!(
            url,
            "postgres://hongbao@198.18.3.20:5432,198.18.3.21:5432/hongbao?target_session_attrs=read-write&connect_timeout=2"
        );
    }
}
