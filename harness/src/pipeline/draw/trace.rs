//! Serving traces drawn from (seed, index): small shapes, a tight cache, shared prefixes,
//! and one trace in twenty a production model's layout ([`super::production`]).

use super::production::{is_production, production_recipe};
use attn_reference::trace::{MaskRecipe, TraceRecipe};
use attn_reference::{AttentionConfig, DType, InputRng, Poison, Space};

/// Traces a `check` runs when `--traces` does not say otherwise.
pub const DEFAULT_TRACES: u32 = 100;

/// The head and block sizes traces draw from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceShapes {
    pub head_sizes: Vec<usize>,
    pub block_sizes: Vec<usize>,
}

impl Default for TraceShapes {
    /// Small and odd sizes (the point is the cache's life, not the kernel's width) and the
    /// common ones.
    fn default() -> Self {
        TraceShapes {
            head_sizes: vec![1, 2, 4, 8, 13, 16, 32, 64, 80, 128],
            block_sizes: vec![1, 2, 3, 4, 5, 8, 16, 16, 32],
        }
    }
}

/// Trace recipe `index` of `seed`: a deterministic function of both, so shards and replays
/// regenerate the same trace. Small shapes, a tight cache (so blocks are reused and
/// sequences preempted), shared prefixes in about half the traces.
pub fn trace_recipe(seed: u64, index: usize) -> TraceRecipe {
    trace_recipe_with(seed, index, &TraceShapes::default())
}

