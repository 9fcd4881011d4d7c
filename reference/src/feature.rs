//! Every aspect of a case that a backend may not implement, declared once, in two kinds: the
//! optional [`Feature`]s a config or batch turns on or off (a window, ALiBi, MLA, …) and the
//! [`Dimension`]s every case has (its dtype, head size, batch shape, …). Backends name one
//! when they decline a case (`Unsupported { feature: Aspect, detail }`), external adapters list
//! the optional features in their capabilities, `attn-diff list` probes each, and summaries
//! group declined cases by it. Every `match` on a [`Feature`] is exhaustive: a feature added
//! here is a compile error wherever it needs handling.

use crate::{AttentionConfig, AttentionKind, DType, Fp8Format, Fp8KvCache, KvScales};
use serde::{Deserialize, Serialize};
use std::fmt;

/// An optional attention feature: on or off in a config (or a batch), listed in an external
/// adapter's capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
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
    /// FP8 cache scales per kv head (vLLM's `use_per_head_quant_scales`): one K and one V
    /// scale for each kv head ([`crate::KvScales::Head`]).
    KvHeadScales,
    /// FP8 cache scales per token and kv head (vLLM's `fp8_per_token_head` cache), computed
    /// as each row is written ([`crate::KvScales::Token`]).
    KvTokenScales,
}

/// A dimension every case has, which a backend may support only some values of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// The compute dtype (each dtype is probed on its own by `list`).
    Dtype,
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

/// One aspect of a case a backend may decline: an optional feature or a dimension. In JSON
/// and on the command line, its name alone (`"sliding_window"`, `"head_size"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Aspect {
    Feature(Feature),
    Dimension(Dimension),
}

impl Aspect {
    /// Every aspect, in the order `list` and error messages show them.
    pub const ALL: [Aspect; 26] = [
        Aspect::Dimension(Dimension::Dtype),
        Aspect::Feature(Feature::EncoderOnly),
        Aspect::Feature(Feature::CrossAttention),
        Aspect::Feature(Feature::SlidingWindow),
        Aspect::Feature(Feature::LogitsSoftCap),
        Aspect::Feature(Feature::Alibi),
        Aspect::Feature(Feature::Sinks),
        Aspect::Feature(Feature::Fp8KvCache),
        Aspect::Feature(Feature::PaddedRequests),
        Aspect::Feature(Feature::Mla),
        Aspect::Feature(Feature::ChunkedLocalAttention),
        Aspect::Feature(Feature::ChunkLookback),
        Aspect::Feature(Feature::NonCausal),
        Aspect::Feature(Feature::PrefixLm),
        Aspect::Feature(Feature::Rswa),
        Aspect::Feature(Feature::Fp8Query),
        Aspect::Feature(Feature::KvHeadScales),
        Aspect::Feature(Feature::KvTokenScales),
        Aspect::Dimension(Dimension::HeadSize),
        Aspect::Dimension(Dimension::BlockSize),
        Aspect::Dimension(Dimension::HeadLayout),
        Aspect::Dimension(Dimension::BatchShape),
        Aspect::Dimension(Dimension::CacheSize),
        Aspect::Dimension(Dimension::Host),
        Aspect::Dimension(Dimension::Trace),
        Aspect::Dimension(Dimension::Other),
    ];

    /// The stable name used in JSON and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Aspect::Feature(f) => f.name(),
            Aspect::Dimension(d) => d.name(),
        }
    }

    /// Words for a person.
    pub fn label(self) -> &'static str {
        match self {
            Aspect::Feature(f) => f.label(),
            Aspect::Dimension(d) => d.label(),
        }
    }

    /// The optional feature, if this aspect is one.
    pub fn feature(self) -> Option<Feature> {
        match self {
            Aspect::Feature(f) => Some(f),
            Aspect::Dimension(_) => None,
        }
    }

    /// Probes for `attn-diff list`: what to ask a backend (on top of a plain config it
    /// accepts) to learn whether it has this aspect, each with what the probe shows.
    pub fn probes(self, base: &AttentionConfig) -> Vec<(String, AttentionConfig)> {
        match self {
            Aspect::Feature(f) => f.probes(base),
            Aspect::Dimension(d) => d.probes(base),
        }
    }
}

