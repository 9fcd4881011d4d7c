//! Shrinks whose every try may be slow: a timeout's (each try can hang for the whole
//! timeout, each in a fresh adapter) and a crash's (each try can cost a restart). Both try
//! at most [`SLOW_SHRINK_STEPS`] candidates; a timeout's shrink is also bounded in time: its
//! tries get a limit scaled to the slowest call that answered ([`TimeoutShrink::per_try`]),
//! the whole shrink takes at most [`TIMEOUTS_IN_ALL`] times the backend's timeout, and its
//! smallest case is not run again (its last try timed out just now, under the same limit).

use crate::pipeline::shrink::ShrinkBudget;
use attn_backends::Backend;
use attn_results::{DivergenceKind, ShrinkInfo, ShrinkLimits};
use std::time::{Duration, Instant};

/// Candidates a shrink of a timeout or a crash may try: its report says when this ended it.
pub const SLOW_SHRINK_STEPS: usize = 16;

/// A try of a timeout's shrink may take this many times the slowest call that answered...
pub const PER_TRY_FACTOR: u32 = 10;
/// ...and never less than this (a loaded machine, a restart's first call), nor more than
/// the backend's timeout.
pub const PER_TRY_FLOOR: Duration = Duration::from_secs(2);
/// A timeout's whole shrink takes at most this many of the backend's timeouts.
pub const TIMEOUTS_IN_ALL: u32 = 1;

/// How the shrink of one timeout is bounded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimeoutShrink {
    /// The limit of each try.
    pub per_try: Duration,
    /// The most the whole shrink takes.
    pub in_all: Duration,
}

impl TimeoutShrink {
    /// The bounds for a shrink of `backend`'s timeout, or `None` when it enforces no timeout.
    /// With no call answered yet, a try gets the whole timeout (nothing says less is
    /// enough), so no try fits in the shrink's time and the case is reported as found.
    pub fn of(backend: &dyn Backend) -> Option<TimeoutShrink> {
        let timeout = backend.call_timeout()?;
        Some(TimeoutShrink::scaled(timeout, backend.slowest_answer()))
    }

    /// The bounds for a backend of `timeout` whose slowest answer so far took `slowest`.
    pub fn scaled(timeout: Duration, slowest: Option<Duration>) -> TimeoutShrink {
        let per_try = slowest
            .map_or(timeout, |s| (s * PER_TRY_FACTOR).max(PER_TRY_FLOOR))
            .min(timeout);
        TimeoutShrink {
            per_try,
            in_all: timeout * TIMEOUTS_IN_ALL,
        }
    }

    /// The latest moment a try may start, for a shrink starting `now`: the last try still
    /// ends within [`TimeoutShrink::in_all`].
    pub fn tries_until(&self, now: Instant) -> Instant {
        now + self.in_all.saturating_sub(self.per_try)
    }

    /// Run `shrink` with every backend call of this thread limited to the per-try limit.
    pub fn run<R>(&self, shrink: impl FnOnce() -> R) -> R {
        attn_backends::call_limit::within(self.per_try, shrink)
    }

    /// `info` with these bounds, for the failure report.
    pub fn stated(&self, info: ShrinkInfo) -> ShrinkInfo {
        ShrinkInfo {
            limits: Some(ShrinkLimits {
                per_try_seconds: self.per_try.as_secs_f64(),
                in_all_seconds: self.in_all.as_secs_f64(),
            }),
            ..info
        }
    }
}

/// Run `shrink` under `timeout`'s per-try limit, when the shrink has one.
pub fn run_within<R>(timeout: Option<&TimeoutShrink>, shrink: impl FnOnce() -> R) -> R {
    match timeout {
        Some(t) => t.run(shrink),
        None => shrink(),
    }
}

/// `info` with `timeout`'s bounds stated, when the shrink had any.
pub fn stated(timeout: Option<&TimeoutShrink>, info: ShrinkInfo) -> ShrinkInfo {
    match timeout {
        Some(t) => t.stated(info),
        None => info,
    }
}

/// `budget` for a failure of `kind` of `backend`: bounded in steps for timeouts and crashes,
/// and for a timeout in time too, with the bounds its tries run under.
pub fn bounded(
    mut budget: ShrinkBudget,
    kind: DivergenceKind,
    backend: &dyn Backend,
) -> (ShrinkBudget, Option<TimeoutShrink>) {
    if matches!(kind, DivergenceKind::Timeout | DivergenceKind::Crashed) {
        budget.max_steps = budget.max_steps.min(SLOW_SHRINK_STEPS);
    }
    let timeout = (kind == DivergenceKind::Timeout)
        .then(|| TimeoutShrink::of(backend))
        .flatten();
    if let Some(t) = &timeout {
        let until = t.tries_until(Instant::now());
        budget.until = Some(budget.until.map_or(until, |u| u.min(until)));
    }
    (budget, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tries_are_scaled_to_the_slowest_answer_within_the_timeout() {
        let at = |slowest: Option<f64>, timeout: f64| {
            TimeoutShrink::scaled(
                Duration::from_secs_f64(timeout),
                slowest.map(Duration::from_secs_f64),
            )
        };
        assert_eq!(at(Some(0.05), 20.0).per_try, PER_TRY_FLOOR);
        assert_eq!(at(Some(0.5), 20.0).per_try, Duration::from_secs(5));
        assert_eq!(at(Some(5.0), 20.0).per_try, Duration::from_secs(20));
        assert_eq!(at(None, 20.0).per_try, Duration::from_secs(20));
        // Nothing answered yet: no try fits, the case is reported as found.
        let t = at(None, 20.0);
        let now = Instant::now();
        assert_eq!(t.tries_until(now), now);
        // Tries of 2 s start within the first 18 s, so the last one ends within 20 s.
        let t = at(Some(0.05), 20.0);
        assert_eq!(t.tries_until(now), now + Duration::from_secs(18));
    }
}
