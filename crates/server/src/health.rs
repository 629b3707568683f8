//! What `serve` tells those who run it: an orchestrator's probes on the admin address
//! (`GET /healthz`, `GET /readyz`) and, on a bare host, systemd (`hongbao_sys::notify`).
//!
//! The supervisor's loop owns the facts — how many workers are linked, whether it has
//! served yet, whether it is stopping — and writes them here on every turn, with the
//! time of the turn; the admin threads read them. Atomics, not a lock: the loop turns
//! thousands of times a second and must never wait for a probe.
//!
//! - **Liveness** (`/healthz`): the admin thread answers. Nothing else is asked, so a
//!   liveness probe never restarts a server that is only busy.
//! - **Readiness** (`/readyz`): the server takes shakes now — it has linked every worker
//!   once (so its listeners are bound and each worker was welcomed), at least one worker
//!   is linked, its loop (the core and its ledger's group commit) has turned within
//!   `LOOP_SILENT_AFTER`, its ledger commits (a full disk makes it refuse what needs the
//!   ledger until it commits again: not ready meanwhile), and it is not stopping. A worker
//!   being restarted leaves the others serving: still ready, said in the answer. A ledger
//!   that failed stops the server, which is not ready from then on.
//!
//! Both answers say only this: no key, no user, no figure of money or traffic. They need
//! no admin key (a probe has none to give); the browser checks still apply.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hongbao_http::Response;

/// A loop silent this long is stuck (it turns at least every tick, a few milliseconds):
/// a shake sent now would wait for it. Long enough that a loaded machine's pause is not
/// taken for it.
pub const LOOP_SILENT_AFTER: Duration = Duration::from_secs(5);

const STARTING: u8 = 0;
const SERVING: u8 = 1;
const STOPPING: u8 = 2;
const FAILED: u8 = 3;

/// The server's state as the probes see it, written by the supervisor's loop.
#[derive(Debug)]
pub struct Health {
    born: Instant,
    phase: AtomicU8,
    linked: AtomicUsize,
    workers: AtomicUsize,
    /// When the loop last turned: milliseconds since `born`.
    turned_ms: AtomicU64,
    /// The ledger cannot commit now (it is trying again).
    ledger_failing: AtomicBool,
}

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Takes shakes: every worker linked, or some while others are being restarted.
    Ready { linked: usize, workers: usize },
    /// Why not, in one line.
    NotReady(String),
}

impl Default for Health {
    fn default() -> Health {
        Health::new()
    }
}

impl Health {
    /// Starting: no worker linked yet.
    pub fn new() -> Health {
        Health {
            born: Instant::now(),
            phase: AtomicU8::new(STARTING),
            linked: AtomicUsize::new(0),
            workers: AtomicUsize::new(0),
            turned_ms: AtomicU64::new(0),
            ledger_failing: AtomicBool::new(false),
        }
    }

    /// One turn of the supervisor's loop at `now`: `linked` of `workers` are linked.
    pub fn turn(&self, now: Instant, linked: usize, workers: usize) {
        self.linked.store(linked, Ordering::Relaxed);
        self.workers.store(workers, Ordering::Relaxed);
        self.turned_ms
            .store(self.since_born(now), Ordering::Relaxed);
    }

    /// Whether the ledger cannot commit now (`Money::commits_failing`), each turn.
    pub fn ledger_failing(&self, failing: bool) {
        self.ledger_failing.store(failing, Ordering::Relaxed);
    }

