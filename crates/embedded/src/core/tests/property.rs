//! The property: money is conserved through any operations and restarts.

use super::*;

/// Users 1..=USERS exist; recipients may also name USERS + 1..=USERS + 2, who never log in.
const USERS: u64 = 8;

#[derive(Debug, Clone)]
enum Action {
    ShakeCampaign {
        packets: u32,
        rate_per_sec: u32,
        amount_min: u64,
        spread: u64,
    },
    SendCampaign {
        packets: u32,
        rate_per_sec: u32,
        recipients: u32,
        user_min: u64,
        amount_extra: u64,
        spread: u64,
    },
    WorkerUp(WorkerId),
    WorkerDown(WorkerId),
    Online {
        worker: WorkerId,
        conn: u64,
        user: u64,
    },
    Offline {
        user: u64,
    },
    Tick {
        ms: u64,
    },
    Claim {
        pick: usize,
        user: u64,
    },
    Send {
        /// None: whoever has the most money, so that sends often succeed.
        user: Option<u64>,
        amount_cents: u64,
        shares: u32,
        recipients: Vec<u64>,
    },
    Open {
        /// Picks among the packets the clients know of; None: a packet that does not exist.
        pick: Option<usize>,
        /// Some: the i-th recipient (mod count); None: `user`, likely not a recipient.
        recipient: Option<usize>,
        user: u64,
    },
    Chat {
        user: u64,
        to_user: u64,
    },
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    let user = 1..=USERS;
    prop_oneof![
        2 => (1u32..40, 1u32..3000, 1u64..200, 0u64..300).prop_map(
            |(packets, rate_per_sec, amount_min, spread)| Action::ShakeCampaign {
                packets,
                rate_per_sec,
                amount_min,
                spread,
            }
        ),
        1 => (1u32..8, 1u32..200, 1u32..4, 1u64..USERS, 0u64..500, 0u64..500).prop_map(
            |(packets, rate_per_sec, recipients, user_min, amount_extra, spread)| {
                Action::SendCampaign {
                    packets,
                    rate_per_sec,
                    recipients,
                    user_min,
                    amount_extra,
                    spread,
                }
            }
        ),
        3 => (0u16..3).prop_map(Action::WorkerUp),
        1 => (0u16..3).prop_map(Action::WorkerDown),
        3 => (0u16..3, 0u64..3, user.clone())
            .prop_map(|(worker, conn, user)| Action::Online { worker, conn, user }),
        1 => user.clone().prop_map(|user| Action::Offline { user }),
        6 => prop_oneof![4 => 0u64..30, 2 => 0u64..2000, 1 => TTL_MS..2 * TTL_MS]
            .prop_map(|ms| Action::Tick { ms }),
        8 => (any::<usize>(), user.clone()).prop_map(|(pick, user)| Action::Claim { pick, user }),
        5 => (
            prop::option::weighted(0.7, user.clone()),
            prop_oneof![3 => 1u64..400, 1 => 1u64..100_000, 1 => Just(0u64)],
            prop_oneof![4 => 1u32..4, 1 => 0u32..6],
            prop_oneof![
                4 => prop::sample::subsequence((1..=USERS + 2).collect::<Vec<_>>(), 1..5),
                1 => prop::collection::vec(1..=USERS + 2, 0..5),
            ],
        )
            .prop_map(|(user, amount_cents, shares, recipients)| Action::Send {
                user,
                amount_cents,
                shares,
                recipients,
            }),
        8 => (
            prop::option::weighted(0.95, any::<usize>()),
            prop::option::weighted(0.8, 0usize..10),
            user.clone(),
        )
            .prop_map(|(pick, recipient, user)| Action::Open {
                pick,
                recipient,
                user,
            }),
        1 => (user.clone(), 1..=USERS + 2).prop_map(|(user, to_user)| Action::Chat { user, to_user }),
        1 => Just(Action::Restart),
    ]
}

impl Sim {
    fn route(&self, user: u64) -> (WorkerId, u64) {
        match self.presence.route(uid(user)) {
            Some(route) => (route.worker, route.conn.key as u64),
            None => (0, user << 8),
        }
    }

