//! `hongbao serve` under test. The `Serve` builder starts it on ephemeral ports of
//! 127.0.0.1 (the binary protocol and the admin API, and the WebSocket and HTTP listeners
//! when asked), with two workers, `SECRET` and its ledger in a temporary directory unless
//! told otherwise; the `Server` it gives back holds the addresses its ready line named,
//! and SIGKILLs it when dropped (its stderr, and its workers', is printed if the test
//! fails).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hongbao_proto::client::Client;
use hongbao_proto::token::{Minter, DEFAULT_KID, DEV_SECRET};
use hongbao_proto::ResultCode;
use serde_json::Value;

use super::{field, wait_until, Admin, Hongbao, WsClient, IO_TIMEOUT, SECRET};

/// The limits per user off: the tests of other things drive one user far past what a
/// person does (a tight loop of shakes, logins, sends). tests/sessions.rs tests the limits
/// themselves, with a `[user_limits]` of its own (a test's config with one keeps it).
const NO_USER_LIMITS: &str = "[user_limits]
shake = { per_sec = 0.0, burst = 0 }
send = { per_sec = 0.0, burst = 0 }
open = { per_sec = 0.0, burst = 0 }
chat = { per_sec = 0.0, burst = 0 }
login = { per_sec = 0.0, burst = 0 }
notices_per_minute = 0
";

/// How to start `hongbao serve`; `start` starts it.
pub struct Serve {
    exe: PathBuf,
    workers: usize,
    /// `None`: no `--secret`, so the built-in development secret.
    secret: Option<String>,
    ws: bool,
    http: bool,
    data_dir: Option<PathBuf>,
    config: Option<String>,
    args: Vec<String>,
    env_remove: Vec<&'static str>,
    env: Vec<(String, String)>,
}

impl Default for Serve {
    fn default() -> Serve {
        Serve::new()
    }
}

