//! The threads one backend call may use besides its caller. A check (`--jobs N`) uses N
//! cores: N workers each run cases, so a multi-threaded kernel called from each of them would
//! only fight its siblings for the cores, and with one job it would make `--jobs 1` more than
//! one core. In a check every call runs on its caller alone. Its work plan is unchanged (the
//! `cpu` backend still splits as for all its threads; libtorch runs one thread in every
//! caller), so its output, bit for bit, does not depend on the number of jobs.

use std::sync::atomic::{AtomicBool, Ordering};

static CALLER_ONLY: AtomicBool = AtomicBool::new(false);

/// From now on, backend calls run on their calling thread alone (`true`), or may wake
/// helper threads (`false`, the default).
pub fn set_caller_only(on: bool) {
    CALLER_ONLY.store(on, Ordering::Relaxed);
}

/// Whether backend calls run on their calling thread alone.
pub fn caller_only() -> bool {
    CALLER_ONLY.load(Ordering::Relaxed)
}
