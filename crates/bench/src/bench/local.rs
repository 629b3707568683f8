//! The bench's one local server: a `hongbao serve` child on ephemeral ports with its own
//! ledger. Killed by `supervisor-kill`, it is started again on the ports it first bound,
//! over the same ledger. `server.rs` holds it (or a lab) as the bench's server, and
//! `inject.rs` kills and restarts it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use super::options::{BenchOptions, SECRET};
use hongbao_load::transport::Transport;
use hongbao_server::config::ServeFlags;
use hongbao_telemetry::reporter::MONITOR_KEY_ENV;

use crate::Error;

/// How long a `hongbao serve` child has to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The addresses a local server listens on: asked for (":0" for any port) or bound.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Addrs {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub ws: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
}

/// One local `hongbao serve`: the child running now, and how to start it again on the
/// same addresses and ledger (`supervisor-kill`'s heal).
pub(crate) struct Local {
    /// `None` once the bench has stopped it for good. Held through a whole kill and
    /// restart, so the bench's own stop waits for a restart under way.
    child: Mutex<Option<Child>>,
    exe: PathBuf,
    nice: i32,
    /// Its flags but the addresses.
    flags: ServeFlags,
    /// The bench's monitor's key, in its environment.
    monitor_key: String,
    /// The addresses it bound the first time, asked for again by every restart.
    pub addrs: Addrs,
    pub data_dir: PathBuf,
    /// `--upgrade-to`: the binary an upgrade starts (else this one).
    pub upgrade_to: Option<PathBuf>,
    /// What the last upgrade did, as the new server said.
    pub last_upgrade: Mutex<Option<Upgraded>>,
}

/// What an upgrade did (`hongbao serve upgraded: …`, the new server's stdout line once
/// the ledger is its), for the summary.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Upgraded {
    /// The connections the old server let go, and the window it let them go over.
    pub drained_connections: u64,
    pub drain_window_ms: u64,
    /// How long the old server's drain took.
    pub drain_ms: u64,
    /// How long commits paused while the ledger passed from the old core to the new.
    pub commits_paused_ms: f64,
    /// The events the new server replayed from the ledger.
    pub replayed_events: u64,
    /// From starting the new binary until the old one had exited and the new one held
    /// the ledger.
    pub took_ms: u64,
}

impl Upgraded {
    fn parse(line: &str) -> crate::Result<Upgraded> {
        Ok(Upgraded {
            drained_connections: field(line, "drained_connections")?,
            drain_window_ms: field(line, "drain_window_ms")?,
            drain_ms: field(line, "drain_ms")?,
            commits_paused_ms: field(line, "commits_paused_ms")?,
            replayed_events: field(line, "replayed_events")?,
            took_ms: 0,
        })
    }
}

/// What a started `hongbao serve` said in its ready line.
struct Ready {
    addrs: Addrs,
    replayed_events: u64,
}

impl Local {
    pub(super) fn start(
        opts: &BenchOptions,
        data_dir: &Path,
        monitor: SocketAddr,
        monitor_key: &str,
    ) -> crate::Result<Local> {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let flags = ServeFlags {
            monitor: Some(monitor.to_string()),
            data_dir: Some(data_dir.to_path_buf()),
            secret: Some(SECRET.into()),
            ..opts.serve_settings()
        };
        let mut local = Local {
            child: Mutex::new(None),
            exe: match &opts.upgrade_from {
                Some(from) => from.clone(),
                None => this_binary()?,
            },
            nice: opts.server_nice,
            monitor_key: monitor_key.to_string(),
            flags,
            addrs: Addrs {
                listen: any,
                admin: any,
                ws: (opts.transport == Transport::Ws).then_some(any),
                http: (opts.transport == Transport::Http).then_some(any),
            },
            data_dir: data_dir.to_path_buf(),
            upgrade_to: opts.upgrade_to.clone(),
            last_upgrade: Mutex::new(None),
        };
        let (child, ready, _) = local.spawn(&local.exe, false)?;
        local.addrs = ready.addrs;
        *local.child.get_mut().unwrap() = Some(child);
        Ok(local)
    }

