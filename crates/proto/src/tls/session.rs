//! A TLS session with no buffers of its own between reads: rustls's unbuffered API, for
//! both ends — the gateway's server sessions and the load's client sessions, a million
//! of them at a time. What is read goes through `open` before the protocol sees it;
//! what is written goes through `seal` before the socket does. A session keeps only the
//! bytes of a record not yet whole and, before its handshake is done, what it was given
//! to send: both empty, and so nothing on the heap, for an idle connection (a buffered
//! rustls session keeps a 4 KiB receive buffer for life: 8,979 B a connection in the
//! load, 6,552 B in the gateway, docs/benchmarks/diary.md).
//!
//! No I/O here: the caller reads and writes the socket.

use std::ops::DerefMut;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, UnbufferedConnectionCommon, UnbufferedStatus,
};
use rustls::HandshakeKind;

/// Either end of an unbuffered rustls connection.
pub trait Unbuffered: DerefMut<Target = UnbufferedConnectionCommon<Self::Data>> {
    type Data;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
}

impl Unbuffered for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
    }
}

impl Unbuffered for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }
}

/// One connection's TLS: rustls's state, and the two things it cannot hand on at once.
pub struct Session<C> {
    tls: C,
    /// Bytes read that are not a whole record yet (or a whole handshake message), kept
    /// for the next read.
    held: Vec<u8>,
    /// Plaintext to send that came before the handshake let us encrypt it.
    waiting: Vec<u8>,
}

/// A server's session.
pub type ServerSession = Session<UnbufferedServerConnection>;
/// A client's session.
pub type ClientSession = Session<UnbufferedClientConnection>;

/// What came of bytes read.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Their plaintext (if any) is in `plain`.
    Data,
    /// The peer said goodbye (close_notify): nothing more comes.
    PeerClosed,
}

impl<C: Unbuffered> Session<C> {
    pub fn new(tls: C) -> Session<C> {
        Session {
            tls,
            held: Vec::new(),
            waiting: Vec::new(),
        }
    }

    pub fn is_handshaking(&self) -> bool {
        self.tls.is_handshaking()
    }

