//! End-to-end tests of `hongbao serve`'s money: shakes that win what the ledger credits,
//! sends, opens and their refunds, chat across workers, campaigns through the admin API.
//! The real binary with two gateway workers, real sockets, a ledger in a temporary
//! directory; what is checked is what a client or an operator can see.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::time::Duration;

mod common;

use common::wire::*;
use common::{wait_until, Serve, IO_TIMEOUT};
use hongbao_proto::ResultCode;
use serde_json::{json, Value};

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
