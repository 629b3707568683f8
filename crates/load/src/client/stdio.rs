//! The client's talk with the coordinator: its commands as JSON lines on stdin, and a
//! report a second as JSON lines on stdout.

use std::io::{ErrorKind, Read, Write};

use hongbao_sys::clock::UnixTime;

use super::{Client, Command};
use crate::report::{self, Report};

impl Client {
    pub(super) fn read_commands(&mut self) {
        let mut chunk = [0u8; 4096];
        loop {
            match std::io::stdin().lock().read(&mut chunk) {
                Ok(0) => {
                    self.stop = true;
                    return;
                }
                Ok(n) => self.stdin_buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.stop = true;
                    return;
                }
            }
        }
        while let Some(end) = self.stdin_buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.stdin_buf.drain(..=end).collect();
            match serde_json::from_slice::<Command>(&line) {
                Ok(Command::SetQps { from_second, qps }) => self.schedule.set_qps(from_second, qps),
                Ok(Command::Clock { offset_us }) => self.opts.clock_offset_us = offset_us,
                Ok(Command::Stop) => self.stop = true,
                Err(e) => tracing::warn!(error = %e, "a bad command from the coordinator"),
            }
        }
    }

    /// Reports `second` at `now` (`last`: the run's last, with the per-user totals).
    pub(super) fn report(&mut self, second: u64, last: bool, now: UnixTime) {
        let (rss_bytes, cpu_ms) = self_usage();
        let users = last.then(|| self.totals.iter().map(|(k, v)| (*k, v.clone())).collect());
        let report = Report {
            proc_index: self.opts.proc_index,
            pid: std::process::id(),
            second,
            unix_ms: now.as_millis(),
            connected: self.connected,
            logged_in: self.logged_in,
            rss_bytes,
            cpu_ms,
            counters: self.counters.clone(),
            shake_latency_us: report::sparse(&self.shake_hist),
            served_latency_us: report::sparse(&self.served_hist),
            open_latency_us: report::sparse(&self.open_hist),
            send_lag_us: report::sparse(&self.lag_hist),
            broadcasts: self.receipts.drain(),
            users,
            history: std::mem::take(&mut self.history),
            last,
        };
        self.shake_hist.reset();
        self.served_hist.reset();
        self.open_hist.reset();
        self.lag_hist.reset();
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, &report);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }
}

pub(super) fn set_nonblocking(fd: i32) {
    // SAFETY: fcntl on a descriptor we own (stdin) with standard flags.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

fn self_usage() -> (u64, u64) {
    hongbao_sys::usage::self_usage()
}
