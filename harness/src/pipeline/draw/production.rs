//! Production-shaped traces: one model's attention layout (heads, kv heads, head size) on
//! every step, as a server runs it, in half precision at real block sizes. The other traces
//! draw toy shapes (the point there is the cache's life); these reach the code paths of real
//! layouts (a pack of more than 16 query heads per kv head, head size 256) on many calls in a
//! row, where state left by the previous call (an accumulator, a scratch buffer, a compiled
//! variant) shows.

use attn_reference::trace::{generate, TraceRecipe};
use attn_reference::{AttentionConfig, DType, InputRng, Poison};

/// One trace in this many is production-shaped, and one more an MLA model's.
pub const PRODUCTION_EVERY: usize = 20;
/// Its place in each run of [`PRODUCTION_EVERY`] traces.
pub const PRODUCTION_AT: usize = 7;
/// The MLA trace's place in each run of [`PRODUCTION_EVERY`] traces.
pub const MLA_AT: usize = 17;
/// Oracle work of one production trace (query × key pairs × query heads × head size over
/// every step): its prompts, then its outputs, are halved until it fits.
pub const PRODUCTION_COST: usize = 40_000_000;

/// A model's attention layout on one tensor-parallel rank, with the features its layers use
/// (windows and local chunks at the trace's scale, not the model's 4k or 8k).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Layout {
    pub model: &'static str,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
    pub window: bool,
    pub soft_cap: Option<f32>,
    pub sinks: bool,
    pub alibi: bool,
    pub chunked: bool,
    /// Multi-head latent attention: V's width (the latent), the key row being latent plus
    /// rotary part, and the model's softmax scale.
    pub mla: Option<(usize, f32)>,
}

const fn layout(
    model: &'static str,
    num_heads: usize,
    num_kv_heads: usize,
    head_size: usize,
) -> Layout {
    Layout {
        model,
        num_heads,
        num_kv_heads,
        head_size,
        window: false,
        soft_cap: None,
        sinks: false,
        alibi: false,
        chunked: false,
        mla: None,
    }
}

/// The layouts, in the order production traces take them: the first five are a default
/// run's (100 traces), so they span the groups (4, 48, 8, 128, 2) and head sizes (64 to 256).
pub const LAYOUTS: &[Layout] = &[
    layout("Llama 3 8B", 32, 8, 128),
    layout("granite-20b-code (MQA)", 48, 1, 128),
    Layout {
        window: true,
        sinks: true,
        ..layout("gpt-oss-20b", 64, 8, 64)
    },
    layout("Falcon-7B-style MQA over 128 heads", 128, 1, 64),
    Layout {
        window: true,
        soft_cap: Some(50.0),
        ..layout("Gemma 2 9B", 16, 8, 256)
    },
    layout("Llama 3 8B, TP 2", 16, 4, 128),
    layout("Llama 3 70B, TP 8", 8, 1, 128),
    layout("Qwen2.5 7B", 28, 4, 128),
    layout("Phi-3 mini", 32, 32, 96),
    Layout {
        alibi: true,
        ..layout("MPT-7B", 32, 32, 128)
    },
    Layout {
        chunked: true,
        ..layout("Llama 4 Scout, TP 8", 5, 1, 128)
    },
    Layout {
        window: true,
        ..layout("Gemma 3 4B", 8, 4, 256)
    },
];

/// MLA models' layouts (absorbed decode: one latent kv head, V its prefix), in the order MLA
/// traces take them.
pub const MLA_LAYOUTS: &[Layout] = &[
    Layout {
        mla: Some((
            attn_reference::mla::DEEPSEEK_V3_KV_LORA_RANK,
            DEEPSEEK_V3_SCALE,
        )),
        ..layout(
            "DeepSeek-V3 (MLA), TP 8",
            16,
            1,
            attn_reference::mla::DEEPSEEK_V3_ENTRY,
        )
    },
    Layout {
        mla: Some((
            attn_reference::mla::DEEPSEEK_V3_KV_LORA_RANK,
            DEEPSEEK_V3_SCALE,
        )),
        ..layout(
            "DeepSeek-V3 (MLA), TP 16",
            8,
            1,
            attn_reference::mla::DEEPSEEK_V3_ENTRY,
        )
    },
];

/// 192^-0.5, DeepSeek-V3's `qk_head_dim` scale (a const: `model_scale` is not).
const DEEPSEEK_V3_SCALE: f32 = 0.072_168_78;

/// Whether trace `index` is production-shaped (an MLA model's among them).
pub fn is_production(index: usize) -> bool {
    matches!(index % PRODUCTION_EVERY, PRODUCTION_AT | MLA_AT)
}

/// Every production layout, MLA ones included (what coverage calls "a model's").
pub fn all_layouts() -> impl Iterator<Item = &'static Layout> {
    LAYOUTS.iter().chain(MLA_LAYOUTS)
}

/// The layout of production trace `index`.
pub fn layout_of(index: usize) -> &'static Layout {
    let n = index / PRODUCTION_EVERY;
    match index % PRODUCTION_EVERY {
        MLA_AT => &MLA_LAYOUTS[n % MLA_LAYOUTS.len()],
        _ => &LAYOUTS[n % LAYOUTS.len()],
    }
}

