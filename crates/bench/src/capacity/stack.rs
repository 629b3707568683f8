//! A stage's layers, up: nginx on loopback (its static answer, or in front of a gateway),
//! `hongbao serve` with its HTTP API (the bench's server), a lab in cluster mode (the
//! bench's lab), or nothing (an external target). Says where the load goes and which
//! processes are which instance of which layer. Everything it starts stops when dropped.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use hongbao_lab::proc::Proc;

use super::plan::{parse_url, Layers, Stage};
use super::probe::Watched;
use crate::bench::server::Server;
use crate::bench::{BenchOptions, Preset};
use crate::{Error, Result};
use hongbao_load::transport::Transport;

pub struct Stack {
    /// Where the load connects.
    pub target: SocketAddr,
    /// Processes of the layers under test (the load's are added by the caller).
    pub watched: Vec<Watched>,
    /// Lab hosts for the load's client processes (cluster stages).
    pub load_hosts: Vec<hongbao_lab::Host>,
    /// The gateway or the lab (dropped last: nginx first).
    nginx: Option<Nginx>,
    server: Option<Server>,
}

impl Stack {
    /// Where agents dial in unless the plan says: the lab's bridge (cluster stages), else
    /// loopback.
    pub fn agent_listen(&self) -> SocketAddr {
        match &self.server {
            Some(server) => server.agent_listen(),
            None => SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }

    /// The lab, for the engines' counters (cluster stages).
    pub fn engine_counters(&self) -> Option<hongbao_lab::EngineCounters> {
        self.server.as_ref()?.engine_counters()
    }

    pub fn up(
        stage: &Stage,
        instances: u32,
        users: u64,
        load_procs: u32,
        campaign_secs: u64,
        dir: &Path,
        (monitor, monitor_key): (SocketAddr, &str),
    ) -> Result<Stack> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let scaled = stage.scaled_layer();
        let gateway_workers = if scaled == "gateway" {
            instances
        } else {
            stage.gateway_workers
        };
        let nginx_workers = if scaled == "nginx" {
            instances
        } else {
            stage.nginx_workers
        };
        let gateway = |hosts: usize, workers: u32| -> Result<Server> {
            let mut opts = BenchOptions::preset(Preset::Quick);
            opts.out = dir.to_path_buf();
            opts.connections = users;
            opts.workers = workers.to_string();
            opts.procs = load_procs;
            opts.transport = Transport::Http;
            opts.hosts = hosts;
            opts.max_shake_qps = stage.max_shake_qps.unwrap_or(opts.max_shake_qps);
            let data = dir.join("data");
            let _ = std::fs::remove_dir_all(&data);
            Server::start(&opts, &data, monitor, monitor_key)
        };
        let mut stack = Stack {
            target: SocketAddr::from(([127, 0, 0, 1], 0)),
            watched: Vec::new(),
            load_hosts: Vec::new(),
            nginx: None,
            server: None,
        };
        match stage.layers {
            Layers::NginxStatic => {
                let nginx = Nginx::start(dir, nginx_workers, None)?;
                stack.target = nginx.listen;
                stack.watched.extend(nginx.watched());
                stack.nginx = Some(nginx);
            }
            Layers::Gateway | Layers::NginxGateway => {
                let server = gateway(0, gateway_workers)?;
                let http = server
                    .http
                    .ok_or_else(|| Error::Failed("the gateway has no HTTP listener".into()))?;
                stack
                    .watched
                    .extend(gateway_processes(&server, gateway_workers)?);
                if stage.layers == Layers::NginxGateway {
                    let nginx = Nginx::start(dir, nginx_workers, Some(http))?;
                    stack.target = nginx.listen;
                    stack.watched.extend(nginx.watched());
                    stack.nginx = Some(nginx);
                } else {
                    stack.target = http;
                }
                stack.server = Some(server);
            }
            Layers::Cluster => {
                let server = gateway(instances as usize, stage.gateway_workers)?;
                stack.target = server
                    .http
                    .ok_or_else(|| Error::Failed("the lab has no nginx".into()))?;
                stack.load_hosts = server.load_hosts.clone();
                stack.watched.extend(lab_processes(&server)?);
                stack.server = Some(server);
            }
            Layers::External => {
                let url = stage
                    .url
                    .as_deref()
                    .ok_or_else(|| Error::Invalid("an external stage needs url".into()))?;
                stack.target = parse_url(url)?.0;
                for (layer, comm) in &stage.watch {
                    let pids = processes_named(comm);
                    if pids.is_empty() {
                        tracing::warn!(process = comm, layer, "no process of that name to watch");
                    }
                    for pid in pids {
                        stack.watched.push(Watched::new(
                            layer,
                            format!("pid {pid}"),
                            vec![pid],
                            false,
                        ));
                    }
                }
            }
        }
        if stage.campaign_rate > 0 {
            let server = stack
                .server
                .as_ref()
                .ok_or_else(|| Error::Invalid("campaign_rate needs a gateway".into()))?;
            let request = hongbao_money::rules::ShakeCampaignRequest {
                packets: stage
                    .campaign_rate
                    .saturating_mul(campaign_secs.max(1) as u32),
                rate_per_sec: stage.campaign_rate,
                amount_min: 100,
                amount_max: 10_000,
            };
            let _: serde_json::Value = server
                .post("/v1/campaigns/shake", &request)
                .map_err(|e| e.within("starting the stage's shake campaign"))?;
        }
        if !stack.watched.iter().any(|w| w.layer == "machine") {
            stack.watched.push(Watched::machine());
        }
        Ok(stack)
    }

