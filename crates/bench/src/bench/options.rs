//! What `hongbao bench` is asked to do: its options and presets, the faults it can inject
//! into its server or a lab, and the defaults it hands the server and the load it starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hongbao_load::client::DEFAULT_NOTICE_POLL_SECS;
use hongbao_load::transport::{HttpConnection, Transport};
use hongbao_server::config::ServeFlags;

pub const SECRET: &str = "hongbao-bench-secret";

/// The bench's server sheds shakes that waited longer than this (`max_queue_ms`: a share
/// rising to all at twice it).
pub const DEFAULT_BENCH_MAX_QUEUE_MS: u32 = 200;

/// The bench's server paces a broadcast while shakes wait longer than this
/// (`broadcast_yield_ms`).
pub const DEFAULT_BENCH_BROADCAST_YIELD_MS: u32 = 3;

/// The bench's server runs this much nicer than the load (see `server_nice`).
pub const DEFAULT_SERVER_NICE: i32 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    Quick,
    Seed,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub connections: u64,
    pub out: PathBuf,
    /// Server worker processes ("auto" or a number).
    pub workers: String,
    /// Load client processes; 0 = auto.
    pub procs: u32,
    /// One steady phase per entry, in order.
    pub phase_qps: Vec<u64>,
    pub shake_packets: u32,
    pub send_packets: u32,
    pub campaign_rate: u32,
    pub recipients: u32,
    pub max_shake_qps: u32,
    pub connect_rate: u64,
    /// Where the bench's own monitor (dashboard, /metrics) listens.
    pub monitor_listen: SocketAddr,
    /// How the clients connect: raw TCP, or WebSocket to the server's `--ws-listen`.
    pub transport: Transport,
    /// Seconds between operator broadcasts during each steady phase; 0 = none.
    pub broadcast_every_secs: f64,
    /// The server's `max_queue_ms`.
    pub max_queue_ms: u32,
    /// The server's `broadcast_yield_ms`.
    pub broadcast_yield_ms: u32,
    /// The server runs at this nice value (its workers inherit it). The load stands in
    /// for a million phones that bring their own CPUs: sharing two cores with the server
    /// at equal priority it fell behind its own schedule when the machine was saturated
    /// (at 1M/60K, by 70 s), and the backlog built up in the clients, out of the server's
    /// sight. Ahead of the server, it sends on time, and overload shows where it would in
    /// the field: as requests waiting at the server, which `max_queue_ms` sheds.
    pub server_nice: i32,
    /// The caller moved the bench into a network namespace of its own
    /// (`doctor::enter_network_namespace`): recorded in the summary.
    pub netns: bool,
    /// With N > 0, N gateway hosts in cluster mode on a lab (Redis Cluster, PostgreSQL,
    /// nginx in front) instead of one local server (docs/scale-out.md).
    pub hosts: usize,
    /// With `--hosts`: a failure injected `fault_at_secs` into the first phase.
    pub fault: Option<Fault>,
    /// Faults at random moments through every steady phase (`--chaos SEED`).
    pub chaos: Option<ChaosOptions>,
    pub fault_at_secs: f64,
    /// `--upgrade-to`: the binary `--fault upgrade` (`--upgrade-at`) starts; this one
    /// when not given.
    pub upgrade_to: Option<std::path::PathBuf>,
    /// `--upgrade-from`: the binary the server (or the lab's gateways) starts on, to be
    /// upgraded from; this one when not given.
    pub upgrade_from: Option<std::path::PathBuf>,
    /// HTTP: a keep-alive connection per user, or a connection per request.
    pub http_connection: HttpConnection,
    /// HTTP: each user looks for packets to open every this many seconds.
    pub notice_poll_secs: u32,
    /// Run the load on agents (docs/agents.md) instead of local client processes.
    pub agents: Option<AgentsChoice>,
    /// With `--hosts`: the lab's ledger is a primary with a synchronous standby and a
    /// failover manager (docs/scale-out.md); implied by a fault to the primary.
    pub standby: bool,
    /// With `--hosts`: the lab's ledger over this many shards (1: one).
    pub shards: usize,
    /// With `--hosts`: the release over this many Redis hash tags (1: `{rel}` alone).
    pub release_tags: u32,
    /// Load a running deployment instead of starting a server (`--target-*`).
    pub target: Option<Target>,
    /// Every transport over TLS (`--tls`): the server's listeners and admin address speak
    /// it with a throwaway certificate made for the run, signed by the CA in this
    /// directory (`ca.pem`, `cert.pem`, `key.pem`), which the clients and the bench trust.
    pub tls_dir: Option<PathBuf>,
    /// Every user connects at once, each coming back on its own back-off
    /// (`--connect-mode storm`), instead of at `connect_rate`.
    pub connect_storm: bool,
}

