//! A capacity plan (docs/capacity.md): the SLO, the load, the stages and their steps, and
//! the target to plan for. Read from TOML; everything is checked before anything starts,
//! so a bad plan costs nothing but its error.

use std::collections::BTreeMap;

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

use hongbao_load::transport::{HttpConnection, RequestTemplate};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    #[serde(default = "default_name")]
    pub name: String,
    pub slo: Slo,
    #[serde(default)]
    pub load: LoadPlan,
    #[serde(rename = "stage")]
    pub stages: Vec<Stage>,
    pub target: Option<Target>,
}

fn default_name() -> String {
    "capacity".into()
}

/// What a step must meet to count.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// p99 latency from each request's intended send time, ms.
    pub p99_ms: f64,
    /// Mean latency, ms (the Python write-up's "p-avg"); none: not judged.
    pub mean_ms: Option<f64>,
    /// Errors (overloaded, error answers, failed connects, requests not sent) ÷ requests.
    #[serde(default = "default_error_rate")]
    pub error_rate: f64,
    /// Achieved QPS must be at least this share of the offered.
    #[serde(default = "default_min_achieved")]
    pub min_achieved: f64,
    /// Largest CPU of any one instance of a layer, in cores (0.7 = 70% of a core), by
    /// layer name (`nginx`, `gateway`, `core`, `gateway-host`, `redis`, `postgres`, `load`,
    /// or a watched layer of an external stage).
    #[serde(default)]
    pub cpu: BTreeMap<String, f64>,
}

fn default_error_rate() -> f64 {
    0.05
}
fn default_min_achieved() -> f64 {
    0.95
}

/// The load that drives every stage: HTTP users, each with a keep-alive connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadPlan {
    #[serde(default = "default_users")]
    pub users: u64,
    /// Load client processes (0: auto).
    #[serde(default)]
    pub procs: u32,
    /// How long each step is held, after `settle_secs` not counted.
    #[serde(default = "default_step_secs")]
    pub step_secs: u64,
    #[serde(default = "default_settle_secs")]
    pub settle_secs: u64,
    #[serde(default)]
    pub http_connection: HttpConnection,
    /// Each stage's load on this many agents (docs/agents.md); 0: local client processes.
    #[serde(default)]
    pub agents: u32,
    /// Start the agents here (on the lab's load hosts in cluster stages), or wait for
    /// agents started elsewhere (`hongbao load-agent --runs 0`, which join every stage).
    #[serde(default)]
    pub spawn_agents: bool,
    /// Where agents dial in [default: 127.0.0.1 (a cluster stage: the lab's bridge), any
    /// port]; agents started elsewhere need a fixed one.
    #[serde(default)]
    pub agent_listen: Option<std::net::SocketAddr>,
    /// The agent link's key and TLS files [default: OUT/agents].
    #[serde(default)]
    pub agent_dir: Option<std::path::PathBuf>,
}

fn default_users() -> u64 {
    1000
}
fn default_step_secs() -> u64 {
    10
}
fn default_settle_secs() -> u64 {
    2
}

impl Default for LoadPlan {
    fn default() -> LoadPlan {
        LoadPlan {
            users: default_users(),
            procs: 0,
            step_secs: default_step_secs(),
            settle_secs: default_settle_secs(),
            http_connection: HttpConnection::KeepAlive,
            agents: 0,
            spawn_agents: false,
            agent_listen: None,
            agent_dir: None,
        }
    }
}

/// Which layers a stage brings up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layers {
    /// nginx answering `200` itself; instances: nginx worker processes.
    #[serde(rename = "nginx-static")]
    NginxStatic,
    /// `hongbao serve` with its HTTP API, the load straight at it; instances: gateway
    /// worker processes.
    #[serde(rename = "gateway")]
    Gateway,
    /// nginx in front of `hongbao serve`; instances: gateway worker processes (or nginx
    /// workers with `scale = "nginx"`).
    #[serde(rename = "nginx+gateway")]
    NginxGateway,
    /// A lab: gateway hosts in cluster mode over a Redis Cluster and PostgreSQL, nginx in
    /// front, the load on load hosts; instances: gateway hosts. Root only.
    #[serde(rename = "cluster")]
    Cluster,
    /// The user's own HTTP target (`url`, …); instances: always one.
    #[serde(rename = "external")]
    External,
}

