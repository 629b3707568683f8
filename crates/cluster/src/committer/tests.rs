//! A batch whose COMMIT went out and whose answer never came back, against a real
//! PostgreSQL: a relay between the committer and the server passes the COMMIT on, lets the
//! server commit it, and cuts both connections before the answer is relayed. The batch is
//! sent again and every op is told what the lost attempt did, paid once.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hongbao_money::seam::Origin;

use super::*;
use crate::commit::{Commit, Done};
use crate::testpg::TestPg;

/// A TCP relay to `to` that, while `cut` is set, passes a client's `COMMIT` on to the
/// server, waits for the server to have done it, and then closes both connections
/// without relaying the answer (and clears `cut`: the next connection is relayed whole).
struct CuttingRelay {
    port: u16,
    cut: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    /// COMMITs the server answered as done whose answers were held back.
    committed: Arc<AtomicUsize>,
}

impl CuttingRelay {
    fn start(to: u16) -> CuttingRelay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, cuts) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let committed = Arc::new(AtomicUsize::new(0));
        let (cut2, cuts2, committed2) = (cut.clone(), cuts.clone(), committed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let server = TcpStream::connect(("127.0.0.1", to)).unwrap();
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let held = Arc::new(AtomicBool::new(false));
                let (held2, committed) = (held.clone(), committed2.clone());
                std::thread::spawn(move || copy_unless_held(s2, c2, &held2, &committed));
                let (cut, cuts) = (cut2.clone(), cuts2.clone());
                std::thread::spawn(move || relay_messages(client, server, &cut, &cuts, &held));
            }
        });
        CuttingRelay {
            port,
            cut,
            cuts,
            committed,
        }
    }
}

