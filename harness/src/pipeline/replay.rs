//! `attn-diff replay FILE`: run one saved case (a replay file) through backends again.

use crate::failure::report::{failure_record, FailureContext};
use crate::pipeline::runner::{evaluate, Outcome};
use attn_backends::Backend;
use attn_reference::{reference_output, Case, Judge};
use std::sync::Arc;

pub struct ReplayResult {
    pub backend: String,
    pub outcome: Outcome,
    pub report: Option<attn_results::FailureRecord>,
}

/// Run `case` on each backend, judged by `judge`; a divergence comes with its report.
pub fn replay_case(
    case: &Case,
    origin: &str,
    backends: &[Arc<dyn Backend>],
    judge: Judge,
) -> Vec<ReplayResult> {
    let expected = reference_output(case);
    let tol = judge.tolerance(case, &expected);
    backends
        .iter()
        .map(|b| {
            let (outcome, _) = evaluate(b.as_ref(), case, &expected, tol);
            let report = match &outcome {
                Outcome::Diverged(d) => Some(failure_record(
                    b.name(),
                    &attn_results::Origin::Replay {
                        file: origin.to_string(),
                        step: None,
                    },
                    case,
                    &expected,
                    d,
                    FailureContext {
                        replay: Some(origin.to_string()),
                        judge: (judge != Judge::Tolerance).then_some(judge),
                        ..FailureContext::of_backend(b.as_ref(), &[], &case.config)
                    },
                    None,
                )),
                _ => None,
            };
            ReplayResult {
                backend: b.name().to_string(),
                outcome,
                report,
            }
        })
        .collect()
}