/// `--agents N` and its settings: where the coordinator listens, its files, whether the
/// bench starts the agents itself.
#[derive(Debug, Clone)]
pub struct AgentsChoice {
    pub count: u32,
    /// None: 127.0.0.1 (with a lab: its bridge address), any port.
    pub listen: Option<SocketAddr>,
    /// None: OUT/agents.
    pub dir: Option<PathBuf>,
    pub cert_names: Vec<String>,
    pub join_timeout_secs: u64,
    pub spawn: bool,
}

/// A running deployment to load (`--target-*`): where its clients connect, its admin
/// API and key, the login secret its tokens are signed with, the CA its TLS is signed by.
#[derive(Debug, Clone)]
pub struct Target {
    pub clients: SocketAddr,
    /// `http://HOST:PORT` or `https://HOST:PORT` (then `ca` is trusted for it).
    pub admin: String,
    pub admin_key: String,
    pub secret: String,
    /// A CA file (PEM) an https admin is trusted by...
    pub ca: Option<PathBuf>,
    /// ...and the clients' TLS to `clients` (binary frames), when they speak it.
    pub client_tls: bool,
}

/// A failure the bench injects into its server or a lab mid-run (docs/bench.md;
/// docs/scale-out.md, "Failures").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL every process of the last gateway host.
    Gateway,
    /// SIGKILL a Redis master; its replica takes over.
    RedisMaster(RedisAim),
    /// SIGSTOP a Redis master for 8 s (its replica takes over meanwhile), then SIGCONT.
    RedisFreeze(RedisAim),
    /// Stop PostgreSQL, and start it again two seconds later.
    Postgres,
    /// `FLUSHALL` on every Redis master: the cluster forgets everything it held, as one
    /// restarted without persistence would (the hosts restore what they need from
    /// PostgreSQL and from what they know).
    RedisWipe,
    /// One local server: SIGSTOP a gateway worker for [`WORKER_STALL`], then SIGCONT.
    WorkerStall,
    /// SIGKILL a gateway worker; the supervisor starts another, its clients reconnect.
    WorkerKill,
    /// One local server: SIGKILL the supervisor (`hongbao serve`), and with it the core
    /// and its ledger writer, which live in its process; its workers exit as their links
    /// close. Healed by starting the server again on the same addresses and ledger.
    /// `core-kill` is the same fault.
    SupervisorKill,
    /// One local server whose ledger is on a small tmpfs: fill it until ENOSPC, hold it
    /// full for [`DISK_FULL_HOLD`], then delete the filler.
    DiskFull,
    /// One local server upgraded in place (`serve --upgrade`: `--upgrade-to`'s binary,
    /// or this one): its sockets handed over, its clients drained to the new process, its
    /// ledger passed last. With `--hosts`, a rolling upgrade: each gateway in turn
    /// drained by SIGTERM and started again on the new binary (`rolling.rs`).
    /// `--upgrade-at S` is `--fault upgrade --fault-at S`.
    Upgrade,
    /// A lab's PostgreSQL on a small tmpfs (the bench mounts it, root): fill it until
    /// ENOSPC, hold it full for [`DISK_FULL_HOLD`], delete the filler (and start
    /// PostgreSQL again if it stopped).
    PostgresDiskFull,
    /// Cut a gateway host off from Redis or PostgreSQL (blackhole routes in its
    /// namespace) for a while: 8 s alone, 5–15 s drawn by chaos.
    Partition(hongbao_lab::Cut),
    /// A lab whose ledger has a synchronous standby (`--standby`): shard K's primary's
    /// host (K = 0 without `:K`) lost with its disk — its processes SIGKILLed, its data
    /// directory removed. The standby takes over; healed by a new standby cloned from the
    /// new primary.
    PrimaryLost(u8),
    /// The primary's host frozen (SIGSTOP) for [`PRIMARY_OUT`], then let go on; the
    /// standby takes over meanwhile and the old primary comes back as its standby.
    PrimaryFreeze(u8),
    /// The primary's host cut off from every other host (the standby, the monitor, the
    /// gateways) for [`PRIMARY_OUT`]; as for a freeze.
    PrimaryIsolate(u8),
    /// A lab with `--shards`: shard K's one PostgreSQL frozen (every process of its host
    /// SIGSTOPped) for [`PRIMARY_OUT`], then let go on: its commits wait (each batch
    /// sent again until its outcome is known) while the other shards carry on. Shard 0
    /// with a standby is a formation, whose faults are the primary's.
    ShardFreeze(u8),
    /// Shard K's PostgreSQL host cut off from every other host for [`PRIMARY_OUT`]; as
    /// for a freeze.
    ShardIsolate(u8),
}

