//! A running load's once-a-second feed to the hongbao monitor: every complete second
//! (all client processes reported) as a sample of role `load`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hongbao_telemetry::reporter::MONITOR_KEY_FILE;
use hongbao_telemetry::sample::{self, RoleSample, Sample};
use hongbao_telemetry::Reporter;

use super::rows::{Row, Shared};

/// Sends every complete second to a monitor, from a thread of its own.
pub(super) struct LoadMonitor {
    reporter: Reporter,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    net_interface: String,
}

impl LoadMonitor {
    pub(super) fn start(
        addr: &str,
        key: Option<String>,
        key_file: Option<std::path::PathBuf>,
        shared: Arc<Mutex<Shared>>,
        epoch_s: u64,
        server: SocketAddr,
    ) -> crate::Result<LoadMonitor> {
        let key = match key {
            Some(k) => Box::new(move || Some(k.clone())),
            None => Reporter::key_from(key_file.unwrap_or_else(|| MONITOR_KEY_FILE.into())),
        };
        let reporter = Reporter::start(addr, key);
        let stop = Arc::new(AtomicBool::new(false));
        let net_interface = sample::interface_for(server.ip());
        let (r, st, iface) = (reporter.clone(), stop.clone(), net_interface.clone());
        let thread = std::thread::Builder::new()
            .name("load-monitor".into())
            .spawn(move || {
                let mut next = 0;
                loop {
                    let stopping = st.load(Ordering::Relaxed);
                    let rows: Vec<Row> = {
                        let s = shared.lock().unwrap();
                        s.rows
                            .range(next..)
                            .map(|(_, row)| row)
                            .take_while(|row| s.complete(row))
                            .cloned()
                            .collect()
                    };
                    for row in rows {
                        next = row.second + 1;
                        r.send(load_sample(&row, epoch_s + row.second, &iface));
                    }
                    if stopping {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
            .map_err(|e| crate::Error::io("starting the load's monitor feed", e))?;
        Ok(LoadMonitor {
            reporter,
            stop,
            thread: Mutex::new(Some(thread)),
            net_interface,
        })
    }
}

impl LoadMonitor {
    /// Stops the once-a-second feed (after the seconds complete so far).
    pub(super) fn stop_sending(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }

    /// The run's last, partial second, delivered before returning.
    pub(super) fn send_final(&self, last: &Row, unix_second: u64) {
        self.reporter
            .send_final(&load_sample(last, unix_second, &self.net_interface));
    }
}

/// One second of the load as a monitor sample (role `load`).
fn load_sample(row: &Row, unix_second: u64, net_interface: &str) -> Sample {
    let c = &row.counters;
    let counters = [
        ("shakes", c.shakes_sent),
        ("won", c.won),
        ("nothing", c.nothing),
        ("overloaded", c.overloaded),
        ("opens", c.opens_sent),
        ("opened", c.opened),
        ("errors", c.errors()),
        ("broadcasts", row.broadcasts_seen),
        ("broadcast_delivered", c.broadcast_delivered),
    ];
    let levels = [
        ("connections", row.connected),
        ("logged_in", row.logged_in),
        ("rss_bytes", row.rss_bytes),
    ];
    Sample {
        instance: format!("load@{}:{}", sample::hostname(), std::process::id()),
        host: sample::hostname(),
        unix_second,
        roles: std::iter::once(RoleSample {
            role: "load".into(),
            processes: row.reports,
            cpu_ms: row.cpu_ms,
            counters: sample::named(&counters),
            levels: sample::named(&levels),
            latency_us: row.shake_latency.clone(),
        })
        .chain(sample::host_role())
        .collect(),
        net: sample::read_net(net_interface),
    }
}
