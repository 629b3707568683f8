//! From connected to ready: the TLS handshake, the WebSocket upgrade, the login with a
//! freshly minted token (and the refresh the server asks for), and an HTTP user's bearer
//! token, kept for half its life.

use hongbao_proto::tls::session::ClientSession;
use hongbao_proto::{Frame, Message};
use hongbao_sys::clock::UnixTime;

use super::{Client, Kind, State, UnixMs};
use crate::transport::{self, Transport};

impl Client {
    /// Connected (over TLS: the handshake done): the protocol begins — for WebSocket its
    /// upgrade, for the others the login.
    pub(super) fn tls_established(&mut self, i: usize, now: UnixTime) {
        match self.opts.transport {
            Transport::Tcp | Transport::Http => self.established(i, now),
            Transport::Ws => {
                // `since` stays: the connect timeout covers the upgrade too.
                self.users[i].state = State::Upgrading;
                let key: [u8; 16] = rand::random();
                self.handshakes.insert(i as u32, key);
                let request = transport::upgrade_request(self.opts.server, &key);
                self.write(i, &request, now);
            }
        }
    }

    /// Connected: the TLS handshake begins (the connect timeout covers it too).
    pub(super) fn start_tls(&mut self, i: usize, now: UnixTime) {
        let config = self.tls.clone().expect("a TLS run");
        let name = rustls::pki_types::ServerName::IpAddress(self.opts.server.ip().into());
        let Ok(session) = rustls::client::UnbufferedClientConnection::new(config, name) else {
            return self.handshake_failed(i, now);
        };
        let user = &mut self.users[i];
        user.state = State::Handshaking;
        user.tls = Some(Box::new(ClientSession::new(session)));
        // Its ClientHello, sealed from nothing.
        self.write(i, &[], now);
    }

    /// The connection is ready for the protocol (TCP connected, or WebSocket upgraded):
    /// count it and log in. An HTTP user needs no login: each request carries its token,
    /// and what it asked before the connection was up goes out now.
    pub(super) fn established(&mut self, i: usize, now: UnixTime) {
        self.counters.connects += 1;
        self.connected += 1;
        if self.opts.transport == Transport::Http {
            self.users[i].state = State::Ready;
            // With a connection per request: when it opened, for the answer's timeout.
            self.users[i].since = if self.on_demand() {
                UnixMs::of(now)
            } else {
                UnixMs::default()
            };
            if !self.on_demand() {
                self.users[i].attempt = 0;
                self.logged_in += 1;
                self.counters.logins += 1;
            }
            let take = if self.on_demand() { 1 } else { usize::MAX };
            let waiting: Vec<(Kind, u64)> = self.users[i]
                .inflight
                .iter()
                .take(take)
                .map(|f| (f.kind, f.packet))
                .collect();
            for (kind, packet) in waiting {
                self.send_http(i, kind, packet, now);
            }
            return;
        }
        let user = &mut self.users[i];
        user.state = State::LoggingIn;
        user.since = UnixMs::of(now);
        self.log_in(i, now);
    }

    /// Sends user `i` a login with a fresh token: its first, or a refresh the server
    /// asked for (on the same connection).
    pub(super) fn log_in(&mut self, i: usize, now: UnixTime) {
        let user_id = self.user_id(i);
        let token = self.mint(user_id, now);
        let login = Message::Login {
            user_id,
            token: token.into_bytes(),
        };
        self.send(
            i,
            &Frame {
                request_id: 0,
                message: login,
            },
            now,
        );
    }

    /// A token for `user_id`, issued in `now`'s Unix second.
    fn mint(&self, user_id: u64, now: UnixTime) -> String {
        self.minter
            .mint_for(user_id, now.second(), self.opts.signer.ttl_secs)
    }

    /// HTTP: the user's bearer token, made again once half its life is gone.
    pub(super) fn bearer(&mut self, user_id: u64, now: UnixTime) -> String {
        let ttl = self.opts.signer.ttl_secs;
        if let Some((token, made)) = self.token_cache.get(&user_id) {
            if now.second() < made + ttl / 2 {
                return token.clone();
            }
        }
        let token = self.mint(user_id, now);
        self.token_cache
            .insert(user_id, (token.clone(), now.second()));
        token
    }
}
