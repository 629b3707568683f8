//! The one state transition: how an event changes the core's memory. The live path
//! applies each event the moment it creates it, and a restart replays the ledger through
//! the same function, so live state and rebuilt state cannot drift apart.

use hongbao_money::event::{Account, Event};

use super::campaigns::{SendCampaign, ShakeCampaign};
use super::{Core, Packet};

impl Core {
    /// The one state transition, shared by the live path and replay. `self.seq` is the
    /// event's sequence number.
    pub(super) fn apply(&mut self, event: &Event, ts_ms: u64) {
        match event {
            Event::ShakeCampaign {
                campaign,
                minted_cents,
                ..
            } => {
                self.minted_cents += minted_cents;
                self.next_campaign = self.next_campaign.max(campaign + 1);
                let c =
                    ShakeCampaign::from_event(event, self.seq, ts_ms).expect("a shake campaign");
                self.shake.insert(*campaign, c);
            }
            Event::ShakeWon {
                campaign,
                index,
                user,
                amount_cents,
            } => {
                let c = self
                    .shake
                    .get_mut(campaign)
                    .expect("win in an unknown campaign");
                c.mark_won(*index, *amount_cents);
                self.credit(Account::User(*user), *amount_cents);
            }
            Event::SendCampaign { campaign, .. } => {
                self.next_campaign = self.next_campaign.max(campaign + 1);
                let c = SendCampaign::from_event(event, ts_ms).expect("a send campaign");
                self.send.insert(*campaign, c);
            }
            Event::PacketSent {
                packet,
                sender,
                amount_cents,
                shares,
                recipients,
                expires_ms,
                idempotency_key,
            } => {
                match sender {
                    Account::User(user) => {
                        self.debit(*sender, *amount_cents);
                        if let Some(key) = idempotency_key {
                            let balance = self.balance(*user);
                            self.idempotent
                                .insert((*user, key.clone()), (*packet, balance));
                        }
                    }
                    Account::Campaign(id) => {
                        self.minted_cents += amount_cents;
                        self.send
                            .get_mut(id)
                            .expect("packet of an unknown campaign")
                            .created(*shares, *amount_cents, ts_ms);
                    }
                }
                for user in recipients {
                    self.pending_notices.entry(*user).or_default().push(*packet);
                }
                self.next_packet = self.next_packet.max(packet + 1);
                self.expiries.insert((*expires_ms, *packet));
                self.packets.insert(
                    *packet,
                    Packet {
                        sender: *sender,
                        amount_cents: *amount_cents,
                        shares: *shares,
                        recipients: recipients.clone(),
                        opened: Vec::new(),
                        remaining_cents: *amount_cents,
                        expires_ms: *expires_ms,
                        expired: false,
                        created_seq: self.seq,
                    },
                );
            }
            Event::ShareOpened {
                packet,
                user,
                amount_cents,
            } => {
                let p = self
                    .packets
                    .get_mut(packet)
                    .expect("open of an unknown packet");
                p.opened.push((*user, *amount_cents));
                p.remaining_cents -= amount_cents;
                if p.remaining_shares() == 0 {
                    self.expiries.remove(&(p.expires_ms, *packet));
                }
                if let Account::Campaign(id) = p.sender {
                    if let Some(c) = self.send.get_mut(&id) {
                        c.opened(*amount_cents);
                    }
                }
                self.credit(Account::User(*user), *amount_cents);
            }
            Event::PacketExpired {
                packet,
                sender,
                refund_cents,
            } => {
                let p = self
                    .packets
                    .get_mut(packet)
                    .expect("expiry of an unknown packet");
                p.expired = true;
                p.remaining_cents -= refund_cents;
                self.expiries.remove(&(p.expires_ms, *packet));
                if let Account::Campaign(id) = sender {
                    if let Some(c) = self.send.get_mut(id) {
                        c.refunded_cents += refund_cents;
                    }
                }
                if *refund_cents > 0 {
                    self.credit(*sender, *refund_cents);
                }
            }
        }
    }
}
