//! `hongbao capacity` (docs/capacity.md) with the real binaries: a small plan of two
//! stages (the gateway alone, nginx in front of it), three steps each, with an injected
//! admission limit (`max_shake_qps`) that must put the knee where it is; an external
//! target (a real HTTP server of another stack, Python's); summary.json checked field by
//! field against the list in docs/capacity.md; bad plans refused before anything starts.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// One capacity run at a time: each measures the machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn hongbao_capacity(plan: &str, dir: &Path) -> (bool, String) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = dir.join("plan.toml");
    std::fs::write(&path, plan).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .arg("capacity")
        .arg(&path)
        .arg("--out")
        .arg(dir.join("out"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn summary(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("out/summary.json")).unwrap()).unwrap()
}

/// The documented fields: path → type, from docs/capacity.md's summary.json list.
fn documented() -> BTreeMap<String, String> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/capacity.md")).unwrap();
    let list = &doc[doc.find("- `schema`").expect("the summary.json list")..];
    let mut fields = BTreeMap::new();
    let mut pending: Vec<String> = Vec::new();
    let mut chars = list.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' => {
                let token: String = chars.by_ref().take_while(|&c| c != '`').collect();
                pending.push(token);
            }
            '(' => {
                let inside: String = chars.by_ref().take_while(|&c| c != ')').collect();
                let kind = inside
                    .split([':', ';', ','])
                    .next()
                    .unwrap()
                    .trim()
                    .to_string();
                for path in pending.drain(..) {
                    fields.insert(path, kind.clone());
                }
            }
            _ => {}
        }
    }
    assert!(fields.len() > 60, "{fields:?}");
    fields
}

/// Every value of `v` with its path (`a.b`, `a[]`, `a{}`), maps being the documented ones.
fn walk(v: &Value, path: &str, maps: &BTreeSet<String>, out: &mut Vec<(String, Value)>) {
    out.push((path.to_string(), v.clone()));
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        Value::Array(items) => {
            for item in items {
                walk(item, &format!("{path}[]"), maps, out);
            }
        }
        Value::Object(fields) if maps.contains(path) => {
            for item in fields.values() {
                walk(item, &format!("{path}{{}}"), maps, out);
            }
        }
        Value::Object(fields) => {
            for (k, item) in fields {
                walk(item, &join(k), maps, out);
            }
        }
        _ => {}
    }
}

fn type_ok(kind: &str, v: &Value) -> bool {
    let base = kind.trim_end_matches(" or null");
    (kind.ends_with(" or null") && v.is_null())
        || match base {
            "number" => v.is_number(),
            "string" => v.is_string(),
            "bool" => v.is_boolean(),
            "object" => v.is_object(),
            other => panic!("unknown documented type {other:?}"),
        }
}

/// Every field in summary.json is documented with its type, and every documented field
/// is there (unless what holds it is null or empty in this run).
fn check_schema(summary: &Value) {
    let doc = documented();
    let maps: BTreeSet<String> = doc
        .keys()
        .filter_map(|k| k.strip_suffix("{}").map(|m| m.to_string()))
        .filter(|m| !m.contains("{}"))
        .collect();
    let mut seen = Vec::new();
    walk(summary, "", &maps, &mut seen);
    // `broke_at.bottleneck` is documented as the steps' bottleneck.
    let alias = |p: &str| p.replace("runs[].broke_at.bottleneck.", "runs[].steps[].bottleneck.");
    let mut present: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (path, value) in &seen {
        present.entry(path.clone()).or_default().push(value.clone());
        if path.is_empty() {
            continue;
        }
        let leaf = !value.is_object() && !value.is_array();
        let key = alias(path);
        match doc.get(&key) {
            Some(kind) => assert!(type_ok(kind, value), "{path}: {value} is not {kind}"),
            None if leaf => panic!("{path} ({value}) is not in docs/capacity.md"),
            None => {}
        }
    }
    for path in doc.keys() {
        if present.contains_key(path) {
            continue;
        }
        // Absent: fine only when its nearest present ancestor is null or empty throughout.
        let mut at = path.as_str();
        let holder = loop {
            at = match at.strip_suffix("[]").or_else(|| at.strip_suffix("{}")) {
                Some(holder) => holder,
                None => {
                    let cut = at
                        .rfind('.')
                        .unwrap_or_else(|| panic!("{path} is documented but not in summary.json"));
                    &at[..cut]
                }
            };
            if let Some(values) = present.get(at) {
                break values;
            }
        };
        let empty = |v: &Value| {
            v.is_null()
                || v.as_array().is_some_and(|a| a.is_empty())
                || v.as_object().is_some_and(|o| o.is_empty())
        };
        assert!(
            holder.iter().all(empty),
            "{path} is documented but not in summary.json (its holder {at} is there)"
        );
    }
}

