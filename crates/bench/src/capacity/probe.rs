//! CPU and network of every instance of every layer, read from /proc once a second:
//! `/proc/PID/stat` (user + system time) for CPU, `/proc/PID/net/dev` for the network of
//! the namespace the instance's first process is in (a lab host's own interface), and
//! `/proc/stat` plus the machine's own `/proc/net/dev` for the `machine` row.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One instance of a layer: a process, or a host's processes summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub layer: String,
    pub instance: String,
    /// Empty for the `machine` row (the whole machine).
    pub pids: Vec<u32>,
    /// The first process is in a namespace of its own: its interfaces are the instance's.
    pub has_net: bool,
}

impl Watched {
    pub fn new(layer: &str, instance: impl Into<String>, pids: Vec<u32>, has_net: bool) -> Self {
        Watched {
            layer: layer.into(),
            instance: instance.into(),
            pids,
            has_net,
        }
    }

    /// The whole machine: every core's busy time, and every interface of this namespace
    /// (loopback included: on one machine the layers talk over it).
    pub fn machine() -> Watched {
        Watched::new("machine", "all", Vec::new(), true)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InstanceSample {
    /// CPU time used so far, ms (summed over the instance's processes).
    pub cpu_ms: u64,
    pub net_in_bytes: u64,
    pub net_out_bytes: u64,
}

/// Every watched instance at one moment, in the order watched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    pub unix_ms: u64,
    pub instances: Vec<InstanceSample>,
}

/// Received and sent bytes over the interfaces of `/proc/{who}/net/dev`, loopback left
/// out unless `with_lo`.
fn net_bytes(who: &str, with_lo: bool) -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{who}/net/dev")) else {
        return (0, 0);
    };
    let mut sum = (0, 0);
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if name.trim() == "lo" && !with_lo {
            continue;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if f.len() >= 9 {
            sum.0 += f[0];
            sum.1 += f[8];
        }
    }
    sum
}

/// Busy CPU time of the whole machine, ms (`/proc/stat`: all but idle and iowait).
fn machine_busy_ms() -> u64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().next() else {
        return 0;
    };
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    if f.len() < 5 {
        return 0;
    }
    // user nice system idle iowait irq softirq steal; USER_HZ = 100.
    let total: u64 = f.iter().take(8).sum();
    (total - f[3] - f[4]) * 10
}

pub fn sample(watched: &[Watched]) -> Sample {
    let instances = watched
        .iter()
        .map(|w| {
            if w.pids.is_empty() {
                let (rx, tx) = net_bytes("self", true);
                return InstanceSample {
                    cpu_ms: machine_busy_ms(),
                    net_in_bytes: rx,
                    net_out_bytes: tx,
                };
            }
            let cpu_ms = w
                .pids
                .iter()
                .map(|p| hongbao_sys::usage::usage_of(&p.to_string()).1)
                .sum();
            let (rx, tx) = if w.has_net {
                net_bytes(&w.pids[0].to_string(), false)
            } else {
                (0, 0)
            };
            InstanceSample {
                cpu_ms,
                net_in_bytes: rx,
                net_out_bytes: tx,
            }
        })
        .collect();
    Sample {
        unix_ms: hongbao_sys::clock::unix_ms(),
        instances,
    }
}

/// Samples `watched` once a second (at each whole second) until dropped.
pub struct Probe {
    pub samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Probe {
    pub fn start(watched: Vec<Watched>) -> crate::Result<Probe> {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (out, halt) = (samples.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("capacity-probe".into())
            .spawn(move || {
                while !halt.load(Ordering::Relaxed) {
                    out.lock().unwrap().push(sample(&watched));
                    let ms = hongbao_sys::clock::unix_ms() % 1000;
                    std::thread::sleep(Duration::from_millis(1000 - ms));
                }
            })
            .map_err(|e| crate::Error::io("starting the capacity probe's thread", e))?;
        Ok(Probe {
            samples,
            stop,
            thread: Some(thread),
        })
    }

    /// Samples from the last one at or before `from_ms` to the first at or after `to_ms`.
    pub fn between(&self, from_ms: u64, to_ms: u64) -> Vec<Sample> {
        let all = self.samples.lock().unwrap();
        let start = all.iter().rposition(|s| s.unix_ms <= from_ms).unwrap_or(0);
        let end = all
            .iter()
            .position(|s| s.unix_ms >= to_ms)
            .map_or(all.len(), |e| e + 1);
        all[start..end.max(start)].to_vec()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_and_the_machine_are_read() {
        let me = Watched::new("test", "me", vec![std::process::id()], false);
        let a = sample(&[me.clone(), Watched::machine()]);
        // Burn some CPU so the counters move.
        let until = std::time::Instant::now() + Duration::from_millis(60);
        let mut x = 0u64;
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = sample(&[me, Watched::machine()]);
        assert!(
            b.instances[0].cpu_ms >= a.instances[0].cpu_ms + 20,
            "{a:?} {b:?}"
        );
        assert!(b.instances[1].cpu_ms >= a.instances[1].cpu_ms);
        assert!(b.unix_ms >= a.unix_ms);
        // The machine row counts loopback: this namespace has one.
        assert!(b.instances[1].net_in_bytes >= a.instances[1].net_in_bytes);
    }
}
