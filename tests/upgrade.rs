//! `hongbao serve --upgrade` and SIGUSR2, against the real binary: a new server takes the
//! old one's listening sockets (no connection attempt refused at any moment), the old one
//! drains its clients to it, and the ledger passes from the old core to the new with
//! nothing acknowledged lost.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod common;

use common::{signal, token, wait_until, Serve, SECRET};
use hongbao_proto::client::Client;
use hongbao_proto::{KickReason, Message, ResultCode};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Connects to `addr` every 2 ms until `stop`: (connected, refused, other failures).
fn connect_in_a_loop(addr: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<(u64, u64, u64)> {
    std::thread::spawn(move || {
        let (mut ok, mut refused, mut other) = (0, 0, 0);
        while !stop.load(Ordering::Relaxed) {
            match TcpStream::connect_timeout(&addr, secs(2)) {
                Ok(_) => ok += 1,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => refused += 1,
                Err(_) => other += 1,
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        (ok, refused, other)
    })
}

/// What a shaking user saw: the cents it won, the kicks it was given (reason, hint),
/// and the shakes answered.
#[derive(Debug, Default)]
struct Seen {
    won_cents: u64,
    kicks: Vec<(KickReason, u32)>,
    answered: u64,
}

fn logged_in(addr: SocketAddr, user: u64) -> Client {
    let mut client = Client::connect(addr).expect("connecting (never refused)");
    client.set_timeout(secs(10)).unwrap();
    let result = client.login(&token(SECRET, user)).expect("login");
    assert_eq!(result, ResultCode::Ok, "login of user {user}");
    client
}

/// A user that shakes every 50 ms until `stop`, coming back (logged in again) after a
/// kick as the kick says.
fn shake_until(addr: SocketAddr, user: u64, stop: Arc<AtomicBool>) -> JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut seen = Seen::default();
        let mut client = logged_in(addr, user);
        while !stop.load(Ordering::Relaxed) {
            client.send(&Message::Shake).expect("sending a shake");
            loop {
                let frame = client.recv().expect("a reply or a kick");
                match frame.message {
                    Message::ShakeReply {
                        result,
                        amount_cents,
                        ..
                    } => {
                        seen.answered += 1;
                        if result == ResultCode::Won {
                            seen.won_cents += amount_cents;
                        }
                        break;
                    }
                    Message::Kick {
                        reason,
                        retry_after_ms,
                        ..
                    } => {
                        seen.kicks.push((reason, retry_after_ms));
                        std::thread::sleep(Duration::from_millis(retry_after_ms.into()));
                        client = logged_in(addr, user);
                        break;
                    }
                    _ => {} // a notice, a broadcast
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    })
}

/// The pid a data directory's lock names.
fn lock_holder(data_dir: &Path) -> (String, u32) {
    let text = std::fs::read_to_string(data_dir.join("hongbao.lock")).unwrap();
    let pid = text
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in the lock: {text}"));
    (text, pid)
}

#[test]
fn an_upgrade_takes_the_sockets_then_the_ledger_and_refuses_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = "drain_secs = 2\n";
    let old = Serve::new()
        .workers(2)
        .data_dir(dir.path())
        .config(config)
        .start();
    old.shake_campaign(1_000_000, 400, 1, 100);
    let addr = old.listen;
    let stop = Arc::new(AtomicBool::new(false));
    let connector = connect_in_a_loop(addr, stop.clone());
    let users: Vec<_> = (1..=20)
        .map(|user| shake_until(addr, user, stop.clone()))
        .collect();
    std::thread::sleep(secs(1));

    // The same command line (ports 0 included: the sockets are handed over, not bound),
    // with --upgrade, and a worker more.
    let started = Instant::now();
    let new = Serve::new()
        .workers(3)
        .data_dir(dir.path())
        .config(config)
        .args(["--upgrade"])
        .start();
    assert_eq!(new.listen, addr, "{}", new.ready);
    assert_eq!(
        new.admin.addr, old.admin.addr,
        "the admin socket handed over"
    );
    let mut old = old;
    let exit = wait_until("the old server to drain and stop", secs(30), || {
        old.process.child.try_wait().unwrap()
    });
    assert!(exit.success(), "{exit:?}\n{}", old.process.log());
    let took = started.elapsed();
    wait_until("the new server to take the ledger", secs(10), || {
        new.process
            .log()
            .contains("the ledger is this server's")
            .then_some(())
    });
    // A second and a half of serving alone, then the count.
    std::thread::sleep(Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    let (connected, refused, failed) = connector.join().unwrap();
    let seen: Vec<Seen> = users.into_iter().map(|u| u.join().unwrap()).collect();

    assert_eq!(
        (refused, failed),
        (0, 0),
        "connection attempts refused or failed through the upgrade ({connected} connected)"
    );
    assert!(connected > 100, "only {connected} connected in {took:?}");
    for (i, s) in seen.iter().enumerate() {
        // Every user was let go once by the old server, told to come back at once, and
        // was served by the new one after.
        assert_eq!(
            s.kicks,
            [(KickReason::Shutdown, 100)],
            "user {}: {s:?}",
            i + 1
        );
        assert!(s.answered > 20, "user {}: {s:?}", i + 1);
    }
    // Nothing acknowledged lost: every cent a user was told it won is in its balance, and
    // the ledger balances.
    let audit = new.audit();
    assert_eq!(audit["ok"], true, "{audit}");
    let won: u64 = seen.iter().map(|s| s.won_cents).sum();
    assert!(won > 0);
    assert_eq!(audit["user_balances_cents"], won, "{audit}");
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(new.balance(i as u64 + 1), s.won_cents, "user {}", i + 1);
    }
    // The directory is the new server's: its lock names it, and a third is refused.
    let (holder, pid) = lock_holder(dir.path());
    assert_eq!(pid, new.pid(), "{holder}");
    assert!(holder.contains("--upgrade"), "{holder}");
    let third = std::process::Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("HONGBAO_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(!third.status.success());
    let said = String::from_utf8_lossy(&third.stderr);
    assert!(said.contains("--upgrade"), "{said}");
    let log = new.process.log();
    assert!(log.contains("commits paused"), "{log}");
    // What the new server committed after the old one let go of the ledger is on disk:
    // stopped and started again, the ledger holds every cent the users were told of (the
    // old server's last close must not take the write-ahead log the new one writes to).
    let seq = audit["ledger_seq"].clone();
    let mut new = new;
    new.stop();
    let files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with("-wal") || f.ends_with("-shm") || f == "upgrade.sock"),
        "a clean stop leaves the ledger one file: {files:?}"
    );
    let again = Serve::new().data_dir(dir.path()).config(config).start();
    let audit = again.audit();
    assert_eq!(audit["ok"], true, "{audit}");
    assert_eq!(audit["ledger_seq"], seq, "{audit}");
    assert_eq!(audit["user_balances_cents"], won, "{audit}");
}

#[test]
fn sigusr2_starts_the_binary_on_disk_and_it_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = Serve::new()
        .workers(1)
        .data_dir(dir.path())
        .config("drain_secs = 1\n")
        .start();
    old.shake_campaign(1_000, 1_000, 5, 5);
    let mut client = logged_in(old.listen, 7);
    // Shakes until one wins (the campaign's first packets are a moment away).
    let won = wait_until("a shake to win", secs(10), || {
        client.send(&Message::Shake).unwrap();
        match client.recv().unwrap().message {
            Message::ShakeReply {
                result: ResultCode::Won,
                amount_cents,
                ..
            } => Some(amount_cents),
            _ => {
                std::thread::sleep(Duration::from_millis(50));
                None
            }
        }
    });
    signal(old.pid(), "-USR2");
    let exit = wait_until("the old server to hand over and stop", secs(30), || {
        old.process.child.try_wait().unwrap()
    });
    assert!(exit.success(), "{exit:?}\n{}", old.process.log());
    let (holder, pid) = lock_holder(dir.path());
    assert_ne!(pid, old.pid(), "{holder}");
    let _stopped_at_the_end = KillOnDrop(pid);
    // The new process serves on the same addresses, with what the old one committed.
    let mut again = logged_in(old.listen, 7);
    again.send(&Message::Shake).unwrap();
    assert!(matches!(
        again.recv().unwrap().message,
        Message::ShakeReply { .. }
    ));
    wait_until("the new server to take the ledger", secs(10), || {
        (old.admin.audit()["ledger_seq"].as_u64() > Some(0)).then_some(())
    });
    assert!(
        old.admin.balance(7) >= won,
        "the win before the upgrade kept"
    );
    assert_eq!(old.admin.audit()["ok"], true);
    signal(pid, "-INT");
    wait_until("the new server to stop", secs(20), || {
        gone(pid).then_some(())
    });
}

/// Whether process `pid` has ended (exited, whether or not reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// A process this test did not start itself (SIGUSR2's), killed if the test ends early.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !gone(self.0) {
            signal(self.0, "-KILL");
        }
    }
}

#[test]
fn an_upgrade_with_nothing_to_take_over_says_so_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args([
            "serve",
            "--upgrade",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env("HONGBAO_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("upgrade.sock"), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "one line: {said}");
    assert!(
        !dir.path().join("ledger.sqlite").exists(),
        "nothing was made"
    );
}
