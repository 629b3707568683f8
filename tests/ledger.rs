//! The embedded ledger's backups and its hash chain with the real binary
//! (docs/ledger.md): `hongbao backup` while a load wins packets, `hongbao ledger verify`
//! of the copy and of the live ledger against the head `/v1/audit` published, `hongbao
//! restore` and a server started on what it restored; a ledger edited behind the server's
//! back refused at start and by `verify`, the event named.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

mod common;
use common::{Hongbao, Serve};

fn hongbao(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hongbao"))
        .args(args)
        .output()
        .expect("running hongbao")
}

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `hongbao ledger verify PATH [--head H]`: whether it passed, and what it said.
fn verify(path: &Path, head: Option<&str>) -> (bool, String) {
    let mut args = vec!["ledger", "verify", path.to_str().unwrap()];
    if let Some(head) = head {
        args.extend(["--head", head]);
    }
    let out = hongbao(&args);
    (out.status.success(), said(&out))
}

#[test]
fn backups_taken_while_serving_verify_restore_and_serve_again() {
    let mut server = Serve::new().workers(1).start();
    let data = server.data_dir.clone();
    server.shake_campaign(3000, 300, 100, 1_000);
    let mut load = Hongbao::start("load", {
        let mut c = Command::new(env!("CARGO_BIN_EXE_hongbao"));
        c.args(["load", "--server", &server.listen.to_string()])
            .args(["--users", "300", "--qps", "600", "--duration", "8"])
            .env("HONGBAO_SECRET", &server.secret);
        c
    });
    let backups = tempfile::tempdir().unwrap();
    let mut events = Vec::new();
    for n in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        let dir = backups.path().join(format!("b{n}"));
        let out = hongbao(&[
            "backup",
            dir.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", said(&out));
        let (ok, text) = verify(&dir, None);
        assert!(ok, "{text}");
        let count: u64 = text
            .split(": ")
            .nth(2)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        events.push(count);
        assert!(dir.join("backup.json").exists());
    }
    load.wait_exit(Duration::from_secs(60));
    assert!(
        events.windows(2).all(|w| w[0] < w[1]),
        "taken as the ledger grew: {events:?}"
    );
    let audit = server.audit();
    assert_eq!(audit["ok"], true);
    let head = audit["ledger_head"].as_str().unwrap().to_string();
    // The audit read is on the admin log with the head it published.
    let log = server.get("/v1/admin-log").to_string();
    assert!(log.contains(&format!("ledger head {head}")), "{log}");
    server.stop();
    // The live ledger holds the head the audit published; a backup taken before it does
    // not reach it.
    let (ok, text) = verify(&data, Some(&head));
    assert!(ok, "{text}");
    assert!(text.contains(&head), "{text}");
    let (ok, text) = verify(&backups.path().join("b0"), Some(&head));
    assert!(!ok && text.contains("cut off"), "{text}");

    // Restored into a new directory, a server starts on it with the backup's events.
    let restored = tempfile::tempdir().unwrap();
    let target = restored.path().join("data");
    let out = hongbao(&[
        "restore",
        backups.path().join("b2").to_str().unwrap(),
        "--data-dir",
        target.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", said(&out));
    // The backup holds the admin keys (their hashes): the operator's key file still
    // opens the door.
    std::fs::copy(data.join("admin.key"), target.join("admin.key")).unwrap();
    let again = Serve::new().workers(1).data_dir(&target).start();
    assert_eq!(again.replayed_events, events[2]);
    assert_eq!(again.audit()["ok"], true);
}

#[test]
fn a_ledger_edited_behind_the_servers_back_is_refused_and_named() {
    let mut server = Serve::new().workers(1).start();
    let data = server.data_dir.clone();
    server.shake_campaign(20, 200, 100, 1_000);
    let mut client = server.login(5);
    // Its packets reach the workers once the campaign is committed: shake until one is won.
    common::wait_until("a win for user 5", Duration::from_secs(20), || {
        client.shake().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        (server.balance(5) > 0).then_some(())
    });
    server.stop();
    let (ok, text) = verify(&data, None);
    assert!(ok, "{text}");

    // A win's amount raised, its user's balance raised to match.
    let conn = rusqlite::Connection::open(data.join("ledger.sqlite")).unwrap();
    let (seq, body): (i64, String) = conn
        .query_row(
            "SELECT seq, body FROM events WHERE kind = 'shake_won' ORDER BY seq LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("a win");
    let event: serde_json::Value = serde_json::from_str(&body).unwrap();
    let won = event["amount_cents"].as_u64().unwrap();
    let forged = body.replace(
        &format!("\"amount_cents\":{won}"),
        &format!("\"amount_cents\":{}", won + 100_000),
    );
    conn.execute(
        "UPDATE events SET body = ?1 WHERE seq = ?2",
        rusqlite::params![forged, seq],
    )
    .unwrap();
    conn.execute(
        "UPDATE balances SET cents = cents + 100000 WHERE account = 'u:5'",
        [],
    )
    .unwrap();
    drop(conn);
    let (ok, text) = verify(&data, None);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("event {seq}: its hash does not match the chain")),
        "{text}"
    );
    let mut refused = Hongbao::spawn(
        "serve",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--data-dir",
            data.to_str().unwrap(),
        ],
    );
    let status = refused.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        refused.log().contains(&format!("event {seq}")),
        "{}",
        refused.log()
    );
}

