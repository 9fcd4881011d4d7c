//! `attn-diff check`: property cases and upstream specs through every selected backend,
//! each compared with the oracle computed once per case; the first divergence of each
//! backend is shrunk and reported.

use crate::artifacts::{Artifact, HeatMap};
use crate::compare::Tolerance;
use crate::pipeline::control::RunControl;
use crate::render::report::{failure_record, FailureFiles};
use crate::runner::{evaluate, Divergence, Outcome};
use crate::shrink::{shrink_fully, ShrinkBudget, Shrunk};
use crate::strategy::{budget_of, fit_space, strategy_for, CaseRecipe, StrategyLimits};
use crate::upstream::UpstreamCase;
use attn_backends::{declared_space, Backend};
use attn_reference::{reference_output, Case, InputRng, Recorded, Space};
use attn_results::{FailureRecord, Origin, UpstreamStatus};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use attn_results::{BackendSummary, CheckSummary, Shard, Tally, UpstreamRow};

/// Property cases when neither `--cases` nor `PROPTEST_CASES` says otherwise.
pub const DEFAULT_CASES: u32 = 500;

/// Identical failures in a row (an error, crash, timeout or malformed reply with the same
/// message) after which a backend is sent no more cases.
pub const DEFAULT_GIVE_UP_AFTER: usize = 5;

pub struct CheckOptions {
    pub backends: Vec<Arc<dyn Backend>>,
    pub cases: u32,
    pub seed: u64,
    pub shard: Shard,
    pub deep: bool,
    /// The long tier for one case in four (`--long`), contexts up to 128k.
    pub long: bool,
    /// Serving traces to run after the property cases (one cache across many steps).
    pub traces: u32,
    /// The head and block sizes traces draw from.
    pub trace_shapes: crate::pipeline::trace::TraceShapes,
    /// Upstream cases to run besides the property cases.
    pub upstream: Vec<UpstreamCase>,
    pub out_dir: PathBuf,
    pub shrink: ShrinkBudget,
    /// `--only`: narrows every backend's declared space (the full space: no narrowing).
    pub only: Space,
    /// The `--external NAME=COMMAND` flags of the run, for replay files and replay lines.
    pub external_flags: Vec<String>,
    /// Specs named with `--spec`: the summary says when one reached no backend.
    pub requested_specs: Vec<String>,
    /// Stop the run after this many failures (`--max-failures`, `-x`: 1).
    pub max_failures: Option<usize>,
    /// Stop sending a backend cases after this many identical failures in a row.
    pub give_up_after: usize,
    /// Run only this property case (`--case-index`), e.g. the one a report names.
    pub case_index: Option<usize>,
    /// Cases and traces that must reach every backend (`--min-run`).
    pub min_run: usize,
    /// Poisoned memory in one case and trace in four (`--no-poison` turns it off, to look
    /// past a known finding).
    pub poison: bool,
    /// Write a failure's replay file as soon as it is found, before shrinking (the command
    /// does, so an interrupt loses nothing; a library caller gets every file pending in
    /// [`CheckRun::artifacts`] and no I/O).
    pub write_as_found: bool,
    /// Told what the run is doing (for a progress bar).
    pub on_event: Option<OnEvent>,
}

/// Backends that draw from one space: they run the very same cases and traces, each drawn
/// and judged by the oracle once. A narrow backend is a cohort of its own and gets the
/// run's whole budget inside its space.
pub struct Cohort {
    pub space: Space,
    /// Indices into `CheckOptions::backends`.
    pub members: Vec<usize>,
}

/// The space `backend` is checked in: what it declares, narrowed by `only`.
pub fn space_of(backend: &dyn Backend, only: &Space) -> Space {
    declared_space(backend).intersect(only)
}