    /// Whether a done handshake resumed a session (a ticket) rather than made one.
    pub fn resumed(&self) -> bool {
        self.tls.handshake_kind() == Some(HandshakeKind::Resumed)
    }

    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.tls.alpn_protocol()
    }

    /// The cipher suite agreed on, once the handshake has chosen it.
    pub fn cipher_suite(&self) -> Option<rustls::CipherSuite> {
        self.tls.negotiated_cipher_suite().map(|s| s.suite())
    }

    /// Whether it holds nothing on the heap of its own (an idle session's state).
    pub fn holds_nothing(&self) -> bool {
        self.held.capacity() == 0 && self.waiting.capacity() == 0
    }

    /// Feeds `cipher` (bytes read from the socket): appends what it decrypts to `plain`
    /// and what it has to send (handshake, tickets, alerts, and what waited for the
    /// handshake) to `out`. An error is the peer's (not TLS, a bad record): `out` then
    /// holds the alert to send before closing.
    pub fn open(
        &mut self,
        cipher: &[u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Opened, rustls::Error> {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(cipher);
        self.open_slice(&mut data, plain, out)
    }

    /// `open` of bytes the caller lets it decrypt where they lie (its read buffer): no
    /// copy, unless a record cut by an earlier read is held (then they join it).
    pub fn open_in_place(
        &mut self,
        cipher: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Opened, rustls::Error> {
        if !self.held.is_empty() {
            return self.open(cipher, plain, out);
        }
        self.open_slice(cipher, plain, out)
    }

    /// Decrypts `data` in place: what is left of it (a record not yet whole) is held.
    fn open_slice(
        &mut self,
        data: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Opened, rustls::Error> {
        let Session { tls, held, waiting } = self;
        let mut at = 0;
        let mut closed = false;
        let result = loop {
            let status = tls.process(&mut data[at..]);
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
                        encrypt(|p, b| traffic.encrypt(p, b), waiting, out);
                    }
                    sent.done();
                    true
                }
                ConnectionState::WriteTraffic(mut traffic) => {
                    encrypt(|p, b| traffic.encrypt(p, b), waiting, out);
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
                // BlockedHandshake (more bytes needed) and early data, which we do not
                // take.
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
            *held = data[at..].to_vec();
        }
        Ok(if closed {
            Opened::PeerClosed
        } else {
            Opened::Data
        })
    }

    /// Encrypts `plain`, appending the records to `out`; before the handshake is done,
    /// keeps it to send once it is. A client's first call (with nothing) writes its
    /// ClientHello.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        let Session { tls, waiting, .. } = self;
        if !waiting.is_empty() {
            waiting.extend_from_slice(plain);
            return;
        }
        loop {
            let status = tls.process(&mut []);
            match status.state {
                Ok(ConnectionState::EncodeTlsData(mut record)) => {
                    encode(HANDSHAKE_ROOM, |buf| record.encode(buf), out)
                }
                Ok(ConnectionState::TransmitTlsData(sent)) => sent.done(),
                Ok(ConnectionState::WriteTraffic(mut traffic)) => {
                    if plain.is_empty() {
                        return;
                    }
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

    /// The goodbye of a session (close_notify), appended to `out`: none before the
    /// handshake is done (the connection just closes).
    pub fn close(&mut self, out: &mut Vec<u8>) {
        loop {
            let status = self.tls.process(&mut []);
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
}

/// Takes out what rustls has to send after an error: its alert.
fn alerts<C: Unbuffered>(tls: &mut C, out: &mut Vec<u8>) {
    while let Ok(ConnectionState::EncodeTlsData(mut record)) = tls.process(&mut []).state {
        encode(HANDSHAKE_ROOM, |buf| record.encode(buf), out);
    }
}

/// Encrypts and empties `plain` into `out` with `encrypt` (a `WriteTraffic`'s).
fn encrypt(
    mut encrypt: impl FnMut(&[u8], &mut [u8]) -> Result<usize, EncryptError>,
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    if plain.is_empty() {
        return;
    }
    encode(
        sealed_len(plain),
        |buf| encrypt(plain, buf).map_err(room),
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

    /// A client session and a server session joined by `open` and `seal` alone, both
    /// unbuffered: the handshake, data both ways, goodbye; neither holds a buffer once
    /// idle.
    #[test]
    fn two_unbuffered_ends_handshake_and_talk() {
        let certs = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let cert_pem = certs.cert.pem();
        let key_der =
            rustls::pki_types::PrivateKeyDer::Pkcs8(certs.signing_key.serialize_der().into());
        let server_config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certs.cert.der().clone()], key_der)
            .unwrap();
        let client_config =
            crate::tls::client_config(cert_pem.as_bytes(), &[crate::tls::ALPN_FRAMES]).unwrap();
        let mut server: ServerSession =
            Session::new(UnbufferedServerConnection::new(server_config.into()).unwrap());
        let name = "127.0.0.1".try_into().unwrap();
        let mut client: ClientSession =
            Session::new(UnbufferedClientConnection::new(client_config, name).unwrap());
        let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
        client.seal(b"login", &mut to_server); // the ClientHello; the data waits
        let (mut at_server, mut at_client) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            // Cut anywhere: records and handshake messages are held until whole.
            for piece in std::mem::take(&mut to_server).chunks(5) {
                server.open(piece, &mut at_server, &mut to_client).unwrap();
            }
            for piece in std::mem::take(&mut to_client).chunks(5) {
                client.open(piece, &mut at_client, &mut to_server).unwrap();
            }
        }
        assert_eq!(at_server, b"login");
        assert!(!server.is_handshaking() && !client.is_handshaking());
        // Hashed with SHA-256, which the CPU does in hardware (`provider`).
        assert_eq!(
            server.cipher_suite(),
            Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
        );
        server.seal(b"ok", &mut to_client);
        client
            .open(&to_client, &mut at_client, &mut to_server)
            .unwrap();
        assert_eq!(at_client, b"ok");
        assert!(server.holds_nothing() && client.holds_nothing());
        let mut bye = Vec::new();
        client.close(&mut bye);
        assert_eq!(
            server.open(&bye, &mut Vec::new(), &mut Vec::new()),
            Ok(Opened::PeerClosed)
        );
    }
}