    /// Stops what the stage started, front to back.
    pub fn down(mut self) -> Result<()> {
        drop(self.nginx.take());
        match self.server.take() {
            Some(server) => server.stop(),
            None => Ok(()),
        }
    }
}

/// The embedded gateway's processes: the supervisor (the core: the money and its
/// ledger) and its workers.
fn gateway_processes(server: &Server, workers: u32) -> Result<Vec<Watched>> {
    let pid = server
        .pid()
        .ok_or_else(|| Error::Failed("no gateway process".into()))?;
    let mut children = Vec::new();
    for _ in 0..100 {
        children = hongbao_lab::children_of(pid);
        if children.len() >= workers as usize {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    children.sort_unstable();
    let mut out = vec![Watched::new("core", "supervisor", vec![pid], false)];
    for (k, child) in children.into_iter().enumerate() {
        out.push(Watched::new(
            "gateway",
            format!("worker {k}"),
            vec![child],
            false,
        ));
    }
    Ok(out)
}

/// The lab's hosts: each gateway host (its supervisor and workers), nginx (master and
/// workers), each Redis node, PostgreSQL (every backend), each with its own interface.
fn lab_processes(server: &Server) -> Result<Vec<Watched>> {
    let lab = server.lab().ok_or_else(|| Error::Failed("no lab".into()))?;
    let lab = lab.lock().unwrap();
    let with_children = |pid: u32| {
        let mut all = vec![pid];
        all.extend(hongbao_lab::children_of(pid));
        all
    };
    let mut out = Vec::new();
    for g in &lab.gateways {
        if let Some(p) = &g.proc {
            out.push(Watched::new(
                "gateway-host",
                &g.host.name,
                with_children(p.pid()),
                true,
            ));
        }
    }
    if let Some((host, Some(p))) = &lab.nginx {
        out.push(Watched::new(
            "nginx",
            &host.name,
            with_children(p.pid()),
            true,
        ));
    }
    for (host, p) in &lab.redis {
        if let Some(p) = p {
            out.push(Watched::new("redis", &host.name, vec![p.pid()], true));
        }
    }
    if let (host, Some(p)) = &lab.postgres {
        out.push(Watched::new(
            "postgres",
            &host.name,
            with_children(p.pid()),
            true,
        ));
    }
    Ok(out)
}

/// Processes whose /proc/PID/comm is `name`.
fn processes_named(name: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name) {
            found.push(pid);
        }
    }
    found.sort_unstable();
    found
}

/// nginx on loopback, from `hongbao nginx-conf`: its static `200`, or in front of a
/// gateway's HTTP API.
struct Nginx {
    proc: Proc,
    listen: SocketAddr,
}

fn free_port() -> Result<SocketAddr> {
    let finding = |e| Error::io("finding a free port on 127.0.0.1", e);
    TcpListener::bind("127.0.0.1:0")
        .map_err(finding)?
        .local_addr()
        .map_err(finding)
}

impl Nginx {
    fn start(dir: &Path, workers: u32, upstream: Option<SocketAddr>) -> Result<Nginx> {
        let prefix = dir.join("nginx");
        let prefix = std::path::absolute(&prefix)
            .map_err(|e| Error::io(format!("resolving {}", prefix.display()), e))?;
        std::fs::create_dir_all(&prefix)
            .map_err(|e| Error::io(format!("creating {}", prefix.display()), e))?;
        let conf = prefix.join("nginx.conf");
        let listen = free_port()?;
        let exe = std::env::current_exe().map_err(|e| Error::io("which binary is this", e))?;
        let mut command = Command::new(exe);
        command.arg("nginx-conf");
        match upstream {
            Some(up) => command.args([
                "--http-listen",
                &listen.to_string(),
                "--http-upstream",
                &up.to_string(),
            ]),
            None => command.args(["--static-listen", &listen.to_string()]),
        };
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            command.args(["--user", "root"]);
        }
        hongbao_lab::write_nginx_conf(command, workers, &prefix, &conf)?;
        let command = Command::new(hongbao_lab::nginx_binary());
        let proc = hongbao_lab::run_nginx(command, &prefix, &conf, listen, workers as usize)?;
        Ok(Nginx { proc, listen })
    }

    /// Its workers, one instance each (the master only starts them).
    fn watched(&self) -> Vec<Watched> {
        let mut workers = hongbao_lab::children_of(self.proc.pid());
        workers.sort_unstable();
        workers
            .into_iter()
            .enumerate()
            .map(|(k, pid)| Watched::new("nginx", format!("worker {k}"), vec![pid], false))
            .collect()
    }
}
