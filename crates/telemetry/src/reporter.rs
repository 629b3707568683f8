//! Sends an instance's samples to a monitor from a thread of its own, so a slow or absent
//! monitor never holds up the process that reports. The monitor takes reports only with
//! its run's key (`Authorization: Bearer`): the reporter asks for it until it has it, so
//! an instance may start before its monitor has made the key.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::Duration;

use crate::sample::Sample;

/// The environment variable that gives a monitor's key to the processes reporting to it.
pub const MONITOR_KEY_ENV: &str = "HONGBAO_MONITOR_KEY";
/// Where `hongbao monitor` keeps its key, and reporters look for it, unless told.
pub const MONITOR_KEY_FILE: &str = "hongbao-monitor.key";

/// Samples waiting to be sent; beyond this the newest are dropped (counters are
/// cumulative, so the next one that gets through carries their counts).
const QUEUE: usize = 64;

/// Where a reporter finds the monitor's key (none yet: asked again at the next send).
pub type KeySource = Box<dyn Fn() -> Option<String> + Send + Sync>;

#[derive(Clone)]
pub struct Reporter {
    tx: SyncSender<Sample>,
    url: String,
    key: std::sync::Arc<KeySource>,
}

impl Reporter {
    /// Starts the sending thread for the monitor at `addr` (`host:port`, or
    /// `https://host:port` for a monitor speaking TLS: the CA in `HONGBAO_TLS_CA`), whose
    /// key `key` gives.
    pub fn start(addr: &str, key: KeySource) -> Reporter {
        let (tx, rx) = sync_channel::<Sample>(QUEUE);
        let url = match addr.starts_with("https://") || addr.starts_with("http://") {
            true => format!("{addr}/v1/report"),
            false => format!("http://{addr}/v1/report"),
        };
        let thread_url = url.clone();
        let key = std::sync::Arc::new(key);
        let thread_key = key.clone();
        let agent = hongbao_http::tls::agent_builder()
            .timeout(Duration::from_secs(2))
            .build();
        std::thread::Builder::new()
            .name("monitor-reporter".into())
            .spawn(move || {
                let mut failing = false;
                for sample in rx {
                    let mut post = agent.post(&thread_url);
                    if let Some(k) = thread_key() {
                        post = post.set("Authorization", &format!("Bearer {k}"));
                    }
                    match post.send_json(&sample) {
                        Ok(_) => failing = false,
                        Err(e) if !failing => {
                            tracing::warn!(monitor = %thread_url, error = %e, "reporting to the monitor failed; will keep trying");
                            failing = true;
                        }
                        Err(_) => {}
                    }
                }
            })
            .expect("spawn the monitor reporter");
        Reporter { tx, url, key }
    }

    /// Queues a sample; never blocks.
    pub fn send(&self, sample: Sample) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(sample) {
            // Dropped: see QUEUE.
        }
    }

    /// Sends a sample and waits (up to a few seconds) until it is delivered, for the last
    /// report of a run.
    pub fn send_final(&self, sample: &Sample) {
        let mut post = hongbao_http::tls::agent_builder()
            .timeout(Duration::from_secs(3))
            .build()
            .post(&self.url);
        if let Some(k) = (self.key)() {
            post = post.set("Authorization", &format!("Bearer {k}"));
        }
        let _ = post.send_json(sample);
    }

    /// The key source of a monitor whose key is in environment variable
    /// `HONGBAO_MONITOR_KEY`, else in `file` (made by `hongbao monitor`).
    pub fn key_from(file: std::path::PathBuf) -> KeySource {
        Box::new(move || {
            hongbao_http::access::run_key(MONITOR_KEY_ENV, &file, false)
                .ok()
                .flatten()
        })
    }
}
