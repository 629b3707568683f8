//! Presence: which connection each logged-in user is on, beside the money side rather
//! than inside it. It answers logins (taking the route, kicking the connection it
//! replaces), routes chat, and delivers notices the money side emits for a user to
//! wherever that user is now. Plain code: it says what to deliver, the supervisor writes
//! it to the workers' links.

use std::collections::HashMap;

use crate::seam::{OpKind, Origin, ReplyCounts};
use crate::{ConnId, Notice, Push, Reply, UserId, WorkerId};
use hongbao_proto::{KickReason, ResultCode};

/// Where a user is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub worker: WorkerId,
    pub conn: ConnId,
}

/// A user's route, and when its session's token was issued (Unix seconds, good to 2106).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Routed {
    route: Route,
    issued: u32,
}

fn secs(issued: u64) -> u32 {
    issued.min(u64::from(u32::MAX)) as u32
}

/// Something for one connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    Reply {
        to: Route,
        request: u32,
        reply: Reply,
    },
    /// `close`: the connection is closed after it (a kick).
    Push { to: Route, push: Push, close: bool },
}

#[derive(Debug, Clone, Default)]
pub struct PresenceCounters {
    pub logins: u64,
    pub kicks_replaced: u64,
    /// Logins refused here by a revocation the worker had not heard of yet.
    pub logins_revoked: u64,
    /// Connections kicked by a revocation.
    pub kicks_revoked: u64,
    /// Notices delivered to a connection.
    pub notices: u64,
    /// Chat replies by result.
    pub chat: ReplyCounts,
}

#[derive(Default)]
pub struct Presence {
    /// Each online user's route, and when its session's token was issued (its latest
    /// refresh's, Unix seconds): one map, 24 bytes an entry, a million of them.
    routes: HashMap<UserId, Routed>,
    /// Tokens of these users issued before (Unix seconds) are refused.
    revoked: HashMap<UserId, u64>,
    pub counters: PresenceCounters,
}

impl Presence {
    /// A worker checked the user's token (issued at `issued`, Unix seconds) on
    /// `origin`'s connection: take the route and answer the login; an older connection
    /// of the same user is kicked. Answering here, not in the worker, orders logins as
    /// clients see them: of two, the one answered first is the one replaced. A token a
    /// revocation refuses (one the worker had not heard of yet) is refused, and its
    /// connection kicked (the deliveries of that are the error).
    pub fn login(&mut self, origin: Origin, issued: u64) -> Result<Vec<Delivery>, Vec<Delivery>> {
        let route = Route {
            worker: origin.worker,
            conn: origin.conn,
        };
        if self.is_revoked(origin.user, issued) {
            self.counters.logins_revoked += 1;
            return Err(vec![
                Delivery::Reply {
                    to: route,
                    request: origin.request,
                    reply: Reply::Login {
                        result: ResultCode::BadToken,
                        user_id: origin.user.get(),
                    },
                },
                revoked(route),
            ]);
        }
        self.counters.logins += 1;
        let mut out = vec![Delivery::Reply {
            to: route,
            request: origin.request,
            reply: Reply::Login {
                result: ResultCode::Ok,
                user_id: origin.user.get(),
            },
        }];
        let routed = Routed {
            route,
            issued: secs(issued),
        };
        if let Some(Routed { route: old, .. }) = self.routes.insert(origin.user, routed) {
            if old != route {
                self.counters.kicks_replaced += 1;
                out.push(Delivery::Push {
                    to: old,
                    push: Push::Kick {
                        reason: KickReason::Replaced,
                        text: "logged in elsewhere".into(),
                        retry_after_ms: 0,
                    },
                    close: true,
                });
            }
        }
        Ok(out)
    }

    fn is_revoked(&self, user: UserId, issued: u64) -> bool {
        self.revoked.get(&user).is_some_and(|&at| issued < at)
    }

    /// The session on `conn` of `worker` took a fresh token, issued at `issued`.
    pub fn refreshed(&mut self, worker: WorkerId, conn: ConnId, user: UserId, issued: u64) {
        if let Some(routed) = self.routes.get_mut(&user) {
            if routed.route == (Route { worker, conn }) {
                routed.issued = secs(issued);
            }
        }
    }

