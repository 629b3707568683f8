//! This worker's end of the link to the supervisor (which hosts the money side): the
//! welcome that starts it, the messages that come down it (packets dealt, replies,
//! pushes, broadcasts, shutdown) and what each does here, and the queue of messages
//! going up.

use std::io::{ErrorKind, Read};

use hongbao_money::Reply;
use hongbao_proto::KickReason;
use hongbao_sys::net;
use mio::net::UnixStream;

use super::Worker;
use crate::error::{Error, Result};
use crate::link::{self, ToSupervisor, ToWorker, WorkerConfig};

/// This worker's end of the link: the stream, the bytes of a message not yet whole, and
/// the messages not yet written.
pub(super) struct SupervisorLink {
    stream: UnixStream,
    inbox: Vec<u8>,
    outbox: Vec<u8>,
}

impl SupervisorLink {
    /// The link, with what came after the welcome (`read_welcome`).
    pub(super) fn new(stream: UnixStream, inbox: Vec<u8>) -> SupervisorLink {
        SupervisorLink {
            stream,
            inbox,
            outbox: Vec::new(),
        }
    }

    /// Bytes waiting to go up.
    pub(super) fn queued(&self) -> usize {
        self.outbox.len()
    }

    pub(super) fn has_output(&self) -> bool {
        !self.outbox.is_empty()
    }
}

/// Waits for the supervisor's welcome. Returns it with whatever came right behind it in
/// the same reads (packets may already be dealt to us): the messages, and the bytes of
/// one not yet whole.
pub(super) fn read_welcome(
    mut stream: &std::os::unix::net::UnixStream,
) -> Result<(WorkerConfig, Vec<ToWorker>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut welcome = None;
    let mut early = Vec::new();
    loop {
        let n = stream
            .read(&mut chunk)
            .map_err(|e| Error::io("reading the supervisor's welcome", e))?;
        if n == 0 {
            return Err(Error::Link(
                "the supervisor closed the link before welcoming this worker".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        link::decode_all::<ToWorker>(&mut buf, |m| match m {
            ToWorker::Welcome(cfg) if welcome.is_none() => welcome = Some(*cfg),
            other => early.push(other),
        })?;
        if let Some(cfg) = welcome {
            return Ok((cfg, early, buf));
        }
    }
}

impl Worker {
    pub(super) fn tell_supervisor(&mut self, msg: &ToSupervisor) {
        link::encode(msg, &mut self.link.outbox);
    }

    pub(super) fn on_link(&mut self, readable: bool) -> Result<()> {
        if !readable {
            return Ok(());
        }
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.link.stream.read(&mut chunk) {
                Ok(0) => {
                    // The supervisor is gone: nothing we could acknowledge any more.
                    self.shutdown = true;
                    return Ok(());
                }
                Ok(n) => self.link.inbox.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("reading the link", e)),
            }
        }
        let mut inbox = Vec::new();
        link::decode_all::<ToWorker>(&mut self.link.inbox, |m| inbox.push(m))?;
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
        match net::write_nonblocking(&mut self.link.stream, &self.link.outbox) {
            Ok(n) => {
                link::consumed(&mut self.link.outbox, n);
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                self.shutdown = true;
                Ok(())
            }
            Err(e) => Err(Error::io("writing the link", e)),
        }
    }
}
