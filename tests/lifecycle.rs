//! End-to-end tests of `hongbao serve`'s life: a worker killed or its binary gone and
//! restarted while the others carry on, a crash that loses nothing acknowledged, SIGTERM's
//! drain, and a full disk that refuses what needs the ledger until there is room.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use common::wire::*;
use common::{is_closed, signal, wait_until, Serve};
use hongbao_proto::client::Client;
use hongbao_proto::{KickReason, Message, ResultCode};
use serde_json::json;

/// A deploy (or a rebuild) replaces the binary under a running server: a worker that
/// dies afterwards is started again all the same, from the binary the supervisor runs.
#[test]
fn a_worker_is_restarted_after_the_binary_on_disk_is_gone() {
    let bin = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let exe = bin.path().join("hongbao");
    std::fs::hard_link(env!("CARGO_BIN_EXE_hongbao"), &exe)
        .or_else(|_| std::fs::copy(env!("CARGO_BIN_EXE_hongbao"), &exe).map(drop))
        .unwrap();
    let mut server = Serve::new().exe(&exe).start();
    std::fs::remove_file(&exe).unwrap();
    let workers = wait_until("both workers to report", secs(10), || {
        let workers = server.stats_workers();
        (workers.len() == 2).then_some(workers)
    });
    let victim = workers[0]["pid"].as_u64().unwrap() as u32;
    signal(victim, "-9");
    wait_until("the worker to be started again", secs(10), || {
        let workers = server.stats_workers();
        (workers.len() == 2
            && workers
                .iter()
                .all(|w| w["pid"].as_u64().is_some_and(|p| p as u32 != victim)))
        .then_some(())
    });
    let exited = server.process.child.try_wait().unwrap();
    assert!(exited.is_none(), "the supervisor exited: {exited:?}");
}

