//! The traces of a `check`: each trace's steps and oracle computed once, every backend run
//! through all of its steps on one cache; the first diverging trace of each failure class of
//! each backend is shrunk and reported with the history of the blocks involved.

use crate::artifacts::Artifact;
use crate::failure::class::{Signature, Symptom};
use crate::failure::report::FailureContext;
use crate::failure::trace::trace_failure_record;
use crate::pipeline::check::classes::Member as ClassMember;
use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::drive::{per_cohort, Item, Member, PerCohort, Ran, Subjects};
use crate::pipeline::check::lifecycle::{self, Bounds, Failing, Reported};
use crate::pipeline::check::slow_shrink::{run_within, stated};
use crate::pipeline::check::subject::{sanitize, RunState};
use crate::pipeline::check::{CheckOptions, Cohort, Event};
use crate::pipeline::draw::trace::{fit_trace, trace_recipe_in};
use crate::pipeline::runner::trace::{evaluate_trace, JudgedTrace, TraceOutcome};
use crate::pipeline::runner::Divergence;
use crate::pipeline::shrink::trace::shrink_trace;
use attn_backends::Backend;
use attn_reference::trace::generate;
use attn_reference::{Judge, Space, TraceRecipe};
use attn_results::Origin;
use std::sync::Arc;
use std::time::Duration;

/// What the workers need to draw and run traces.
pub struct Traces<'a> {
    pub seed: u64,
    pub poison: bool,
    pub shapes: &'a crate::pipeline::draw::trace::TraceShapes,
    pub cohorts: &'a [Cohort],
    pub backends: &'a [Arc<dyn Backend>],
    /// The verdict policy (`--judge`).
    pub judge: Judge,
}

/// A trace drawn, its steps judged by the oracle.
pub struct DrawnTrace {
    judged: JudgedTrace,
    buckets: Vec<(&'static str, &'static str)>,
}

/// Trace `index` as each cohort drew it, each distinct draw judged once.
pub type DrawnIndex = PerCohort<DrawnTrace>;

impl Subjects for Traces<'_> {
    type Prepared = DrawnIndex;
    /// `None` for a trace of no steps (nothing to run).
    type Verdict = Option<(TraceOutcome, Duration)>;

    fn prepare(&self, item: &Item) -> DrawnIndex {
        per_cohort(&item.members, self.cohorts.len(), |c| {
            let space = &self.cohorts[c].space;
            trace_poisoned_if(
                self.poison,
                trace_recipe_in(self.seed, item.index, self.shapes, space),
            )
        })
        .map(|r| {
            let judged = JudgedTrace::judged_by(generate(&r), &self.judge);
            DrawnTrace {
                buckets: crate::pipeline::coverage::trace_buckets(&judged.trace),
                judged,
            }
        })
    }

    fn held_bytes(&self, p: &DrawnIndex) -> usize {
        p.distinct()
            .flat_map(|d| d.judged.steps.iter().zip(&d.judged.expected))
            .map(|(step, expected)| step.held_bytes() + 8 * expected.len())
            .sum()
    }

    fn evaluate(&self, p: &DrawnIndex, m: Member) -> Self::Verdict {
        let t = &p.of(m.cohort).judged;
        (!t.steps.is_empty()).then(|| evaluate_trace(self.backends[m.backend].as_ref(), t))
    }
}

/// A trace recipe as a run draws it: without its poison under `--no-poison`.
pub fn trace_poisoned_if(poison: bool, mut r: TraceRecipe) -> TraceRecipe {
    if !poison {
        r.poison = None;
    }
    r
}

/// The traces a check runs: those of its shard, for every cohort whose space has decoder
/// steps (traces are decoder steps), none when one property case was asked for by index.
pub fn items(opts: &CheckOptions, cohorts: &[Cohort]) -> Vec<Item> {
    let traces = if opts.case_index.is_some() {
        0
    } else {
        opts.traces as usize
    };
    crate::pipeline::check::subject::items_of(
        (0..traces).filter(|&i| opts.shard.owns(i)),
        cohorts,
        |c| crate::pipeline::draw::trace::draws_traces(&c.space),
    )
}

