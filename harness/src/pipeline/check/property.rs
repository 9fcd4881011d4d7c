//! The property cases of a `check`: each drawn once per cohort, judged by the oracle once and
//! run on the cohort's backends; the first divergence of each class of each backend is shrunk
//! and reported, the others counted in its class.

use crate::artifacts::Artifact;
use crate::failure::class::{Signature, Symptom};
use crate::pipeline::check::classes::Member as ClassMember;
use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::drive::{per_cohort, Item, Member, PerCohort, Ran, Subjects};
use crate::pipeline::check::lifecycle::{self, Bounds, Failing, Reported};
use crate::pipeline::check::shifted::{Judged, Pair, Which};
use crate::pipeline::check::slow_shrink::{run_within, stated};
use crate::pipeline::check::subject::{
    case_tree, poisoned_if, record_outcome, report, sanitize, Diverged, RunState,
};
use crate::pipeline::check::{CheckOptions, Cohort};
use crate::pipeline::draw::budget::fit_space;
use crate::pipeline::draw::budget_of;
use crate::pipeline::draw::tier::StrategyLimits;
use crate::pipeline::recipe::CaseRecipe;
use crate::pipeline::runner::{Divergence, Outcome};
use crate::pipeline::shrink::case::shrink_fully;
use attn_backends::Backend;
use attn_reference::Judge;
use attn_results::{Origin, RunPart};
use proptest::strategy::ValueTree;
use std::sync::Arc;
use std::time::Duration;

/// What the workers need to draw and run property cases.
pub struct PropertyCases<'a> {
    pub seed: u64,
    pub limits: StrategyLimits,
    pub poison: bool,
    pub cohorts: &'a [Cohort],
    pub backends: &'a [Arc<dyn Backend>],
    /// The verdict policy (`--judge`).
    pub judge: Judge,
}

/// A property case drawn and judged by the oracle (with its unshifted twin when it shifts
/// its logits: [`crate::pipeline::check::shifted`]).
pub struct JudgedCase {
    pub pair: Pair,
    shared: bool,
    buckets: Vec<(&'static str, &'static str)>,
}

/// Property case `index` as each cohort drew it, each distinct draw judged once.
pub type JudgedIndex = PerCohort<JudgedCase>;

impl Subjects for PropertyCases<'_> {
    type Prepared = JudgedIndex;
    type Verdict = (Outcome, Duration, Which);

    fn prepare(&self, item: &Item) -> JudgedIndex {
        per_cohort(&item.members, self.cohorts.len(), |c| {
            let space = &self.cohorts[c].space;
            poisoned_if(
                self.poison,
                case_tree(self.seed, item.index, self.limits, space).current(),
            )
        })
        .map(|r| {
            let pair = Pair::measured(&r, &self.judge);
            let case = &pair.drawn.case;
            JudgedCase {
                shared: crate::pipeline::recipe::shares_blocks(case),
                buckets: crate::pipeline::coverage::buckets(case),
                pair,
            }
        })
    }

    fn held_bytes(&self, p: &JudgedIndex) -> usize {
        let held = |j: &Judged| j.case.held_bytes() + 8 * j.expected.len();
        p.distinct()
            .map(|c| held(&c.pair.drawn) + c.pair.twin.as_ref().map_or(0, held))
            .sum()
    }

    fn evaluate(&self, p: &JudgedIndex, m: Member) -> (Outcome, Duration, Which) {
        p.of(m.cohort)
            .pair
            .evaluate(self.backends[m.backend].as_ref())
    }
}

/// Record property case `item` in order: tallies, coverage, and the first failure of each
/// backend shrunk and reported.
pub fn record(
    opts: &CheckOptions,
    cases: &PropertyCases<'_>,
    run: &mut RunState<'_>,
    item: &Item,
    ran: Ran<JudgedIndex, (Outcome, Duration, Which)>,
    control: &mut RunControl,
) {
    run.oracle_time += ran.oracle;
    let Some(judged) = &ran.prepared else { return };
    for (m, verdict) in item.members.iter().zip(ran.verdicts) {
        let Some(((outcome, time, which), wall)) = verdict else {
            continue;
        };
        let (member, c) = (m.backend, judged.of(m.cohort));
        // The case that diverged: the drawn one, or its unshifted twin.
        let j = c.pair.get(which);
        let backend = &opts.backends[member];
        let summary = &mut run.summaries[member];
        record_outcome(summary, RunPart::Property, &outcome, time);
        control.note(member, &outcome);
        if !matches!(outcome, Outcome::Unsupported(_)) {
            crate::pipeline::coverage::count(&mut run.coverage, backend.name(), &c.buckets);
        }
        summary.shared_block_cases += c.shared as usize;
        summary.wall_seconds += wall.as_secs_f64();
        let Outcome::Diverged(d) = &outcome else {
            continue;
        };
        summary.first_failing_case.get_or_insert(item.index);
        let failing = FailingCase {
            opts,
            index: item.index,
            limits: cases.limits,
            space: &cases.cohorts[m.cohort].space,
            found: j,
            divergence: d,
        };
        lifecycle::enter(opts, run, control, member, &failing);
    }
}

