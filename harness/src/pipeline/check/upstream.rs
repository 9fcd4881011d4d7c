//! The upstream cases of a `check` (vLLM's backend test specs at its tolerance): each built
//! and judged by the oracle once, sent to every backend whose space admits it, with a row per
//! backend; a failure repeated on another spec folds into the first.

use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::drive::{Item, Member, Ran, Subjects};
use crate::pipeline::check::subject::{record_outcome, report, sanitize, Diverged, RunState};
use crate::pipeline::check::{CheckOptions, Event};
use crate::pipeline::runner::{evaluate, Outcome};
use crate::pipeline::upstream::UpstreamCase;
use attn_backends::Backend;
use attn_reference::{reference_output, Case, Space, Unsupported};
use attn_results::compare::Tolerance;
use attn_results::{RunPart, UpstreamStatus};
use std::sync::Arc;
use std::time::Duration;

/// Failures of one backend on upstream cases reported in full (others fold or are counted).
const MAX_REPORTED: usize = 8;

/// What the workers need to build and run upstream cases.
pub struct UpstreamCases<'a> {
    pub cases: &'a [UpstreamCase],
    pub backends: &'a [Arc<dyn Backend>],
    /// Each backend's space when narrower than the full one: a case outside is not sent.
    pub spaces: Vec<Option<Space>>,
}

/// An upstream case built and judged by the oracle.
pub struct JudgedUpstream {
    case: Case,
    expected: Vec<f64>,
    buckets: Vec<(&'static str, &'static str)>,
}

impl Subjects for UpstreamCases<'_> {
    type Prepared = JudgedUpstream;
    /// The outcome, or why the case is outside the backend's space (not sent).
    type Verdict = Result<(Outcome, Duration), Unsupported>;

    fn prepare(&self, item: &Item) -> JudgedUpstream {
        let case = self.cases[item.index].build();
        JudgedUpstream {
            expected: reference_output(&case),
            buckets: crate::pipeline::coverage::buckets(&case),
            case,
        }
    }

    fn held_bytes(&self, c: &JudgedUpstream) -> usize {
        c.case.held_bytes() + 8 * c.expected.len()
    }

    fn evaluate(&self, c: &JudgedUpstream, m: Member) -> Self::Verdict {
        if let Some(space) = &self.spaces[m.backend] {
            space.admits(&c.case)?;
        }
        let backend = self.backends[m.backend].as_ref();
        Ok(evaluate(
            backend,
            &c.case,
            &c.expected,
            Tolerance::upstream(),
        ))
    }
}

/// Record upstream case `item` in order: a row per backend, tallies, coverage, failures.
pub fn record(
    opts: &CheckOptions,
    run: &mut RunState<'_>,
    rows: &mut Vec<attn_results::UpstreamRow>,
    item: &Item,
    ran: Ran<JudgedUpstream, Result<(Outcome, Duration), Unsupported>>,
    control: &mut RunControl,
) {
    run.oracle_time += ran.oracle;
    let uc = &opts.upstream[item.index];
    if let Some(c) = &ran.prepared {
        for (m, verdict) in item.members.iter().zip(ran.verdicts) {
            let Some((verdict, wall)) = verdict else {
                continue;
            };
            let member = m.backend;
            let backend = &opts.backends[member];
            let (outcome, time) = match verdict {
                Err(outside) => {
                    // Outside the space it is checked in: not sent, and not one of its
                    // declines.
                    let status = UpstreamStatus::NotDeclared { reason: outside };
                    rows.push(uc.row(backend.name(), status, f64::NAN, f64::NAN));
                    continue;
                }
                Ok(v) => v,
            };
            let summary = &mut run.summaries[member];
            record_outcome(summary, RunPart::Upstream, &outcome, time);
            control.note(member, &outcome);
            if !matches!(outcome, Outcome::Unsupported(_)) {
                crate::pipeline::coverage::count(&mut run.coverage, backend.name(), &c.buckets);
            }
            let (status, abs, rel) = match &outcome {
                Outcome::Pass(cmp) => (UpstreamStatus::Pass, cmp.max_abs_err, cmp.max_rel_err),
                Outcome::Unsupported(u) => (
                    UpstreamStatus::Unsupported { reason: u.clone() },
                    f64::NAN,
                    f64::NAN,
                ),
                Outcome::Diverged(d) => {
                    let (a, r) = d
                        .comparison
                        .as_ref()
                        .map_or((f64::NAN, f64::NAN), |c| (c.max_abs_err, c.max_rel_err));
                    // The same failure on another upstream case folds into the first: the same
                    // kind, and for an error the same exception (numbers, addresses and paths
                    // aside); values that diverge only with the same message.
                    let key = |m: &str| match d.comparison {
                        None => crate::failure::exception::Exception::of(m).key,
                        Some(_) => m.to_string(),
                    };
                    if let Some(same) = summary
                        .failures
                        .iter_mut()
                        .find(|f| f.kind == d.kind && key(&f.message) == key(&d.message))
                    {
                        same.also.push(uc.label());
                    } else if summary.failures.len() < MAX_REPORTED {
                        control.note_class();
                        let stem = format!(
                            "{}-{}",
                            sanitize(backend.name()),
                            uc.label().replace([' ', '/', ','], "_")
                        );
                        let origin = uc.origin();
                        let diverged = Diverged {
                            backend: backend.name(),
                            origin: &origin,
                            case: &c.case,
                            expected: &c.expected,
                            divergence: d,
                            tolerance: Tolerance::upstream(),
                        };
                        let (r, a) = report(opts, &diverged, &stem, None);
                        summary.failures.push(r);
                        run.artifacts.push(a);
                    }
                    (UpstreamStatus::Diverged { kind: d.kind }, a, r)
                }
            };
            rows.push(uc.row(backend.name(), status, abs, rel));
            summary.wall_seconds += wall.as_secs_f64();
        }
    }
    (run.tell)(Event::UpstreamCase);
}