/// The shards a primary's fault may aim at (`primary-lost:K`): a lab with a standby holds
/// up to 3, and shard 0's is the fault without `:K`.
const PRIMARY_LOST: [&str; 3] = ["primary-lost", "primary-lost:1", "primary-lost:2"];
const PRIMARY_FREEZE: [&str; 3] = ["primary-freeze", "primary-freeze:1", "primary-freeze:2"];
const PRIMARY_ISOLATE: [&str; 3] = ["primary-isolate", "primary-isolate:1", "primary-isolate:2"];

/// The shards a shard fault may aim at (`shard-freeze:K`): a lab holds up to 8.
const SHARD_FREEZE: [&str; 8] = [
    "shard-freeze:0",
    "shard-freeze:1",
    "shard-freeze:2",
    "shard-freeze:3",
    "shard-freeze:4",
    "shard-freeze:5",
    "shard-freeze:6",
    "shard-freeze:7",
];
const SHARD_ISOLATE: [&str; 8] = [
    "shard-isolate:0",
    "shard-isolate:1",
    "shard-isolate:2",
    "shard-isolate:3",
    "shard-isolate:4",
    "shard-isolate:5",
    "shard-isolate:6",
    "shard-isolate:7",
];

/// Which Redis master a Redis fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisAim {
    /// The first live master `CLUSTER NODES` lists (`redis-master`, `redis-freeze`).
    First,
    /// The master that holds the release of campaign packets, `{rel}` (`…:rel`): the
    /// hosts' liveness and the packets each holds go through a failover with it.
    Release,
}

impl RedisAim {
    /// The key whose slot picks the master, if the aim is a key's.
    pub fn key(self) -> Option<&'static str> {
        match self {
            RedisAim::First => None,
            RedisAim::Release => Some("{rel}"),
        }
    }
}

/// What `--chaos` asks for.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub seed: u64,
    /// The mean quiet gap between one fault's heal and the next fault, seconds.
    pub every_secs: f64,
    pub faults: Vec<Fault>,
}

