//! Every aspect of a case that a backend may not implement, declared once. Backends name one
//! when they decline a case (`Unsupported { feature, detail }`), external adapters list the
//! optional ones in their capabilities, `attn-diff list` probes each, and summaries group
//! declined cases by it.

use crate::{AttentionConfig, AttentionKind, DType, Fp8Format, Fp8KvCache};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One aspect of a case a backend may decline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// The compute dtype (each dtype is probed on its own by `list`).
    Dtype,
    /// Encoder-only (bidirectional) attention.
    EncoderOnly,
    /// Cross-attention (`encoder_decoder`): decoder queries over an encoder's cached K/V.
    CrossAttention,
    SlidingWindow,
    LogitsSoftCap,
    Alibi,
    Sinks,
    /// An FP8 KV cache (`fp8_e4m3` or `fp8_e5m2`, per-tensor k/v scales); the format is
    /// probed on its own by `list`.
    Fp8KvCache,
    /// Requests with no new token in the step (query_len 0, seq_len 0) after the real ones:
    /// vLLM pads a batch's request count with them for CUDA graphs. A property of the batch,
    /// not of the config ([`Feature::used_by_batch`]).
    PaddedRequests,
    /// Multi-head latent attention: one latent KV head whose first `head_size_v` dims are V
    /// ([`crate::Mla`]).
    Mla,
    /// Chunked local attention (Llama 4's `attention_chunk_size`): a query sees only the keys
    /// of its own chunk of positions.
    ChunkedLocalAttention,
    /// Non-causal decoder requests (vLLM 0.33's per-request `causal`, `supports_non_causal`):
    /// a request that sees every key of its sequence. A property of the batch
    /// ([`crate::Batch::causal`]).
    NonCausal,
    /// PrefixLM's bidirectional ranges (vLLM 0.33's `mm_req_doc_ranges`): image or document
    /// tokens of a request that see each other both ways. A property of the batch
    /// ([`crate::Batch::prefix_lm`]).
    PrefixLm,
    /// R-SWA (vLLM 0.33's `rswa_prefix_lens`): a request's prefix stays visible past the
    /// window. A property of the batch ([`crate::Batch::rswa`]).
    Rswa,
    /// Chunked attention with look-back (vLLM 0.33's `CHUNK_LOOKBACK`): a query also sees
    /// the `k` chunks before its own ([`AttentionConfig::chunk_lookback`]).
    ChunkLookback,
    /// An FP8 query (vLLM's `query_quant` with `_q_scale`): the query quantized to E4M3
    /// before the kernel, read back with its scale ([`crate::Fp8KvCache::q_scale`]; only
    /// with an FP8 KV cache).
    Fp8Query,
    /// The head size (a SIMD width, a device tile).
    HeadSize,
    /// The KV-cache block size.
    BlockSize,
    /// The query/kv head packing (GQA ratio, head counts).
    HeadLayout,
    /// The batch's shape: number of sequences, lengths, query chunks.
    BatchShape,
    /// The KV cache's size (a backend that cannot allocate a huge cache lazily).
    CacheSize,
    /// The machine the backend runs on (a missing instruction set).
    Host,
    /// Multi-step traces: one cache kept across a trace's steps (an adapter whose protocol
    /// has no sessions cannot).
    Trace,
    /// A reason the backend gave that names none of the above (external adapters).
    Other,
}

impl Feature {
    pub const ALL: [Feature; 24] = [
        Feature::Dtype,
        Feature::EncoderOnly,
        Feature::CrossAttention,
        Feature::SlidingWindow,
        Feature::LogitsSoftCap,
        Feature::Alibi,
        Feature::Sinks,
        Feature::Fp8KvCache,
        Feature::PaddedRequests,
        Feature::Mla,
        Feature::ChunkedLocalAttention,
        Feature::ChunkLookback,
        Feature::NonCausal,
        Feature::PrefixLm,
        Feature::Rswa,
        Feature::Fp8Query,
        Feature::HeadSize,
        Feature::BlockSize,
        Feature::HeadLayout,
        Feature::BatchShape,
        Feature::CacheSize,
        Feature::Host,
        Feature::Trace,
        Feature::Other,
    ];

