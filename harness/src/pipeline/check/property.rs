//! The property cases of a `check`: each drawn once per cohort, judged by the oracle once and
//! run on the cohort's backends; the first divergence of each class of each backend is shrunk
//! and reported, the others counted in its class.

use crate::artifacts::Artifact;
use crate::failure::class::{Signature, Symptom};
use crate::pipeline::check::classes::{count_in, Member as ClassMember, Placed};
use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::drive::{per_cohort, Item, Member, PerCohort, Ran, Subjects};
use crate::pipeline::check::shifted::{Judged, Pair, Which};
use crate::pipeline::check::slow_shrink::{bounded, TimeoutShrink};
use crate::pipeline::check::subject::{
    case_tree, class_budget, record_outcome, report, sanitize, Diverged, RunState,
};
use crate::pipeline::check::{CheckOptions, Cohort, Event};
use crate::pipeline::draw::budget::fit_space;
use crate::pipeline::draw::budget_of;
use crate::pipeline::draw::tier::StrategyLimits;
use crate::pipeline::recipe::CaseRecipe;
use crate::pipeline::runner::{Divergence, Outcome};
use crate::pipeline::shrink::case::shrink_fully;
use crate::pipeline::shrink::ShrinkBudget;
use attn_backends::Backend;
use attn_reference::Judge;
use attn_results::{FailureRecord, Origin, RunPart};
use proptest::strategy::ValueTree;
use std::sync::Arc;
use std::time::Duration;

/// `r` as a run draws it: without its poison under `--no-poison`.
pub fn poisoned_if(poison: bool, mut r: CaseRecipe) -> CaseRecipe {
    if !poison {
        r.poison = None;
    }
    r
}

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
        let index = item.index;
        let found = Signature::of(&j.case, d);
        if let Placed::Existing(i) = run.classes[member].place(&found) {
            count_in(&mut summary.failures[i], &found, ClassMember::Case(index));
            continue;
        }
        control.note_class();
        if opts.write_as_found {
            // On disk before shrinking starts: an interrupt loses nothing.
            let origin = Origin::Property {
                seed: opts.seed,
                index,
            };
            let diverged = Diverged {
                backend: backend.name(),
                origin: &origin,
                case: &j.case,
                expected: &j.expected,
                divergence: d,
                tolerance: j.tol,
            };
            let unshrunk = report(
                opts,
                &diverged,
                &failure_stem(backend.name(), opts.seed, index),
                None,
            );
            crate::artifacts::write_all(&[unshrunk.1]);
        }
        (run.tell)(Event::Shrinking {
            backend: backend.name(),
        });
        let t0 = std::time::Instant::now();
        let failing = FailingCase {
            seed: opts.seed,
            index,
            limits: cases.limits,
            space: &cases.cohorts[m.cohort].space,
            found: j,
            divergence: d,
        };
        let book = &mut run.classes[member];
        let (budget, timeout) = bounded(
            class_budget(opts.shrink, book.shrink_work),
            d.kind,
            backend.as_ref(),
        );
        let (mut r, a, shrunk) =
            shrink_and_report(backend.as_ref(), &failing, opts, (budget, timeout));
        book.shrink_work += shrunk.as_ref().map_or(0, |s| s.1);
        let summary = &mut run.summaries[member];
        summary.wall_seconds += t0.elapsed().as_secs_f64();
        let shrunk_sig = shrunk.map(|s| s.0);
        let named = shrunk_sig.clone().unwrap_or_else(|| found.clone());
        match book.enter(found.clone(), shrunk_sig, summary.failures.len()) {
            Some(i) => count_in(&mut summary.failures[i], &found, ClassMember::Case(index)),
            None => {
                count_in(&mut r, &named, ClassMember::Case(index));
                summary.failures.push(r);
                run.artifacts.push(a);
            }
        }
    }
}

/// A property case that diverged, with what is needed to regenerate and shrink it.
struct FailingCase<'a> {
    seed: u64,
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
    opts: &CheckOptions,
    (budget, timeout): (ShrinkBudget, Option<TimeoutShrink>),
) -> (FailureRecord, Artifact, Option<(Signature, u64)>) {
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
    let mut tree = case_tree(f.seed, f.index, f.limits, f.space);
    let cost = budget_of(f.index, f.limits);
    let fit = |r: CaseRecipe| fit_space(r, f.space, cost);
    let shrink = || shrink_fully(&mut tree, budget, &fit, fails);
    let shrunk = match &timeout {
        Some(t) => t.run(shrink),
        None => shrink(),
    };
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
    let info = match &timeout {
        Some(t) => t.stated(shrunk.info()),
        None => shrunk.info(),
    };
    let origin = Origin::Property {
        seed: f.seed,
        index: f.index,
    };
    let stem = failure_stem(backend.name(), f.seed, f.index);
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
            (record, artifact, Some((signature, shrunk.work)))
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
            let (r, a) = report(opts, &diverged, &stem, None);
            (r, a, None)
        }
    }
}

/// The file stem of property case `index`'s failure files.
fn failure_stem(backend: &str, seed: u64, index: usize) -> String {
    format!("{}-seed{seed}-case{index}", sanitize(backend))
}
