//! What an idle TLS session keeps on the heap, after its handshake and one record each
//! way: rustls's buffered `ServerConnection` against its unbuffered one (the caller owns
//! every buffer), and both ends of `hongbao_proto::tls::session` as the gateway and the
//! load keep them (with and without resumption on the client). Counted by a global
//! allocator, live bytes over N sessions.
//!
//!   cargo run --release -p hongbao-http --example tls_session_memory [N]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicIsize, Ordering};

use hongbao_http::tls::{new_ticket_key, server_config_with, DevCerts};
use hongbao_proto::tls::client_config;
use hongbao_proto::tls::session::{ClientSession, ServerSession, Session};
use rustls::client::UnbufferedClientConnection;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError};
use rustls::{ClientConnection, ServerConnection};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        System.realloc(p, l, n)
    }
}
#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
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

    // Buffered.
    let before = live();
    let mut kept = Vec::new();
    for _ in 0..n {
        let mut s = ServerConnection::new(server.clone()).unwrap();
        let mut c = ClientConnection::new(client.clone(), "127.0.0.1".try_into().unwrap()).unwrap();
        c.writer().write_all(b"login").unwrap();
        for _ in 0..4 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).unwrap();
                s.process_new_packets().unwrap();
            }
            let mut got = Vec::new();
            let _ = s.reader().read_to_end(&mut got);
            s.writer().write_all(b"welcome").unwrap_or(());
            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets().unwrap();
            }
        }
        drop(c);
        kept.push(s);
    }
    let per = (live() - before) as f64 / n as f64;
    println!("buffered ServerConnection, idle: {per:.0} bytes a session (live heap)");
    drop(kept);

    // Unbuffered: the caller owns the buffers; nothing is kept between records.
    let before = live();
    let mut kept = Vec::new();
    let mut incoming = Vec::new();
    let mut outgoing = vec![0u8; 32 * 1024];
    for _ in 0..n {
        let mut s = UnbufferedServerConnection::new(server.clone()).unwrap();
        let mut c = ClientConnection::new(client.clone(), "127.0.0.1".try_into().unwrap()).unwrap();
        c.writer().write_all(b"login").unwrap();
        for _ in 0..4 {
            incoming.clear();
            while c.wants_write() {
                c.write_tls(&mut incoming).unwrap();
            }
            let mut to_client = Vec::new();
            let mut at = 0;
            loop {
                let st = s.process_tls_records(&mut incoming[at..]);
                let discard = st.discard;
                let state = st.state.unwrap();
                let mut done = false;
                match state {
                    ConnectionState::EncodeTlsData(mut e) => {
                        let k = match e.encode(&mut outgoing) {
                            Ok(k) => k,
                            Err(EncodeError::InsufficientSize(_)) => panic!("small"),
                            Err(e) => panic!("{e:?}"),
                        };
                        to_client.extend_from_slice(&outgoing[..k]);
                    }
                    ConnectionState::TransmitTlsData(t) => t.done(),
                    ConnectionState::ReadTraffic(mut r) => {
                        while let Some(rec) = r.next_record() {
                            let _ = rec.unwrap().payload;
                        }
                    }
                    ConnectionState::WriteTraffic(mut w) => {
                        let k = w.encrypt(b"welcome", &mut outgoing).unwrap();
                        to_client.extend_from_slice(&outgoing[..k]);
                        done = true;
                    }
                    ConnectionState::BlockedHandshake => done = true,
                    other => panic!("{other:?}"),
                }
                at += discard;
                if done {
                    break;
                }
            }
            let mut rd = &to_client[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets().unwrap();
            }
        }
        drop(c);
        kept.push(s);
    }
    let per = (live() - before) as f64 / n as f64;
    println!("unbuffered ServerConnection, idle: {per:.0} bytes a session (live heap)");
    drop(kept);

    // The sessions the gateway and the load keep, both ends, the client with and without
    // a resumption store (the load's keeps tickets, shared by its users).
    for resume in [true, false] {
        let mut config = (*client).clone();
        if !resume {
            config.resumption = rustls::client::Resumption::disabled();
        }
        let config = std::sync::Arc::new(config);
        let (mut servers, mut clients) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let mut srv: ServerSession =
                Session::new(UnbufferedServerConnection::new(server.clone()).unwrap());
            let name = "127.0.0.1".try_into().unwrap();
            let mut cli: ClientSession =
                Session::new(UnbufferedClientConnection::new(config.clone(), name).unwrap());
            let (mut to_s, mut to_c, mut plain) = (Vec::new(), Vec::new(), Vec::new());
            cli.seal(b"login", &mut to_s);
            for _ in 0..4 {
                srv.open(&std::mem::take(&mut to_s), &mut plain, &mut to_c)
                    .unwrap();
                cli.open(&std::mem::take(&mut to_c), &mut plain, &mut to_s)
                    .unwrap();
            }
            srv.seal(b"welcome", &mut to_c);
            cli.open(&to_c, &mut plain, &mut to_s).unwrap();
            // Kept boxed, as the gateway and the load keep them.
            servers.push(Box::new(srv));
            clients.push(Box::new(cli));
        }
        // What each side holds is what it gives back: the boxes and all they own.
        let at = live();
        drop(servers);
        let server_bytes = at - live();
        let at = live();
        drop(clients);
        let client_bytes = at - live();
        println!(
            "hongbao's sessions, idle (resumption {}): the gateway's {:.0} bytes, the load's {:.0} bytes a session (live heap)",
            if resume { "on" } else { "off" },
            (server_bytes as f64 - (n * 8) as f64) / n as f64,
            (client_bytes as f64 - (n * 8) as f64) / n as f64
        );
    }
    println!(
        "(struct sizes: ServerConnection {} B, UnbufferedServerConnection {} B)",
        std::mem::size_of::<ServerConnection>(),
        std::mem::size_of::<UnbufferedServerConnection>()
    );
}
