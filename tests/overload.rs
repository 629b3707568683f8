//! End-to-end tests of `hongbao serve` past what it admits: the shake rate, shakes that
//! waited too long in the kernel, the answers a read brings in one write, the load's
//! clients backing off when told `overloaded`, and a stalled worker.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

mod common;

use common::wire::*;
use common::{signal, wait_until, Serve, SECRET};
use hongbao_proto::{Message, ResultCode};
use serde_json::Value;

#[test]
fn shakes_over_the_rate_limit_are_overloaded() {
    // 10 a second for the server: 5 per worker.
    let server = Serve::new().args(["--max-shake-qps", "10"]).start();
    let mut client = server.login(1);
    let burst = 30;
    let mut ids = Vec::new();
    for _ in 0..burst {
        ids.push(client.send(&Message::Shake).unwrap());
    }
    let mut counts = BTreeMap::new();
    for id in ids {
        let frame = client.recv().unwrap();
        assert_eq!(frame.request_id, id);
        let Message::ShakeReply {
            result,
            retry_after_ms,
            ..
        } = frame.message
        else {
            panic!("expected a shake reply, got {frame:?}");
        };
        // Every shed shake names a wait (drawn around 1 s, at most 64 s); no other answer
        // does.
        match result {
            ResultCode::Overloaded => {
                assert!((1..=64_000).contains(&retry_after_ms), "{retry_after_ms}")
            }
            _ => assert_eq!(retry_after_ms, 0),
        }
        *counts.entry(result.name()).or_insert(0) += 1;
    }
    let overloaded = counts.get("overloaded").copied().unwrap_or(0);
    let nothing = counts.get("nothing").copied().unwrap_or(0);
    assert_eq!(overloaded + nothing, burst, "{counts:?}");
    // At most two seconds' worth of one worker's share got through.
    assert!(nothing <= 10, "{counts:?}");
    assert!(overloaded >= burst - 10, "{counts:?}");
    // The next second admits again.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(shake_result(&mut client).0, ResultCode::Nothing);
}

#[test]
fn shakes_that_waited_too_long_are_overloaded() {
    let server = Serve::new().args(["--max-queue-ms", "100"]).start();
    let mut client = server.login(1);
    assert_eq!(shake_result(&mut client).0, ResultCode::Nothing);
    let pids: Vec<u32> = server.worker_pids();
    // Frozen workers cannot read: the shake waits in the kernel well past 100 ms.
    for &pid in &pids {
        signal(pid, "-STOP");
    }
    let id = client.send(&Message::Shake).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    for &pid in &pids {
        signal(pid, "-CONT");
    }
    let frame = client.recv().unwrap();
    assert_eq!(frame.request_id, id);
    assert!(
        matches!(
            frame.message,
            Message::ShakeReply {
                result: ResultCode::Overloaded,
                retry_after_ms: 1..=64_000,
                ..
            }
        ),
        "{frame:?}"
    );
    // A shake read in time is served as usual.
    assert_eq!(shake_result(&mut client).0, ResultCode::Nothing);
    wait_until("the shed shake to be counted", secs(10), || {
        let totals = &server.get("/v1/stats")["totals"];
        (totals["shakes_shed_late"] == 1 && totals["shakes_overloaded"] == 1).then_some(())
    });
}

/// The answers to the requests one read brings go out in one write: 50 shakes that
/// waited in the kernel while the workers were stopped are answered, in order, with a
/// write or two — not a write each (the `writes` counter).
#[test]
fn one_reads_requests_are_answered_in_one_write() {
    let server = Serve::new().start();
    let mut client = server.login(1);
    assert_eq!(shake_result(&mut client).0, ResultCode::Nothing);
    let totals = |shakes: u64| {
        wait_until("the shakes to be counted", secs(10), || {
            let totals = server.get("/v1/stats")["totals"].clone();
            (totals["shakes"] == shakes).then_some(totals["writes"].as_u64().unwrap())
        })
    };
    let pids: Vec<u32> = server.worker_pids();
    let before = totals(1);
    for &pid in &pids {
        signal(pid, "-STOP");
    }
    let ids: Vec<u32> = (0..50)
        .map(|_| client.send(&Message::Shake).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for &pid in &pids {
        signal(pid, "-CONT");
    }
    for id in ids {
        let frame = client.recv().unwrap();
        assert_eq!(frame.request_id, id);
        assert!(
            matches!(
                frame.message,
                Message::ShakeReply {
                    result: ResultCode::Nothing,
                    ..
                }
            ),
            "{frame:?}"
        );
    }
    let writes = totals(51) - before;
    assert!((1..=3).contains(&writes), "{writes} writes for 50 answers");
}

/// Users told "overloaded" stop shaking for the back-off time: with the server's shake
/// limit far under the offered rate, a load that backs off sends a fraction of what one
/// that keeps shaking sends, and counts the firings it skipped as backed off.
#[test]
fn load_users_told_overloaded_back_off() {
    let server = Serve::new().args(["--max-shake-qps", "50"]).start();
    let run = |backoff_secs: &str| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_hongbao"))
            .args(["load", "--server", &server.listen.to_string()])
            .args(["--users", "100", "--qps", "500"])
            .args(["--procs", "1", "--duration", "5"])
            .args(["--secret", SECRET, "--overload-backoff-secs", backoff_secs])
            .output()
            .expect("running hongbao load");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "load failed: {stdout}");
        // Progress lines, then the summary as pretty JSON.
        let start = stdout.rfind("\n{").expect("a summary") + 1;
        serde_json::from_str(&stdout[start..]).expect("the summary parses")
    };
    let n = |v: &Value, k: &str| v["totals"][k].as_u64().unwrap();

    let steady = run("0");
    assert_eq!(n(&steady, "backed_off"), 0);
    assert!(n(&steady, "overloaded") > 1000, "{steady}");

    // 5 firings per user per second; the server, shedding all along, asks for waits of
    // 1 s, then 2, 4, 8 s...: users skip several firings for every one they send.
    let backing = run("60");
    let (sent, skipped) = (n(&backing, "shakes_sent"), n(&backing, "backed_off"));
    assert!(n(&backing, "overloaded") >= 1, "{backing}");
    assert!(
        skipped > sent,
        "sent {sent}, backed off {skipped}: {backing}"
    );
    assert!(sent < n(&steady, "shakes_sent") / 2, "{backing}");
    assert_eq!(n(&backing, "error_replies"), 0);
}

