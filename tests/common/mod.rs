//! What the integration tests share: running `hongbao` subcommands, reading their output,
//! `hongbao serve` started by one builder (`Serve`), its admin API, one WebSocket client,
//! `hongbao bench` run to its summary, waiting; `wire`: what the serve tests say and
//! expect on the wire. Each test file compiles its own copy and uses part of it.
#![allow(dead_code)]

mod admin;
mod bench;
mod serve;
pub mod wire;
mod ws;

use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// Each test file uses some of these.
#[allow(unused_imports)]
pub use admin::Admin;
#[allow(unused_imports)]
pub use bench::{assert_faults_cost_nothing, bench_summary, run_bench};
#[allow(unused_imports)]
pub use serve::{bearer, login, token, Serve, Server};
#[allow(unused_imports)]
pub use ws::{fresh_key, WsClient, WsEvent};

/// How long a process may take to print its ready line.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a process may take to exit after SIGINT (a monitor draws its report).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Read/write timeout of every test socket and client: long enough for a loaded 2-core
/// machine, short enough that a missing reply fails the test rather than hanging it.
/// A test that expects silence sets a shorter timeout of its own where it waits for it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The secret `Serve` starts a server with, unless told another (or the built-in one).
pub const SECRET: &str = "hongbao-test-secret";

/// A running `hongbao` subcommand: SIGKILLed when dropped. Its stdout is drained line by
/// line into a channel (so it never blocks writing), its stderr into a log that is
/// printed if the test fails.
pub struct Hongbao {
    pub what: &'static str,
    pub child: Child,
    pub stdout: Receiver<String>,
    pub stderr: Arc<Mutex<String>>,
}

impl Drop for Hongbao {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "----- hongbao {} stderr -----\n{}-----",
                self.what,
                self.log()
            );
        }
    }
}

impl Hongbao {
    pub fn spawn(what: &'static str, args: &[&str]) -> Hongbao {
        Hongbao::spawn_from(env!("CARGO_BIN_EXE_hongbao").as_ref(), what, args)
    }

    /// As `spawn`, from the binary at `exe`.
    pub fn spawn_from(exe: &std::path::Path, what: &'static str, args: &[&str]) -> Hongbao {
        let mut command = Command::new(exe);
        command.args(args);
        Hongbao::start(what, command)
    }

    /// Runs `command` (a `hongbao` command line, its environment set as the test wants)
    /// without `HONGBAO_SECRET`, its stdin closed and its output piped.
    pub fn start(what: &'static str, mut command: Command) -> Hongbao {
        // The runner's own secret stays out, unless the test gives one.
        if !command.get_envs().any(|(k, _)| k == "HONGBAO_SECRET") {
            command.env_remove("HONGBAO_SECRET");
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting hongbao {what}: {e}"));
        let stderr = log_lines(child.stderr.take().unwrap());
        let stdout = lines_of(child.stdout.take().unwrap());
        Hongbao {
            what,
            child,
            stdout,
            stderr,
        }
    }

    /// The first stdout line, which must start with `prefix`.
    pub fn ready_line(&self, prefix: &str) -> String {
        let line = self
            .stdout
            .recv_timeout(START_TIMEOUT)
            .unwrap_or_else(|e| panic!("hongbao {} printed no ready line: {e}", self.what));
        assert!(line.starts_with(prefix), "unexpected first line: {line:?}");
        line
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process (and any it started with the same stderr) wrote on stderr so far,
    /// whole lines only.
    pub fn log(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let what = format!("hongbao {} to exit", self.what);
        wait_until(&what, timeout, || self.child.try_wait().unwrap())
    }

    /// SIGINT, then waits for the exit, which must be clean.
    pub fn interrupt(&mut self) {
        signal(self.pid(), "-INT");
        let status = self.wait_exit(STOP_TIMEOUT);
        assert!(
            status.success(),
            "hongbao {} exited with {status}",
            self.what
        );
    }

    /// Every stdout line not read yet, up to the end of the stream (call after the exit).
    pub fn rest_of_stdout(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(RecvTimeoutError::Disconnected) => return lines,
                Err(RecvTimeoutError::Timeout) => panic!("stdout of {} never ended", self.what),
            }
        }
    }
}