/// `base` with `edit` applied: one probe of `list`.
fn edited(base: &AttentionConfig, edit: &dyn Fn(&mut AttentionConfig)) -> AttentionConfig {
    let mut c = base.clone();
    edit(&mut c);
    c
}

impl From<Feature> for Aspect {
    fn from(f: Feature) -> Aspect {
        Aspect::Feature(f)
    }
}

impl From<Dimension> for Aspect {
    fn from(d: Dimension) -> Aspect {
        Aspect::Dimension(d)
    }
}

impl PartialEq<Feature> for Aspect {
    fn eq(&self, f: &Feature) -> bool {
        *self == Aspect::Feature(*f)
    }
}

impl PartialEq<Dimension> for Aspect {
    fn eq(&self, d: &Dimension) -> bool {
        *self == Aspect::Dimension(*d)
    }
}

impl Dimension {
    /// The stable name used in JSON and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Dimension::Dtype => "dtype",
            Dimension::HeadSize => "head_size",
            Dimension::BlockSize => "block_size",
            Dimension::HeadLayout => "head_layout",
            Dimension::BatchShape => "batch_shape",
            Dimension::CacheSize => "cache_size",
            Dimension::Host => "host",
            Dimension::Trace => "trace",
            Dimension::Other => "other",
        }
    }

    /// Words for a person.
    pub fn label(self) -> &'static str {
        match self {
            Dimension::Dtype => "dtype",
            Dimension::HeadSize => "head size",
            Dimension::BlockSize => "block size",
            Dimension::HeadLayout => "head layout",
            Dimension::BatchShape => "batch shape",
            Dimension::CacheSize => "KV cache size",
            Dimension::Host => "host CPU",
            Dimension::Trace => "multi-step traces",
            Dimension::Other => "other",
        }
    }

    /// Probes for `attn-diff list` (see [`Aspect::probes`]): values of this dimension past
    /// what backends commonly take.
    pub fn probes(self, base: &AttentionConfig) -> Vec<(String, AttentionConfig)> {
        let with = |edit: &dyn Fn(&mut AttentionConfig)| edited(base, edit);
        match self {
            Dimension::Dtype => DType::ALL
                .into_iter()
                .map(|dtype| (dtype.name().to_string(), with(&|c| c.dtype = dtype)))
                .collect(),
            Dimension::HeadSize => [3, 80, 256, 576]
                .into_iter()
                .map(|d| (format!("head size {d}"), with(&|c| c.head_size = d)))
                .collect(),
            Dimension::BlockSize => [1, 3, 128, 256]
                .into_iter()
                .map(|b| (format!("block size {b}"), with(&|c| c.block_size = b)))
                .collect(),
            Dimension::HeadLayout => [(9, 3), (8, 1), (8, 8)]
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
            // Not asked with a config: a shape, a cache size, the host, traces, anything.
            Dimension::BatchShape
            | Dimension::CacheSize
            | Dimension::Host
            | Dimension::Trace
            | Dimension::Other => Vec::new(),
        }
    }
}