    /// Tokens of `user` issued before `at` (Unix seconds) are refused from now on; its
    /// connection here is kicked if its token is one of them (and its route gone: the
    /// user is offline). The same revocation heard again kicks nothing new: a session
    /// begun since with a fresh token stays.
    pub fn revoke(&mut self, user: UserId, at: u64) -> Option<Delivery> {
        let entry = self.revoked.entry(user).or_insert(at);
        *entry = (*entry).max(at);
        if self
            .routes
            .get(&user)
            .is_none_or(|r| u64::from(r.issued) >= at)
        {
            return None;
        }
        let to = self.routes.remove(&user)?.route;
        self.counters.kicks_revoked += 1;
        Some(revoked(to))
    }

    /// The revocations in force: (user, Unix second).
    pub fn revocations(&self) -> Vec<(u64, u64)> {
        self.revoked.iter().map(|(u, at)| (u.get(), *at)).collect()
    }

    /// Forgets revocations older than `horizon` seconds at Unix second `now`: every
    /// token they refuse has expired.
    pub fn forget_revocations(&mut self, now: u64, horizon: u64) {
        self.revoked
            .retain(|_, at| at.saturating_add(horizon) > now);
    }

    /// The connection closed or logged in as someone else.
    pub fn offline(&mut self, worker: WorkerId, conn: ConnId, user: UserId) {
        if self.routes.get(&user).map(|r| r.route) == Some(Route { worker, conn }) {
            self.routes.remove(&user);
        }
    }

    /// The worker is gone, and its users with it: returns them (offline now, unless
    /// they log in again).
    pub fn worker_down(&mut self, worker: WorkerId) -> Vec<UserId> {
        let gone: Vec<UserId> = self
            .routes
            .iter()
            .filter(|(_, r)| r.route.worker == worker)
            .map(|(u, _)| *u)
            .collect();
        for user in &gone {
            self.routes.remove(user);
        }
        gone
    }

    pub fn route(&self, user: UserId) -> Option<Route> {
        self.routes.get(&user).map(|r| r.route)
    }

    pub fn online_users(&self) -> usize {
        self.routes.len()
    }

    /// `text` from the caller to `to_user`'s connection: `delivered`, or `offline`.
    pub fn chat(&mut self, origin: Origin, to_user: u64, text: String) -> Vec<Delivery> {
        let mut out = Vec::new();
        let route = UserId::new(to_user).and_then(|u| self.route(u));
        let result = match route {
            Some(to) => {
                out.push(Delivery::Push {
                    to,
                    push: Push::Chat {
                        from_user: origin.user,
                        text,
                    },
                    close: false,
                });
                ResultCode::Delivered
            }
            None => ResultCode::Offline,
        };
        self.counters.chat.count(OpKind::Chat, result);
        out.push(Delivery::Reply {
            to: Route {
                worker: origin.worker,
                conn: origin.conn,
            },
            request: origin.request,
            reply: Reply::Chat { result },
        });
        out
    }

    /// A notice for `user`, to its connection if it is online.
    pub fn notice(&mut self, user: UserId, notice: Notice) -> Option<Delivery> {
        let to = self.route(user)?;
        self.counters.notices += 1;
        Some(Delivery::Push {
            to,
            push: Push::Notice(notice),
            close: false,
        })
    }
}

