//! Shrinking a failing recipe to a minimal one with proptest's value trees: simplify while the
//! failure persists, step back (complicate) when a simplification made it pass.

use crate::strategy::CaseRecipe;
use proptest::strategy::ValueTree;
use std::time::{Duration, Instant};

/// How far a shrink may go. Its default limits are in steps and in work, never in time, so
/// a failure shrinks to the same case on any machine, under any load and at any `--jobs`; a
/// time limit is only there when a person asks for one (`--shrink-time`).
#[derive(Clone, Copy, Debug)]
pub struct ShrinkBudget {
    pub max_steps: usize,
    /// Work the candidates tried may add up to, in [`Weigh`] units.
    pub max_work: u64,
    pub max_time: Option<Duration>,
}

impl ShrinkBudget {
    /// No shrinking (`--no-shrink`): a failure is reported as found.
    pub const NONE: ShrinkBudget = ShrinkBudget {
        max_steps: 0,
        max_work: 0,
        max_time: None,
    };

    /// Work each pass of a shrink may spend by default: 15-20 s of the heaviest candidates
    /// (two prefills of 5,000 tokens, about 1.5 s a try) on a 2-core EPYC, far more than most
    /// shrinks need (they end when nothing smaller fails).
    pub const DEFAULT_WORK: u64 = 1_000_000_000;

    /// Whether a shrink begun at `start` that has tried `steps` candidates of `work` in all
    /// may try one more of `next` work: within every limit and not interrupted.
    pub fn allows(&self, (steps, work): (usize, u64), next: u64, start: Instant) -> bool {
        steps < self.max_steps
            && work.saturating_add(next) <= self.max_work
            && self.max_time.is_none_or(|t| start.elapsed() < t)
            && !crate::interrupt::interrupted()
    }
}

impl Default for ShrinkBudget {
    fn default() -> Self {
        ShrinkBudget {
            max_steps: 4000,
            max_work: Self::DEFAULT_WORK,
            max_time: None,
        }
    }
}

/// What trying one shrink candidate costs, in machine-independent units (about a
/// multiply-add of the oracle, or one element written): what a shrink's budget counts.
pub trait Weigh {
    fn work(&self) -> u64;
}

/// A try's fixed cost beyond its arithmetic: building the case, the calls, the comparison.
pub const TRY_WORK: u64 = 100_000;

/// What each sequence of a batch adds beyond its arithmetic (its block table, its share of
/// the scheduling, checking and comparing): a batch of a thousand one-token decodes takes
/// about a second a try.
pub const SEQ_WORK: u64 = 100_000;

impl Weigh for CaseRecipe {
    /// The oracle's multiply-adds, plus every K/V and query element the case writes, plus
    /// each sequence's own cost.
    fn work(&self) -> u64 {
        let (seq_lens, query_lens) = self.lens();
        let kv = seq_lens.iter().sum::<usize>() * self.num_kv_heads * self.head_size * 2;
        let q = query_lens.iter().sum::<usize>() * self.num_heads() * self.head_size;
        (crate::strategy::cost(self) + kv + q) as u64 + seq_lens.len() as u64 * SEQ_WORK + TRY_WORK
    }
}

/// The end of a shrink, of a property case's recipe or a trace's.
#[derive(Clone, Debug)]
pub struct Shrunk<R = CaseRecipe> {
    pub recipe: R,
    /// Ended on the budget or an interrupt rather than because nothing smaller failed.
    pub exhausted: bool,
    /// Shrink steps that still failed.
    pub accepted: usize,
    pub steps: usize,
    /// [`Weigh`] units of the candidates tried.
    pub work: u64,
    pub elapsed: Duration,
}

impl<R> Shrunk<R> {
    /// What a report says of this shrink.
    pub fn info(&self) -> attn_results::ShrinkInfo {
        attn_results::ShrinkInfo {
            steps: self.steps,
            accepted: self.accepted,
            seconds: self.elapsed.as_secs_f64(),
            exhausted: self.exhausted,
        }
    }
}

