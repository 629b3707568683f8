//! Who may speak for the server, tried the way an attacker would (docs/security.md):
//! every admin endpoint without a key, with a wrong one and with a role too low — each
//! refused, nothing started, the attempt on the record; the cross-site `text/plain` POST
//! that once minted ¥1,000,000; a rebound `Host`; a key removed while the server runs; a
//! stranger looking for the worker link; a second server on a held port; the monitor's
//! and the load's doors; `hongbao admin-key`; every cent minted naming its key.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::{wait_until, Admin, Serve, SECRET};
use serde_json::{json, Value};

/// Every admin endpoint, with a body where it takes one, and the role it needs.
const ENDPOINTS: &[(&str, &str, Option<&str>, &str)] = &[
    ("GET", "/metrics", None, "metrics"),
    ("GET", "/v1/stats", None, "metrics"),
    ("GET", "/v1/campaigns", None, "viewer"),
    ("GET", "/v1/campaigns/1", None, "viewer"),
    ("GET", "/v1/audit", None, "viewer"),
    ("GET", "/v1/users/31337", None, "viewer"),
    ("GET", "/v1/balances", None, "viewer"),
    ("GET", "/v1/ledger/ops", None, "viewer"),
    (
        "POST",
        "/v1/campaigns/shake",
        Some(r#"{"packets":10,"rate_per_sec":10,"amount_min":100,"amount_max":100}"#),
        "operator",
    ),
    (
        "POST",
        "/v1/campaigns/send",
        Some(
            r#"{"packets":1,"rate_per_sec":1,"recipients":1,"user_min":31337,"user_max":31337,"amount_min":100000000,"amount_max":100000000}"#,
        ),
        "operator",
    ),
    (
        "POST",
        "/v1/broadcast",
        Some(r#"{"text":"pwned"}"#),
        "operator",
    ),
    ("GET", "/v1/admin-keys", None, "operator"),
    (
        "POST",
        "/v1/admin-keys",
        Some(r#"{"name":"intruder","role":"operator"}"#),
        "operator",
    ),
    ("DELETE", "/v1/admin-keys/operator", None, "operator"),
    ("GET", "/v1/admin-log", None, "operator"),
    ("POST", "/v1/users/31337/revoke", Some("{}"), "operator"),
];

fn rank(role: &str) -> u8 {
    match role {
        "metrics" => 0,
        "viewer" => 1,
        "operator" => 2,
        other => panic!("{other}"),
    }
}

/// Nothing was started or made: no campaign, no broadcast, no key but those listed.
fn nothing_started(server: &Admin, keys: &[&str]) {
    assert_eq!(
        server.get("/v1/campaigns"),
        json!([]),
        "a campaign was started"
    );
    let stats = server.get("/v1/stats");
    assert_eq!(
        stats["totals"]["broadcasts"], 0,
        "a broadcast went out: {stats}"
    );
    let names: BTreeSet<String> = server
        .get("/v1/admin-keys")
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap().to_string())
        .collect();
    let expected: BTreeSet<String> = keys.iter().map(|k| k.to_string()).collect();
    assert_eq!(names, expected);
    let audit = server.audit();
    assert_eq!(audit["minted_cents"], 0, "{audit}");
}

/// A user logs in and shakes: the server serves.
fn still_serves(server: &common::Server) {
    let mut client = server.login(7);
    assert!(matches!(
        client.shake().unwrap(),
        hongbao_proto::Message::ShakeReply { .. }
    ));
}

/// The newest admin-log entries.
fn log(server: &Admin, limit: usize) -> Vec<Value> {
    server.get(&format!("/v1/admin-log?limit={limit}"))["entries"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn every_endpoint_refuses_no_key_a_wrong_key_and_a_role_too_low() {
    let server = Serve::new().start();
    let op = &server.admin;
    let viewer = op.with_key(&op.make_key("watcher", "viewer"));
    let scraper = op.with_key(&op.make_key("prometheus", "metrics"));
    let stranger =
        op.with_key("hbk_0000000000000000000000000000000000000000000000000000000000000000");
    let anonymous = op.without_key();
    for &(method, path, body, need) in ENDPOINTS {
        let what = format!("{method} {path}");
        for (who, admin) in [("no key", &anonymous), ("a wrong key", &stranger)] {
            let (status, reply, headers) = admin.http_full(method, path, body, &[]);
            assert_eq!(status, 401, "{what} with {who}: {reply}");
            assert!(
                headers
                    .iter()
                    .any(|(k, v)| k.eq_ignore_ascii_case("www-authenticate") && v == "Bearer"),
                "{what} with {who}: {headers:?}"
            );
            let error: Value = serde_json::from_str(&reply).unwrap();
            assert!(error["error"].is_string(), "{what}: {reply}");
        }
        for (role, admin) in [("metrics", &scraper), ("viewer", &viewer)] {
            let (status, reply) = admin.http(method, path, body);
            if rank(role) < rank(need) {
                assert_eq!(status, 403, "{what} as {role}: {reply}");
            } else {
                assert!(
                    status != 401 && status != 403,
                    "{what} as {role}: {status} {reply}"
                );
            }
        }
    }
    nothing_started(op, &["operator", "prometheus", "watcher"]);
    // Every refusal is on the record: the first 10 of a second one by one, the rest of
    // that second folded, one entry per source, method, path and status with its count,
    // written once the second is over.
    std::thread::sleep(Duration::from_millis(1600));
    let entries = log(op, 1000);
    for &(method, path, _, _) in ENDPOINTS {
        let path = path.split('?').next().unwrap();
        let on_record: u64 = entries
            .iter()
            .filter(|e| e["status"] == 401 && e["method"] == method)
            .filter(|e| e["path"].as_str().unwrap().split('?').next() == Some(path))
            .map(folded_count)
            .sum();
        assert_eq!(
            on_record, 2,
            "{method} {path}, no key and a wrong key: {entries:#?}"
        );
    }
    let refused: Vec<&Value> = entries.iter().filter(|e| e["status"] == 401).collect();
    assert!(refused
        .iter()
        .all(|e| e["key"].is_null() && e["source"].as_str().unwrap().starts_with("127.0.0.1")));
    assert!(entries
        .iter()
        .any(|e| e["status"] == 403 && e["key"] == "watcher"));
    // And counted by status and reason.
    let metrics = op.http("GET", "/metrics", None).1;
    let count = |status: u16, reason: &str| -> f64 {
        let name =
            format!("hongbao_admin_refusals_total{{status=\"{status}\",reason=\"{reason}\"}}");
        metrics
            .lines()
            .find(|l| l.starts_with(&name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{metrics}"))
    };
    assert_eq!(count(401, "no-key"), ENDPOINTS.len() as f64);
    assert_eq!(count(401, "unknown-key"), ENDPOINTS.len() as f64);
    assert!(count(403, "role") >= 1.0);
}

/// How many refusals an admin-log entry stands for: 1, or a folded entry's count.
fn folded_count(entry: &Value) -> u64 {
    let result = entry["result"].as_str().unwrap();
    match result.split_once(" refused like this in the second") {
        Some((n, _)) => n.parse().unwrap(),
        None => 1,
    }
}

#[test]
fn a_flood_of_refusals_cannot_hide_the_probe_after_it() {
    let server = Serve::new().start();
    let op = &server.admin;
    // Junk first, to spend the second's budget of entries...
    let anonymous = op.without_key();
    for _ in 0..22 {
        assert_eq!(anonymous.http("GET", "/v1/balances", None).0, 401);
    }
    // ...then the probe: a page on another site minting to a chosen user.
    let mint = r#"{"packets":1,"rate_per_sec":1,"amount_min":100000000,"amount_max":100000000}"#;
    let (status, reply, _) = op.http_full(
        "POST",
        "/v1/campaigns/shake",
        Some(mint),
        &[
            ("Content-Type", "text/plain"),
            ("Origin", "http://evil.example"),
        ],
    );
    assert_eq!(status, 403, "{reply}");
    nothing_started(op, &["operator"]);
    let probe = common::wait_until("the probe on the record", Duration::from_secs(5), || {
        log(op, 100)
            .into_iter()
            .find(|e| e["path"] == "/v1/campaigns/shake" && e["status"] == 403)
    });
    let result = probe["result"].as_str().unwrap();
    assert!(result.contains("evil.example"), "{probe}");
    // The flood is there too, counted whole: every one of the 22.
    let flood: u64 = log(op, 100)
        .iter()
        .filter(|e| e["path"] == "/v1/balances" && e["status"] == 401)
        .map(folded_count)
        .sum();
    assert_eq!(flood, 22);
    let metrics = op.http("GET", "/metrics", None).1;
    assert!(
        metrics.contains("hongbao_admin_refusals_total{status=\"403\",reason=\"origin\"} 1"),
        "{metrics}"
    );
}

#[test]
fn the_cross_site_simple_post_that_minted_a_million_is_refused_and_recorded() {
    let server = Serve::new().start();
    let op = &server.admin;
    let send = r#"{"packets":1,"rate_per_sec":1,"recipients":1,"user_min":31337,"user_max":31337,"amount_min":100000000,"amount_max":100000000}"#;
    // As a page on another site sends it: text/plain, its Origin — no key, of course,
    // and here even with one: the browser checks come first. A revocation (issue 44's
    // door) the same.
    for (path, body) in [
        ("/v1/campaigns/send", send),
        ("/v1/users/31337/revoke", "{}"),
    ] {
        for admin in [op.without_key(), op.with_key(&op.key())] {
            let (status, reply, _) = admin.http_full(
                "POST",
                path,
                Some(body),
                &[
                    ("Content-Type", "text/plain"),
                    ("Origin", "http://evil.example"),
                ],
            );
            assert_eq!(status, 403, "{path}: {reply}");
        }
    }
    // Without the Origin (a browser that hides it): text/plain is still refused.
    let (status, reply, _) = op.http_full(
        "POST",
        "/v1/campaigns/send",
        Some(send),
        &[("Content-Type", "text/plain")],
    );
    assert_eq!(status, 415, "{reply}");
    // A name rebound to 127.0.0.1.
    let (status, reply, _) = op.http_full("GET", "/v1/balances", None, &[("Host", "evil.example")]);
    assert_eq!(status, 403, "{reply}");
    nothing_started(op, &["operator"]);
    let entries = log(op, 50);
    let attempt = entries
        .iter()
        .find(|e| e["path"] == "/v1/campaigns/send" && e["status"] == 403)
        .unwrap_or_else(|| panic!("the attempt is on the record: {entries:#?}"));
    assert!(
        attempt["result"].as_str().unwrap().contains("evil.example"),
        "{attempt}"
    );
    assert!(
        attempt["body"].as_str().unwrap().contains("100000000"),
        "{attempt}"
    );
    assert!(entries.iter().any(|e| e["status"] == 415));
    // The same request as the operator's own tool sends it works, and names its maker.
    let campaign = op.post("/v1/campaigns/send", &serde_json::from_str(send).unwrap());
    assert_eq!(campaign["created_by"], "operator");
}

#[test]
fn a_key_removed_stops_working_without_a_restart_and_changes_are_recorded() {
    let server = Serve::new().start();
    let op = &server.admin;
    let night = op.with_key(&op.make_key("night-shift", "operator"));
    assert_eq!(night.get("/v1/audit")["ok"], true);
    // A campaign by each key: the audit says who minted every cent.
    let a = op.shake_campaign(10, 100, 100, 100);
    let b = night.shake_campaign(5, 100, 200, 200);
    assert_eq!(
        op.get(&format!("/v1/campaigns/{a}"))["created_by"],
        "operator"
    );
    assert_eq!(
        op.get(&format!("/v1/campaigns/{b}"))["created_by"],
        "night-shift"
    );
    let audit = op.audit();
    assert_eq!(
        audit["minted_by"],
        json!({"operator": 1000, "night-shift": 1000})
    );
    // Removed: refused within a second, on the next request here.
    let removed = op.http("DELETE", "/v1/admin-keys/night-shift", None);
    assert_eq!(removed.0, 200, "{removed:?}");
    let (status, _) = night.http("GET", "/v1/audit", None);
    assert_eq!(status, 401);
    // The last operator key stays.
    let (status, reply) = op.http("DELETE", "/v1/admin-keys/operator", None);
    assert_eq!(status, 409, "{reply}");
    // Every change on the record, naming the key, before it was answered.
    let entries = log(op, 100);
    let made: Vec<(&str, &str, i64)> = entries
        .iter()
        .filter(|e| e["method"] != "GET")
        .map(|e| {
            (
                e["key"].as_str().unwrap_or(""),
                e["path"].as_str().unwrap(),
                e["status"].as_i64().unwrap(),
            )
        })
        .collect();
    for expected in [
        ("operator", "/v1/admin-keys", 201),
        ("operator", "/v1/campaigns/shake", 201),
        ("night-shift", "/v1/campaigns/shake", 201),
        ("operator", "/v1/admin-keys/night-shift", 200),
        ("operator", "/v1/admin-keys/operator", 409),
    ] {
        assert!(made.contains(&expected), "{expected:?} not in {made:?}");
    }
    // A read of a user's data is on the record too.
    op.get("/v1/users/42");
    assert!(log(op, 5)
        .iter()
        .any(|e| e["path"] == "/v1/users/42" && e["role"] == "operator"));
    // The key made through the API was never logged.
    assert!(!serde_json::to_string(&entries).unwrap().contains("hbk_"));
}

#[test]
fn the_admin_key_cli_adds_lists_and_removes_while_the_server_runs() {
    let server = Serve::new().start();
    let dir = server.data_dir.to_str().unwrap().to_string();
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hongbao"))
            .arg("admin-key")
            .args(args)
            .args(["--data-dir", &dir])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, key, err) = cli(&["add", "grafana", "--role", "metrics"]);
    assert!(ok, "{err}");
    let key = key.trim().to_string();
    assert!(key.starts_with("hbk_"), "{key}");
    let scraper = server.admin.with_key(&key);
    wait_until("the new key to work", Duration::from_secs(5), || {
        (scraper.http("GET", "/metrics", None).0 == 200).then_some(())
    });
    assert_eq!(scraper.http("GET", "/v1/balances", None).0, 403);
    let (ok, list, _) = cli(&["list"]);
    assert!(
        ok && list.contains("grafana") && list.contains("metrics") && !list.contains(&key),
        "{list}"
    );
    let (ok, _, err) = cli(&["add", "grafana", "--role", "viewer"]);
    assert!(!ok && err.contains("exists"), "{err}");
    let (ok, _, err) = cli(&["remove", "grafana"]);
    assert!(ok, "{err}");
    wait_until(
        "the removed key to stop working",
        Duration::from_secs(5),
        || (scraper.http("GET", "/metrics", None).0 == 401).then_some(()),
    );
    let (ok, _, err) = cli(&["remove", "operator"]);
    assert!(!ok && err.contains("last operator key"), "{err}");
    // The first key's file is the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(server.data_dir.join("admin.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// The worker link has no address: no worker listens on a Unix socket, the supervisor
/// only on DIR/upgrade.sock (0600: its owner's, for `serve --upgrade`), and no abstract
/// name of the old form exists; the workers got theirs as an inherited descriptor (its number on the command line). A
/// stranger (another user) asking to take over starts nothing.
#[test]
fn a_stranger_finds_no_worker_link_to_join() {
    let server = Serve::new().start();
    let mut pids = server.worker_pids();
    pids.push(server.pid());
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap();
    // Inode → (flags, path) of every Unix socket; flag 0x10000 is __SO_ACCEPTCON: listening.
    let upgrade_sock = server.data_dir.join("upgrade.sock");
    let mut upgrade_inode = None;
    let listening: BTreeSet<String> = unix
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(7)
                .is_some_and(|p| std::path::Path::new(p) == upgrade_sock)
            {
                upgrade_inode = Some(f[6].to_string());
                return None;
            }
            (u32::from_str_radix(f[3], 16).ok()? & 0x10000 != 0).then(|| f[6].to_string())
        })
        .collect();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&upgrade_sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{}", upgrade_sock.display());
    let upgrade_inode = upgrade_inode.expect("the supervisor's upgrade.sock");
    for pid in &pids {
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
        {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            let target = target.to_string_lossy();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                assert!(
                    !listening.contains(inode),
                    "process {pid} listens on a Unix socket {inode}"
                );
                assert!(
                    *pid == server.pid() || inode != upgrade_inode,
                    "worker {pid} holds the upgrade socket"
                );
            }
        }
    }
    assert!(!unix.contains(&format!("hongbao-link-{}", server.pid())));
    for pid in server.worker_pids() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.contains("--link-fd "), "{cmdline}");
        assert!(!cmdline.contains(SECRET), "{cmdline}");
    }
    // A stranger (another user) asking to take over: refused, nothing started, the
    // workers the same. Only root can become another user.
    let workers = server.worker_pids();
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    });
    if root {
        let stranger = {
            use std::os::unix::process::CommandExt;
            Command::new(env!("CARGO_BIN_EXE_hongbao"))
                .args(["serve", "--upgrade", "--admin", "127.0.0.1:0"])
                .arg("--data-dir")
                .arg(&server.data_dir)
                .env("HONGBAO_SECRET", SECRET)
                .uid(65534)
                .gid(65534)
                .output()
                .unwrap()
        };
        assert!(!stranger.status.success(), "a stranger's upgrade ran");
        assert_eq!(server.worker_pids(), workers);
    }
    // The server still serves: the link is whole.
    still_serves(&server);
}

