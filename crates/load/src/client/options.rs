//! What a client process is told: its options, on its command line as JSON from the
//! coordinator, and the coordinator's commands, one JSON line each on its stdin.

use std::net::{Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::transport::{self, HttpConnection, Transport};

/// How long a simulated user told "overloaded" stops shaking when the answer does not say.
pub const DEFAULT_OVERLOAD_BACKOFF_SECS: u32 = 30;

fn default_connect_timeout_ms() -> u64 {
    super::DEFAULT_CONNECT_TIMEOUT_MS
}

/// How often an HTTP user looks for packets to open (it gets no pushes).
pub const DEFAULT_NOTICE_POLL_SECS: u32 = 5;

/// Everything a client process needs, passed by the coordinator on its command line as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientOptions {
    pub proc_index: u32,
    pub procs: u32,
    pub server: SocketAddr,
    /// All users of the run (U) and the id of user index 0.
    pub users: u64,
    pub first_user: u64,
    pub qps: u64,
    /// Unix time (ms) of schedule second 0, shared by all processes.
    pub epoch_ms: u64,
    /// Source addresses this process binds its connections to, round-robin.
    pub source_ips: Vec<Ipv4Addr>,
    /// New connections per second for this process...
    pub connect_rate: u64,
    /// ...or none of that: every user connects at once, and each one that fails comes
    /// back on its own back-off (`backoff.rs`), as a crowd of app clients does at
    /// midnight (`--connect-mode storm`).
    #[serde(default)]
    pub connect_storm: bool,
    /// How long a user waits for its connection — the TCP connect, the TLS handshake and
    /// the WebSocket upgrade together — before it gives up and comes back on its back-off.
    /// In a storm it waits in the server's accept queue meanwhile: a client that gives up
    /// there has made its key share for nothing, and makes another next time.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    pub secret: String,
    /// How its users' login tokens are signed (the secret's HS256 key by default).
    #[serde(default)]
    pub signer: Signer,
    /// TLS to the server (every transport), trusting this CA (PEM); none: plain.
    #[serde(default)]
    pub tls_ca: Option<String>,
    /// The coordinator's clock minus this machine's, µs: an agent's client runs the
    /// schedule at `epoch_ms` of the coordinator's clock (0 on the coordinator's machine).
    #[serde(default)]
    pub clock_offset_us: i64,
    /// Unix ms from which to start connecting (0: at once).
    pub connect_from_ms: u64,
    /// Raw TCP, or WebSocket to the server's `--ws-listen` address.
    #[serde(default)]
    pub transport: Transport,
    /// A user answered "overloaded" skips its shakes for the wait the answer names
    /// (`retry_after_ms`), or for this many seconds when it names none, ±50% either way,
    /// as the app does ("too many people, try again shortly"); 0 keeps shaking.
    #[serde(default)]
    pub overload_backoff_secs: u32,
    /// HTTP: one keep-alive connection per user, or a new connection for every request
    /// (the short-connection cases).
    #[serde(default)]
    pub http_connection: HttpConnection,
    /// HTTP: each user looks for packets to open every this many seconds; 0 never.
    #[serde(default)]
    pub notice_poll_secs: u32,
    /// HTTP: a request of the user's own sent for each firing instead of a shake
    /// (`hongbao capacity` against nginx's static answer or an external target).
    #[serde(default)]
    pub request: Option<transport::RequestTemplate>,
}

/// The key a load process signs its users' login tokens with: the run's secret as HS256
/// key `hongbao` (what `serve` makes of the same secret), or a private key (PEM) of the
/// app server's, by `kid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signer {
    pub kid: String,
    pub alg: hongbao_proto::token::Alg,
    /// ES256 and EdDSA: the private key's PEM (PKCS#8). HS256: empty, the secret.
    pub private_key_pem: String,
    /// How long each token lives; the server asks for a fresh one before it ends.
    pub ttl_secs: u64,
}

impl Default for Signer {
    fn default() -> Signer {
        Signer {
            kid: hongbao_proto::token::DEFAULT_KID.into(),
            alg: hongbao_proto::token::Alg::HS256,
            private_key_pem: String::new(),
            ttl_secs: 3600,
        }
    }
}

impl Signer {
    /// The minter of these tokens, with `secret` for HS256.
    pub fn minter(&self, secret: &str) -> crate::Result<hongbao_proto::token::Minter> {
        let material = match self.alg {
            hongbao_proto::token::Alg::HS256 => secret.as_bytes(),
            _ => self.private_key_pem.as_bytes(),
        };
        hongbao_proto::token::Minter::new(&self.kid, self.alg, material)
            .map_err(|e| crate::Error::Config(e.to_string()))
    }
}

/// Commands from the coordinator, one JSON object per stdin line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    SetQps {
        from_second: u64,
        qps: u64,
    },
    /// The coordinator's clock was measured again (agents): the schedule moves onto it.
    Clock {
        offset_us: i64,
    },
    Stop,
}

/// Starts `command` (a `hongbao` binary, maybe entered into a lab host) as a client
/// process and gives it `options` as the first line on its stdin — a command line is
/// seen by every local user, and the login secret is among them. Its stdin (for the
/// commands) and stdout (its reports) come back piped.
pub fn start_process(
    mut command: std::process::Command,
    options: &ClientOptions,
) -> crate::Result<(
    std::process::Child,
    std::process::ChildStdin,
    std::process::ChildStdout,
)> {
    use crate::Error;
    use std::io::Write;
    use std::process::Stdio;
    let mut child = command
        .arg("load-client")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("starting a load client process", e))?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all((serde_json::to_string(options)? + "\n").as_bytes())
        .map_err(|e| Error::io("giving a load client its options", e))?;
    let stdout = child.stdout.take().expect("piped");
    Ok((child, stdin, stdout))
}