impl ChaosOptions {
    /// The faults chaos draws from when none are named: every one that fits the server.
    /// `disk-full` only as root, who can mount the tmpfs it needs. With a standby, the
    /// primary's faults instead of those of the one PostgreSQL (every shard's primary's,
    /// with several). With several shards and no standby, each shard's own PostgreSQL
    /// frozen and cut off too.
    pub fn default_faults(hosts: usize, standby: bool, shards: usize) -> Vec<Fault> {
        let mut faults = vec![Fault::WorkerKill, Fault::WorkerStall];
        if hosts == 0 {
            faults.push(Fault::SupervisorKill);
            // SAFETY: geteuid(2) cannot fail and touches no memory.
            if unsafe { libc::geteuid() } == 0 {
                faults.push(Fault::DiskFull);
            }
        }
        // SAFETY: as above.
        if hosts > 0 && unsafe { libc::geteuid() } == 0 {
            faults.push(Fault::PostgresDiskFull);
        }
        if hosts > 0 {
            use RedisAim::{First, Release};
            faults.extend([
                Fault::Gateway,
                Fault::RedisMaster(First),
                Fault::RedisMaster(Release),
                Fault::RedisFreeze(Release),
                Fault::Postgres,
                Fault::RedisWipe,
                Fault::Partition(hongbao_lab::Cut::Redis),
                Fault::Partition(hongbao_lab::Cut::Postgres),
            ]);
        }
        if hosts > 0 && standby {
            faults.retain(|f| !f.needs_one_postgres());
            for k in 0..shards.clamp(1, PRIMARY_LOST.len()) as u8 {
                faults.extend([
                    Fault::PrimaryLost(k),
                    Fault::PrimaryFreeze(k),
                    Fault::PrimaryIsolate(k),
                ]);
            }
        }
        if hosts > 0 && shards > 1 && !standby {
            for k in 0..shards.min(SHARD_FREEZE.len()) as u8 {
                faults.extend([Fault::ShardFreeze(k), Fault::ShardIsolate(k)]);
            }
        }
        faults
    }
}

/// How long `--fault worker-stall` stops the worker.
pub const WORKER_STALL: Duration = Duration::from_millis(300);

/// How long `primary-freeze` and `primary-isolate` keep the primary out.
pub const PRIMARY_OUT: Duration = Duration::from_secs(20);

/// How long `disk-full` holds the ledger's disk full before deleting the filler.
pub const DISK_FULL_HOLD: Duration = Duration::from_secs(5);

