//! The process groups of every adapter running now, so an interrupt can end them all: the
//! harness's signal handler calls [`kill_all`], which only reads atomics and calls
//! `killpg`, both safe inside a signal handler.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// More adapters than any run starts at once; a group past this is not tracked (it still
/// dies with its `AdapterProcess`).
const SLOTS: usize = 256;

static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];

/// Set by [`kill_all`]: from then on no adapter may start (a process spawned while the
/// groups were being killed would outlive the run).
static ENDING: AtomicBool = AtomicBool::new(false);

/// Whether every adapter was ended (an interrupt): no new one may start.
pub fn ending() -> bool {
    ENDING.load(Ordering::SeqCst)
}

/// Track process group `pgid` until [`unregister`].
pub(crate) fn register(pgid: i32) {
    for slot in &GROUPS {
        if slot
            .compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

/// Stop tracking `pgid` (its process ended or was killed).
pub(crate) fn unregister(pgid: i32) {
    for slot in &GROUPS {
        let _ = slot.compare_exchange(pgid, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// SIGKILL every tracked adapter's process group, and refuse new ones from now on.
/// Async-signal-safe.
pub fn kill_all() {
    ENDING.store(true, Ordering::SeqCst);
    for slot in &GROUPS {
        let pgid = slot.load(Ordering::SeqCst);
        if pgid > 0 {
            // SAFETY: killpg has no memory effects; a stale group id fails with ESRCH.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

/// How many adapter groups are tracked now.
pub fn running() -> usize {
    GROUPS
        .iter()
        .filter(|s| s.load(Ordering::SeqCst) > 0)
        .count()
}
