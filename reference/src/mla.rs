//! Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi K2) as vLLM runs it at decode,
//! "absorbed": the cache holds one latent entry per token (`kv_lora_rank` latent dims, then
//! the rotary part), every query head attends over that single latent head, keys are the
//! whole entry and values are its first `head_size_v` dims. The softmax scale is the
//! model's (`qk_head_dim^-0.5`, 192 for DeepSeek-V3), never `head_size^-0.5`.
//!
//! A case with [`Mla`] set has `config.head_size` = the entry's width (K), one kv head, an
//! explicit scale, and no V tensors of its own: `tensors.value` and every
//! `tensors.context_value[s]` are empty, since V *is* the prefix of each key row.

use serde::{Deserialize, Serialize};

/// The latent layout: V is the first `head_size_v` dims of each K entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mla {
    /// Width of V (`kv_lora_rank`: 512 in DeepSeek-V3), at most `config.head_size`.
    pub head_size_v: usize,
}

/// DeepSeek-V3's latent: `kv_lora_rank`.
pub const DEEPSEEK_V3_KV_LORA_RANK: usize = 512;
/// DeepSeek-V3's rotary part of the latent entry.
pub const DEEPSEEK_V3_ROPE_DIM: usize = 64;
/// The cache entry: latent plus rotary part (576).
pub const DEEPSEEK_V3_ENTRY: usize = DEEPSEEK_V3_KV_LORA_RANK + DEEPSEEK_V3_ROPE_DIM;
/// DeepSeek-V3's `qk_head_dim` (`qk_nope_head_dim` 128 + `qk_rope_head_dim` 64), whose
/// `^-0.5` is the softmax scale.
pub const DEEPSEEK_V3_QK_HEAD_DIM: usize = 192;
/// DeepSeek-V3's query heads (before a tensor-parallel split).
pub const DEEPSEEK_V3_HEADS: usize = 128;

/// The scale of a model whose `qk_head_dim` is `qk_head_dim`, rounded to f32 as configs carry it.
pub fn model_scale(qk_head_dim: usize) -> f32 {
    (1.0 / (qk_head_dim as f64).sqrt()) as f32
}

impl crate::AttentionConfig {
    /// DeepSeek-V3's absorbed MLA decode layer: `num_heads` query heads (128 over the
    /// tensor-parallel size) over one 576-wide latent head, V its first 512 dims, scale
    /// 192^-0.5.
    pub fn deepseek_v3_mla(num_heads: usize, block_size: usize, dtype: crate::DType) -> Self {
        let mut c = crate::AttentionConfig::new(num_heads, 1, DEEPSEEK_V3_ENTRY, block_size, dtype);
        c.mla = Some(Mla {
            head_size_v: DEEPSEEK_V3_KV_LORA_RANK,
        });
        c.scale = Some(model_scale(DEEPSEEK_V3_QK_HEAD_DIM));
        c
    }

    /// Width of V and of the output: `mla.head_size_v` in an MLA case, else `head_size`.
    pub fn head_size_v(&self) -> usize {
        self.mla.map_or(self.head_size, |m| m.head_size_v)
    }

    /// Elements of V a case carries per token (`tensors.value` row): 0 in an MLA case, whose
    /// V is read from the key rows.
    pub fn value_row(&self) -> usize {
        if self.mla.is_some() {
            0
        } else {
            self.num_kv_heads * self.head_size
        }
    }

    /// Elements of one output row (`[num_heads, head_size_v]` per token).
    pub fn output_row(&self) -> usize {
        self.num_heads * self.head_size_v()
    }
}

/// V of `keys` (`[n, num_kv_heads, head_size]`): the first `head_size_v` dims of every row.
pub fn values_of_keys(keys: &[f32], head_size: usize, head_size_v: usize) -> Vec<f32> {
    keys.chunks_exact(head_size.max(1))
        .flat_map(|row| &row[..head_size_v.min(row.len())])
        .copied()
        .collect()
}

/// How a case's cache holds K and V, as `--only kv_layouts=` and adapters' capabilities name
/// it: `mha` (K and V rows per kv head) or `mla` (one latent entry, V its prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvLayout {
    Mha,
    Mla,
}

impl KvLayout {
    pub const ALL: [KvLayout; 2] = [KvLayout::Mha, KvLayout::Mla];

    /// The layout of `config`.
    pub fn of(config: &crate::AttentionConfig) -> KvLayout {
        if config.mla.is_some() {
            KvLayout::Mla
        } else {
            KvLayout::Mha
        }
    }
}

impl std::fmt::Display for KvLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvLayout::Mha => "mha",
            KvLayout::Mla => "mla",
        })
    }
}

impl std::str::FromStr for KvLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        KvLayout::ALL
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| format!("unknown KV layout `{s}` (known: mha, mla)"))
    }
}