impl Fault {
    pub fn parse(name: &str) -> crate::Result<Fault> {
        match name {
            "gateway" => Ok(Fault::Gateway),
            "redis-master" => Ok(Fault::RedisMaster(RedisAim::First)),
            "redis-master:rel" => Ok(Fault::RedisMaster(RedisAim::Release)),
            "redis-freeze" => Ok(Fault::RedisFreeze(RedisAim::First)),
            "redis-freeze:rel" => Ok(Fault::RedisFreeze(RedisAim::Release)),
            "postgres" | "postgres-restart" => Ok(Fault::Postgres),
            "redis-wipe" => Ok(Fault::RedisWipe),
            "worker-stall" => Ok(Fault::WorkerStall),
            "worker-kill" => Ok(Fault::WorkerKill),
            // The core lives in the supervisor's process: killing one kills the other.
            "supervisor-kill" | "core-kill" => Ok(Fault::SupervisorKill),
            "disk-full" => Ok(Fault::DiskFull),
            "upgrade" => Ok(Fault::Upgrade),
            "postgres-disk-full" => Ok(Fault::PostgresDiskFull),
            "gateway-kill" => Ok(Fault::Gateway),
            "redis-master-kill" => Ok(Fault::RedisMaster(RedisAim::First)),
            "redis-master-kill:rel" => Ok(Fault::RedisMaster(RedisAim::Release)),
            "partition-redis" => Ok(Fault::Partition(hongbao_lab::Cut::Redis)),
            "partition-postgres" => Ok(Fault::Partition(hongbao_lab::Cut::Postgres)),
            other => {
                let shard = |names: &[&str]| names.iter().position(|n| *n == other);
                if let Some(k) = shard(&PRIMARY_LOST) {
                    return Ok(Fault::PrimaryLost(k as u8));
                }
                if let Some(k) = shard(&PRIMARY_FREEZE) {
                    return Ok(Fault::PrimaryFreeze(k as u8));
                }
                if let Some(k) = shard(&PRIMARY_ISOLATE) {
                    return Ok(Fault::PrimaryIsolate(k as u8));
                }
                if let Some(k) = shard(&SHARD_FREEZE) {
                    return Ok(Fault::ShardFreeze(k as u8));
                }
                if let Some(k) = shard(&SHARD_ISOLATE) {
                    return Ok(Fault::ShardIsolate(k as u8));
                }
                Err(crate::Error::Invalid(format!(
                    "a fault is worker-stall, worker-kill, supervisor-kill (or core-kill), disk-full, upgrade, gateway[-kill], redis-master[-kill][:rel], redis-freeze[:rel], redis-wipe, postgres[-restart], postgres-disk-full, partition-redis|postgres, primary-lost|freeze|isolate[:K] (K a shard, 1 or 2) or shard-freeze|isolate:K (K a shard, 0 to 7), not {other:?}"
                )))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::Gateway => "gateway",
            Fault::RedisMaster(RedisAim::First) => "redis-master",
            Fault::RedisMaster(RedisAim::Release) => "redis-master:rel",
            Fault::RedisFreeze(RedisAim::First) => "redis-freeze",
            Fault::RedisFreeze(RedisAim::Release) => "redis-freeze:rel",
            Fault::Postgres => "postgres",
            Fault::RedisWipe => "redis-wipe",
            Fault::WorkerStall => "worker-stall",
            Fault::WorkerKill => "worker-kill",
            Fault::SupervisorKill => "supervisor-kill",
            Fault::DiskFull => "disk-full",
            Fault::Upgrade => "upgrade",
            Fault::PostgresDiskFull => "postgres-disk-full",
            Fault::Partition(hongbao_lab::Cut::Redis) => "partition-redis",
            Fault::Partition(hongbao_lab::Cut::Postgres) => "partition-postgres",
            Fault::PrimaryLost(k) => PRIMARY_LOST[usize::from(k)],
            Fault::PrimaryFreeze(k) => PRIMARY_FREEZE[usize::from(k)],
            Fault::PrimaryIsolate(k) => PRIMARY_ISOLATE[usize::from(k)],
            Fault::ShardFreeze(k) => SHARD_FREEZE[usize::from(k)],
            Fault::ShardIsolate(k) => SHARD_ISOLATE[usize::from(k)],
        }
    }

    /// The shard a fault to one shard's PostgreSQL aims at (a primary's: 0 without `:K`).
    pub fn shard(self) -> Option<usize> {
        match self {
            Fault::ShardFreeze(k)
            | Fault::ShardIsolate(k)
            | Fault::PrimaryLost(k)
            | Fault::PrimaryFreeze(k)
            | Fault::PrimaryIsolate(k) => Some(usize::from(k)),
            _ => None,
        }
    }

    /// Whether the fault is done to the ledger's primary, which needs a lab with a
    /// standby (`--standby`, implied by the fault).
    pub fn needs_standby(self) -> bool {
        matches!(
            self,
            Fault::PrimaryLost(_) | Fault::PrimaryFreeze(_) | Fault::PrimaryIsolate(_)
        )
    }

    /// Whether the fault is done to the one PostgreSQL of a lab without a standby.
    pub fn needs_one_postgres(self) -> bool {
        matches!(self, Fault::Postgres | Fault::PostgresDiskFull)
    }

    /// Whether the fault is done to a lab (`--hosts`) rather than to any server.
    pub fn needs_lab(self) -> bool {
        !matches!(
            self,
            Fault::WorkerStall
                | Fault::WorkerKill
                | Fault::SupervisorKill
                | Fault::DiskFull
                | Fault::Upgrade
        )
    }

    /// Whether the fault is done only to one local server (no `--hosts`): a lab's
    /// gateway is killed by `gateway-kill`, and its ledger is PostgreSQL's.
    pub fn one_server_only(self) -> bool {
        matches!(self, Fault::SupervisorKill | Fault::DiskFull)
    }

    /// Whether the fault needs the server's ledger on a small tmpfs the bench mounts.
    pub fn needs_small_disk(self) -> bool {
        self == Fault::DiskFull
    }

    /// Whether the fault needs the lab's PostgreSQL on a small tmpfs.
    pub fn needs_postgres_disk(self) -> bool {
        self == Fault::PostgresDiskFull
    }
}

impl BenchOptions {
    /// The settings of the bench's server as `serve` flags — of its local server and of
    /// every gateway of its lab, and what `hongbao bench --print-serve-args` prints for
    /// the sitting scripts' servers. Not the addresses, ledger or secret of one run.
    pub fn serve_settings(&self) -> ServeFlags {
        let tls = |file: &str| self.tls_dir.as_ref().map(|d| d.join(file));
        ServeFlags {
            workers: Some(self.workers.clone()),
            connections: Some(self.connections),
            max_shake_qps: Some(self.max_shake_qps),
            max_queue_ms: Some(self.max_queue_ms),
            broadcast_yield_ms: Some(self.broadcast_yield_ms),
            tls_cert: tls("cert.pem"),
            tls_key: tls("key.pem"),
            release_tags: (self.release_tags > 1).then_some(self.release_tags),
            ..Default::default()
        }
    }