#[test]
fn a_second_server_on_a_held_port_refuses_to_start_saying_which() {
    let first = Serve::new().start();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args([
            "serve",
            "--listen",
            &first.listen.to_string(),
            "--admin",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("HONGBAO_SECRET", SECRET)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&first.listen.to_string()) && stderr.contains("in use"),
        "{stderr}"
    );
    assert!(stderr.contains("by process"), "names the holder: {stderr}");
    assert!(
        !dir.path().join("data").exists(),
        "started nothing: made a data dir"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    // The first one serves on, alone.
    still_serves(&first);
}

#[test]
fn the_monitor_takes_reports_only_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("monitor.key");
    let monitor = common::Hongbao::start("monitor", {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hongbao"));
        c.args(["monitor", "--listen", "127.0.0.1:0", "--out"])
            .arg(dir.path().join("out"))
            .arg("--key-file")
            .arg(&key_file);
        c
    });
    let ready = monitor.ready_line("hongbao monitor ready: ");
    let addr = common::field(&ready, "listen");
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    let agent = ureq::AgentBuilder::new()
        .timeout(common::IO_TIMEOUT)
        .build();
    let mark = format!("http://{addr}/v1/mark");
    let json = "application/json";
    let auth = format!("Bearer {key}");
    // (headers, the answer): no key, a wrong key, a page on another site, the key.
    let tries: [(&[(&str, &str)], u16); 4] = [
        (&[("Content-Type", json)], 401),
        (
            &[("Content-Type", json), ("Authorization", "Bearer hbk_nope")],
            401,
        ),
        (
            &[
                ("Content-Type", "text/plain"),
                ("Origin", "http://evil.example"),
            ],
            403,
        ),
        (&[("Content-Type", json), ("Authorization", &auth)], 200),
    ];
    for (headers, expected) in tries {
        let mut request = agent.post(&mark);
        for (name, value) in headers {
            request = request.set(name, value);
        }
        let status = match request.send_string(r#"{"phase":"x"}"#) {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(s, _)) => s,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(status, expected, "{headers:?}");
    }
    // A serve reporting to it finds the key in its file and is taken.
    let server = Serve::new()
        .args([
            "--monitor",
            &addr,
            "--monitor-key-file",
            key_file.to_str().unwrap(),
        ])
        .start();
    wait_until(
        "the server's reports to be taken",
        Duration::from_secs(15),
        || {
            let rows = agent
                .get(&format!("http://{addr}/v1/latest"))
                .call()
                .ok()?
                .into_json::<Value>()
                .ok()?;
            rows.to_string().contains("serve").then_some(())
        },
    );
    drop(server);
}

#[test]
fn the_load_control_takes_commands_only_with_its_key() {
    let server = Serve::new().start();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("load.key");
    let load = common::Hongbao::start("load", {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hongbao"));
        c.args([
            "load",
            "--server",
            &server.listen.to_string(),
            "--users",
            "20",
            "--qps",
            "10",
        ])
        .args(["--control", "127.0.0.1:0", "--procs", "1"])
        .arg("--control-key-file")
        .arg(&key_file)
        .env("HONGBAO_SECRET", SECRET);
        c
    });
    let control = wait_until("the control address", common::START_TIMEOUT, || {
        load.stdout
            .recv_timeout(Duration::from_millis(200))
            .ok()
            .and_then(|line| {
                line.split("control on http://")
                    .nth(1)
                    .map(|rest| rest.split_whitespace().next().unwrap().to_string())
            })
    });
    let agent = ureq::AgentBuilder::new()
        .timeout(common::IO_TIMEOUT)
        .build();
    let url = format!("http://{control}/qps");
    let post = |request: ureq::Request| match request
        .set("Content-Type", "application/json")
        .send_string(r#"{"qps":10000000}"#)
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(post(agent.post(&url)), 401);
    assert_eq!(
        post(agent.post(&url).set("Authorization", "Bearer hbk_nope")),
        401
    );
    // --set-qps reads the key the load made; without it there is nothing to send.
    let set_qps = |key_file: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_hongbao"))
            .args(["load", "--control", &control, "--set-qps", "20"])
            .arg("--control-key-file")
            .arg(key_file)
            .output()
            .unwrap()
    };
    let set = set_qps(&key_file);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert!(!set_qps(&dir.path().join("missing.key")).status.success());
    // No secret on the command line of the load or its client processes.
    for pid in common::descendants(load.pid())
        .into_iter()
        .chain([load.pid()])
    {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains(SECRET),
            "process {pid}"
        );
    }
}

