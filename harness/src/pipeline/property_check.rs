//! The property cases of a `check`: each drawn once per cohort, judged by the oracle once and
//! run on the cohort's backends; the first divergence of each class of each backend is shrunk
//! and reported, the others counted in its class.

use crate::artifacts::{Artifact, HeatMap};
use crate::check::{case_tree, sanitize, CheckOptions, Cohort, Event, RunState};
use crate::compare::Tolerance;
use crate::failure::class::{Signature, Symptom};
use crate::failure::report::{failure_record, FailureContext};
use crate::pipeline::control::RunControl;
use crate::pipeline::drive::{per_cohort, Item, Member, PerCohort, Ran, Subjects};
use crate::pipeline::failure_classes::{count_in, Member as ClassMember, Placed, CLASS_SHRINKS};
use crate::runner::{evaluate, Divergence, Outcome};
use crate::shrink::{shrink_fully, ShrinkBudget, Shrunk};
use crate::strategy::{budget_of, fit_space, CaseRecipe, StrategyLimits};
use attn_backends::Backend;
use attn_reference::{reference_output, Case};
use attn_results::{BackendSummary, FailureRecord, Origin, Tally};
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
}

/// A property case drawn and judged by the oracle.
pub struct JudgedCase {
    pub case: Case,
    pub expected: Vec<f64>,
    pub tol: Tolerance,
    shared: bool,
    buckets: Vec<(&'static str, &'static str)>,
}

/// Property case `index` as each cohort drew it, each distinct draw judged once.
pub type JudgedIndex = PerCohort<JudgedCase>;

impl Subjects for PropertyCases<'_> {
    type Prepared = JudgedIndex;
    type Verdict = (Outcome, Duration);

    fn prepare(&self, item: &Item) -> JudgedIndex {
        per_cohort(&item.members, self.cohorts.len(), |c| {
            let space = &self.cohorts[c].space;
            poisoned_if(
                self.poison,
                case_tree(self.seed, item.index, self.limits, space).current(),
            )
        })
        .map(|r| {
            let case = r.build();
            let expected = reference_output(&case);
            let buckets = crate::coverage::buckets(&case);
            JudgedCase {
                shared: crate::check::shares_blocks(&case),
                buckets,
                tol: Tolerance::for_case(&case),
                expected,
                case,
            }
        })
    }

    fn held_bytes(&self, p: &JudgedIndex) -> usize {
        p.distinct()
            .map(|c| c.case.held_bytes() + 8 * c.expected.len())
            .sum()
    }

    fn evaluate(&self, p: &JudgedIndex, m: Member) -> (Outcome, Duration) {
        let c = p.of(m.cohort);
        evaluate(
            self.backends[m.backend].as_ref(),
            &c.case,
            &c.expected,
            c.tol,
        )
    }
}

/// Which part of a run a case belongs to: each has its own tally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Property,
    Upstream,
}

/// Count `outcome` of one case in `summary`'s tally for `part`.
pub fn record_outcome(summary: &mut BackendSummary, part: Part, outcome: &Outcome, time: Duration) {
    summary.backend_seconds += time.as_secs_f64();
    let mut worst = |abs: f64, rel: f64| {
        summary.worst_abs_err = summary.worst_abs_err.max(abs);
        summary.worst_rel_err = summary.worst_rel_err.max(rel);
    };
    let mut tally = Tally {
        sent: 1,
        ..Tally::default()
    };
    match outcome {
        Outcome::Pass(c) => {
            worst(c.max_abs_err, c.max_rel_err);
            tally.passed = 1;
        }
        Outcome::Unsupported(u) => {
            summary.add_unsupported(u, 1);
            tally.declined = 1;
        }
        Outcome::Diverged(d) => {
            if let Some(c) = &d.comparison {
                worst(c.max_abs_err, c.max_rel_err);
            }
            tally.failed = 1;
            *summary.divergences.entry(d.kind).or_default() += 1;
        }
    }
    match part {
        Part::Property => summary.property += tally,
        Part::Upstream => summary.upstream += tally,
    }
}

