//! This worker's end of the link to the supervisor (which hosts the money side): the
//! welcome that starts it, the messages that come down it (packets dealt, replies,
//! pushes, broadcasts, shutdown) and what each does here, and the queue of messages
//! going up.

use std::io::{ErrorKind, Read};

use hongbao_sys::net;
use mio::net::UnixStream;

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

    /// Queues `msg` to go up.
    pub(super) fn send(&mut self, msg: &ToSupervisor) {
        link::encode(msg, &mut self.outbox);
    }

    /// Reads what the link holds: the messages now whole, or none when the supervisor
    /// closed it.
    pub(super) fn receive(&mut self) -> Result<Option<Vec<ToWorker>>> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.inbox.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("reading the link", e)),
            }
        }
        let mut inbox = Vec::new();
        link::decode_all::<ToWorker>(&mut self.inbox, |m| inbox.push(m))?;
        Ok(Some(inbox))
    }

    /// Writes what is queued, as much as the link takes; false when the supervisor is
    /// gone (the pipe broken).
    pub(super) fn flush(&mut self) -> Result<bool> {
        match net::write_nonblocking(&mut self.stream, &self.outbox) {
            Ok(n) => {
                link::consumed(&mut self.outbox, n);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(Error::io("writing the link", e)),
        }
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
