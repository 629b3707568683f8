//! An operator's broadcast (`POST /v1/broadcast`): handed to every worker and to the other
//! hosts, and answered once each worker has said how many connections it is writing it
//! to, or once the wait is over.

use std::sync::mpsc::Sender;
use std::time::Duration;

use hongbao_http::Response;
use hongbao_sys::clock::Uptime;

use super::event_loop::{PendingBroadcast, Supervisor};
use crate::admin::Broadcasted;
use crate::link::{self, ToWorker};

/// How long a broadcast's admin answer waits for the workers' counts.
const BROADCAST_ANSWER_WAIT: Duration = Duration::from_secs(5);

impl Supervisor {
    pub(super) fn broadcast(&mut self, text: String, reply: Sender<Response>) {
        let id = self.next_broadcast;
        self.next_broadcast += 1;
        let server_time_us = self.time.unix().as_micros();
        self.money.broadcast_elsewhere(server_time_us, text.clone());
        let msg = ToWorker::Broadcast {
            id,
            server_time_us,
            text,
        };
        let mut waiting = Vec::new();
        for (&w, &key) in &self.worker_links {
            link::encode(&msg, &mut self.links[key].outbuf);
            waiting.push(w);
        }
        self.broadcasts.insert(
            id,
            PendingBroadcast {
                reply,
                server_time_us,
                workers: waiting.len(),
                waiting,
                connections: 0,
                deadline: self.time.now + BROADCAST_ANSWER_WAIT,
            },
        );
        self.answer_broadcasts(false, self.time.now);
    }

    /// Answers the broadcasts every worker has counted (or, with `overdue`, those whose
    /// wait is over at `now`: a worker that does not answer is left out of the count).
    pub(super) fn answer_broadcasts(&mut self, overdue: bool, now: Uptime) {
        let done: Vec<u64> = self
            .broadcasts
            .iter()
            .filter(|(_, b)| b.waiting.is_empty() || (overdue && now >= b.deadline))
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let b = self.broadcasts.remove(&id).expect("listed");
            let answer = Broadcasted {
                connections: b.connections,
                id,
                server_time_us: b.server_time_us,
                workers: b.workers - b.waiting.len(),
            };
            let _ = b.reply.send(Response::json(200, &answer));
        }
    }
}