/// Production trace recipe `index` of `seed`: [`layout_of`]'s layout in bf16 or f16 at block
/// size 16, 32 or 64, two to four requests of a few dozen to 160 prompt tokens and 8 to 32
/// decodes, chunked prefill under a token budget, a cache tight enough to preempt,
/// within [`PRODUCTION_COST`].
pub fn production_recipe(seed: u64, index: usize) -> TraceRecipe {
    let l = layout_of(index);
    let mut rng = InputRng::new(seed ^ 0x51 ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut pick = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let dtype = [DType::Bf16, DType::F16][pick(0, 1)];
    let block_size = [16, 16, 32, 64][pick(0, 3)];
    let mut config =
        AttentionConfig::new(l.num_heads, l.num_kv_heads, l.head_size, block_size, dtype);
    if l.window {
        config.sliding_window = Some(pick(16, 96));
    }
    config.logits_soft_cap = l.soft_cap;
    if l.sinks {
        config.sinks = Some(
            (0..l.num_heads)
                .map(|_| pick(0, 16) as f32 / 2.0 - 4.0)
                .collect(),
        );
    }
    if l.alibi {
        config.alibi_slopes = Some(crate::pipeline::recipe::alibi_slopes(l.num_heads));
    }
    if l.chunked {
        config.attention_chunk_size = Some(pick(32, 96));
    }
    if let Some((head_size_v, scale)) = l.mla {
        config.mla = Some(attn_reference::mla::Mla { head_size_v });
        config.scale = Some(scale);
    }
    let n = pick(2, 4);
    let sharing = if pick(0, 1) == 0 {
        pick(2, 3).min(n)
    } else {
        0
    };
    let mut recipe = TraceRecipe {
        config,
        prompts: (0..n).map(|_| pick(24, 160)).collect(),
        outputs: (0..n).map(|_| pick(8, 32)).collect(),
        sharing,
        shared_prefix: pick(block_size, 2 * block_size),
        chunk: pick(16, 64),
        token_budget: pick(48, 256),
        max_running: pick(2, 4),
        cache_blocks: pick(4, 16),
        max_steps: 48,
        seed: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64 ^ 0x5eed,
        poison: Poison::ALL.get(pick(0, 15)).copied(),
        masks: None,
    };
    if pick(0, 5) == 0 {
        let mut cache = crate::pipeline::draw::fields::fp8_cache(&mut pick);
        // An MLA cache entry is one latent tensor written and read back with one scale
        // (vLLM's `concat_and_cache_mla` takes `k_scale` alone): V, its prefix, has no scale
        // of its own, so an MLA model's draw keeps `v_scale` equal to `k_scale`.
        if recipe.config.mla.is_some() {
            cache.v_scale = cache.k_scale;
        }
        recipe.config.kv_cache = Some(cache);
    }
    // Prompts go first (a prefill's square is most of the work); decodes, one step each,
    // are what makes the trace long.
    while work(&recipe) > PRODUCTION_COST && recipe.prompts.iter().any(|&p| p > 8) {
        recipe.prompts.iter_mut().for_each(|p| *p = p.div_ceil(2));
    }
    while work(&recipe) > PRODUCTION_COST && recipe.outputs.iter().any(|&o| o > 1) {
        recipe.outputs.iter_mut().for_each(|o| *o /= 2);
    }
    recipe
}

/// The oracle's work for `r`'s trace: every step's query × key pairs, times query heads and
/// head size.
pub fn work(r: &TraceRecipe) -> usize {
    let c = &r.config;
    let pairs: usize = generate(r)
        .steps
        .iter()
        .flat_map(|s| &s.seqs)
        .map(|s| s.query_len * (s.context_len + s.query_len))
        .sum();
    pairs * c.num_heads * c.head_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mla_scale_is_deepseeks() {
        let exact = attn_reference::mla::model_scale(attn_reference::mla::DEEPSEEK_V3_QK_HEAD_DIM);
        assert!((DEEPSEEK_V3_SCALE - exact).abs() < 1e-8);
    }

    #[test]
    fn a_default_run_holds_five_layouts_and_an_mla_one_each_within_its_cost_and_valid() {
        let indices: Vec<usize> = (0..100).filter(|&i| is_production(i)).collect();
        assert_eq!(indices.len(), 10);
        let mla: Vec<usize> = indices
            .iter()
            .copied()
            .filter(|i| i % 20 == MLA_AT)
            .collect();
        assert!(mla
            .iter()
            .all(|&i| production_recipe(1, i).config.mla.is_some()));
        let mut groups = std::collections::BTreeSet::new();
        for i in indices {
            let r = production_recipe(1, i);
            let l = layout_of(i);
            assert_eq!(
                (
                    r.config.num_heads,
                    r.config.num_kv_heads,
                    r.config.head_size
                ),
                (l.num_heads, l.num_kv_heads, l.head_size)
            );
            assert!(work(&r) <= PRODUCTION_COST, "{}", l.model);
            let t = generate(&r);
            t.validate().unwrap();
            // Long enough that each path runs many times: at least a dozen steps.
            assert!(t.steps.len() >= 12, "{}: {} steps", l.model, t.steps.len());
            groups.insert(l.num_heads / l.num_kv_heads);
        }
        assert!(groups.iter().any(|&g| g > 16), "{groups:?}");
    }
}
