//! A rolling upgrade of a lab's gateways (`--upgrade-at` with `--hosts`): each gateway in
//! turn told to stop — SIGTERM, so it drains: not ready, its listeners closed, its clients
//! let go over `drain_secs`, each told to come back, which they do through nginx to the
//! gateways still up — and started again on `--upgrade-to`'s binary (or the same one: a
//! rolling restart); the next once it is ready, as a StatefulSet's rolling update goes
//! (docs/scale-out.md, "Upgrading one gateway at a time").

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use hongbao_sys::clock::Clock;

use super::admin::stats;

/// The drain the lab's gateways are given: serve's default `drain_secs` (the lab sets
/// none), and the 3 s a server may take after it for its last commits.
const DRAIN_WINDOW: Duration =
    Duration::from_secs(hongbao_server::config::DEFAULT_DRAIN_SECS as u64 + 3);

/// How long past its window a draining gateway is waited for before it is killed.
const PAST_WINDOW: Duration = Duration::from_secs(10);

/// How long a gateway started again is left ready before the next is drained (a
/// StatefulSet's `minReadySeconds`): the clients let go last, told to come back in about
/// a second, have logged in again by then.
const READY_FOR: Duration = Duration::from_secs(3);

/// One gateway's step of a rolling upgrade.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolledGateway {
    /// The host's name (gw1, gw2, …).
    pub host: String,
    /// The connections it held when it was told to stop: the clients it moved.
    pub connections: u64,
    /// The window it had to drain in (`drain_secs` and the 3 s after).
    pub drain_window_ms: u64,
    /// From SIGTERM to its exit.
    pub drain_ms: u64,
    /// Whether it exited on its own within the window (else it was killed past it).
    pub drained_in_window: bool,
    /// From starting the new binary to its ready line; none if it did not start.
    pub start_ms: Option<u64>,
}

impl RolledGateway {
    /// Gateway `host`'s step as it drained: told to stop with `connections`, it exited
    /// (or was killed, `exited` false) `drain` later.
    fn drained(host: &str, connections: u64, drain: Duration, exited: bool) -> RolledGateway {
        let drain_ms = drain.as_millis() as u64;
        RolledGateway {
            host: host.to_string(),
            connections,
            drain_window_ms: DRAIN_WINDOW.as_millis() as u64,
            drain_ms,
            drained_in_window: exited && drain_ms <= DRAIN_WINDOW.as_millis() as u64,
            start_ms: None,
        }
    }
}

/// Upgrades every gateway of `lab`, one after another, to the binary `to`.
/// Says what was done; each gateway's step comes back beside it. The lab is locked only
/// to take a gateway out and to start it again, not while it drains.
pub(super) fn roll(
    lab: &Mutex<hongbao_lab::Lab>,
    to: &Path,
    key: &str,
) -> (String, Vec<RolledGateway>) {
    let clock = Clock::start();
    let count = lab.lock().unwrap().gateways.len();
    let mut rolled = Vec::with_capacity(count);
    for i in 0..count {
        let (host, admin, proc) = {
            let mut lab = lab.lock().unwrap();
            let gw = &mut lab.gateways[i];
            (gw.host.name.clone(), gw.admin(), gw.proc.take())
        };
        let Some(mut proc) = proc else {
            return (
                format!("rolling upgrade: gateway host {host} was not running"),
                rolled,
            );
        };
        if !proc.running() {
            lab.lock().unwrap().gateways[i].proc = Some(proc);
            return (
                format!("rolling upgrade: gateway host {host} had exited before its turn"),
                rolled,
            );
        }
        // The connections it holds (`totals.connections`); 0 if it does not say.
        let connections =
            stats(&format!("http://{admin}"), key).map_or(0, |s| s.totals.levels.connections);
        let workers = hongbao_lab::children_of(proc.pid());
        let told = clock.now();
        let exited = proc.terminate(DRAIN_WINDOW + PAST_WINDOW);
        let mut step = RolledGateway::drained(&host, connections, clock.now().since(told), exited);
        if !exited {
            for pid in workers {
                // SAFETY: kill(2) on ids read a moment ago as the killed gateway's children.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let starting = clock.now();
        let started = {
            let mut lab = lab.lock().unwrap();
            lab.gateways[i].exe = Some(to.to_path_buf());
            lab.start_gateway(i)
        };
        if let Err(e) = started {
            rolled.push(step);
            return (
                format!(
                    "rolling upgrade: gateway host {host} drained but did not start again: {e:#}"
                ),
                rolled,
            );
        }
        step.start_ms = Some(clock.now().since(starting).as_millis() as u64);
        rolled.push(step);
        if i + 1 < count {
            std::thread::sleep(READY_FOR);
        }
    }
    let steps: Vec<String> = rolled
        .iter()
        .map(|s| {
            format!(
                "{} let {} connections go in {} ms{} and was ready again {} ms later",
                s.host,
                s.connections,
                s.drain_ms,
                if s.drained_in_window {
                    String::new()
                } else {
                    format!(" (past its {} ms window: killed)", s.drain_window_ms)
                },
                s.start_ms.unwrap_or(0)
            )
        })
        .collect();
    (
        format!(
            "rolling upgrade: {count} gateways upgraded to {} one at a time (SIGTERM, drained, started again): {}",
            to.display(),
            steps.join("; ")
        ),
        rolled,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_drained_in_its_window_only_if_it_exited_within_it() {
        let window = DRAIN_WINDOW;
        let step = RolledGateway::drained("gw1", 500, window, true);
        assert_eq!(
            (step.drain_ms, step.drained_in_window),
            (window.as_millis() as u64, true)
        );
        assert_eq!(
            (step.host.as_str(), step.connections, step.start_ms),
            ("gw1", 500, None)
        );
        let late = RolledGateway::drained("gw1", 500, window + Duration::from_millis(1), true);
        assert!(!late.drained_in_window);
        let killed = RolledGateway::drained("gw1", 500, Duration::from_secs(1), false);
        assert!(!killed.drained_in_window, "killed past its window");
    }
}