impl Feature {
    /// Every optional feature, in the order shrinking turns them off and reports list them.
    pub const ALL: [Feature; 17] = [
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
        Feature::KvHeadScales,
        Feature::KvTokenScales,
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
    pub const NOT_WITH_MLA: [Feature; 11] = [
        Feature::SlidingWindow,
        Feature::LogitsSoftCap,
        Feature::Alibi,
        Feature::Sinks,
        Feature::ChunkedLocalAttention,
        Feature::ChunkLookback,
        Feature::NonCausal,
        Feature::PrefixLm,
        Feature::Rswa,
        Feature::KvHeadScales,
        Feature::KvTokenScales,
    ];

    /// The optional features every backend of this project implemented when the list was
    /// made: what [`Backend::optional_features`](../attn_backends) claims by default. A feature
    /// added to [`Feature::ALL`] later is not here, so every backend declines it until
    /// it says otherwise: a new feature can never be silently skipped.
    pub const ESTABLISHED: [Feature; 5] = [
        Feature::EncoderOnly,
        Feature::SlidingWindow,
        Feature::LogitsSoftCap,
        Feature::Alibi,
        Feature::Sinks,
    ];

    /// The stable name used in JSON and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
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
            Feature::KvHeadScales => "kv_head_scales",
            Feature::KvTokenScales => "kv_token_scales",
        }
    }

    /// Words for a person.
    pub fn label(self) -> &'static str {
        match self {
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
            Feature::KvHeadScales => "FP8 cache scales per kv head",
            Feature::KvTokenScales => "FP8 cache scales per token and kv head",
        }
    }

    /// Whether `config` uses this optional feature (always false for the features of the
    /// batch, which a config does not hold).
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
            Feature::Fp8Query => config
                .kv_cache
                .as_ref()
                .is_some_and(|k| k.q_scale.is_some()),
            Feature::KvHeadScales => config
                .kv_cache
                .as_ref()
                .is_some_and(|k| matches!(k.scales, KvScales::Head { .. })),
            Feature::KvTokenScales => config
                .kv_cache
                .as_ref()
                .is_some_and(|k| k.scales == KvScales::Token),
            Feature::PaddedRequests | Feature::NonCausal | Feature::PrefixLm | Feature::Rswa => {
                false
            }
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
            Feature::EncoderOnly
            | Feature::CrossAttention
            | Feature::SlidingWindow
            | Feature::LogitsSoftCap
            | Feature::Alibi
            | Feature::Sinks
            | Feature::Fp8KvCache
            | Feature::Mla
            | Feature::ChunkedLocalAttention
            | Feature::ChunkLookback
            | Feature::Fp8Query
            | Feature::KvHeadScales
            | Feature::KvTokenScales => false,
        }
    }

    /// Turn this feature of the batch on in `batch` (one sequence or more) with a
    /// representative value, what `list` asks a backend about; the config's features are
    /// turned on in a config ([`Feature::turn_on`]).
    pub fn turn_on_batch(self, batch: &mut crate::Batch) {
        let seqs = batch.seq_lens.len();
        match self {
            Feature::PaddedRequests => {
                batch.seq_lens.push(0);
                batch.query_lens.push(0);
            }
            Feature::NonCausal => batch.causal = Some(vec![false; seqs]),
            Feature::PrefixLm => {
                batch.prefix_lm = Some(crate::PrefixLm {
                    ranges: vec![vec![(0, 0)]; seqs],
                    clamp_to_window: false,
                })
            }
            Feature::Rswa => {
                batch.rswa = Some(crate::Rswa {
                    window: 1,
                    prefix_lens: vec![1; seqs],
                })
            }
            Feature::EncoderOnly
            | Feature::CrossAttention
            | Feature::SlidingWindow
            | Feature::LogitsSoftCap
            | Feature::Alibi
            | Feature::Sinks
            | Feature::Fp8KvCache
            | Feature::Mla
            | Feature::ChunkedLocalAttention
            | Feature::ChunkLookback
            | Feature::Fp8Query
            | Feature::KvHeadScales
            | Feature::KvTokenScales => {}
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
            Feature::KvHeadScales | Feature::KvTokenScales => "config.kv_cache.scales",
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
            Feature::EncoderOnly
            | Feature::CrossAttention
            | Feature::LogitsSoftCap
            | Feature::Sinks
            | Feature::Fp8KvCache
            | Feature::Fp8Query
            | Feature::KvHeadScales
            | Feature::KvTokenScales => true,
        }
    }

    /// Turn this optional feature off in `config` (the shrinker's "feature off" step); false
    /// when there was nothing to turn off.
    pub fn turn_off(self, config: &mut AttentionConfig) -> bool {
        let was = self.used_by(config);
        match self {
            Feature::EncoderOnly | Feature::CrossAttention => {
                if was {
                    config.kind = AttentionKind::Decoder
                }
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
            // Finer scales off: per tensor, the same K and V scale for every element. The
            // scales of a finer cache are 1, which per tensor is a plain FP8 cache.
            Feature::KvHeadScales | Feature::KvTokenScales => {
                if was {
                    if let Some(k) = &mut config.kv_cache {
                        k.scales = KvScales::Tensor;
                    }
                }
            }
            // The batch's features: nothing of the config's to turn off.
            Feature::PaddedRequests | Feature::NonCausal | Feature::PrefixLm | Feature::Rswa => {}
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
            // An E4M3 cache (the only format with per-token scales), its per-tensor scales 1.
            Feature::KvHeadScales | Feature::KvTokenScales => {
                let q_scale = config.kv_cache.as_ref().and_then(|k| k.q_scale);
                let scales = if self == Feature::KvHeadScales {
                    let kv = config.num_kv_heads;
                    KvScales::Head {
                        k: (0..kv).map(|h| [0.5, 0.25][h % 2]).collect(),
                        v: (0..kv).map(|h| [0.25, 1.0][h % 2]).collect(),
                    }
                } else {
                    KvScales::Token
                };
                config.kv_cache = Some(Fp8KvCache {
                    q_scale,
                    scales,
                    ..Fp8KvCache::new(Fp8Format::E4m3, 1.0, 1.0)
                });
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
                    kv_cache: config.kv_cache.clone().map(|c| Fp8KvCache {
                        v_scale: c.k_scale,
                        scales: KvScales::Tensor,
                        ..c
                    }),
                    ..mla
                };
            }
            // The batch's features: a config cannot hold them.
            Feature::PaddedRequests | Feature::NonCausal | Feature::PrefixLm | Feature::Rswa => {}
        }
    }

    /// Probes for `attn-diff list` (see [`Aspect::probes`]): the feature turned on, an FP8
    /// cache in each format; none for the batch's features, which `list` asks directly.
    pub fn probes(self, base: &AttentionConfig) -> Vec<(String, AttentionConfig)> {
        let with = |edit: &dyn Fn(&mut AttentionConfig)| edited(base, edit);
        match self {
            Feature::Fp8KvCache => Fp8Format::ALL
                .into_iter()
                .map(|dtype| {
                    let cache = Fp8KvCache::new(dtype, 0.5, 0.25);
                    (
                        format!("KV cache {dtype}"),
                        with(&|c| c.kv_cache = Some(cache.clone())),
                    )
                })
                .collect(),
            Feature::PaddedRequests | Feature::NonCausal | Feature::PrefixLm | Feature::Rswa => {
                Vec::new()
            }
            Feature::EncoderOnly
            | Feature::CrossAttention
            | Feature::SlidingWindow
            | Feature::LogitsSoftCap
            | Feature::Alibi
            | Feature::Sinks
            | Feature::Mla
            | Feature::ChunkedLocalAttention
            | Feature::ChunkLookback
            | Feature::Fp8Query
            | Feature::KvHeadScales
            | Feature::KvTokenScales => {
                vec![(self.label().to_string(), with(&|c| self.turn_on(c)))]
            }
        }
    }
}