/// Record property case `item` in order: tallies, coverage, and the first failure of each
/// backend shrunk and reported.
pub fn record(
    opts: &CheckOptions,
    (cases, run): (&PropertyCases<'_>, &mut RunState<'_>),
    item: &Item,
    ran: Ran<JudgedIndex, (Outcome, Duration)>,
    control: &mut RunControl,
) {
    run.oracle_time += ran.oracle;
    let Some(judged) = &ran.prepared else { return };
    for (m, verdict) in item.members.iter().zip(ran.verdicts) {
        let Some(((outcome, time), wall)) = verdict else {
            continue;
        };
        let (member, c) = (m.backend, judged.of(m.cohort));
        let backend = &opts.backends[member];
        let summary = &mut run.summaries[member];
        record_outcome(summary, Part::Property, &outcome, time);
        control.note(member, &outcome);
        if !matches!(outcome, Outcome::Unsupported(_)) {
            crate::coverage::count(&mut run.coverage, backend.name(), &c.buckets);
        }
        summary.shared_block_cases += c.shared as usize;
        summary.wall_seconds += wall.as_secs_f64();
        let Outcome::Diverged(d) = &outcome else {
            continue;
        };
        summary.first_failing_case.get_or_insert(item.index);
        let index = item.index;
        let found = Signature::of(&c.case, d);
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
            let unshrunk = report(
                opts,
                (backend.name(), &origin),
                (&c.case, &c.expected, d, c.tol),
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
            case: &c.case,
            expected: &c.expected,
            divergence: d,
        };
        let book = &mut run.classes[member];
        let budget = for_kind(class_budget(opts.shrink, book.shrink_work), d.kind);
        let (mut r, a, shrunk) = shrink_and_report(backend.as_ref(), &failing, opts, budget);
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

/// The budget of the next class's shrink: the run's, or none once this backend's classes
/// have spent [`CLASS_SHRINKS`] of them.
pub fn class_budget(budget: ShrinkBudget, spent: u64) -> ShrinkBudget {
    if spent >= budget.max_work.saturating_mul(CLASS_SHRINKS) {
        ShrinkBudget::NONE
    } else {
        budget
    }
}

/// Candidates a shrink of a timeout or a crash may try: each can cost a whole timeout or a
/// restart, so the shrink stops early and its report says the budget ended it.
pub const SLOW_SHRINK_STEPS: usize = 16;

/// `budget` for a failure of `kind`: bounded for timeouts and crashes.
pub fn for_kind(mut budget: ShrinkBudget, kind: attn_results::DivergenceKind) -> ShrinkBudget {
    use attn_results::DivergenceKind::{Crashed, Timeout};
    if matches!(kind, Timeout | Crashed) {
        budget.max_steps = budget.max_steps.min(SLOW_SHRINK_STEPS);
    }
    budget
}

/// A property case that diverged, with what is needed to regenerate and shrink it.
struct FailingCase<'a> {
    seed: u64,
    index: usize,
    limits: StrategyLimits,
    space: &'a attn_reference::Space,
    case: &'a Case,
    expected: &'a [f64],
    divergence: &'a Divergence,
}

/// A failure's report and its pending files, named after `stem` under `opts.out_dir`.
pub fn report(
    opts: &CheckOptions,
    (backend, origin): (&str, &Origin),
    (case, expected, d, tol): (&Case, &[f64], &Divergence, Tolerance),
    stem: &str,
    shrunk: Option<&Shrunk>,
) -> (FailureRecord, Artifact) {
    let dir = &opts.out_dir;
    let replay = dir.join(format!("{stem}.json"));
    let heatmap = d
        .comparison
        .as_ref()
        .map(|c| HeatMap::of(dir.join(format!("{stem}.png")), backend, case, c));
    let files = FailureContext {
        replay: Some(replay.display().to_string()),
        heatmap: heatmap.as_ref().map(|h| h.path.display().to_string()),
        ..crate::check::context_of(opts, backend, &case.config)
    };
    let record = failure_record(
        backend,
        origin,
        case,
        expected,
        d,
        files,
        shrunk.map(Shrunk::info),
    );
    let mut file = case.clone();
    file.recorded = Some(crate::check::recorded(opts, backend, origin, tol, d));
    let artifact = Artifact {
        replay: Some((replay, file)),
        trace: None,
        heatmap,
    };
    (record, artifact)
}

/// Shrink a failing property case (keeping its symptom: kind, severity, an error's message)
/// and report it; with the shrunk case's signature and the shrink's work when it still
/// failed.
fn shrink_and_report(
    backend: &dyn Backend,
    f: &FailingCase<'_>,
    opts: &CheckOptions,
    budget: ShrinkBudget,
) -> (FailureRecord, Artifact, Option<(Signature, u64)>) {
    let symptom = Symptom::of(f.divergence);
    let fails = |r: &CaseRecipe| {
        let c = poisoned_if(opts.poison, r.clone()).build();
        let e = reference_output(&c);
        matches!(evaluate(backend, &c, &e, Tolerance::for_case(&c)).0, Outcome::Diverged(ref d) if Symptom::of(d) == symptom)
    };
    let mut tree = case_tree(f.seed, f.index, f.limits, f.space);
    let cost = budget_of(f.index, f.limits);
    let fit = |r: CaseRecipe| fit_space(r, f.space, cost);
    let shrunk = shrink_fully(&mut tree, budget, &fit, fails);
    let minimal = poisoned_if(opts.poison, shrunk.recipe.clone()).build();
    let e = reference_output(&minimal);
    let (out, _) = evaluate(backend, &minimal, &e, Tolerance::for_case(&minimal));
    let origin = Origin::Property {
        seed: f.seed,
        index: f.index,
    };
    let stem = failure_stem(backend.name(), f.seed, f.index);
    match out {
        Outcome::Diverged(d) if Symptom::of(&d) == symptom => {
            let signature = Signature::shrunk(&minimal, &d);
            let (mut record, artifact) = report(
                opts,
                (backend.name(), &origin),
                (&minimal, &e, &d, Tolerance::for_case(&minimal)),
                &stem,
                Some(&shrunk),
            );
            // A small case can lose the pattern a large one showed ("only decode tokens
            // diverge"): keep the hint of the case as found when it says something else.
            let before = f
                .divergence
                .comparison
                .as_ref()
                .and_then(|c| crate::failure::hint::hint(f.case, c));
            if before.is_some() && before != record.hint {
                let h = before.unwrap_or_default();
                record
                    .text
                    .push_str(&format!("hint before shrinking: {h}\n"));
                record.hint_unshrunk = Some(h);
            }
            (record, artifact, Some((signature, shrunk.work)))
        }
        // Flaky: the minimal case passed (or failed otherwise) when re-run; report the
        // original.
        _ => {
            let (r, a) = report(
                opts,
                (backend.name(), &origin),
                (
                    f.case,
                    f.expected,
                    f.divergence,
                    Tolerance::for_case(f.case),
                ),
                &stem,
                None,
            );
            (r, a, None)
        }
    }
}

/// The file stem of property case `index`'s failure files.
fn failure_stem(backend: &str, seed: u64, index: usize) -> String {
    format!("{}-seed{seed}-case{index}", sanitize(backend))
}
