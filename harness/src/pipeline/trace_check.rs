//! The traces of a `check`: each trace's steps and oracle computed once, every backend run
//! through all of its steps on one cache; the first diverging trace of each backend is
//! shrunk and reported with the history of the blocks involved.

use crate::artifacts::Artifact;
use crate::check::{sanitize, CheckOptions, Cohort, Event};
use crate::pipeline::control::RunControl;
use crate::pipeline::trace::{evaluate_trace, trace_recipe_in, JudgedTrace, TraceOutcome};
use crate::pipeline::trace_shrink::shrink_trace;
use crate::render::trace_report::trace_failure_record;
use crate::runner::Divergence;
use attn_backends::Backend;
use attn_reference::trace::generate;
use attn_reference::Space;
use attn_results::{BackendSummary, CoverageReport, FailureRecord, Origin};
use std::time::{Duration, Instant};

/// Run `opts.traces` traces (those of this shard) on every backend into `summaries`.
pub fn run_traces(
    opts: &CheckOptions,
    (cohorts, control): (&[Cohort], &mut RunControl),
    summaries: &mut [BackendSummary],
    artifacts: &mut Vec<Artifact>,
    coverage: &mut CoverageReport,
    oracle_time: &mut Duration,
    tell: &mut dyn FnMut(Event<'_>),
) {
    // A single property case asked for by its index runs alone.
    let traces = if opts.case_index.is_some() {
        0
    } else {
        opts.traces
    };
    for index in 0..traces as usize {
        if !opts.shard.owns(index) {
            continue;
        }
        if control.should_stop() {
            break;
        }
        let mut drawn = crate::pipeline::same_index::SameIndex::new();
        for cohort in cohorts {
            let live = control.live(&cohort.members);
            if live.is_empty() || !crate::pipeline::trace::draws_traces(&cohort.space) {
                // Traces are decoder steps: nothing to draw for a space without them.
                continue;
            }
            let t0 = Instant::now();
            let recipe = opts.trace_without_poison_if_off(trace_recipe_in(
                opts.seed,
                index,
                &opts.trace_shapes,
                &cohort.space,
            ));
            let judged = drawn.get_or_make(recipe, |r| JudgedTrace::new(generate(r)));
            *oracle_time += t0.elapsed();
            if judged.steps.is_empty() {
                continue;
            }
            let buckets = crate::coverage::trace_buckets(&judged.trace);
            for &member in &live {
                let (backend, summary) = (&opts.backends[member], &mut summaries[member]);
                let t0 = Instant::now();
                let (outcome, time) = evaluate_trace(backend.as_ref(), judged);
                summary.traces.sent += 1;
                summary.backend_seconds += time.as_secs_f64();
                match &outcome {
                    TraceOutcome::Pass {
                        max_abs_err,
                        max_rel_err,
                    } => {
                        summary.traces.passed += 1;
                        summary.trace_steps += judged.steps.len();
                        summary.worst_abs_err = summary.worst_abs_err.max(*max_abs_err);
                        summary.worst_rel_err = summary.worst_rel_err.max(*max_rel_err);
                    }
                    TraceOutcome::Unsupported(u) => {
                        summary.traces.declined += 1;
                        summary.add_unsupported(u, 1);
                    }
                    TraceOutcome::Diverged { step, divergence } => {
                        control.note_failure(member, divergence.kind, &divergence.message);
                        summary.trace_steps += step + 1;
                        summary.traces.failed += 1;
                        summary.first_failing_trace.get_or_insert(index);
                        *summary.divergences.entry(divergence.kind).or_default() += 1;
                        if summary.traces.failed == 1 {
                            if opts.write_as_found {
                                // On disk before shrinking starts: an interrupt loses nothing.
                                let file = trace_file(
                                    opts,
                                    backend.name(),
                                    index,
                                    judged,
                                    (*step, divergence),
                                );
                                crate::artifacts::write_all(&[file]);
                            }
                            tell(Event::Shrinking {
                                backend: backend.name(),
                            });
                            let (record, artifact) = shrink_and_report(
                                backend.as_ref(),
                                (opts, &cohort.space),
                                index,
                                (*step, divergence),
                                judged,
                            );
                            summary.failures.push(record);
                            artifacts.push(artifact);
                        }
                    }
                }
                if !matches!(outcome, TraceOutcome::Unsupported(_)) {
                    crate::coverage::count(coverage, backend.name(), &buckets);
                }
                summary.wall_seconds += t0.elapsed().as_secs_f64();
            }
        }
        tell(Event::Trace);
    }
}

/// The file stem of trace `index`'s failure file.
fn trace_stem(backend: &str, seed: u64, index: usize) -> String {
    format!("{}-seed{seed}-trace{index}", sanitize(backend))
}

/// Shrink trace `index` (diverging at `step`) and report its smallest form.
fn shrink_and_report(
    backend: &dyn Backend,
    (opts, space): (&CheckOptions, &Space),
    index: usize,
    (step, divergence): (usize, &Divergence),
    original: &JudgedTrace,
) -> (FailureRecord, Artifact) {
    let stem = trace_stem(backend.name(), opts.seed, index);
    let path = opts.out_dir.join(format!("{stem}.json"));
    let kind = divergence.kind;
    let shrunk = shrink_trace(
        backend,
        opts.trace_without_poison_if_off(trace_recipe_in(
            opts.seed,
            index,
            &opts.trace_shapes,
            space,
        )),
        (step, kind),
        opts.shrink,
        space,
    );
    let minimal = JudgedTrace::new(generate(&shrunk.recipe));
    let (judged, step, divergence, shrunk) = match evaluate_trace(backend, &minimal).0 {
        TraceOutcome::Diverged { step, divergence } if divergence.kind == kind => {
            (&minimal, step, *divergence, Some(&shrunk))
        }
        // Flaky: the minimal trace passed when re-run; report the original.
        _ => (original, step, divergence.clone(), None),
    };
    let external = crate::external::flag_for(backend.name(), &opts.external_flags);
    let record = trace_failure_record(
        backend.name(),
        &trace_origin(opts, index, judged, step),
        judged,
        step,
        &divergence,
        (Some(path.display().to_string()), external),
        shrunk,
    );
    let artifact = trace_file(opts, backend.name(), index, judged, (step, &divergence));
    (record, artifact)
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
fn trace_file(
    opts: &CheckOptions,
    backend: &str,
    index: usize,
    t: &JudgedTrace,
    (step, divergence): (usize, &Divergence),
) -> Artifact {
    let path = opts
        .out_dir
        .join(format!("{}.json", trace_stem(backend, opts.seed, index)));
    let mut file = t.trace.clone();
    let tol = crate::compare::Tolerance::for_case(&t.steps[step]);
    let origin = trace_origin(opts, index, t, step);
    file.recorded = Some(crate::check::recorded(
        opts, backend, &origin, tol, divergence,
    ));
    Artifact {
        trace: Some((path, file)),
        ..Artifact::default()
    }
}
