//! The lab: many hosts on one machine, for the cluster mode (docs/scale-out.md). Lab `n`
//! is a bridge with network namespaces on 198.18.n.0/24 (`netns`): six Redis hosts
//! making a Redis Cluster of three masters and three replicas (`redis`), a PostgreSQL
//! host (`postgres`) — or a primary with a synchronous standby and pg_auto_failover's
//! monitor (`standby`) —, gateway hosts running `hongbao serve` in cluster mode, load hosts
//! for `hongbao load`, and an nginx host in front of the gateways. Everything it starts,
//! it stops: when the `Lab` is dropped, and, from the state file it keeps
//! (`DIR/lab.json`), by `hongbao lab down` after its owner was killed.
//!
//! Addresses in lab `n`: the machine 198.18.n.1, nginx .10, Redis .11–.16, PostgreSQL
//! .20 (with a standby: the data nodes .20 and .21, the monitor .22), the ledger's other
//! shards .24 onward, gateways .31
//! onward, load hosts .51 onward.
//!
//! Modules (the `Lab` itself, its plan and state file, are here in lib.rs):
//! - `netns`: test hosts as network namespaces on one bridge, and starting programs in them;
//! - `redis`: the lab's Redis Cluster, three masters and three replicas, no persistence;
//! - `postgres`: the lab's PostgreSQL, a throwaway cluster with fsync and synchronous commit,
//!   and the ledger's URL and `psql` as the gateways' role;
//! - `standby`: instead, two PostgreSQL nodes, primary and synchronous standby, kept by
//!   pg_auto_failover's keepers and monitor;
//! - `proc`: a process the lab started: stopped with SIGTERM then SIGKILL, or killed as a
//!   fault, and recorded in the state file;
//! - `relay`: a TCP relay that lets the hosts reach a service on this machine's loopback;
//! - `faults`: what is done to a lab's hosts on purpose: a gateway killed or cut off
//!   from Redis or PostgreSQL, a Redis master found (by key), killed, started again or
//!   frozen, PostgreSQL restarted;
//! - `failover`: with a standby, the primary lost with its disk, frozen or cut off, the
//!   new primary waited for, the old node brought back as the standby;
//! - `shards`: the ledger's shards after the first (`--shards`), one PostgreSQL each;
//! - `counters`: what the engines have done, for a run's costs per operation.
//! - `nginx`: `hongbao nginx-conf`'s configuration, nginx in front of the gateways (the
//!   lab's, a bench's, an operator's).

mod counters;
pub mod disk;
mod error;
mod failover;
mod faults;
mod teardown;
pub use hongbao_sys::netns;
pub mod nginx;
pub mod postgres;
pub mod proc;
pub mod redis;
pub mod relay;
pub mod shards;
pub mod standby;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use hongbao_server::config::ServeFlags;
use serde::{Deserialize, Serialize};

pub use counters::{parse_commandstats, EngineCounters};
pub use error::{Error, Result};
pub use faults::Cut;
pub use netns::Host;
use proc::{Proc, ProcRecord};
pub use relay::Relay;
pub use teardown::{children_of, down};

/// Ports on every gateway host.
pub const GATEWAY_TCP: u16 = 7000;
pub const GATEWAY_ADMIN: u16 = 7001;
pub const GATEWAY_WS: u16 = 7002;
pub const GATEWAY_HTTP: u16 = 7003;
/// Ports on the nginx host.
pub const NGINX_TCP: u16 = 8000;
pub const NGINX_HTTP: u16 = 8080;
pub const NGINX_WS: u16 = 8082;

/// How long a process gets between SIGTERM and SIGKILL.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// Sysctls in every gateway and load host (they are per namespace): the same as
/// `hongbao doctor --apply` sets on the machine.
const HOST_SYSCTLS: &[&str] = &[
    "net.ipv4.ip_local_port_range=1024 65535",
    "net.ipv4.ip_local_reserved_ports=7000-7003,8000-8082",
    "net.core.somaxconn=65535",
    "net.ipv4.tcp_max_syn_backlog=65535",
    "net.ipv4.tcp_tw_reuse=1",
];

