//! TLS on the client listeners (binary frames, WebSocket, the HTTP API): a layer under
//! the codecs, nothing above it knows. A connection of a TLS listener carries a rustls
//! session; what is read goes through it (`open`) before the codec sees it, and what is
//! written goes through it (`seal`) before the socket does — everything a connection is
//! sent passes `Worker::write`, the one place that seals.
//!
//! The session is rustls's unbuffered one: rustls keeps no buffers of a connection's
//! (a buffered session keeps a 4 KiB receive buffer for life); what it has to send is
//! taken out at once and goes the way every write goes (the connection's queue, the
//! slow-reader limit). Between reads a session keeps only the bytes of a record not yet
//! whole, and, before its handshake is done, what it was given to send: both empty, and
//! so nothing on the heap, for an idle connection.
//!
//! A client that does not speak TLS (or not a version or name we take) fails its
//! handshake: it is sent rustls's alert and closed, and counted (`tls_refused`). New
//! certificates (a reload) apply to the connections that come after; those open keep the
//! config they began with.

use std::sync::Arc;

use hongbao_http::tls::{server_config_with, ALPN_FRAMES, ALPN_HTTP};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, WriteTraffic};
use rustls::ServerConfig;

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
    pub(super) fn session(&self, http: bool) -> Box<Session> {
        let config = if http { &self.http } else { &self.frames };
        Box::new(Session {
            tls: UnbufferedServerConnection::new(config.clone())
                .expect("a server session of a valid config"),
            held: Vec::new(),
            waiting: Vec::new(),
        })
    }
}

/// One connection's TLS: rustls's state, and the two things it cannot hand on at once.
pub(super) struct Session {
    tls: UnbufferedServerConnection,
    /// Bytes read that are not a whole record yet (or a whole handshake message), kept
    /// for the next read.
    held: Vec<u8>,
    /// Plaintext to send that came before the handshake let us encrypt it.
    waiting: Vec<u8>,
}

impl Session {
    pub(super) fn is_handshaking(&self) -> bool {
        self.tls.is_handshaking()
    }

