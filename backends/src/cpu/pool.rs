//! Helper threads that spin for a short while between calls.
//!
//! A forward call of 20–300 µs (small batches, cache-resident decode) cannot afford to wake
//! a sleeping thread through a futex: that alone costs tens of microseconds, and a general
//! pool (rayon) parks its threads as soon as they run out of work. vLLM's kernel runs in
//! OpenMP, whose threads spin between parallel regions. Here helpers spin for [`SPIN`] after
//! each call (yielding the core after the first part of it), then sleep on a condition
//! variable; back-to-back calls (decode steps, a benchmark) find them awake.
//!
//! The caller never waits for a helper to *start*: the job must let whoever is running claim
//! any of its work (the backend deals items with stealing, `claims`), helpers join a call
//! only while it is open, and the caller closes the call when its own share is done, then
//! waits only for the helpers that joined.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle helper stays awake after a call: the first quarter busy-spinning, the
/// rest yielding its core to anything else runnable.
const SPIN: Duration = Duration::from_micros(400);

/// The job of the open call: a closure on the caller's stack, lifetime erased. Only read by
/// helpers that joined the call, and the caller does not return before they have left it.
type Job = *const (dyn Fn(usize) + Sync + 'static);

/// `state`: call epoch in the high 32 bits, [`CLOSED`], then the number of helpers inside.
const CLOSED: u64 = 1 << 31;
const JOINED_MASK: u64 = CLOSED - 1;

fn epoch(state: u64) -> u64 {
    state >> 32
}

struct Shared {
    state: AtomicU64,
    job: UnsafeCell<Option<Job>>,
    /// A helper's job panicked during the current call.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

// SAFETY: `job` is written only by the caller holding `Pool::caller`, while no helper is
// inside a call (the previous call was closed and its joined count drained to 0), and read
// only by helpers that joined the open call (an Acquire CAS after the caller's SeqCst
// publication of the state). The closure it points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    /// One call at a time; a concurrent caller runs its work alone.
    caller: Mutex<()>,
    helpers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool with `helpers` threads (indices 1..=helpers; the caller is index 0). Threads
    /// that cannot be spawned are left out: their share of the work goes to the others.
    pub fn new(helpers: usize) -> Pool {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(None),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let helpers = (1..=helpers)
            .filter_map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("attn-cpu-{index}"))
                    .spawn(move || helper(&shared, index))
                    .ok()
            })
            .collect();
        Pool {
            shared,
            caller: Mutex::new(()),
            helpers,
        }
    }

    /// Every helper sleeps (no call for longer than [`SPIN`]): a call now pays a wake-up.
    pub fn asleep(&self) -> bool {
        self.shared.sleepers.load(Ordering::SeqCst) >= self.helpers.len()
    }

    /// Run `work(index)` on the calling thread (index 0) and on every helper that wakes in
    /// time. `work` must finish the whole job whatever number of threads runs it (any thread
    /// may claim any piece). A panic in any thread is resumed here.
    pub fn run(&self, work: &(dyn Fn(usize) + Sync)) {
        let Ok(_one_call) = self.caller.try_lock() else {
            work(0);
            return;
        };
        let sh = &*self.shared;
        // SAFETY: lifetime erasure only; the pointer is not used after this call returns
        // (see `Shared`).
        let job: Job = unsafe { std::mem::transmute(work as *const (dyn Fn(usize) + Sync)) };
        // SAFETY: no helper is inside a call (invariant between calls), so none reads `job`.
        unsafe { *sh.job.get() = Some(job) };
        let open = (epoch(sh.state.load(Ordering::Relaxed)) + 1) << 32;
        sh.state.store(open, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }

        let mine = catch_unwind(AssertUnwindSafe(|| work(0)));

        sh.state.fetch_or(CLOSED, Ordering::AcqRel);
        let start = Instant::now();
        while sh.state.load(Ordering::Acquire) & JOINED_MASK != 0 {
            pause(start);
        }
        // SAFETY: closed with no helper inside: nobody reads `job` until the next call.
        unsafe { *sh.job.get() = None };
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        let theirs = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = theirs {
            resume_unwind(payload);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        for handle in self.helpers.drain(..) {
            let _ = handle.join();
        }
    }
}