/// `hongbao monitor --listen 127.0.0.1:0 --out DIR`, and the address it bound.
pub fn start_monitor(out: &std::path::Path) -> (Hongbao, SocketAddr) {
    let key_file = monitor_key_file(out);
    std::fs::create_dir_all(out).unwrap();
    let (out, key_file) = (out.to_str().unwrap(), key_file.to_str().unwrap());
    let monitor = Hongbao::spawn(
        "monitor",
        &[
            "monitor",
            "--listen",
            "127.0.0.1:0",
            "--out",
            out,
            "--key-file",
            key_file,
        ],
    );
    let ready = monitor.ready_line("hongbao monitor ready: ");
    let addr: SocketAddr = field(&ready, "listen").parse().unwrap();
    assert_ne!(addr.port(), 0, "{ready}");
    assert_eq!(field(&ready, "out"), out);
    assert!(
        ready.ends_with(&format!("(dashboard http://{addr}/)")),
        "{ready}"
    );
    assert_eq!(field(&ready, "key"), key_file);
    (monitor, addr)
}

/// Where `start_monitor` has the monitor keep its key: the file `serve --monitor` and
/// `load --monitor` are pointed at (`--monitor-key-file`).
pub fn monitor_key_file(out: &std::path::Path) -> std::path::PathBuf {
    out.join("monitor.key")
}

/// The key of the monitor `start_monitor` started with `out`.
pub fn monitor_key(out: &std::path::Path) -> String {
    std::fs::read_to_string(monitor_key_file(out))
        .expect("the monitor's key file")
        .trim()
        .to_string()
}

/// `name=VALUE` from a ready line.
pub fn field(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        .to_string()
}

/// The value of header `name` (in any case) in an HTTP response head: the status line,
/// then `Name: value` lines.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// A pipe's lines, as they come, on a channel.
pub fn lines_of(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// A pipe's lines, collected into one log.
pub fn log_lines(pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut sink = sink.lock().unwrap();
            sink.push_str(&line);
            sink.push('\n');
        }
    });
    log
}

/// `kill SIGNAL PID`, which must succeed.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// Polls `f` every 20 ms until it gives a value; fails the test after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a read or write error says the peer closed the connection.
pub fn is_closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}

/// Every process descended from `pid` (children, their children…), from /proc.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found
}

/// Whether `client`'s connection still answers a ping with a pong (it is open and its
/// session stands).
pub fn pings(client: &mut hongbao_proto::client::Client) -> bool {
    matches!(
        client
            .request(&hongbao_proto::Message::Ping { client_time_us: 1 })
            .map(|f| f.message),
        Ok(hongbao_proto::Message::Pong { .. })
    )
}

/// Whether the tests run as root (the lab's namespaces, tmpfs mounts).
/// Why a lab with a standby cannot come up here, if it cannot: pg_autoctl is missing
/// (panics instead where CI installed it, `HONGBAO_REQUIRE_DEPLOY_TOOLS=1`).
pub fn missing_pg_autoctl() -> Option<String> {
    if std::path::Path::new("/usr/bin/pg_autoctl").exists() {
        return None;
    }
    let install = "apt-get install pg-auto-failover-cli postgresql-15-auto-failover";
    if std::env::var_os("HONGBAO_REQUIRE_DEPLOY_TOOLS").is_some_and(|v| v == "1") {
        panic!("pg_autoctl is required here (HONGBAO_REQUIRE_DEPLOY_TOOLS=1) and is not installed: {install}");
    }
    Some(format!("pg_autoctl is not installed ({install})"))
}

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A loopback port free a moment ago (bound and let go).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