/// What to bring up.
#[derive(Debug, Clone)]
pub struct LabPlan {
    /// The lab's number: its subnet is 198.18.n.0/24.
    pub lab: u8,
    /// Logs, data and the state file.
    pub dir: PathBuf,
    pub gateways: usize,
    pub loads: usize,
    /// nginx in front of the gateways.
    pub nginx: bool,
    /// The `hongbao` binary the gateways run.
    pub hongbao: PathBuf,
    /// The `hongbao serve` settings of every gateway (its workers, secret, limits); the
    /// lab adds each one's addresses, data directory, engines and name.
    pub serve: ServeFlags,
    /// The key of the monitor the gateways report to (`--monitor` in `serve`), given to
    /// them in `HONGBAO_MONITOR_KEY`.
    pub monitor_key: Option<String>,
    /// PostgreSQL's data on a tmpfs of this many bytes, for `postgres-disk-full` to fill
    /// (root; its WAL kept small to fit); `None`: on the disk under the system's
    /// temporary directory.
    pub postgres_disk: Option<u64>,
    /// The ledger a primary with a synchronous standby, failed over by pg_auto_failover's
    /// monitor (`standby`); `false`: one PostgreSQL.
    pub standby: bool,
    /// The ledger's shards (`shards`): 0 or 1 for one; shards after the first are one
    /// PostgreSQL each.
    pub shards: usize,
}

/// What `DIR/lab.json` records, for `hongbao lab down`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LabState {
    pub lab: u8,
    pub netns: Vec<String>,
    pub postgres_dir: Option<PathBuf>,
    /// The data of the shards after the first.
    #[serde(default)]
    pub shard_dirs: Vec<PathBuf>,
    pub procs: Vec<ProcRecord>,
}

/// A gateway host: `hongbao serve` in cluster mode.
pub struct Gateway {
    pub host: Host,
    pub proc: Option<Proc>,
    /// The binary it runs when not the plan's (a rolling upgrade's new one).
    pub exe: Option<PathBuf>,
}

impl Gateway {
    pub fn tcp(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.host.addr, GATEWAY_TCP))
    }
    pub fn admin(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.host.addr, GATEWAY_ADMIN))
    }
    pub fn ws(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.host.addr, GATEWAY_WS))
    }
    pub fn http(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.host.addr, GATEWAY_HTTP))
    }
}

/// The lab's secrets, made when it comes up and kept in files of its directory (mode
/// 0600) that the gateways are given: never on a command line.
pub struct LabSecrets {
    /// The Redis ACL user's password (`redis.password`).
    pub redis: String,
    /// The PostgreSQL role's password (`postgres.password`).
    pub postgres: String,
}

/// Files in the lab's directory.
pub const REDIS_PASSWORD_FILE: &str = "redis.password";
pub const POSTGRES_PASSWORD_FILE: &str = "postgres.password";
pub const ADMIN_KEY_FILE: &str = "admin.key";
/// The lab's CA (`ca.pem`), and the certificate of its engines (`cert.pem`, `key.pem`).
pub const TLS_DIR: &str = "tls";

/// The last byte of the engine hosts' addresses: PostgreSQL's, the Redis nodes'.
const PG_LAST: u8 = 20;
const REDIS_LAST: std::ops::RangeInclusive<u8> = 11..=16;

pub struct Lab {
    pub plan: LabPlan,
    pub secrets: LabSecrets,
    /// An operator key for every gateway's admin API (`admin.key`): the lab makes it in
    /// the ledger before any gateway starts.
    pub admin_key: String,
    pub redis: Vec<(Host, Option<Proc>)>,
    pub postgres: (Host, Option<Proc>),
    pub postgres_dir: PathBuf,
    /// The tmpfs under `postgres_dir`, when the plan asks for one.
    postgres_disk: Option<disk::SmallDisk>,
    /// With a standby (the plan's `standby`): the monitor and the two data nodes, whose
    /// files are under `postgres_dir`; `postgres` then names the first data node's host,
    /// with no process of its own.
    pub formation: Option<standby::Formation>,
    /// The ledger's shards after the first (`shards`).
    pub shards: Vec<shards::Shard>,
    pub gateways: Vec<Gateway>,
    pub loads: Vec<Host>,
    pub nginx: Option<(Host, Option<Proc>)>,
    state: LabState,
}

