//! An operator broadcast in a worker: encoded once per form a connection may read, then
//! written out a slice of connections per turn of the loop, so shakes wait at most a
//! slice's worth of writes.

use hongbao_money::Push;
use hongbao_proto::Frame;

use super::codec::{self, Form};
use super::conn::State;
use super::Worker;
use crate::link::ToCore;

/// Connections a broadcast is written to per turn of the loop.
const BROADCAST_SLICE: usize = 256;

pub(super) struct BroadcastJob {
    /// The broadcast in each form, indexed by `Form as usize`.
    bytes: [Vec<u8>; 3],
    next_key: usize,
    end_key: usize,
}

impl Worker {
    pub(super) fn start_broadcast(&mut self, id: u64, server_time_us: u64, text: String) {
        self.stats.counters.broadcasts += 1;
        let frame = Frame {
            request_id: 0,
            message: codec::push_message(&Push::Broadcast {
                server_time_us,
                text,
            }),
        };
        let bytes = [Form::Frame, Form::WsBinary, Form::WsText].map(|form| {
            let mut out = Vec::new();
            codec::encode(form, &frame, &mut out);
            out
        });
        let connections = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Open && c.codec.form().is_some())
            .count() as u64;
        self.tell_core(&ToCore::BroadcastTaken { id, connections });
        self.broadcasts.push_back(BroadcastJob {
            bytes,
            next_key: 0,
            end_key: self.conns.capacity(),
        });
    }

    /// Writes the oldest broadcast to the next slice of connections.
    pub(super) fn broadcast_slice(&mut self) {
        let Some(mut job) = self.broadcasts.pop_front() else {
            return;
        };
        let mut visited = 0;
        while job.next_key < job.end_key && visited < BROADCAST_SLICE {
            let key = job.next_key;
            job.next_key += 1;
            let Some(conn) = self.conns.get(key) else {
                continue;
            };
            visited += 1;
            if conn.state != State::Open {
                continue;
            }
            let Some(form) = conn.codec.form() else {
                continue;
            };
            self.stats.counters.broadcast_delivered += 1;
            self.write(key, &job.bytes[form as usize]);
        }
        if job.next_key < job.end_key {
            self.broadcasts.push_front(job);
        }
    }
}