    /// The CA (PEM) the clients trust: the run's own with `--tls`, a target's with
    /// `--target-client-tls`, else none (plain).
    pub fn client_ca(&self) -> crate::Result<Option<String>> {
        let file = match (&self.tls_dir, &self.target) {
            (Some(dir), _) => dir.join("ca.pem"),
            (
                None,
                Some(Target {
                    ca: Some(ca),
                    client_tls: true,
                    ..
                }),
            ) => ca.clone(),
            _ => return Ok(None),
        };
        let pem = std::fs::read_to_string(&file)
            .map_err(|e| crate::Error::io(format!("reading {}", file.display()), e))?;
        Ok(Some(pem))
    }

    /// Every fault the run may do: `--fault`'s and the chaos list's.
    /// Whether the lab gets a standby: asked for, or a fault needs one.
    pub fn lab_standby(&self) -> bool {
        self.standby || self.faults().any(Fault::needs_standby)
    }

    pub fn faults(&self) -> impl Iterator<Item = Fault> + '_ {
        self.fault
            .into_iter()
            .chain(self.chaos.iter().flat_map(|c| c.faults.iter().copied()))
    }

    pub fn preset(preset: Preset) -> BenchOptions {
        let base = BenchOptions {
            connections: 20_000,
            out: PathBuf::from("bench-out"),
            workers: "auto".into(),
            procs: 0,
            phase_qps: vec![30_000, 60_000],
            shake_packets: 2_000,
            send_packets: 1_000,
            campaign_rate: 200,
            recipients: 3,
            max_shake_qps: 100_000,
            connect_rate: 20_000,
            monitor_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            transport: Transport::Tcp,
            broadcast_every_secs: 0.0,
            max_queue_ms: DEFAULT_BENCH_MAX_QUEUE_MS,
            broadcast_yield_ms: DEFAULT_BENCH_BROADCAST_YIELD_MS,
            server_nice: DEFAULT_SERVER_NICE,
            netns: false,
            agents: None,
            standby: false,
            shards: 1,
            release_tags: 1,
            target: None,
            tls_dir: None,
            connect_storm: false,
            hosts: 0,
            fault: None,
            chaos: None,
            fault_at_secs: 5.0,
            upgrade_to: None,
            upgrade_from: None,
            http_connection: HttpConnection::KeepAlive,
            notice_poll_secs: DEFAULT_NOTICE_POLL_SECS,
        };
        match preset {
            Preset::Quick => base,
            Preset::Seed => BenchOptions {
                connections: 1_000_000,
                shake_packets: 40_000,
                send_packets: 20_000,
                connect_rate: 50_000,
                ..base
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_is_killed_with_its_supervisor_and_names_come_back() {
        assert_eq!(Fault::parse("core-kill").unwrap(), Fault::SupervisorKill);
        for name in [
            "worker-kill",
            "worker-stall",
            "supervisor-kill",
            "disk-full",
            "upgrade",
        ] {
            let fault = Fault::parse(name).unwrap();
            assert_eq!(fault.name(), name);
            assert!(!fault.needs_lab(), "{name}");
        }
        assert!(Fault::SupervisorKill.one_server_only() && Fault::DiskFull.one_server_only());
        assert!(!Fault::WorkerKill.one_server_only() && !Fault::Upgrade.one_server_only());
        let e = Fault::parse("disk").unwrap_err().to_string();
        assert!(e.contains("disk-full") && e.contains("core-kill"), "{e}");
    }

    #[test]
    fn one_servers_chaos_kills_its_supervisor_and_fills_its_disk_as_root() {
        let one = ChaosOptions::default_faults(0, false, 1);
        assert!(one.contains(&Fault::SupervisorKill));
        // SAFETY: geteuid(2) cannot fail and touches no memory.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(one.contains(&Fault::DiskFull), root);
        let lab = ChaosOptions::default_faults(2, false, 1);
        assert!(lab.iter().all(|f| !f.one_server_only()), "{lab:?}");
        assert_eq!(lab.contains(&Fault::PostgresDiskFull), root);
        assert!(Fault::parse("postgres-disk-full").unwrap().needs_lab());
    }

    #[test]
    fn with_a_standby_chaos_does_the_primarys_faults_instead_of_the_one_postgress() {
        let standby = ChaosOptions::default_faults(2, true, 1);
        for f in [
            Fault::PrimaryLost(0),
            Fault::PrimaryFreeze(0),
            Fault::PrimaryIsolate(0),
        ] {
            assert!(standby.contains(&f) && f.needs_standby() && f.needs_lab());
            assert_eq!(Fault::parse(f.name()).unwrap(), f);
        }
        assert!(
            !standby.iter().any(|f| f.needs_one_postgres()),
            "{standby:?}"
        );
        assert!(!ChaosOptions::default_faults(2, false, 1)
            .iter()
            .any(|f| f.needs_standby()));
        // Several shards with a standby: every shard's primary; without, each shard's one
        // PostgreSQL frozen or cut off.
        let shards = ChaosOptions::default_faults(2, true, 3);
        for f in [Fault::PrimaryLost(2), Fault::PrimaryIsolate(1)] {
            assert!(shards.contains(&f) && f.needs_standby() && f.needs_lab());
            assert_eq!(Fault::parse(f.name()).unwrap(), f);
        }
        assert_eq!(Fault::PrimaryLost(0).name(), "primary-lost");
        assert!(!shards.iter().any(|f| matches!(f, Fault::ShardFreeze(_))));
        let plain = ChaosOptions::default_faults(2, false, 3);
        for f in [Fault::ShardFreeze(1), Fault::ShardIsolate(0)] {
            assert!(plain.contains(&f) && !f.needs_standby() && f.needs_lab());
            assert_eq!(Fault::parse(f.name()).unwrap(), f);
        }
        assert_eq!(Fault::parse("shard-freeze:7").unwrap().shard(), Some(7));
        assert!(Fault::parse("shard-freeze:8").is_err());
        let mut opts = BenchOptions::preset(Preset::Quick);
        assert!(!opts.lab_standby());
        opts.fault = Some(Fault::PrimaryLost(1));
        assert!(
            opts.lab_standby(),
            "a fault to the primary brings a standby"
        );
    }
}