/// `backends` grouped by their space (`only` applied), in order of first appearance.
pub fn cohorts(backends: &[Arc<dyn Backend>], only: &Space) -> Vec<Cohort> {
    let mut out: Vec<Cohort> = Vec::new();
    for (i, b) in backends.iter().enumerate() {
        let space = space_of(b.as_ref(), only);
        match out.iter_mut().find(|c| c.space == space) {
            Some(c) => c.members.push(i),
            None => out.push(Cohort {
                space,
                members: vec![i],
            }),
        }
    }
    out
}

/// A progress callback of [`run_check`].
pub type OnEvent = Box<dyn FnMut(Event<'_>) + Send>;

/// What `run_check` is doing, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A property case ran on every backend.
    PropertyCase,
    /// An upstream case ran on every backend.
    UpstreamCase,
    /// A trace ran on every backend.
    Trace,
    /// A divergence of `backend` is being shrunk (until the next case event).
    Shrinking { backend: &'a str },
}

/// A check's summary and the files its failures leave, not yet written.
pub struct CheckRun {
    pub summary: CheckSummary,
    pub artifacts: Vec<Artifact>,
}

impl CheckRun {
    /// Write the replay files and heat maps the summary names.
    pub fn write_artifacts(&self) {
        crate::artifacts::write_all(&self.artifacts);
    }
}

impl CheckOptions {
    /// `cases` property cases of seed 1 on `backends`, unsharded, no upstream cases, the
    /// default shrink budget, failures' files under `out_dir`.
    pub fn new(backends: Vec<Arc<dyn Backend>>, cases: u32, out_dir: PathBuf) -> CheckOptions {
        CheckOptions {
            backends,
            cases,
            seed: 1,
            shard: Shard::ALL,
            deep: false,
            long: false,
            traces: crate::pipeline::trace::DEFAULT_TRACES,
            trace_shapes: Default::default(),
            upstream: Vec::new(),
            out_dir,
            shrink: ShrinkBudget::default(),
            only: Space::default(),
            external_flags: Vec::new(),
            requested_specs: Vec::new(),
            max_failures: None,
            give_up_after: DEFAULT_GIVE_UP_AFTER,
            case_index: None,
            min_run: 1,
            poison: true,
            write_as_found: false,
            on_event: None,
        }
    }

    /// `r` as this run draws it: without its poison under `--no-poison`.
    pub fn without_poison_if_off(&self, mut r: CaseRecipe) -> CaseRecipe {
        if !self.poison {
            r.poison = None;
        }
        r
    }

    /// A trace recipe as this run draws it: without its poison under `--no-poison`.
    pub fn trace_without_poison_if_off(
        &self,
        mut r: attn_reference::TraceRecipe,
    ) -> attn_reference::TraceRecipe {
        if !self.poison {
            r.poison = None;
        }
        r
    }

    pub fn default_cases() -> u32 {
        if std::env::var_os("PROPTEST_CASES").is_some() {
            Config::default().cases
        } else {
            DEFAULT_CASES
        }
    }
}

/// The proptest tree of property case `index` inside `space`: a deterministic function of
/// (seed, index, space), so shards and replays regenerate exactly the same case.
pub fn case_tree(
    seed: u64,
    index: usize,
    limits: StrategyLimits,
    space: &Space,
) -> impl ValueTree<Value = CaseRecipe> {
    let mut bytes = [0u8; 32];
    let mut rng = InputRng::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&(rng.below(u64::MAX)).to_le_bytes());
    }
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    strategy_for(index, limits, space)
        .new_tree(&mut runner)
        .expect("recipe strategy never rejects")
}

/// Which part of a run a case belongs to: each has its own tally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Property,
    Upstream,
}

fn record(summary: &mut BackendSummary, part: Part, outcome: &Outcome, time: Duration) {
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

/// A property case that diverged, with what is needed to regenerate and shrink it.
struct FailingCase<'a> {
    seed: u64,
    index: usize,
    limits: StrategyLimits,
    space: &'a Space,
    case: &'a Case,
    expected: &'a [f64],
    divergence: &'a Divergence,
}