/// A property case that diverged, with what is needed to regenerate and shrink it.
struct FailingCase<'a> {
    opts: &'a CheckOptions,
    index: usize,
    limits: StrategyLimits,
    space: &'a attn_reference::Space,
    /// The case that diverged (a shifted case's twin, when that is what diverged).
    found: &'a Judged,
    divergence: &'a Divergence,
}

/// Shrink a failing property case (keeping its symptom: kind, severity, an error's message)
/// within `budget` (and a timeout's bounds) and report it; with the shrunk case's signature
/// and the shrink's work when it still failed.
fn shrink_and_report(
    backend: &dyn Backend,
    f: &FailingCase<'_>,
    (budget, timeout): Bounds,
) -> Reported {
    let opts = f.opts;
    let symptom = Symptom::of(f.divergence);
    // The divergence of the last try that still failed: the smallest case's, so far.
    let mut last_failure: Option<Divergence> = None;
    let fails = |r: &CaseRecipe| {
        let pair = Pair::of(&poisoned_if(opts.poison, r.clone()), &opts.judge);
        match pair.evaluate(backend).0 {
            Outcome::Diverged(d) if Symptom::of(&d) == symptom => {
                last_failure = Some(d);
                true
            }
            _ => false,
        }
    };
    let mut tree = case_tree(opts.seed, f.index, f.limits, f.space);
    let cost = budget_of(f.index, f.limits);
    let fit = |r: CaseRecipe| fit_space(r, f.space, cost);
    let shrink = || shrink_fully(&mut tree, budget, &fit, fails);
    let shrunk = run_within(timeout.as_ref(), shrink);
    let pair = Pair::of(
        &poisoned_if(opts.poison, shrunk.recipe.clone()),
        &opts.judge,
    );
    let (out, which) = match (&timeout, last_failure) {
        // A timeout's smallest case timed out on its last try: another would cost as much.
        (Some(_), Some(d)) if shrunk.accepted > 0 => (Outcome::Diverged(d), Which::Drawn),
        // Nothing smaller timed out: the smallest case is the one found.
        (Some(_), _) => (Outcome::Diverged(f.divergence.clone()), Which::Drawn),
        (None, _) => {
            let (out, _, which) = pair.evaluate(backend);
            (out, which)
        }
    };
    let minimal = pair.get(which);
    let info = stated(timeout.as_ref(), shrunk.info());
    let origin = f.origin();
    let stem = failure_stem(backend.name(), opts.seed, f.index);
    match out {
        Outcome::Diverged(d) if Symptom::of(&d) == symptom => {
            let signature = Signature::shrunk(&minimal.case, &d);
            let diverged = Diverged {
                backend: backend.name(),
                origin: &origin,
                case: &minimal.case,
                expected: &minimal.expected,
                divergence: &d,
                tolerance: minimal.tol,
            };
            let (mut record, artifact) = report(opts, &diverged, &stem, Some(info));
            // A small case can lose the pattern a large one showed ("only decode tokens
            // diverge"): keep the hint of the case as found when it says something else.
            let before = f
                .divergence
                .comparison
                .as_ref()
                .and_then(|c| crate::failure::hint::hint(&f.found.case, c));
            if before.is_some() && before != record.hint {
                record.hint_unshrunk = before;
            }
            Reported {
                record,
                artifact,
                shrunk: Some((signature, shrunk.work)),
            }
        }
        // Flaky: the minimal case passed (or failed otherwise) when re-run; report the
        // original.
        _ => {
            let diverged = Diverged {
                backend: backend.name(),
                origin: &origin,
                case: &f.found.case,
                expected: &f.found.expected,
                divergence: f.divergence,
                tolerance: f.found.tol,
            };
            let (record, artifact) = report(opts, &diverged, &stem, None);
            Reported {
                record,
                artifact,
                shrunk: None,
            }
        }
    }
}

impl FailingCase<'_> {
    fn origin(&self) -> Origin {
        Origin::Property {
            seed: self.opts.seed,
            index: self.index,
        }
    }
}

impl Failing for FailingCase<'_> {
    fn member(&self) -> ClassMember {
        ClassMember::Case(self.index)
    }

    fn divergence(&self) -> &Divergence {
        self.divergence
    }

    fn signature(&self) -> Signature {
        Signature::of(&self.found.case, self.divergence)
    }

    fn as_found(&self, backend: &dyn Backend) -> Artifact {
        let origin = self.origin();
        let diverged = Diverged {
            backend: backend.name(),
            origin: &origin,
            case: &self.found.case,
            expected: &self.found.expected,
            divergence: self.divergence,
            tolerance: self.found.tol,
        };
        let stem = failure_stem(backend.name(), self.opts.seed, self.index);
        report(self.opts, &diverged, &stem, None).1
    }

    fn shrink_and_report(&self, backend: &dyn Backend, bounds: Bounds) -> Reported {
        shrink_and_report(backend, self, bounds)
    }
}

/// The file stem of property case `index`'s failure files.
fn failure_stem(backend: &str, seed: u64, index: usize) -> String {
    format!("{}-seed{seed}-case{index}", sanitize(backend))
}
