//! A broadcast written out by the worker: a slice of connections a turn, as far as the
//! pacing (`broadcasts.rs`) allows, and how long the loop may wait for the next slice.

use std::time::Duration;

use hongbao_money::Push;
use hongbao_proto::Frame;
use hongbao_sys::clock::Uptime;

use super::codec::{self, Form};
use super::event_loop::Worker;
use crate::link::ToSupervisor;

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
            .filter(|(_, c)| c.state.is_open() && c.codec.form().is_some())
            .count() as u64;
        self.tell_supervisor(&ToSupervisor::BroadcastTaken { id, connections });
        let now = self.now();
        self.broadcasts.queue(now, bytes, self.conns.capacity());
    }

    /// Writes the oldest broadcast to the next slice of connections, as many as the pace
    /// allows. `now`: the turn's clock (when its poll returned), for the judgement and
    /// the allowance.
    pub(super) fn broadcast_slice(&mut self, now: Uptime) {
        let yield_after = self.yield_after();
        let Some((mut job, allowed)) = self.broadcasts.next_slice(now, yield_after) else {
            return;
        };
        let mut visited = 0;
        while job.next_key < job.end_key && visited < allowed {
            let key = job.next_key;
            job.next_key += 1;
            let Some(conn) = self.conns.get(key) else {
                continue;
            };
            visited += 1;
            if !conn.state.is_open() {
                continue;
            }
            let Some(form) = conn.codec.form() else {
                continue;
            };
            self.stats.counters.broadcast_delivered += 1;
            self.write(key, &job.bytes[form as usize]);
        }
        self.broadcasts.visited(job, visited);
    }

    /// How long the loop may sleep before the broadcast under way may write again.
    pub(super) fn broadcast_wait(&self) -> Option<Duration> {
        self.broadcasts.wait(self.yield_after())
    }

    fn yield_after(&self) -> Duration {
        Duration::from_millis(self.cfg.broadcast_yield_ms.into())
    }
}