    /// Starts `exe serve` on `self.addrs` (taking the running one over, with `upgrade`)
    /// and waits for its ready line; the lines it prints after come on the receiver.
    fn spawn(
        &self,
        exe: &Path,
        upgrade: bool,
    ) -> crate::Result<(Child, Ready, mpsc::Receiver<String>)> {
        let mut command = Command::new(exe);
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
        let flags = ServeFlags {
            listen: Some(a.listen.to_string()),
            admin: Some(a.admin.to_string()),
            ws_listen: a.ws.map(|ws| ws.to_string()),
            http_listen: a.http.map(|http| http.to_string()),
            ..self.flags.clone()
        };
        command.arg("serve");
        flags.apply(&mut command);
        if upgrade {
            command.arg("--upgrade");
        }
        command.env(MONITOR_KEY_ENV, &self.monitor_key);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io("starting hongbao serve", e))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let ready = rx
            .recv_timeout(READY_TIMEOUT)
            .map_err(|e| Error::Failed(format!("hongbao serve did not become ready: {e}")))
            .and_then(|line| Ready::parse(&line, a));
        match ready {
            Ok(ready) => Ok((child, ready, rx)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// The running child's id.
    pub(super) fn pid(&self) -> Option<u32> {
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
            match self.spawn(&self.exe, false) {
                Ok((child, ready, _)) if ready.addrs == self.addrs => {
                    *held = Some(child);
                    return format!(
                        "{killed}; up again on the same addresses after {:.1} s, {} events replayed from the ledger",
                        t.elapsed().as_secs_f64(),
                        ready.replayed_events
                    );
                }
                Ok((mut child, ready, _)) => {
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

    /// Upgrades the server in place (`serve --upgrade`, docs/deploy.md): the binary of
    /// `--upgrade-to` (or this one) takes the running one's sockets, the old one drains
    /// to it and hands it the ledger. The new process is the bench's server from then
    /// on. Says what happened; what it did is kept in `last_upgrade`.
    pub fn upgrade(&self, timeout: Duration) -> String {
        let mut held = self.child.lock().unwrap();
        let Some(old) = held.as_mut() else {
            return "no server to upgrade: it was stopped".to_string();
        };
        let old_pid = old.id();
        let exe = match &self.upgrade_to {
            Some(to) => to.clone(),
            // This one (not the one it started on, which `--upgrade-from` may have named).
            None => match std::env::current_exe() {
                Ok(exe) => exe,
                Err(e) => return format!("upgrade: which binary is this: {e}"),
            },
        };
        let t = Instant::now();
        let (new, ready, lines) = match self.spawn(&exe, true) {
            Ok(started) => started,
            Err(e) => return format!("upgrade: {} did not start: {e:#}", exe.display()),
        };
        if ready.addrs != self.addrs {
            return format!(
                "upgrade: the new server said {:?}, not {:?}",
                ready.addrs, self.addrs
            );
        }
        let new_pid = new.id();
        // The old one drains to the new, hands it the ledger and exits.
        let exited = loop {
            match old.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if t.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
                _ => break None,
            }
        };
        let old = held.replace(new);
        drop(old);
        let Some(status) = exited else {
            return format!("upgrade: the old server {old_pid} had not stopped after {timeout:?}");
        };
        let left = timeout
            .saturating_sub(t.elapsed())
            .max(Duration::from_secs(5));
        let line = lines
            .recv_timeout(left)
            .ok()
            .filter(|l| l.starts_with("hongbao serve upgraded:"));
        let Some(line) = line else {
            return format!("upgrade: the old server {old_pid} exited ({status}), but the new one {new_pid} never said it holds the ledger");
        };
        match Upgraded::parse(&line) {
            Ok(mut done) => {
                done.took_ms = t.elapsed().as_millis() as u64;
                let what = format!(
                    "upgraded to {} (pid {old_pid} -> {new_pid}): {} connections drained over a {} ms window in {} ms, commits paused {:.1} ms, {} events replayed; {} ms in all",
                    exe.display(),
                    done.drained_connections,
                    done.drain_window_ms,
                    done.drain_ms,
                    done.commits_paused_ms,
                    done.replayed_events,
                    done.took_ms
                );
                *self.last_upgrade.lock().unwrap() = Some(done);
                what
            }
            Err(e) => format!("upgrade: {e:#}"),
        }
    }

    /// Kills the server, if running, and keeps it from being started again.
    pub(super) fn kill_for_good(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Asks the server to stop (SIGINT) and waits for it, for good.
    pub(super) fn stop(&self) -> crate::Result<()> {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return Ok(());
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let exited = child
                .try_wait()
                .map_err(|e| Error::io("waiting for hongbao serve", e))?;
            if exited.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(Error::Failed(
            "hongbao serve did not stop within 30 s".into(),
        ))
    }
}

impl Ready {
    /// `hongbao serve ready: listen=… admin=… [ws=…] [http=…] … replayed_events=N`, with
    /// the listeners `asked` for.
    fn parse(line: &str, asked: &Addrs) -> crate::Result<Ready> {
        let addr = |name: &str| field::<SocketAddr>(line, name);
        Ok(Ready {
            addrs: Addrs {
                listen: addr("listen")?,
                admin: addr("admin")?,
                ws: asked.ws.map(|_| addr("ws")).transpose()?,
                http: asked.http.map(|_| addr("http")).transpose()?,
            },
            replayed_events: field(line, "replayed_events")?,
        })
    }
}

/// This binary, which the bench's servers (and an upgrade, a lab's gateways) run unless
/// told.
pub(super) fn this_binary() -> crate::Result<PathBuf> {
    std::env::current_exe().map_err(|e| Error::io("which binary is this", e))
}

/// The value of `NAME=value` in a line the server printed (`hongbao serve ready: …`,
/// `hongbao serve upgraded: …`).
fn field<T>(line: &str, name: &str) -> crate::Result<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let value = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .ok_or_else(|| Error::Answer(format!("no {name}= in {line:?}")))?;
    value
        .parse()
        .map_err(|e| Error::Answer(format!("{name}={value} in {line:?}: {e}")))
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
