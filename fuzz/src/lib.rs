//! What the fuzz targets share: a global allocator that aborts the run when the code
//! under test makes one allocation over a limit, and the scoped limits the targets set
//! around each decoder call.
//!
//! The limit is armed only while a decoder runs ([`limited`]); the targets' own checks
//! (copies, re-encodings, owned copies of what was decoded) run [`unlimited`], so the
//! limit speaks about the decoder alone. An allocation over the limit prints its size,
//! the limit and a Rust backtrace, then calls `std::process::abort()`: libFuzzer reports
//! a deadly signal and saves the input under `fuzz/artifacts/<target>/`.
//!
//! libFuzzer runs each input on one thread, so one process-wide limit is enough.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// No limit.
const OFF: usize = usize::MAX;

/// The largest single allocation allowed right now, in bytes.
static LIMIT: AtomicUsize = AtomicUsize::new(OFF);

/// `std::alloc::System`, with every allocation's size checked against [`LIMIT`].
pub struct Guarded;

#[inline]
fn admit(size: usize) {
    let limit = LIMIT.load(Ordering::Relaxed);
    if size > limit {
        over_limit(size, limit);
    }
}

#[cold]
#[inline(never)]
fn over_limit(size: usize, limit: usize) -> ! {
    // Lift the limit first: printing and the backtrace allocate.
    LIMIT.store(OFF, Ordering::Relaxed);
    eprintln!("==hongbao-fuzz== allocation of {size} bytes over the limit of {limit} bytes");
    eprintln!("{}", std::backtrace::Backtrace::force_capture());
    std::process::abort()
}

// SAFETY: every call is forwarded unchanged to the system allocator; the size check
// only reads an atomic (or aborts the process).
unsafe impl GlobalAlloc for Guarded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        admit(layout.size());
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        admit(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        admit(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Guarded = Guarded;

/// Runs `f` with every single allocation limited to `limit` bytes (0: no allocation at
/// all), then restores the limit that was in force before.
pub fn limited<R>(limit: usize, f: impl FnOnce() -> R) -> R {
    lift_limit_on_panic();
    let before = LIMIT.swap(limit, Ordering::Relaxed);
    let r = f();
    LIMIT.store(before, Ordering::Relaxed);
    r
}

/// Runs `f` with no allocation limit (the targets' own bookkeeping inside a limited
/// call, e.g. owned copies of what a decoder hands to a callback).
pub fn unlimited<R>(f: impl FnOnce() -> R) -> R {
    limited(OFF, f)
}

/// A failed assertion inside a limited call must be reported as itself, not as the
/// allocation its panic message needs: wrap libfuzzer-sys's panic hook (installed before
/// the first input runs) in one that lifts the limit first.
fn lift_limit_on_panic() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let inner = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            LIMIT.store(OFF, Ordering::Relaxed);
            inner(info)
        }));
    });
}