/// The kick of a revoked session.
fn revoked(to: Route) -> Delivery {
    Delivery::Push {
        to,
        push: Push::Kick {
            reason: KickReason::Revoked,
            text: "this user's sessions were revoked".into(),
            retry_after_ms: 0,
        },
        close: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(worker: WorkerId, key: u32, user: u64) -> Origin {
        Origin {
            worker,
            conn: ConnId { key, generation: 1 },
            request: 7,
            user: UserId::new(user).unwrap(),
        }
    }

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    #[test]
    fn a_second_login_kicks_the_first_connection() {
        let mut p = Presence::default();
        let first = p.login(origin(0, 1, 5), 0).unwrap();
        assert_eq!(first.len(), 1);
        let second = p.login(origin(1, 2, 5), 0).unwrap();
        assert!(matches!(
            &second[1],
            Delivery::Push { to, push: Push::Kick { reason: KickReason::Replaced, .. }, close: true }
                if to.worker == 0 && to.conn.key == 1
        ));
        assert_eq!(p.route(user(5)).unwrap().worker, 1);
        // The first connection going away does not take the second's route.
        p.offline(
            0,
            ConnId {
                key: 1,
                generation: 1,
            },
            user(5),
        );
        assert_eq!(p.online_users(), 1);
        // A login again on the same connection replaces nothing.
        assert_eq!(p.login(origin(1, 2, 5), 0).unwrap().len(), 1);
        assert_eq!(p.counters.kicks_replaced, 1);
    }

    #[test]
    fn chat_is_delivered_to_online_users_only() {
        let mut p = Presence::default();
        p.login(origin(0, 1, 5), 0).unwrap();
        let sent = p.chat(origin(1, 9, 6), 5, "hi".into());
        assert!(
            matches!(&sent[0], Delivery::Push { push: Push::Chat { from_user, text }, .. }
            if from_user.get() == 6 && text == "hi")
        );
        assert!(matches!(
            &sent[1],
            Delivery::Reply {
                reply: Reply::Chat {
                    result: ResultCode::Delivered
                },
                request: 7,
                ..
            }
        ));
        for to in [4, 0] {
            let sent = p.chat(origin(1, 9, 6), to, "anyone?".into());
            assert_eq!(sent.len(), 1);
            assert!(matches!(
                &sent[0],
                Delivery::Reply {
                    reply: Reply::Chat {
                        result: ResultCode::Offline
                    },
                    ..
                }
            ));
        }
        let gone: Vec<u64> = p.worker_down(0).iter().map(|u| u.get()).collect();
        assert_eq!(gone, [5]);
        assert_eq!(p.online_users(), 0);
    }

    #[test]
    fn notices_reach_the_users_current_connection() {
        let mut p = Presence::default();
        let notice = Notice {
            packet_id: 3,
            from_user: None,
            amount_cents: 10,
            shares: 1,
            expires_at_ms: 0,
        };
        assert_eq!(p.notice(user(5), notice), None);
        p.login(origin(2, 4, 5), 0).unwrap();
        assert!(
            matches!(p.notice(user(5), notice), Some(Delivery::Push { to, .. }) if to.worker == 2)
        );
        assert_eq!(p.counters.notices, 1);
    }

    #[test]
    fn a_revocation_kicks_the_route_and_refuses_older_tokens() {
        let mut p = Presence::default();
        p.login(origin(2, 4, 5), 100).unwrap();
        let kick = p.revoke(user(5), 200).unwrap();
        assert!(matches!(
            kick,
            Delivery::Push { to, push: Push::Kick { reason: KickReason::Revoked, .. }, close: true }
                if to.worker == 2 && to.conn.key == 4
        ));
        assert_eq!(p.route(user(5)), None, "offline");
        assert_eq!(
            p.revoke(user(5), 150),
            None,
            "nobody to kick; the later instant kept"
        );
        let refused = p.login(origin(1, 3, 5), 199).unwrap_err();
        assert!(matches!(
            &refused[0],
            Delivery::Reply {
                reply: Reply::Login {
                    result: ResultCode::BadToken,
                    ..
                },
                ..
            }
        ));
        assert!(matches!(&refused[1], Delivery::Push { close: true, .. }));
        assert_eq!(p.route(user(5)), None);
        assert!(
            p.login(origin(1, 3, 5), 200).is_ok(),
            "issued at the revocation or after"
        );
        assert_eq!(
            p.revoke(user(5), 200),
            None,
            "heard again: the fresh session stays"
        );
        assert!(p.route(user(5)).is_some());
        p.refreshed(
            1,
            ConnId {
                key: 3,
                generation: 1,
            },
            user(5),
            250,
        );
        assert_eq!(p.revoke(user(5), 240), None, "its refreshed token is newer");
        assert!(p.revoke(user(5), 260).is_some());
        p.forget_revocations(260 + 86_400, 86_400);
        assert!(
            p.login(origin(1, 3, 5), 0).is_ok(),
            "forgotten once no token outlives it"
        );
        assert_eq!(
            (p.counters.logins_revoked, p.counters.kicks_revoked),
            (1, 2)
        );
    }
}
