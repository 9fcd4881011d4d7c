//! `attn-diff check`: property cases and upstream specs through every selected backend,
//! each compared with the oracle computed once per case; the first divergence of each
//! backend is shrunk and reported.

use crate::compare::Tolerance;
use crate::report::{write_replay, FailureReport};
use crate::runner::{evaluate, DivergenceKind, Outcome};
use crate::shrink::{shrink_fully, ShrinkBudget};
use crate::strategy::{recipe, CaseRecipe, StrategyLimits};
use crate::upstream::UpstreamCase;
use attn_backends::Backend;
use attn_reference::{reference_output, Case, InputRng};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Property cases when neither `--cases` nor `PROPTEST_CASES` says otherwise.
pub const DEFAULT_CASES: u32 = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    pub fn owns(&self, case_index: usize) -> bool {
        case_index % self.count == self.index
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    /// `I/N` with 0 <= I < N.
    fn from_str(s: &str) -> Result<Self, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("shard `{s}` must look like I/N, e.g. 0/4"))?;
        let index: usize = i
            .trim()
            .parse()
            .map_err(|_| format!("shard index `{i}` is not a number"))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("shard count `{n}` is not a number"))?;
        if count == 0 || index >= count {
            return Err(format!("shard `{s}`: need 0 <= I < N"));
        }
        Ok(Shard { index, count })
    }
}

pub struct CheckOptions {
    pub backends: Vec<Arc<dyn Backend>>,
    pub cases: u32,
    pub seed: u64,
    pub shard: Shard,
    pub deep: bool,
    /// Upstream cases to run besides the property cases.
    pub upstream: Vec<UpstreamCase>,
    pub out_dir: PathBuf,
    pub shrink: ShrinkBudget,
    /// Called after each property case (for a progress bar).
    pub on_case: Option<Box<dyn Fn() + Send>>,
}