    #[cfg(test)]
    fn alpn_protocol(&self) -> Option<&[u8]> {
        self.tls.alpn_protocol()
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

/// Feeds `cipher` (bytes read from the socket) to `session`: appends what it decrypts to
/// `plain` and what it has to send (handshake, tickets, alerts, and what waited for the
/// handshake) to `out`. An error is the peer's (not TLS, a bad record): `out` then holds
/// the alert to send before closing.
pub(super) fn open(
    session: &mut Session,
    cipher: &[u8],
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<Opened, rustls::Error> {
    let Session { tls, held, waiting } = session;
    let mut data = std::mem::take(held);
    data.extend_from_slice(cipher);
    let mut at = 0;
    let mut closed = false;
    let result = loop {
        let status = tls.process_tls_records(&mut data[at..]);
        let discard = status.discard;
        let state = match status.state {
            Ok(state) => state,
            Err(e) => break Err(e),
        };
        let more = match state {
            ConnectionState::ReadTraffic(mut records) => {
                let mut failed = None;
                while let Some(record) = records.next_record() {
                    match record {
                        Ok(record) => plain.extend_from_slice(record.payload),
                        Err(e) => failed = Some(e),
                    }
                }
                if let Some(e) = failed {
                    break Err(e);
                }
                true
            }
            ConnectionState::EncodeTlsData(mut record) => {
                encode(HANDSHAKE_ROOM, |buf| record.encode(buf), out);
                true
            }
            ConnectionState::TransmitTlsData(mut sent) => {
                // What waited may go with the handshake's last flight.
                if let Some(mut traffic) = sent.may_encrypt_app_data() {
                    encrypt(&mut traffic, waiting, out);
                }
                sent.done();
                true
            }
            ConnectionState::WriteTraffic(mut traffic) => {
                encrypt(&mut traffic, waiting, out);
                false
            }
            ConnectionState::PeerClosed => {
                closed = true;
                true
            }
            ConnectionState::Closed => {
                closed = true;
                false
            }
            // BlockedHandshake (more bytes needed) and early data, which we do not take.
            _ => false,
        };
        at += discard;
        if !more {
            break Ok(());
        }
    };
    if let Err(e) = result {
        alerts(tls, out);
        return Err(e);
    }
    if at < data.len() {
        data.drain(..at);
        data.shrink_to_fit();
        *held = data;
    }
    Ok(if closed {
        Opened::PeerClosed
    } else {
        Opened::Data
    })
}

/// Encrypts `plain` for `session`, appending the records to `out`; before the handshake
/// is done, keeps it to send once it is.
pub(super) fn seal(session: &mut Session, plain: &[u8], out: &mut Vec<u8>) {
    let Session { tls, waiting, .. } = session;
    if !waiting.is_empty() {
        waiting.extend_from_slice(plain);
        return;
    }
    loop {
        let status = tls.process_tls_records(&mut []);
        match status.state {
            Ok(ConnectionState::EncodeTlsData(mut record)) => {
                encode(HANDSHAKE_ROOM, |buf| record.encode(buf), out)
            }
            Ok(ConnectionState::TransmitTlsData(sent)) => sent.done(),
            Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                return encode(
                    sealed_len(plain),
                    |buf| traffic.encrypt(plain, buf).map_err(room),
                    out,
                );
            }
            Ok(ConnectionState::BlockedHandshake) => return waiting.extend_from_slice(plain),
            // Closed, or failed: nothing more is sent.
            _ => return,
        }
    }
}

/// The goodbye of a TLS session (close_notify), appended to `out`: none before the
/// handshake is done (the connection just closes).
pub(super) fn close(session: &mut Session, out: &mut Vec<u8>) {
    loop {
        let status = session.tls.process_tls_records(&mut []);
        match status.state {
            Ok(ConnectionState::EncodeTlsData(mut record)) => {
                encode(HANDSHAKE_ROOM, |buf| record.encode(buf), out)
            }
            Ok(ConnectionState::TransmitTlsData(sent)) => sent.done(),
            Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                return encode(64, |buf| traffic.queue_close_notify(buf).map_err(room), out);
            }
            _ => return,
        }
    }
}

/// Takes out what rustls has to send after an error: its alert.
fn alerts(tls: &mut UnbufferedServerConnection, out: &mut Vec<u8>) {
    while let Ok(ConnectionState::EncodeTlsData(mut record)) =
        tls.process_tls_records(&mut []).state
    {
        encode(HANDSHAKE_ROOM, |buf| record.encode(buf), out);
    }
}

/// Encrypts and empties `plain` into `out`.
fn encrypt(
    traffic: &mut WriteTraffic<'_, ServerConnectionData>,
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    if plain.is_empty() {
        return;
    }
    encode(
        sealed_len(plain),
        |buf| traffic.encrypt(plain, buf).map_err(room),
        out,
    );
    *plain = Vec::new();
}

/// What encrypting `plain` takes: a record header, the content type and the AEAD tag
/// (TLS 1.3; 1.2's explicit nonce fits too) for each record of at most 16 KiB.
fn sealed_len(plain: &[u8]) -> usize {
    plain.len() + (plain.len() / 16384 + 1) * 40
}

/// The room first given to a handshake record (rustls asks for more when it needs it).
const HANDSHAKE_ROOM: usize = 2048;

/// How much room an encryption wanted (none: it cannot be done at all).
fn room(e: EncryptError) -> EncodeError {
    match e {
        EncryptError::InsufficientSize(size) => EncodeError::InsufficientSize(size),
        EncryptError::EncryptExhausted => EncodeError::AlreadyEncoded,
    }
}

/// Runs `write` (rustls writing into a buffer it is given) on the end of `out`, with
/// `room` bytes or as many as it asks for.
fn encode(
    mut room: usize,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    loop {
        out.resize(start + room, 0);
        match write(&mut out[start..]) {
            Ok(n) => return out.truncate(start + n),
            Err(EncodeError::InsufficientSize(size)) => room = size.required_size,
            Err(EncodeError::AlreadyEncoded) => return out.truncate(start),
        }
    }
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
        let (mut server, _) = joined(false, ALPN_FRAMES);
        let frame = [0, 0, 0, 6, 2, 2, 0, 0, 0, 1];
        let (mut plain, mut alert) = (Vec::new(), Vec::new());
        assert!(open(&mut server, &frame, &mut plain, &mut alert).is_err());
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
                open(&mut server, piece, &mut plain, &mut to_client).unwrap();
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
        assert!(server.held.is_empty() && server.held.capacity() == 0);
        assert!(server.waiting.is_empty() && server.waiting.capacity() == 0);
    }
}
