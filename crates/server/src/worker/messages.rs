//! What the supervisor's messages do to the worker (packets dealt, replies, pushes,
//! broadcasts, a new configuration, shutdown), and the worker's own going up the link.

use hongbao_money::Reply;
use hongbao_proto::KickReason;

use super::event_loop::Worker;
use crate::error::Result;
use crate::link::{ToSupervisor, ToWorker, WorkerConfig};

impl Worker {
    pub(super) fn tell_supervisor(&mut self, msg: &ToSupervisor) {
        self.link.send(msg);
    }

    pub(super) fn on_link(&mut self, readable: bool) -> Result<()> {
        if !readable {
            return Ok(());
        }
        let Some(inbox) = self.link.receive()? else {
            // The supervisor is gone: nothing we could acknowledge any more.
            self.shutdown = true;
            return Ok(());
        };
        for msg in inbox {
            self.on_supervisor_message(msg);
        }
        Ok(())
    }

    pub(super) fn on_supervisor_message(&mut self, msg: ToWorker) {
        match msg {
            ToWorker::Deal { packets } => self.shakes.deal(packets),
            ToWorker::Reply { conn, req, reply } => {
                if matches!(reply, Reply::Shake { .. }) {
                    if let Some(read_at) = self.shakes.claimed(conn, req) {
                        self.record_latency(read_at);
                    }
                }
                if let Some(key) = self.key_of(conn) {
                    self.reply(key, req, &reply);
                    if let Some(c) = self.conns.get_mut(key) {
                        c.state.awaiting = c.state.awaiting.saturating_sub(1);
                    }
                    self.finish_draining(key);
                }
            }
            ToWorker::Push { conn, push, close } => {
                let Some(key) = self.key_of(conn) else {
                    return;
                };
                self.push(key, &push);
                if close {
                    // Presence already routed the user elsewhere: just close.
                    if self.conns[key].state.user.take().is_some() {
                        self.stats.levels.logged_in -= 1;
                    }
                    let reason = match push {
                        hongbao_money::Push::Kick { reason, .. } => reason,
                        _ => KickReason::Replaced,
                    };
                    self.goodbye(key, reason);
                }
            }
            ToWorker::Welcome(cfg) => self.reconfigure(*cfg),
            ToWorker::Revoke { user, at } => self.sessions.note_revoked(user, at),
            ToWorker::LoginRefused { conn } => {
                let Some(key) = self.key_of(conn) else {
                    return;
                };
                // Its reply (`rate-limited`) comes as any reply does.
                let c = &mut self.conns[key];
                if c.state.user.take().is_some() {
                    self.stats.levels.logged_in -= 1;
                    c.state.session = Default::default();
                    // It must log in again within the login deadline, from now.
                    c.last_seen = self.time.polled.secs();
                    self.visit_soon(key);
                }
            }
            ToWorker::Broadcast {
                id,
                server_time_us,
                text,
            } => self.start_broadcast(id, server_time_us, text),
            ToWorker::DrainTo { count } => self.grant_drain(count as usize),
            ToWorker::Drain {
                window_ms,
                retry_after_ms,
            } => self.start_drain(
                std::time::Duration::from_millis(window_ms.into()),
                retry_after_ms,
            ),
            ToWorker::Shutdown => {
                // Tell every client why its connection is about to close.
                let open: Vec<usize> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.state.is_open())
                    .map(|(key, _)| key)
                    .collect();
                for key in open {
                    self.kick(key, KickReason::Shutdown, "server shutting down");
                }
                self.shutdown = true;
            }
        }
    }

    /// A new welcome: the configuration reloaded. Sessions whose key is gone are kicked
    /// `revoked`; every connection's deadlines are looked at again (an idle timeout or a
    /// refresh lead set now applies to the sessions already logged in).
    fn reconfigure(&mut self, cfg: WorkerConfig) {
        let gone = match self.sessions.reload(cfg.login.clone()) {
            Ok(gone) => gone,
            Err(e) => {
                // The supervisor checked these keys before sending them.
                tracing::error!(error = %e, "a reloaded login setup is unusable; kept the old");
                Vec::new()
            }
        };
        // New certificates: for the connections that come after.
        match cfg.tls.as_ref().map(super::tls::Tls::new).transpose() {
            Ok(tls) => self.tls = tls,
            Err(e) => tracing::error!(error = %e, "reloaded TLS files are unusable; kept the old"),
        }
        self.cfg = cfg;
        let keys: Vec<usize> = self.conns.iter().map(|(key, _)| key).collect();
        for key in keys {
            let c = &self.conns[key];
            if c.state.user.is_some() && gone.contains(&c.state.session.kid) {
                self.stats.counters.kicks_revoked += 1;
                self.kick(
                    key,
                    KickReason::Revoked,
                    "the key that signed this session's token was removed",
                );
            } else {
                self.visit_soon(key);
            }
        }
    }

    pub(super) fn flush_link(&mut self) -> Result<()> {
        if !self.link.flush()? {
            self.shutdown = true;
        }
        Ok(())
    }
}
