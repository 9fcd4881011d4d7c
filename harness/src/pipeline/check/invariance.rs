//! The invariance pairs of a `check`: a drawn decoder case run as it is and in its form
//! under one relation ([`attn_reference::relation`]: the request alone, the batch reversed,
//! the prompt chunked, the blocks moved, the call repeated), the compared rows set beside
//! each other bit for bit, not beside the oracle. Where the backend declares the relation
//! ([`Backend::invariant_under`]), a moved bit is a `variant` failure, shrunk to the smallest
//! case whose forms still differ and reported with both forms' replay files; where it does
//! not, the drift is measured per relation and reported, never dropped.

use crate::artifacts::Artifact;
use crate::failure::class::Signature;
use crate::pipeline::check::classes::Member as ClassMember;
use crate::pipeline::check::control::RunControl;
use crate::pipeline::check::drive::{per_cohort, Item, Member, PerCohort, Ran, Subjects};
use crate::pipeline::check::lifecycle::{self, Bounds, Failing, Reported};
use crate::pipeline::check::subject::{
    case_tree, poisoned_if, report, sanitize, Diverged, RunState,
};
use crate::pipeline::check::{CheckOptions, Cohort};
use crate::pipeline::draw::budget::fit_space;
use crate::pipeline::draw::budget_of;
use crate::pipeline::draw::pair::{case_index, pick_of, PAIR_STREAM};
use crate::pipeline::draw::tier::StrategyLimits;
use crate::pipeline::recipe::CaseRecipe;
use crate::pipeline::runner::{catch_panic, output_of, Divergence, NoOutput};
use crate::pipeline::shrink::case::shrink_fully;
use attn_backends::{declines_case, run::run_case, Backend};
use attn_reference::relation::{transform, PairOf, Relation, Transformed};
use attn_reference::{reference_output, Case, Space};
use attn_results::compare::Tolerance;
use attn_results::invariance::Drift;
use attn_results::{DivergenceKind, Origin};
use proptest::strategy::ValueTree;
use std::sync::Arc;
use std::time::Duration;

/// The pairs a check runs: those of its shard, sent to every cohort that draws decoder
/// cases; none when one property case was asked for by index.
pub fn items(opts: &CheckOptions, cohorts: &[Cohort]) -> Vec<Item> {
    let pairs = if opts.case_index.is_some() {
        0
    } else {
        opts.pairs as usize
    };
    crate::pipeline::check::subject::items_of(
        (0..pairs).filter(|&i| opts.shard.owns(i)),
        cohorts,
        |c| {
            c.space
                .kinds
                .as_ref()
                .is_none_or(|k| k.contains(&attn_reference::AttentionKind::Decoder))
        },
    )
}

/// What the workers need to draw and run pairs.
pub struct Pairs<'a> {
    pub seed: u64,
    pub limits: StrategyLimits,
    pub poison: bool,
    pub cohorts: &'a [Cohort],
    pub backends: &'a [Arc<dyn Backend>],
}

/// The drawn case of a pair and its other form: the relation of its turn, or the next
/// that applies to the case.
pub struct DrawnPair {
    case: Case,
    other: Option<Transformed>,
}

impl DrawnPair {
    fn draw(recipe: &CaseRecipe, index: usize, pick: u64) -> DrawnPair {
        let case = recipe.build();
        let n = Relation::ALL.len();
        let other = (0..n)
            .map(|k| Relation::ALL[(index + k) % n])
            .find_map(|r| transform(&case, r, pick));
        DrawnPair { case, other }
    }
}

/// A pair's verdict on one backend.
pub enum PairVerdict {
    /// No relation applies to the case (not a decoder case, say).
    NotApplicable,
    /// The backend declined a form (no failure) or failed one (its kind and message: the
    /// property cases judge such failures, the run's control counts them).
    NotJudged(Relation, Option<(DivergenceKind, String)>),
    Judged {
        relation: Relation,
        drift: Drift,
    },
}

