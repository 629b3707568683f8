//! The bench's server: a `hongbao serve` child on ephemeral ports with its own ledger,
//! talked to through its admin API, and sampled once a second for the server side of the
//! series and the per-connection memory. Killed by `supervisor-kill`, it is started again
//! on the ports it first bound, over the same ledger.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::inject::Injector;
use super::options::{BenchOptions, Fault, SECRET};
use crate::transport::Transport;

/// A `hongbao serve` child (killed if still running when dropped), or with `--hosts N` a
/// lab of N gateways in cluster mode behind nginx (taken down when dropped).
pub(crate) struct Server {
    local: Option<Arc<Local>>,
    lab: Option<Arc<Mutex<hongbao_lab::Lab>>>,
    /// The lab's directory (its lab.json), read without the lab's lock.
    lab_dir: Option<PathBuf>,
    /// Where operators' requests go (the first gateway of a lab).
    pub admin: SocketAddr,
    /// Every gateway's admin address, for the server side of the series.
    pub admins: Vec<SocketAddr>,
    pub listen: SocketAddr,
    /// The WebSocket listener, when asked for.
    pub ws: Option<SocketAddr>,
    /// The HTTP listener, when asked for.
    pub http: Option<SocketAddr>,
    /// With a lab: the hosts the load client processes run on.
    pub load_hosts: Vec<hongbao_lab::Host>,
    /// With a lab: the monitor, reachable from its hosts at the bridge's address.
    _monitor_relay: Option<hongbao_lab::Relay>,
}

/// A lab's load hosts: as many as client processes, up to two — the load, like the
/// gateways, reaches nginx over the lab's network from hosts of its own.
const LOAD_HOSTS: usize = 2;

/// How long a `hongbao serve` child has to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The room of the lab PostgreSQL's tmpfs when `postgres-disk-full` may fill it: its
/// cluster (about 40 MiB), a WAL kept to 64 MiB, and room to spare for a run's rows.
const POSTGRES_DISK_BYTES: u64 = 512 << 20;

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(local) = &self.local {
            local.kill_for_good();
        }
        // A bench that fails while a fault's thread still holds the lab: taken down from
        // its lab.json all the same (by the last holder it already is, lab.json gone).
        drop(self.lab.take());
        if let Some(dir) = &self.lab_dir {
            if dir.join("lab.json").exists() {
                if let Err(e) = hongbao_lab::down(dir) {
                    eprintln!("bench: taking the lab down: {e:#}");
                }
            }
        }
    }
}

/// The addresses a local server listens on: asked for (":0" for any port) or bound.
#[derive(Debug, Clone, PartialEq)]
struct Addrs {
    listen: SocketAddr,
    admin: SocketAddr,
    ws: Option<SocketAddr>,
    http: Option<SocketAddr>,
}

/// One local `hongbao serve`: the child running now, and how to start it again on the
/// same addresses and ledger (`supervisor-kill`'s heal).
pub(crate) struct Local {
    /// `None` once the bench has stopped it for good. Held through a whole kill and
    /// restart, so the bench's own stop waits for a restart under way.
    child: Mutex<Option<Child>>,
    exe: PathBuf,
    nice: i32,
    /// Everything but the addresses.
    args: Vec<OsString>,
    /// The addresses it bound the first time, asked for again by every restart.
    addrs: Addrs,
    pub data_dir: PathBuf,
}

/// What a started `hongbao serve` said in its ready line.
struct Ready {
    addrs: Addrs,
    replayed_events: u64,
}

impl Local {
    fn start(opts: &BenchOptions, data_dir: &Path, monitor: SocketAddr) -> anyhow::Result<Local> {
        let any: SocketAddr = "127.0.0.1:0".parse()?;
        let mut args: Vec<OsString> = vec![
            "serve".into(),
            "--monitor".into(),
            monitor.to_string().into(),
        ];
        args.extend(["--data-dir".into(), data_dir.as_os_str().to_owned()]);
        for (flag, value) in [
            ("--workers", opts.workers.clone()),
            ("--connections", opts.connections.to_string()),
            ("--max-shake-qps", opts.max_shake_qps.to_string()),
            ("--max-queue-ms", opts.max_queue_ms.to_string()),
            ("--broadcast-yield-ms", opts.broadcast_yield_ms.to_string()),
            ("--secret", SECRET.to_string()),
        ] {
            args.extend([flag.into(), value.into()]);
        }
        let mut local = Local {
            child: Mutex::new(None),
            exe: std::env::current_exe()?,
            nice: opts.server_nice,
            args,
            addrs: Addrs {
                listen: any,
                admin: any,
                ws: (opts.transport == Transport::Ws).then_some(any),
                http: (opts.transport == Transport::Http).then_some(any),
            },
            data_dir: data_dir.to_path_buf(),
        };
        let (child, ready) = local.spawn()?;
        local.addrs = ready.addrs;
        *local.child.get_mut().unwrap() = Some(child);
        Ok(local)
    }

