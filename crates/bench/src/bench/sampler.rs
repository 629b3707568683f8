//! The server sampled once a second through the run, on a thread of its own: the server
//! side of the series (its shakes a second, for each phase's server-side QPS), and its
//! memory and CPU for the summary's resources.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hongbao_sys::clock::UnixTime;

use super::server::{self, Server, ServerSample};

/// Where in each Unix second a sample is taken: the middle, away from the instants the
/// workers report their second (just after it starts).
const SAMPLE_AT: Duration = Duration::from_millis(500);
/// The least wait between two samples, should one fall right on `SAMPLE_AT`.
const LEAST_WAIT: Duration = Duration::from_millis(10);

pub(super) struct Sampler {
    samples: Arc<Mutex<Vec<ServerSample>>>,
    /// Cleared to stop the thread (after its current sample).
    sampling: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Sampler {
    /// Samples every gateway of `server` from now until `stop`.
    pub fn start(server: &Server) -> Sampler {
        let samples: Arc<Mutex<Vec<ServerSample>>> = Arc::default();
        let sampling = Arc::new(AtomicBool::new(true));
        let thread = {
            let (samples, sampling, admins, key) = (
                samples.clone(),
                sampling.clone(),
                server.admins.clone(),
                server.key.clone(),
            );
            std::thread::spawn(move || {
                while sampling.load(Ordering::Relaxed) {
                    if let Some(s) = server::sample_all(&admins, &key) {
                        samples.lock().unwrap().push(s);
                    }
                    std::thread::sleep(until_next_sample(UnixTime::now()));
                }
            })
        };
        Sampler {
            samples,
            sampling,
            thread,
        }
    }

    /// The server's shakes a second in the samples taken from `from` to before `to`.
    pub fn shake_rates(&self, from: UnixTime, to: UnixTime) -> Vec<f64> {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.at >= from && s.at < to)
            .map(|s| s.shakes_per_sec as f64)
            .collect()
    }

    /// Stops the thread and hands back every sample it took.
    pub fn stop(self) -> Vec<ServerSample> {
        self.sampling.store(false, Ordering::Relaxed);
        let _ = self.thread.join();
        let samples = self.samples.lock().unwrap().clone();
        samples
    }
}

/// How long from `now` to the next sample: to `SAMPLE_AT` in this second or the next.
fn until_next_sample(now: UnixTime) -> Duration {
    let into_second = Duration::from_millis(now.as_millis() % 1000);
    let second = Duration::from_secs(1);
    let wait = (second + SAMPLE_AT - into_second).as_millis() % second.as_millis();
    Duration::from_millis(wait as u64).max(LEAST_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_falls_in_the_middle_of_a_second() {
        let at = |ms| until_next_sample(UnixTime::from_millis(ms)).as_millis();
        assert_eq!(at(1_000_000_250), 250);
        assert_eq!(at(1_000_000_000), 500);
        assert_eq!(at(1_000_000_600), 900);
        assert_eq!(at(1_000_000_999), 501);
        // Right on the middle (or a moment short of it): not twice at once.
        assert_eq!(at(1_000_000_500), 10);
        assert_eq!(at(1_000_000_495), 10);
    }
}