/// What a replay file records of the run that wrote it.
pub fn recorded(
    opts: &CheckOptions,
    backend: &str,
    origin: &Origin,
    tol: Tolerance,
    d: &Divergence,
) -> Recorded {
    Recorded {
        backend: backend.to_string(),
        external: crate::external::flag_for(backend, &opts.external_flags),
        origin: origin.to_string(),
        seed: Some(opts.seed),
        only: Some(opts.only.clone()).filter(|s| !s.is_full()),
        atol: tol.atol,
        rtol: tol.rtol,
        outcome: d.kind.to_string(),
    }
}

/// A failure's report and its pending files, named after `stem` under `opts.out_dir`.
fn report(
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
    let files = FailureFiles {
        replay: Some(replay.display().to_string()),
        heatmap: heatmap.as_ref().map(|h| h.path.display().to_string()),
        external: crate::external::flag_for(backend, &opts.external_flags),
    };
    let record = failure_record(backend, origin, case, expected, d, files, shrunk);
    let mut file = case.clone();
    file.recorded = Some(recorded(opts, backend, origin, tol, d));
    let artifact = Artifact {
        replay: Some((replay, file)),
        trace: None,
        heatmap,
    };
    (record, artifact)
}

/// Shrink a failing property case (keeping its divergence kind) and report it.
fn shrink_and_report(
    backend: &dyn Backend,
    f: &FailingCase<'_>,
    opts: &CheckOptions,
) -> (FailureRecord, Artifact) {
    let kind = f.divergence.kind;
    let fails = |r: &CaseRecipe| {
        let c = opts.without_poison_if_off(r.clone()).build();
        let e = reference_output(&c);
        matches!(evaluate(backend, &c, &e, Tolerance::for_case(&c)).0, Outcome::Diverged(ref d) if d.kind == kind)
    };
    let mut tree = case_tree(f.seed, f.index, f.limits, f.space);
    let budget = budget_of(f.index, f.limits);
    let fit = |r: CaseRecipe| fit_space(r, f.space, budget);
    let shrunk = shrink_fully(&mut tree, opts.shrink, &fit, fails);
    let minimal = opts.without_poison_if_off(shrunk.recipe.clone()).build();
    let e = reference_output(&minimal);
    let (out, _) = evaluate(backend, &minimal, &e, Tolerance::for_case(&minimal));
    let origin = Origin::Property {
        seed: f.seed,
        index: f.index,
    };
    let stem = failure_stem(backend.name(), f.seed, f.index);
    match out {
        Outcome::Diverged(d) => {
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
                .and_then(|c| crate::render::hint::hint(f.case, c));
            if before.is_some() && before != record.hint {
                let h = before.unwrap_or_default();
                record
                    .text
                    .push_str(&format!("hint before shrinking: {h}\n"));
                record.hint_unshrunk = Some(h);
            }
            (record, artifact)
        }
        // Flaky: the minimal case passed when re-run; report the original.
        _ => report(
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
        ),
    }
}

/// The file stem of property case `index`'s failure files.
fn failure_stem(backend: &str, seed: u64, index: usize) -> String {
    format!("{}-seed{seed}-case{index}", sanitize(backend))
}

/// Whether a case's block tables share a physical block between live positions.
pub fn shares_blocks(case: &Case) -> bool {
    let bs = case.config.block_size;
    let mut seen = std::collections::HashSet::new();
    (0..case.num_seqs()).any(|s| {
        (0..case.batch.seq_lens[s].div_ceil(bs))
            .any(|i| !seen.insert(case.layout.block_table[s][i]))
    })
}

