//! The bench's first step: its output directory, the ledger's own tmpfs for `disk-full`,
//! the monitor (the dashboard and the series), the server (a local one, a lab, or a
//! running deployment), its baseline sample, and the sampler. What it starts is the
//! `Bench` the later steps work with.

use std::path::Path;
use std::time::Duration;

use hongbao_monitor::Monitor;
use hongbao_sys::clock::Clock;

use super::disk::{self, SmallDisk};
use super::options::BenchOptions;
use super::sampler::Sampler;
use super::say::say;
use super::server::{Server, ServerSample};
use crate::{Error, Result};

/// How long a server just started is left before its baseline is sampled: its workers
/// up and their first per-second report written, so the baseline is the idle server's
/// memory and CPU, not a half-started one's.
const SERVER_SETTLE: Duration = Duration::from_millis(1500);

/// What the bench started, and what it was asked to do. The fields drop in order: the
/// server before the monitor, and the ledger's tmpfs last, so a run that ends on an
/// error still stops its server and gives the disk back.
pub(super) struct Bench<'a> {
    pub opts: &'a BenchOptions,
    /// The bench's own clock, for its waits and deadlines.
    pub clock: Clock,
    pub sampler: Sampler,
    pub server: Server,
    /// The server's sample before any load.
    pub server_baseline: ServerSample,
    pub monitor: Monitor,
    /// `disk-full`'s tmpfs under the ledger; unmounted when the bench ends.
    pub small_disk: Option<SmallDisk>,
}

impl<'a> Bench<'a> {
    /// Makes `opts.out` ready and starts the monitor, the server and the sampler.
    pub fn set_up(opts: &'a BenchOptions) -> Result<Bench<'a>> {
        let clock = Clock::start();
        std::fs::create_dir_all(&opts.out)
            .map_err(|e| Error::io(format!("creating {}", opts.out.display()), e))?;
        let data_dir = opts.out.join("data");
        if data_dir.exists() {
            SmallDisk::clear_stale(&data_dir);
            std::fs::remove_dir_all(&data_dir)
                .map_err(|e| Error::io("clearing the previous bench's ledger", e))?;
        }
        let small_disk = small_disk(opts, &data_dir)?;
        let monitor = Monitor::start(opts.monitor_listen, Some(&opts.out), "hongbao bench")?;
        say(&format!(
            "bench: dashboard at http://{}/ ; series in {}",
            monitor.addr(),
            opts.out.join("series.csv").display()
        ));
        monitor.mark("start");
        say(&starting(opts, &data_dir));
        let server = Server::start(opts, &data_dir, monitor.addr(), monitor.key())?;
        std::thread::sleep(SERVER_SETTLE);
        let server_baseline = server.sample()?;
        let sampler = Sampler::start(&server);
        Ok(Bench {
            opts,
            clock,
            sampler,
            server,
            server_baseline,
            monitor,
            small_disk,
        })
    }
}

/// `disk-full` fills a tmpfs of the ledger's own (a local server's only).
fn small_disk(opts: &BenchOptions, data_dir: &Path) -> Result<Option<SmallDisk>> {
    if opts.hosts == 0 && opts.faults().any(|f| f.needs_small_disk()) {
        let disk = SmallDisk::mount(data_dir, disk::bytes_for(opts))?;
        say(&format!(
            "bench: disk-full: the ledger is on a {} MiB tmpfs of its own",
            disk.bytes >> 20
        ));
        Ok(Some(disk))
    } else {
        Ok(None)
    }
}

/// What the bench is about to load, in a line.
fn starting(opts: &BenchOptions, data_dir: &Path) -> String {
    if let Some(t) = &opts.target {
        format!(
            "bench: loading the running deployment: clients to {}, admin API at {}",
            t.clients, t.admin
        )
    } else if opts.hosts > 0 {
        format!(
            "bench: bringing up a lab of {} gateway hosts (workers {}) in cluster mode, nginx in front; its files in {}",
            opts.hosts,
            opts.workers,
            opts.out.join("lab").display()
        )
    } else {
        format!(
            "bench: starting hongbao serve (workers {}), ledger in {}",
            opts.workers,
            data_dir.display()
        )
    }
}