/// While a bench runs, no process of it — the bench, its server and workers, its load and
/// load clients — has a secret on its command line: not the login secret, not a key.
#[test]
fn no_secret_is_on_any_command_line_during_a_bench() {
    let out = tempfile::tempdir().unwrap();
    let mut bench = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args([
            "bench",
            "--connections",
            "2000",
            "--workers",
            "2",
            "--procs",
            "2",
        ])
        .args([
            "--phase-qps",
            "1000,1000",
            "--shake-packets",
            "50",
            "--send-packets",
            "20",
        ])
        .arg("--out")
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let secret = "hongbao-bench-secret";
    let mut seen = BTreeSet::new();
    while bench.try_wait().unwrap().is_none() {
        for pid in common::descendants(bench.id())
            .into_iter()
            .chain([bench.id()])
        {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            assert!(!cmdline.contains(secret), "the login secret in {cmdline}");
            assert!(!cmdline.contains("hbk_"), "a key in {cmdline}");
            let word = cmdline.split_whitespace().nth(1).unwrap_or("").to_string();
            seen.insert(word);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(bench.wait().unwrap().success());
    // Every kind of process was looked at while it ran.
    for kind in ["bench", "serve", "worker", "load-client"] {
        assert!(seen.contains(kind), "no {kind} process seen: {seen:?}");
    }
}
