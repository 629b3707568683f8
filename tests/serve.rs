//! End-to-end tests of `hongbao serve`: the real binary with two gateway workers, real
//! sockets on `127.0.0.1:0`, the admin API over HTTP, and a ledger in a temporary
//! directory. Each test starts its own server (they run in parallel) and a `Server`
//! guard SIGKILLs it when the test ends, so nothing outlives a failing test.
//!
//! What is checked is what a client or an operator can see: replies and pushes on the
//! wire, balances and audits from the admin API, and that all of it survives a worker
//! being killed and the whole server crashing.

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;

use common::{is_closed, signal, token, wait_until, Serve, Server, IO_TIMEOUT, SECRET};
use hongbao_proto::client::Client;
use hongbao_proto::{encode_to_vec, Frame, KickReason, Message, ResultCode};
use hongbao_telemetry::log::{FILTER_ENV, FORMAT_ENV};
use serde_json::{json, Value};

// ----- helpers ---------------------------------------------------------------------------

/// Whether process `pid` has exited (gone, or a zombie nobody has reaped yet).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

// ----- wire helpers ----------------------------------------------------------------------

/// A frame header (and payload) with every field as given, valid or not.
fn raw_frame(len: u32, version: u8, kind: u8, request_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = len.to_be_bytes().to_vec();
    bytes.push(version);
    bytes.push(kind);
    bytes.extend_from_slice(&request_id.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn expect_kick(client: &mut Client, reason: KickReason) {
    let frame = client.recv().expect("waiting for a kick");
    match frame.message {
        Message::Kick { reason: got, .. } if frame.request_id == 0 => assert_eq!(got, reason),
        other => panic!("expected kick {reason:?}, got {other:?}"),
    }
}

/// The server has closed this connection: the next read sees the end of the stream.
fn expect_closed(client: &mut Client) {
    match client.recv() {
        Err(e) if is_closed(&e) => {}
        other => panic!("expected the server to close the connection, got {other:?}"),
    }
}

/// Like `expect_closed`, letting pushes that were already on their way arrive first.
fn expect_closed_after_pushes(client: &mut Client) {
    loop {
        match client.recv() {
            Ok(frame) if frame.request_id == 0 => {}
            Err(e) if is_closed(&e) => return,
            other => panic!("expected the server to close the connection, got {other:?}"),
        }
    }
}

fn ping(client: &mut Client, client_time_us: u64) -> std::io::Result<()> {
    match client.request(&Message::Ping { client_time_us })?.message {
        Message::Pong {
            client_time_us: echoed,
            server_time_us,
        } => {
            assert_eq!(echoed, client_time_us);
            assert!(server_time_us > 0);
            Ok(())
        }
        other => panic!("expected a pong, got {other:?}"),
    }
}

fn shake_result(client: &mut Client) -> (ResultCode, u64, u64) {
    match client.shake().expect("shake") {
        Message::ShakeReply {
            result,
            packet_id,
            amount_cents,
            ..
        } => (result, packet_id, amount_cents),
        other => panic!("expected a shake reply, got {other:?}"),
    }
}

/// Shakes until `wins` shakes have won; returns (packet_id, amount) of each win.
fn shake_until_won(client: &mut Client, wins: usize) -> Vec<(u64, u64)> {
    let deadline = Instant::now() + secs(15);
    let mut won = Vec::new();
    while won.len() < wins {
        assert!(
            Instant::now() < deadline,
            "only {} wins of {wins}",
            won.len()
        );
        match shake_result(client) {
            (ResultCode::Won, packet, amount) => won.push((packet, amount)),
            (ResultCode::Nothing, 0, 0) => std::thread::sleep(Duration::from_millis(10)),
            other => panic!("unexpected shake reply {other:?}"),
        }
    }
    won
}

fn send_result(
    client: &mut Client,
    amount: u64,
    shares: u32,
    to: &[u64],
) -> (ResultCode, u64, u64) {
    match client.send_packet(amount, shares, to).expect("send") {
        Message::SendReply {
            result,
            packet_id,
            balance_cents,
        } => (result, packet_id, balance_cents),
        other => panic!("expected a send reply, got {other:?}"),
    }
}

fn open_result(client: &mut Client, packet: u64) -> (ResultCode, u64) {
    match client.open(packet).expect("open") {
        Message::OpenReply {
            result,
            packet_id,
            amount_cents,
        } => {
            assert_eq!(packet_id, packet);
            (result, amount_cents)
        }
        other => panic!("expected an open reply, got {other:?}"),
    }
}

fn chat_result(client: &mut Client, to: u64, text: &str) -> ResultCode {
    match client.chat(to, text).expect("chat") {
        Message::ChatReply { result } => result,
        other => panic!("expected a chat reply, got {other:?}"),
    }
}

/// The next push, which must be a packet notice; returns its fields.
fn expect_notice(client: &mut Client) -> (u64, u64, u64, u32, u64) {
    match client
        .next_push()
        .expect("waiting for a packet notice")
        .message
    {
        Message::PacketNotice {
            packet_id,
            from_user,
            amount_cents,
            shares,
            expires_at_ms,
        } => (packet_id, from_user, amount_cents, shares, expires_at_ms),
        other => panic!("expected a packet notice, got {other:?}"),
    }
}

fn expect_chat(client: &mut Client, from: u64, text: &str) {
    match client
        .next_push()
        .expect("waiting for a chat message")
        .message
    {
        Message::ChatMessage {
            from_user,
            text: got,
        } => {
            assert_eq!((from_user, got.as_str()), (from, text));
        }
        other => panic!("expected a chat message, got {other:?}"),
    }
}

/// Logs in users from `first` on until both workers hold some of them (the kernel spreads
/// connections over the workers' SO_REUSEPORT listeners by a hash, so a handful almost
/// always suffices). Returns the clients by user and the stats' workers.
fn users_on_both_workers(server: &Server, first: u64) -> (BTreeMap<u64, Client>, Vec<Value>) {
    let mut clients = BTreeMap::new();
    let workers = spread_over_workers(server, &mut clients, first);
    (clients, workers)
}

/// Adds users from `next` on to `clients` (eight at a time) until both workers hold
/// some of `clients`; returns the stats' workers.
fn spread_over_workers(
    server: &Server,
    clients: &mut BTreeMap<u64, Client>,
    mut next: u64,
) -> Vec<Value> {
    for round in 0..6 {
        if round > 0 || clients.is_empty() {
            for _ in 0..8 {
                clients.insert(next, server.login(next));
                next += 1;
            }
        }
        let logged_in = clients.len() as u64;
        // Workers report once a second.
        let workers = wait_until("workers to report the logins", secs(10), || {
            let workers = server.stats_workers();
            let sum: u64 = workers
                .iter()
                .map(|w| w["logged_in"].as_u64().unwrap())
                .sum();
            (workers.len() == 2 && sum == logged_in).then_some(workers)
        });
        if workers.iter().all(|w| w["logged_in"].as_u64().unwrap() > 0) {
            return workers;
        }
    }
    panic!("{} connections all landed on one worker", clients.len());
}

// ----- the tests -------------------------------------------------------------------------

#[test]
fn login_tokens_and_frame_violations() {
    let server = Serve::new().start();

    // Before login: ping is answered, everything else is refused, the connection stays.
    let mut alice = server.connect();
    ping(&mut alice, 12345).unwrap();
    for message in [
        Message::Shake,
        Message::Open { packet_id: 1 },
        Message::Chat {
            to_user: 2,
            text: "hi".into(),
        },
        Message::Send {
            amount_cents: 1,
            shares: 1,
            recipients: vec![2],
            idempotency_key: None,
        },
    ] {
        match alice.request(&message).unwrap().message {
            Message::Error { result, .. } => assert_eq!(result, ResultCode::NotLoggedIn),
            other => panic!("{message:?} before login got {other:?}"),
        }
    }
    assert_eq!(alice.login(&token(SECRET, 1)).unwrap(), ResultCode::Ok);
    assert_eq!(shake_result(&mut alice), (ResultCode::Nothing, 0, 0));

    // The frame may name the token's user too.
    let mut bob = server.connect();
    let reply = bob
        .request(&Message::Login {
            user_id: 2,
            token: token(SECRET, 2).into_bytes(),
        })
        .unwrap();
    assert_eq!(
        reply.message,
        Message::LoginReply {
            result: ResultCode::Ok,
            user_id: 2
        }
    );

    // A bad token: login-reply{bad-token}, kick{bad-token}, closed. (Every token form
    // an attacker would try is in tests/sessions.rs.)
    for (user, secret) in [(3, "wrong secret"), (0, SECRET)] {
        let mut mallory = server.connect();
        let reply = mallory
            .request(&Message::Login {
                user_id: user,
                token: token(secret, user).into_bytes(),
            })
            .unwrap();
        assert_eq!(
            reply.message,
            Message::LoginReply {
                result: ResultCode::BadToken,
                user_id: user
            }
        );
        expect_kick(&mut mallory, KickReason::BadToken);
        expect_closed(&mut mallory);
    }
    // Someone else's token.
    let mut eve = server.connect();
    let stolen = token(SECRET, 1).into_bytes();
    let reply = eve
        .request(&Message::Login {
            user_id: 4,
            token: stolen,
        })
        .unwrap();
    assert!(matches!(
        reply.message,
        Message::LoginReply {
            result: ResultCode::BadToken,
            ..
        }
    ));
    expect_kick(&mut eve, KickReason::BadToken);
    expect_closed(&mut eve);

    // Nobody else noticed.
    assert_eq!(
        chat_result(&mut alice, 2, "still there?"),
        ResultCode::Delivered
    );
    expect_chat(&mut bob, 1, "still there?");

    // Fatal framing errors: kick{bad-frame}, closed. One of them from a logged-in user,
    // who is then offline.
    let fatal: [(&str, Vec<u8>); 4] = [
        ("length 0xFFFFFFFF", vec![0xFF; 4]),
        (
            "length over the limit",
            raw_frame(16 * 1024 + 1, 1, 6, 1, &[]),
        ),
        ("length under the header", raw_frame(5, 1, 6, 1, &[])),
        ("version 3", raw_frame(14, 3, 6, 1, &[0; 8])),
    ];
    for (i, (what, bytes)) in fatal.iter().enumerate() {
        let mut client = if i == 0 {
            server.login(5)
        } else {
            server.connect()
        };
        client.send_raw(bytes).unwrap();
        let frame = client.recv().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            matches!(
                frame.message,
                Message::Kick {
                    reason: KickReason::BadFrame,
                    ..
                }
            ),
            "{what}: got {frame:?}"
        );
        expect_closed(&mut client);
    }
    wait_until("user 5 to be offline", secs(5), || {
        (chat_result(&mut alice, 5, "gone?") == ResultCode::Offline).then_some(())
    });

    // Recoverable errors: answered under the frame's request id, the connection stays.
    alice.send_raw(&raw_frame(6, 1, 0x7F, 77, &[])).unwrap();
    let frame = alice.recv().unwrap();
    assert_eq!(frame.request_id, 77);
    assert!(
        matches!(
            frame.message,
            Message::Error {
                result: ResultCode::UnknownType,
                ..
            }
        ),
        "{frame:?}"
    );
    // A shake with a trailing byte, and a message only servers send.
    alice.send_raw(&raw_frame(7, 1, 0x02, 78, &[0])).unwrap();
    let server_kind = encode_to_vec(&Frame {
        request_id: 79,
        message: Message::ChatReply {
            result: ResultCode::Delivered,
        },
    });
    alice.send_raw(&server_kind).unwrap();
    for request_id in [78, 79] {
        let frame = alice.recv().unwrap();
        assert_eq!(frame.request_id, request_id);
        assert!(
            matches!(
                frame.message,
                Message::Error {
                    result: ResultCode::BadRequest,
                    ..
                }
            ),
            "{frame:?}"
        );
    }
    ping(&mut alice, 1).unwrap();

    // A frame that arrives a byte at a time, and frames pipelined in one write.
    let bytes = encode_to_vec(&Frame {
        request_id: 500,
        message: Message::Ping { client_time_us: 9 },
    });
    for byte in &bytes {
        alice.send_raw(std::slice::from_ref(byte)).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut pipelined = Vec::new();
    for request_id in 501..=503 {
        pipelined.extend(encode_to_vec(&Frame {
            request_id,
            message: Message::Ping {
                client_time_us: request_id as u64,
            },
        }));
    }
    alice.send_raw(&pipelined).unwrap();
    for (request_id, echoed) in [(500, 9), (501, 501), (502, 502), (503, 503)] {
        let frame = alice.recv().unwrap();
        assert_eq!(frame.request_id, request_id);
        assert!(
            matches!(frame.message, Message::Pong { client_time_us, .. } if client_time_us == echoed)
        );
    }
    drop(bob);
    server.audit();
}

#[test]
fn a_second_login_replaces_the_first() {
    let server = Serve::new().start();
    let mut friend = server.login(11);
    let mut first = server.login(10);
    let mut second = server.login(10);
    expect_kick(&mut first, KickReason::Replaced);
    expect_closed(&mut first);
    drop(first);
    // The route is the new connection's, also after the old one is gone for good.
    for text in ["to the new one", "still the new one"] {
        assert_eq!(chat_result(&mut friend, 10, text), ResultCode::Delivered);
        expect_chat(&mut second, 11, text);
        std::thread::sleep(Duration::from_millis(300));
    }
    ping(&mut second, 3).unwrap();
    // A connection is one user's: logging in on it as another is refused, and it stays
    // the first user's.
    assert_eq!(
        second.login(&token(SECRET, 12)).unwrap(),
        ResultCode::BadRequest
    );
    assert_eq!(chat_result(&mut friend, 12, "?"), ResultCode::Offline);
    // Logging in again on the same connection is not a replacement.
    assert_eq!(second.login(&token(SECRET, 10)).unwrap(), ResultCode::Ok);
    ping(&mut second, 4).unwrap();
    assert_eq!(
        chat_result(&mut friend, 10, "same conn"),
        ResultCode::Delivered
    );
    expect_chat(&mut second, 11, "same conn");
}

#[test]
fn shakes_win_what_the_ledger_credits() {
    let server = Serve::new().start();
    let mut alice = server.login(1);
    let mut bob = server.login(2);
    assert_eq!(shake_result(&mut alice), (ResultCode::Nothing, 0, 0));

    let campaign = server.shake_campaign(40, 1000, 100, 900);
    let mut packets = BTreeSet::new();
    let mut total = 0;
    for (user, client) in [(1, &mut alice), (2, &mut bob)] {
        let won = shake_until_won(client, 3);
        for &(packet, amount) in &won {
            assert!((100..=900).contains(&amount), "won {amount}");
            assert_eq!(packet >> 32, campaign, "packet {packet:#x}");
            assert!(packets.insert(packet), "packet {packet:#x} won twice");
        }
        let sum: u64 = won.iter().map(|(_, a)| a).sum();
        assert_eq!(server.balance(user), sum);
        total += sum;
    }
    assert_eq!(server.balance(3), 0);

    let status = server.get(&format!("/v1/campaigns/{campaign}"));
    assert_eq!(status["won"], 6);
    assert_eq!(status["won_cents"], total);
    assert_eq!(status["state"], "running");
    let minted = status["minted_cents"].as_u64().unwrap();
    assert!((40 * 100..=40 * 900).contains(&minted));
    let audit = server.audit();
    assert_eq!(audit["minted_cents"], minted);
    assert_eq!(audit["user_balances_cents"], total);
    assert_eq!(audit["unclaimed_cents"], minted - total);
    assert_eq!(audit["unclaimed_packets"], 34);
}

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

#[test]
fn sends_debit_the_sender_and_notify_recipients() {
    let server = Serve::new().start();
    let mut sender = server.login(10);
    let mut online = server.login(11);
    server.shake_campaign(10, 1000, 1000, 1000);
    shake_until_won(&mut sender, 2);
    assert_eq!(server.balance(10), 2000);

    // Refused sends leave the balance alone and say what it is.
    let bad: [(u64, u32, &[u64]); 7] = [
        (100, 0, &[11]),     // no shares
        (0, 1, &[11]),       // no money
        (100, 2, &[11, 11]), // duplicate recipients
        (100, 1, &[]),       // no recipients
        (1, 2, &[11, 12]),   // a share under a cent
        (100, 3, &[11, 12]), // more shares than recipients
        (100, 1, &[0]),      // user 0 does not exist
    ];
    for (amount, shares, to) in bad {
        assert_eq!(
            send_result(&mut sender, amount, shares, to),
            (ResultCode::BadRequest, 0, 2000),
            "send {amount} in {shares} to {to:?}"
        );
    }
    assert_eq!(
        send_result(&mut sender, 2001, 1, &[11]),
        (ResultCode::InsufficientFunds, 0, 2000)
    );
    let mut poor = server.login(13);
    assert_eq!(
        send_result(&mut poor, 1, 1, &[11]),
        (ResultCode::InsufficientFunds, 0, 0)
    );

    let before_ms = now_ms();
    let (result, packet, balance) = send_result(&mut sender, 600, 2, &[11, 12]);
    assert_eq!((result, balance), (ResultCode::Ok, 1400));
    assert!(packet > 0);
    assert_eq!(server.balance(10), 1400);

    // Online: told at once. Offline: told at login.
    let (id, from, amount, shares, expires) = expect_notice(&mut online);
    assert_eq!((id, from, amount, shares), (packet, 10, 600, 2));
    let ttl_ms = expires - before_ms;
    assert!(
        (24 * 3600 * 1000 - 60_000..=24 * 3600 * 1000 + 60_000).contains(&ttl_ms),
        "expires in {ttl_ms} ms"
    );
    let mut offline = server.login(12);
    assert_eq!(expect_notice(&mut offline), (packet, 10, 600, 2, expires));

    // Spending it all is allowed; then nothing is left.
    let (result, second, balance) = send_result(&mut sender, 1400, 1, &[11]);
    assert_eq!((result, balance), (ResultCode::Ok, 0));
    assert_eq!(expect_notice(&mut online).0, second);
    assert_eq!(
        send_result(&mut sender, 1, 1, &[11]),
        (ResultCode::InsufficientFunds, 0, 0)
    );
    let audit = server.audit();
    assert_eq!(audit["unopened_cents"], 2000);
    assert_eq!(audit["unopened_shares"], 3);
    assert_eq!(audit["live_packets"], 2);
}

#[test]
fn opens_give_every_result() {
    let server = Serve::new().start();
    let mut sender = server.login(20);
    server.shake_campaign(10, 1000, 1000, 1000);
    shake_until_won(&mut sender, 2);

    // Two shares for three recipients: the third finds it empty.
    let (result, packet, _) = send_result(&mut sender, 300, 2, &[21, 22, 23]);
    assert_eq!(result, ResultCode::Ok);
    let mut r21 = server.login(21);
    let mut r22 = server.login(22);
    let mut r23 = server.login(23);
    let mut stranger = server.login(24);

    let (result, first) = open_result(&mut r21, packet);
    assert_eq!(result, ResultCode::Opened);
    assert!((1..300).contains(&first), "first share {first}");
    assert_eq!(
        open_result(&mut r21, packet),
        (ResultCode::AlreadyOpened, first)
    );
    assert_eq!(
        open_result(&mut stranger, packet),
        (ResultCode::NotARecipient, 0)
    );
    assert_eq!(
        open_result(&mut sender, packet),
        (ResultCode::NotARecipient, 0)
    );
    let (result, second) = open_result(&mut r22, packet);
    assert_eq!(result, ResultCode::Opened);
    assert_eq!(first + second, 300);
    assert_eq!(open_result(&mut r23, packet), (ResultCode::Empty, 0));
    assert_eq!(
        open_result(&mut r22, packet),
        (ResultCode::AlreadyOpened, second)
    );
    assert_eq!(
        open_result(&mut r23, packet + 1000),
        (ResultCode::NoSuchPacket, 0)
    );
    assert_eq!(
        open_result(&mut r23, u64::MAX),
        (ResultCode::NoSuchPacket, 0)
    );

    // A fresh connection of the same user still sees its first amount.
    drop(r21);
    let mut r21 = server.login(21);
    assert_eq!(
        open_result(&mut r21, packet),
        (ResultCode::AlreadyOpened, first)
    );

    assert_eq!(server.balance(20), 1700);
    assert_eq!(server.balance(21), first);
    assert_eq!(server.balance(22), second);
    assert_eq!(server.balance(23), 0);
    let audit = server.audit();
    assert_eq!(audit["unopened_cents"], 0);
    assert_eq!(audit["live_packets"], 0);

    // Every share of a one-cent-each packet, opened concurrently by its recipients.
    let recipients: Vec<u64> = (30..40).collect();
    let (result, packet, _) = send_result(&mut sender, 10, 10, &recipients);
    assert_eq!(result, ResultCode::Ok);
    let handles: Vec<_> = recipients
        .iter()
        .map(|&user| {
            let mut client = server.login(user);
            std::thread::spawn(move || open_result(&mut client, packet))
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap(), (ResultCode::Opened, 1));
    }
    assert_eq!(server.balance(20), 1690);
    server.audit();
}

#[test]
fn expired_packets_refund_the_sender() {
    let server = Serve::new().args(["--packet-ttl-secs", "2"]).start();
    let mut sender = server.login(30);
    server.shake_campaign(10, 1000, 1000, 1000);
    shake_until_won(&mut sender, 1);

    let mut r31 = server.login(31);
    let mut r32 = server.login(32);
    let (result, packet, balance) = send_result(&mut sender, 500, 3, &[31, 32, 33]);
    assert_eq!((result, balance), (ResultCode::Ok, 500));
    let (_, _, _, _, expires_ms) = expect_notice(&mut r31);
    let (result, opened) = open_result(&mut r31, packet);
    assert_eq!(result, ResultCode::Opened);
    assert_eq!(server.audit()["unopened_cents"], 500 - opened);

    // Wait out the time-to-live.
    let wait = expires_ms.saturating_sub(now_ms()) + 300;
    std::thread::sleep(Duration::from_millis(wait));
    assert_eq!(open_result(&mut r32, packet), (ResultCode::Expired, 0));
    // An open from before the expiry still answers with its amount.
    assert_eq!(
        open_result(&mut r31, packet),
        (ResultCode::AlreadyOpened, opened)
    );
    // The remainder went back to the sender.
    wait_until("the refund", secs(5), || {
        (server.balance(30) == 1000 - opened).then_some(())
    });
    let audit = server.audit();
    assert_eq!(audit["unopened_cents"], 0);
    assert_eq!(audit["unopened_shares"], 0);
    assert_eq!(audit["live_packets"], 0);
    // Someone logging in now is not told about the dead packet.
    let mut late = server.login(33);
    assert_eq!(open_result(&mut late, packet), (ResultCode::Expired, 0));
    late.set_timeout(Duration::from_millis(300)).unwrap();
    match late.next_push() {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("expected no notice for an expired packet, got {other:?}"),
    }
}

#[test]
fn chat_crosses_workers() {
    let server = Serve::new().start();
    let (mut clients, workers) = users_on_both_workers(&server, 100);
    assert!(workers.iter().all(|w| w["logged_in"].as_u64().unwrap() > 0));
    let users: Vec<u64> = clients.keys().copied().collect();
    for &from in &users {
        for &to in &users {
            if from == to {
                continue;
            }
            let text = format!("你好 {to}, from {from}");
            let result = chat_result(clients.get_mut(&from).unwrap(), to, &text);
            assert_eq!(result, ResultCode::Delivered, "{from} → {to}");
            expect_chat(clients.get_mut(&to).unwrap(), from, &text);
        }
    }
    // A user may chat to itself.
    let me = users[0];
    let client = clients.get_mut(&me).unwrap();
    assert_eq!(
        chat_result(client, me, "note to self"),
        ResultCode::Delivered
    );
    expect_chat(client, me, "note to self");

    // Never seen, and gone.
    assert_eq!(chat_result(client, 999_999, "anyone?"), ResultCode::Offline);
    let gone = users[1];
    drop(clients.remove(&gone));
    let client = clients.get_mut(&me).unwrap();
    wait_until("the closed user to be offline", secs(5), || {
        (chat_result(client, gone, "bye?") == ResultCode::Offline).then_some(())
    });
    // Nothing undelivered is queued for someone who comes back.
    let mut back = server.login(gone);
    back.set_timeout(Duration::from_millis(300)).unwrap();
    assert!(back.next_push().is_err(), "a push for a fresh login");
}

#[test]
fn campaigns_admin_api() {
    let server = Serve::new().start();
    assert_eq!(server.get("/v1/campaigns"), json!([]));

    let refused = [
        ("POST", "/v1/campaigns/shake", "{not json"),
        ("POST", "/v1/campaigns/shake", ""),
        ("POST", "/v1/campaigns/shake", r#"{"packets":10}"#),
        (
            "POST",
            "/v1/campaigns/shake",
            r#"{"packets":10,"rate_per_sec":10,"amount_min":1,"amount_max":2,"extra":1}"#,
        ),
        (
            "POST",
            "/v1/campaigns/shake",
            r#"{"packets":-1,"rate_per_sec":10,"amount_min":1,"amount_max":2}"#,
        ),
        (
            "POST",
            "/v1/campaigns/shake",
            r#"{"packets":0,"rate_per_sec":10,"amount_min":1,"amount_max":2}"#,
        ),
        (
            "POST",
            "/v1/campaigns/shake",
            r#"{"packets":10,"rate_per_sec":0,"amount_min":1,"amount_max":2}"#,
        ),
        (
            "POST",
            "/v1/campaigns/shake",
            r#"{"packets":10,"rate_per_sec":10,"amount_min":5,"amount_max":4}"#,
        ),
        (
            "POST",
            "/v1/campaigns/shake",
            r#"{"packets":10,"rate_per_sec":10,"amount_min":0,"amount_max":4}"#,
        ),
        (
            "POST",
            "/v1/campaigns/send",
            r#"{"packets":1,"rate_per_sec":1,"recipients":3,"user_min":1,"user_max":2,"amount_min":10,"amount_max":10}"#,
        ),
        (
            "POST",
            "/v1/campaigns/send",
            r#"{"packets":1,"rate_per_sec":1,"recipients":3,"user_min":1,"user_max":9,"amount_min":2,"amount_max":10}"#,
        ),
        ("GET", "/v1/users/abc", ""),
        ("GET", "/v1/campaigns/abc", ""),
        // Bodies must be JSON objects: serde would read a struct from an array.
        ("POST", "/v1/campaigns/shake", "[1,1,1,1]"),
        ("POST", "/v1/campaigns/send", "[1,1,2,1,9,2,10]"),
        ("POST", "/v1/broadcast", r#"["to everyone"]"#),
        ("POST", "/v1/broadcast", r#""to everyone""#),
    ];
    for (method, path, body) in refused {
        let (status, reply) = server.http(method, path, Some(body).filter(|_| method == "POST"));
        assert_eq!(status, 400, "{method} {path} {body}: {reply}");
        let error: Value = serde_json::from_str(&reply).unwrap();
        assert!(error["error"].is_string(), "{reply}");
    }
    assert_eq!(server.http("GET", "/v1/campaigns/7", None).0, 404);
    assert_eq!(server.http("GET", "/v1/nothing", None).0, 404);
    assert_eq!(server.http("DELETE", "/v1/audit", None).0, 405);
    assert_eq!(server.http("GET", "/v1/campaigns/shake", None).0, 400);
    // Nothing was started by any of that.
    assert_eq!(server.get("/v1/campaigns"), json!([]));
    let audit = server.audit();
    assert_eq!(audit["minted_cents"], 0);

    // A shake campaign, watched as it releases its packets.
    let id = server.shake_campaign(50, 25, 10, 20);
    let mut seen = BTreeSet::new();
    let status = wait_until("the campaign to release everything", secs(10), || {
        let status = server.get(&format!("/v1/campaigns/{id}"));
        seen.insert(status["released"].as_u64().unwrap());
        (status["released"] == 50).then_some(status)
    });
    assert!(
        seen.iter().any(|r| (1..50).contains(r)),
        "no progress seen in between: {seen:?}"
    );
    assert!(status["released_all_ms"].as_u64().unwrap() >= status["started_ms"].as_u64().unwrap());
    assert_eq!(status["rate_per_sec"], 25);
    let minted = status["minted_cents"].as_u64().unwrap();
    assert!((500..=1000).contains(&minted));
    let mut client = server.login(7);
    let wins = shake_until_won(&mut client, 2);
    let won: u64 = wins.iter().map(|(_, a)| a).sum();
    let status = server.get(&format!("/v1/campaigns/{id}"));
    assert_eq!(
        (status["won"].clone(), status["won_cents"].clone()),
        (json!(2), json!(won))
    );

    // A send campaign for users 500 and 501: the online one is told, from user 0.
    let mut recipient = server.login(500);
    let body = r#"{"packets":1,"rate_per_sec":10,"recipients":2,"user_min":500,"user_max":501,"amount_min":100,"amount_max":100}"#;
    let (status, reply) = server.http("POST", "/v1/campaigns/send", Some(body));
    assert_eq!(status, 201, "{reply}");
    let send_id = serde_json::from_str::<Value>(&reply).unwrap()["id"]
        .as_u64()
        .unwrap();
    assert_eq!(send_id, id + 1);
    let (packet, from, amount, shares, _) = expect_notice(&mut recipient);
    assert_eq!((from, amount, shares), (0, 100, 2));
    let (result, share) = open_result(&mut recipient, packet);
    assert_eq!(result, ResultCode::Opened);
    let status = server.get(&format!("/v1/campaigns/{send_id}"));
    assert_eq!(status["kind"], "send");
    assert_eq!(status["state"], "done");
    assert_eq!(status["shares"], 2);
    assert_eq!(status["shares_opened"], 1);
    assert_eq!(status["amount_opened_cents"], share);
    assert_eq!(server.get("/v1/campaigns").as_array().unwrap().len(), 2);

    let audit = server.audit();
    assert_eq!(audit["minted_cents"], minted + 100);
    assert_eq!(audit["user_balances_cents"], won + share);
    assert_eq!(audit["unopened_cents"], 100 - share);

    // The ledger's wins and opened shares, each as its client was told, page by page.
    let op = |packet: u64, user: u64, cents: u64| json!({"packet": packet, "user": user, "amount_cents": cents});
    let told_wins: Vec<Value> = wins.iter().map(|&(p, a)| op(p, 7, a)).collect();
    let ops = server.get("/v1/ledger/ops");
    assert_eq!(ops["wins"], json!(told_wins));
    assert_eq!(ops["opens"], json!([op(packet, 500, share)]));
    assert_eq!(ops["next"], Value::Null);
    let first = server.get("/v1/ledger/ops?limit=2");
    assert_eq!(first["wins"], ops["wins"]);
    let next = first["next"].as_str().expect("a full page has a next");
    let rest = server.get(&format!("/v1/ledger/ops?after={next}&limit=2"));
    assert_eq!(
        (rest["wins"].clone(), rest["opens"].clone()),
        (json!([]), ops["opens"].clone())
    );
    assert_eq!(rest["next"], Value::Null);
    for query in ["limit=0", "after=x", "surprise=1"] {
        let (status, reply) = server.http("GET", &format!("/v1/ledger/ops?{query}"), None);
        assert_eq!(status, 400, "{query}: {reply}");
    }
    assert_eq!(server.http("POST", "/v1/ledger/ops", Some("{}")).0, 405);

    let (status, metrics) = server.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(metrics.contains("hongbao_"), "{metrics}");
    assert!(metrics.contains("hongbao_audit_ok 1"), "{metrics}");
    let stats = server.get("/v1/stats");
    assert_eq!(stats["online_users"], 2);
}

/// Thirty operators' tools asking at once over keep-alive connections are all answered,
/// twice each (tiny_http's pool once left 26 of 30 waiting).
#[test]
fn the_admin_api_answers_many_keep_alive_clients_at_once() {
    use std::io::{Read, Write};
    let server = Serve::new().start();
    let addr = server.admin.addr;
    let request = format!(
        "GET /v1/audit HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n",
        server.admin.key()
    );
    let clients: Vec<_> = (0..30)
        .map(|_| {
            let request = request.clone();
            std::thread::spawn(move || {
                let mut stream = std::net::TcpStream::connect(addr).unwrap();
                stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                for _ in 0..2 {
                    stream.write_all(request.as_bytes()).unwrap();
                    let mut head = Vec::new();
                    let mut byte = [0u8];
                    while !head.ends_with(b"\r\n\r\n") {
                        stream.read_exact(&mut byte).expect("an answer");
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8(head).unwrap();
                    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .expect("a length");
                    let mut body = vec![0; length];
                    stream.read_exact(&mut body).unwrap();
                    assert!(String::from_utf8(body).unwrap().contains("\"ok\": true"));
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("every client answered twice");
    }
}

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

/// A client that never reads and a client that sends after being kicked must not take the
/// worker down with them.
#[test]
fn misbehaving_clients_do_not_hurt_the_worker() {
    let server = Serve::new().start();
    let mut watcher = server.login(1);
    // Kicked, then keeps writing.
    let mut noisy = server.connect();
    noisy.send_raw(&[0xFF; 4]).unwrap();
    expect_kick(&mut noisy, KickReason::BadFrame);
    for _ in 0..10 {
        if noisy.send_raw(&[0u8; 1024]).is_err() {
            break;
        }
    }
    // Closes half-way through a frame.
    let mut half = server.login(2);
    half.send_raw(
        &encode_to_vec(&Frame {
            request_id: 1,
            message: Message::Ping { client_time_us: 1 },
        })[..7],
    )
    .unwrap();
    drop(half);
    // Connects and says nothing (the login timeout is 10 s; it just sits there).
    let _silent = std::net::TcpStream::connect(server.listen).unwrap();
    ping(&mut watcher, 2).unwrap();
    wait_until("user 2 to be offline", secs(5), || {
        (chat_result(&mut watcher, 2, "?") == ResultCode::Offline).then_some(())
    });
    server.audit();
}

// ----- clients that do not play by the rules: no login, too many, half-close -----------

/// Whether the server has sent something (or closed) on `stream`, without waiting.
fn has_input(stream: &std::net::TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let ready = !matches!(stream.peek(&mut [0u8; 1]), Err(e) if e.kind() == ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    ready
}

/// A connection from loopback address `source`, not logged in.
fn connect_from(server: &Server, source: [u8; 4]) -> std::net::TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let from = SocketAddr::from((source, 0));
    socket.bind(&from.into()).unwrap();
    socket.connect(&server.listen.into()).unwrap();
    let stream: std::net::TcpStream = socket.into();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream
}

/// The login deadline counts from the connect: pinging, or trickling an unfinished frame
/// a byte at a time, does not buy a connection that never logs in more time.
#[test]
fn a_client_that_never_logs_in_is_kicked_whatever_it_sends() {
    let server = Serve::new().config("login_timeout_secs = 2\n").start();
    let mut pinger = server.connect();
    let mut trickler = server.connect();
    let mut user = server.login(5);
    let frame = encode_to_vec(&Frame {
        request_id: 9,
        message: Message::Ping { client_time_us: 1 },
    });
    // 2 s to log in, the sweep once a second: kicked by about 3 s; 20 × 300 ms is 6 s.
    let (mut pongs, mut trickled, mut trickler_kicked) = (0, 0, false);
    for _ in 0..20 {
        if pinger
            .request(&Message::Ping { client_time_us: 2 })
            .is_err()
        {
            break; // kicked: the kick is queued, then the stream ended
        }
        pongs += 1;
        if !trickler_kicked {
            trickler_kicked = has_input(trickler.stream());
            if !trickler_kicked && trickled + 1 < frame.len() {
                trickler.send_raw(&frame[trickled..trickled + 1]).unwrap();
                trickled += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        pongs < 20,
        "a pinging client was never kicked ({pongs} pongs)"
    );
    expect_kick(&mut pinger, KickReason::Idle);
    trickler_kicked = trickler_kicked || has_input(trickler.stream());
    assert!(trickler_kicked, "a trickling client was not kicked in time");
    expect_kick(&mut trickler, KickReason::Idle);
    // The logged-in user, silent all along, stays.
    ping(&mut user, 3).unwrap();
    let totals = server.get("/v1/stats")["totals"].clone();
    assert!(totals["kicks_idle"].as_u64().unwrap() >= 2, "{totals}");
}

/// The sweep's other deadlines, now that it looks only at connections that can expire: a
/// silent logged-in session is kicked once an idle timeout is set while one that talks
/// stays; and without one, a kicked connection whose client neither reads nor closes is
/// closed by the server after the grace.
#[test]
fn idle_sessions_and_lingering_kicks_are_swept() {
    let server = Serve::new().config("idle_timeout_secs = 2\n").start();
    let mut silent = server.login(1);
    let mut talker = server.login(2);
    // 2 s idle, the sweep once a second: kicked by about 3 s; 20 × 300 ms is 6 s.
    for i in 0..20 {
        if has_input(silent.stream()) {
            break;
        }
        ping(&mut talker, i + 1).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    expect_kick(&mut silent, KickReason::Idle);
    expect_closed(&mut silent);
    ping(&mut talker, 100).unwrap();
    drop(server);

    let server = Serve::new().start();
    let lingering = server.login(10);
    let mut second = server.login(10);
    let connections = || server.get("/v1/stats")["connections"].as_u64();
    wait_until("the replaced connection to be closed", secs(10), || {
        (connections() == Some(1)).then_some(())
    });
    ping(&mut second, 1).unwrap();
    drop(lingering);
}

/// Connections not yet logged in are capped per worker and per source address. Over a
/// source's share a connection is closed at once and counted; over the worker's cap in
/// all it is not accepted at all: it waits in the kernel's accept queue, taken in once a
/// place frees (never accept-and-close). Logged-in connections are not limited.
#[test]
fn connections_not_logged_in_are_capped() {
    let config = "max_unauthenticated = 3\nmax_unauthenticated_per_source = 2\n";
    let server = Serve::new().config(config).start();
    let settle = || std::thread::sleep(Duration::from_millis(500));
    let closed = |streams: &[std::net::TcpStream]| streams.iter().filter(|s| has_input(s)).count();

    // Eight from one address over two workers: two per worker at most, so four or fewer
    // held, the rest closed at once.
    let same: Vec<_> = (0..8)
        .map(|_| connect_from(&server, [127, 0, 0, 1]))
        .collect();
    settle();
    let closed_same = closed(&same);
    assert!(
        (4..=6).contains(&closed_same),
        "{closed_same} of eight closed from one address"
    );
    // Eight more from eight addresses: three per worker in all, so the workers take in
    // what fits and leave the rest queued — none of them closed.
    let spread: Vec<_> = (0..8)
        .map(|i| connect_from(&server, [127, 0, 0, 10 + i]))
        .collect();
    settle();
    assert_eq!(
        closed(&spread),
        0,
        "over the cap in all: queued, not closed"
    );
    wait_until(
        "the rejections and the pause to be counted",
        secs(5),
        || {
            let totals = server.get("/v1/stats")["totals"].clone();
            let rejected = totals["rejected_unauthenticated"].as_u64() == Some(closed_same as u64);
            let paused = totals["accept_paused"].as_u64() >= Some(1);
            (rejected && paused).then_some(())
        },
    );

    // Places free as held connections go; what queued is taken in; logged-in ones do not
    // count.
    drop(same);
    drop(spread);
    settle();
    let users: Vec<Client> = (1..=10).map(|u| server.login(u)).collect();
    for mut user in users {
        assert_eq!(shake_result(&mut user).0, ResultCode::Nothing);
    }
}

/// A client that sends requests and shuts down its write side gets a reply to every one
/// (those the core answers too), then the server closes.
#[test]
fn a_half_closed_client_gets_every_reply() {
    let server = Serve::new().start();
    for user in 1..=5 {
        let mut client = server.login(user);
        let mut sent = BTreeSet::new();
        for message in [
            Message::Ping { client_time_us: 1 },
            Message::Open { packet_id: 999 },
            Message::Open { packet_id: 998 },
            Message::Send {
                amount_cents: 100,
                shares: 1,
                recipients: vec![100 + user],
                idempotency_key: None,
            },
            Message::Chat {
                to_user: 77,
                text: "anyone?".into(),
            },
            Message::Shake,
            Message::Ping { client_time_us: 2 },
        ] {
            sent.insert(client.send(&message).unwrap());
        }
        client.stream().shutdown(std::net::Shutdown::Write).unwrap();
        let mut answered = BTreeSet::new();
        loop {
            match client.recv() {
                Ok(frame) => {
                    answered.insert(frame.request_id);
                }
                Err(e) if is_closed(&e) => break,
                Err(e) => panic!("user {user}: waiting for replies: {e}"),
            }
        }
        assert_eq!(answered, sent, "user {user}: replies before the close");
    }
    server.audit();
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

// ----- logs ------------------------------------------------------------------------------

/// What `serve` logs when it runs with the built-in development secret.
const DEV_SECRET_WARNING: &str =
    "login tokens are signed with the built-in development secret: listening on loopback only";

/// The stderr of a `serve` with the development secret and `extra` arguments, once it has
/// logged the dev-secret warning and stopped. The test runner's own `HONGBAO_LOG_FORMAT`
/// and `HONGBAO_LOG` are left out: the flag, or its absence, decides.
fn dev_secret_log(extra: &[&str]) -> String {
    let mut server = Serve::new()
        .dev_secret()
        .args(extra)
        .env_remove(FORMAT_ENV)
        .env_remove(FILTER_ENV)
        .start();
    wait_until("the dev-secret warning", secs(10), || {
        server
            .process
            .log()
            .contains(DEV_SECRET_WARNING)
            .then_some(())
    });
    server.stop();
    server.process.log()
}

/// `--log-format json`: every line on stderr (the supervisor's and its workers') is one
/// JSON object, and the dev-secret warning is one of them, at level WARN.
#[test]
fn log_format_json_writes_one_object_a_line() {
    let log = dev_secret_log(&["--log-format", "json"]);
    let records: Vec<Value> = log
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line:?}"))
        })
        .collect();
    let warning = records
        .iter()
        .find(|r| {
            r["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(DEV_SECRET_WARNING))
        })
        .unwrap_or_else(|| panic!("no dev-secret warning in {log}"));
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert!(warning["timestamp"].is_string(), "{warning}");
}

/// Without the flag the log is for people: the same warning is a plain line saying WARN.
#[test]
fn the_log_is_human_by_default() {
    let log = dev_secret_log(&[]);
    let line = log
        .lines()
        .find(|line| line.contains(DEV_SECRET_WARNING))
        .unwrap_or_else(|| panic!("no dev-secret warning in {log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(
        serde_json::from_str::<Value>(line).is_err(),
        "a human log line that is JSON: {line}"
    );
}