/// Where a greedy pass goes on after a candidate still failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterAccept {
    /// Back to the most drastic candidate of the new recipe, never returning to a recipe
    /// accepted before (lateral moves cannot cycle).
    FromTheTop,
    /// The same kind of candidate again on the new recipe, then on down the list; another
    /// sweep while the last one made progress (cheaper when each try is a whole trace).
    SameCandidate,
}

/// The one greedy shrinker: try `candidates` of the best recipe so far, most drastic first;
/// `still_fails` says whether one still fails, giving the recipe to keep (which may be
/// trimmed further, e.g. to the step it now diverges at). Ends when no candidate fails, or
/// on the budget.
pub fn greedy<R: Clone + PartialEq + Weigh>(
    start_from: R,
    budget: ShrinkBudget,
    after: AfterAccept,
    candidates: &dyn Fn(&R) -> Vec<R>,
    mut still_fails: impl FnMut(&R) -> Option<R>,
) -> Shrunk<R> {
    let start = Instant::now();
    let mut best = start_from;
    let (mut steps, mut accepted, mut work) = (0, 0, 0);
    let mut visited = vec![best.clone()];
    let (mut i, mut progress) = (0, false);
    let mut cs = candidates(&best);
    let exhausted = loop {
        if i >= cs.len() {
            if after == AfterAccept::SameCandidate && progress {
                (i, progress) = (0, false);
                continue;
            }
            break false;
        }
        let c = &cs[i];
        if after == AfterAccept::FromTheTop && visited.contains(c) {
            i += 1;
            continue;
        }
        let next = c.work();
        if !budget.allows((steps, work), next, start) {
            break true;
        }
        steps += 1;
        work += next;
        match still_fails(c) {
            Some(kept) => {
                if after == AfterAccept::FromTheTop {
                    visited.push(c.clone());
                    i = 0;
                }
                best = kept;
                cs = candidates(&best);
                accepted += 1;
                progress = true;
            }
            None => i += 1,
        }
    };
    Shrunk {
        recipe: best,
        exhausted,
        accepted,
        steps,
        work,
        elapsed: start.elapsed(),
    }
}

/// Shrink `tree` (whose current value fails) while `fails` holds.
pub fn shrink<T>(
    tree: &mut T,
    budget: ShrinkBudget,
    mut fails: impl FnMut(&CaseRecipe) -> bool,
) -> Shrunk
where
    T: ValueTree<Value = CaseRecipe>,
{
    let start = Instant::now();
    let mut best = tree.current();
    let (mut steps, mut accepted, mut work) = (0, 0, 0);
    // Nothing simpler to try: done, not exhausted. Otherwise ending on the budget is.
    let mut exhausted = tree.simplify();
    while exhausted {
        let candidate = tree.current();
        let next = candidate.work();
        if !budget.allows((steps, work), next, start) {
            break;
        }
        steps += 1;
        work += next;
        if fails(&candidate) {
            best = candidate;
            accepted += 1;
            if !tree.simplify() {
                exhausted = false;
                break;
            }
        } else if !tree.complicate() {
            exhausted = false;
            break;
        }
    }
    Shrunk {
        recipe: best,
        exhausted,
        accepted,
        steps,
        work,
        elapsed: start.elapsed(),
    }
}

/// Batches larger than this are bisected before single sequences are removed, and skip
/// proptest's pass, which removes one element per try.
const BISECT_ABOVE: usize = 8;
/// Sequences above which a shrink step tries no candidate per sequence.
const PER_SEQUENCE_ABOVE: usize = 512;