impl Layers {
    pub fn name(self) -> &'static str {
        match self {
            Layers::NginxStatic => "nginx-static",
            Layers::Gateway => "gateway",
            Layers::NginxGateway => "nginx+gateway",
            Layers::Cluster => "cluster",
            Layers::External => "external",
        }
    }

    /// The layer that answers "overloaded": the gateway's admission, or the target.
    pub fn refusing_layer(self) -> &'static str {
        match self {
            Layers::NginxStatic => "nginx",
            Layers::Gateway | Layers::NginxGateway => "gateway",
            Layers::Cluster => "gateway-host",
            Layers::External => "target",
        }
    }

    /// The layer `instances` counts by default.
    pub fn scaled_layer(self) -> &'static str {
        match self {
            Layers::NginxStatic => "nginx",
            Layers::Gateway | Layers::NginxGateway => "gateway",
            Layers::Cluster => "gateway-host",
            Layers::External => "target",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    pub name: String,
    pub layers: Layers,
    /// Offered QPS of each step, rising.
    pub steps: Vec<u64>,
    /// Instance counts of the scaled layer, one run of the steps each.
    #[serde(default = "default_instances")]
    pub instances: Vec<u32>,
    /// `nginx+gateway` only: which layer `instances` counts ("gateway" or "nginx").
    pub scale: Option<String>,
    /// nginx worker processes when nginx is not the scaled layer.
    #[serde(default = "default_one")]
    pub nginx_workers: u32,
    /// Gateway worker processes per gateway host (`cluster`), or when the gateway is not
    /// the scaled layer.
    #[serde(default = "default_one")]
    pub gateway_workers: u32,
    /// The gateway's `--max-shake-qps` (per gateway): an injected limit.
    pub max_shake_qps: Option<u32>,
    /// Stages with a gateway: a shake campaign releasing this many packets a second for
    /// the whole run, so that wins are committed (the ledger, and in a cluster Redis and
    /// PostgreSQL, at work); 0: none.
    #[serde(default)]
    pub campaign_rate: u32,
    /// The request each firing sends; default: `POST /v1/shake` with the user's bearer
    /// token for stages with a gateway, `GET /` for nginx-static.
    pub request: Option<RequestPlan>,
    /// `external`: the target.
    pub url: Option<String>,
    /// `external`: processes of the user's stack on this machine to watch, by layer:
    /// `{ app = "python3", redis = "redis-server" }` (process names as in
    /// /proc/PID/comm); each process is an instance of its layer.
    #[serde(default)]
    pub watch: BTreeMap<String, String>,
}

fn default_instances() -> Vec<u32> {
    vec![1]
}
fn default_one() -> u32 {
    1
}

/// A request of the plan's own.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestPlan {
    #[serde(default = "default_method")]
    pub method: String,
    /// Path and query; for `external`, the URL's.
    pub path: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
}

fn default_method() -> String {
    "GET".into()
}

/// What to plan for: instances per layer to carry `qps` with `headroom` to spare.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub qps: u64,
    #[serde(default = "default_headroom")]
    pub headroom: f64,
}

fn default_headroom() -> f64 {
    0.3
}

/// `http://HOST[:PORT][/PATH]`: the address to connect to, the Host header, and the
/// path (with its query).
pub fn parse_url(url: &str) -> Result<(std::net::SocketAddr, String, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Invalid(format!("url {url:?}: only http:// targets (no TLS)")))?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], rest[at..].to_string()),
        None => (rest, "/".to_string()),
    };
    if authority.is_empty() {
        return Err(Error::Invalid(format!("url {url:?} has no host")));
    }
    let with_port = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    use std::net::ToSocketAddrs;
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("url {url:?}: resolving {with_port}"), e))?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| Error::Invalid(format!("url {url:?}: no IPv4 address")))?;
    Ok((addr, authority.to_string(), path))
}

impl Stage {
    /// The instance counts of the layer this stage scales.
    pub fn scaled_layer(&self) -> &str {
        match (self.layers, self.scale.as_deref()) {
            (Layers::NginxGateway, Some("nginx")) => "nginx",
            (layers, _) => layers.scaled_layer(),
        }
    }

    /// The request each firing sends, `None` for the gateway's shake.
    pub fn template(&self) -> Result<Option<RequestTemplate>> {
        let from_plan = |host: String, default_path: &str| {
            let r = self.request.clone().unwrap_or_default();
            let method = if self.request.is_some() {
                r.method
            } else {
                "GET".into()
            };
            let t = RequestTemplate {
                method,
                path: r.path.unwrap_or_else(|| default_path.to_string()),
                host,
                headers: r.headers.into_iter().collect(),
                body: r.body,
            };
            t.check().map_err(|e| Error::Invalid(e.to_string()))?;
            Ok(Some(t))
        };
        match self.layers {
            Layers::External => {
                let url = self
                    .url
                    .as_deref()
                    .ok_or_else(|| Error::Invalid("an external stage needs url".into()))?;
                let (_, host, path) = parse_url(url)?;
                from_plan(host, &path)
            }
            Layers::NginxStatic => from_plan("hongbao".into(), "/"),
            _ if self.request.is_some() => from_plan("hongbao".into(), "/v1/shake"),
            _ => Ok(None),
        }
    }
}