    fn run(&mut self, action: &Action) {
        match *action {
            Action::ShakeCampaign {
                packets,
                rate_per_sec,
                amount_min,
                spread,
            } => {
                self.shake_campaign(&shake_request(
                    packets,
                    rate_per_sec,
                    amount_min,
                    amount_min + spread,
                ));
            }
            Action::SendCampaign {
                packets,
                rate_per_sec,
                recipients,
                user_min,
                amount_extra,
                spread,
            } => {
                let amount_min = recipients as u64 + amount_extra;
                self.send_campaign(&SendCampaignRequest {
                    packets,
                    rate_per_sec,
                    recipients,
                    user_min,
                    user_max: (user_min + recipients as u64).max(USERS + 2),
                    amount_min,
                    amount_max: amount_min + spread,
                });
            }
            Action::WorkerUp(worker) => {
                // The supervisor only announces a worker the core does not count as live.
                if !self.live_workers.contains(&worker) {
                    self.worker_up(worker);
                }
            }
            Action::WorkerDown(worker) => self.worker_down(worker),
            Action::Online { worker, conn, user } => {
                if self.live_workers.contains(&worker) {
                    self.online(worker, (user << 8) | conn, user);
                }
            }
            Action::Offline { user } => {
                let (worker, conn) = self.route(user);
                self.offline(worker, conn, user);
            }
            Action::Tick { ms } => self.advance(ms),
            Action::Claim { pick, user } => {
                if self.dealt.is_empty() {
                    return;
                }
                // Any packet dealt since the restart: in a pool, already won, or stranded
                // on a worker that died since.
                let (worker, packet, amount) = self.dealt[pick % self.dealt.len()];
                let (_, conn) = self.route(user);
                let balance = self.core.balance(user);
                let (result, packet_id, amount_cents) =
                    result_of_shake(&self.claim(worker, conn, user, packet));
                match result {
                    ResultCode::Won => {
                        assert_eq!((packet_id, amount_cents), (packet, amount));
                        let last = &self.ledger.last().unwrap().event;
                        let won = Event::ShakeWon {
                            campaign: (packet >> 32) as u32,
                            index: packet as u32,
                            user,
                            amount_cents: amount,
                        };
                        assert_eq!(last, &won, "a win the ledger does not hold");
                        assert_eq!(self.core.balance(user), balance + amount);
                    }
                    ResultCode::Nothing => assert_eq!(self.core.balance(user), balance),
                    other => panic!("claim answered {other:?}"),
                }
            }
            Action::Send {
                user,
                amount_cents,
                shares,
                ref recipients,
            } => {
                let user = user.unwrap_or_else(|| {
                    (1..=USERS)
                        .max_by_key(|u| self.core.balance(*u))
                        .expect("there are users")
                });
                let balance = self.core.balance(user);
                let (result, packet, after) = self.send(user, amount_cents, shares, recipients);
                match result {
                    ResultCode::Ok => {
                        assert_eq!(after, balance - amount_cents);
                        assert_eq!(self.recipients[&packet], *recipients);
                    }
                    ResultCode::InsufficientFunds => {
                        assert!(balance < amount_cents);
                        assert_eq!(after, balance);
                    }
                    ResultCode::BadRequest => assert_eq!(after, balance),
                    other => panic!("send answered {other:?}"),
                }
            }
            Action::Open {
                pick,
                recipient,
                user,
            } => {
                // What the clients heard of; before any notice, whatever the ledger holds
                // (campaign packets for users who were offline).
                let known: Vec<u64> = if self.packets.is_empty() {
                    self.recipients.keys().copied().collect()
                } else {
                    self.packets.iter().copied().collect()
                };
                let packet = match (pick, known.len()) {
                    (Some(pick), n) if n > 0 => known[pick % n],
                    _ => 1 << 40,
                };
                let recipients = self.recipients.get(&packet).cloned().unwrap_or_default();
                let user = match recipient {
                    Some(i) if !recipients.is_empty() => recipients[i % recipients.len()],
                    _ => user,
                };
                let earlier = self.opened.get(&(packet, user)).copied();
                let balance = self.core.balance(user);
                let (result, amount) = self.open(user, packet);
                match result {
                    ResultCode::Opened => {
                        assert!(earlier.is_none());
                        assert_eq!(self.opened.get(&(packet, user)), Some(&amount));
                        assert!(amount >= 1);
                        assert_eq!(self.core.balance(user), balance + amount);
                    }
                    ResultCode::AlreadyOpened => assert_eq!(Some(amount), earlier),
                    ResultCode::NotARecipient => assert!(!recipients.contains(&user)),
                    ResultCode::NoSuchPacket => assert!(!self.recipients.contains_key(&packet)),
                    ResultCode::Expired | ResultCode::Empty => {}
                    other => panic!("open answered {other:?}"),
                }
                if result != ResultCode::Opened {
                    assert_eq!(self.core.balance(user), balance);
                }
            }
            Action::Chat { user, to_user } => {
                let online = self.presence.route(uid(to_user)).is_some();
                let result = self.chat(user, to_user, "hi");
                let expected = if online {
                    ResultCode::Delivered
                } else {
                    ResultCode::Offline
                };
                assert_eq!(result, expected);
            }
            Action::Restart => self.restart(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Money is conserved after every step, shares and wins are paid at most once, and a
    /// restart from the ledger changes no figure.
    #[test]
    fn money_is_conserved_through_any_operations_and_restarts(
        seed: u64,
        actions in prop::collection::vec(action(), 1..200),
    ) {
        let mut sim = Sim::new(seed);
        for action in &actions {
            sim.run(action);
            sim.check();
        }
        // Whatever the history, a last restart rebuilds the same state.
        sim.restart();
        sim.check();
        // And once every campaign has created its packets and every time-to-live has run
        // out, nothing is left unopened.
        sim.advance(2 * TTL_MS);
        sim.advance(TTL_MS);
        let audit = sim.core.audit();
        prop_assert_eq!(audit.unopened_cents, 0);
        prop_assert!(audit.ok);
    }
}
