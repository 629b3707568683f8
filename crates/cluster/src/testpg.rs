//! A throwaway PostgreSQL for the crate's tests that need a real one (`committer`,
//! `connect`, `standby`), and a streaming standby of it.

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A throwaway PostgreSQL on loopback, run as the `postgres` user (root only: initdb
/// refuses root, and only root can become `postgres`); stopped and removed when dropped.
pub(crate) struct TestPg {
    child: Child,
    dir: PathBuf,
    pub(crate) port: u16,
}

impl Drop for TestPg {
    fn drop(&mut self) {
        // SIGINT: PostgreSQL's fast shutdown.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn postgres_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&"postgres")).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

fn bin_dir() -> Option<PathBuf> {
    let mut bins: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").exists())
        .collect();
    bins.sort();
    bins.pop()
}

/// A loopback port free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TestPg {
    /// `None`, with why printed, where it cannot run (not root, no PostgreSQL).
    pub(crate) fn start() -> Option<TestPg> {
        let is_root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        });
        let (Some((uid, gid)), Some(bin), true) = (postgres_ids(), bin_dir(), is_root) else {
            eprintln!("skipped: needs root and Debian's postgresql (a postgres user, /usr/lib/postgresql)");
            return None;
        };
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "hongbao-committer-pg-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let data = dir.join("data");
        let out = Command::new(bin.join("initdb"))
            .uid(uid)
            .gid(gid)
            .arg("-D")
            .arg(&data)
            .args(["--auth=trust", "-U", "postgres", "--no-sync"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(TestPg::run(dir, port))
    }

    /// A PostgreSQL on `port` with its data in `dir/data`, once it takes connections.
    fn run(dir: PathBuf, port: u16) -> TestPg {
        let ((uid, gid), bin) = (postgres_ids().unwrap(), bin_dir().unwrap());
        let child = Command::new(bin.join("postgres"))
            .uid(uid)
            .gid(gid)
            .arg("-D")
            .arg(dir.join("data"))
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("port={port}"),
            ])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .stdout(std::fs::File::create(dir.join("log")).unwrap())
            .stderr(std::fs::File::create(dir.join("log.err")).unwrap())
            .spawn()
            .unwrap();
        let pg = TestPg { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not start: {}",
                pg.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        pg
    }

    /// A standby of this one, cloned by `pg_basebackup` and streaming from it
    /// (`primary_conninfo` written by `-R`), on a port of its own.
    pub(crate) fn standby(&self) -> TestPg {
        let ((uid, gid), bin) = (postgres_ids().unwrap(), bin_dir().unwrap());
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("hongbao-standby-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let out = Command::new(bin.join("pg_basebackup"))
            .uid(uid)
            .gid(gid)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-R", "--checkpoint=fast", "--no-sync"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_basebackup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TestPg::run(dir, port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log.err")).unwrap_or_default()
    }
}
