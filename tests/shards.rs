//! The ledger over several PostgreSQL formations, for real (docs/scale-out.md, "Shards"):
//! labs whose ledger has two shards (root; Debian's redis-server and PostgreSQL, and
//! pg_auto_failover for the standby). A bench over both balances to the cent with credits
//! crossing between them; one shard's primary lost (each shard a formation), or one
//! shard frozen, leaves the other winning every second;
//! a gateway given the shards in another order is refused at start and starts nothing.

use std::io::Write;
use std::process::Command;
use std::time::Duration;

mod common;

use common::SECRET;
use hongbao_lab::{Lab, LabPlan};

/// One lab at a time: two would slow each other on two cores.
static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_lab() -> std::sync::MutexGuard<'static, ()> {
    ONE_LAB.lock().unwrap_or_else(|e| e.into_inner())
}

fn skipped(test: &str, why: &str) -> bool {
    let _ = writeln!(std::io::stderr(), "SKIPPED shards::{test}: {why}");
    false
}

fn can_run(test: &str) -> bool {
    common::is_root() || skipped(test, "the lab needs root (network namespaces)")
}

/// Every shard's hash chains walked, each named by its shard, and credits relayed.
fn assert_sharded(summary: &serde_json::Value) {
    assert_eq!(summary["audit"]["ok"], true, "{}", summary["audit"]);
    assert_eq!(summary["audit"]["server"]["ok"], true);
    assert_eq!(summary["history"]["ok"], true, "{}", summary["history"]);
    let heads = summary["audit"]["server"]["ledger_heads"]
        .as_object()
        .expect("heads");
    for shard in ["0/", "1/"] {
        assert!(heads.keys().any(|h| h.starts_with(shard)), "{heads:?}");
    }
    let outbox = &summary["engines"]["outbox"];
    assert_eq!(outbox["shards"], 2, "{outbox}");
    assert!(outbox["credits"].as_u64().unwrap() > 0, "{outbox}");
    assert_eq!(outbox["waiting"], 0, "{outbox}");
    assert_eq!(summary["audit"]["server"]["credits_in_flight_cents"], 0);
}

/// `bench --hosts 2 --shards 2 --release-tags 3`: wins and opens on both shards, the
/// credits whose wallets are on the other shard relayed, the release split over three
/// Redis slots; every packet won, every share opened, the audit and the history exact.
#[test]
fn a_bench_over_two_shards_and_three_release_tags_balances_to_the_cent() {
    if !can_run("a_bench_over_two_shards_and_three_release_tags_balances_to_the_cent") {
        return;
    }
    let _one = one_lab();
    let out = tempfile::tempdir().unwrap();
    let summary = common::run_bench(
        out.path(),
        "--hosts 2 --shards 2 --release-tags 3 --connections 1000 --workers 1 --procs 1 \
         --phase-qps 500 --campaign-rate 100 --shake-packets 300 --send-packets 60",
    );
    assert_sharded(&summary);
    common::assert_faults_cost_nothing(&summary, out.path());
}

/// `bench --hosts 2 --shards 2 --fault primary-lost:1`: both shards are formations (a
/// primary, its synchronous standby, their monitor); shard 1's primary is lost with its
/// disk (its standby takes over) while shard 0 carries on: shard 0 wins in every second
/// of the fault's window, shard 1 commits again, nothing acknowledged is lost and every
/// credit in flight is delivered once (how soon, and how much of its rate the other
/// keeps, is the bench's to measure: scripts/shards-sitting.sh, docs/BENCHMARKS.md).
#[test]
fn one_shards_primary_lost_leaves_the_other_winning_and_loses_nothing() {
    let test = "one_shards_primary_lost_leaves_the_other_winning_and_loses_nothing";
    if !can_run(test) {
        return;
    }
    if let Some(why) = common::missing_pg_autoctl() {
        skipped(test, &why);
        return;
    }
    shard_one_faulted(
        "primary-lost:1",
        5000,
        "lost shard 1's primary",
        "shard 0 stopped winning while shard 1's primary was lost",
    );
}

/// `bench --hosts 2 --shards 2 --fault shard-freeze:1`: shard 1's one PostgreSQL frozen
/// for 20 s (every process of its host SIGSTOPped) while shard 0 carries on: shard 0 wins
/// in every second of the fault's window, shard 1 commits again once let go, and its
/// batches sent again meanwhile are each paid once — the audit and the history exact.
#[test]
fn one_shard_frozen_leaves_the_other_winning_and_loses_nothing() {
    if !can_run("one_shard_frozen_leaves_the_other_winning_and_loses_nothing") {
        return;
    }
    shard_one_faulted(
        "shard-freeze:1",
        7000,
        "froze shard 1",
        "shard 0 stopped winning while shard 1 was frozen",
    );
}

