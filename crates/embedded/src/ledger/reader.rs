//! Reading the ledger beside the writer: a user's balance and recent events, every
//! balance, the wins and opens a page at a time — what is durable, never blocking the
//! writer (WAL).

use hongbao_money::event::{Account, Event};
use hongbao_money::rules::shake_packet_id;
use hongbao_money::seam::{Balances, LedgerOp, LedgerRead, OpsCursor, OpsPage};
use hongbao_money::{error as money, UserView};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::Path;

use super::keep_wal;
use crate::error::{Error, Result};

/// Read-only look-ups (admin threads), never blocking the writer thanks to WAL.
pub struct Reader {
    conn: Connection,
}

impl Reader {
    pub fn open(path: &Path) -> Result<Reader> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|e| Error::ledger("opening a reader", e))?;
        keep_wal(&conn);
        Ok(Reader { conn })
    }

    pub fn user(&self, user: u64, limit: usize) -> Result<UserView> {
        let balance: Option<i64> = self
            .conn
            .query_row(
                "SELECT cents FROM balances WHERE account = ?1",
                [Account::User(user).key()],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| Error::ledger("reading a balance", e))?;
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, ts_ms, body FROM events WHERE user = ?1 ORDER BY seq DESC LIMIT ?2",
            )
            .map_err(|e| Error::ledger("reading user events", e))?;
        let rows = stmt
            .query_map(params![user as i64, limit as i64], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| Error::ledger("reading user events", e))?;
        let mut recent_events = Vec::new();
        for row in rows {
            let (seq, ts_ms, body) = row.map_err(|e| Error::ledger("reading user events", e))?;
            let mut event: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| Error::Corrupt(e.to_string()))?;
            event["seq"] = seq.into();
            event["ts_ms"] = ts_ms.into();
            recent_events.push(event);
        }
        Ok(UserView {
            user,
            balance_cents: balance.unwrap_or(0) as u64,
            recent_events,
        })
    }

    /// Every non-zero balance, by account.
    pub fn balances(&self) -> Result<Balances> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT account, cents FROM balances WHERE cents != 0")
            .map_err(|e| Error::ledger("reading balances", e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .map_err(|e| Error::ledger("reading balances", e))?;
        let mut balances = Balances::default();
        for row in rows {
            let (account, cents) = row.map_err(|e| Error::ledger("reading balances", e))?;
            match Account::from_key(&account) {
                Some(Account::User(u)) => {
                    balances.users.insert(u, cents as u64);
                }
                Some(Account::Campaign(c)) => {
                    balances.campaigns.insert(c, cents as u64);
                }
                None => return Err(Error::Corrupt(format!("account key {account:?}"))),
            }
        }
        Ok(balances)
    }

    /// Up to `limit` wins and opened shares after event `after_seq`, in ledger order: the
    /// events as they are stored (a win twice, were it there, shows twice).
    pub fn ops(&self, after_seq: u64, limit: usize) -> Result<OpsPage> {
        let reading = |e| Error::ledger("reading wins and opens", e);
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, body FROM events WHERE seq > ?1 \
                 AND kind IN ('shake_won', 'share_opened') ORDER BY seq LIMIT ?2",
            )
            .map_err(reading)?;
        let rows = stmt
            .query_map(params![after_seq as i64, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(reading)?;
        let mut page = OpsPage::default();
        let mut last = None;
        for row in rows {
            let (seq, body) = row.map_err(reading)?;
            let event: Event = serde_json::from_str(&body)
                .map_err(|e| Error::Corrupt(format!("event {seq} does not parse: {e}: {body}")))?;
            match event {
                Event::ShakeWon {
                    campaign,
                    index,
                    user,
                    amount_cents,
                } => page.wins.push(LedgerOp {
                    packet: shake_packet_id(campaign, index),
                    user,
                    amount_cents,
                }),
                Event::ShareOpened {
                    packet,
                    user,
                    amount_cents,
                } => page.opens.push(LedgerOp {
                    packet,
                    user,
                    amount_cents,
                }),
                other => {
                    return Err(Error::Corrupt(format!(
                        "event {seq} is stored as a win or an open but is {other:?}"
                    )))
                }
            }
            last = Some(seq as u64);
        }
        // A short page is the end of what is committed.
        if page.wins.len() + page.opens.len() == limit {
            page.next = last.map(OpsCursor::Seq);
        }
        Ok(page)
    }
}

impl LedgerRead for Reader {
    fn user(&self, user: u64, limit: usize) -> money::Result<UserView> {
        Ok(Reader::user(self, user, limit)?)
    }

    fn balances(&self) -> money::Result<Balances> {
        Ok(Reader::balances(self)?)
    }

    fn ops(&self, after: Option<OpsCursor>, limit: usize) -> money::Result<OpsPage> {
        let after = match after {
            None => 0,
            Some(OpsCursor::Seq(seq)) => seq,
            Some(other) => {
                return Err(money::Error::refused(format!(
                    "cursor {other} is not this ledger's: it pages by event (seq.N)"
                )))
            }
        };
        Ok(Reader::ops(self, after, limit)?)
    }
}