/// Record trace `item` in order: tallies, coverage, and the first diverging trace of each
/// backend shrunk and reported.
pub fn record(
    opts: &CheckOptions,
    traces: &Traces<'_>,
    run: &mut RunState<'_>,
    item: &Item,
    ran: Ran<DrawnIndex, Option<(TraceOutcome, Duration)>>,
    control: &mut RunControl,
) {
    run.oracle_time += ran.oracle;
    if let Some(drawn) = &ran.prepared {
        for (m, verdict) in item.members.iter().zip(ran.verdicts) {
            let Some((Some((outcome, time)), wall)) = verdict else {
                continue;
            };
            let (member, t) = (m.backend, drawn.of(m.cohort));
            let judged = &t.judged;
            let backend = &opts.backends[member];
            let summary = &mut run.summaries[member];
            summary.traces.sent += 1;
            summary.backend_seconds += time.as_secs_f64();
            summary.wall_seconds += wall.as_secs_f64();
            match &outcome {
                TraceOutcome::Pass {
                    max_abs_err,
                    max_rel_err,
                } => {
                    control.note_pass(member);
                    summary.traces.passed += 1;
                    summary.trace_steps += judged.steps.len();
                    summary.worst_abs_err = summary.worst_abs_err.max(*max_abs_err);
                    summary.worst_rel_err = summary.worst_rel_err.max(*max_rel_err);
                }
                TraceOutcome::Unsupported(u) => {
                    control.note_pass(member);
                    summary.traces.declined += 1;
                    summary.add_unsupported(u, 1);
                }
                TraceOutcome::Diverged { step, divergence } => {
                    control.note_failure(member, divergence.kind, &divergence.message);
                    summary.trace_steps += step + 1;
                    summary.traces.failed += 1;
                    summary.first_failing_trace.get_or_insert(item.index);
                    *summary.divergences.entry(divergence.kind).or_default() += 1;
                    let diverged = DivergedTrace {
                        opts,
                        space: &traces.cohorts[m.cohort].space,
                        index: item.index,
                        judged,
                        step: *step,
                        divergence,
                    };
                    lifecycle::enter(opts, run, control, member, &diverged);
                }
            }
            if !matches!(outcome, TraceOutcome::Unsupported(_)) {
                crate::pipeline::coverage::count(&mut run.coverage, backend.name(), &t.buckets);
            }
        }
    }
    (run.tell)(Event::Trace);
}

/// The file stem of trace `index`'s failure file.
fn trace_stem(backend: &str, seed: u64, index: usize) -> String {
    format!("{}-seed{seed}-trace{index}", sanitize(backend))
}

/// Trace `index` diverging at `step`: what its shrink starts from and its replay file records.
#[derive(Clone, Copy)]
struct DivergedTrace<'a> {
    opts: &'a CheckOptions,
    /// The space it was drawn (and shrinks) in.
    space: &'a Space,
    index: usize,
    judged: &'a JudgedTrace,
    step: usize,
    divergence: &'a Divergence,
}