/// Spin politely: a CPU hint at first, then give the core away between checks.
fn pause(since: Instant) {
    std::hint::spin_loop();
    if since.elapsed() > SPIN / 4 {
        std::thread::yield_now();
    }
}

fn helper(sh: &Shared, index: usize) {
    let mut seen = 0;
    while let Some(state) = next_call(sh, seen) {
        seen = epoch(state);
        if !join(sh, state) {
            continue;
        }
        // SAFETY: joined the open call, so the caller keeps the job alive until we leave.
        let job = unsafe { (*sh.job.get()).expect("an open call has a job") };
        // SAFETY: as above; the closure is `Sync`, so calling it from here is allowed.
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(index) })) {
            *sh.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(payload);
        }
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

/// Enter the call `state` names, unless it has been closed or replaced meanwhile.
fn join(sh: &Shared, mut state: u64) -> bool {
    let call = epoch(state);
    loop {
        if epoch(state) != call || state & CLOSED != 0 {
            return false;
        }
        match sh
            .state
            .compare_exchange_weak(state, state + 1, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(now) => state = now,
        }
    }
}

/// Wait for an open call newer than `seen`: spin, then sleep. `None` on shutdown.
fn next_call(sh: &Shared, seen: u64) -> Option<u64> {
    let is_new = |s: u64| epoch(s) != seen && s & CLOSED == 0;
    let start = Instant::now();
    while start.elapsed() < SPIN {
        for _ in 0..64 {
            let s = sh.state.load(Ordering::Acquire);
            if is_new(s) {
                return Some(s);
            }
            std::hint::spin_loop();
        }
        if sh.shutdown.load(Ordering::Relaxed) {
            return None;
        }
        pause(start);
    }
    let mut guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
    sh.sleepers.fetch_add(1, Ordering::SeqCst);
    let found = loop {
        if sh.shutdown.load(Ordering::SeqCst) {
            break None;
        }
        let s = sh.state.load(Ordering::SeqCst);
        if is_new(s) {
            break Some(s);
        }
        guard = sh.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    };
    sh.sleepers.fetch_sub(1, Ordering::SeqCst);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_to(pool: &Pool, n: usize) -> Vec<usize> {
        let next = AtomicUsize::new(0);
        let done: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        pool.run(&|_thread| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = done.get(i) else { break };
            slot.fetch_add(1, Ordering::Relaxed);
        });
        done.iter().map(|d| d.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn every_piece_runs_exactly_once_call_after_call() {
        let pool = Pool::new(3);
        for call in 0..2000 {
            assert!(count_to(&pool, call % 97).iter().all(|&c| c == 1));
        }
    }

    #[test]
    fn helpers_asleep_are_woken_and_take_work() {
        let pool = Pool::new(1);
        let start = Instant::now();
        while !pool.asleep() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "helper never went to sleep"
            );
            std::thread::sleep(SPIN);
        }
        let threads = Mutex::new(std::collections::BTreeSet::new());
        let next = AtomicUsize::new(0);
        pool.run(&|thread| {
            while next.fetch_add(1, Ordering::Relaxed) < 200 {
                threads.lock().unwrap().insert(thread);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        assert_eq!(threads.into_inner().unwrap().len(), 2);
    }

    #[test]
    fn concurrent_callers_each_finish_their_own_work() {
        let pool = Pool::new(1);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        assert!(count_to(&pool, 50).iter().all(|&c| c == 1));
                    }
                });
            }
        });
    }

    #[test]
    fn a_helper_panic_reaches_the_caller() {
        let pool = Pool::new(1);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|thread| {
                if thread == 1 {
                    panic!("helper failed");
                }
                // Keep the call open until the helper has joined and panicked.
                while pool.shared.panic.lock().is_ok_and(|p| p.is_none()) {
                    std::hint::spin_loop();
                }
            })
        }));
        assert!(result.is_err());
        // The pool still works afterwards.
        assert!(count_to(&pool, 10).iter().all(|&c| c == 1));
    }
}
