//! TLS on the client listeners (binary frames, WebSocket, the HTTP API): a layer under
//! the codecs, nothing above it knows. A connection of a TLS listener carries a rustls
//! session; what is read goes through it (`open`) before the codec sees it, and what is
//! written goes through it (`seal`) before the socket does — everything a connection is
//! sent passes `Worker::write`, the one place that seals. rustls keeps nothing of ours:
//! what it has to send is taken out at once and goes the way every write goes (the
//! connection's queue, the slow-reader limit).
//!
//! A client that does not speak TLS (or not a version or name we take) fails its
//! handshake: it is sent rustls's alert and closed, and counted (`tls_refused`). New
//! certificates (a reload) apply to the connections that come after; those open keep the
//! config they began with.

use std::io::{Read, Write};
use std::sync::Arc;

use hongbao_http::tls::{server_config_with, ALPN_FRAMES, ALPN_HTTP};
use rustls::{ServerConfig, ServerConnection};

use crate::link::TlsPem;

/// The configs a worker's TLS sessions begin with: one per kind of listener (they say
/// different ALPN names).
pub(super) struct Tls {
    frames: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
}

impl Tls {
    pub(super) fn new(pem: &TlsPem) -> Result<Tls, String> {
        let tickets = Some(&pem.ticket_key);
        Ok(Tls {
            frames: server_config_with(&pem.cert, &pem.key, &[ALPN_FRAMES], tickets)?,
            http: server_config_with(&pem.cert, &pem.key, &[ALPN_HTTP], tickets)?,
        })
    }

    /// A session for a connection of a listener speaking HTTP (or binary frames).
    pub(super) fn session(&self, http: bool) -> Box<ServerConnection> {
        let config = if http { &self.http } else { &self.frames };
        Box::new(ServerConnection::new(config.clone()).expect("a server session of a valid config"))
    }
}

/// What came of bytes read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Opened {
    /// Their plaintext (if any) is in `plain`.
    Data,
    /// The peer said goodbye (close_notify): nothing more comes.
    PeerClosed,
}

/// Feeds `cipher` (bytes read from the socket) to `tls`: appends what it decrypts to
/// `plain` and what it has to send (handshake, alerts) to `out`. An error is the peer's
/// (not TLS, a bad record): `out` then holds the alert to send before closing.
pub(super) fn open(
    tls: &mut ServerConnection,
    mut cipher: &[u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<Opened, rustls::Error> {
    let mut closed = false;
    while !cipher.is_empty() {
        // rustls takes what fits its buffer; what it decrypts is taken out before more.
        if tls.read_tls(&mut cipher).is_err() {
            break;
        }
        let state = match tls.process_new_packets() {
            Ok(state) => state,
            Err(e) => {
                drain(tls, out);
                return Err(e);
            }
        };
        let n = state.plaintext_bytes_to_read();
        if n > 0 {
            let start = plain.len();
            plain.resize(start + n, 0);
            tls.reader()
                .read_exact(&mut plain[start..])
                .expect("rustls said how many bytes it holds");
        }
        closed |= state.peer_has_closed();
    }
    drain(tls, out);
    Ok(if closed {
        Opened::PeerClosed
    } else {
        Opened::Data
    })
}

/// Encrypts `plain` for `tls`, appending the records to `out`.
pub(super) fn seal(tls: &mut ServerConnection, plain: &[u8], out: &mut Vec<u8>) {
    // Written into rustls's own queue (sent once the handshake is done, if it is not).
    let _ = tls.writer().write_all(plain);
    drain(tls, out);
}

/// The goodbye of a TLS session (close_notify), appended to `out`.
pub(super) fn close(tls: &mut ServerConnection, out: &mut Vec<u8>) {
    tls.send_close_notify();
    drain(tls, out);
}

/// Takes out everything rustls has to send.
fn drain(tls: &mut ServerConnection, out: &mut Vec<u8>) {
    while tls.wants_write() {
        if tls.write_tls(out).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hongbao_http::tls::{client_config, DevCerts};
    use rustls::ClientConnection;

    /// A client and a worker's session, joined by `open` and `seal` alone: the
    /// handshake, data both ways, a plain client refused.
    #[test]
    fn a_session_opens_and_seals_through_the_worker_functions() {
        let certs = DevCerts::make(&["127.0.0.1"]).unwrap();
        let pem = TlsPem {
            cert: certs.cert_pem.clone().into_bytes(),
            key: certs.key_pem.clone().into_bytes(),
            ticket_key: hongbao_http::tls::new_ticket_key(),
        };
        let tls = Tls::new(&pem).unwrap();
        let mut server = tls.session(false);
        let config = client_config(certs.ca_pem.as_bytes(), &[ALPN_FRAMES]).unwrap();
        let mut client = ClientConnection::new(config, "127.0.0.1".try_into().unwrap()).unwrap();
        let (mut to_server, mut plain, mut to_client) = (Vec::new(), Vec::new(), Vec::new());
        client.writer().write_all(b"shake").unwrap();
        // Round trips until the handshake is done and the data is through.
        for _ in 0..5 {
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            let opened = open(&mut server, &to_server, &mut plain, &mut to_client).unwrap();
            assert_eq!(opened, Opened::Data);
            to_server.clear();
            let mut rd = &to_client[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
                client.process_new_packets().unwrap();
            }
            to_client.clear();
        }
        assert_eq!(plain, b"shake");
        assert_eq!(server.alpn_protocol(), Some(ALPN_FRAMES));
        seal(&mut server, b"nothing", &mut to_client);
        let mut rd = &to_client[..];
        client.read_tls(&mut rd).unwrap();
        client.process_new_packets().unwrap();
        let mut back = [0u8; 7];
        client.reader().read_exact(&mut back).unwrap();
        assert_eq!(&back, b"nothing");
        // Goodbye: the client hears close_notify.
        let mut bye = Vec::new();
        close(&mut server, &mut bye);
        let mut rd = &bye[..];
        client.read_tls(&mut rd).unwrap();
        assert!(client.process_new_packets().unwrap().peer_has_closed());

        // A plain client's login frame is not TLS: refused, with an alert to send.
        let mut server = tls.session(false);
        let frame = [0, 0, 0, 6, 2, 2, 0, 0, 0, 1];
        let (mut plain, mut alert) = (Vec::new(), Vec::new());
        assert!(open(&mut server, &frame, &mut plain, &mut alert).is_err());
        assert!(plain.is_empty());
        assert!(!alert.is_empty(), "an alert goes back");
    }
}
