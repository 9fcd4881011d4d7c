//! What the three kinds of subject (property cases, traces, upstream cases) share: the run's
//! state they record into, a case's tree and replay record, their tallies and reports.

use super::classes::CLASS_SHRINKS;
use super::drive::{Item, Member};
use super::{CheckOptions, Cohort, Event};
use crate::artifacts::{Artifact, HeatMap};
use crate::failure::report::{failure_record, FailureContext};
use crate::pipeline::draw::strategy_for;
use crate::pipeline::draw::tier::StrategyLimits;
use crate::pipeline::recipe::CaseRecipe;
use crate::pipeline::runner::{Divergence, Outcome};
use crate::pipeline::shrink::ShrinkBudget;
use attn_backends::Backend;
use attn_reference::{Case, InputRng, Recorded, Space};
use attn_results::compare::Tolerance;
use attn_results::{BackendSummary, CoverageReport, FailureRecord, Origin, RunPart, Tally};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::time::Duration;

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
        judge: non_default(opts.judge),
        outcome: d.kind.to_string(),
        pair: None,
    }
}

/// `judge` when it is not the default policy: what records and replay lines must carry.
pub fn non_default(judge: attn_reference::Judge) -> Option<attn_reference::Judge> {
    (judge != attn_reference::Judge::Tolerance).then_some(judge)
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
    let context = match backend_named(opts, backend) {
        Some(b) => {
            crate::failure::report::FailureContext::of_backend(b, &opts.external_flags, config)
        }
        None => crate::failure::report::FailureContext {
            external: crate::external::flag_for(backend, &opts.external_flags),
            ..Default::default()
        },
    };
    crate::failure::report::FailureContext {
        judge: non_default(opts.judge),
        ..context
    }
}

/// What the recorders of a run fill in, in subject order.
pub struct RunState<'t> {
    pub summaries: Vec<BackendSummary>,
    /// Per backend: its failure classes so far.
    pub classes: Vec<crate::pipeline::check::classes::ClassBook>,
    pub artifacts: Vec<Artifact>,
    pub coverage: CoverageReport,
    /// The oracle's time over every subject (summed across workers).
    pub oracle_time: Duration,
    pub tell: &'t mut dyn FnMut(Event<'_>),
}

/// The loop items of `indices` for fixed subjects (upstream cases, recorded calls): each
/// sent to every one of `backends` backends, in one cohort.
pub fn items_for_every_backend(indices: impl Iterator<Item = usize>, backends: usize) -> Vec<Item> {
    indices
        .map(|index| Item {
            index,
            members: (0..backends)
                .map(|backend| Member { backend, cohort: 0 })
                .collect(),
        })
        .collect()
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

/// Count `outcome` of one case in `summary`'s tally for `part`.
pub fn record_outcome(
    summary: &mut BackendSummary,
    part: RunPart,
    outcome: &Outcome,
    time: Duration,
) {
    summary.backend_seconds += time.as_secs_f64();
    let mut worst = |abs: f64, rel: f64| {
        summary.worst_abs_err = summary.worst_abs_err.max(abs);
        summary.worst_rel_err = summary.worst_rel_err.max(rel);
    };
    let mut tally = Tally {
        sent: 1,
        ..Tally::default()
    };
    let figures = match outcome {
        Outcome::Pass(c) => c.figures,
        Outcome::Diverged(d) => d.comparison.as_ref().and_then(|c| c.figures),
        Outcome::Unsupported(_) => None,
    };
    if let Some(f) = &figures {
        attn_results::figures::add_to(&mut summary.figures, f);
    }
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
    *summary.tally_mut(part) += tally;
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

/// A divergence as its report is built: whose, which subject, the case, the oracle's output
/// and the tolerance it was judged by.
#[derive(Clone, Copy)]
pub struct Diverged<'a> {
    pub backend: &'a str,
    pub origin: &'a Origin,
    pub case: &'a Case,
    pub expected: &'a [f64],
    pub divergence: &'a Divergence,
    pub tolerance: Tolerance,
}

/// A failure's report and its pending files, named after `stem` under `opts.out_dir`.
pub fn report(
    opts: &CheckOptions,
    diverged: &Diverged<'_>,
    stem: &str,
    shrunk: Option<attn_results::ShrinkInfo>,
) -> (FailureRecord, Artifact) {
    let Diverged {
        backend,
        origin,
        case,
        expected,
        divergence: d,
        tolerance: tol,
    } = *diverged;
    let dir = &opts.out_dir;
    let replay = dir.join(format!("{stem}.json"));
    let heatmap = d
        .comparison
        .as_ref()
        .map(|c| HeatMap::of(dir.join(format!("{stem}.png")), backend, case, c));
    let files = FailureContext {
        replay: Some(replay.display().to_string()),
        heatmap: heatmap.as_ref().map(|h| h.path.display().to_string()),
        ..crate::pipeline::check::subject::context_of(opts, backend, &case.config)
    };
    let record = failure_record(backend, origin, case, expected, d, files, shrunk);
    let mut file = case.clone();
    file.recorded = Some(crate::pipeline::check::subject::recorded(
        opts, backend, origin, tol, d,
    ));
    let artifact = Artifact {
        replay: Some((replay, file)),
        trace: None,
        heatmap,
        also: Vec::new(),
    };
    (record, artifact)
}

/// `r` as a run draws it: without its poison under `--no-poison`.
pub fn poisoned_if(poison: bool, mut r: CaseRecipe) -> CaseRecipe {
    if !poison {
        r.poison = None;
    }
    r
}