#[test]
fn a_small_plan_finds_the_knee_an_injected_limit_puts() {
    let dir = tempfile::tempdir().unwrap();
    // The gateway admits 1,000 shakes a second: 400 and 800 pass, 1,600 is refused a third.
    let plan = r#"
name = "knee test"
[slo]
p99_ms = 250
error_rate = 0.05
[load]
users = 200
procs = 1
step_secs = 3
settle_secs = 1
[[stage]]
name = "gateway"
layers = "gateway"
steps = [400, 800, 1600]
max_shake_qps = 1000
campaign_rate = 50
[[stage]]
name = "nginx + gateway"
layers = "nginx+gateway"
steps = [400, 800, 1600]
max_shake_qps = 1000
[target]
qps = 5000
headroom = 0.5
"#;
    let (ok, output) = hongbao_capacity(plan, dir.path());
    assert!(ok, "{output}");
    let s = summary(dir.path());
    check_schema(&s);
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{output}");
    for run in runs {
        let name = run["stage"].as_str().unwrap();
        assert!(run["failed"].is_null(), "{name}: {}", run["failed"]);
        assert_eq!(run["knee"]["offered_qps"], 800, "{name}: {output}");
        assert_eq!(run["knee"]["lower_bound"], false);
        let steps = run["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 3, "{name}: {output}");
        assert!(steps[..2].iter().all(|s| s["meets_slo"] == true));
        let broke = &run["broke_at"];
        assert_eq!(broke["offered_qps"], 1600);
        assert_eq!(broke["bottleneck"]["layer"], "gateway", "{name}: {broke}");
        assert_eq!(broke["bottleneck"]["cause"], "overloaded");
        let over = steps[2]["errors"]["overloaded"].as_u64().unwrap();
        assert!(over > 300, "{name}: {}", steps[2]["errors"]);
        // The knee's step: what each layer and instance spent.
        let knee = &steps[1];
        assert!(knee["achieved_qps"].as_f64().unwrap() > 760.0);
        let layers: Vec<&str> = knee["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["layer"].as_str().unwrap())
            .collect();
        for want in ["core", "gateway", "load", "machine"] {
            assert!(layers.contains(&want), "{name}: {layers:?}");
        }
        if name == "nginx + gateway" {
            assert!(layers.contains(&"nginx"), "{layers:?}");
        }
        let gateway_cpu = knee["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["layer"] == "gateway")
            .unwrap()["cpu_cores"]
            .as_f64()
            .unwrap();
        assert!(gateway_cpu > 0.0, "{name}: the gateway's CPU was not seen");
        assert!(run["note"].as_str().unwrap().contains("gateway refused"));
    }
    // The plan: the gateway measured at its knee, 800/s per worker → ⌈7,500 ÷ 800⌉.
    let plan = s["capacity_plan"]["layers"].as_array().unwrap();
    let gateway = plan.iter().find(|l| l["layer"] == "gateway").unwrap();
    assert_eq!(gateway["basis"], "measured");
    let per = gateway["per_instance_qps"].as_f64().unwrap();
    assert_eq!(
        gateway["instances"].as_f64().unwrap(),
        (7500.0 / per).ceil(),
        "{gateway}"
    );
    // The report, the charts, the series.
    let out = dir.path().join("out");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("QPS at the knee") && html.contains("nginx + gateway"));
    for chart in s["charts"].as_array().unwrap() {
        let chart = chart.as_str().unwrap();
        let svg = std::fs::read_to_string(out.join(format!("{chart}.svg"))).unwrap();
        assert!(svg.contains("knee"), "{chart} has no knee mark");
        assert!(out.join(format!("{chart}.png")).exists());
        assert!(html.contains(&format!("{chart}.svg")));
    }
    assert_eq!(s["charts"].as_array().unwrap().len(), 4);
    assert!(out.join("series/series.csv").exists());
    assert!(
        output.contains("stage | instances | QPS at the knee"),
        "{output}"
    );
}

/// A Python HTTP server (keep-alive, Content-Length), as a user's own stack.
struct Python(Child);

impl Drop for Python {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_external_target_is_measured_the_same_way() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = format!(
        r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        ok = self.path.startswith("/api/") and body.startswith(b"user=")
        out = b'{{"ok":true}}' if ok else b'{{"ok":false}}'
        self.send_response(200 if ok else 400)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H)
print("ready", flush=True)
s.serve_forever()
"#
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (.ci/run installs it)");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    let _python = Python(child);
    let dir = tempfile::tempdir().unwrap();
    let plan = format!(
        r#"
name = "external"
[slo]
p99_ms = 500
[load]
users = 20
procs = 1
step_secs = 2
settle_secs = 1
[[stage]]
name = "python"
layers = "external"
url = "http://127.0.0.1:{port}/api/ping"
steps = [50, 100]
watch = {{ app = "python3" }}
request = {{ method = "POST", body = "user={{user}}" }}
"#
    );
    let (ok, output) = hongbao_capacity(&plan, dir.path());
    assert!(ok, "{output}");
    let s = summary(dir.path());
    check_schema(&s);
    let run = &s["runs"][0];
    let steps = run["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{output}");
    for step in steps {
        // Every request answered 200: the path and the filled body reached the server.
        assert_eq!(step["errors"]["error_replies"], 0, "{step}");
        assert!(
            step["achieved_qps"].as_f64().unwrap() >= step["offered_qps"].as_f64().unwrap() * 0.95
        );
        let app = step["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["layer"] == "app")
            .unwrap_or_else(|| panic!("no app layer: {step}"));
        assert!(app["cpu_cores"].as_f64().unwrap() > 0.0, "{app}");
    }
    assert_eq!(run["knee"]["lower_bound"], true);
    // A wrong body is an error reply, counted by cause.
    let plan = plan.replace("user={user}", "nobody");
    let dir = tempfile::tempdir().unwrap();
    let (ok, output) = hongbao_capacity(&plan, dir.path());
    assert!(ok, "{output}");
    let s = summary(dir.path());
    let step = &s["runs"][0]["steps"][0];
    assert!(
        step["errors"]["error_replies"].as_u64().unwrap() > 40,
        "{step}"
    );
    assert_eq!(step["meets_slo"], false);
    assert!(s["runs"][0]["knee"].is_null());
    // The same stage loaded by two agents the run starts: the same answers, the load's
    // CPU counted over the agents and their clients.
    let plan = plan
        .replace("nobody", "user={user}")
        .replace("procs = 1", "agents = 2\nspawn_agents = true");
    let dir = tempfile::tempdir().unwrap();
    let (ok, output) = hongbao_capacity(&plan, dir.path());
    assert!(ok, "{output}");
    let s = summary(dir.path());
    check_schema(&s);
    for step in s["runs"][0]["steps"].as_array().unwrap() {
        assert_eq!(step["errors"]["error_replies"], 0, "{step}");
        assert!(
            step["achieved_qps"].as_f64().unwrap() >= step["offered_qps"].as_f64().unwrap() * 0.95,
            "{step}"
        );
    }
    assert!(dir.path().join("out/agents/agent.key").exists());
}

#[test]
fn a_bad_plan_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (plan, why) in [
        ("[slo]\np99_ms = 10\n", "stage"),
        (
            "[slo]\np99_ms = 10\n[[stage]]\nname = \"a\"\nlayers = \"gateway\"\nsteps = [5, 3]\n",
            "rise",
        ),
        (
            "[slo]\np99_ms = 10\n[[stage]]\nname = \"a\"\nlayers = \"external\"\nurl = \"https://x/\"\nsteps = [5]\n",
            "http://",
        ),
        ("not toml [", "reading the plan"),
    ] {
        let (ok, output) = hongbao_capacity(plan, dir.path());
        assert!(!ok, "{plan}");
        assert!(output.contains(why), "{plan}: {output}");
        assert!(!dir.path().join("out").exists(), "{plan} started something");
    }
}

/// A cluster stage: the lab's hosts, each its own instance with its own network, and the
/// stores' load from their own counters (root: the lab is network namespaces).
#[test]
fn a_cluster_stage_measures_each_host_and_the_stores() {
    let dir = tempfile::tempdir().unwrap();
    let plan = r#"
name = "cluster test"
[slo]
p99_ms = 500
[load]
users = 100
procs = 1
step_secs = 3
settle_secs = 1
[[stage]]
name = "cluster"
layers = "cluster"
instances = [2]
steps = [200, 400]
campaign_rate = 50
"#;
    let (ok, output) = hongbao_capacity(plan, dir.path());
    assert!(ok, "{output}");
    let s = summary(dir.path());
    check_schema(&s);
    let run = &s["runs"][0];
    assert!(run["failed"].is_null(), "{}", run["failed"]);
    let steps = run["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{output}");
    let step = &steps[1];
    assert!(step["meets_slo"] == true, "{}", step["broken"]);
    let instances = step["instances"].as_array().unwrap();
    let of =
        |layer: &str| -> Vec<&Value> { instances.iter().filter(|i| i["layer"] == layer).collect() };
    assert_eq!(of("gateway-host").len(), 2);
    assert_eq!(of("redis").len(), 6);
    assert_eq!(of("nginx").len(), 1);
    assert_eq!(of("postgres").len(), 1);
    // Every gateway host and nginx carried traffic on their own interfaces.
    for i in of("gateway-host").into_iter().chain(of("nginx")) {
        let net = i["net_in_bytes_per_sec"].as_f64().unwrap();
        assert!(net > 1000.0, "{i}");
        assert!(i["cpu_cores"].as_f64().unwrap() > 0.0, "{i}");
    }
    // The engines: Redis commands and PostgreSQL commits (the campaign's wins) per second.
    let engines = &step["engines"];
    assert!(
        engines["redis_calls_per_sec_total"].as_f64().unwrap() > 0.0,
        "{engines}"
    );
    assert!(
        engines["pg_commits_per_sec"].as_f64().unwrap() > 0.0,
        "{engines}"
    );
    // The lab is gone.
    let lab = dir.path().join("out/cluster-x2/lab/lab.json");
    assert!(!lab.exists(), "the lab was left up");
}