/// Simpler neighbours of a recipe, most drastic first: what a person would try by hand. Each
/// goes through `fit` (the backend's space), so none leaves it.
fn candidates(r: &CaseRecipe, fit: &dyn Fn(CaseRecipe) -> CaseRecipe) -> Vec<CaseRecipe> {
    let mut out: Vec<CaseRecipe> = Vec::new();
    let mut push = |f: &dyn Fn(&mut CaseRecipe)| {
        let mut c = r.clone();
        f(&mut c);
        let c = fit(c);
        // Never larger in a size: fitting into a space can round a size up, and a candidate
        // larger than its recipe would let the greedy loop cycle between the two.
        let larger = c.head_size > r.head_size
            || c.block_size > r.block_size
            || c.group > r.group
            || c.num_kv_heads > r.num_kv_heads;
        if &c != r && !larger && !out.contains(&c) {
            out.push(c);
        }
    };
    // A large batch is bisected first: a bug one sequence triggers is found in about
    // log2(n) tries instead of one try (of the whole batch) per sequence removed.
    if r.seqs.len() > BISECT_ABOVE {
        let half = r.seqs.len() / 2;
        push(&|c| c.seqs.truncate(half));
        push(&|c| {
            c.seqs.drain(..half);
        });
    }
    // Past [`PER_SEQUENCE_ABOVE`] sequences only moves of the whole batch: the tail cut by an
    // eighth, a sixty-fourth or one (a step that fails only past 8,192 decodes gets to 8,193
    // in a few dozen tries), every query halved, then what follows the sequences. One
    // candidate per sequence would be thousands of copies of a batch of thousands.
    let per_sequence = r.seqs.len() <= PER_SEQUENCE_ABOVE;
    if !per_sequence {
        let n = r.seqs.len();
        for keep in [n - n / 8, n - n / 64, n - 1] {
            push(&|c| c.seqs.truncate(keep));
        }
    }
    // The big moves before the small ones: one sequence alone, every query halved at once
    // (a failure that needs two sequences of 15 new tokens also fails with 2 and 2 where
    // one sequence at a time, a token at a time, stalls).
    if r.seqs.len() > 1 && per_sequence {
        for i in 0..r.seqs.len() {
            push(&|c| c.seqs = vec![r.seqs[i]]);
        }
    }
    if r.seqs.iter().any(|&(_, q)| q > 1) {
        push(&|c| c.seqs.iter_mut().for_each(|s| s.1 = (s.1 / 2).max(1)));
    }
    for i in (0..r.seqs.len()).filter(|_| per_sequence) {
        if r.seqs.len() > 1 {
            push(&|c| {
                c.seqs.remove(i);
            });
        }
        let (ctx, q) = r.seqs[i];
        // Halving, then smaller cuts, then one: a 100k context that only fails past 256
        // keys gets to 257 in a few dozen steps rather than thousands.
        for new_ctx in [
            0,
            ctx / 2,
            ctx - ctx / 8,
            ctx - ctx / 64,
            ctx.saturating_sub(1),
        ] {
            push(&|c| c.seqs[i].0 = new_ctx);
        }
        for new_q in [1, 2, q / 2, q - q / 8, q.saturating_sub(1)] {
            if new_q < q {
                push(&|c| c.seqs[i].1 = new_q.max(1));
            }
        }
        // Move tokens from the query into the context (keeps the length, shortens the query).
        if q > 1 {
            push(&|c| c.seqs[i] = (ctx + q - 1, 1));
        }
    }
    push(&|c| c.share = None);
    if let Some(sh) = r.share {
        push(&|c| {
            c.share = Some(crate::strategy::Share {
                group: 2,
                blocks: 1.max(sh.blocks - 1),
            })
        });
    }
    // Every optional feature off, one at a time.
    for off in attn_reference::Feature::OPTIONAL
        .into_iter()
        .filter_map(|f| r.without(f))
    {
        push(&|c| *c = off.clone());
    }
    if let Some(w) = r.window {
        for new_w in [1, w / 2, w - 1] {
            push(&|c| c.window = Some(new_w.max(1)));
        }
    }
    if let Some(n) = r.chunk {
        for new_n in [1, n / 2, n - 1] {
            push(&|c| c.chunk = Some(new_n.max(1)));
        }
    }
    // PrefixLM: one range at a time gone, the ranges on the first request only, no clamp;
    // then every sequence halved with its ranges kept where they are (the spans are
    // thousandths of a length: halving it alone would shrink a narrow range to one token).
    if let Some(p) = &r.prefix_lm {
        if r.seqs.iter().any(|&(ctx, q)| ctx + q > 1) {
            push(&|c| {
                for s in &mut c.seqs {
                    *s = (s.0 / 2, (s.1 / 2).max(1));
                }
                if let Some(p) = &mut c.prefix_lm {
                    for span in &mut p.spans {
                        *span = ((span.0 * 2).min(1000), (span.1 * 2).min(1000));
                    }
                }
            });
        }
        for i in 0..p.spans.len() {
            push(&|c| {
                if let Some(p) = &mut c.prefix_lm {
                    p.spans.remove(i);
                }
            });
        }
        push(&|c| {
            if let Some(p) = &mut c.prefix_lm {
                p.seqs &= 1;
            }
        });
        push(&|c| {
            if let Some(p) = &mut c.prefix_lm {
                p.clamp = false;
            }
        });
    }
    if let Some(rs) = r.rswa {
        for new_w in [1, rs.window / 2, rs.window - 1] {
            push(&|c| {
                c.rswa = Some(crate::strategy::RswaRecipe {
                    window: new_w.max(1),
                    ..rs
                })
            });
        }
    }
    push(&|c| c.scale = None);
    push(&|c| c.poison = None);
    if let Some(total) = r.cache_blocks {
        // Keep the blocks high while it still fails; drop the huge cache when it does not
        // matter.
        push(&|c| c.cache_blocks = None);
        push(&|c| c.cache_blocks = Some(total / 2));
    }
    push(&|c| c.num_kv_heads = 1);
    push(&|c| c.num_kv_heads = (c.num_kv_heads - 1).max(1));
    push(&|c| c.group = 1);
    push(&|c| c.group = (c.group - 1).max(1));
    for d in [1, 2, r.head_size / 2, r.head_size - 1] {
        if d < r.head_size {
            push(&|c| c.head_size = d.max(1));
        }
    }
    for b in [1, r.block_size / 2, r.block_size - 1] {
        push(&|c| c.block_size = b.max(1));
    }
    push(&|c| c.padding_tokens = 0);
    push(&|c| c.spare_blocks = 0);
    push(&|c| c.table = crate::strategy::TableOrder::Sequential);
    push(&|c| c.dtype = attn_reference::DType::F32);
    // Small integers: other simple seeds are lateral moves (a size that stops failing with
    // one set of values may fail with another); `refine` takes each recipe at most once, so
    // they cannot cycle.
    for seed in 0..4 {
        push(&|c| c.values = crate::strategy::Values::Simple(seed));
    }
    out
}

