//! What TLS adds to one shake, on its own: the server's side of one request record in
//! (open) and one reply record out (seal) with rustls's unbuffered API, as the gateway
//! does it, timed over N shakes taken in turn on K established TLS 1.3 sessions
//! (AES-128-GCM, the shake's 10-byte frame in and 22-byte reply out): with K = 1 every
//! session state is in cache, with K = 20,000 (the shake bench's connections) it is not.
//! The client's side is timed apart. No sockets: the premise of the TLS shake bench,
//! without the kernel.
//!
//!   cargo run --release -p hongbao-http --example tls_record_cost [N] [K]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use hongbao_http::tls::{new_ticket_key, server_config_with, DevCerts};
use hongbao_proto::tls::client_config;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::ConnectionState;
use rustls::ClientConnection;

const SHAKE: [u8; 10] = [0, 0, 0, 6, 2, 2, 0, 0, 0, 7];
const REPLY: [u8; 22] = [0; 22];

/// Feeds `incoming` to the server; answers each whole request with `reply` (once the
/// handshake is done); returns what the server wrote and how many records it read.
fn serve(
    s: &mut UnbufferedServerConnection,
    incoming: &mut [u8],
    out: &mut Vec<u8>,
    scratch: &mut [u8],
    reply: &[u8],
) -> usize {
    let mut at = 0;
    let mut read = 0;
    loop {
        let st = s.process_tls_records(&mut incoming[at..]);
        let discard = st.discard;
        let mut stop = false;
        match st.state.expect("tls") {
            ConnectionState::EncodeTlsData(mut e) => {
                let k = e.encode(scratch).expect("room");
                out.extend_from_slice(&scratch[..k]);
            }
            ConnectionState::TransmitTlsData(t) => t.done(),
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(rec) = r.next_record() {
                    std::hint::black_box(rec.expect("record").payload);
                    read += 1;
                }
            }
            ConnectionState::WriteTraffic(mut w) => {
                for _ in 0..read {
                    let k = w.encrypt(reply, scratch).expect("room");
                    out.extend_from_slice(&scratch[..k]);
                }
                stop = true;
            }
            ConnectionState::BlockedHandshake => stop = true,
            other => panic!("{other:?}"),
        }
        at += discard;
        if stop {
            return read;
        }
    }
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let k: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    hongbao_http::tls::install_provider();
    let certs = DevCerts::make(&["127.0.0.1"]).unwrap();
    let key = new_ticket_key();
    let server = server_config_with(
        certs.cert_pem.as_bytes(),
        certs.key_pem.as_bytes(),
        &[b"hongbao/2"],
        Some(&key),
    )
    .unwrap();
    let client = client_config(certs.ca_pem.as_bytes(), &[b"hongbao/2"]).unwrap();
    let mut scratch = vec![0u8; 32 * 1024];
    let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
    let mut pairs = Vec::with_capacity(k);
    for _ in 0..k {
        let mut s = UnbufferedServerConnection::new(server.clone()).unwrap();
        let mut c = ClientConnection::new(client.clone(), "127.0.0.1".try_into().unwrap()).unwrap();
        // The handshake, then one shake to settle.
        for _ in 0..4 {
            to_server.clear();
            while c.wants_write() {
                c.write_tls(&mut to_server).unwrap();
            }
            to_client.clear();
            serve(&mut s, &mut to_server, &mut to_client, &mut scratch, &REPLY);
            let mut rd = &to_client[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets().unwrap();
            }
        }
        assert!(!c.is_handshaking());
        pairs.push((s, c));
    }

    let (mut server_time, mut client_time) = (Duration::ZERO, Duration::ZERO);
    let mut got = [0u8; 64];
    for i in 0..n as usize {
        let (s, c) = &mut pairs[i % k];
        let t0 = Instant::now();
        c.writer().write_all(&SHAKE).unwrap();
        to_server.clear();
        c.write_tls(&mut to_server).unwrap();
        let t1 = Instant::now();
        to_client.clear();
        let read = serve(s, &mut to_server, &mut to_client, &mut scratch, &REPLY);
        let t2 = Instant::now();
        assert_eq!(read, 1);
        let mut rd = &to_client[..];
        c.read_tls(&mut rd).unwrap();
        c.process_new_packets().unwrap();
        assert_eq!(c.reader().read(&mut got).unwrap(), REPLY.len());
        let t3 = Instant::now();
        server_time += t2 - t1;
        client_time += (t1 - t0) + (t3 - t2);
    }
    let per = |d: Duration| d.as_nanos() as f64 / f64::from(n);
    println!(
        "server, a shake (one record in, one out): {:.0} ns; client: {:.0} ns; {n} shakes over {k} sessions",
        per(server_time),
        per(client_time)
    );
}