/// Server to client, until `held` is set: from then on nothing more is passed on, and
/// an answer held back that says the COMMIT was done is counted in `committed`.
fn copy_unless_held(
    mut from: TcpStream,
    mut to: TcpStream,
    held: &AtomicBool,
    committed: &AtomicUsize,
) {
    let mut buf = [0u8; 16384];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if held.load(Ordering::SeqCst) {
            // CommandComplete, tag COMMIT.
            if buf[..n].windows(7).any(|w| w == b"COMMIT\0") {
                committed.fetch_add(1, Ordering::SeqCst);
            }
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// Client to server, message by message (the startup packet has no type byte).
fn relay_messages(
    mut client: TcpStream,
    mut server: TcpStream,
    cut: &AtomicBool,
    cuts: &AtomicUsize,
    held: &AtomicBool,
) {
    let mut len = [0u8; 4];
    if client.read_exact(&mut len).is_err() {
        return;
    }
    let mut startup = vec![0u8; u32::from_be_bytes(len) as usize - 4];
    if client.read_exact(&mut startup).is_err() {
        return;
    }
    let _ = server.write_all(&[&len[..], &startup].concat());
    loop {
        let mut head = [0u8; 5];
        if client.read_exact(&mut head).is_err() {
            break;
        }
        let mut body = vec![0u8; u32::from_be_bytes(head[1..].try_into().unwrap()) as usize - 4];
        if client.read_exact(&mut body).is_err() {
            break;
        }
        let commit = head[0] == b'Q' && body.starts_with(b"COMMIT");
        let cutting = commit && cut.swap(false, Ordering::SeqCst);
        if cutting {
            // The server's answer, when it comes, ends the client's side unrelayed.
            held.store(true, Ordering::SeqCst);
            cuts.fetch_add(1, Ordering::SeqCst);
        }
        if server.write_all(&[&head[..], &body].concat()).is_err() {
            break;
        }
        if cutting {
            std::thread::sleep(Duration::from_millis(300));
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
}

pub(crate) fn origin(user: u64) -> Origin {
    Origin {
        worker: 0,
        conn: hongbao_money::ConnId {
            key: 1,
            generation: 0,
        },
        request: 1,
        user: hongbao_money::UserId::new(user).unwrap(),
    }
}

async fn scalar(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[test]
fn a_batch_cut_after_its_commit_is_sent_again_and_pays_nothing_twice() {
    let Some(pg) = TestPg::start() else { return };
    let relay = CuttingRelay::start(pg.port);
    let target = PgTarget {
        url: format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            relay.port
        ),
        ..PgTarget::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let setup = pg_connect(&target).await.unwrap();
        setup.batch_execute(crate::store::SCHEMA).await.unwrap();
        let chain = tokio::sync::Mutex::new(());
        let lost = std::sync::atomic::AtomicU64::new(0);
        let link = Link {
            chain: &chain,
            lost: &lost,
            target: &target,
        };
        let mut conn = None;
        // Every batch at the time it is given (the committer's clock read once a batch):
        // sent again, it keeps it.
        let at = UnixTime::from_millis(1_800_000_000_123);
        // Before the cut: user 7 wins 1,000 and sends 100 to users 8 and 9 (packet 50).
        let win = |packet, cents, op_id| Commit::Win {
            to: origin(7),
            campaign: 1,
            packet,
            cents,
            op_id,
        };
        let done = commit_until_known(&mut conn, link, Here::ONE, "h1", at, &[win(1, 1_000, 1)])
            .await
            .unwrap();
        assert!(matches!(done[..], [Some(Done::Won(true))]));
        // The same packet dealt again to the same user (back from a failed batch, or
        // restored after Redis lost its state) is another op: not won twice.
        let done = commit_until_known(&mut conn, link, Here::ONE, "h1", at, &[win(1, 1_000, 2)])
            .await
            .unwrap();
        assert!(matches!(done[..], [Some(Done::Won(false))]));
        let send = [Commit::Send {
            to: origin(7),
            packet: 50,
            cents: 100,
            recipients: vec![8, 9],
            shares: vec![60, 40],
            expires_ms: u64::MAX >> 2,
            key: None,
        }];
        commit_until_known(&mut conn, link, Here::ONE, "h1", at, &send)
            .await
            .unwrap();
        let open = |user, op_id| Commit::Open {
            to: origin(user),
            packet: 50,
            op_id,
        };
        commit_until_known(&mut conn, link, Here::ONE, "h1", at, &[open(9, 3)])
            .await
            .unwrap();
        // The batch cut after its COMMIT: an open, a win, a send without a key, a send
        // with one; and ops that find work other ops did — user 9's share opened again,
        // packet 1 dealt a third time.
        let batch = [
            open(8, 4),
            win(2, 500, 5),
            Commit::Send {
                to: origin(7),
                packet: 51,
                cents: 300,
                recipients: vec![9],
                shares: vec![300],
                expires_ms: u64::MAX >> 2,
                key: None,
            },
            Commit::Send {
                to: origin(7),
                packet: 52,
                cents: 200,
                recipients: vec![8],
                shares: vec![200],
                expires_ms: u64::MAX >> 2,
                key: Some("k1".into()),
            },
            open(9, 6),
            win(1, 1_000, 7),
        ];
        let events_before = scalar(&setup, "SELECT count(*) FROM hb_events").await;
        relay.cut.store(true, Ordering::SeqCst);
        let done = commit_until_known(&mut conn, link, Here::ONE, "h1", at, &batch)
            .await
            .unwrap();
        assert_eq!(relay.cuts.load(Ordering::SeqCst), 1, "the COMMIT was cut");
        assert_eq!(lost.load(Ordering::SeqCst), 1, "one connection given up");
        assert_eq!(
            relay.committed.load(Ordering::SeqCst),
            1,
            "the server had committed the lost attempt: the second found it done"
        );
        // Told what the lost attempt did.
        let told: Vec<String> = done
            .iter()
            .map(|d| match d {
                Some(Done::Opened(r, cents)) => format!("opened {r} {cents}"),
                Some(Done::Won(w)) => format!("won {w}"),
                Some(Done::Sent(r, p, _)) => format!("sent {r} {p}"),
                Some(Done::Created(c)) => format!("created {c}"),
                None => "left out".into(),
            })
            .collect();
        assert_eq!(
            told,
            [
                "opened opened 40",
                "won true",
                "sent ok 51",
                "sent ok 52",
                "opened already-opened 60",
                "won false"
            ]
        );
        // Paid once: 1,000 + 500 won, 100 + 300 + 200 sent.
        assert_eq!(
            scalar(&setup, "SELECT cents FROM hb_balances WHERE user_id = 7").await,
            900
        );
        assert_eq!(
            scalar(&setup, "SELECT cents FROM hb_balances WHERE user_id = 8").await,
            40
        );
        assert_eq!(
            scalar(&setup, "SELECT cents FROM hb_balances WHERE user_id = 9").await,
            60
        );
        assert_eq!(
            scalar(&setup, "SELECT count(*) FROM hb_events").await - events_before,
            4,
            "each op's event once"
        );
        assert_eq!(
            scalar(&setup, "SELECT count(*) FROM hb_packets WHERE sender = 7").await,
            3
        );
        // The host's chain has no fork: each event's hash is linked from the one before.
        let mut chains = crate::chain::Chains::new(0);
        for r in setup
            .query(
                "SELECT host, seq, at_ms, body::text, hash FROM hb_events ORDER BY seq",
                &[],
            )
            .await
            .unwrap()
        {
            let (seq, at_ms): (i64, i64) = (r.get(1), r.get(2));
            assert_eq!(at_ms as u64, at.as_millis(), "event {seq}");
            chains.step(r.get(0), seq as u64, at_ms as u64, r.get(3), r.get(4));
        }
        let walked = chains.finish();
        assert!(walked.problems.is_empty(), "{:?}", walked.problems);
        assert_eq!(walked.heads.len(), 1);
    });
    drop(pg);
}