impl Lab {
    /// Brings the lab up. On any failure what was started is stopped again.
    pub fn up(plan: LabPlan) -> Result<Lab> {
        if plan.lab == 0 || plan.lab == 255 {
            return Err(Error::Refused(
                "the lab number must be 1 to 254 (its subnet is 198.18.n.0/24)".into(),
            ));
        }
        std::fs::create_dir_all(&plan.dir)
            .map_err(|e| Error::io(format!("creating {}", plan.dir.display()), e))?;
        netns::create_bridge(plan.lab)?;
        let postgres_dir = std::env::temp_dir().join(format!("hongbao-lab{}-postgres", plan.lab));
        let secrets = LabSecrets {
            redis: hongbao_http::access::new_key(),
            postgres: hongbao_http::access::new_key(),
        };
        for (file, secret) in [
            (REDIS_PASSWORD_FILE, &secrets.redis),
            (POSTGRES_PASSWORD_FILE, &secrets.postgres),
        ] {
            let path = plan.dir.join(file);
            hongbao_server::access::write_secret_file(&path, secret)
                .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        }
        if plan.standby && plan.postgres_disk.is_some() {
            return Err(Error::Refused(
                "a lab with a standby keeps no PostgreSQL data on a small disk (postgres_disk)"
                    .into(),
            ));
        }
        // The engines speak TLS only: a CA of the lab's own, and one certificate naming
        // every engine host (PostgreSQL's, with a standby's and the monitor's, the Redis
        // nodes').
        let engines: Vec<String> = [PG_LAST, standby::STANDBY_LAST, standby::MONITOR_LAST]
            .into_iter()
            .chain(REDIS_LAST)
            .map(|last| Ipv4Addr::new(198, 18, plan.lab, last))
            .chain(shards::extra_addrs(plan.lab, plan.shards, plan.standby))
            .map(|addr| addr.to_string())
            .collect();
        let names: Vec<&str> = engines.iter().map(String::as_str).collect();
        hongbao_http::tls::DevCerts::make(&names)
            .map_err(|e| Error::Failed(e.to_string()))?
            .write(&plan.dir.join(TLS_DIR))
            .map_err(|e| Error::io("writing the lab's certificates", e))?;
        let mut lab = Lab {
            secrets,
            admin_key: String::new(),
            state: LabState {
                lab: plan.lab,
                postgres_dir: Some(postgres_dir.clone()),
                ..LabState::default()
            },
            redis: Vec::new(),
            postgres: (placeholder_host(), None),
            postgres_dir,
            postgres_disk: None,
            formation: None,
            shards: Vec::new(),
            gateways: Vec::new(),
            loads: Vec::new(),
            nginx: None,
            plan,
        };
        // From here on, dropping `lab` tears down what exists.
        lab.save()?;
        lab.bring_up()?;
        Ok(lab)
    }

    fn host(&mut self, name: &str, last: u8, sysctls: &[&str]) -> Result<Host> {
        // Recorded first: a host half made is taken down with the rest.
        self.state
            .netns
            .push(netns::netns_name(self.plan.lab, name));
        self.save()?;
        Ok(netns::create_host(self.plan.lab, name, last, sysctls)?)
    }