/// After proptest's shrinking: greedy passes over [`candidates`] until none still fails, so
/// components that can only shrink together (a window and a sequence length) get there.
pub fn refine(
    recipe: CaseRecipe,
    budget: ShrinkBudget,
    fit: &dyn Fn(CaseRecipe) -> CaseRecipe,
    mut fails: impl FnMut(&CaseRecipe) -> bool,
) -> Shrunk {
    greedy(
        recipe,
        budget,
        AfterAccept::FromTheTop,
        &|r| candidates(r, fit),
        |c| fails(c).then(|| c.clone()),
    )
}

/// proptest's shrinking of the tree (whose values are inside the space already), then
/// [`refine`] with `fit` moving its candidates inside: the whole shrink of a failing case.
pub fn shrink_fully<T>(
    tree: &mut T,
    budget: ShrinkBudget,
    fit: &dyn Fn(CaseRecipe) -> CaseRecipe,
    mut fails: impl FnMut(&CaseRecipe) -> bool,
) -> Shrunk
where
    T: ValueTree<Value = CaseRecipe>,
{
    // proptest's pass takes a step per element removed, each a try of the whole batch: a
    // large batch goes straight to the greedy pass, which bisects it.
    let found = tree.current();
    if found.seqs.len() > BISECT_ABOVE {
        return refine(found, budget, fit, &mut fails);
    }
    // Each pass has the whole budget: proptest's may spend it all on a heavy case, and the
    // greedy pass is the one that halves lengths and sizes.
    let first = shrink(tree, budget, &mut fails);
    let second = refine(first.recipe.clone(), budget, fit, &mut fails);
    Shrunk {
        recipe: second.recipe,
        // proptest's pass may end on the budget while refining still finishes.
        exhausted: second.exhausted || (first.exhausted && second.steps == 0),
        accepted: first.accepted + second.accepted,
        steps: first.steps + second.steps,
        work: first.work + second.work,
        elapsed: first.elapsed + second.elapsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Weigh for u32 {
        fn work(&self) -> u64 {
            1
        }
    }

    fn halve_or_step(x: &u32) -> Vec<u32> {
        [x / 2, x.saturating_sub(1)]
            .into_iter()
            .filter(|c| c != x)
            .collect()
    }

    #[test]
    fn both_orders_reach_the_smallest_failing_value() {
        for after in [AfterAccept::FromTheTop, AfterAccept::SameCandidate] {
            let s = greedy(100, ShrinkBudget::default(), after, &halve_or_step, |&x| {
                (x >= 37).then_some(x)
            });
            assert_eq!((s.recipe, s.exhausted), (37, false), "{after:?}");
            assert!(s.accepted >= 3 && s.steps > s.accepted, "{after:?} {s:?}");
        }
    }

    #[test]
    fn the_budget_ends_a_shrink_and_says_so() {
        // Every candidate still fails: only the budget ends the shrink.
        let all_fail = |budget| {
            greedy(
                1000,
                budget,
                AfterAccept::FromTheTop,
                &halve_or_step,
                |&x| Some(x),
            )
        };
        let s = all_fail(ShrinkBudget {
            max_steps: 3,
            ..ShrinkBudget::default()
        });
        assert_eq!((s.recipe, s.steps, s.exhausted), (125, 3, true));
        // Work ends it the same way, whatever the machine.
        let s = all_fail(ShrinkBudget {
            max_work: 2,
            ..ShrinkBudget::default()
        });
        assert_eq!((s.recipe, s.steps, s.work, s.exhausted), (250, 2, 2, true));
    }

    #[test]
    fn a_shrink_ends_the_same_however_slow_its_tries_are() {
        // The default budget has no time limit: a slow machine (or a loaded one, or one of
        // many jobs) gets the same shrunk recipe as a fast one.
        let budget = ShrinkBudget {
            max_work: 5,
            ..ShrinkBudget::default()
        };
        let run = |delay: u64| {
            greedy(
                1000,
                budget,
                AfterAccept::FromTheTop,
                &halve_or_step,
                |&x| {
                    std::thread::sleep(Duration::from_millis(delay));
                    (x >= 3).then_some(x)
                },
            )
        };
        let (fast, slow) = (run(0), run(30));
        assert_eq!(
            (fast.recipe, fast.steps, fast.exhausted),
            (slow.recipe, slow.steps, slow.exhausted)
        );
        assert_eq!((fast.recipe, fast.work, fast.exhausted), (31, 5, true));
    }

    #[test]
    fn a_lateral_move_never_cycles_back() {
        // Every candidate "still fails" and the only one is a lateral move: from the top, a
        // recipe once accepted is not tried again, so the shrink ends.
        let s = greedy(
            4,
            ShrinkBudget::default(),
            AfterAccept::FromTheTop,
            &|x: &u32| vec![x ^ 1],
            |&x| Some(x),
        );
        assert_eq!((s.recipe, s.steps, s.exhausted), (5, 1, false));
    }

    #[test]
    fn the_kept_recipe_is_what_the_judge_returns() {
        // A trace is cut to the step it now diverges at: the judge's recipe is kept, not the
        // candidate.
        let s = greedy(
            64,
            ShrinkBudget::default(),
            AfterAccept::SameCandidate,
            &halve_or_step,
            |&x| (x >= 10).then_some(x - x % 10),
        );
        assert_eq!(s.recipe, 10);
    }
}