/// "I can't run this case": which feature, why in words that hold for every case declined for
/// the same reason, and the case's own value apart (so 17 head sizes declined for one reason
/// are one reason, not 17).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unsupported {
    pub feature: Aspect,
    /// E.g. "not a multiple of 64"; empty when the feature alone says it ("no ALiBi").
    pub detail: String,
    /// The case's value, e.g. "160"; none for an on/off feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl Unsupported {
    pub fn new(feature: impl Into<Aspect>, detail: impl Into<String>) -> Self {
        Unsupported {
            feature: feature.into(),
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
        if self.feature == Dimension::Other {
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
            _ if self.feature == Dimension::Other => f.write_str(&self.detail),
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

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Aspect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Aspect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Aspect::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown feature `{s}` (known: {})",
                    Aspect::ALL.map(Aspect::name).join(", ")
                )
            })
    }
}

impl std::str::FromStr for Feature {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.parse::<Aspect>()? {
            Aspect::Feature(f) => Ok(f),
            Aspect::Dimension(d) => Err(format!(
                "`{d}` is a dimension every case has, not an optional feature (known: {})",
                Feature::ALL.map(Feature::name).join(", ")
            )),
        }
    }
}

/// Its name alone, as JSON has always held it.
impl Serialize for Aspect {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// Every aspect's name, in `Aspect::ALL`'s order, for serde's "expected one of".
const ASPECT_NAMES: [&str; Aspect::ALL.len()] = {
    let mut names = [""; Aspect::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Aspect::ALL[i].name();
        i += 1;
    }
    names
};

impl<'de> Deserialize<'de> for Aspect {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Aspect, D::Error> {
        let name = String::deserialize(d)?;
        name.parse()
            .map_err(|_| serde::de::Error::unknown_variant(&name, &ASPECT_NAMES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        for a in Aspect::ALL {
            assert_eq!(a.name().parse::<Aspect>(), Ok(a));
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(json, format!("\"{}\"", a.name()));
            assert_eq!(serde_json::from_str::<Aspect>(&json).unwrap(), a);
        }
        for f in Feature::ALL {
            assert_eq!(f.name().parse::<Feature>(), Ok(f));
            assert_eq!(
                serde_json::to_string(&f).unwrap(),
                format!("\"{}\"", f.name())
            );
            assert!(Aspect::ALL.contains(&Aspect::Feature(f)));
        }
        let mut names: Vec<_> = Aspect::ALL.map(Aspect::name).to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Aspect::ALL.len());
        assert!("head_size".parse::<Feature>().is_err());
        let bad = serde_json::from_str::<Aspect>("\"window\"").unwrap_err();
        assert!(
            bad.to_string().contains("unknown variant `window`"),
            "{bad}"
        );
        // The names serde offers are every aspect's, as `name` spells them.
        for a in Aspect::ALL {
            assert!(
                bad.to_string().contains(&format!("`{}`", a.name())),
                "{a}: {bad}"
            );
        }
    }