/// The mode bits of `path`.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn one_process_per_data_directory_and_a_clean_stop_leaves_the_ledger_whole() {
    let mut server = Serve::new().workers(1).http().start();
    let data = server.data_dir.clone();
    // The ledger holds every user's money, the admin keys' hashes and the admin log.
    assert_eq!(mode(&data), 0o700, "the data directory");
    assert_eq!(mode(&data.join("ledger.sqlite")), 0o600, "the ledger");
    assert_eq!(mode(&data.join("admin.key")), 0o600, "the first key");

    // A second server on the same ledger is refused before it makes anything, naming the
    // first; so is a restore into it.
    let keys_before = server.get("/v1/admin-keys").to_string();
    let second = hongbao(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let text = said(&second);
    assert!(!second.status.success(), "{text}");
    let named = format!("hongbao serve (pid {}", server.pid());
    assert!(text.contains(&named), "{text}");
    assert_eq!(server.get("/v1/admin-keys").to_string(), keys_before);
    let backups = tempfile::tempdir().unwrap();
    let backup = backups.path().join("b");
    let out = hongbao(&[
        "backup",
        backup.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(mode(&backup), 0o700, "the backup's directory");
    assert_eq!(mode(&backup.join("ledger.sqlite")), 0o600, "the backup");
    let restore = |force: bool| {
        let mut args = vec![
            "restore",
            backup.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ];
        if force {
            args.push("--force");
        }
        hongbao(&args)
    };
    let refused = restore(true);
    assert!(!refused.status.success());
    assert!(said(&refused).contains(&named), "{}", said(&refused));

    // Whatever was served — the HTTP API's reads, shakes, the admin API — a clean stop
    // folds the write-ahead log in and removes it.
    let url = format!("http://{}/v1/me", server.http_addr());
    let me = ureq::get(&url)
        .set("Authorization", &server.bearer(7))
        .call()
        .unwrap();
    assert_eq!(me.status(), 200);
    let mut client = server.login(8);
    client.shake().unwrap();
    server.get("/v1/users/7");
    server.stop();
    for side in ["ledger.sqlite-wal", "ledger.sqlite-shm"] {
        assert!(!data.join(side).exists(), "{side} left after a clean stop");
    }
    // With the server gone, the restore takes the directory (the old ledger moved aside).
    let out = restore(true);
    assert!(out.status.success(), "{}", said(&out));
}

#[test]
fn a_restore_after_a_crash_folds_the_write_ahead_log_into_the_ledger_it_moves_aside() {
    let mut server = Serve::new().workers(1).start();
    let data = server.data_dir.clone();
    server.shake_campaign(10, 1000, 100, 100);
    let backups = tempfile::tempdir().unwrap();
    let backup = backups.path().join("b");
    let out = hongbao(&[
        "backup",
        backup.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", said(&out));
    // Committed after the backup, and only in the write-ahead log when the server dies.
    let mut client = server.login(9);
    let won = common::wait_until("a win", Duration::from_secs(10), || {
        match client.shake().unwrap() {
            hongbao_proto::Message::ShakeReply {
                result: hongbao_proto::ResultCode::Won,
                amount_cents,
                ..
            } => Some(amount_cents),
            _ => None,
        }
    });
    server.crash();
    assert!(
        data.join("ledger.sqlite-wal").exists(),
        "a crash leaves the log"
    );
    let out = hongbao(&[
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--force",
    ]);
    assert!(out.status.success(), "{}", said(&out));
    let aside = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("ledger.sqlite.replaced-"))
        .expect("the old ledger moved aside");
    let (ok, text) = verify(&aside, None);
    assert!(ok, "{text}");
    let conn = rusqlite::Connection::open(&aside).unwrap();
    let cents: i64 = conn
        .query_row(
            "SELECT cents FROM balances WHERE account = 'u:9'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        cents as u64, won,
        "the win committed after the backup, kept"
    );
}