    /// Starts `hongbao serve` on `self.addrs` and waits for its ready line.
    fn spawn(&self) -> anyhow::Result<(Child, Ready)> {
        let mut command = Command::new(&self.exe);
        let server_nice = self.nice;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // setpriority(2), which is async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                if server_nice != 0 {
                    libc::setpriority(libc::PRIO_PROCESS, 0, server_nice);
                }
                Ok(())
            });
        }
        let a = &self.addrs;
        command.args(&self.args).args([
            "--listen",
            &a.listen.to_string(),
            "--admin",
            &a.admin.to_string(),
        ]);
        if let Some(ws) = a.ws {
            command.args(["--ws-listen", &ws.to_string()]);
        }
        if let Some(http) = a.http {
            command.args(["--http-listen", &http.to_string()]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting hongbao serve")?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let ready = rx
            .recv_timeout(READY_TIMEOUT)
            .context("hongbao serve did not become ready")
            .and_then(|line| Ready::parse(&line, a));
        match ready {
            Ok(ready) => Ok((child, ready)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// The running child's id.
    fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// SIGKILLs the server (its core and ledger writer with it), waits for its workers
    /// to go, and starts it again on the same addresses and ledger, trying until
    /// `timeout`. Says what happened.
    pub fn kill_and_restart(&self, timeout: Duration) -> String {
        let mut held = self.child.lock().unwrap();
        let Some(child) = held.as_mut() else {
            return "no supervisor to kill: the server was stopped".to_string();
        };
        let pid = child.id();
        // Its children are its workers (read here, not from `/v1/stats`, which a
        // worker just restarted may not be in yet).
        let worker_pids: Vec<u64> = hongbao_lab::children_of(pid)
            .into_iter()
            .map(u64::from)
            .filter(|&w| running(w))
            .collect();
        let t = Instant::now();
        let _ = child.kill();
        let _ = child.wait();
        *held = None;
        // Each worker ends when its link to the supervisor closes; one still up would
        // hold the listeners (and take connections) beside the new server's workers.
        let outlived = wait_gone(&worker_pids, Duration::from_secs(10));
        for &w in &outlived {
            // SAFETY: a signal to a worker of our own server, by its id.
            unsafe { libc::kill(w as i32, libc::SIGKILL) };
        }
        let workers = match outlived.len() {
            0 => format!("its {} workers exited", worker_pids.len()),
            n => format!(
                "{n} of its {} workers outlived it by 10 s and were SIGKILLed",
                worker_pids.len()
            ),
        };
        let killed = format!(
            "killed the supervisor {pid} (SIGKILL; the core and its ledger writer are in its process); {workers}"
        );
        let mut last_error = None;
        while t.elapsed() < timeout {
            match self.spawn() {
                Ok((child, ready)) if ready.addrs == self.addrs => {
                    *held = Some(child);
                    return format!(
                        "{killed}; up again on the same addresses after {:.1} s, {} events replayed from the ledger",
                        t.elapsed().as_secs_f64(),
                        ready.replayed_events
                    );
                }
                Ok((mut child, ready)) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_error = Some(format!("it bound {:?}, not {:?}", ready.addrs, self.addrs));
                }
                // An address not free yet: try again in a moment.
                Err(e) => last_error = Some(format!("{e:#}")),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        format!(
            "{killed}; not up again in {timeout:?}: {}",
            last_error.unwrap_or_default()
        )
    }

    /// Kills the server, if running, and keeps it from being started again.
    fn kill_for_good(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Asks the server to stop (SIGINT) and waits for it, for good.
    fn stop(&self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return Ok(());
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!("hongbao serve did not stop within 30 s")
    }
}

impl Ready {
    /// `hongbao serve ready: listen=… admin=… [ws=…] [http=…] … replayed_events=N`, with
    /// the listeners `asked` for.
    fn parse(line: &str, asked: &Addrs) -> anyhow::Result<Ready> {
        let field = |name: &str| -> anyhow::Result<&str> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
                .with_context(|| format!("no {name}= in {line:?}"))
        };
        let addr = |name: &str| -> anyhow::Result<SocketAddr> { Ok(field(name)?.parse()?) };
        Ok(Ready {
            addrs: Addrs {
                listen: addr("listen")?,
                admin: addr("admin")?,
                ws: asked.ws.map(|_| addr("ws")).transpose()?,
                http: asked.http.map(|_| addr("http")).transpose()?,
            },
            replayed_events: field("replayed_events")?.parse()?,
        })
    }
}

/// Waits until every process of `pids` is gone (or a zombie: it holds nothing) or
/// `timeout` passes; returns those still running.
fn wait_gone(pids: &[u64], timeout: Duration) -> Vec<u64> {
    let t = Instant::now();
    loop {
        let running: Vec<u64> = pids.iter().copied().filter(|&p| running(p)).collect();
        if running.is_empty() || t.elapsed() >= timeout {
            return running;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` is alive and not a zombie (`/proc/PID/stat`'s state).
fn running(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

impl Server {
    pub fn start(
        opts: &BenchOptions,
        data_dir: &Path,
        monitor: SocketAddr,
    ) -> anyhow::Result<Server> {
        if opts.hosts > 0 {
            return Server::start_lab(opts, monitor);
        }
        let local = Local::start(opts, data_dir, monitor)?;
        let a = local.addrs.clone();
        Ok(Server {
            local: Some(Arc::new(local)),
            lab: None,
            lab_dir: None,
            load_hosts: Vec::new(),
            _monitor_relay: None,
            admins: vec![a.admin],
            admin: a.admin,
            listen: a.listen,
            ws: a.ws,
            http: a.http,
        })
    }

    /// `opts.hosts` gateways in cluster mode on a lab's hosts, nginx in front: the load
    /// goes to nginx; the audit and campaigns to the first gateway. The gateways report
    /// to the bench's `monitor` through a relay on the lab's bridge.
    fn start_lab(opts: &BenchOptions, monitor: SocketAddr) -> anyhow::Result<Server> {
        let number = hongbao_lab::free_lab_number(std::process::id());
        let monitor_there =
            SocketAddr::from((hongbao_lab::netns::bridge_addr(number), monitor.port()));
        let serve_args = vec![
            "--max-shake-qps".to_string(),
            opts.max_shake_qps.to_string(),
            "--max-queue-ms".to_string(),
            opts.max_queue_ms.to_string(),
            "--broadcast-yield-ms".to_string(),
            opts.broadcast_yield_ms.to_string(),
            "--monitor".to_string(),
            monitor_there.to_string(),
        ];
        let lab = hongbao_lab::Lab::up(hongbao_lab::LabPlan {
            lab: number,
            dir: std::path::absolute(opts.out.join("lab"))?,
            gateways: opts.hosts,
            loads: match opts.procs {
                0 => LOAD_HOSTS,
                procs => LOAD_HOSTS.min(procs as usize),
            },
            nginx: true,
            hongbao: std::env::current_exe()?,
            gateway_workers: opts.workers.clone(),
            secret: SECRET.into(),
            serve_args,
            postgres_disk: opts
                .faults()
                .any(Fault::needs_postgres_disk)
                .then_some(POSTGRES_DISK_BYTES),
        })
        .context("bringing the lab up")?;
        // Interrupted (Ctrl-C, SIGTERM), the bench takes the lab down before it goes.
        let stop = hongbao_sys::Stop::on_signals()?;
        let lab_dir = lab.plan.dir.clone();
        std::thread::spawn(move || loop {
            if stop.requested() {
                match hongbao_lab::down(&lab_dir) {
                    Ok(state) => eprintln!("bench: interrupted; lab {} taken down", state.lab),
                    Err(e) => eprintln!("bench: interrupted; taking the lab down: {e:#}"),
                }
                std::process::exit(130);
            }
            std::thread::sleep(Duration::from_millis(100));
        });
        let (tcp, http, ws) = lab.nginx_addrs().context("the lab has no nginx")?;
        let admins: Vec<SocketAddr> = lab.gateways.iter().map(|g| g.admin()).collect();
        let load_hosts = lab.loads.clone();
        let relay = hongbao_lab::Relay::start(monitor_there, monitor)?;
        Ok(Server {
            load_hosts,
            _monitor_relay: Some(relay),
            local: None,
            admin: admins[0],
            admins,
            listen: tcp,
            ws: Some(ws),
            http: Some(http),
            lab_dir: Some(lab.plan.dir.clone()),
            lab: Some(Arc::new(Mutex::new(lab))),
        })
    }

    /// Injects `fault` `after` from now, on a thread of its own; what it did comes back
    /// on the handle. `None` for a lab's fault without a lab.
    pub fn inject_later(
        &self,
        fault: Fault,
        after: Duration,
    ) -> Option<std::thread::JoinHandle<String>> {
        if fault.needs_lab() && self.lab.is_none() {
            return None;
        }
        let injector = self.injector();
        Some(std::thread::spawn(move || {
            std::thread::sleep(after);
            injector.inject(fault, 0, false)
        }))
    }

    /// What can do faults to this server, for a thread of its own.
    pub fn injector(&self) -> Injector {
        Injector {
            lab: self.lab.clone(),
            local: self.local.clone(),
            admin: self.admin,
        }
    }

    /// The `hongbao serve` child's id (without a lab).
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.pid())
    }

    /// The lab (with `--hosts`).
    pub fn lab(&self) -> Option<Arc<Mutex<hongbao_lab::Lab>>> {
        self.lab.clone()
    }

    /// The lab's engine counters (with `--hosts`), `None` without a lab or if they cannot
    /// be read.
    pub fn engine_counters(&self) -> Option<hongbao_lab::EngineCounters> {
        let lab = self.lab.as_ref()?.lock().unwrap();
        lab.engine_counters()
            .map_err(|e| eprintln!("bench: the engines' counters: {e:#}"))
            .ok()
    }

    /// One sample over every gateway: rates, memory and CPU summed.
    pub fn sample(&self) -> anyhow::Result<ServerSample> {
        sample_all(&self.admins).context("no /v1/stats from the gateways")
    }

    /// `GET path` of the admin API. Asked again for up to 30 s while the answer is 503
    /// or no answer (a lab's ledger restarting).
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let url = format!("http://{}{path}", self.admin);
        self.retrying(path, || {
            ureq::get(&url)
                .timeout(Duration::from_secs(15))
                .call()
                .map_err(Box::new)
        })
    }

    pub fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<T> {
        let url = format!("http://{}{path}", self.admin);
        let body = serde_json::to_value(body)?;
        self.retrying(path, || {
            ureq::post(&url)
                .timeout(Duration::from_secs(15))
                .send_json(body.clone())
                .map_err(Box::new)
        })
    }

    fn retrying<T: DeserializeOwned>(
        &self,
        path: &str,
        mut ask: impl FnMut() -> Result<ureq::Response, Box<ureq::Error>>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let error = match ask() {
                Ok(r) => return Ok(r.into_json()?),
                Err(e) => *e,
            };
            match error {
                ureq::Error::Status(503, _) | ureq::Error::Transport(_)
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                ureq::Error::Status(code, r) => {
                    bail!("{path}: {code} {}", r.into_string()?)
                }
                e => return Err(e.into()),
            }
        }
    }

    /// Asks the server to stop (SIGINT) and waits for it; a lab is taken down.
    pub fn stop(mut self) -> anyhow::Result<()> {
        // The last holder: the fault thread, if any, was joined.
        drop(self.lab.take());
        match &self.local {
            Some(local) => local.stop(),
            None => Ok(()),
        }
    }
}

/// `/v1/stats` of every gateway in `admins` that answers, summed into one sample.
pub(super) fn sample_all(admins: &[SocketAddr]) -> Option<ServerSample> {
    let mut total: Option<ServerSample> = None;
    for admin in admins {
        let url = format!("http://{admin}/v1/stats");
        // A gateway that does not answer (killed on purpose) is left out.
        let Some(v) = ureq::get(&url)
            .timeout(Duration::from_secs(5))
            .call()
            .ok()
            .and_then(|r| r.into_json::<Value>().ok())
        else {
            continue;
        };
        let s = sample(&v);
        total = Some(match total {
            None => s,
            Some(t) => ServerSample {
                unix_ms: t.unix_ms,
                shakes_per_sec: t.shakes_per_sec + s.shakes_per_sec,
                rss_bytes: t.rss_bytes + s.rss_bytes,
                cpu_ms: t.cpu_ms + s.cpu_ms,
            },
        });
    }
    total
}

/// One sample of the server's `/v1/stats`, taken once a second.
#[derive(Debug, Clone)]
pub(crate) struct ServerSample {
    pub unix_ms: u64,
    pub shakes_per_sec: u64,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
}

pub(super) fn sample(stats: &Value) -> ServerSample {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let workers = stats["workers"].as_array().cloned().unwrap_or_default();
    let rss =
        workers.iter().map(|w| n(&w["rss_bytes"])).sum::<u64>() + n(&stats["core"]["rss_bytes"]);
    let cpu = workers.iter().map(|w| n(&w["cpu_ms"])).sum::<u64>() + n(&stats["core"]["cpu_ms"]);
    ServerSample {
        unix_ms: n(&stats["unix_ms"]),
        shakes_per_sec: n(&stats["per_sec"]["shakes"]),
        rss_bytes: rss,
        cpu_ms: cpu,
    }
}
