//! End-to-end tests of `hongbao serve`'s sessions: the real binary with two gateway
//! workers, real sockets on `127.0.0.1:0`. Each test starts its own server (they run in
//! parallel) and a `Server` guard SIGKILLs it when the test ends, so nothing outlives a
//! failing test. This file: logins and their tokens, frames that break the protocol,
//! clients that misbehave, never log in, idle, half-close, and the log's formats; the
//! money is `money.rs`, overload `overload.rs`, workers dying and the server stopping
//! `lifecycle.rs` (their helpers: `common/wire.rs`).

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

mod common;

use common::wire::*;
use common::{is_closed, token, wait_until, Serve, Server, IO_TIMEOUT, SECRET};
use hongbao_proto::client::Client;
use hongbao_proto::{encode_to_vec, Frame, KickReason, Message, ResultCode};
use hongbao_telemetry::log::{FILTER_ENV, FORMAT_ENV};
use serde_json::Value;

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