/// A bench over two shards with `fault` done to shard 1 6 s in (a campaign of `packets`
/// at 200 a second): the fault said `did`, shard 1 committed again, shard 0 won in every
/// second of the fault's window, and the faults cost nothing.
fn shard_one_faulted(fault: &str, packets: u32, did: &str, stalled: &str) {
    let _one = one_lab();
    let out = tempfile::tempdir().unwrap();
    let summary = common::run_bench(
        out.path(),
        &format!(
            "--hosts 2 --shards 2 --connections 1000 --workers 1 --procs 1 --phase-qps 1000 \
             --campaign-rate 200 --shake-packets {packets} --send-packets 100 \
             --fault {fault} --fault-at 6"
        ),
    );
    assert_sharded(&summary);
    let fault = &summary["fault"];
    let what = fault["what"].as_str().unwrap();
    assert!(what.contains(did), "{what}");
    assert!(what.contains("shard 1 committed again"), "{what}");
    let shards = fault["shards"]
        .as_array()
        .expect("each shard through the fault");
    assert_eq!(shards.len(), 2, "{fault}");
    assert!(shards[0]["window_secs"].as_u64().unwrap() > 3, "{fault}");
    assert!(
        shards[0]["min_per_sec"].as_u64().unwrap() > 0,
        "{stalled}: {fault}"
    );
    common::assert_faults_cost_nothing(&summary, out.path());
}

/// A gateway given the lab's two shards in the other order (or one of them left out):
/// each formation recorded which shard it is at the lab's first start, so the gateway
/// says which one disagrees and exits without serving.
#[test]
fn a_gateway_whose_shard_map_disagrees_is_refused_at_start() {
    if !can_run("a_gateway_whose_shard_map_disagrees_is_refused_at_start") {
        return;
    }
    let _one = one_lab();
    let dir = tempfile::tempdir().unwrap();
    let seed = std::process::id() ^ 0x54a2;
    let lab = Lab::up(LabPlan {
        lab: hongbao_lab::free_lab_number(seed),
        dir: dir.path().to_path_buf(),
        gateways: 1,
        loads: 0,
        nginx: false,
        hongbao: env!("CARGO_BIN_EXE_hongbao").into(),
        serve: hongbao_server::config::ServeFlags {
            workers: Some("1".into()),
            secret: Some(SECRET.into()),
            ..Default::default()
        },
        monitor_key: None,
        postgres_disk: None,
        standby: false,
        shards: 2,
    })
    .expect("the lab with two shards comes up");
    let (zero, one) = (lab.shard_url(0), lab.shard_url(1));
    for (postgres, says) in [
        (
            format!("{one};{zero}"),
            "formation 0 records version 1 (2 shards, this formation shard 1)",
        ),
        (zero.clone(), "this host's map is version 1 (1 shards"),
    ] {
        let data = tempfile::tempdir().unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_hongbao"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data.path())
            .args(["--redis", &lab.redis_urls(), "--postgres", &postgres])
            .arg("--redis-password-file")
            .arg(dir.path().join(hongbao_lab::REDIS_PASSWORD_FILE))
            .arg("--postgres-password-file")
            .arg(dir.path().join(hongbao_lab::POSTGRES_PASSWORD_FILE))
            .arg("--engines-ca")
            .arg(lab.tls_dir().join("ca.pem"))
            .args(["--host-name", "stranger", "--workers", "1"])
            .env("HONGBAO_SECRET", SECRET)
            .output()
            .expect("running hongbao serve");
        let said = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "it started: {said}");
        assert!(said.contains(says), "{said}");
        assert!(!said.contains("hongbao serve ready"), "{said}");
    }
    // The lab's own gateway, on the map the formations hold, is serving all along.
    let gw = &lab.gateways[0];
    let answer = ureq::get(&format!("http://{}/v1/audit", gw.admin()))
        .set("Authorization", &format!("Bearer {}", lab.admin_key))
        .timeout(Duration::from_secs(10))
        .call()
        .expect("the lab's gateway answers");
    let audit: serde_json::Value = answer.into_json().unwrap();
    assert_eq!(audit["ok"], true, "{audit}");
}
