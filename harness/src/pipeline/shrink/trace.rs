//! Shrinking a diverging trace: greedy, most drastic first, keeping the symptom (kind,
//! severity, an error's message). In
//! order of preference: fewer steps (stop right after the diverging one), fewer sequences,
//! shorter prompts, outputs and chunks, a smaller cache and batch, then the per-case shrinks
//! of the diverging step's shape (heads, head size, block size, dtype, features).

use crate::pipeline::shrink::{
    greedy, AfterAccept, ShrinkBudget, Shrunk, Weigh, SEQ_WORK, TRY_WORK,
};
use attn_reference::trace::{MaskRecipe, TraceRecipe};
use attn_reference::{DType, Feature};

/// A shrunk trace: the same record as a shrunk case's.
pub type ShrunkTrace = Shrunk<TraceRecipe>;

impl Weigh for TraceRecipe {
    /// From the recipe alone (generating the trace here would draw every token's values a
    /// second time per try): each sequence's decodes against their whole prefix, its K/V
    /// and query rows, a sequence-step per decode token and per prefill chunk (at most
    /// `max_steps` of them), a fixed cost per step, and the cache the trace starts from.
    fn work(&self) -> u64 {
        let c = &self.config;
        let kv_row = (c.num_kv_heads * c.head_size * 2) as u64;
        let q_row = (c.num_heads * c.head_size) as u64;
        let chunk = self.chunk.max(1);
        let steps_cap = self.max_steps as u64;
        let seqs: u64 = self
            .prompts
            .iter()
            .zip(&self.outputs)
            .map(|(&prompt, &output)| {
                let len = (prompt.max(1) + output) as u64;
                let seq_steps = (prompt.max(1).div_ceil(chunk) + output) as u64;
                len * len / 2 * q_row + len * (kv_row + q_row) + seq_steps.min(steps_cap) * SEQ_WORK
            })
            .sum();
        seqs + TRY_WORK * steps_cap + (self.cache_blocks * c.block_size) as u64 * kv_row
    }
}

/// Shrink `recipe` (which diverges at `step`) while `diverges_at` finds it diverging (at the
/// step it returns), its candidates moved by `fit`. After an
/// accepted candidate the same kind is tried again on the smaller trace before moving on
/// (each try runs a whole trace, so the list is not restarted).
pub fn shrink_trace(
    recipe: TraceRecipe,
    step: usize,
    budget: ShrinkBudget,
    fit: &dyn Fn(TraceRecipe) -> TraceRecipe,
    mut diverges_at: impl FnMut(&TraceRecipe) -> Option<usize>,
) -> ShrunkTrace {
    let mut start = recipe;
    start.max_steps = start.max_steps.min(step + 1);
    greedy(
        start,
        budget,
        AfterAccept::SameCandidate,
        &|r| candidates(r, fit),
        |c| {
            diverges_at(c).map(|at| {
                // Stop right after the step it now diverges at.
                let mut kept = c.clone();
                kept.max_steps = kept.max_steps.min(at + 1);
                kept
            })
        },
    )
}

