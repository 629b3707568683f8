//! Operator broadcasts during the bench's steady phases: sent on an absolute schedule
//! while the bench waits for other things, then checked against what the clients received.
//!
//! Time comes in as a value of the bench's clock: the schedule's decisions (`due`) take
//! `now`, so a test moves the clock by hand.

use std::path::Path;
use std::time::Duration;

use super::say::say;
use super::server::Server;
use super::summary::Discrepancy;
use hongbao_load::broadcast::{self, BroadcastStats, Sent};
use hongbao_load::coordinator::Load;
use hongbao_server::admin::{BroadcastRequest, Broadcasted};
use hongbao_sys::clock::{Clock, Uptime};

use crate::{Error, Result};

/// The longest nap of a wait that sends broadcasts: one falls due within it at most this
/// late.
const NAP: Duration = Duration::from_millis(50);
/// How often the wait for the last deliveries looks at the clients' counts again.
const DELIVERY_POLL: Duration = Duration::from_millis(100);

/// Sends a steady phase's broadcasts on time while the bench waits for other things: the
/// first when the phase's QPS holds, then every `every` (on an absolute schedule, so a
/// slow answer does not push the next one later).
pub(super) struct Broadcaster {
    clock: Clock,
    every: Option<Duration>,
    /// When the next one is due; `None` outside a steady phase.
    next_at: Option<Uptime>,
    phase: String,
    pub sent: Vec<Sent>,
}

impl Broadcaster {
    pub fn new(every_secs: f64, clock: Clock) -> Broadcaster {
        Broadcaster {
            clock,
            every: (every_secs > 0.0).then(|| Duration::from_secs_f64(every_secs)),
            next_at: None,
            phase: String::new(),
            sent: Vec::new(),
        }
    }

    pub fn start_phase(&mut self, name: &str) {
        if self.every.is_some() {
            self.next_at = Some(self.clock.now());
            self.phase = name.to_string();
        }
    }

    pub fn end_phase(&mut self) {
        self.next_at = None;
    }

    /// Whether a broadcast falls due at `now`; if so the next is scheduled.
    fn due(&mut self, now: Uptime) -> bool {
        let (Some(every), Some(due)) = (self.every, self.next_at) else {
            return false;
        };
        if now < due {
            return false;
        }
        let mut next = due + every;
        while next <= now {
            next += every; // fell behind (a stall): skip, do not burst
        }
        self.next_at = Some(next);
        true
    }

    /// Sends a broadcast if one is due at `now`; whether it did.
    fn tick(&mut self, now: Uptime, server: &Server, load: &Load) -> Result<bool> {
        if !self.due(now) {
            return Ok(false);
        }
        // Drops before the send, as the clients last reported: a drop between that report
        // and the send only loosens the check (`broadcast::delivery_ok`).
        let t = load.totals();
        let text = format!("bench broadcast {}", self.sent.len() + 1);
        let r: Broadcasted = server.post("/v1/broadcast", &BroadcastRequest { text })?;
        self.sent.push(Sent {
            id: r.id,
            server_time_us: r.server_time_us,
            connections: r.connections,
            phase: self.phase.clone(),
            drops_before: t.disconnects + t.connect_failures(),
        });
        Ok(true)
    }

    /// Sleeps for `d`, sending what falls due meanwhile.
    pub fn sleep(&mut self, d: Duration, server: &Server, load: &Load) -> Result<()> {
        let mut now = self.clock.now();
        let end = now + d;
        loop {
            if self.tick(now, server, load)? {
                now = self.clock.now(); // the broadcast's answer took a while
            }
            if now >= end {
                return Ok(());
            }
            std::thread::sleep(end.since(now).min(NAP));
            now = self.clock.now();
        }
    }
}

/// Waits until every broadcast in `sent` has reached as many clients as the server handed
/// it to, for at most max(5 s, twice the slowest delivery seen so far); false on timeout.
/// Clients report once a second, so the 5 s also covers their reports catching up.
pub(super) fn wait_deliveries(load: &Load, sent: &[Sent], clock: &Clock) -> bool {
    let slowest_ms = load
        .broadcasts()
        .iter()
        .map(|b| b.complete_ms())
        .fold(0.0, f64::max);
    let deadline = clock.now() + Duration::from_secs_f64((2.0 * slowest_ms / 1000.0).max(5.0));
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
        if clock.now() > deadline {
            return false;
        }
        std::thread::sleep(DELIVERY_POLL);
    }
}

/// The run's broadcasts judged once the load has stopped: each against what its clients
/// received (`broadcasts.json` in `out`), the failed ones as discrepancies. `drops_after`
/// is the clients' drops when the phases ended, which loosen the check.
pub(super) fn judge(
    out: &Path,
    sent: &[Sent],
    deliveries: &[BroadcastStats],
    drops_after: u64,
    discrepancies: &mut Vec<Discrepancy>,
) -> Result<broadcast::Summary> {
    let entries = broadcast::entries(sent, deliveries);
    let summary = broadcast::summary(sent, deliveries);
    // Written before the monitor finishes, so its last report draws the curves.
    let path = out.join("broadcasts.json");
    let writing = || format!("writing {}", path.display());
    let json = serde_json::to_string_pretty(&entries).map_err(|e| Error::json(writing(), e))?;
    std::fs::write(&path, json).map_err(|e| Error::io(writing(), e))?;
    for (s, e) in sent.iter().zip(&entries) {
        if !broadcast::delivery_ok(s, e.delivered, drops_after) {
            discrepancies.push(Discrepancy::new(
                "broadcast_delivery",
                Some(&s.phase),
                s.connections,
                e.delivered,
            ));
        }
    }
    if !sent.is_empty() {
        let b = &summary;
        say(&format!(
            "bench: {} broadcasts to {} connections: {} delivered; slowest complete in {:.1} ms; delivery p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
            b.sent, b.connections, b.delivered, b.complete_ms, b.latency_ms.p50, b.latency_ms.p99, b.latency_ms.max
        ));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasts_fall_due_on_an_absolute_schedule_and_skip_what_a_stall_missed() {
        let at = Uptime::from_millis;
        let mut b = Broadcaster::new(2.0, Clock::start());
        assert!(!b.due(at(0)), "none outside a steady phase");
        b.next_at = Some(at(1_000));
        assert!(!b.due(at(999)));
        assert!(b.due(at(1_000)));
        assert!(!b.due(at(2_999)));
        // A late turn does not push the next one later: still 5 s, not 3.3 + 2.
        assert!(b.due(at(3_300)));
        assert_eq!(b.next_at, Some(at(5_000)));
        // A stall past several: one now, the next on the schedule after it.
        assert!(b.due(at(11_500)));
        assert_eq!(b.next_at, Some(at(13_000)));
        b.end_phase();
        assert!(!b.due(at(13_000)));
        // Without --broadcast-every: never.
        let mut none = Broadcaster::new(0.0, Clock::start());
        none.next_at = Some(at(0));
        assert!(!none.due(at(10_000)));
    }
}
