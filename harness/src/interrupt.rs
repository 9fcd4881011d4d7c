//! Ctrl-C and SIGTERM during a run: the first one ends every adapter's process group at once
//! (a hung adapter cannot hold the run) and asks the run to stop between cases; the run then
//! keeps what it found (replay files are written as soon as a divergence is seen), prints its
//! partial summary and exits 130. A second signal ends attn-diff at once.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The exit status of an interrupted run (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    attn_backends::external::live::kill_all();
}

/// Install the handler for SIGINT and SIGTERM (once per process; later calls do nothing new).
pub fn install() {
    #[cfg(unix)]
    // SAFETY: the handler only stores an atomic and calls killpg (async-signal-safe);
    // SA_RESETHAND restores the default action, so a second signal ends the process.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut action.sa_mask);
        for sig in [libc::SIGINT, libc::SIGTERM] {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Whether the run was asked to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