/// Simpler neighbours of `r`, most drastic first, each moved inside the space by `fit`.
fn candidates(r: &TraceRecipe, fit: &dyn Fn(TraceRecipe) -> TraceRecipe) -> Vec<TraceRecipe> {
    let mut out: Vec<TraceRecipe> = Vec::new();
    let mut push = |f: &dyn Fn(&mut TraceRecipe)| {
        let mut c = r.clone();
        f(&mut c);
        let c = fit(c);
        // Never larger in a size (fitting can round one up; the loop must not cycle).
        let larger = c.config.head_size > r.config.head_size
            || c.config.block_size > r.config.block_size
            || c.config.num_heads > r.config.num_heads;
        if &c != r && !larger && !out.contains(&c) {
            out.push(c);
        }
    };
    push(&|c| c.max_steps = c.max_steps.saturating_sub(1).max(1));
    for i in 0..r.prompts.len() {
        push(&|c| {
            c.prompts.remove(i);
            c.outputs.remove(i);
            if i < c.sharing {
                c.sharing -= 1;
            }
            if let Some(m) = c.masks.as_mut() {
                m.remove_seq(i);
            }
        });
    }
    push(&|c| c.sharing = 0);
    push(&|c| c.shared_prefix = 0);
    for i in 0..r.prompts.len() {
        push(&|c| c.outputs[i] = 0);
        push(&|c| c.outputs[i] /= 2);
        push(&|c| c.outputs[i] = c.outputs[i].saturating_sub(1));
        push(&|c| c.prompts[i] = c.prompts[i].div_ceil(2));
        push(&|c| c.prompts[i] = c.prompts[i].saturating_sub(1).max(1));
    }
    push(&|c| c.shared_prefix /= 2);
    push(&|c| c.shared_prefix = c.shared_prefix.saturating_sub(1));
    push(&|c| c.chunk = 1);
    push(&|c| c.chunk = c.chunk.div_ceil(2));
    push(&|c| c.chunk = c.chunk.saturating_sub(1).max(1));
    push(&|c| c.token_budget = c.token_budget.div_ceil(2).max(1));
    push(&|c| c.token_budget = c.token_budget.saturating_sub(1).max(1));
    push(&|c| c.max_running = c.max_running.saturating_sub(1).max(1));
    push(&|c| c.cache_blocks = c.cache_blocks.min(1));
    push(&|c| c.cache_blocks = c.cache_blocks.div_ceil(2));
    push(&|c| c.cache_blocks = c.cache_blocks.saturating_sub(1));
    // The per-case shrinks of the step's shape.
    // Per-head values (ALiBi slopes, sinks) follow the head count.
    let heads = |c: &mut TraceRecipe, q: usize, kv: usize| {
        c.config.num_heads = q;
        c.config.num_kv_heads = kv;
        if let Some(a) = &mut c.config.alibi_slopes {
            *a = crate::pipeline::recipe::alibi_slopes(q);
        }
        if let Some(s) = &mut c.config.sinks {
            s.resize(q, 0.0);
        }
        if let Some(k) = &mut c.config.kv_cache {
            *k = k.fitted_to_heads(kv);
        }
    };
    push(&|c| heads(c, 1, 1));
    push(&|c| heads(c, c.config.num_kv_heads, c.config.num_kv_heads));
    // One kv head with the group kept, and the group cut to just past the power of two
    // below it (kernels pack query heads in powers of two: 17 heads per kv head are past a
    // pack of 16, as 48 are).
    let group = r.config.num_heads / r.config.num_kv_heads.max(1);
    push(&|c| heads(c, group, 1));
    if group > 2 {
        let past = (group - 1).next_power_of_two() / 2 + 1;
        push(&|c| heads(c, past * c.config.num_kv_heads, c.config.num_kv_heads));
    }
    push(&|c| c.config.head_size = 1);
    push(&|c| c.config.head_size = c.config.head_size.div_ceil(2));
    // An MLA entry's V is its prefix: both widths shrink together.
    if r.config.mla.is_some() {
        let mla_widths = |c: &mut TraceRecipe, cut: fn(usize) -> usize| {
            if let Some(m) = c.config.mla.as_mut() {
                let rope = c.config.head_size - m.head_size_v;
                m.head_size_v = cut(m.head_size_v);
                c.config.head_size = m.head_size_v + cut(rope);
            }
        };
        push(&|c| mla_widths(c, |_| 1));
        push(&|c| mla_widths(c, |w| w.div_ceil(2)));
    }
    push(&|c| c.config.block_size = 1);
    push(&|c| c.config.block_size = c.config.block_size.div_ceil(2));
    push(&|c| c.config.block_size = c.config.block_size.saturating_sub(1).max(1));
    push(&|c| c.config.dtype = DType::F32);
    // Every optional feature of the config off, one at a time (the features are data).
    for f in Feature::ALL {
        push(&|c| {
            f.turn_off(&mut c.config);
        });
    }
    // vLLM 0.33's masks, as data: all off, each kind off, each request's off, each range.
    if let Some(m) = &r.masks {
        push(&|c| c.masks = None);
        push(&|c| on_masks(c, |m| m.non_causal = 0));
        push(&|c| on_masks(c, |m| m.ranges.clear()));
        push(&|c| on_masks(c, |m| m.rswa = None));
        push(&|c| on_masks(c, |m| m.clamp = false));
        for i in 0..r.prompts.len().min(64) {
            push(&|c| on_masks(c, |m| m.non_causal &= !(1 << i)));
            push(&|c| on_masks(c, |m| m.range_seqs &= !(1 << i)));
        }
        for i in 0..m.ranges.len() {
            push(&|c| {
                on_masks(c, |m| {
                    m.ranges.remove(i);
                })
            });
            push(&|c| on_masks(c, |m| m.ranges[i].1 = m.ranges[i].0));
        }
    }
    push(&|c| c.poison = None);
    out
}

/// `f` on the masks of `c`, where it has any.
fn on_masks(c: &mut TraceRecipe, f: impl Fn(&mut MaskRecipe)) {
    if let Some(m) = c.masks.as_mut() {
        f(m);
    }
}
