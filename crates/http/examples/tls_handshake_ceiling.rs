//! The ceiling a login storm over TLS is held to (issue 51): full TLS 1.3 handshakes a
//! second on this machine with both ends in one process — a rustls client and server,
//! the gateway's own configs (its ECDSA P-256 certificate from `hongbao dev-cert`, its key
//! exchange and ciphers), each on the unbuffered session the gateway and the load use —
//! and no sockets: the crypto and rustls alone, the most any storm of this machine's own
//! clients and server can log in. Each thread makes handshakes one after another for the
//! seconds asked; THREADS threads at once (1: a core; 2: this machine's two cores).
//! `--resumed` makes them resume from a ticket instead (the client keeps its session).
//!
//!   cargo run --release -p hongbao-http --example tls_handshake_ceiling -- [THREADS] [SECS] [--resumed]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hongbao_http::tls::{new_ticket_key, server_config_with, DevCerts, ALPN_FRAMES};
use hongbao_proto::tls::session::{ClientSession, ServerSession, Session};
use rustls::client::{Resumption, UnbufferedClientConnection};
use rustls::server::UnbufferedServerConnection;

/// One handshake between a fresh client and a fresh server session, bytes passed in
/// memory; returns whether the client resumed.
fn handshake(client: &Arc<rustls::ClientConfig>, server: &Arc<rustls::ServerConfig>) -> bool {
    let name = "127.0.0.1".try_into().expect("a name");
    let mut c: ClientSession =
        Session::new(UnbufferedClientConnection::new(client.clone(), name).expect("client"));
    let mut s: ServerSession =
        Session::new(UnbufferedServerConnection::new(server.clone()).expect("server"));
    let (mut to_server, mut to_client, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    c.seal(b"", &mut to_server);
    for _ in 0..8 {
        if !c.is_handshaking() && !s.is_handshaking() {
            break;
        }
        let incoming = std::mem::take(&mut to_server);
        s.open(&incoming, &mut plain, &mut to_client)
            .expect("the server's side");
        let incoming = std::mem::take(&mut to_client);
        c.open(&incoming, &mut plain, &mut to_server)
            .expect("the client's side");
    }
    // The server's last flight (its tickets) reaches the client too.
    let incoming = std::mem::take(&mut to_server);
    s.open(&incoming, &mut plain, &mut to_client)
        .expect("the server's side");
    let incoming = std::mem::take(&mut to_client);
    c.open(&incoming, &mut plain, &mut to_server)
        .expect("the client's side");
    assert!(
        !c.is_handshaking() && !s.is_handshaking(),
        "the handshake ends"
    );
    s.resumed()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let resumed = args.iter().any(|a| a == "--resumed");
    let numbers: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let threads = numbers.first().copied().unwrap_or(1).max(1) as usize;
    let secs = numbers.get(1).copied().unwrap_or(5).max(1);
    hongbao_http::tls::install_provider();
    let certs = DevCerts::make(&["127.0.0.1"]).expect("a certificate");
    let ticket_key = new_ticket_key();
    let server = server_config_with(
        certs.cert_pem.as_bytes(),
        certs.key_pem.as_bytes(),
        &[ALPN_FRAMES],
        Some(&ticket_key),
    )
    .expect("the gateway's config");
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let server = server.clone();
            let ca = certs.ca_pem.clone();
            std::thread::spawn(move || {
                let mut client =
                    (*hongbao_proto::tls::client_config(ca.as_bytes(), &[ALPN_FRAMES]).unwrap())
                        .clone();
                if !resumed {
                    client.resumption = Resumption::disabled();
                }
                let client = Arc::new(client);
                // One to warm up (and, resuming, to get a ticket).
                handshake(&client, &server);
                let (start, mut done, mut resumes) = (Instant::now(), 0u64, 0u64);
                while start.elapsed() < Duration::from_secs(secs) {
                    resumes += u64::from(handshake(&client, &server));
                    done += 1;
                }
                (done, resumes, start.elapsed())
            })
        })
        .collect();
    let mut total = 0.0;
    let mut resumes = 0;
    for w in workers {
        let (done, r, took) = w.join().expect("a thread");
        total += done as f64 / took.as_secs_f64();
        resumes += r;
    }
    let kind = if resumed { "resumed" } else { "full" };
    println!(
        "tls_handshake_ceiling: {threads} thread(s), {secs} s: {total:.0} {kind} TLS handshakes a second, client and server together ({:.0} a thread); {resumes} resumed",
        total / threads as f64
    );
}
