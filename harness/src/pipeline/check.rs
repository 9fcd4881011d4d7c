//! `attn-diff check`: property cases and upstream specs through every selected backend,
//! each compared with the oracle computed once per case; the first divergence of each
//! backend is shrunk and reported. The loop itself is `drive`; what each kind of subject
//! does is in `property_check`, `trace_check` and `upstream_check`.

use crate::artifacts::Artifact;
use crate::compare::Tolerance;
use crate::pipeline::control::RunControl;
use crate::pipeline::drive::{drive, Item, Member};
use crate::pipeline::property_check::{self, PropertyCases};
use crate::pipeline::trace_check::{self, Traces};
use crate::pipeline::upstream_check::{self, UpstreamCases};
use crate::runner::Divergence;
use crate::shrink::ShrinkBudget;
use crate::strategy::{strategy_for, CaseRecipe, StrategyLimits};
use crate::upstream::UpstreamCase;
use attn_backends::{declared_space, Backend};
use attn_reference::{Case, InputRng, Recorded, Space};
use attn_results::{CoverageReport, Origin};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// Subjects run at once (`--jobs`); the summary is the same whatever it is.
    pub jobs: usize,
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
            jobs: 1,
            on_event: None,
        }
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
        environment: backend_named(opts, backend)
            .map(|b| b.environment())
            .unwrap_or_default(),
        origin: origin.to_string(),
        seed: Some(opts.seed),
        only: Some(opts.only.clone()).filter(|s| !s.is_full()),
        atol: tol.atol,
        rtol: tol.rtol,
        outcome: d.kind.to_string(),
    }
}

/// The run's backend called `name`.
fn backend_named<'a>(opts: &'a CheckOptions, name: &str) -> Option<&'a dyn Backend> {
    opts.backends
        .iter()
        .find(|b| b.name() == name)
        .map(|b| b.as_ref())
}

/// The backend part of a report of `backend` (one of the run's) on `config`.
pub fn context_of(
    opts: &CheckOptions,
    backend: &str,
    config: &attn_reference::AttentionConfig,
) -> crate::failure::report::FailureContext {
    match backend_named(opts, backend) {
        Some(b) => {
            crate::failure::report::FailureContext::of_backend(b, &opts.external_flags, config)
        }
        None => crate::failure::report::FailureContext {
            external: crate::external::flag_for(backend, &opts.external_flags),
            ..Default::default()
        },
    }
}

/// What the recorders of a run fill in, in subject order.
pub struct RunState<'t> {
    pub summaries: Vec<BackendSummary>,
    /// Per backend: its failure classes so far.
    pub classes: Vec<crate::pipeline::failure_classes::ClassBook>,
    pub artifacts: Vec<Artifact>,
    pub coverage: CoverageReport,
    /// The oracle's time over every subject (summed across workers).
    pub oracle_time: Duration,
    pub tell: &'t mut dyn FnMut(Event<'_>),
}

/// The loop items of `indices`: one per index, sent to the members of every cohort that
/// `draws`, in cohort order.
pub fn items_of(
    indices: impl Iterator<Item = usize>,
    cohorts: &[Cohort],
    draws: impl Fn(&Cohort) -> bool,
) -> Vec<Item> {
    let members: Vec<Member> = cohorts
        .iter()
        .enumerate()
        .filter(|(_, c)| draws(c))
        .flat_map(|(cohort, c)| {
            c.members
                .iter()
                .map(move |&backend| Member { backend, cohort })
        })
        .collect();
    if members.is_empty() {
        return Vec::new();
    }
    indices
        .map(|index| Item {
            index,
            members: members.clone(),
        })
        .collect()
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
            .map_or_else(Vec::new, crate::coverage::not_declared)
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
    };
    drive(
        jobs,
        &cases,
        &property_items,
        &mut control,
        &mut |item, ran, control| {
            property_check::record(opts, (&cases, &mut run), item, ran, control);
            (run.tell)(Event::PropertyCase);
        },
    );

    let traces = Traces {
        seed: opts.seed,
        poison: opts.poison,
        shapes: &opts.trace_shapes,
        cohorts: &cohorts,
        backends: &opts.backends,
    };
    let trace_items = trace_check::items(opts, &cohorts);
    drive(
        jobs,
        &traces,
        &trace_items,
        &mut control,
        &mut |item, ran, control| {
            trace_check::record(opts, (&traces, &mut run), item, ran, control)
        },
    );

    // Upstream cases are sharded like property cases, so shards' counts add up; a single
    // property case asked for by its index runs alone.
    let upstream_items: Vec<Item> = (0..opts.upstream.len())
        .filter(|&j| opts.shard.owns(j) && opts.case_index.is_none())
        .map(|index| Item {
            index,
            members: (0..opts.backends.len())
                .map(|backend| Member { backend, cohort: 0 })
                .collect(),
        })
        .collect();
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
            upstream_check::record(opts, &mut run, &mut upstream_rows, item, ran, control)
        },
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
        for f in s.failures.iter_mut() {
            if let Some(line) = f
                .class
                .as_ref()
                .map(crate::pipeline::failure_classes::class_line)
            {
                f.text.push_str(&line);
            }
        }
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