impl Subjects for Pairs<'_> {
    type Prepared = PerCohort<DrawnPair>;
    type Verdict = (PairVerdict, Duration);

    fn prepare(&self, item: &Item) -> Self::Prepared {
        let pick = pick_of(self.seed, item.index);
        per_cohort(&item.members, self.cohorts.len(), |c| {
            poisoned_if(
                self.poison,
                case_tree(
                    self.seed ^ PAIR_STREAM,
                    case_index(item.index),
                    self.limits,
                    &self.cohorts[c].space,
                )
                .current(),
            )
        })
        .map(|r| DrawnPair::draw(&r, item.index, pick))
    }

    fn held_bytes(&self, p: &Self::Prepared) -> usize {
        p.distinct()
            .map(|d| {
                d.case.held_bytes()
                    + d.other
                        .as_ref()
                        .map_or(0, |t| t.cases.iter().map(Case::held_bytes).sum::<usize>())
            })
            .sum()
    }

    fn evaluate(&self, p: &Self::Prepared, m: Member) -> Self::Verdict {
        let d = p.of(m.cohort);
        let t0 = std::time::Instant::now();
        let verdict = match &d.other {
            None => PairVerdict::NotApplicable,
            Some(t) => judge_pair(self.backends[m.backend].as_ref(), &d.case, t),
        };
        (verdict, t0.elapsed())
    }
}

/// Run `case` and its form `t` on `backend` and set the compared rows beside each other.
pub fn judge_pair(backend: &dyn Backend, case: &Case, t: &Transformed) -> PairVerdict {
    // A form's output, or how it failed (none: declined).
    let run = |c: &Case| -> Result<Vec<f32>, Option<(DivergenceKind, String)>> {
        declines_case(backend, c).map_err(|_| None)?;
        match output_of(catch_panic(|| run_case(backend, c))) {
            Ok(r) => Ok(r.output),
            Err(NoOutput::Declined(_)) => Err(None),
            Err(NoOutput::Failed(kind, message)) => Err(Some((kind, message))),
        }
    };
    let base = match run(case) {
        Ok(out) => out,
        Err(failed) => return PairVerdict::NotJudged(t.relation, failed),
    };
    let mut others = Vec::with_capacity(t.cases.len());
    for c in &t.cases {
        match run(c) {
            Ok(out) => others.push(out),
            Err(failed) => return PairVerdict::NotJudged(t.relation, failed),
        }
    }
    let head = case.config.head_size_v();
    let width = case.config.num_heads * head;
    let mantissa = match case.config.dtype {
        attn_reference::DType::F32 => 23,
        attn_reference::DType::F16 => 10,
        attn_reference::DType::Bf16 => 7,
    };
    PairVerdict::Judged {
        relation: t.relation,
        drift: Drift::of(&base, &others, &t.rows, (width, head), mantissa),
    }
}

/// Record pair `item` in order: each backend's tally per relation, and a declared
/// relation's moved bits entered as a failure.
pub fn record(
    opts: &CheckOptions,
    pairs: &Pairs<'_>,
    run: &mut RunState<'_>,
    item: &Item,
    ran: Ran<PerCohort<DrawnPair>, (PairVerdict, Duration)>,
    control: &mut RunControl,
) {
    run.oracle_time += ran.oracle;
    let Some(drawn) = &ran.prepared else { return };
    for (m, verdict) in item.members.iter().zip(ran.verdicts) {
        let Some(((verdict, time), wall)) = verdict else {
            continue;
        };
        let member = m.backend;
        let backend = opts.backends[member].as_ref();
        let summary = &mut run.summaries[member];
        summary.backend_seconds += time.as_secs_f64();
        summary.wall_seconds += wall.as_secs_f64();
        let (relation, drift) = match verdict {
            PairVerdict::NotApplicable => continue,
            PairVerdict::NotJudged(r, failed) => {
                // A backend failing every call the same way is given up on here too.
                if let Some((kind, message)) = failed {
                    control.note_failure(member, kind, &message);
                }
                summary.pairs.sent += 1;
                summary.pairs.declined += 1;
                let claim = Claim::of(backend, r, opts.hold.contains(&r));
                tally(summary, claim.is_some(), r).not_judged += 1;
                continue;
            }
            PairVerdict::Judged { relation, drift } => (relation, drift),
        };
        summary.pairs.sent += 1;
        let claim = Claim::of(backend, relation, opts.hold.contains(&relation));
        tally(summary, claim.is_some(), relation).add(&drift);
        crate::pipeline::coverage::count(
            &mut run.coverage,
            backend.name(),
            &[("invariance relation", relation.name())],
        );
        let Some(claim) = claim.filter(|_| !drift.held()) else {
            summary.pairs.passed += 1;
            control.note_pass(member);
            continue;
        };
        summary.pairs.failed += 1;
        let d = drawn.of(m.cohort);
        let divergence = variant(relation, &drift, claim);
        control.note_failure(member, divergence.kind, &divergence.message);
        summary.first_failing_pair.get_or_insert(item.index);
        *summary.divergences.entry(divergence.kind).or_default() += 1;
        let failing = VariantPair {
            opts,
            index: item.index,
            limits: pairs.limits,
            space: &pairs.cohorts[m.cohort].space,
            case: &d.case,
            other: d.other.as_ref().expect("judged pairs have another form"),
            claim,
            divergence,
        };
        lifecycle::enter(opts, run, control, member, &failing);
    }
}

