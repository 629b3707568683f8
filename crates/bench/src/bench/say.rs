//! The bench's own words to its operator: one line at a time on standard output, flushed
//! as it is said, so a run followed live (or by a test reading the pipe) sees each line
//! when it happens rather than when a buffer fills.

use std::io::Write;

/// Says `line` on standard output, at once.
pub(super) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
