//! `attn-diff check`: property cases, traces and upstream specs through every selected
//! backend, each compared with the oracle computed once per subject. This file holds the
//! run's options and cohorts; [`run`] is the loop, [`drive`] runs its items on every core,
//! [`lifecycle`] takes every kind's failures through one path, and [`property`], [`trace`],
//! [`invariance`] and [`upstream`] say what each kind of subject does.

pub mod classes;
pub mod control;
pub mod drive;
pub mod engine_calls;
pub mod invariance;
pub mod lifecycle;
pub mod property;
pub mod run;
pub mod shifted;
pub mod slow_shrink;
pub mod subject;
pub mod trace;
pub mod upstream;

use crate::artifacts::Artifact;
use crate::pipeline::shrink::ShrinkBudget;
use crate::pipeline::upstream::UpstreamCase;
use attn_backends::{declared_space, Backend};
use attn_reference::{Judge, Space};
use proptest::test_runner::Config;
use std::path::PathBuf;
use std::sync::Arc;

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
    /// Invariance pairs to run after the traces ([`invariance`]).
    pub pairs: u32,
    /// Relations judged as declared on every backend (`--hold`).
    pub hold: Vec<attn_reference::relation::Relation>,
    /// The head and block sizes traces draw from.
    pub trace_shapes: crate::pipeline::draw::trace::TraceShapes,
    /// Upstream cases to run besides the property cases.
    pub upstream: Vec<UpstreamCase>,
    /// A real engine's recorded calls to judge (`--recording`).
    pub recorded: Vec<crate::pipeline::recording::EngineCall>,
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
    /// The verdict policy (`--judge`): attn-diff's tolerance, or the precision ladder.
    pub judge: Judge,
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
    /// An invariance pair ran on every backend.
    InvariancePair,
    /// A recorded engine call ran on every backend.
    RecordedCall,
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
            traces: crate::pipeline::draw::trace::DEFAULT_TRACES,
            pairs: crate::pipeline::draw::pair::default_pairs(cases),
            hold: Vec::new(),
            trace_shapes: Default::default(),
            upstream: Vec::new(),
            recorded: Vec::new(),
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
            judge: Judge::Tolerance,
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