#[test]
fn a_killed_worker_is_restarted_and_the_others_carry_on() {
    let server = Serve::new().start();
    let campaign = server.shake_campaign(40, 1000, 100, 100);
    let (mut clients, workers) = users_on_both_workers(&server, 1);
    let victim = &workers[0];
    let (victim_index, victim_pid) = (
        victim["worker"].as_u64().unwrap(),
        victim["pid"].as_u64().unwrap() as u32,
    );
    let victims_users = victim["logged_in"].as_u64().unwrap() as usize;
    wait_until("both pools to be dealt", secs(10), || {
        let workers = server.stats_workers();
        workers
            .iter()
            .all(|w| w["pool_packets"].as_u64().unwrap() > 0)
            .then_some(())
    });

    signal(victim_pid, "-9");
    wait_until("the worker to die", secs(5), || {
        process_gone(victim_pid).then_some(())
    });

    // The victim's clients were cut off; the others still talk.
    let mut cut_off = Vec::new();
    for (&user, client) in clients.iter_mut() {
        match ping(client, user) {
            Ok(()) => {}
            Err(e) if is_closed(&e) => cut_off.push(user),
            Err(e) => panic!("user {user}: {e}"),
        }
    }
    assert_eq!(cut_off.len(), victims_users, "cut off: {cut_off:?}");
    for user in &cut_off {
        clients.remove(user);
    }
    let survivors: Vec<u64> = clients.keys().copied().collect();
    let (a, b) = (survivors[0], *survivors.last().unwrap());
    assert_eq!(
        chat_result(clients.get_mut(&a).unwrap(), b, "ok?"),
        ResultCode::Delivered
    );
    expect_chat(clients.get_mut(&b).unwrap(), a, "ok?");
    for user in &cut_off {
        let client = clients.get_mut(&a).unwrap();
        wait_until("a cut-off user to be offline", secs(5), || {
            (chat_result(client, *user, "there?") == ResultCode::Offline).then_some(())
        });
    }

    // Back under a new pid, counted as a restart.
    let stats = wait_until("the worker to come back", secs(10), || {
        let stats = server.get("/v1/stats");
        let workers = stats["workers"].as_array().unwrap();
        let back = workers.iter().find(|w| w["worker"] == victim_index)?;
        (back["pid"].as_u64().unwrap() as u32 != victim_pid).then_some(stats.clone())
    });
    let workers = stats["workers"].as_array().unwrap();
    for w in workers {
        let restarts = w["restarts"].as_u64().unwrap();
        if w["worker"] == victim_index {
            assert!(restarts >= 1);
        } else {
            assert_eq!(restarts, 0);
        }
    }
    // Totals are the sum of the live workers' levels, not of the dead one's too.
    let sum = |key: &str| -> u64 { workers.iter().map(|w| w[key].as_u64().unwrap()).sum() };
    assert_eq!(stats["logged_in"], sum("logged_in"), "{stats:#}");
    assert_eq!(stats["connections"], sum("connections"), "{stats:#}");

    // The cut-off users come back; everybody can reach everybody.
    for &user in &cut_off {
        clients.insert(user, server.login(user));
    }
    for &user in &cut_off {
        let text = format!("welcome back {user}");
        assert_eq!(
            chat_result(clients.get_mut(&a).unwrap(), user, &text),
            ResultCode::Delivered
        );
        expect_chat(clients.get_mut(&user).unwrap(), a, &text);
    }

    // The dead worker's pool went back into play: every packet can still be won (by
    // clients on both workers, since each worker's pool is its own).
    spread_over_workers(&server, &mut clients, 1000);
    let mut won = 0;
    let deadline = Instant::now() + secs(15);
    while won < 40 {
        if Instant::now() > deadline {
            let status = server.get(&format!("/v1/campaigns/{campaign}"));
            let stats = server.get("/v1/stats");
            panic!("only {won} of 40 packets won: {status:#} {stats:#}");
        }
        let mut any = false;
        for client in clients.values_mut() {
            if let (ResultCode::Won, _, 100) = shake_result(client) {
                won += 1;
                any = true;
            }
        }
        if !any {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let status = server.get(&format!("/v1/campaigns/{campaign}"));
    assert_eq!(
        (status["won"].clone(), status["state"].clone()),
        (json!(40), json!("done"))
    );
    let audit = server.audit();
    assert_eq!(audit["user_balances_cents"], 4000);
    assert_eq!(audit["unclaimed_cents"], 0);
}

#[test]
fn a_crash_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Serve::new().data_dir(dir.path()).start();
    assert_eq!(server.replayed_events, 0);
    let users = [1, 2, 3, 4, 5];
    let mut clients: BTreeMap<u64, Client> = users.iter().map(|&u| (u, server.login(u))).collect();

    server.shake_campaign(20, 1000, 500, 500);
    shake_until_won(clients.get_mut(&1).unwrap(), 2);
    shake_until_won(clients.get_mut(&2).unwrap(), 2);
    let c1 = clients.get_mut(&1).unwrap();
    let (result, from_1, _) = send_result(c1, 700, 3, &[3, 4, 5]);
    assert_eq!(result, ResultCode::Ok);
    let (result, opened_by_3) = open_result(clients.get_mut(&3).unwrap(), from_1);
    assert_eq!(result, ResultCode::Opened);
    let (result, from_2, _) = send_result(clients.get_mut(&2).unwrap(), 400, 2, &[4, 5]);
    assert_eq!(result, ResultCode::Ok);
    // Still running at the crash; nobody shakes for it.
    let running = server.shake_campaign(1000, 5, 1, 10);

    let audit = server.audit();
    assert_eq!(audit["unopened_shares"], 4);
    assert!(audit["unclaimed_cents"].as_u64().unwrap() > 0);
    let balances: Vec<u64> = users.iter().map(|&u| server.balance(u)).collect();
    assert_eq!(balances[..3], [300, 600, opened_by_3]);
    let campaigns = server.get("/v1/campaigns");
    // Workers report (with their pids) once a second.
    let worker_pids: Vec<u32> = server.worker_pids();

    server.crash();
    // Workers exit when their link to the core closes; their clients see the end.
    for &pid in &worker_pids {
        wait_until("a worker to exit after the crash", secs(5), || {
            process_gone(pid).then_some(())
        });
    }
    for client in clients.values_mut() {
        expect_closed_after_pushes(client);
    }
    drop(clients);

    let mut server = Serve::new().data_dir(dir.path()).start();
    assert!(server.replayed_events > 0);
    assert_eq!(server.audit(), audit);
    let after: Vec<u64> = users.iter().map(|&u| server.balance(u)).collect();
    assert_eq!(after, balances);
    let mut resumed = server.get("/v1/campaigns");
    for c in resumed.as_array_mut().unwrap().iter_mut() {
        // Released-but-unwon packets are released again from the restart on.
        for field in ["released", "released_all_ms"] {
            c.as_object_mut().unwrap().remove(field);
        }
    }
    let mut expected = campaigns.clone();
    for c in expected.as_array_mut().unwrap().iter_mut() {
        for field in ["released", "released_all_ms"] {
            c.as_object_mut().unwrap().remove(field);
        }
    }
    assert_eq!(resumed, expected);
    let status = server.get(&format!("/v1/campaigns/{running}"));
    assert_eq!(status["state"], "running");

    // The unopened shares are still there to open, and their recipients are told again.
    let mut r4 = server.login(4);
    let told: BTreeSet<u64> = (0..2).map(|_| expect_notice(&mut r4).0).collect();
    assert_eq!(told, BTreeSet::from([from_1, from_2]));
    let (result, a) = open_result(&mut r4, from_1);
    assert_eq!(result, ResultCode::Opened);
    let (result, b) = open_result(&mut r4, from_2);
    assert_eq!(result, ResultCode::Opened);
    let mut r3 = server.login(3);
    assert_eq!(
        open_result(&mut r3, from_1),
        (ResultCode::AlreadyOpened, opened_by_3)
    );
    assert_eq!(server.balance(4), a + b);
    let audit = server.audit();

    // A graceful stop tells clients why, and keeps everything too.
    server.stop();
    expect_kick(&mut r4, KickReason::Shutdown);
    expect_closed(&mut r4);
    let server = Serve::new().data_dir(dir.path()).start();
    assert_eq!(server.audit(), audit);
    assert_eq!(server.balance(4), a + b);
    assert_eq!(server.balance(1), 300);
}

/// SIGTERM drains: the server is not ready from that moment and takes no new connection,
/// its clients are let go over `drain_secs` — each kicked `shutdown` and told to come back
/// in about a second — while those not yet let go are still served; then it exits
/// cleanly, its ledger whole.
#[test]
fn sigterm_lets_the_clients_go_over_the_drain_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Serve::new()
        .workers(2)
        .data_dir(dir.path())
        .config("drain_secs = 3\n")
        .start();
    server.shake_campaign(1_000, 1_000, 1, 1);
    let clients: Vec<Client> = (1..=20).map(|user| server.login(user)).collect();
    let t0 = Instant::now();
    signal(server.pid(), "-TERM");
    // Each client shakes on until its kick comes: when it came, what it said, and how
    // many shakes were answered meanwhile.
    let watchers: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            std::thread::spawn(move || {
                let mut answered = 0;
                loop {
                    client.send(&Message::Shake).unwrap();
                    let frame = client.recv().expect("a reply or a kick");
                    match frame.message {
                        Message::Kick {
                            reason,
                            retry_after_ms,
                            ..
                        } => {
                            let at = t0.elapsed();
                            expect_closed(&mut client);
                            return (at, reason, retry_after_ms, answered);
                        }
                        Message::ShakeReply { .. } => answered += 1,
                        Message::Error { .. } => {} // over a limit: still answered
                        other => panic!("while draining: {other:?}"),
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        })
        .collect();
    wait_until("/readyz to say not ready", secs(5), || {
        (server.admin.without_key().http("GET", "/readyz", None).0 == 503).then_some(())
    });
    wait_until("a new connection refused", secs(5), || {
        std::net::TcpStream::connect(server.listen)
            .is_err()
            .then_some(())
    });
    let mut kicks: Vec<_> = watchers.into_iter().map(|w| w.join().unwrap()).collect();
    kicks.sort_by_key(|k| k.0);
    for (_, reason, retry_after_ms, _) in &kicks {
        assert_eq!(
            (*reason, *retry_after_ms),
            (KickReason::Shutdown, 1_000),
            "{kicks:?}"
        );
    }
    // Ten a worker, the k-th at k/10 of the 3 s: the first after 0.3 s, the last at 3 s —
    // not all at once, as SIGINT does.
    let (first, last) = (kicks[0].0, kicks[kicks.len() - 1].0);
    assert!(
        last - first >= Duration::from_millis(1_500),
        "kicks from {first:?} to {last:?}"
    );
    assert!(
        kicks.iter().map(|k| k.3).sum::<u32>() >= 20,
        "shakes went unanswered while draining: {kicks:?}"
    );
    let exit = wait_until("the server to stop after its drain", secs(20), || {
        server.process.child.try_wait().unwrap()
    });
    assert!(exit.success(), "{exit:?}");
    let server = Serve::new().data_dir(dir.path()).start();
    assert_eq!(server.audit()["ok"], true, "{}", server.audit());
}

/// A tmpfs mounted for one test (root), unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallDisk(dir.to_path_buf()))
    }

    /// Fills what room is left with `path`.
    fn fill(&self, path: &Path) {
        let mut file = std::fs::File::create(path).unwrap();
        let chunk = vec![0u8; 16 << 10];
        while std::io::Write::write_all(&mut file, &chunk).is_ok() {}
        let _ = file.sync_all();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The ledger's disk fills up: the send whose commit failed waits (nothing acknowledged
/// that is not durable), what needs the ledger meanwhile is answered `unavailable` at
/// once, the server does not stop, and once there is room again the waiting send is
/// answered and everything works — with the audit exact.
#[test]
fn a_full_disk_refuses_what_needs_the_ledger_until_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("ledger");
    let Some(disk) = SmallDisk::mount(&data, "4m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let mut server = Serve::new().data_dir(&data).start();
    server.shake_campaign(20, 1000, 1000, 1000);
    let mut winner = server.login(7);
    shake_until_won(&mut winner, 3);
    drop(winner);
    let fill = data.join("fill");
    disk.fill(&fill);
    // Sends until one is not answered in time: its commit is failing, its reply waits.
    let mut waiting = None;
    let mut acknowledged = 0;
    for _ in 0..400 {
        let mut client = server.login(7);
        client.set_timeout(Duration::from_millis(1500)).unwrap();
        match client.send_packet(1, 1, &[8]) {
            Ok(Message::SendReply {
                result: ResultCode::Ok,
                ..
            }) => acknowledged += 1,
            Ok(other) => panic!("a send before the disk refused: {other:?}"),
            Err(_) => {
                waiting = Some(client);
                break;
            }
        }
    }
    let mut waiting = waiting.expect("a commit failed with the disk full");
    // Meanwhile: sends and opens are refused at once, reads and pings answered.
    let mut other = server.login(9);
    for _ in 0..3 {
        match other.send_packet(1, 1, &[8]).expect("an answer") {
            Message::Error {
                result: ResultCode::Unavailable,
                text,
                ..
            } => assert!(text.contains("cannot commit"), "{text}"),
            m => panic!("a send while the ledger cannot commit: {m:?}"),
        }
    }
    ping(&mut other, 1).unwrap();
    assert!(!process_gone(server.pid()), "the server stopped");
    // Room again: the waiting send is answered, and new ones go through.
    std::fs::remove_file(&fill).unwrap();
    waiting.set_timeout(secs(10)).unwrap();
    match waiting.recv().expect("the waiting send's answer").message {
        Message::SendReply {
            result: ResultCode::Ok,
            ..
        } => acknowledged += 1,
        m => panic!("the waiting send: {m:?}"),
    }
    assert_eq!(
        send_result(&mut other, 1, 1, &[8]).0,
        ResultCode::InsufficientFunds
    );
    assert_eq!(send_result(&mut waiting, 1, 1, &[8]).0, ResultCode::Ok);
    acknowledged += 1;
    let audit = server.audit();
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(
        server.get("/v1/users/7")["balance_cents"],
        3000 - acknowledged
    );
    server.stop();
}