    /// Every worker has linked once: the server serves from now on.
    pub fn serving(&self) {
        let _ =
            self.phase
                .compare_exchange(STARTING, SERVING, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The server is stopping — asked to, or `failed` (its ledger, its loop): never ready
    /// again.
    pub fn stopping(&self, failed: bool) {
        let phase = if failed { FAILED } else { STOPPING };
        self.phase.store(phase, Ordering::Relaxed);
    }

    /// Whether the server takes shakes at `now`, and if not, why.
    pub fn readiness(&self, now: Instant) -> Readiness {
        let linked = self.linked.load(Ordering::Relaxed);
        let workers = self.workers.load(Ordering::Relaxed);
        let not = |why: String| Readiness::NotReady(why);
        match self.phase.load(Ordering::Relaxed) {
            STOPPING => return not("stopping".into()),
            FAILED => return not("failed, stopping (the log says why)".into()),
            STARTING => return not(format!("starting: {linked} of {workers} workers up")),
            _ => {}
        }
        let silent_ms = self
            .since_born(now)
            .saturating_sub(self.turned_ms.load(Ordering::Relaxed));
        if silent_ms >= LOOP_SILENT_AFTER.as_millis() as u64 {
            return not(format!(
                "the supervisor's loop has not turned for {:.1} s",
                silent_ms as f64 / 1000.0
            ));
        }
        if self.ledger_failing.load(Ordering::Relaxed) {
            return not("the ledger cannot commit (its disk may be full): trying again".into());
        }
        if linked == 0 {
            return not(format!("no worker up (0 of {workers}): restarting them"));
        }
        Readiness::Ready { linked, workers }
    }

    fn since_born(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.born).as_millis() as u64
    }
}

/// `GET /healthz`: the admin thread answers.
pub fn healthz() -> Response {
    text(200, "ok")
}

/// `GET /readyz`: 200 when the server takes shakes, else 503 with the reason.
pub fn readyz(health: &Health) -> Response {
    match health.readiness(Instant::now()) {
        Readiness::Ready { linked, workers } if linked == workers => text(200, "ready"),
        Readiness::Ready { linked, workers } => text(
            200,
            &format!("ready: {linked} of {workers} workers up, the others restarting"),
        ),
        Readiness::NotReady(why) => text(503, &format!("not ready: {why}")),
    }
}

/// A one-line plain-text answer a probe's log can show as it is; never cached.
fn text(status: u16, line: &str) -> Response {
    Response::new(status, "text/plain; charset=utf-8", format!("{line}\n"))
        .with_header("cache-control", "no-store")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_until_every_worker_linked_once() {
        let health = Health::new();
        let t0 = Instant::now();
        assert_eq!(
            health.readiness(t0),
            Readiness::NotReady("starting: 0 of 0 workers up".into())
        );
        health.turn(t0, 1, 2);
        assert_eq!(
            health.readiness(t0),
            Readiness::NotReady("starting: 1 of 2 workers up".into())
        );
        health.turn(t0, 2, 2);
        health.serving();
        assert_eq!(
            health.readiness(t0),
            Readiness::Ready {
                linked: 2,
                workers: 2
            }
        );
    }

    #[test]
    fn a_worker_restarting_leaves_it_ready_and_none_does_not() {
        let health = Health::new();
        let t0 = Instant::now();
        health.turn(t0, 2, 2);
        health.serving();
        health.turn(t0, 1, 2);
        assert_eq!(
            health.readiness(t0),
            Readiness::Ready {
                linked: 1,
                workers: 2
            }
        );
        health.turn(t0, 0, 2);
        assert_eq!(
            health.readiness(t0),
            Readiness::NotReady("no worker up (0 of 2): restarting them".into())
        );
        health.turn(t0, 2, 2);
        assert!(matches!(health.readiness(t0), Readiness::Ready { .. }));
    }

    #[test]
    fn a_silent_loop_is_not_ready_and_a_turn_makes_it_ready_again() {
        let health = Health::new();
        let t0 = Instant::now();
        health.turn(t0, 2, 2);
        health.serving();
        let almost = t0 + LOOP_SILENT_AFTER - Duration::from_millis(1);
        assert!(matches!(health.readiness(almost), Readiness::Ready { .. }));
        let late = t0 + LOOP_SILENT_AFTER + Duration::from_millis(200);
        assert_eq!(
            health.readiness(late),
            Readiness::NotReady("the supervisor's loop has not turned for 5.2 s".into())
        );
        health.turn(late, 2, 2);
        assert!(matches!(health.readiness(late), Readiness::Ready { .. }));
    }

    #[test]
    fn a_ledger_that_cannot_commit_is_not_ready_until_it_commits_again() {
        let health = Health::new();
        let t0 = Instant::now();
        health.turn(t0, 2, 2);
        health.serving();
        health.ledger_failing(true);
        assert!(matches!(
            health.readiness(t0),
            Readiness::NotReady(why) if why.starts_with("the ledger cannot commit")
        ));
        health.ledger_failing(false);
        assert!(matches!(health.readiness(t0), Readiness::Ready { .. }));
    }

    #[test]
    fn stopping_is_never_ready_again() {
        let health = Health::new();
        let t0 = Instant::now();
        health.turn(t0, 2, 2);
        health.serving();
        health.stopping(false);
        health.turn(t0, 2, 2);
        health.serving();
        assert_eq!(health.readiness(t0), Readiness::NotReady("stopping".into()));
        health.stopping(true);
        assert_eq!(
            health.readiness(t0),
            Readiness::NotReady("failed, stopping (the log says why)".into())
        );
    }

    #[test]
    fn the_answers_are_one_line_of_text() {
        let health = Health::new();
        let starting = readyz(&health);
        assert_eq!(starting.status, 503);
        assert_eq!(starting.body, b"not ready: starting: 0 of 0 workers up\n");
        health.turn(Instant::now(), 1, 1);
        health.serving();
        let ready = readyz(&health);
        assert_eq!(
            (ready.status, ready.body.as_slice()),
            (200, &b"ready\n"[..])
        );
        let live = healthz();
        assert_eq!((live.status, live.body.as_slice()), (200, &b"ok\n"[..]));
    }
}
