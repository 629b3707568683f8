//! What the users ask the server, and when: the shakes the schedule fires (timed from
//! their intended send time), the opens after a notice, and an HTTP user's notice polls,
//! spread over each second.

use hongbao_proto::{Frame, Message};
use hongbao_sys::clock::UnixTime;

use super::{micros_since, Client, Inflight, Kind, State};
use crate::schedule::Firing;
use crate::transport::{self, HttpConnection, Transport};

impl Client {
    /// Sends the shake of firing `f`, meant to go out at `intended`, at `now`, recording
    /// how late it went out.
    pub(super) fn fire(&mut self, f: Firing, intended: UnixTime, now: UnixTime) {
        let i = (f.user_index - self.first_index) as usize;
        if self.on_demand() {
            if self.users[i].stream.is_some() {
                self.counters.skipped_busy += 1;
                return;
            }
        } else if self.users[i].state != State::Ready {
            self.counters.skipped_not_ready += 1;
            return;
        }
        if self.users[i].since.time() > intended {
            self.counters.backed_off += 1;
            return;
        }
        self.counters.shakes_sent += 1;
        let _ = self.lag_hist.record(micros_since(now, intended));
        self.request(i, Kind::Shake, intended, 0, now);
    }

    /// Asks the server something for user `i` at `now`, timed from `intended`. Over HTTP
    /// with a connection per request, the ask waits for the connection it opens (begun,
    /// for its timeout, when the ask was meant to go out).
    pub(super) fn request(
        &mut self,
        i: usize,
        kind: Kind,
        intended: UnixTime,
        packet: u64,
        now: UnixTime,
    ) {
        let user = &mut self.users[i];
        let request_id = user.next_request;
        user.next_request = user.next_request.wrapping_add(1).max(1);
        user.inflight.push(Inflight {
            request_id,
            kind,
            intended,
            packet,
        });
        if self.opts.transport != Transport::Http {
            let message = match kind {
                Kind::Shake => Message::Shake,
                Kind::Open => Message::Open { packet_id: packet },
                Kind::Poll => unreachable!("only HTTP users look for notices"),
            };
            return self.send(
                i,
                &Frame {
                    request_id,
                    message,
                },
                now,
            );
        }
        // With a connection per request, a connection carries one ask; the others wait
        // for the next connection (`done_asking`).
        match self.users[i].state {
            State::Ready if !self.on_demand() => self.send_http(i, kind, packet, now),
            State::Idle if self.on_demand() => self.connect(i, intended),
            _ => {}
        }
    }

    /// The HTTP request for an ask, with the user's bearer token.
    pub(super) fn send_http(&mut self, i: usize, kind: Kind, packet: u64, now: UnixTime) {
        let user_id = self.user_id(i);
        let bearer = self.bearer(user_id, now);
        let ask = match kind {
            Kind::Shake => transport::HttpAsk::Shake,
            Kind::Open => transport::HttpAsk::Open(packet),
            Kind::Poll => transport::HttpAsk::Notices,
        };
        let mut bytes = Vec::with_capacity(384);
        let server_closes = self.opts.http_connection == HttpConnection::Close;
        match (&self.opts.request, ask) {
            (Some(template), transport::HttpAsk::Shake) => {
                template.write(user_id, &bearer, server_closes, &mut bytes)
            }
            _ => transport::http_request(ask, &bearer, server_closes, &mut bytes),
        }
        self.write(i, &bytes, now);
    }

    /// The notice polls of `second` (see [`spread_polls`]); none but over HTTP.
    pub(super) fn load_polls(&self, second: u64, out: &mut Vec<(u64, usize)>) {
        out.clear();
        // A user's own requests have no notices to look for.
        if self.opts.transport == Transport::Http && self.opts.request.is_none() {
            let every = self.opts.notice_poll_secs as u64;
            spread_polls(self.first_index, self.users.len(), every, second, out);
        }
    }

    /// User `i` looks for packets to open, if it is free to ask.
    pub(super) fn poll_notices(&mut self, i: usize, now: UnixTime) {
        // With a connection per request a busy user's poll waits for its next connection
        // (as an open after a notice does) rather than being skipped: a user's polls and
        // shakes fall at the same offsets every second, so a skipped poll would be skipped
        // every time and the user would never see its packets.
        let user = &self.users[i];
        let ready = if self.on_demand() {
            !user.inflight.iter().any(|f| f.kind == Kind::Poll)
        } else {
            user.state == State::Ready
        };
        if ready {
            self.counters.notice_polls += 1;
            self.request(i, Kind::Poll, now, 0, now);
        }
    }
}

/// The notice polls of `second` for the `users` users from `first_index`, each polling
/// every `every` seconds (0: never), as (offset µs into the second, user index), spread
/// evenly over the second. (All at the top of the second, a few hundred requests at once
/// queue behind each other and hold up the shakes fired with them.)
fn spread_polls(
    first_index: u64,
    users: usize,
    every: u64,
    second: u64,
    out: &mut Vec<(u64, usize)>,
) {
    out.clear();
    if every == 0 {
        return;
    }
    let due = (0..users).filter(|&i| (first_index + i as u64 + second).is_multiple_of(every));
    out.extend(due.map(|i| (0, i)));
    let n = out.len() as u64;
    for (k, poll) in out.iter_mut().enumerate() {
        poll.0 = k as u64 * 1_000_000 / n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_user_polls_once_per_period_spread_over_the_second() {
        let mut polls = Vec::new();
        let mut seen = vec![0; 1000];
        for second in 0..5 {
            spread_polls(7, 1000, 5, second, &mut polls);
            assert_eq!(polls.len(), 200);
            assert!(
                polls.windows(2).all(|w| w[1].0 - w[0].0 == 5_000),
                "{polls:?}"
            );
            assert_eq!(polls[0].0, 0);
            polls.iter().for_each(|&(_, i)| seen[i] += 1);
        }
        assert!(
            seen.iter().all(|&n| n == 1),
            "each user once in five seconds"
        );
        spread_polls(7, 1000, 0, 3, &mut polls);
        assert!(polls.is_empty());
    }
}
