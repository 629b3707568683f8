//! The stop value: handed to every loop that must end in order, instead of a global flag
//! each polls. Cloning it shares it; `request` stops every holder. `on_signals` makes
//! SIGINT and SIGTERM request it (signal-hook stores to the flag, which is all a signal
//! handler may safely do), so Ctrl-C ends `serve`, `load`, `bench` and `monitor` in order.
//! It remembers which: SIGTERM (systemd's, Kubernetes', podman's stop) asks `serve` to
//! drain first (`gently`), SIGINT and `request` to stop at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use signal_hook::consts::SIGUSR2;

#[derive(Debug, Clone, Default)]
pub struct Stop {
    /// SIGINT, or `request`: stop now.
    now: Arc<AtomicBool>,
    /// SIGTERM: stop, gently where the holder knows how.
    term: Arc<AtomicBool>,
}

impl Stop {
    /// A stop nobody has requested yet.
    pub fn new() -> Stop {
        Stop::default()
    }

    /// A stop that SIGINT and SIGTERM request (from now on; the signals no longer kill).
    pub fn on_signals() -> std::io::Result<Stop> {
        let stop = Stop::new();
        signal_hook::flag::register(signal_hook::consts::SIGINT, stop.now.clone())?;
        signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.term.clone())?;
        Ok(stop)
    }

    pub fn request(&self) {
        self.now.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for, either way.
    pub fn requested(&self) -> bool {
        self.now.load(Ordering::SeqCst) || self.term.load(Ordering::SeqCst)
    }

    /// Whether the stop asked for is SIGTERM's alone: a holder that can end gently (a
    /// server draining its connections) does, until SIGINT or `request` says now.
    pub fn gently(&self) -> bool {
        self.term.load(Ordering::SeqCst) && !self.now.load(Ordering::SeqCst)
    }
}

/// A reload asked for: SIGHUP sets it, the loop that owns the configuration takes it
/// (`take`) and reads its files again.
#[derive(Debug, Clone, Default)]
pub struct Reload(Arc<AtomicBool>);

impl Reload {
    /// A reload SIGHUP asks for (from now on; the signal no longer kills).
    pub fn on_sighup() -> std::io::Result<Reload> {
        let reload = Reload::default();
        signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.0.clone())?;
        Ok(reload)
    }

    /// One that `signal` asks for (SIGUSR2: an upgrade), the same way.
    pub fn on_signal(signal: i32) -> std::io::Result<Reload> {
        let asked = Reload::default();
        signal_hook::flag::register(signal, asked.0.clone())?;
        Ok(asked)
    }

    /// Whether a reload was asked for since the last `take`.
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sighup_asks_for_one_reload() {
        let reload = Reload::on_sighup().unwrap();
        assert!(!reload.take());
        // SAFETY: raising a signal this process handles (registered just above).
        unsafe { libc::raise(libc::SIGHUP) };
        assert!(reload.take());
        assert!(!reload.take(), "taken");
    }

    #[test]
    fn clones_share_one_stop() {
        let stop = Stop::new();
        let loop_side = stop.clone();
        assert!(!loop_side.requested());
        stop.request();
        assert!(loop_side.requested());
    }

    #[test]
    fn a_signal_requests_it_and_sigterm_alone_gently() {
        let stop = Stop::on_signals().unwrap();
        assert!(!stop.requested() && !stop.gently());
        // SAFETY: raise(2) sends a signal to this process, whose handler only stores.
        unsafe { libc::raise(libc::SIGTERM) };
        assert!(stop.requested());
        assert!(stop.gently());
        // SAFETY: as above.
        unsafe { libc::raise(libc::SIGINT) };
        assert!(stop.requested());
        assert!(!stop.gently(), "SIGINT after SIGTERM: now");
    }
}