impl CheckOptions {
    pub fn default_cases() -> u32 {
        if std::env::var_os("PROPTEST_CASES").is_some() {
            Config::default().cases
        } else {
            DEFAULT_CASES
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct BackendSummary {
    pub backend: String,
    pub cases_run: usize,
    pub passed: usize,
    pub failed: usize,
    /// Cases the backend declined, by its reason.
    pub unsupported: BTreeMap<String, usize>,
    pub divergences: BTreeMap<DivergenceKind, usize>,
    pub worst_abs_err: f64,
    pub worst_rel_err: f64,
    /// Time in the backend's forward calls.
    pub backend_seconds: f64,
    /// Wall time spent on this backend's cases (write + forward + compare).
    pub wall_seconds: f64,
    /// Property cases whose batch shares KV blocks between sequences.
    pub shared_block_cases: usize,
    /// Cases run up to and including the first divergence.
    pub first_divergence_at: Option<usize>,
    pub failures: Vec<FailureReport>,
}

impl BackendSummary {
    pub fn cases_per_second(&self) -> f64 {
        if self.wall_seconds > 0.0 {
            self.cases_run as f64 / self.wall_seconds
        } else {
            0.0
        }
    }
}

/// One row of the upstream table.
#[derive(Clone, Debug, Serialize)]
pub struct UpstreamRow {
    pub backend: String,
    pub test: &'static str,
    pub spec: String,
    pub heads: (usize, usize),
    pub status: String,
    pub max_abs_err: f64,
    pub max_rel_err: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct CheckSummary {
    pub seed: u64,
    pub cases: u32,
    pub shard: Shard,
    pub deep: bool,
    pub oracle_seconds: f64,
    pub backends: Vec<BackendSummary>,
    pub upstream: Vec<UpstreamRow>,
}

impl CheckSummary {
    pub fn any_divergence(&self) -> bool {
        self.backends.iter().any(|b| b.failed > 0)
    }
}

/// The proptest tree of property case `index`: a deterministic function of (seed, index), so
/// shards and replays regenerate exactly the same case.
pub fn case_tree(
    seed: u64,
    index: usize,
    limits: StrategyLimits,
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
    recipe(limits)
        .new_tree(&mut runner)
        .expect("recipe strategy never rejects")
}

fn record(summary: &mut BackendSummary, outcome: &Outcome, time: Duration) {
    summary.cases_run += 1;
    summary.backend_seconds += time.as_secs_f64();
    match outcome {
        Outcome::Pass(c) => {
            summary.passed += 1;
            summary.worst_abs_err = summary.worst_abs_err.max(c.max_abs_err);
            summary.worst_rel_err = summary.worst_rel_err.max(c.max_rel_err);
        }
        Outcome::Unsupported(reason) => {
            *summary.unsupported.entry(reason.clone()).or_default() += 1
        }
        Outcome::Diverged(d) => {
            summary.failed += 1;
            summary.first_divergence_at.get_or_insert(summary.cases_run);
            *summary.divergences.entry(d.kind).or_default() += 1;
            if let Some(c) = &d.comparison {
                summary.worst_abs_err = summary.worst_abs_err.max(c.max_abs_err);
                summary.worst_rel_err = summary.worst_rel_err.max(c.max_rel_err);
            }
        }
    }
}

/// A property case that diverged, with what is needed to regenerate and shrink it.
struct FailingCase<'a> {
    seed: u64,
    index: usize,
    limits: StrategyLimits,
    case: &'a Case,
    expected: &'a [f64],
    divergence: &'a crate::runner::Divergence,
}

/// Shrink a failing property case (keeping its divergence kind), write its replay file and
/// heat map, and report it.
fn shrink_and_report(
    backend: &dyn Backend,
    f: &FailingCase<'_>,
    opts: &CheckOptions,
) -> FailureReport {
    let kind = f.divergence.kind;
    let fails = |r: &CaseRecipe| {
        let c = r.build();
        let e = reference_output(&c);
        matches!(evaluate(backend, &c, &e, Tolerance::for_case(&c)).0, Outcome::Diverged(ref d) if d.kind == kind)
    };
    let mut tree = case_tree(f.seed, f.index, f.limits);
    let shrunk = shrink_fully(&mut tree, opts.shrink, fails);
    let minimal = shrunk.recipe.build();
    let e = reference_output(&minimal);
    let (out, _) = evaluate(backend, &minimal, &e, Tolerance::for_case(&minimal));
    let origin = format!("property case {} (seed {})", f.index, f.seed);
    let file = format!(
        "{}-seed{}-case{}.json",
        sanitize(backend.name()),
        f.seed,
        f.index
    );
    let replay = write_replay(&opts.out_dir, &file, &minimal);
    let heatmap = opts.out_dir.join(file.replace(".json", ".png"));
    match out {
        Outcome::Diverged(d) => FailureReport::new(
            backend.name(),
            &origin,
            &minimal,
            &e,
            &d,
            replay,
            Some(&shrunk),
            Some(&heatmap),
        ),
        // Flaky: the minimal case passed when re-run; report the original.
        _ => FailureReport::new(
            backend.name(),
            &origin,
            f.case,
            f.expected,
            f.divergence,
            replay,
            None,
            Some(&heatmap),
        ),
    }
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

pub fn run_check(mut opts: CheckOptions) -> CheckSummary {
    let limits = if opts.deep {
        StrategyLimits::DEEP
    } else {
        StrategyLimits::DEFAULT
    };
    let mut summaries: Vec<BackendSummary> = opts
        .backends
        .iter()
        .map(|b| BackendSummary {
            backend: b.name().to_string(),
            ..Default::default()
        })
        .collect();
    let mut oracle_time = Duration::ZERO;
    let on_case = opts.on_case.take();

    for index in 0..opts.cases as usize {
        if !opts.shard.owns(index) {
            continue;
        }
        let recipe = case_tree(opts.seed, index, limits).current();
        let case = recipe.build();
        let t0 = Instant::now();
        let expected = reference_output(&case);
        oracle_time += t0.elapsed();
        let shared = shares_blocks(&case);
        let tol = Tolerance::for_case(&case);
        for (backend, summary) in opts.backends.iter().zip(summaries.iter_mut()) {
            let t0 = Instant::now();
            let (outcome, time) = evaluate(backend.as_ref(), &case, &expected, tol);
            record(summary, &outcome, time);
            summary.shared_block_cases += shared as usize;
            if let Outcome::Diverged(d) = &outcome {
                if summary.failures.is_empty() {
                    let failing = FailingCase {
                        seed: opts.seed,
                        index,
                        limits,
                        case: &case,
                        expected: &expected,
                        divergence: d,
                    };
                    summary
                        .failures
                        .push(shrink_and_report(backend.as_ref(), &failing, &opts));
                }
            }
            summary.wall_seconds += t0.elapsed().as_secs_f64();
        }
        if let Some(f) = &on_case {
            f();
        }
    }

    let mut upstream_rows = Vec::new();
    for uc in &opts.upstream {
        let case = uc.build();
        let t0 = Instant::now();
        let expected = reference_output(&case);
        oracle_time += t0.elapsed();
        for (backend, summary) in opts.backends.iter().zip(summaries.iter_mut()) {
            let t0 = Instant::now();
            let (outcome, time) =
                evaluate(backend.as_ref(), &case, &expected, Tolerance::upstream());
            record(summary, &outcome, time);
            let (status, abs, rel) = match &outcome {
                Outcome::Pass(c) => ("pass".to_string(), c.max_abs_err, c.max_rel_err),
                Outcome::Unsupported(r) => (format!("unsupported: {r}"), f64::NAN, f64::NAN),
                Outcome::Diverged(d) => {
                    let (a, r) = d
                        .comparison
                        .as_ref()
                        .map_or((f64::NAN, f64::NAN), |c| (c.max_abs_err, c.max_rel_err));
                    if summary.failures.len() < 8 {
                        let file = format!(
                            "{}-{}.json",
                            sanitize(backend.name()),
                            uc.label().replace([' ', '/', ','], "_")
                        );
                        let replay = write_replay(&opts.out_dir, &file, &case);
                        let heatmap = opts.out_dir.join(file.replace(".json", ".png"));
                        summary.failures.push(FailureReport::new(
                            backend.name(),
                            &uc.label(),
                            &case,
                            &expected,
                            d,
                            replay,
                            None,
                            Some(&heatmap),
                        ));
                    }
                    (format!("FAIL ({})", d.kind), a, r)
                }
            };
            upstream_rows.push(UpstreamRow {
                backend: backend.name().to_string(),
                test: uc.test.name(),
                spec: uc.spec.to_string(),
                heads: uc.heads,
                status,
                max_abs_err: abs,
                max_rel_err: rel,
            });
            summary.wall_seconds += t0.elapsed().as_secs_f64();
        }
    }

    CheckSummary {
        seed: opts.seed,
        cases: opts.cases,
        shard: opts.shard,
        deep: opts.deep,
        oracle_seconds: oracle_time.as_secs_f64(),
        backends: summaries,
        upstream: upstream_rows,
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
