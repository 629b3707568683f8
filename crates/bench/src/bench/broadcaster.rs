//! Operator broadcasts during the bench's steady phases: sent on an absolute schedule
//! while the bench waits for other things, then checked against what the clients received.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use super::server::Server;
use hongbao_load::broadcast::Sent;
use hongbao_load::coordinator::Load;

/// Sends a steady phase's broadcasts on time while the bench waits for other things: the
/// first when the phase's QPS holds, then every `every` (on an absolute schedule, so a
/// slow answer does not push the next one later).
pub(super) struct Broadcaster {
    every: Option<Duration>,
    /// When the next one is due; `None` outside a steady phase.
    next_at: Option<Instant>,
    phase: String,
    pub sent: Vec<Sent>,
}

impl Broadcaster {
    pub fn new(every_secs: f64) -> Broadcaster {
        Broadcaster {
            every: (every_secs > 0.0).then(|| Duration::from_secs_f64(every_secs)),
            next_at: None,
            phase: String::new(),
            sent: Vec::new(),
        }
    }

    pub fn start_phase(&mut self, name: &str) {
        if self.every.is_some() {
            self.next_at = Some(Instant::now());
            self.phase = name.to_string();
        }
    }

    pub fn end_phase(&mut self) {
        self.next_at = None;
    }

    /// Sends a broadcast if one is due.
    fn tick(&mut self, server: &Server, load: &Load) -> anyhow::Result<()> {
        let (Some(every), Some(due)) = (self.every, self.next_at) else {
            return Ok(());
        };
        let now = Instant::now();
        if now < due {
            return Ok(());
        }
        let mut next = due + every;
        while next <= now {
            next += every; // fell behind (a stall): skip, do not burst
        }
        self.next_at = Some(next);
        // Drops before the send, as the clients last reported: a drop between that report
        // and the send only loosens the check (`broadcast::delivery_ok`).
        let t = load.totals();
        let text = format!("bench broadcast {}", self.sent.len() + 1);
        let r: Value = server.post("/v1/broadcast", &json!({ "text": text }))?;
        let field = |k: &str| {
            r[k].as_u64()
                .with_context(|| format!("POST /v1/broadcast answered without {k}: {r}"))
        };
        self.sent.push(Sent {
            id: field("id")?,
            server_time_us: field("server_time_us")?,
            connections: field("connections")?,
            phase: self.phase.clone(),
            drops_before: t.disconnects + t.connect_failures(),
        });
        Ok(())
    }

    /// Sleeps for `d`, sending what falls due meanwhile.
    pub fn sleep(&mut self, d: Duration, server: &Server, load: &Load) -> anyhow::Result<()> {
        let end = Instant::now() + d;
        loop {
            self.tick(server, load)?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    }
}

/// Waits until every broadcast in `sent` has reached as many clients as the server handed
/// it to, for at most max(5 s, twice the slowest delivery seen so far); false on timeout.
/// Clients report once a second, so the 5 s also covers their reports catching up.
pub(super) fn wait_deliveries(load: &Load, sent: &[Sent]) -> bool {
    let slowest_ms = load
        .broadcasts()
        .iter()
        .map(|b| b.complete_ms())
        .fold(0.0, f64::max);
    let deadline = Instant::now() + Duration::from_secs_f64((2.0 * slowest_ms / 1000.0).max(5.0));
    loop {
        let delivered = load.broadcasts_delivered();
        let done = sent.iter().all(|s| {
            delivered
                .get(&s.server_time_us)
                .is_some_and(|&d| d >= s.connections)
        });
        if done {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