    /// The optional attention features: on or off in a config, listed in an external
    /// adapter's capabilities.
    pub const OPTIONAL: [Feature; 15] = [
        Feature::EncoderOnly,
        Feature::CrossAttention,
        Feature::SlidingWindow,
        Feature::LogitsSoftCap,
        Feature::Alibi,
        Feature::Sinks,
        Feature::Fp8KvCache,
        Feature::PaddedRequests,
        Feature::Mla,
        Feature::ChunkedLocalAttention,
        Feature::Fp8Query,
        Feature::ChunkLookback,
        Feature::NonCausal,
        Feature::PrefixLm,
        Feature::Rswa,
    ];

    /// The optional features a batch uses rather than a config.
    pub const OF_THE_BATCH: [Feature; 4] = [
        Feature::PaddedRequests,
        Feature::NonCausal,
        Feature::PrefixLm,
        Feature::Rswa,
    ];

    /// The optional features no MLA model has: the case model refuses them beside MLA, and
    /// coverage counts no pair of them with it.
    pub const NOT_WITH_MLA: [Feature; 9] = [
        Feature::SlidingWindow,
        Feature::LogitsSoftCap,
        Feature::Alibi,
        Feature::Sinks,
        Feature::ChunkedLocalAttention,
        Feature::ChunkLookback,
        Feature::NonCausal,
        Feature::PrefixLm,
        Feature::Rswa,
    ];

    /// The optional features every backend of this project implemented when the list was
    /// made: what [`Backend::optional_features`](../attn_backends) claims by default. A feature
    /// added to [`Feature::OPTIONAL`] later is not here, so every backend declines it until
    /// it says otherwise: a new feature can never be silently skipped.
    pub const ESTABLISHED: [Feature; 5] = [
        Feature::EncoderOnly,
        Feature::SlidingWindow,
        Feature::LogitsSoftCap,
        Feature::Alibi,
        Feature::Sinks,
    ];

