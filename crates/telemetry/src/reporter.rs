//! Sends an instance's samples to a monitor from a thread of its own, so a slow or absent
//! monitor never holds up the process that reports.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::Duration;

use crate::sample::Sample;

/// Samples waiting to be sent; beyond this the newest are dropped (counters are
/// cumulative, so the next one that gets through carries their counts).
const QUEUE: usize = 64;

#[derive(Clone)]
pub struct Reporter {
    tx: SyncSender<Sample>,
    url: String,
}

impl Reporter {
    /// Starts the sending thread for the monitor at `addr` (`host:port`).
    pub fn start(addr: &str) -> Reporter {
        let (tx, rx) = sync_channel::<Sample>(QUEUE);
        let url = format!("http://{addr}/v1/report");
        let thread_url = url.clone();
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(2))
            .build();
        std::thread::Builder::new()
            .name("monitor-reporter".into())
            .spawn(move || {
                let mut failing = false;
                for sample in rx {
                    match agent.post(&thread_url).send_json(&sample) {
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
        Reporter { tx, url }
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
        let _ = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(3))
            .build()
            .post(&self.url)
            .send_json(sample);
    }
}
