//! Traces through a backend: the oracle of every step, and running a backend with one cache
//! across all steps, every step judged. The first diverging step ends the run.

use super::{catch_panic, judge, Divergence, Outcome};
use crate::pipeline::draw::trace::trace_recipe;
use attn_backends::{Backend, TraceSession, Unsupported};
use attn_reference::trace::generate;
use attn_reference::{reference_output, Case, Judge, Trace};
use attn_results::compare::Tolerance;
use std::time::Duration;

/// A trace with what judging it needs: each step as a case and its oracle output.
pub struct JudgedTrace {
    pub trace: Trace,
    pub steps: Vec<Case>,
    pub expected: Vec<Vec<f64>>,
    /// The tolerance each step is judged by.
    pub tolerances: Vec<Tolerance>,
}

impl JudgedTrace {
    /// The steps and oracle of a valid trace, judged by attn-diff's tolerance.
    pub fn new(trace: Trace) -> JudgedTrace {
        JudgedTrace::judged_by(trace, &Judge::Tolerance)
    }

    /// The steps and oracle of a valid trace, each step judged by `judge`.
    pub fn judged_by(trace: Trace, judge: &Judge) -> JudgedTrace {
        // A step's unwritten slots are the trace's cache's, so they hold the trace's poison:
        // the failure rules read it from the step (a NaN through a weight of 0 is named a
        // poison read only where the case says its slots were poisoned).
        let steps: Vec<Case> = (0..trace.steps.len())
            .map(|i| Case {
                poison: trace.poison,
                ..trace.step_case(i)
            })
            .collect();
        let expected: Vec<Vec<f64>> = steps.iter().map(reference_output).collect();
        let tolerances = steps
            .iter()
            .zip(&expected)
            .map(|(s, e)| judge.tolerance(s, e))
            .collect();
        JudgedTrace {
            trace,
            steps,
            expected,
            tolerances,
        }
    }

    /// Step `step` as a failure report reads it.
    pub fn diverged_at(&self, step: usize) -> crate::failure::trace::DivergedStep<'_> {
        crate::failure::trace::DivergedStep {
            trace: &self.trace,
            step,
            case: &self.steps[step],
            expected: &self.expected[step],
        }
    }
}

#[derive(Clone, Debug)]
pub enum TraceOutcome {
    /// Every step agreed; the worst errors over all steps.
    Pass {
        max_abs_err: f64,
        max_rel_err: f64,
    },
    Unsupported(Unsupported),
    Diverged {
        step: usize,
        divergence: Box<Divergence>,
    },
}

/// Run `backend` through every step of `t` on one cache.
pub fn evaluate_trace(backend: &dyn Backend, t: &JudgedTrace) -> (TraceOutcome, Duration) {
    let mut time = Duration::ZERO;
    if t.steps.is_empty() {
        return (
            TraceOutcome::Pass {
                max_abs_err: 0.0,
                max_rel_err: 0.0,
            },
            time,
        );
    }
    let failed_start = |result| {
        let (outcome, _) = judge(result, &t.steps[0], &t.expected[0], t.tolerances[0]);
        diverged_or_unsupported(outcome, 0)
    };
    let mut session = match catch_panic(|| TraceSession::start(backend, &t.trace)) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return (failed_start(Ok(Err(e))), time),
        Err(panic) => return (failed_start(Err(panic)), time),
    };
    let (mut abs, mut rel) = (0.0f64, 0.0f64);
    for (i, (case, expected)) in t.steps.iter().zip(&t.expected).enumerate() {
        let result = catch_panic(|| session.step(case));
        let (outcome, dt) = judge(result, case, expected, t.tolerances[i]);
        time += dt;
        match outcome {
            Outcome::Pass(c) => {
                abs = abs.max(c.max_abs_err);
                rel = rel.max(c.max_rel_err);
            }
            other => return (diverged_or_unsupported(other, i), time),
        }
    }
    (
        TraceOutcome::Pass {
            max_abs_err: abs,
            max_rel_err: rel,
        },
        time,
    )
}

fn diverged_or_unsupported(outcome: Outcome, step: usize) -> TraceOutcome {
    match outcome {
        Outcome::Diverged(divergence) => TraceOutcome::Diverged {
            step,
            divergence: Box::new(divergence),
        },
        Outcome::Unsupported(u) => TraceOutcome::Unsupported(u),
        Outcome::Pass(_) => unreachable!("only failures are passed here"),
    }
}

/// The trace of recipe `index` of `seed`, ready to judge.
pub fn trace_for(seed: u64, index: usize) -> JudgedTrace {
    JudgedTrace::new(generate(&trace_recipe(seed, index)))
}
