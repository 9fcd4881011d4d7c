//! Shrinking a failing property case: proptest's value tree first, then greedy passes over
//! simpler recipes (fewer and shorter sequences, smaller sizes, features off).

use super::{greedy, AfterAccept, ShrinkBudget, Shrunk, Weigh, SEQ_WORK, TRY_WORK};
use crate::pipeline::recipe::{cost, CaseRecipe};
use proptest::strategy::ValueTree;
use std::time::Instant;

impl Weigh for CaseRecipe {
    /// The oracle's multiply-adds, plus every K/V and query element the case writes, plus
    /// each sequence's own cost.
    fn work(&self) -> u64 {
        let (seq_lens, query_lens) = self.lens();
        let kv = seq_lens.iter().sum::<usize>() * self.num_kv_heads * self.head_size * 2;
        let q = query_lens.iter().sum::<usize>() * self.num_heads() * self.head_size;
        (cost(self) + kv + q) as u64 + seq_lens.len() as u64 * SEQ_WORK + TRY_WORK
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
        if !budget.allows(steps, work, next, start) {
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
            c.share = Some(crate::pipeline::recipe::Share {
                group: 2,
                blocks: 1.max(sh.blocks - 1),
            })
        });
    }
    // Every optional feature off, one at a time.
    for off in attn_reference::Feature::ALL
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
                c.rswa = Some(crate::pipeline::recipe::RswaRecipe {
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
    push(&|c| c.table = crate::pipeline::recipe::TableOrder::Sequential);
    push(&|c| c.dtype = attn_reference::DType::F32);
    // Small integers: other simple seeds are lateral moves (a size that stops failing with
    // one set of values may fail with another); `refine` takes each recipe at most once, so
    // they cannot cycle.
    for seed in 0..4 {
        push(&|c| c.values = crate::pipeline::recipe::Values::Simple(seed));
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
