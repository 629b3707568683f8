//! A load client's sending side: frames encoded for the run's transport, sealed over
//! TLS, written at once or kept until the socket is writable again (and a user whose
//! server stops reading dropped).

use hongbao_proto::Frame;
use hongbao_sys::clock::UnixTime;
use hongbao_sys::net::write_nonblocking;

use super::{Client, State};
use crate::transport;

/// A user's unsent output past this means the server is not reading: drop and reconnect.
const MAX_OUTPUT: usize = 64 * 1024;

impl Client {
    pub(super) fn send(&mut self, i: usize, frame: &Frame, now: UnixTime) {
        let mut bytes = Vec::with_capacity(64);
        transport::encode(self.opts.transport, frame, &mut bytes);
        self.write(i, &bytes, now);
    }

    /// Writes `bytes` to user `i`'s connection at `now`: sealed first over TLS (before
    /// the handshake is done, kept by the session until it is).
    pub(super) fn write(&mut self, i: usize, bytes: &[u8], now: UnixTime) {
        if let Some(session) = self.users[i].tls.as_mut() {
            let mut sealed = Vec::with_capacity(bytes.len() + 64);
            session.seal(bytes, &mut sealed);
            if !sealed.is_empty() {
                self.write_raw(i, &sealed, now);
            }
            return;
        }
        self.write_raw(i, bytes, now);
    }

    pub(super) fn write_raw(&mut self, i: usize, bytes: &[u8], now: UnixTime) {
        let user = &mut self.users[i];
        let Some(stream) = user.stream.as_mut() else {
            return;
        };
        let mut written = 0;
        if user.out.is_empty() {
            match write_nonblocking(stream, bytes) {
                Ok(n) => written = n,
                Err(_) => return self.lost(i, now),
            }
        }
        if written < bytes.len() {
            user.out.extend_from_slice(&bytes[written..]);
            if user.out.len() > MAX_OUTPUT {
                self.lost(i, now);
            }
        }
    }

    pub(super) fn on_writable(&mut self, i: usize, now: UnixTime) {
        let user = &mut self.users[i];
        if user.state == State::Connecting {
            let stream = user.stream.as_ref().expect("connecting has a stream");
            match stream.take_error() {
                Ok(None) if stream.peer_addr().is_ok() && self.tls.is_some() => {
                    self.start_tls(i, now);
                }
                Ok(None) if stream.peer_addr().is_ok() => self.tls_established(i, now),
                Ok(None) => {} // spurious wake-up: not connected yet
                Ok(Some(e)) | Err(e) => self.connect_failed(i, &e, now),
            }
            return;
        }
        let Some(stream) = user.stream.as_mut() else {
            return;
        };
        let Ok(written) = write_nonblocking(stream, &user.out) else {
            return self.lost(i, now);
        };
        user.out.drain(..written);
        if user.out.is_empty() {
            user.out = Vec::new();
        }
    }
}
