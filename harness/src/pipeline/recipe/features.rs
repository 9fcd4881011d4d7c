//! Where each optional feature lives in a recipe, both ways: written into a config
//! ([`CaseRecipe::config`]) and read back from one ([`CaseRecipe::take_features_of`]). One
//! arm per feature in each, no wildcard: a new feature is a compile error here until the
//! recipe holds it.

use super::{alibi_slopes, CaseRecipe};
use attn_reference::{AttentionConfig, Feature, InputRng};

impl CaseRecipe {
    /// The case's attention config: its shape and scale, and every optional feature the
    /// config holds.
    pub fn config(&self) -> AttentionConfig {
        let mut c = AttentionConfig::new(
            self.num_heads(),
            self.num_kv_heads,
            self.head_size,
            self.block_size,
            self.dtype,
        );
        c.scale = self.scale;
        for f in Feature::ALL {
            into_config(f, self, &mut c);
        }
        c
    }

    /// The config's kind and optional features, as this recipe holds them (an MLA recipe
    /// keeps its latent, which the config has no more of).
    pub(crate) fn take_features_of(&mut self, c: &AttentionConfig) {
        for f in Feature::ALL {
            from_config(f, self, c);
        }
    }
}

/// Write `r`'s value of feature `f` into `c` (whose shape and scale are `r`'s already).
fn into_config(f: Feature, r: &CaseRecipe, c: &mut AttentionConfig) {
    match f {
        Feature::EncoderOnly | Feature::CrossAttention => c.kind = r.kind,
        Feature::SlidingWindow => c.sliding_window = r.window,
        Feature::ChunkedLocalAttention => c.attention_chunk_size = r.chunk,
        Feature::ChunkLookback => {
            c.chunk_lookback = r.lookback.filter(|&k| k > 0 && r.chunk.is_some())
        }
        Feature::LogitsSoftCap => c.logits_soft_cap = r.soft_cap,
        // The query's FP8 scale and the scales' granularity are part of the cache; scales
        // per head follow the recipe's kv heads (shrinking changes them).
        Feature::Fp8KvCache
        | Feature::Fp8Query
        | Feature::KvHeadScales
        | Feature::KvTokenScales => {
            c.kv_cache = r
                .kv_cache
                .as_ref()
                .map(|k| k.fitted_to_heads(r.num_kv_heads))
        }
        Feature::Mla => {
            if let Some(m) = r.mla {
                // V stays a prefix of a latent entry shrunk below it.
                c.mla = Some(attn_reference::Mla {
                    head_size_v: m.head_size_v(r.head_size),
                });
                c.scale = Some(m.scale);
            }
        }
        // MLA models have neither ALiBi nor sinks.
        Feature::Alibi => {
            if r.alibi && r.mla.is_none() {
                c.alibi_slopes = Some(alibi_slopes(c.num_heads));
            }
        }
        Feature::Sinks => {
            if r.sinks && r.mla.is_none() {
                // Sinks around the typical logit, so they matter without swamping the keys.
                let mut rng = InputRng::new(0x51c5);
                c.sinks = Some(
                    (0..c.num_heads)
                        .map(|_| r.dtype.round((rng.normal() * 1.5) as f32))
                        .collect(),
                );
            }
        }
        // The batch's features: the recipe builds them into the batch, not the config.
        Feature::PaddedRequests | Feature::NonCausal | Feature::PrefixLm | Feature::Rswa => {}
    }
}

/// Read feature `f` of `c` back into `r`.
fn from_config(f: Feature, r: &mut CaseRecipe, c: &AttentionConfig) {
    match f {
        Feature::EncoderOnly | Feature::CrossAttention => r.kind = c.kind,
        Feature::SlidingWindow => r.window = c.sliding_window,
        Feature::ChunkedLocalAttention => r.chunk = c.attention_chunk_size,
        Feature::ChunkLookback => r.lookback = c.chunk_lookback,
        Feature::LogitsSoftCap => r.soft_cap = c.logits_soft_cap,
        // A recipe's per-head scales are kept when the config's are them fitted to its heads
        // (they may be drawn for more heads than the case has).
        Feature::Fp8KvCache
        | Feature::Fp8Query
        | Feature::KvHeadScales
        | Feature::KvTokenScales => {
            let fitted = r
                .kv_cache
                .as_ref()
                .map(|k| k.fitted_to_heads(c.num_kv_heads));
            if fitted != c.kv_cache {
                r.kv_cache = c.kv_cache.clone()
            }
        }
        Feature::Alibi => r.alibi = c.alibi_slopes.is_some(),
        Feature::Sinks => r.sinks = c.sinks.is_some(),
        // An MLA recipe keeps its latent (`fit_latent` carries a fitted config's back).
        Feature::Mla => {}
        Feature::PaddedRequests | Feature::NonCausal | Feature::PrefixLm | Feature::Rswa => {}
    }
}