    fn bring_up(&mut self) -> Result<()> {
        let dir = self.plan.dir.clone();
        // PostgreSQL.
        let pg = self.host("pg", PG_LAST, &[])?;
        disk::SmallDisk::clear_stale(&self.postgres_dir);
        let _ = std::fs::remove_dir_all(&self.postgres_dir);
        if self.plan.standby {
            self.postgres.0 = pg;
            self.bring_up_formation()?;
        } else {
            if let Some(bytes) = self.plan.postgres_disk {
                self.postgres_disk = Some(disk::SmallDisk::mount(&self.postgres_dir, bytes)?);
            }
            postgres::init(
                &self.postgres_dir,
                netns::bridge_addr(self.plan.lab),
                &self.tls_dir(),
            )?;
            self.postgres.0 = pg;
            self.postgres.1 = Some(self.start_postgres()?);
            self.save()?;
            postgres::make_role(&self.postgres_dir, &self.secrets.postgres)?;
        }
        self.bring_up_shards()?;
        // The gateways' first operator key, made in the ledger before any gateway: each
        // would otherwise make its own, known only to its host.
        let access = hongbao_cluster::PgAccess::connect(&self.pg_target())
            .map_err(|e| Error::from(e).within("the lab's PostgreSQL, for its admin key"))?;
        self.admin_key = hongbao_server::access::make_key(
            &access,
            "lab-operator",
            hongbao_money::access::Role::Operator,
            "lab",
        )
        .map_err(|e| Error::from(e).within("making the lab's admin key"))?;
        let key_file = dir.join(ADMIN_KEY_FILE);
        hongbao_server::access::write_secret_file(&key_file, &self.admin_key)
            .map_err(|e| Error::io(format!("writing {}", key_file.display()), e))?;
        // Redis Cluster.
        for (i, last) in (1..=6u8).zip(REDIS_LAST) {
            let host = self.host(&format!("redis{i}"), last, &[])?;
            let proc =
                redis::start_node(&host, &dir.join(format!("redis{i}")), &self.redis_auth())?;
            self.redis.push((host, Some(proc)));
            self.save()?;
        }
        let addrs: Vec<Ipv4Addr> = self.redis.iter().map(|(h, _)| h.addr).collect();
        redis::create_cluster(&self.redis_auth(), &addrs)?;
        // Gateways, each waited for.
        for i in 1..=self.plan.gateways {
            let host = self.host(&format!("gw{i}"), 30 + i as u8, HOST_SYSCTLS)?;
            self.gateways.push(Gateway {
                host,
                proc: None,
                exe: None,
            });
            self.start_gateway(i - 1)?;
        }
        for i in 1..=self.plan.loads {
            let host = self.host(&format!("load{i}"), 50 + i as u8, HOST_SYSCTLS)?;
            self.loads.push(host);
        }
        if self.plan.nginx {
            let host = self.host("nginx", 10, HOST_SYSCTLS)?;
            let proc = self.start_nginx(&host)?;
            self.nginx = Some((host, Some(proc)));
            self.save()?;
        }
        Ok(())
    }

