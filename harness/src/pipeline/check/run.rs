//! The check loop: property cases, then traces, then invariance pairs, then upstream cases,
//! then recorded engine calls, each through [`drive`] on every core, recorded in order into
//! one summary.

use super::control::RunControl;
use super::drive::drive;
use super::engine_calls::{self, EngineCalls};
use super::invariance::{self, Pairs};
use super::property::{self, PropertyCases};
use super::subject::{items_for_every_backend, items_of, RunState};
use super::trace::{self, Traces};
use super::upstream::{self, UpstreamCases};
use super::{cohorts, space_of, CheckOptions, CheckRun, Event};
use crate::failure::report::finish_text;
use crate::pipeline::draw::tier::StrategyLimits;
use attn_results::{BackendSummary, CheckSummary, CoverageReport};
use std::time::Duration;

/// Run the check `opts` describes and return its summary and the files its failures leave
/// (not yet written).
pub fn run_check(mut opts: CheckOptions) -> CheckRun {
    let limits = match (opts.deep, opts.long) {
        (false, false) => StrategyLimits::DEFAULT,
        (true, false) => StrategyLimits::DEEP,
        (false, true) => StrategyLimits::DEFAULT.long(),
        (true, true) => StrategyLimits::DEEP.long(),
    };
    let cohorts = cohorts(&opts.backends, &opts.only);
    let summaries: Vec<BackendSummary> = opts
        .backends
        .iter()
        .map(|b| BackendSummary {
            space: Some(space_of(b.as_ref(), &opts.only)).filter(|s| !s.is_full()),
            ..BackendSummary::new(b.id())
        })
        .collect();
    let mut coverage = CoverageReport::default();
    for (b, summary) in opts.backends.iter().zip(&summaries) {
        for (dim, bucket) in summary
            .space
            .as_ref()
            .map_or_else(Vec::new, crate::pipeline::coverage::declared::not_declared)
        {
            coverage.mark_not_declared(b.name(), dim, bucket);
        }
    }
    let mut on_event = opts.on_event.take();
    let mut tell = |e: Event<'_>| {
        if let Some(f) = on_event.as_mut() {
            f(e)
        }
    };
    let mut run = RunState {
        classes: summaries.iter().map(|_| Default::default()).collect(),
        summaries,
        artifacts: Vec::new(),
        coverage,
        oracle_time: Duration::ZERO,
        tell: &mut tell,
    };
    let opts = &opts;
    let jobs = opts.jobs.max(1);
    let mut control = RunControl::new(opts.backends.len(), opts.max_failures, opts.give_up_after);

    let indices: Vec<usize> = match opts.case_index {
        Some(i) => vec![i],
        None => (0..opts.cases as usize).collect(),
    };
    let property_items = items_of(
        indices.into_iter().filter(|&i| opts.shard.owns(i)),
        &cohorts,
        |_| true,
    );
    let cases = PropertyCases {
        seed: opts.seed,
        limits,
        poison: opts.poison,
        cohorts: &cohorts,
        backends: &opts.backends,
        judge: opts.judge,
    };
    drive(
        jobs,
        &cases,
        &property_items,
        &mut control,
        &mut |item, ran, control| {
            property::record(opts, &cases, &mut run, item, ran, control);
            (run.tell)(Event::PropertyCase);
        },
    );

    let traces = Traces {
        seed: opts.seed,
        poison: opts.poison,
        shapes: &opts.trace_shapes,
        cohorts: &cohorts,
        backends: &opts.backends,
        judge: opts.judge,
    };
    let trace_items = trace::items(opts, &cohorts);
    drive(
        jobs,
        &traces,
        &trace_items,
        &mut control,
        &mut |item, ran, control| trace::record(opts, &traces, &mut run, item, ran, control),
    );

    let pairs = Pairs {
        seed: opts.seed,
        limits,
        poison: opts.poison,
        cohorts: &cohorts,
        backends: &opts.backends,
    };
    let pair_items = invariance::items(opts, &cohorts);
    drive(
        jobs,
        &pairs,
        &pair_items,
        &mut control,
        &mut |item, ran, control| {
            invariance::record(opts, &pairs, &mut run, item, ran, control);
            (run.tell)(Event::InvariancePair);
        },
    );

    // Upstream cases are sharded like property cases, so shards' counts add up; a single
    // property case asked for by its index runs alone.
    let upstream_items = items_for_every_backend(
        (0..opts.upstream.len()).filter(|&j| opts.shard.owns(j) && opts.case_index.is_none()),
        opts.backends.len(),
    );
    let upstream = UpstreamCases {
        cases: &opts.upstream,
        backends: &opts.backends,
        spaces: run.summaries.iter().map(|s| s.space.clone()).collect(),
    };
    let mut upstream_rows = Vec::new();
    drive(
        jobs,
        &upstream,
        &upstream_items,
        &mut control,
        &mut |item, ran, control| {
            upstream::record(opts, &mut run, &mut upstream_rows, item, ran, control)
        },
    );

    let calls = EngineCalls {
        calls: &opts.recorded,
        backends: &opts.backends,
        spaces: run.summaries.iter().map(|s| s.space.clone()).collect(),
        judge: opts.judge,
    };
    drive(
        jobs,
        &calls,
        &engine_calls::items(opts),
        &mut control,
        &mut |item, ran, control| engine_calls::record(opts, &mut run, item, ran, control),
    );

    let RunState {
        mut summaries,
        artifacts,
        coverage,
        oracle_time,
        ..
    } = run;
    for (i, s) in summaries.iter_mut().enumerate() {
        s.gave_up = control.gave_up(i).map(str::to_string);
        s.failures.iter_mut().for_each(finish_text);
    }
    // Nothing compared: no worst error to speak of.
    for s in &mut summaries {
        if s.reached() == 0 {
            s.worst_abs_err = f64::NAN;
            s.worst_rel_err = f64::NAN;
        }
    }

    let alone = opts.case_index.is_some();
    CheckRun {
        summary: CheckSummary {
            schema_version: attn_results::SCHEMA_VERSION,
            seed: opts.seed,
            cases: opts.cases,
            shard: opts.shard,
            deep: opts.deep,
            long: opts.long,
            // A single case asked for by its index runs alone: no traces, no pairs.
            traces: if alone { 0 } else { opts.traces },
            pairs: if alone { 0 } else { opts.pairs },
            oracle_seconds: oracle_time.as_secs_f64(),
            backends: summaries,
            upstream: upstream_rows,
            coverage: Some(coverage),
            only: Some(opts.only.clone()).filter(|s| !s.is_full()),
            requested_specs: opts.requested_specs.clone(),
            stopped: control.stopped.clone(),
            min_run: opts.min_run,
            judge: opts.judge,
        },
        artifacts,
    }
}
