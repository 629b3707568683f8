//! The load on agents (docs/agents.md): `hongbao bench --agents N` with agents it starts
//! itself, here and on a lab's load hosts; agents started by hand, one killed mid-run and a
//! stranger refused; the bench aimed at a server it did not start (`--target-*`).

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::{bench_summary, run_bench, signal, wait_until, Hongbao, Serve};

/// Small phases a few agents carry in seconds.
const SMALL: &str = "--connections 3000 --workers 2 --phase-qps 600 --campaign-rate 200 \
                     --shake-packets 80 --send-packets 40";

/// The merged figures are the agents' summed: every counter of the load's totals is the
/// sum of the agents' own.
fn assert_totals_are_the_agents_sum(summary: &Value) {
    let agents = summary["agents"]["agents"].as_array().expect("agents");
    let totals = summary["load"]["totals"].as_object().unwrap();
    for (name, total) in totals {
        let sum: u64 = agents
            .iter()
            .map(|a| a["counters"][name].as_u64().unwrap())
            .sum();
        assert_eq!(total.as_u64().unwrap(), sum, "{name}");
    }
}

/// Three agents the bench starts here: every cent and every operation as told, the
/// merged totals the agents' sum, each agent's clock measured and in the summary.
#[test]
fn a_bench_on_three_agents_balances_every_cent_and_sums_their_reports() {
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(out.path(), &format!("{SMALL} --agents 3 --spawn-agents"));
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    assert_eq!(summary["load"]["procs"], 3);
    let agents = &summary["agents"];
    assert_eq!(agents["count"], 3);
    assert_eq!(agents["lost"], serde_json::json!([]));
    assert_eq!(agents["refused"], 0);
    let list = agents["agents"].as_array().unwrap();
    let indexes: Vec<u64> = list.iter().map(|a| a["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, [0, 1, 2]);
    for a in list {
        assert!(a["clock_readings"].as_u64().unwrap() >= 1, "{a}");
        // One machine, one clock: the measured offset is within its round trip.
        let (offset, rtt) = (
            a["offset_us"].as_i64().unwrap(),
            a["rtt_us"].as_u64().unwrap(),
        );
        assert!(offset.unsigned_abs() <= rtt / 2 + 1_000, "{a}");
        // Each held its slice: a third of the users.
        assert_eq!(a["counters"]["logins"], 1000, "{a}");
    }
    assert_totals_are_the_agents_sum(&summary);
    // The agents' files stay for the next run (and agents started elsewhere).
    for file in ["agent.key", "ca.pem", "cert.pem", "key.pem"] {
        assert!(out.path().join("agents").join(file).exists(), "{file}");
    }
}

/// Four agents on four load hosts of a lab against two gateways in cluster mode (root):
/// the load crosses the lab's network from four addresses, and every cent balances.
#[test]
fn four_agents_on_lab_hosts_against_two_gateways_balance_every_cent() {
    if !common::is_root() {
        eprintln!("skipped: the lab's network namespaces need root");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let summary = run_bench(
        out.path(),
        "--hosts 2 --connections 2000 --workers 1 --phase-qps 400 --campaign-rate 200 \
         --shake-packets 60 --send-packets 30 --agents 4 --spawn-agents",
    );
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    let list = summary["agents"]["agents"].as_array().unwrap();
    let mut hosts: Vec<&str> = list
        .iter()
        .map(|a| a["peer"].as_str().unwrap().split(':').next().unwrap())
        .collect();
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts.len(), 4, "one load host each: {hosts:?}");
    assert_totals_are_the_agents_sum(&summary);
}

/// Agents started by hand join a waiting bench; one is killed mid-run (SIGKILL, and its
/// client with it) and reported lost, with when and what it had sent, while the others
/// carry the run to its end; its users' history is incomplete, not missing; the money
/// is judged exactly all the same. A stranger with a wrong key is refused on the record.
#[test]
fn an_agent_killed_mid_run_is_reported_while_the_others_carry_on() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("agents");
    let port = common::free_port();
    // A shake campaign of 10 s: the kill lands inside it.
    let args = format!(
        "--connections 3000 --workers 2 --phase-qps 600 --campaign-rate 40 --shake-packets 400 \
         --send-packets 20 --agents 3 --agent-listen 127.0.0.1:{port} --agent-dir {} --agent-join-secs 60",
        dir.display()
    );
    let bench = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .arg("bench")
        .args(args.split_whitespace())
        .arg("--out")
        .arg(out.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its key and certificate are made as it starts waiting.
    wait_until("the agent files", Duration::from_secs(60), || {
        dir.join("ca.pem").exists().then_some(())
    });
    let coordinator = format!("127.0.0.1:{port}");
    let agent = |index: &str, key: &std::path::Path| {
        let (ca, key) = (dir.join("ca.pem"), key.to_path_buf());
        Hongbao::spawn(
            "load-agent",
            &[
                "load-agent",
                "--coordinator",
                &coordinator,
                "--ca",
                ca.to_str().unwrap(),
                "--key-file",
                key.to_str().unwrap(),
                "--index",
                index,
                "--join-timeout",
                "60",
            ],
        )
    };
    let wrong_key = out.path().join("wrong.key");
    std::fs::write(&wrong_key, "hbk_a-key-of-another-run\n").unwrap();
    let mut stranger = agent("0", &wrong_key);
    let status = stranger.wait_exit(Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        stranger.log().contains("wrong agent key"),
        "{}",
        stranger.log()
    );

    let key = dir.join("agent.key");
    let agents: Vec<Hongbao> = ["0", "1", "2"].iter().map(|i| agent(i, &key)).collect();
    // Killed a few seconds into the first phase: after the connect phase and the start.
    wait_until("the phase to start", Duration::from_secs(120), || {
        let series = std::fs::read_to_string(out.path().join("series.csv")).ok()?;
        series.contains("qps-600").then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let clients = common::descendants(agents[1].pid());
    signal(agents[1].pid(), "-KILL");
    for client in clients {
        signal(client, "-KILL");
    }
    let output = bench.wait_with_output().unwrap();
    let summary = bench_summary(out.path(), &args, output);
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    let a = &summary["agents"];
    let lost = a["lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{a}");
    assert_eq!(lost[0]["index"], 1);
    assert!(lost[0]["last_second"].as_u64().is_some(), "{}", lost[0]);
    assert!(lost[0]["counters"]["shakes_sent"].as_u64().unwrap() > 0);
    assert_eq!(a["users_incomplete"], 1000);
    assert!(a["refused"].as_u64().unwrap() >= 1);
    assert!(a["refusals"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("wrong agent key"));
    // The others carried on to the end: their last reports came.
    for other in [0, 2] {
        let counters = &a["agents"][other]["counters"];
        assert!(counters["shakes_sent"].as_u64().unwrap() > 0);
    }
    drop(agents);
}

/// The bench aimed at a running server it did not start, twice, its load on agents: the
/// campaigns through the admin API with an operator key, the audit and the history check
/// through it; the second run's balance check is of its own gains only. The deployment
/// runs a shake campaign of its own all along, whose packets the bench's users win too:
/// each run judges its own campaigns only, and the second's history holds none of the
/// first's operations.
#[test]
fn a_bench_against_a_running_server_audits_through_its_admin_api() {
    let server = Serve::new().workers(2).start();
    let key_file = server.data_dir.join("admin.key");
    // The deployment's own campaign, released through both runs.
    server.shake_campaign(100_000, 40, 100, 100);
    for run in 0..2 {
        let out = tempfile::tempdir().unwrap();
        let args = format!(
            "--connections 1000 --phase-qps 300 --campaign-rate 200 --shake-packets 40 \
             --send-packets 20 --agents 2 --spawn-agents --target-clients {} \
             --target-admin http://{} --target-admin-key-file {}",
            server.listen,
            server.admin.addr,
            key_file.display()
        );
        let output = Command::new(env!("CARGO_BIN_EXE_hongbao"))
            .arg("bench")
            .args(args.split_whitespace())
            .arg("--out")
            .arg(out.path())
            .env("HONGBAO_SECRET", &server.secret)
            .output()
            .unwrap();
        let summary = bench_summary(out.path(), &args, output);
        assert_eq!(
            summary["audit"]["ok"], true,
            "run {run}: {}",
            summary["audit"]
        );
        assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
        assert!(summary["target"]
            .as_str()
            .unwrap()
            .contains("admin http://"));
        assert_eq!(summary["shake"]["won_clients"], 40);
        let h = &summary["history"];
        assert_eq!(h["wins_told"], 40, "the run's wins only: {h}");
        assert_eq!(
            h["ledger_only"]["count"], 0,
            "no earlier run's operations: {h}"
        );
        let told_all = summary["load"]["totals"]["won"].as_u64().unwrap();
        assert!(
            told_all > 40,
            "the deployment's packets were won too: {told_all}"
        );
        assert!(!out.path().join("data").exists(), "no server of its own");
    }
    // The server took both runs: its money adds up.
    assert_eq!(server.audit()["ok"], true);
}

/// The same bench with `--target-*` against a lab brought up by hand (`hongbao lab up`,
/// root): two gateways in cluster mode behind nginx, the load from two agents through
/// nginx, the campaigns and the audit through the first gateway's admin API.
#[test]
fn a_bench_against_a_lab_brought_up_by_hand_balances_every_cent() {
    if !common::is_root() {
        eprintln!("skipped: the lab's network namespaces need root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lab_dir = dir.path().join("lab");
    let number = hongbao_lab::free_lab_number(std::process::id().wrapping_add(97)).to_string();
    let secret = "a-lab-brought-up-by-hand-secret";
    let mut command = Command::new(env!("CARGO_BIN_EXE_hongbao"));
    command
        .args([
            "lab",
            "up",
            "--lab",
            &number,
            "--gateways",
            "2",
            "--workers",
            "1",
        ])
        .arg("--dir")
        .arg(&lab_dir)
        .env("HONGBAO_SECRET", secret);
    let mut lab = Hongbao::start("lab up", command);
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.starts_with("Ctrl-C")) {
        let line = lab
            .stdout
            .recv_timeout(Duration::from_secs(180))
            .unwrap_or_else(|e| panic!("the lab did not come up: {e}\n{}", lab.log()));
        lines.push(line);
    }
    let word_after = |prefix: &str, word: &str| -> String {
        let line = lines
            .iter()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in {lines:?}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == word).unwrap();
        words[at + 1].to_string()
    };
    let nginx_tcp = word_after("nginx    tcp", "tcp");
    let admin = word_after("gateway  gw1", "admin");
    let out = dir.path().join("bench");
    let args = format!(
        "--connections 2000 --phase-qps 400 --campaign-rate 200 --shake-packets 60 \
         --send-packets 30 --agents 2 --spawn-agents --target-clients {nginx_tcp} \
         --target-admin http://{admin} --target-admin-key-file {}",
        lab_dir.join("admin.key").display()
    );
    let output = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .arg("bench")
        .args(args.split_whitespace())
        .arg("--out")
        .arg(&out)
        .env("HONGBAO_SECRET", secret)
        .output()
        .unwrap();
    let summary = bench_summary(&out, &args, output);
    lab.interrupt();
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    assert_eq!(summary["shake"]["won_clients"], 60);
    assert_eq!(summary["send"]["opened_clients"], 90);
    assert!(!lab_dir.join("lab.json").exists(), "the lab is down");
}
