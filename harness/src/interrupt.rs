//! Ctrl-C and SIGTERM during a run: the first one ends every adapter's process group at once
//! (a hung adapter cannot hold the run) and asks the run to stop between cases; the run then
//! keeps what it found (replay files are written as soon as a divergence is seen), prints its
//! partial summary and exits 130.
//!
//! The same request often arrives twice: `timeout` signals the process and then its whole
//! process group, a service manager signals the main process and then its cgroup. A repeat
//! within [`REPEAT_WINDOW_NS`] of the first is that same request and changes nothing; a later
//! one (a person pressing Ctrl-C again) ends attn-diff at once, saying so on stderr. The
//! handler stays installed throughout: no default action can end the run silently.

use std::sync::atomic::{AtomicU64, Ordering};

/// When the first signal arrived (`CLOCK_MONOTONIC` nanoseconds, at least 1); 0 until then.
static FIRST_SIGNAL_NS: AtomicU64 = AtomicU64::new(0);

/// The exit status of an interrupted run (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// A signal this soon after the first is the same request delivered twice.
pub const REPEAT_WINDOW_NS: u64 = 1_000_000_000;

/// What a second, deliberate interrupt writes before attn-diff ends.
const ENDING_AT_ONCE: &[u8] =
    b"\nattn-diff: interrupted again: exiting at once, without a summary\n";

/// `CLOCK_MONOTONIC` in nanoseconds, never 0 (async-signal-safe).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes only into `ts`.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .max(1)
}

/// What a signal arriving at `now` does, given the first one's time (0: none yet).
#[derive(Debug, PartialEq, Eq)]
enum Response {
    /// The first: stop the run.
    Stop,
    /// The same request again: nothing more to do.
    Repeat,
    /// A new request while stopping: end at once.
    EndNow,
}

fn respond(first: u64, now: u64) -> Response {
    if first == 0 {
        Response::Stop
    } else if now.saturating_sub(first) < REPEAT_WINDOW_NS {
        Response::Repeat
    } else {
        Response::EndNow
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    let now = monotonic_ns();
    let first = match FIRST_SIGNAL_NS.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => 0,
        Err(first) => first,
    };
    match respond(first, now) {
        Response::Stop => attn_backends::external::live::kill_all(),
        Response::Repeat => {}
        // SAFETY: write and _exit are async-signal-safe; the adapters were killed by the
        // first signal.
        Response::EndNow => unsafe {
            libc::write(
                libc::STDERR_FILENO,
                ENDING_AT_ONCE.as_ptr().cast(),
                ENDING_AT_ONCE.len(),
            );
            libc::_exit(i32::from(EXIT_INTERRUPTED));
        },
    }
}

/// Install the handler for SIGINT and SIGTERM (once per process; later calls do nothing new).
/// A check installs it before anything else it does, so no adapter starts without it.
pub fn install() {
    #[cfg(unix)]
    // SAFETY: the handler only touches atomics and calls async-signal-safe functions
    // (clock_gettime, killpg, write, _exit). SA_RESTART keeps a signal from failing the
    // pipes' reads and writes with EINTR.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        for sig in [libc::SIGINT, libc::SIGTERM] {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Whether the run was asked to stop.
pub fn interrupted() -> bool {
    FIRST_SIGNAL_NS.load(Ordering::SeqCst) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_of_the_first_signal_is_not_a_second_interrupt() {
        assert_eq!(respond(0, 5), Response::Stop);
        // `timeout` signals the process, then its group, microseconds apart.
        assert_eq!(respond(5, 5 + 1_000), Response::Repeat);
        assert_eq!(respond(5, 5 + REPEAT_WINDOW_NS - 1), Response::Repeat);
        assert_eq!(respond(5, 5 + REPEAT_WINDOW_NS), Response::EndNow);
    }
}