impl Serve {
    /// Two workers, `SECRET`, the binary protocol and the admin API only.
    pub fn new() -> Serve {
        Serve {
            exe: env!("CARGO_BIN_EXE_hongbao").into(),
            workers: 2,
            secret: Some(SECRET.into()),
            ws: false,
            http: false,
            data_dir: None,
            config: None,
            args: Vec::new(),
            env_remove: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn workers(mut self, workers: usize) -> Serve {
        self.workers = workers;
        self
    }

    /// A secret other than `SECRET`.
    pub fn secret(mut self, secret: &str) -> Serve {
        self.secret = Some(secret.into());
        self
    }

    /// No `--secret`: the built-in development secret.
    pub fn dev_secret(mut self) -> Serve {
        self.secret = None;
        self
    }

    /// The demo log-in (`--demo-login`): `GET /token?user=N` hands out any user's token.
    pub fn demo_login(self) -> Serve {
        self.args(["--demo-login"])
    }

    /// A WebSocket listener (`--ws-listen`).
    pub fn ws(mut self) -> Serve {
        self.ws = true;
        self
    }

    /// TLS on every listener, with the certificate and key in `files`.
    pub fn tls(self, files: &hongbao_http::tls::TlsFiles) -> Serve {
        self.args([
            "--tls-cert".to_string(),
            files.cert.display().to_string(),
            "--tls-key".to_string(),
            files.key.display().to_string(),
        ])
    }

    /// The HTTP API (`--http-listen`).
    pub fn http(mut self) -> Serve {
        self.http = true;
        self
    }

    /// The ledger in `dir` (which outlives the server, for a restart on the same ledger)
    /// instead of a temporary directory of the server's own.
    pub fn data_dir(mut self, dir: &Path) -> Serve {
        self.data_dir = Some(dir.to_path_buf());
        self
    }

    /// A configuration file with `toml` in it (`--config`).
    pub fn config(mut self, toml: &str) -> Serve {
        self.config = Some(toml.into());
        self
    }

    /// More arguments, after the builder's own (a flag given twice takes its last value).
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Serve {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// The binary at `exe` rather than the one cargo built.
    pub fn exe(mut self, exe: &Path) -> Serve {
        self.exe = exe.to_path_buf();
        self
    }

    /// Sets `name` to `value` in the server's environment.
    pub fn env(mut self, name: &str, value: &str) -> Serve {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Leaves `name` out of the server's environment.
    pub fn env_remove(mut self, name: &'static str) -> Serve {
        self.env_remove.push(name);
        self
    }

    /// Starts the server and waits for its ready line.
    pub fn start(self) -> Server {
        let root = tempfile::tempdir().expect("a temporary directory");
        let data_dir = self.data_dir.unwrap_or_else(|| root.path().join("data"));
        let workers = self.workers.to_string();
        let mut command = Command::new(&self.exe);
        command.args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
        if self.ws {
            command.args(["--ws-listen", "127.0.0.1:0"]);
        }
        if self.http {
            command.args(["--http-listen", "127.0.0.1:0"]);
        }
        command.args(["--workers", &workers]);
        // The secret out of sight, as a deployment gives it (not on the command line).
        if let Some(secret) = &self.secret {
            command.env("HONGBAO_SECRET", secret);
        }
        command.arg("--data-dir").arg(&data_dir);
        let toml = match &self.config {
            Some(toml) if toml.contains("[user_limits]") => toml.clone(),
            Some(toml) => format!("{toml}\n{NO_USER_LIMITS}"),
            None => NO_USER_LIMITS.to_string(),
        };
        let path = root.path().join("serve.toml");
        std::fs::write(&path, toml).unwrap();
        command.arg("--config").arg(path);
        command.args(&self.args);
        for name in &self.env_remove {
            command.env_remove(name);
        }
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let process = Hongbao::start("serve", command);
        let ready = process.ready_line("hongbao serve ready: ");
        let addr = |name: &str| -> SocketAddr {
            let addr: SocketAddr = field(&ready, name).parse().unwrap();
            assert_ne!(addr.port(), 0, "{ready}");
            addr
        };
        // The operator key a fresh server makes for itself.
        let key = std::fs::read_to_string(data_dir.join("admin.key"))
            .map(|k| k.trim().to_string())
            .ok();
        let (listen, admin) = (addr("listen"), Admin::new(addr("admin"), key));
        let ws = self.ws.then(|| addr("ws"));
        let http = self.http.then(|| addr("http"));
        assert_eq!(field(&ready, "workers"), workers, "{ready}");
        let replayed_events = field(&ready, "replayed_events").parse().unwrap();
        Server {
            process,
            listen,
            admin,
            ws,
            http,
            workers: self.workers,
            data_dir,
            replayed_events,
            secret: self.secret.unwrap_or_else(|| DEV_SECRET.into()),
            ready,
            _root: root,
        }
    }
}

/// A running `hongbao serve`; `server.get(…)`, `server.audit()`… are its admin API's.
pub struct Server {
    /// Killed when dropped, before the temporary directory goes.
    pub process: Hongbao,
    /// The binary protocol's address.
    pub listen: SocketAddr,
    pub admin: Admin,
    ws: Option<SocketAddr>,
    http: Option<SocketAddr>,
    pub workers: usize,
    pub data_dir: PathBuf,
    pub replayed_events: u64,
    /// The secret it signs tokens with.
    pub secret: String,
    /// Its ready line, as printed.
    pub ready: String,
    _root: tempfile::TempDir,
}

impl std::ops::Deref for Server {
    type Target = Admin;
    fn deref(&self) -> &Admin {
        &self.admin
    }
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The WebSocket listener's address (`Serve::ws`).
    pub fn ws_addr(&self) -> SocketAddr {
        self.ws
            .expect("serve was started without a WebSocket listener")
    }

    /// The HTTP API's address (`Serve::http`).
    pub fn http_addr(&self) -> SocketAddr {
        self.http.expect("serve was started without the HTTP API")
    }

    /// A binary-protocol client, not logged in.
    pub fn connect(&self) -> Client {
        let mut client = Client::connect(self.listen).expect("connecting to the server");
        client.set_timeout(IO_TIMEOUT).unwrap();
        client
    }

    /// A binary-protocol client logged in as `user` with a token of the server's secret.
    pub fn login(&self, user: u64) -> Client {
        login(self.listen, user, &self.secret)
    }

    /// `Bearer TOKEN` for the HTTP API.
    pub fn bearer(&self, user: u64) -> String {
        bearer(&self.secret, user)
    }

    /// An upgraded WebSocket client that has sent nothing yet.
    pub fn ws_connect(&self) -> WsClient {
        WsClient::connect(self.ws_addr(), &self.secret)
    }

    /// The stats' workers, once every worker has reported (once a second).
    pub fn workers_reported(&self) -> Vec<Value> {
        wait_until("every worker to report", Duration::from_secs(10), || {
            let workers = self.stats_workers();
            (workers.len() == self.workers).then_some(workers)
        })
    }

    /// The pids of the workers, once every one has reported.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.workers_reported()
            .iter()
            .map(|w| w["pid"].as_u64().unwrap() as u32)
            .collect()
    }

    /// SIGINT, then waits for a clean exit.
    pub fn stop(&mut self) {
        self.process.interrupt();
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn crash(&mut self) {
        self.process.child.kill().unwrap();
        self.process.child.wait().unwrap();
    }
}

/// A login token (a JWT) for `user`, signed as a server with `secret` and no
/// `[[login_keys]]` verifies it (HS256, kid `hongbao`), issued now, living an hour.
pub fn token(secret: &str, user: u64) -> String {
    let now = hongbao_sys::clock::unix_ms() / 1000;
    Minter::hs256(DEFAULT_KID, secret.as_bytes()).mint_for(user, now, 3600)
}

/// A binary-protocol client at `addr` logged in as `user` with a token of `secret`.
pub fn login(addr: SocketAddr, user: u64, secret: &str) -> Client {
    let mut client = Client::connect(addr).expect("connecting over TCP");
    client.set_timeout(IO_TIMEOUT).unwrap();
    let result = client.login(&token(secret, user)).expect("login");
    assert_eq!(result, ResultCode::Ok, "login of user {user}");
    client
}

/// `Bearer TOKEN`, the HTTP API's `Authorization` for `user`.
pub fn bearer(secret: &str, user: u64) -> String {
    format!("Bearer {}", token(secret, user))
}