/// Why a backend's bits must not move under a relation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The backend declares the relation.
    Declared,
    /// The run holds the backend to it (`check --hold`, or a replay file that records it).
    Held,
}

impl Claim {
    /// What holds `backend` to `relation`, if anything: its declaration first, then `held`.
    pub fn of(backend: &dyn Backend, relation: Relation, held: bool) -> Option<Claim> {
        if backend.invariant_under().contains(&relation) {
            Some(Claim::Declared)
        } else {
            held.then_some(Claim::Held)
        }
    }

    /// "which the backend declares", as a failure's message says it.
    pub fn words(self) -> &'static str {
        match self {
            Claim::Declared => "which the backend declares",
            Claim::Held => "which the run holds it to (--hold)",
        }
    }
}

/// `summary`'s tally of `relation`, made (marked declared or not) on first use.
fn tally(
    summary: &mut attn_results::BackendSummary,
    declared: bool,
    relation: Relation,
) -> &mut attn_results::invariance::RelationTally {
    summary
        .invariance
        .entry(relation)
        .or_insert_with(|| attn_results::invariance::RelationTally {
            declared,
            ..Default::default()
        })
}

/// The failure of rows that moved under a declared `relation`. Its message starts with
/// what was changed, so the class is the relation's whatever the numbers.
fn variant(relation: Relation, d: &Drift, claim: Claim) -> Divergence {
    Divergence {
        kind: DivergenceKind::Variant,
        message: format!(
            "rows changed under the {relation} relation, {}: {}; {}",
            claim.words(),
            relation.change(),
            moved_words(d)
        ),
        comparison: None,
        output: None,
    }
}

/// "1 of 2 compared rows moved, by up to 3 ulps (first: token 1 head 0, … as drawn, … after)".
pub fn moved_words(d: &Drift) -> String {
    let first = d.first.map_or(String::new(), |(row, head, a, b)| {
        format!(" (first: token {row} head {head}, {a:e} as drawn, {b:e} after)")
    });
    format!(
        "{} of {} compared rows moved, by up to {} ulps{first}",
        d.moved, d.rows, d.max_ulps
    )
}

/// What a variant failure's report says is wrong.
fn variant_hint(relation: Relation) -> String {
    format!(
        "a request's rows depend on what else the call holds ({}: {}): look at {}",
        relation,
        relation.change(),
        relation.suspect()
    )
}

/// A pair whose forms' rows differ under a relation its backend declares.
struct VariantPair<'a> {
    opts: &'a CheckOptions,
    index: usize,
    limits: StrategyLimits,
    space: &'a Space,
    case: &'a Case,
    other: &'a Transformed,
    claim: Claim,
    divergence: Divergence,
}