    /// The Redis Cluster's node URLs as the lab's user, comma-separated, for `--redis`
    /// (the password is in `redis.password`).
    pub fn redis_urls(&self) -> String {
        self.redis
            .iter()
            .map(|(h, _)| format!("rediss://{}@{}:{}", redis::USER, h.addr, redis::PORT))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Where the lab keeps its CA and the engines' certificate and key.
    pub fn tls_dir(&self) -> PathBuf {
        self.plan.dir.join(TLS_DIR)
    }

    /// How the lab's tools log in to its Redis.
    pub fn redis_auth(&self) -> redis::Auth {
        let tls = self.tls_dir();
        redis::Auth {
            password: self.secrets.redis.clone(),
            cert: tls.join("cert.pem"),
            key: tls.join("key.pem"),
            ca: tls.join("ca.pem"),
        }
    }

    /// Starts the lab's PostgreSQL over its data; on a small disk with a small WAL.
    fn start_postgres(&self) -> Result<Proc> {
        postgres::start(
            &self.postgres.0,
            &self.postgres_dir,
            self.postgres_disk.is_some(),
        )
    }

    /// (Re)starts gateway `i` (from 0) and waits for its ready line.
    pub fn start_gateway(&mut self, i: usize) -> Result<()> {
        let redis_urls = self.redis_urls();
        let postgres_url = self.ledger_urls();
        let plan = &self.plan;
        let gw = &self.gateways[i];
        let data = plan.dir.join(format!("{}-data", gw.host.name));
        let flags = ServeFlags {
            listen: Some(gw.tcp().to_string()),
            admin: Some(gw.admin().to_string()),
            ws_listen: Some(gw.ws().to_string()),
            http_listen: Some(gw.http().to_string()),
            data_dir: Some(data),
            redis: Some(redis_urls),
            redis_password_file: Some(plan.dir.join(REDIS_PASSWORD_FILE)),
            postgres: Some(postgres_url),
            postgres_password_file: Some(plan.dir.join(POSTGRES_PASSWORD_FILE)),
            engines_ca: Some(plan.dir.join(TLS_DIR).join("ca.pem")),
            host_name: Some(gw.host.name.clone()),
            ..plan.serve.clone()
        };
        let mut command = gw.host.command(gw.exe.as_ref().unwrap_or(&plan.hongbao));
        command.arg("serve");
        flags.apply(&mut command);
        if let Some(key) = &plan.monitor_key {
            command.env("HONGBAO_MONITOR_KEY", key);
        }
        let log = plan.dir.join(format!("{}.log", gw.host.name));
        let (mut proc, stdout) =
            Proc::spawn_piped(&format!("gateway {}", gw.host.name), command, &log)?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Keep draining so the gateway never blocks on a full pipe.
            for _ in lines {}
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.starts_with("hongbao serve ready") => {}
            other => {
                proc.stop(GRACE);
                return Err(Error::Failed(format!(
                    "gateway {} did not start ({other:?}):\n{}",
                    self.gateways[i].host.name,
                    proc.log_tail()
                )));
            }
        }
        self.gateways[i].proc = Some(proc);
        self.save()
    }