/// [`trace_recipe`] with head and block sizes drawn from `shapes` (to aim traces at what a
/// backend runs: `--trace-head-sizes`, `--trace-block-sizes`).
///
/// With the default shapes, one trace in [`crate::pipeline::draw::production::PRODUCTION_EVERY`] is instead a model's layout
/// ([`crate::pipeline::draw::production`]); shapes aimed elsewhere draw none.
pub fn trace_recipe_with(seed: u64, index: usize, shapes: &TraceShapes) -> TraceRecipe {
    if is_production(index) && *shapes == TraceShapes::default() {
        return production_recipe(seed, index);
    }
    let mut rng = InputRng::new(seed ^ 0x7 ^ (index as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut pick = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let num_kv_heads = pick(1, 2);
    let num_heads = num_kv_heads * [1, 2, 4][pick(0, 2)];
    let one_of = |v: &[usize], i: usize| v[i.min(v.len() - 1)];
    let head_size = one_of(
        &shapes.head_sizes,
        pick(0, shapes.head_sizes.len().max(1) - 1),
    );
    let block_size = one_of(
        &shapes.block_sizes,
        pick(0, shapes.block_sizes.len().max(1) - 1),
    );
    let dtype = [DType::F32, DType::F32, DType::Bf16, DType::F16][pick(0, 3)];
    let mut config = AttentionConfig::new(num_heads, num_kv_heads, head_size, block_size, dtype);
    if pick(0, 5) == 0 {
        config.sliding_window = Some(pick(1, 24));
    }
    if pick(0, 7) == 0 {
        config.logits_soft_cap = Some(10.0);
    }
    let n = pick(1, 6);
    let sharing = if pick(0, 1) == 0 {
        pick(2, 6).min(n)
    } else {
        0
    };
    let mut recipe = TraceRecipe {
        config,
        prompts: (0..n).map(|_| pick(1, 4 * block_size + 3)).collect(),
        outputs: (0..n).map(|_| pick(0, 2 * block_size + 2)).collect(),
        sharing,
        shared_prefix: pick(block_size, 3 * block_size),
        chunk: pick(1, 3 * block_size),
        token_budget: pick(2, 6 * block_size),
        max_running: pick(1, 4),
        cache_blocks: pick(2, 12),
        max_steps: 48,
        seed: rng_seed(seed, index),
        // One trace in four starts on a poisoned cache (drawn last: the rest is unchanged).
        poison: Poison::ALL.get(pick(0, 15)).copied(),
        masks: None,
    };
    // The features of a step's config beyond window and soft-cap, drawn after everything
    // else so every earlier draw is what it was: ALiBi, sinks, an FP8 cache and local
    // chunks each in about one trace in six, so their positions and scales live across
    // steps too.
    let c = &mut recipe.config;
    if pick(0, 5) == 0 {
        c.alibi_slopes = Some(crate::pipeline::recipe::alibi_slopes(c.num_heads));
    }
    if pick(0, 5) == 0 {
        let sinks = (0..c.num_heads).map(|_| pick(0, 16) as f32 / 2.0 - 4.0);
        c.sinks = Some(sinks.collect());
    }
    if pick(0, 5) == 0 {
        c.kv_cache = Some(crate::pipeline::draw::fields::fp8_cache(&mut pick));
    }
    // Local chunks in about one trace in six, drawn last: decodes cross chunk boundaries
    // from one step to the next.
    if pick(0, 5) == 0 {
        c.attention_chunk_size = Some(pick(1, 3 * c.block_size));
        // Half of them look back a chunk or two (drawn after, so the chunk is as before).
        if pick(0, 1) == 0 {
            c.chunk_lookback = Some(pick(1, 2));
        }
    }
    // vLLM 0.33's per-request masks in about one trace in five, drawn last (every draw above
    // is as before): non-causal requests, PrefixLM ranges in the prompts (chunked prefill
    // splits them across steps, blocks and query chunks; some one token long) and R-SWA,
    // each kept by its request across steps.
    if pick(0, 4) == 0 {
        let block_size = recipe.config.block_size;
        let mut m = MaskRecipe::default();
        if pick(0, 2) == 0 {
            m.non_causal = pick(1, 63) as u64;
        }
        if pick(0, 1) == 0 {
            let mut points: Vec<u16> = (0..2 * pick(1, 3)).map(|_| pick(0, 1000) as u16).collect();
            points.sort_unstable();
            m.ranges = points
                .chunks_exact(2)
                .map(|p| {
                    if pick(0, 3) == 0 {
                        (p[0], p[0])
                    } else {
                        (p[0], p[1])
                    }
                })
                .collect();
            m.range_seqs = if pick(0, 1) == 0 {
                u64::MAX
            } else {
                pick(1, 63) as u64
            };
            m.clamp = pick(0, 2) == 0;
        }
        if pick(0, 1) == 0 {
            // Half of them keep the whole prompt, as vLLM's runner sets the prefix.
            let prefix = if pick(0, 1) == 0 { 1000 } else { pick(0, 1000) };
            m.rswa = Some((pick(1, 2 * block_size + 2), prefix as u16));
        }
        recipe.masks = Some(m);
    }
    // A window or local chunks leave blocks behind (the null block, stale memory): half of
    // those traces without poison get NaN or an infinity there, drawn last, so a kernel that
    // loads a skipped block and weighs it by 0 meets a value 0 · v cannot hide.
    let c = &recipe.config;
    if (c.sliding_window.is_some() || c.attention_chunk_size.is_some())
        && recipe.poison.is_none()
        && pick(0, 1) == 0
    {
        recipe.poison = Some(Poison::ALL[pick(0, 2)]);
    }
    // An FP8 cache's scales per tensor, per kv head or per token by thirds, drawn last: a
    // per-token scale cache lives across steps with its blocks (freed, reused, rewritten).
    if let Some(cache) = recipe.config.kv_cache.take() {
        let top = 1 + pick(0, 2) as u64;
        let cache = crate::pipeline::draw::fields::scale_granularity(cache, top, &mut pick);
        recipe.config.kv_cache = Some(cache.fitted_to_heads(recipe.config.num_kv_heads));
    }
    recipe
}

/// Whether `space` has traces to draw: decoder steps over K and V rows (the drawn traces are
/// ordinary attention and only the production ones MLA, so a space of MLA alone has none).
pub fn draws_traces(space: &Space) -> bool {
    space.allows_kind(attn_reference::AttentionKind::Decoder)
        && space.allows_kv_layout(attn_reference::mla::KvLayout::Mha)
}

/// `r` moved inside `space`: its config as [`Space::fit_config`] moves a case's, at most
/// `max_seqs` sequences running, `max_tokens` per step, prefill chunks of at most
/// `max_query_len`, sequences of at most `max_seq_len` tokens. The identity on the full
/// space. Every trace a `check` draws and every trace shrink candidate goes through it.
pub fn fit_trace(mut r: TraceRecipe, space: &Space) -> TraceRecipe {
    if space.is_full() {
        return r;
    }
    let mla_model = r.config.mla.is_some();
    space.fit_config(&mut r.config);
    // An MLA model's trace stays MLA where the space allows it (elsewhere it runs as ordinary
    // attention at its size); a drawn trace never becomes one (an MLA-only space, which
    // `check` draws no trace for, would otherwise get one with masks MLA refuses).
    if !mla_model || !space.allows_feature(attn_reference::Feature::Mla) {
        attn_reference::Feature::Mla.turn_off(&mut r.config);
    }
    // The masks the space leaves out.
    use attn_reference::Feature;
    if let Some(m) = r.masks.as_mut() {
        if !space.allows_feature(Feature::NonCausal) {
            m.non_causal = 0;
        }
        if !space.allows_feature(Feature::PrefixLm) {
            m.ranges.clear();
        }
        if !space.allows_feature(Feature::Rswa) {
            m.rswa = None;
        }
    }
    // Traces are a decoder's life: a space without decoders runs none (`check` draws no
    // trace for it), and a trace never becomes anything else.
    r.config.kind = attn_reference::AttentionKind::Decoder;
    if let Some(m) = space.max_seqs.filter(|&m| m >= 1) {
        r.max_running = r.max_running.min(m);
    }
    if let Some(m) = space.max_tokens.filter(|&m| m >= 1) {
        r.token_budget = r.token_budget.min(m);
    }
    if let Some(m) = space.max_query_len.filter(|&m| m >= 1) {
        r.chunk = r.chunk.min(m);
    }
    if let Some(m) = space.max_seq_len.filter(|&m| m >= 1) {
        for (p, o) in r.prompts.iter_mut().zip(r.outputs.iter_mut()) {
            *p = (*p).clamp(1, m);
            *o = (*o).min(m - *p);
        }
    }
    r
}

/// [`trace_recipe_with`] inside `space` ([`fit_trace`]).
pub fn trace_recipe_in(
    seed: u64,
    index: usize,
    shapes: &TraceShapes,
    space: &Space,
) -> TraceRecipe {
    fit_trace(trace_recipe_with(seed, index, shapes), space)
}

fn rng_seed(seed: u64, index: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64
}

/// A comma-separated list of sizes (`--trace-head-sizes`, `--trace-block-sizes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeList(pub Vec<usize>);

/// Parse a comma-separated list of sizes from 1 to 1024.
pub fn parse_sizes(text: &str) -> Result<SizeList, String> {
    let sizes: Vec<usize> = text
        .split(',')
        .map(|t| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=1024).contains(&n))
                .ok_or_else(|| format!("`{t}` is not a size from 1 to 1024"))
        })
        .collect::<Result<_, _>>()?;
    Ok(SizeList(sizes))
}