/// A gateway worker stopped for 300 ms (SIGSTOP, SIGCONT): it sheds the shakes that
/// waited past `max_queue_ms`, asking for the base wait of about a second, and the load's
/// users follow it — each skips about a second of its firings, not the 30 s they wait
/// when the server names no wait — so the stall costs about a second of shaking. In the
/// `fifo` read order the worker, its queue drained, sets a shake cap (worker/cap.rs); in
/// the adaptive order (the default) it never does.
#[test]
fn a_stalled_worker_costs_its_users_about_a_second() {
    for order in ["fifo", "adaptive"] {
        stalled_worker(order);
    }
}

fn stalled_worker(order: &str) {
    let server = Serve::new()
        .args(["--max-queue-ms", "100", "--ready-order", order])
        .start();
    let pid = server.worker_pids()[0];
    // 1,000 users at 2,000 a second: each fires twice a second.
    let (users, qps, duration) = (1000u64, 2000u64, 12u64);
    let load = Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args(["load", "--server", &server.listen.to_string()])
        .args(["--users", &users.to_string(), "--qps", &qps.to_string()])
        .args(["--procs", "1", "--duration", &duration.to_string()])
        .args(["--secret", SECRET, "--overload-backoff-secs", "30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running hongbao load");
    // Past the connecting, with most of the run still to come after the stall.
    std::thread::sleep(secs(3));
    signal(pid, "-STOP");
    std::thread::sleep(Duration::from_millis(300));
    signal(pid, "-CONT");
    // Once its queue has drained, a FIFO worker caps its shakes at what it served (a
    // level in its stats, reported once a second, dropped after 30 s refusing nothing).
    let capped = (0..40).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let stats = server.get("/v1/stats");
        stats["workers"]
            .as_array()
            .is_some_and(|ws| ws.iter().any(|w| w["shake_cap"].as_u64() > Some(0)))
    });
    let out = load.wait_with_output().expect("the load's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "load failed: {stdout}");
    let start = stdout.rfind("\n{").expect("a summary") + 1;
    let summary: Value = serde_json::from_str(&stdout[start..]).expect("the summary parses");
    let n = |k: &str| summary["totals"][k].as_u64().unwrap();
    let (overloaded, backed_off) = (n("overloaded"), n("backed_off"));
    assert!(overloaded > 0, "nothing was shed: {summary}");
    let shed_late = server.get("/v1/stats")["totals"]["shakes_shed_late"]
        .as_u64()
        .unwrap();
    assert!(shed_late > 0, "no shake shed as late");
    // Each shed user waited 0.5–1.5 s (or twice that should the shedding straddle a
    // second boundary): at 2 firings a second, at most ~6 skipped each. Waiting 15–45 s
    // it would have skipped every firing to the run's end, 18 or more.
    let per_user = qps / users;
    eprintln!("stall: {overloaded} shed, {backed_off} firings backed off");
    assert!(
        backed_off <= overloaded * per_user * 3,
        "{overloaded} shed, {backed_off} firings backed off: {summary}"
    );
    assert_eq!(n("error_replies"), 0, "{summary}");
    // The stall's oldest shakes waited all 300 ms and were shed; `served_latency_ms` is
    // the shakes answered won or nothing alone, a part of `latency_ms`'s.
    let ms = |dist: &str, q: &str| summary[dist][q].as_f64().unwrap();
    assert!(ms("latency_ms", "max") >= 290.0, "{summary}");
    assert!(ms("served_latency_ms", "p50") > 0.0, "{summary}");
    assert!(
        ms("served_latency_ms", "max") <= ms("latency_ms", "max"),
        "{summary}"
    );
    assert_eq!(
        capped,
        order == "fifo",
        "{order}: a shake cap set after the queue drained: {capped}"
    );
}