    fn start_nginx(&self, host: &Host) -> Result<Proc> {
        let prefix = self.plan.dir.join("nginx");
        let conf = prefix.join("nginx.conf");
        let list = |f: fn(&Gateway) -> SocketAddr| {
            self.gateways
                .iter()
                .map(|g| f(g).to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let at = |port: u16| SocketAddrV4::new(host.addr, port).to_string();
        let mut command = Command::new(&self.plan.hongbao);
        command
            .arg("nginx-conf")
            .args([
                "--tcp-listen",
                &at(NGINX_TCP),
                "--tcp-upstream",
                &list(Gateway::tcp),
            ])
            .args([
                "--http-listen",
                &at(NGINX_HTTP),
                "--http-upstream",
                &list(Gateway::http),
            ])
            .args([
                "--ws-listen",
                &at(NGINX_WS),
                "--ws-upstream",
                &list(Gateway::ws),
            ])
            .args(["--user", "root"]);
        write_nginx_conf(command, 2, &prefix, &conf)?;
        let addr = SocketAddr::V4(SocketAddrV4::new(host.addr, NGINX_HTTP));
        run_nginx(host.command(nginx_binary()), &prefix, &conf, addr, 0)
    }

    /// nginx's addresses: (binary protocol, HTTP, WebSocket).
    pub fn nginx_addrs(&self) -> Option<(SocketAddr, SocketAddr, SocketAddr)> {
        let (host, _) = self.nginx.as_ref()?;
        let at = |port| SocketAddr::V4(SocketAddrV4::new(host.addr, port));
        Some((at(NGINX_TCP), at(NGINX_HTTP), at(NGINX_WS)))
    }

    pub(crate) fn save(&mut self) -> Result<()> {
        let mut procs = Vec::new();
        procs.extend(self.postgres.1.iter().map(Proc::record));
        procs.extend(
            self.shards
                .iter()
                .filter_map(|s| s.proc.as_ref().map(Proc::record)),
        );
        procs.extend(
            self.formations()
                .flat_map(|f| f.keepers().map(Proc::record)),
        );
        procs.extend(
            self.redis
                .iter()
                .filter_map(|(_, p)| p.as_ref().map(Proc::record)),
        );
        procs.extend(
            self.gateways
                .iter()
                .filter_map(|g| g.proc.as_ref().map(Proc::record)),
        );
        if let Some((_, Some(p))) = &self.nginx {
            procs.push(p.record());
        }
        self.state.procs = procs;
        let path = self.plan.dir.join("lab.json");
        let writing = || format!("writing {}", path.display());
        // The state is plain fields: were it ever to fail as JSON, it is the file not written.
        let json =
            serde_json::to_vec_pretty(&self.state).map_err(|e| Error::io(writing(), e.into()))?;
        std::fs::write(&path, json).map_err(|e| Error::io(writing(), e))
    }

    /// Every host, for printing.
    pub fn hosts(&self) -> Vec<&Host> {
        let mut all: Vec<&Host> = Vec::new();
        all.extend(self.nginx.iter().map(|(h, _)| h));
        all.extend(self.redis.iter().map(|(h, _)| h));
        all.push(&self.postgres.0);
        all.extend(self.shards.iter().map(|s| &s.host));
        for formation in self.formations() {
            all.extend(formation.nodes.iter().skip(1).map(|n| &n.host));
            all.push(&formation.monitor.host);
        }
        all.extend(self.gateways.iter().map(|g| &g.host));
        all.extend(self.loads.iter());
        all
    }
}

/// Finishes `command` (`hongbao nginx-conf` with what to proxy) with the worker count,
/// `prefix` and `--out conf`, and runs it.
pub fn write_nginx_conf(
    mut command: Command,
    workers: u32,
    prefix: &Path,
    conf: &Path,
) -> Result<()> {
    let status = command
        .args(["--worker-processes", &workers.to_string()])
        .arg("--prefix")
        .arg(prefix)
        .arg("--out")
        .arg(conf)
        .status()
        .map_err(|e| Error::io("running hongbao nginx-conf", e))?;
    if !status.success() {
        return Err(Error::Failed("hongbao nginx-conf failed".into()));
    }
    Ok(())
}

/// Runs nginx (`command` is [`nginx_binary`], in a host or not) in the foreground on
/// `conf` with its files under `prefix`, and waits until it accepts at `addr` with at
/// least `workers` worker processes up. Stopped again if it does not.
pub fn run_nginx(
    mut command: Command,
    prefix: &Path,
    conf: &Path,
    addr: SocketAddr,
    workers: usize,
) -> Result<Proc> {
    command
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(conf)
        .args(["-g", "daemon off;"]);
    let mut proc = Proc::spawn("nginx", command, &prefix.join("stderr.log"))
        .map_err(|e| e.within("starting nginx (apt-get install nginx)"))?;
    for _ in 0..100 {
        let up = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
        if up && children_of(proc.pid()).len() >= workers {
            return Ok(proc);
        }
        if !proc.running() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let tail = proc.log_tail();
    proc.stop(GRACE);
    Err(Error::Failed(format!("nginx did not start:\n{tail}")))
}

/// nginx on the PATH, or Debian's.
pub fn nginx_binary() -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let candidate = Path::new(dir).join("nginx");
        if candidate.exists() {
            return candidate;
        }
    }
    PathBuf::from("/usr/sbin/nginx")
}

fn placeholder_host() -> Host {
    Host {
        name: String::new(),
        netns: String::new(),
        addr: Ipv4Addr::UNSPECIFIED,
    }
}

/// A lab number no bridge uses yet, from `seed` (e.g. a process id), for tests that run
/// side by side.
pub fn free_lab_number(seed: u32) -> u8 {
    for k in 0..254u32 {
        let n = ((seed.wrapping_add(k)) % 200 + 20) as u8;
        if !Path::new(&format!("/sys/class/net/{}", netns::bridge_name(n))).exists() {
            return n;
        }
    }
    20
}
