//! The attention layer's configuration: everything that is fixed for a model layer
//! rather than for a batch.

use crate::{DType, Fp8KvCache};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which tokens a query may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKind {
    /// Causal self-attention: the query at absolute position `p` sees keys `0..=p`.
    #[default]
    Decoder,
    /// Bidirectional self-attention over the whole sequence (query_len == seq_len). vLLM's
    /// `ENCODER` (the encoder of an encoder-decoder model) computes the same thing with no
    /// cache, so a case of this kind stands for both.
    EncoderOnly,
    /// Cross-attention (vLLM's `ENCODER_DECODER`): decoder queries over the encoder's K/V in
    /// a cross-attention cache written once per request (on its first decoder step), so
    /// every key is context. `seq_len` is the encoder's length, `query_len` the step's
    /// decoder tokens (any number); not causal, no window, no ALiBi; the step writes
    /// nothing (every slot -1).
    EncoderDecoder,
}

impl AttentionKind {
    pub const ALL: [AttentionKind; 3] = [
        AttentionKind::Decoder,
        AttentionKind::EncoderOnly,
        AttentionKind::EncoderDecoder,
    ];
}

impl fmt::Display for AttentionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttentionKind::Decoder => "decoder",
            AttentionKind::EncoderOnly => "encoder_only",
            AttentionKind::EncoderDecoder => "encoder_decoder",
        })
    }
}

impl std::str::FromStr for AttentionKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        AttentionKind::ALL
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| {
                format!(
                    "unknown attention kind `{s}` (known: decoder, encoder_only, encoder_decoder)"
                )
            })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionConfig {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
    pub block_size: usize,
    pub dtype: DType,
    /// Softmax scale; `None` means the default `head_size^-0.5`.
    #[serde(default)]
    pub scale: Option<f32>,
    #[serde(default)]
    pub kind: AttentionKind,
    /// Sliding window of `w` keys. Decoder: keys `[p - w + 1, p]`, i.e. (left, right) =
    /// (w - 1, 0). Encoder-only: keys with `|p - k| < w`, i.e. (w - 1, w - 1).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Logit soft-cap: `cap * tanh(logit / cap)`, after scaling and before ALiBi.
    #[serde(default)]
    pub logits_soft_cap: Option<f32>,
    /// One ALiBi slope per query head: adds `slope_h * (k - p)` to the logit.
    #[serde(default)]
    pub alibi_slopes: Option<Vec<f32>>,
    /// One sink logit per query head: joins the softmax denominator, contributes no value.
    #[serde(default)]
    pub sinks: Option<Vec<f32>>,
    /// An FP8 KV cache (K/V stored as `fp8(x / scale)`, read as `fp8 * scale`); `None`: the
    /// cache holds the compute dtype. Left out of JSON when `None`, so older cases read and
    /// write the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<Fp8KvCache>,
    /// Multi-head latent attention ([`crate::Mla`]): `head_size` is the latent entry (K),
    /// V its first `head_size_v` dims. Left out of JSON when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<crate::Mla>,
    /// Chunked local attention (Llama 4's `attention_chunk_size`): positions are cut into
    /// chunks of `c` and a decoder query at `p` sees keys `[p - p % c, p]` (within a window
    /// too, if there is one). Left out of JSON when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_chunk_size: Option<usize>,
    /// Chunked attention with look-back (vLLM 0.33's `CHUNK_LOOKBACK`): a decoder query in
    /// chunk `p / c` also sees the `k` chunks before its own, keys from `(p / c - k) * c`.
    /// Needs `attention_chunk_size`; at least 1 (look-back 0 is Llama 4's local chunks, the
    /// field left out). Left out of JSON when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_lookback: Option<usize>,
}

impl AttentionConfig {
    /// A plain causal config with no optional features.
    pub fn new(
        num_heads: usize,
        num_kv_heads: usize,
        head_size: usize,
        block_size: usize,
        dtype: DType,
    ) -> Self {
        AttentionConfig {
            num_heads,
            num_kv_heads,
            head_size,
            block_size,
            dtype,
            scale: None,
            kind: AttentionKind::Decoder,
            sliding_window: None,
            logits_soft_cap: None,
            alibi_slopes: None,
            sinks: None,
            kv_cache: None,
            mla: None,
            attention_chunk_size: None,
            chunk_lookback: None,
        }
    }

    /// Bytes of one stored K or V element: 1 in an FP8 cache, else the compute dtype's.
    pub fn kv_element_bytes(&self) -> usize {
        match self.kv_cache {
            Some(_) => 1,
            None => self.dtype.size_bytes(),
        }
    }

    /// The scale actually applied to `q·k`.
    pub fn effective_scale(&self) -> f64 {
        match self.scale {
            Some(s) => s as f64,
            None => 1.0 / (self.head_size as f64).sqrt(),
        }
    }

    /// Query heads per kv head (valid configs only).
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads.max(1)
    }

    /// The kv head that query head `h` reads.
    pub fn kv_head_of(&self, h: usize) -> usize {
        h / self.group_size().max(1)
    }

    /// The window as (left, right) key offsets around the query position, as backends
    /// express it; `None` without a window.
    pub fn window_left_right(&self) -> Option<(usize, usize)> {
        self.sliding_window.map(|w| {
            let l = w.saturating_sub(1);
            match self.kind {
                AttentionKind::Decoder => (l, 0),
                AttentionKind::EncoderOnly | AttentionKind::EncoderDecoder => (l, l),
            }
        })
    }

    /// Short human-readable description of the features in use.
    pub fn features(&self) -> Vec<String> {
        let mut f = vec![self.kind.to_string()];
        if let Some(w) = self.sliding_window {
            f.push(format!("window={w}"));
        }
        if let Some(c) = self.attention_chunk_size {
            f.push(format!("chunk={c}"));
        }
        if let Some(k) = self.chunk_lookback {
            f.push(format!("lookback={k}"));
        }
        if let Some(c) = self.logits_soft_cap {
            f.push(format!("soft_cap={c}"));
        }
        if self.alibi_slopes.is_some() {
            f.push("alibi".into());
        }
        if self.sinks.is_some() {
            f.push("sinks".into());
        }
        if let Some(s) = self.scale {
            f.push(format!("scale={s}"));
        }
        if let Some(c) = &self.kv_cache {
            f.push(c.to_string());
        }
        if let Some(m) = &self.mla {
            f.push(format!(
                "mla (V = first {} of {})",
                m.head_size_v, self.head_size
            ));
        }
        f
    }
}

impl fmt::Display for AttentionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "heads {}/{} (group {}), head_size {}, block_size {}, {}, {}",
            self.num_heads,
            self.num_kv_heads,
            self.group_size(),
            self.head_size,
            self.block_size,
            self.dtype,
            self.features().join(", ")
        )
    }
}