/// Shrink trace `index` (diverging at `step`, its symptom kept) within `budget` (and a
/// timeout's bounds) and report its smallest form; with the shrunk step's signature and the
/// shrink's work when it still failed.
fn shrink_and_report(
    backend: &dyn Backend,
    (budget, timeout): Bounds,
    found: DivergedTrace<'_>,
) -> Reported {
    let DivergedTrace {
        opts,
        space,
        index,
        judged: original,
        step,
        divergence,
    } = found;
    let stem = trace_stem(backend.name(), opts.seed, index);
    let path = opts.out_dir.join(format!("{stem}.json"));
    let symptom = Symptom::of(divergence);
    // The step and divergence of the last try that still failed: the smallest trace's.
    let mut last_failure: Option<(usize, Divergence)> = None;
    let shrink = || {
        shrink_trace(
            trace_poisoned_if(
                opts.poison,
                trace_recipe_in(opts.seed, index, &opts.trace_shapes, space),
            ),
            step,
            budget,
            &|r| fit_trace(r, space),
            |r| {
                let (at, d) = divergence_of(backend, r, &symptom, &opts.judge)?;
                last_failure = Some((at, d));
                Some(at)
            },
        )
    };
    let shrunk = run_within(timeout.as_ref(), shrink);
    let info = stated(timeout.as_ref(), shrunk.info());
    let minimal = JudgedTrace::judged_by(generate(&shrunk.recipe), &opts.judge);
    let rerun = match (&timeout, last_failure) {
        // A timeout's smallest trace timed out on its last try: another would cost as much.
        (Some(_), Some((at, d))) if shrunk.accepted > 0 => Some((at, d)),
        // Nothing smaller timed out: report the trace as found.
        (Some(_), _) => None,
        (None, _) => match evaluate_trace(backend, &minimal).0 {
            TraceOutcome::Diverged { step, divergence } => Some((step, *divergence)),
            _ => None,
        },
    };
    let (judged, step, divergence, info) = match rerun {
        Some((step, divergence)) if Symptom::of(&divergence) == symptom => {
            (&minimal, step, divergence, Some(info))
        }
        None if timeout.is_some() => (original, step, divergence.clone(), Some(info)),
        // Flaky: the minimal trace passed (or failed otherwise) when re-run; report the
        // original.
        _ => (original, step, divergence.clone(), None),
    };
    let signature = info.is_some().then(|| {
        (
            Signature::shrunk(&judged.steps[step], &divergence),
            shrunk.work,
        )
    });
    let record = trace_failure_record(
        backend.name(),
        &trace_origin(opts, index, judged, step),
        judged.diverged_at(step),
        &divergence,
        FailureContext {
            replay: Some(path.display().to_string()),
            ..crate::pipeline::check::subject::context_of(
                opts,
                backend.name(),
                &judged.steps[step].config,
            )
        },
        info,
    );
    let shrunk_form = DivergedTrace {
        judged,
        step,
        divergence: &divergence,
        ..found
    };
    Reported {
        record,
        artifact: trace_file(backend.name(), shrunk_form),
        shrunk: signature,
    }
}

impl Failing for DivergedTrace<'_> {
    fn member(&self) -> ClassMember {
        ClassMember::Trace(self.index)
    }

    fn divergence(&self) -> &Divergence {
        self.divergence
    }

    fn signature(&self) -> Signature {
        Signature::of(self.judged.diverged_at(self.step).case, self.divergence)
    }

    fn as_found(&self, backend: &dyn Backend) -> Artifact {
        trace_file(backend.name(), *self)
    }

    fn shrink_and_report(&self, backend: &dyn Backend, bounds: Bounds) -> Reported {
        shrink_and_report(backend, bounds, *self)
    }
}

/// Step `step` of trace `index` as a failure's origin.
fn trace_origin(opts: &CheckOptions, index: usize, t: &JudgedTrace, step: usize) -> Origin {
    Origin::Trace {
        seed: opts.seed,
        index,
        step,
        steps: t.steps.len(),
    }
}

/// The replay file of trace `index` diverging at `step`, with what it records of the run
/// (written before shrinking, then replaced by the shrunk trace's).
fn trace_file(backend: &str, found: DivergedTrace<'_>) -> Artifact {
    let DivergedTrace {
        opts,
        index,
        judged: t,
        step,
        divergence,
        ..
    } = found;
    let path = opts
        .out_dir
        .join(format!("{}.json", trace_stem(backend, opts.seed, index)));
    let mut file = t.trace.clone();
    let tol = t.tolerances[step];
    let origin = trace_origin(opts, index, t, step);
    file.recorded = Some(crate::pipeline::check::subject::recorded(
        opts, backend, &origin, tol, divergence,
    ));
    Artifact {
        trace: Some((path, file)),
        ..Artifact::default()
    }
}

/// The step where `recipe`'s trace diverges on `backend` with `symptom`, if it does.
pub fn diverges(backend: &dyn Backend, recipe: &TraceRecipe, symptom: &Symptom) -> Option<usize> {
    divergence_of(backend, recipe, symptom, &Judge::Tolerance).map(|(step, _)| step)
}

/// The step where `recipe`'s trace diverges on `backend` with `symptom`, and how.
fn divergence_of(
    backend: &dyn Backend,
    recipe: &TraceRecipe,
    symptom: &Symptom,
    judge: &Judge,
) -> Option<(usize, Divergence)> {
    let trace = generate(recipe);
    if trace.steps.is_empty() || trace.validate().is_err() {
        return None;
    }
    match evaluate_trace(backend, &JudgedTrace::judged_by(trace, judge)).0 {
        TraceOutcome::Diverged { step, divergence } if Symptom::of(&divergence) == *symptom => {
            Some((step, *divergence))
        }
        _ => None,
    }
}