/// Above zero (and not NaN).
fn positive(x: f64) -> bool {
    x > 0.0
}

impl Plan {
    /// Reads and checks a plan.
    pub fn from_toml(text: &str) -> Result<Plan> {
        let plan: Plan =
            toml::from_str(text).map_err(|e| Error::Invalid(format!("reading the plan: {e}")))?;
        plan.check()?;
        Ok(plan)
    }

    /// Everything that would make the run fail or mean nothing, said before it starts.
    pub fn check(&self) -> Result<()> {
        let slo = &self.slo;
        if !positive(slo.p99_ms) {
            return Err(Error::Invalid("slo.p99_ms must be above 0".into()));
        }
        if slo.mean_ms.is_some_and(|m| !positive(m)) {
            return Err(Error::Invalid("slo.mean_ms must be above 0".into()));
        }
        if !(0.0..=1.0).contains(&slo.error_rate) || !(0.0..=1.0).contains(&slo.min_achieved) {
            return Err(Error::Invalid(
                "slo.error_rate and slo.min_achieved are shares from 0 to 1".into(),
            ));
        }
        for (layer, cpu) in &slo.cpu {
            if !positive(*cpu) {
                return Err(Error::Invalid(format!(
                    "slo.cpu.{layer} must be above 0 (cores of one instance)"
                )));
            }
        }
        let load = &self.load;
        if load.users == 0 {
            return Err(Error::Invalid("load.users must be at least 1".into()));
        }
        if load.step_secs < 2 {
            return Err(Error::Invalid("load.step_secs must be at least 2".into()));
        }
        if self.stages.is_empty() {
            return Err(Error::Invalid("the plan has no [[stage]]".into()));
        }
        let mut names = std::collections::BTreeSet::new();
        for stage in &self.stages {
            let at = format!("stage {:?}", stage.name);
            if !names.insert(stage.name.as_str()) {
                return Err(Error::Invalid(format!("{at}: two stages have this name")));
            }
            if stage.steps.is_empty() || stage.steps.contains(&0) {
                return Err(Error::Invalid(format!(
                    "{at}: steps must be a list of QPS above 0"
                )));
            }
            if stage.steps.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::Invalid(format!("{at}: steps must rise")));
            }
            if stage.instances.is_empty() || stage.instances.contains(&0) {
                return Err(Error::Invalid(format!(
                    "{at}: instances must be a list of counts above 0"
                )));
            }
            if stage.instances.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::Invalid(format!("{at}: instances must rise")));
            }
            if stage.nginx_workers == 0 || stage.gateway_workers == 0 {
                return Err(Error::Invalid(format!(
                    "{at}: nginx_workers and gateway_workers must be at least 1"
                )));
            }
            match stage.scale.as_deref() {
                None => {}
                Some("gateway" | "nginx") if stage.layers == Layers::NginxGateway => {}
                Some(other) => {
                    let why = "only an nginx+gateway stage chooses, gateway or nginx";
                    return Err(Error::Invalid(format!("{at}: scale {other:?}: {why}")));
                }
            }
            match stage.layers {
                Layers::External => {
                    if stage.url.is_none() {
                        return Err(Error::Invalid(format!(
                            "{at}: an external stage needs url = \"http://…\""
                        )));
                    }
                    if stage.instances != [1] {
                        return Err(Error::Invalid(format!(
                            "{at}: an external stage has one instance (its own)"
                        )));
                    }
                }
                _ => {
                    if stage.url.is_some() || !stage.watch.is_empty() {
                        return Err(Error::Invalid(format!(
                            "{at}: url and watch are for external stages"
                        )));
                    }
                }
            }
            if matches!(stage.layers, Layers::NginxStatic | Layers::External)
                && (stage.max_shake_qps.is_some() || stage.campaign_rate > 0)
            {
                return Err(Error::Invalid(format!(
                    "{at}: max_shake_qps and campaign_rate are a gateway's; this stage has none"
                )));
            }
            // SAFETY: geteuid(2) has no preconditions.
            if stage.layers == Layers::Cluster && unsafe { libc::geteuid() } != 0 {
                return Err(Error::Invalid(format!(
                    "{at}: a cluster stage brings up a lab of network namespaces: run as root"
                )));
            }
            stage
                .template()
                .map_err(|e| e.within(format!("{at}: the request")))?;
        }
        if let Some(target) = &self.target {
            if target.qps == 0 || !(positive(target.headroom) || target.headroom == 0.0) {
                return Err(Error::Invalid(
                    "target.qps must be above 0 and target.headroom at least 0".into(),
                ));
            }
        }
        Ok(())
    }

    /// (stage, instances) pairs in run order.
    pub fn runs(&self) -> Vec<(usize, u32)> {
        self.stages
            .iter()
            .enumerate()
            .flat_map(|(s, stage)| stage.instances.iter().map(move |&n| (s, n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "t"
[slo]
p99_ms = 50
error_rate = 0.05
[slo.cpu]
gateway = 0.7
[load]
users = 200
step_secs = 3
[[stage]]
name = "static"
layers = "nginx-static"
steps = [1000, 2000]
[[stage]]
name = "app"
layers = "nginx+gateway"
steps = [500, 1000, 1500]
instances = [1, 2]
max_shake_qps = 800
[[stage]]
name = "theirs"
layers = "external"
url = "http://127.0.0.1:9/x?y=1"
steps = [10]
watch = { app = "python3" }
request = { method = "POST", headers = { "X-User" = "{user}" }, body = "u={user}" }
[target]
qps = 30000
"#;

    #[test]
    fn a_good_plan_reads() {
        let plan = Plan::from_toml(GOOD).unwrap();
        assert_eq!(plan.stages.len(), 3);
        assert_eq!(plan.runs(), vec![(0, 1), (1, 1), (1, 2), (2, 1)]);
        assert_eq!(plan.stages[1].scaled_layer(), "gateway");
        assert_eq!(plan.target.as_ref().unwrap().headroom, 0.3);
        assert!(plan.stages[1].template().unwrap().is_none());
        let t = plan.stages[2].template().unwrap().unwrap();
        assert_eq!((t.method.as_str(), t.path.as_str()), ("POST", "/x?y=1"));
        assert_eq!(t.host, "127.0.0.1:9");
        let s = plan.stages[0].template().unwrap().unwrap();
        assert_eq!((s.method.as_str(), s.path.as_str()), ("GET", "/"));
    }

    #[test]
    fn bad_plans_say_why() {
        for (from, to, why) in [
            ("p99_ms = 50", "p99_ms = 0", "p99_ms"),
            ("steps = [1000, 2000]", "steps = [2000, 1000]", "rise"),
            ("instances = [1, 2]", "instances = [0]", "instances"),
            ("url = \"http://127.0.0.1:9/x?y=1\"", "", "needs url"),
            (
                "url = \"http://127.0.0.1:9/x?y=1\"",
                "url = \"https://a/\"",
                "http://",
            ),
            (
                "layers = \"nginx-static\"",
                "layers = \"nginx-static\"\nmax_shake_qps = 3",
                "max_shake_qps",
            ),
            (
                "layers = \"nginx-static\"",
                "layers = \"nginx-static\"\ncampaign_rate = 3",
                "campaign_rate",
            ),
            ("users = 200", "users = 200\nbogus = 1", "bogus"),
            (
                "layers = \"nginx-static\"",
                "layers = \"redis\"",
                "unknown variant",
            ),
            ("method = \"POST\"", "method = \"P T\"", "method"),
            ("gateway = 0.7", "gateway = -1", "slo.cpu.gateway"),
            ("name = \"static\"", "name = \"app\"", "two stages"),
        ] {
            assert!(GOOD.contains(from), "{from}");
            let text = GOOD.replacen(from, to, 1);
            let err = format!("{:#}", Plan::from_toml(&text).unwrap_err());
            assert!(err.contains(why), "{to:?}: {err}");
        }
    }

    #[test]
    fn urls_split() {
        let (addr, host, path) = parse_url("http://127.0.0.1:8080/a/b?c=d").unwrap();
        assert_eq!(addr.to_string(), "127.0.0.1:8080");
        assert_eq!(
            (host.as_str(), path.as_str()),
            ("127.0.0.1:8080", "/a/b?c=d")
        );
        let (addr, _, path) = parse_url("http://127.0.0.1").unwrap();
        assert_eq!((addr.port(), path.as_str()), (80, "/"));
        assert!(parse_url("ftp://x").is_err());
        assert!(parse_url("http:///x").is_err());
    }
}
