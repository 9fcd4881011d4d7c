//! The upstream cases of a `check` (vLLM's backend test specs at its tolerance): each built
//! and judged by the oracle once, sent to every backend whose space admits it, with a row per
//! backend; a failure goes through the one lifecycle ([`lifecycle`]), so a spec failing as
//! another did is counted in that one's class and named beside it. Specs are fixed cases:
//! they are reported as found, never shrunk.

use crate::artifacts::Artifact;
use crate::failure::class::Signature;
use crate::pipeline::check::classes::Member as ClassMember;
use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::drive::{Item, Member, Ran, Subjects};
use crate::pipeline::check::lifecycle::{self, Bounds, Failing, Reported};
use crate::pipeline::check::subject::{record_outcome, report, sanitize, Diverged, RunState};
use crate::pipeline::check::{CheckOptions, Event};
use crate::pipeline::runner::{evaluate, Divergence, Outcome};
use crate::pipeline::upstream::UpstreamCase;
use attn_backends::Backend;
use attn_reference::{reference_output, Case, Space, Unsupported};
use attn_results::compare::Tolerance;
use attn_results::{RunPart, UpstreamStatus};
use std::sync::Arc;
use std::time::Duration;

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
                    let failing = UpstreamFailure {
                        opts,
                        index: item.index,
                        spec: uc,
                        judged: c,
                        divergence: d,
                    };
                    lifecycle::enter(opts, run, control, member, &failing);
                    (UpstreamStatus::Diverged { kind: d.kind }, a, r)
                }
            };
            rows.push(uc.row(backend.name(), status, abs, rel));
            run.summaries[member].wall_seconds += wall.as_secs_f64();
        }
    }
    (run.tell)(Event::UpstreamCase);
}

/// An upstream case that diverged on one backend.
struct UpstreamFailure<'a> {
    opts: &'a CheckOptions,
    index: usize,
    spec: &'a UpstreamCase,
    judged: &'a JudgedUpstream,
    divergence: &'a Divergence,
}

impl UpstreamFailure<'_> {
    fn reported(&self, backend: &dyn Backend) -> (attn_results::FailureRecord, Artifact) {
        let stem = format!(
            "{}-{}",
            sanitize(backend.name()),
            self.spec.label().replace([' ', '/', ','], "_")
        );
        let origin = self.spec.origin();
        let diverged = Diverged {
            backend: backend.name(),
            origin: &origin,
            case: &self.judged.case,
            expected: &self.judged.expected,
            divergence: self.divergence,
            tolerance: Tolerance::upstream(),
        };
        report(self.opts, &diverged, &stem, None)
    }
}

impl Failing for UpstreamFailure<'_> {
    fn member(&self) -> ClassMember {
        ClassMember::Upstream(self.index, self.spec.label())
    }

    fn divergence(&self) -> &Divergence {
        self.divergence
    }

    fn signature(&self) -> Signature {
        Signature::of(&self.judged.case, self.divergence)
    }

    fn as_found(&self, backend: &dyn Backend) -> Artifact {
        self.reported(backend).1
    }

    fn shrink_and_report(&self, backend: &dyn Backend, _: Bounds) -> Reported {
        let (record, artifact) = self.reported(backend);
        Reported {
            record,
            artifact,
            shrunk: None,
        }
    }
}