    /// The stable name used in JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Dtype => "dtype",
            Feature::EncoderOnly => "encoder_only",
            Feature::CrossAttention => "cross_attention",
            Feature::SlidingWindow => "sliding_window",
            Feature::LogitsSoftCap => "logits_soft_cap",
            Feature::Alibi => "alibi",
            Feature::Sinks => "sinks",
            Feature::Fp8KvCache => "fp8_kv_cache",
            Feature::PaddedRequests => "padded_requests",
            Feature::Mla => "mla",
            Feature::ChunkedLocalAttention => "chunked_local_attention",
            Feature::ChunkLookback => "chunk_lookback",
            Feature::NonCausal => "non_causal",
            Feature::PrefixLm => "prefix_lm",
            Feature::Rswa => "rswa",
            Feature::Fp8Query => "fp8_query",
            Feature::HeadSize => "head_size",
            Feature::BlockSize => "block_size",
            Feature::HeadLayout => "head_layout",
            Feature::BatchShape => "batch_shape",
            Feature::CacheSize => "cache_size",
            Feature::Host => "host",
            Feature::Trace => "trace",
            Feature::Other => "other",
        }
    }

    /// Words for a person.
    pub fn label(self) -> &'static str {
        match self {
            Feature::Dtype => "dtype",
            Feature::EncoderOnly => "encoder-only attention",
            Feature::CrossAttention => "cross-attention",
            Feature::SlidingWindow => "sliding window",
            Feature::LogitsSoftCap => "logits soft-cap",
            Feature::Alibi => "ALiBi",
            Feature::Sinks => "attention sinks",
            Feature::Fp8KvCache => "FP8 KV cache",
            Feature::PaddedRequests => "padded requests (query length 0)",
            Feature::Mla => "multi-head latent attention (MLA)",
            Feature::ChunkedLocalAttention => "chunked local attention",
            Feature::ChunkLookback => "chunk look-back",
            Feature::NonCausal => "non-causal requests",
            Feature::PrefixLm => "PrefixLM ranges",
            Feature::Rswa => "R-SWA prefixes",
            Feature::Fp8Query => "FP8 query",
            Feature::HeadSize => "head size",
            Feature::BlockSize => "block size",
            Feature::HeadLayout => "head layout",
            Feature::BatchShape => "batch shape",
            Feature::CacheSize => "KV cache size",
            Feature::Host => "host CPU",
            Feature::Trace => "multi-step traces",
            Feature::Other => "other",
        }
    }

    /// Whether `config` uses this optional feature (always false for the dimensions, which
    /// every config has).
    pub fn used_by(self, config: &AttentionConfig) -> bool {
        match self {
            Feature::EncoderOnly => config.kind == AttentionKind::EncoderOnly,
            Feature::CrossAttention => config.kind == AttentionKind::EncoderDecoder,
            Feature::SlidingWindow => config.sliding_window.is_some(),
            Feature::LogitsSoftCap => config.logits_soft_cap.is_some(),
            Feature::Alibi => config.alibi_slopes.is_some(),
            Feature::Sinks => config.sinks.is_some(),
            Feature::Fp8KvCache => config.kv_cache.is_some(),
            Feature::Mla => config.mla.is_some(),
            Feature::ChunkedLocalAttention => config.attention_chunk_size.is_some(),
            Feature::ChunkLookback => config.chunk_lookback.is_some(),
            Feature::Fp8Query => config.kv_cache.is_some_and(|k| k.q_scale.is_some()),
            _ => false,
        }
    }

    /// The features of the batch that `batch` uses.
    pub fn of_batch(batch: &crate::Batch) -> impl Iterator<Item = Feature> + '_ {
        Feature::OF_THE_BATCH
            .into_iter()
            .filter(move |f| f.used_by_batch(batch))
    }

    /// Whether `batch` uses this feature (the features of the batch).
    pub fn used_by_batch(self, batch: &crate::Batch) -> bool {
        match self {
            Feature::PaddedRequests => batch.query_lens.contains(&0),
            Feature::NonCausal => batch.has_non_causal(),
            Feature::PrefixLm => batch.has_prefix_lm(),
            Feature::Rswa => batch.rswa.is_some(),
            _ => false,
        }
    }

    /// The config field that holds this optional feature, as errors name it.
    pub fn field(self) -> &'static str {
        match self {
            Feature::EncoderOnly | Feature::CrossAttention => "config.kind",
            Feature::SlidingWindow => "config.sliding_window",
            Feature::LogitsSoftCap => "config.logits_soft_cap",
            Feature::Alibi => "config.alibi_slopes",
            Feature::Sinks => "config.sinks",
            Feature::Fp8KvCache => "config.kv_cache",
            Feature::PaddedRequests => "batch.query_lens",
            Feature::NonCausal => "batch.causal",
            Feature::PrefixLm => "batch.prefix_lm",
            Feature::Rswa => "batch.rswa",
            Feature::Mla => "config.mla",
            Feature::ChunkedLocalAttention => "config.attention_chunk_size",
            Feature::ChunkLookback => "config.chunk_lookback",
            Feature::Fp8Query => "config.kv_cache.q_scale",
            _ => "config",
        }
    }

    /// Whether this optional feature means anything for attention of `kind`: a window,
    /// ALiBi and local chunks measure keys from the query's position, which cross-attention
    /// has not; MLA and local chunks are causal decoder attention. What draws, fits and
    /// validates a config reads this.
    pub fn allows_kind(self, kind: AttentionKind) -> bool {
        match self {
            Feature::SlidingWindow | Feature::Alibi => kind != AttentionKind::EncoderDecoder,
            Feature::Mla
            | Feature::ChunkedLocalAttention
            | Feature::ChunkLookback
            | Feature::PaddedRequests
            | Feature::NonCausal
            | Feature::PrefixLm
            | Feature::Rswa => kind == AttentionKind::Decoder,
            _ => true,
        }
    }

    /// Turn this optional feature off in `config` (the shrinker's "feature off" step); false
    /// when there was nothing to turn off.
    pub fn turn_off(self, config: &mut AttentionConfig) -> bool {
        let was = self.used_by(config);
        match self {
            Feature::EncoderOnly | Feature::CrossAttention if was => {
                config.kind = AttentionKind::Decoder
            }
            Feature::SlidingWindow => config.sliding_window = None,
            Feature::LogitsSoftCap => config.logits_soft_cap = None,
            Feature::Alibi => config.alibi_slopes = None,
            Feature::Sinks => config.sinks = None,
            Feature::Fp8KvCache => config.kv_cache = None,
            Feature::Mla => config.mla = None,
            // Look-back is a kind of local chunks: both go.
            Feature::ChunkedLocalAttention => {
                config.attention_chunk_size = None;
                config.chunk_lookback = None;
            }
            Feature::ChunkLookback => config.chunk_lookback = None,
            Feature::Fp8Query => {
                if let Some(k) = &mut config.kv_cache {
                    k.q_scale = None;
                }
            }
            _ => {}
        }
        was
    }

    /// Turn this optional feature on in `config` with a representative value (what `list`
    /// asks a backend about).
    pub fn turn_on(self, config: &mut AttentionConfig) {
        match self {
            Feature::EncoderOnly => config.kind = AttentionKind::EncoderOnly,
            Feature::CrossAttention => config.kind = AttentionKind::EncoderDecoder,
            Feature::SlidingWindow => config.sliding_window = Some(64),
            Feature::LogitsSoftCap => config.logits_soft_cap = Some(30.0),
            Feature::Alibi => config.alibi_slopes = Some(vec![0.5; config.num_heads]),
            Feature::Sinks => config.sinks = Some(vec![0.0; config.num_heads]),
            Feature::ChunkedLocalAttention => config.attention_chunk_size = Some(64),
            Feature::ChunkLookback => {
                config.attention_chunk_size = config.attention_chunk_size.or(Some(64));
                config.chunk_lookback = Some(1);
            }
            Feature::Fp8KvCache => {
                // One scale for both: MLA's K and V are one cache entry.
                let v_scale = if config.mla.is_some() { 0.5 } else { 0.25 };
                config.kv_cache = Some(Fp8KvCache::new(Fp8Format::E4m3, 0.5, v_scale))
            }
            // An FP8 query comes with an FP8 cache: the config's, or a fresh one.
            Feature::Fp8Query => {
                if config.kv_cache.is_none() {
                    Feature::Fp8KvCache.turn_on(config);
                }
                if let Some(k) = &mut config.kv_cache {
                    k.q_scale = Some(0.25);
                }
            }
            // DeepSeek-V3's latent layout with the config's heads and block size; MLA has
            // one latent head and none of the other optional features.
            Feature::Mla => {
                let mla = AttentionConfig::deepseek_v3_mla(
                    config.num_heads,
                    config.block_size,
                    config.dtype,
                );
                *config = AttentionConfig {
                    kv_cache: config.kv_cache.map(|c| Fp8KvCache {
                        v_scale: c.k_scale,
                        ..c
                    }),
                    ..mla
                };
            }
            _ => {}
        }
    }

    /// Probes for `attn-diff list`: what to ask a backend (on top of a plain config it
    /// accepts) to learn whether it has this feature, each with what the probe shows.
    pub fn probes(self, base: &AttentionConfig) -> Vec<(String, AttentionConfig)> {
        let with = |edit: &dyn Fn(&mut AttentionConfig)| {
            let mut c = base.clone();
            edit(&mut c);
            c
        };
        match self {
            Feature::Dtype => DType::ALL
                .into_iter()
                .map(|dtype| (dtype.name().to_string(), with(&|c| c.dtype = dtype)))
                .collect(),
            Feature::Fp8KvCache => Fp8Format::ALL
                .into_iter()
                .map(|dtype| {
                    let cache = Fp8KvCache::new(dtype, 0.5, 0.25);
                    (
                        format!("KV cache {dtype}"),
                        with(&|c| c.kv_cache = Some(cache)),
                    )
                })
                .collect(),
            // Not a config: `list` asks the backend's features directly.
            f if Feature::OF_THE_BATCH.contains(&f) => Vec::new(),
            f if Feature::OPTIONAL.contains(&f) => {
                vec![(f.label().to_string(), with(&|c| f.turn_on(c)))]
            }
            Feature::HeadSize => [3, 80, 256, 576]
                .into_iter()
                .map(|d| (format!("head size {d}"), with(&|c| c.head_size = d)))
                .collect(),
            Feature::BlockSize => [1, 3, 128, 256]
                .into_iter()
                .map(|b| (format!("block size {b}"), with(&|c| c.block_size = b)))
                .collect(),
            Feature::HeadLayout => [(9, 3), (8, 1), (8, 8)]
                .into_iter()
                .map(|(q, kv)| {
                    (
                        format!("{q}/{kv} heads"),
                        with(&|c| {
                            c.num_heads = q;
                            c.num_kv_heads = kv;
                            for f in [Feature::Alibi, Feature::Sinks] {
                                if f.used_by(c) {
                                    f.turn_on(c);
                                }
                            }
                        }),
                    )
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// "I can't run this case": which feature, why in words that hold for every case declined for
/// the same reason, and the case's own value apart (so 17 head sizes declined for one reason
/// are one reason, not 17).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unsupported {
    pub feature: Feature,
    /// E.g. "not a multiple of 64"; empty when the feature alone says it ("no ALiBi").
    pub detail: String,
    /// The case's value, e.g. "160"; none for an on/off feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl Unsupported {
    pub fn new(feature: Feature, detail: impl Into<String>) -> Self {
        Unsupported {
            feature,
            detail: detail.into(),
            value: None,
        }
    }

    /// The case's value of the declined feature.
    pub fn value(mut self, value: impl fmt::Display) -> Self {
        self.value = Some(value.to_string());
        self
    }

    /// The reason without the case's value: what summaries group by.
    pub fn reason(&self) -> String {
        if self.feature == Feature::Other {
            self.detail.clone()
        } else if self.detail.is_empty() {
            self.feature.label().to_string()
        } else {
            format!("{} {}", self.feature.label(), self.detail)
        }
    }
}

/// "head size 160: not a multiple of 64", "ALiBi".
impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.value, self.detail.is_empty()) {
            _ if self.feature == Feature::Other => f.write_str(&self.detail),
            (Some(v), false) => write!(f, "{} {v}: {}", self.feature.label(), self.detail),
            (Some(v), true) => write!(f, "{} {v}", self.feature.label()),
            (None, _) => f.write_str(&self.reason()),
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Feature {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Feature::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown feature `{s}` (known: {})",
                    Feature::ALL.map(Feature::name).join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        for f in Feature::ALL {
            assert_eq!(f.name().parse::<Feature>(), Ok(f));
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{}\"", f.name()));
        }
        let mut names: Vec<_> = Feature::ALL.map(Feature::name).to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Feature::ALL.len());
    }

    #[test]
    fn unsupported_reads_with_and_without_its_value() {
        let u = Unsupported::new(Feature::HeadSize, "not a multiple of 64").value(160);
        assert_eq!(u.to_string(), "head size 160: not a multiple of 64");
        assert_eq!(u.reason(), "head size not a multiple of 64");
        let u = Unsupported::new(Feature::Alibi, "");
        assert_eq!(u.to_string(), "ALiBi");
        let json = serde_json::to_value(&u).unwrap();
        assert_eq!(json, serde_json::json!({"feature": "alibi", "detail": ""}));
    }

    #[test]
    fn optional_features_turn_on_and_off() {
        let plain = AttentionConfig::new(4, 2, 8, 16, DType::F32);
        // The features of a batch are not the config's.
        for f in Feature::OPTIONAL
            .into_iter()
            .filter(|f| !Feature::OF_THE_BATCH.contains(f))
        {
            let mut c = plain.clone();
            assert!(!f.used_by(&c), "{f}");
            f.turn_on(&mut c);
            assert!(f.used_by(&c), "{f}");
            assert!(c.validate().is_ok(), "{f}: {:?}", c.validate());
            assert!(f.turn_off(&mut c), "{f}");
            if f == Feature::Fp8Query {
                // Off, the query is read as it is; the cache it came with stays FP8.
                assert!(Feature::Fp8KvCache.turn_off(&mut c), "{f}");
            }
            if f == Feature::ChunkLookback {
                // Off, the query sees its own chunk only; the chunks it came with stay.
                assert!(Feature::ChunkedLocalAttention.turn_off(&mut c), "{f}");
            }
            if f == Feature::Mla {
                // MLA brings its own head layout and scale; off, it leaves them, valid.
                assert!(c.validate().is_ok(), "{f}: {:?}", c.validate());
            } else {
                assert_eq!(c, plain, "{f}");
            }
            assert!(!f.turn_off(&mut c), "{f}");
        }
        // An FP8 latent cache: on top of MLA, one scale for K and V.
        let mut c = plain.clone();
        Feature::Mla.turn_on(&mut c);
        Feature::Fp8KvCache.turn_on(&mut c);
        assert_eq!(c.validate(), Ok(()));
    }
}