pub fn run_check(mut opts: CheckOptions) -> CheckRun {
    let limits = match (opts.deep, opts.long) {
        (false, false) => StrategyLimits::DEFAULT,
        (true, false) => StrategyLimits::DEEP,
        (false, true) => StrategyLimits::DEFAULT.long(),
        (true, true) => StrategyLimits::DEEP.long(),
    };
    let cohorts = cohorts(&opts.backends, &opts.only);
    let mut summaries: Vec<BackendSummary> = opts
        .backends
        .iter()
        .map(|b| BackendSummary {
            space: Some(space_of(b.as_ref(), &opts.only)).filter(|s| !s.is_full()),
            ..BackendSummary::new(b.name())
        })
        .collect();
    let mut artifacts = Vec::new();
    let mut coverage = attn_results::CoverageReport::default();
    for (b, summary) in opts.backends.iter().zip(&summaries) {
        for (dim, bucket) in summary
            .space
            .as_ref()
            .map_or_else(Vec::new, crate::coverage::not_declared)
        {
            coverage.mark_not_declared(b.name(), dim, bucket);
        }
    }
    let mut oracle_time = Duration::ZERO;
    let mut on_event = opts.on_event.take();
    let mut tell = |e: Event<'_>| {
        if let Some(f) = on_event.as_mut() {
            f(e)
        }
    };

    let mut control = RunControl::new(opts.backends.len(), opts.max_failures, opts.give_up_after);
    let indices: Vec<usize> = match opts.case_index {
        Some(i) => vec![i],
        None => (0..opts.cases as usize).collect(),
    };
    for index in indices {
        if !opts.shard.owns(index) {
            continue;
        }
        if control.should_stop() {
            break;
        }
        let mut drawn = crate::pipeline::same_index::SameIndex::new();
        for cohort in &cohorts {
            let live = control.live(&cohort.members);
            if live.is_empty() {
                continue;
            }
            let recipe = opts.without_poison_if_off(
                case_tree(opts.seed, index, limits, &cohort.space).current(),
            );
            let (case, expected) = drawn.get_or_make(recipe, |r| {
                let case = r.build();
                let t0 = Instant::now();
                let expected = reference_output(&case);
                oracle_time += t0.elapsed();
                (case, expected)
            });
            let shared = shares_blocks(case);
            let buckets = crate::coverage::buckets(case);
            let tol = Tolerance::for_case(case);
            for &member in &live {
                let (backend, summary) = (&opts.backends[member], &mut summaries[member]);
                let t0 = Instant::now();
                let (outcome, time) = evaluate(backend.as_ref(), case, expected, tol);
                record(summary, Part::Property, &outcome, time);
                control.note(member, &outcome);
                if !matches!(outcome, Outcome::Unsupported(_)) {
                    crate::coverage::count(&mut coverage, backend.name(), &buckets);
                }
                summary.shared_block_cases += shared as usize;
                if let Outcome::Diverged(d) = &outcome {
                    summary.first_failing_case.get_or_insert(index);
                    if summary.failures.is_empty() {
                        if opts.write_as_found {
                            // On disk before shrinking starts: an interrupt loses nothing.
                            let origin = Origin::Property {
                                seed: opts.seed,
                                index,
                            };
                            let unshrunk = report(
                                &opts,
                                (backend.name(), &origin),
                                (case, expected, d, tol),
                                &failure_stem(backend.name(), opts.seed, index),
                                None,
                            );
                            crate::artifacts::write_all(&[unshrunk.1]);
                        }
                        tell(Event::Shrinking {
                            backend: backend.name(),
                        });
                        let failing = FailingCase {
                            seed: opts.seed,
                            index,
                            limits,
                            space: &cohort.space,
                            case,
                            expected,
                            divergence: d,
                        };
                        let (r, a) = shrink_and_report(backend.as_ref(), &failing, &opts);
                        summary.failures.push(r);
                        artifacts.push(a);
                    }
                }
                summary.wall_seconds += t0.elapsed().as_secs_f64();
            }
        }
        tell(Event::PropertyCase);
    }

    crate::pipeline::trace_check::run_traces(
        &opts,
        (&cohorts, &mut control),
        &mut summaries,
        &mut artifacts,
        &mut coverage,
        &mut oracle_time,
        &mut tell,
    );

    let mut upstream_rows = Vec::new();
    // Upstream cases are sharded like property cases, so shards' counts add up.
    for (j, uc) in opts.upstream.iter().enumerate() {
        // A single property case asked for by its index runs alone.
        if !opts.shard.owns(j) || opts.case_index.is_some() {
            continue;
        }
        if control.should_stop() {
            break;
        }
        let case = uc.build();
        let t0 = Instant::now();
        let expected = reference_output(&case);
        oracle_time += t0.elapsed();
        let buckets = crate::coverage::buckets(&case);
        for (member, (backend, summary)) in
            opts.backends.iter().zip(summaries.iter_mut()).enumerate()
        {
            if control.gave_up(member).is_some() {
                continue;
            }
            if let Err(outside) = summary.space.as_ref().map_or(Ok(()), |s| s.admits(&case)) {
                // Outside the space it is checked in: not sent, and not one of its declines.
                let status = UpstreamStatus::NotDeclared { reason: outside };
                upstream_rows.push(uc.row(backend.name(), status, (f64::NAN, f64::NAN)));
                continue;
            }
            let t0 = Instant::now();
            let (outcome, time) =
                evaluate(backend.as_ref(), &case, &expected, Tolerance::upstream());
            record(summary, Part::Upstream, &outcome, time);
            control.note(member, &outcome);
            if !matches!(outcome, Outcome::Unsupported(_)) {
                crate::coverage::count(&mut coverage, backend.name(), &buckets);
            }
            let (status, abs, rel) = match &outcome {
                Outcome::Pass(c) => (UpstreamStatus::Pass, c.max_abs_err, c.max_rel_err),
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
                    // The same failure on another upstream case folds into the first.
                    if let Some(same) = summary
                        .failures
                        .iter_mut()
                        .find(|f| f.kind == d.kind && f.message == d.message)
                    {
                        same.also.push(uc.label());
                    } else if summary.failures.len() < 8 {
                        let stem = format!(
                            "{}-{}",
                            sanitize(backend.name()),
                            uc.label().replace([' ', '/', ','], "_")
                        );
                        let (r, a) = report(
                            &opts,
                            (backend.name(), &uc.origin()),
                            (&case, &expected, d, Tolerance::upstream()),
                            &stem,
                            None,
                        );
                        summary.failures.push(r);
                        artifacts.push(a);
                    }
                    (UpstreamStatus::Diverged { kind: d.kind }, a, r)
                }
            };
            upstream_rows.push(uc.row(backend.name(), status, (abs, rel)));
            summary.wall_seconds += t0.elapsed().as_secs_f64();
        }
        tell(Event::UpstreamCase);
    }
    for (i, s) in summaries.iter_mut().enumerate() {
        s.gave_up = control.gave_up(i).map(str::to_string);
        for f in s.failures.iter_mut().filter(|f| !f.also.is_empty()) {
            f.text.push_str(&format!(
                "also:    the same failure on {} more upstream case(s): {}\n",
                f.also.len(),
                f.also.join("; ")
            ));
        }
    }
    // Nothing compared: no worst error to speak of.
    for s in &mut summaries {
        if s.reached() == 0 {
            s.worst_abs_err = f64::NAN;
            s.worst_rel_err = f64::NAN;
        }
    }

    CheckRun {
        summary: CheckSummary {
            schema_version: attn_results::SCHEMA_VERSION,
            seed: opts.seed,
            cases: opts.cases,
            shard: opts.shard,
            deep: opts.deep,
            long: opts.long,
            // A single case asked for by its index runs alone: no traces.
            traces: if opts.case_index.is_some() {
                0
            } else {
                opts.traces
            },
            oracle_seconds: oracle_time.as_secs_f64(),
            backends: summaries,
            upstream: upstream_rows,
            coverage: Some(coverage),
            only: Some(opts.only.clone()).filter(|s| !s.is_full()),
            requested_specs: opts.requested_specs.clone(),
            stopped: control.stopped.clone(),
            min_run: opts.min_run,
        },
        artifacts,
    }
}

/// A backend name as a file-name component.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
