//! What the `serve` tests (serve.rs, money.rs, overload.rs, lifecycle.rs) say to a
//! server and expect back: raw frames, kicks and closes, a shake's, a send's, an open's
//! and a chat's answers, notices, users spread over both workers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hongbao_proto::client::Client;
use hongbao_proto::{KickReason, Message, ResultCode};
use serde_json::Value;

use super::{is_closed, wait_until, Server};

/// Whether process `pid` has exited (gone, or a zombie nobody has reaped yet).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

// ----- wire helpers ----------------------------------------------------------------------

/// A frame header (and payload) with every field as given, valid or not.
pub fn raw_frame(len: u32, version: u8, kind: u8, request_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = len.to_be_bytes().to_vec();
    bytes.push(version);
    bytes.push(kind);
    bytes.extend_from_slice(&request_id.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

pub fn expect_kick(client: &mut Client, reason: KickReason) {
    let frame = client.recv().expect("waiting for a kick");
    match frame.message {
        Message::Kick { reason: got, .. } if frame.request_id == 0 => assert_eq!(got, reason),
        other => panic!("expected kick {reason:?}, got {other:?}"),
    }
}

/// The server has closed this connection: the next read sees the end of the stream.
pub fn expect_closed(client: &mut Client) {
    match client.recv() {
        Err(e) if is_closed(&e) => {}
        other => panic!("expected the server to close the connection, got {other:?}"),
    }
}

/// Like `expect_closed`, letting pushes that were already on their way arrive first.
pub fn expect_closed_after_pushes(client: &mut Client) {
    loop {
        match client.recv() {
            Ok(frame) if frame.request_id == 0 => {}
            Err(e) if is_closed(&e) => return,
            other => panic!("expected the server to close the connection, got {other:?}"),
        }
    }
}

pub fn ping(client: &mut Client, client_time_us: u64) -> std::io::Result<()> {
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

pub fn shake_result(client: &mut Client) -> (ResultCode, u64, u64) {
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
pub fn shake_until_won(client: &mut Client, wins: usize) -> Vec<(u64, u64)> {
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

pub fn send_result(
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

pub fn open_result(client: &mut Client, packet: u64) -> (ResultCode, u64) {
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

pub fn chat_result(client: &mut Client, to: u64, text: &str) -> ResultCode {
    match client.chat(to, text).expect("chat") {
        Message::ChatReply { result } => result,
        other => panic!("expected a chat reply, got {other:?}"),
    }
}

/// The next push, which must be a packet notice; returns its fields.
pub fn expect_notice(client: &mut Client) -> (u64, u64, u64, u32, u64) {
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

pub fn expect_chat(client: &mut Client, from: u64, text: &str) {
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
pub fn users_on_both_workers(server: &Server, first: u64) -> (BTreeMap<u64, Client>, Vec<Value>) {
    let mut clients = BTreeMap::new();
    let workers = spread_over_workers(server, &mut clients, first);
    (clients, workers)
}

/// Adds users from `next` on to `clients` (eight at a time) until both workers hold
/// some of `clients`; returns the stats' workers.
pub fn spread_over_workers(
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