    #[test]
    fn unsupported_reads_with_and_without_its_value() {
        let u = Unsupported::new(Dimension::HeadSize, "not a multiple of 64").value(160);
        assert_eq!(u.to_string(), "head size 160: not a multiple of 64");
        assert_eq!(u.reason(), "head size not a multiple of 64");
        let u = Unsupported::new(Feature::Alibi, "");
        assert_eq!(u.to_string(), "ALiBi");
        let json = serde_json::to_value(&u).unwrap();
        assert_eq!(json, serde_json::json!({"feature": "alibi", "detail": ""}));
    }

    #[test]
    fn the_features_of_the_batch_turn_on_in_a_batch() {
        for f in Feature::OF_THE_BATCH {
            let mut batch = crate::Batch::plain(vec![1], vec![1]);
            assert!(!f.used_by_batch(&batch), "{f}");
            f.turn_on_batch(&mut batch);
            assert!(f.used_by_batch(&batch), "{f}");
            assert_eq!(Feature::of_batch(&batch).collect::<Vec<_>>(), vec![f]);
        }
    }

    #[test]
    fn optional_features_turn_on_and_off() {
        let plain = AttentionConfig::new(4, 2, 8, 16, DType::F32);
        // The features of a batch are not the config's.
        for f in Feature::ALL
            .into_iter()
            .filter(|f| !Feature::OF_THE_BATCH.contains(f))
        {
            let mut c = plain.clone();
            assert!(!f.used_by(&c), "{f}");
            f.turn_on(&mut c);
            assert!(f.used_by(&c), "{f}");
            assert!(c.validate().is_ok(), "{f}: {:?}", c.validate());
            assert!(f.turn_off(&mut c), "{f}");
            if [
                Feature::Fp8Query,
                Feature::KvHeadScales,
                Feature::KvTokenScales,
            ]
            .contains(&f)
            {
                // Off, the query is read as it is, or the cache has one scale for K and one
                // for V; the cache it came with stays FP8.
                assert!(
                    c.kv_cache.as_ref().is_some_and(|k| k.scales.is_tensor()),
                    "{f}"
                );
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
