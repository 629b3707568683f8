//! `disk-full`'s disk: the bench's server ledger on a small tmpfs that the bench mounts
//! for the run (root) and unmounts at its end, sized here; the tmpfs and its filler are
//! `hongbao_lab::disk`'s, shared with the lab's `postgres-disk-full`.

use super::options::BenchOptions;

/// The least room the ledger's tmpfs gets, whatever the run.
const MIN_BYTES: u64 = 64 << 20;
/// Room per ledger event a run may write: an event row, its index entry and the balance
/// it moves take a few hundred bytes; the rest is for the WAL.
const BYTES_PER_EVENT: u64 = 1 << 10;

/// The room the ledger's tmpfs gets for `opts`: 64 MiB, and more for runs whose
/// campaigns write more events (a win per shake packet, a send and its opens per send
/// packet, each phase).
pub(super) fn bytes_for(opts: &BenchOptions) -> u64 {
    let per_phase = u64::from(opts.shake_packets)
        + u64::from(opts.send_packets) * (1 + u64::from(opts.recipients));
    MIN_BYTES + per_phase * opts.phase_qps.len() as u64 * BYTES_PER_EVENT
}

pub(super) use hongbao_lab::disk::{fill, SmallDisk};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledgers_disk_grows_with_the_campaigns() {
        let mut opts = BenchOptions::preset(super::super::Preset::Quick);
        opts.phase_qps = vec![1000];
        opts.shake_packets = 0;
        opts.send_packets = 0;
        assert_eq!(bytes_for(&opts), 64 << 20);
        opts.shake_packets = 100;
        opts.send_packets = 10;
        opts.recipients = 3;
        opts.phase_qps = vec![1000, 2000];
        assert_eq!(bytes_for(&opts), (64 << 20) + 2 * 140 * 1024);
    }
}
