//! TLS on the client listeners (binary frames, WebSocket, the HTTP API): a layer under
//! the codecs, nothing above it knows. A connection of a TLS listener carries a rustls
//! session; what is read goes through it (`open`) before the codec sees it, and what is
//! written goes through it (`seal`) before the socket does — everything a connection is
//! sent passes `Worker::write`, the one place that seals.
//!
//! The session is rustls's unbuffered one (`hongbao_proto::tls::session`, the load's
//! too): rustls keeps no buffers of a connection's; what it has to send is taken out at
//! once and goes the way every write goes (the connection's queue, the slow-reader
//! limit). An idle connection's session holds nothing on the heap but rustls's state.
//!
//! A client that does not speak TLS (or not a version or name we take) fails its
//! handshake: it is sent rustls's alert and closed, and counted (`tls_refused`). New
//! certificates (a reload) apply to the connections that come after; those open keep the
//! config they began with. Handshakes under way are counted for admission
//! (`accept.rs`): the session says whether it still counts.

use std::sync::Arc;

use hongbao_http::tls::{server_config_with, ALPN_FRAMES, ALPN_HTTP};
pub(super) use hongbao_proto::tls::session::Opened;
use hongbao_proto::tls::session::ServerSession;
use rustls::server::UnbufferedServerConnection;
use rustls::ServerConfig;

use crate::config::TlsPem;
use crate::error::Result;

/// The configs a worker's TLS sessions begin with: one per kind of listener (they say
/// different ALPN names).
pub(super) struct Tls {
    frames: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
}

impl Tls {
    pub(super) fn new(pem: &TlsPem) -> Result<Tls> {
        let tickets = Some(&pem.ticket_key);
        let config = |alpn| server_config_with(&pem.cert, &pem.key, alpn, tickets);
        Ok(Tls {
            frames: config(&[ALPN_FRAMES])?,
            http: config(&[ALPN_HTTP])?,
        })
    }

    /// A session for a connection of a listener speaking HTTP (or binary frames).
    pub(super) fn session(&self, http: bool) -> Box<Session> {
        let config = if http { &self.http } else { &self.frames };
        let tls = UnbufferedServerConnection::new(config.clone())
            .expect("a server session of a valid config");
        Box::new(Session {
            tls: ServerSession::new(tls),
            admitting: true,
        })
    }
}

/// One connection's TLS: the session, and whether its handshake still counts as under
/// way.
pub(super) struct Session {
    tls: ServerSession,
    /// Counted among the worker's handshakes under way (`accept.rs`): from the accept to
    /// the handshake's end or the connection's, whichever comes first.
    admitting: bool,
}

impl Session {
    pub(super) fn is_handshaking(&self) -> bool {
        self.tls.is_handshaking()
    }

    /// Whether the handshake is still counted as under way.
    pub(super) fn admitting(&self) -> bool {
        self.admitting
    }

    /// The handshake is no longer under way (done, or its connection closed): true the
    /// one time it stops counting.
    pub(super) fn admitted(&mut self) -> bool {
        std::mem::take(&mut self.admitting)
    }

    /// Whether a done handshake resumed a session (a ticket) rather than made one.
    pub(super) fn resumed(&self) -> bool {
        self.tls.resumed()
    }

    #[cfg(test)]
    fn alpn_protocol(&self) -> Option<&[u8]> {
        self.tls.alpn_protocol()
    }
}

/// Feeds `cipher` (bytes read from the socket) to `session`: appends what it decrypts to
/// `plain` and what it has to send (handshake, tickets, alerts, and what waited for the
/// handshake) to `out`. An error is the peer's (not TLS, a bad record): `out` then holds
/// the alert to send before closing.
pub(super) fn open(
    session: &mut Session,
    cipher: &mut [u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<Opened, rustls::Error> {
    // Decrypted where they were read (the worker's read buffer): no copy a read.
    session.tls.open_in_place(cipher, plain, out)
}

/// Encrypts `plain` for `session`, appending the records to `out`; before the handshake
/// is done, keeps it to send once it is.
pub(super) fn seal(session: &mut Session, plain: &[u8], out: &mut Vec<u8>) {
    session.tls.seal(plain, out)
}

/// The goodbye of a TLS session (close_notify), appended to `out`: none before the
/// handshake is done (the connection just closes).
pub(super) fn close(session: &mut Session, out: &mut Vec<u8>) {
    session.tls.close(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hongbao_http::tls::{client_config, DevCerts};
    use rustls::ClientConnection;
    use std::io::{Read, Write};

    /// A worker's session (an HTTP listener's or not) and a client offering `alpn`, with
    /// a throwaway certificate the client trusts; nothing sent yet.
    fn joined(http: bool, alpn: &[u8]) -> (Box<Session>, ClientConnection) {
        let certs = DevCerts::make(&["127.0.0.1"]).unwrap();
        let pem = TlsPem {
            cert: certs.cert_pem.clone().into_bytes(),
            key: certs.key_pem.clone().into_bytes(),
            ticket_key: hongbao_http::tls::new_ticket_key(),
        };
        let server = Tls::new(&pem).unwrap().session(http);
        let config = client_config(certs.ca_pem.as_bytes(), &[alpn]).unwrap();
        let client = ClientConnection::new(config, "127.0.0.1".try_into().unwrap()).unwrap();
        (server, client)
    }

    /// A client and a worker's session, joined by `open` and `seal` alone: the
    /// handshake, data both ways, a plain client refused.
    #[test]
    fn a_session_opens_and_seals_through_the_worker_functions() {
        let (mut server, mut client) = joined(false, ALPN_FRAMES);
        let (mut to_server, mut plain, mut to_client) = (Vec::new(), Vec::new(), Vec::new());
        client.writer().write_all(b"shake").unwrap();
        // Round trips until the handshake is done and the data is through.
        for _ in 0..5 {
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            let opened = open(&mut server, &mut to_server, &mut plain, &mut to_client).unwrap();
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
        let (mut server, _) = joined(false, ALPN_FRAMES);
        let frame = [0, 0, 0, 6, 2, 2, 0, 0, 0, 1];
        let (mut plain, mut alert) = (Vec::new(), Vec::new());
        assert!(open(&mut server, &mut frame.clone(), &mut plain, &mut alert).is_err());
        assert!(plain.is_empty());
        assert!(!alert.is_empty(), "an alert goes back");
    }

    /// Bytes that come a few at a time (records and handshake messages cut anywhere)
    /// are held until whole; what is sealed before the handshake is done goes once it
    /// is; an idle session holds nothing of its own.
    #[test]
    fn cut_records_are_held_and_early_writes_wait_for_the_handshake() {
        let (mut server, mut client) = joined(true, ALPN_HTTP);
        let mut early = Vec::new();
        seal(&mut server, b"hello before the handshake", &mut early);
        assert!(early.is_empty(), "nothing can be encrypted yet");
        client.writer().write_all(&[7u8; 20000]).unwrap(); // two records
        let (mut plain, mut heard) = (Vec::new(), Vec::new());
        for _ in 0..6 {
            let mut to_server = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut to_server).unwrap();
            }
            let mut to_client = Vec::new();
            for piece in to_server.chunks(7) {
                open(&mut server, &mut piece.to_vec(), &mut plain, &mut to_client).unwrap();
            }
            let mut rd = &to_client[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
                client.process_new_packets().unwrap();
            }
            let _ = client.reader().read_to_end(&mut heard);
        }
        assert_eq!(plain, vec![7u8; 20000]);
        assert_eq!(heard, b"hello before the handshake");
        assert!(!server.is_handshaking());
        assert!(server.tls.holds_nothing());
    }
}
