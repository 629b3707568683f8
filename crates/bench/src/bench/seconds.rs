//! The load's seconds as times: second 0 of a run starts at the load's epoch, a Unix time
//! every client process shares, and second `s` `s` seconds later. The phases, the fault
//! and the series are all told in these seconds; here they become `UnixTime`s and back,
//! so a loop reads the clock once and compares typed values, never raw milliseconds.

use std::time::Duration;

use hongbao_load::coordinator::Load;
use hongbao_sys::clock::UnixTime;

/// How often a wait for a second of the load looks at the clock again.
const POLL: Duration = Duration::from_millis(20);

/// The load's schedule of seconds, from its epoch.
#[derive(Debug, Clone, Copy)]
pub(super) struct RunSeconds {
    epoch: UnixTime,
}

impl RunSeconds {
    pub fn of(load: &Load) -> RunSeconds {
        RunSeconds::from_epoch(UnixTime::from_millis(load.epoch_ms()))
    }

    pub fn from_epoch(epoch: UnixTime) -> RunSeconds {
        RunSeconds { epoch }
    }

    /// When second 0 starts.
    pub fn epoch(self) -> UnixTime {
        self.epoch
    }

    /// When `second` starts.
    pub fn start_of(self, second: u64) -> UnixTime {
        self.epoch + Duration::from_secs(second)
    }

    /// The second `at` falls in (0 before the epoch).
    pub fn second_at(self, at: UnixTime) -> u64 {
        at.since(self.epoch).as_secs()
    }

    /// Sleeps until `second` has begun.
    pub fn wait_until(self, second: u64) {
        let at = self.start_of(second);
        while UnixTime::now() < at {
            std::thread::sleep(POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_is_told_from_the_epoch_and_back() {
        let s = RunSeconds::from_epoch(UnixTime::from_millis(1_000_000_250));
        assert_eq!(s.start_of(3), UnixTime::from_millis(1_000_003_250));
        assert_eq!(s.second_at(UnixTime::from_millis(1_000_003_249)), 2);
        assert_eq!(s.second_at(s.start_of(3)), 3);
        assert_eq!(
            s.second_at(UnixTime::from_millis(1_000_000_000)),
            0,
            "before the epoch"
        );
    }
}
