//! The process groups of every adapter running now, so an interrupt can end them all: the
//! harness's signal handler calls [`kill_all`], which only reads atomics and calls
//! `killpg`, both safe inside a signal handler.

use std::sync::atomic::{AtomicI32, Ordering};

/// More adapters than any run starts at once; a group past this is not tracked (it still
/// dies with its `AdapterProcess`).
const SLOTS: usize = 256;

static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];

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

/// SIGKILL every tracked adapter's process group. Async-signal-safe.
pub fn kill_all() {
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