impl VariantPair<'_> {
    fn origin(&self) -> Origin {
        Origin::Invariance {
            seed: self.opts.seed,
            index: self.index,
            relation: self.other.relation,
        }
    }

    fn stem(&self, backend: &str) -> String {
        format!(
            "{}-seed{}-pair{}",
            sanitize(backend),
            self.opts.seed,
            self.index
        )
    }

    /// The report of `case` (and its form `other`) diverging as `d`, with both forms' files.
    fn reported(
        &self,
        backend: &dyn Backend,
        (case, other, d): (&Case, &Transformed, &Divergence),
        shrunk: Option<attn_results::ShrinkInfo>,
    ) -> (attn_results::FailureRecord, Artifact) {
        let origin = self.origin();
        let stem = self.stem(backend.name());
        let expected = reference_output(case);
        let diverged = Diverged {
            backend: backend.name(),
            origin: &origin,
            case,
            expected: &expected,
            divergence: d,
            // Bitwise: the replay file records no tolerance to meet.
            tolerance: Tolerance::rel_abs(0.0, 0.0),
        };
        let (mut record, mut artifact) = report(self.opts, &diverged, &stem, shrunk);
        record.hint = Some(variant_hint(other.relation));
        // The report's text was rendered without it: the hint is the pair's to give.
        record.text = crate::failure::report::render(&record, case, &expected, d);
        // The replay file rebuilds the other form and compares the two.
        let pair = PairOf {
            relation: other.relation,
            pick: pick_of(self.opts.seed, self.index),
            held_to: self.claim == Claim::Held,
        };
        if let Some(r) = artifact
            .replay
            .as_mut()
            .and_then(|(_, c)| c.recorded.as_mut())
        {
            r.pair = Some(pair);
        }
        artifact.also = other
            .cases
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let name = format!("{stem}.{}{}.json", other.relation, k + 1);
                (self.opts.out_dir.join(name), c.clone())
            })
            .collect();
        (record, artifact)
    }
}

impl Failing for VariantPair<'_> {
    fn member(&self) -> ClassMember {
        ClassMember::Pair(self.index)
    }

    fn divergence(&self) -> &Divergence {
        &self.divergence
    }

    fn signature(&self) -> Signature {
        Signature::of(self.case, &self.divergence)
    }

    fn as_found(&self, backend: &dyn Backend) -> Artifact {
        self.reported(backend, (self.case, self.other, &self.divergence), None)
            .1
    }

    fn shrink_and_report(&self, backend: &dyn Backend, (budget, _): Bounds) -> Reported {
        let opts = self.opts;
        let relation = self.other.relation;
        let pick = pick_of(opts.seed, self.index);
        // The smallest case whose forms still differ under the same relation.
        let mut last: Option<(Case, Transformed, Drift)> = None;
        let fails = |r: &CaseRecipe| {
            let case = poisoned_if(opts.poison, r.clone()).build();
            let Some(t) = transform(&case, relation, pick) else {
                return false;
            };
            match judge_pair(backend, &case, &t) {
                PairVerdict::Judged { drift, .. } if !drift.held() => {
                    last = Some((case, t, drift));
                    true
                }
                _ => false,
            }
        };
        let mut tree = case_tree(
            opts.seed ^ PAIR_STREAM,
            case_index(self.index),
            self.limits,
            self.space,
        );
        let cost = budget_of(case_index(self.index), self.limits);
        let fit = |r: CaseRecipe| fit_space(r, self.space, cost);
        let shrunk = shrink_fully(&mut tree, budget, &fit, fails);
        match last {
            Some((case, other, drift)) if shrunk.accepted > 0 => {
                let d = variant(relation, &drift, self.claim);
                let signature = Signature::shrunk(&case, &d);
                let (record, artifact) =
                    self.reported(backend, (&case, &other, &d), Some(shrunk.info()));
                Reported {
                    record,
                    artifact,
                    shrunk: Some((signature, shrunk.work)),
                }
            }
            // Nothing smaller still differed: the pair as found.
            _ => {
                let (record, artifact) = self.reported(
                    backend,
                    (self.case, self.other, &self.divergence),
                    Some(shrunk.info()),
                );
                Reported {
                    record,
                    artifact,
                    shrunk: None,
                }
            }
        }
    }
}
