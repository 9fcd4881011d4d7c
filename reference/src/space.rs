//! The case space a backend runs: what it declares it can run (built-in backends in code,
//! external adapters in their handshake's `capabilities`), narrowed by `check --only`. The
//! strategies draw inside it, the shrinker stays inside it, and [`Space::admits`] is the one
//! check of whether a case is in it. Every key left out (`None`) means "no restriction".
//!
//! The keys and their JSON names are the adapters' capability keys and `--only`'s keys, one
//! list ([`Space::KEYS`]) for both.

use crate::mla::KvLayout;
use crate::Dimension;
use crate::{AttentionConfig, AttentionKind, Case, DType, Feature, Fp8Format, Unsupported};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A KV-cache dtype as vLLM's `kv_cache_dtype` names it: `auto` keeps the compute dtype;
/// `fp8` is `fp8_e4m3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KvCacheDtype {
    Auto,
    Fp8(Fp8Format),
}

impl KvCacheDtype {
    pub const ALL: [KvCacheDtype; 3] = [
        KvCacheDtype::Auto,
        KvCacheDtype::Fp8(Fp8Format::E4m3),
        KvCacheDtype::Fp8(Fp8Format::E5m2),
    ];

    /// The KV-cache dtype of `config`.
    pub fn of(config: &AttentionConfig) -> KvCacheDtype {
        config
            .kv_cache
            .as_ref()
            .map_or(KvCacheDtype::Auto, |c| KvCacheDtype::Fp8(c.dtype))
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvCacheDtype::Auto => f.write_str("auto"),
            KvCacheDtype::Fp8(format) => f.write_str(format.name()),
        }
    }
}

impl FromStr for KvCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(KvCacheDtype::Auto),
            "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8(Fp8Format::E4m3)),
            "fp8_e5m2" => Ok(KvCacheDtype::Fp8(Fp8Format::E5m2)),
            _ => Err(format!(
                "unknown KV-cache dtype `{s}` (known: auto, fp8, fp8_e4m3, fp8_e5m2)"
            )),
        }
    }
}

impl Serialize for KvCacheDtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KvCacheDtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A case space: the configs and batch shapes a backend runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Space {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtypes: Option<Vec<DType>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_sizes: Option<Vec<usize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_size_multiple_of: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_sizes: Option<Vec<usize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size_multiple_of: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<AttentionKind>>,
    /// The optional features implemented (names of [`Feature::ALL`]); a config using
    /// any other one is outside. Encoder-only and cross-attention are declared by `kinds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<Feature>>,
    /// Sequences per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seqs: Option<usize>,
    /// New (query) tokens of one sequence in a step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_query_len: Option<usize>,
    /// Context plus new tokens of one sequence (a cross-attention step: the encoder's keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seq_len: Option<usize>,
    /// Tokens per step, padding tokens included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    /// Query heads per KV head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_group: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtypes: Option<Vec<KvCacheDtype>>,
    /// `mha`, `mla` or both: `--only kv_layouts=mla` aims a run at MLA cases alone. MLA
    /// also needs `mla` among the features (a backend declares it there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_layouts: Option<Vec<KvLayout>>,
}

fn list<T: fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn comma<T: fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Elements of `a` also in `b` (either `None`: the other), in `a`'s order.
fn meet<T: PartialEq + Clone>(a: &Option<Vec<T>>, b: &Option<Vec<T>>) -> Option<Vec<T>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.iter().filter(|x| b.contains(x)).cloned().collect()),
        (Some(v), None) | (None, Some(v)) => Some(v.clone()),
        (None, None) => None,
    }
}

fn min_of(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm_of(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) if a > 0 && b > 0 => Some(a / gcd(a, b) * b),
        (a, b) => a.or(b),
    }
}

/// The largest head size the strategies reach by rounding to a multiple.
const MAX_DRAWN_SIZE: usize = 576;

/// The sizes of a dimension a space allows, in order, up to `cap` when only a multiple is
/// given; `None` when every size is allowed.
fn allowed_sizes(
    set: &Option<Vec<usize>>,
    multiple: Option<usize>,
    cap: usize,
) -> Option<Vec<usize>> {
    let m = multiple.filter(|&m| m > 1);
    match (set, m) {
        (None, None) => None,
        (Some(s), _) => {
            let mut v: Vec<usize> = s
                .iter()
                .copied()
                .filter(|&x| x >= 1 && m.is_none_or(|m| x.is_multiple_of(m)))
                .collect();
            v.sort_unstable();
            v.dedup();
            Some(v)
        }
        (None, Some(m)) => Some((1..=cap.max(m) / m).map(|k| k * m).collect()),
    }
}

/// `x` moved into `allowed` (sorted): kept when allowed; the smallest values (what shrinking
/// goes to) spread over the first allowed sizes, so small draws still reach several; others
/// to the nearest allowed size.
fn fit_size(x: usize, allowed: &Option<Vec<usize>>) -> usize {
    let Some(a) = allowed else { return x };
    if a.is_empty() || a.contains(&x) {
        return x;
    }
    if x >= 1 && x <= a.len() && x < a[0] {
        return a[x - 1];
    }
    *a.iter()
        .min_by_key(|&&s| (s.abs_diff(x), s))
        .expect("not empty")
}

impl Space {
    /// Every key, as adapters' capabilities and `--only` spell them.
    pub const KEYS: [&'static str; 14] = [
        "dtypes",
        "head_sizes",
        "head_size_multiple_of",
        "block_sizes",
        "block_size_multiple_of",
        "kinds",
        "features",
        "max_seqs",
        "max_query_len",
        "max_seq_len",
        "max_tokens",
        "max_group",
        "kv_cache_dtypes",
        "kv_layouts",
    ];

    /// Whether no key restricts anything.
    pub fn is_full(&self) -> bool {
        *self == Space::default()
    }

    /// The space of both: lists intersect, limits take the smaller, multiples their least
    /// common multiple.
    pub fn intersect(&self, other: &Space) -> Space {
        let mut s = Space {
            dtypes: meet(&self.dtypes, &other.dtypes),
            head_sizes: meet(&self.head_sizes, &other.head_sizes),
            head_size_multiple_of: lcm_of(self.head_size_multiple_of, other.head_size_multiple_of),
            block_sizes: meet(&self.block_sizes, &other.block_sizes),
            block_size_multiple_of: lcm_of(
                self.block_size_multiple_of,
                other.block_size_multiple_of,
            ),
            kinds: meet(&self.kinds, &other.kinds),
            features: meet(&self.features, &other.features),
            max_seqs: min_of(self.max_seqs, other.max_seqs),
            max_query_len: min_of(self.max_query_len, other.max_query_len),
            max_seq_len: min_of(self.max_seq_len, other.max_seq_len),
            max_tokens: min_of(self.max_tokens, other.max_tokens),
            max_group: min_of(self.max_group, other.max_group),
            kv_cache_dtypes: meet(&self.kv_cache_dtypes, &other.kv_cache_dtypes),
            kv_layouts: meet(&self.kv_layouts, &other.kv_layouts),
        };
        // The FP8 cache is declared two ways; where either side rules it out, so does both.
        if !(self.allows_feature(Feature::Fp8KvCache) && other.allows_feature(Feature::Fp8KvCache))
        {
            let auto = vec![KvCacheDtype::Auto];
            s.kv_cache_dtypes = Some(meet(&s.kv_cache_dtypes, &Some(auto)).unwrap_or_default());
            if let Some(f) = &mut s.features {
                f.retain(|f| *f != Feature::Fp8KvCache);
            }
        }
        s
    }

    /// Why no case fits this space, if none does (a key whose values were all ruled out).
    pub fn emptiness(&self) -> Option<String> {
        let none_left = |key: &str| Some(format!("no `{key}` is left"));
        if self.dtypes.as_ref().is_some_and(Vec::is_empty) {
            return none_left("dtypes");
        }
        if self.kinds.as_ref().is_some_and(Vec::is_empty) {
            return none_left("kinds");
        }
        if self.kv_cache_dtypes.as_ref().is_some_and(|k| {
            !k.iter()
                .any(|d| *d == KvCacheDtype::Auto || self.allows_feature(Feature::Fp8KvCache))
        }) {
            return none_left("kv_cache_dtypes");
        }
        if self.kv_layouts.as_ref().is_some_and(|k| {
            !k.iter()
                .any(|l| *l == KvLayout::Mha || self.allows_feature(Feature::Mla))
        }) {
            return none_left("kv_layouts");
        }
        if self.head_size_values().is_some_and(|v| v.is_empty()) {
            return Some("no head size is in both `head_sizes` and `head_size_multiple_of`".into());
        }
        if self.block_size_values().is_some_and(|v| v.is_empty()) {
            return Some(
                "no block size is in both `block_sizes` and `block_size_multiple_of`".into(),
            );
        }
        for (key, v) in [
            ("max_seqs", self.max_seqs),
            ("max_query_len", self.max_query_len),
            ("max_seq_len", self.max_seq_len),
            ("max_tokens", self.max_tokens),
            ("max_group", self.max_group),
            ("head_size_multiple_of", self.head_size_multiple_of),
            ("block_size_multiple_of", self.block_size_multiple_of),
        ] {
            if v == Some(0) {
                return Some(format!("`{key}` is 0"));
            }
        }
        None
    }

    /// The head sizes allowed, in order (up to 576 when only a multiple is given).
    pub fn head_size_values(&self) -> Option<Vec<usize>> {
        allowed_sizes(&self.head_sizes, self.head_size_multiple_of, MAX_DRAWN_SIZE)
    }

    /// The block sizes allowed, in order (up to 256 when only a multiple is given).
    pub fn block_size_values(&self) -> Option<Vec<usize>> {
        allowed_sizes(&self.block_sizes, self.block_size_multiple_of, 256)
    }

    pub fn allows_dtype(&self, d: DType) -> bool {
        self.dtypes.as_ref().is_none_or(|v| v.contains(&d))
    }

    pub fn allows_kind(&self, k: AttentionKind) -> bool {
        self.kinds.as_ref().is_none_or(|v| v.contains(&k))
    }

    /// Whether an optional feature may be on.
    pub fn allows_feature(&self, f: Feature) -> bool {
        match f {
            Feature::EncoderOnly => self.allows_kind(AttentionKind::EncoderOnly),
            Feature::CrossAttention => self.allows_kind(AttentionKind::EncoderDecoder),
            // An FP8 format among `kv_cache_dtypes` declares the FP8 cache by itself.
            Feature::Fp8KvCache => match &self.kv_cache_dtypes {
                Some(v) => v.iter().any(|d| *d != KvCacheDtype::Auto),
                None => self.features.as_ref().is_none_or(|v| v.contains(&f)),
            },
            Feature::Mla => {
                self.features.as_ref().is_none_or(|v| v.contains(&f))
                    && self.allows_kv_layout(KvLayout::Mla)
            }
            // Finer scales need a cache they can be the scales of (per token: E4M3's).
            Feature::KvHeadScales => {
                self.features.as_ref().is_none_or(|v| v.contains(&f))
                    && self.allows_feature(Feature::Fp8KvCache)
            }
            Feature::KvTokenScales => {
                self.features.as_ref().is_none_or(|v| v.contains(&f))
                    && self.allows_kv_cache(KvCacheDtype::Fp8(Fp8Format::E4m3))
            }
            Feature::SlidingWindow
            | Feature::LogitsSoftCap
            | Feature::Alibi
            | Feature::Sinks
            | Feature::PaddedRequests
            | Feature::ChunkedLocalAttention
            | Feature::NonCausal
            | Feature::PrefixLm
            | Feature::Rswa
            | Feature::ChunkLookback
            | Feature::Fp8Query => self.features.as_ref().is_none_or(|v| v.contains(&f)),
        }
    }

    /// Whether `--only kv_layouts=` (or a declared list) lets this layout in.
    pub fn allows_kv_layout(&self, l: KvLayout) -> bool {
        self.kv_layouts.as_ref().is_none_or(|v| v.contains(&l))
    }

    pub fn allows_kv_cache(&self, k: KvCacheDtype) -> bool {
        match k {
            KvCacheDtype::Auto => self.kv_cache_dtypes.as_ref().is_none_or(|v| v.contains(&k)),
            KvCacheDtype::Fp8(_) => {
                self.allows_feature(Feature::Fp8KvCache)
                    && self.kv_cache_dtypes.as_ref().is_none_or(|v| v.contains(&k))
            }
        }
    }

    /// `Err` naming the first key `config` breaks.
    pub fn admits_config(&self, c: &AttentionConfig) -> Result<(), Unsupported> {
        if let Some(d) = &self.dtypes {
            if !d.contains(&c.dtype) {
                return Err(
                    Unsupported::new(Dimension::Dtype, format!("other than {}", list(d)))
                        .value(c.dtype),
                );
            }
        }
        if let Some(h) = &self.head_sizes {
            if !h.contains(&c.head_size) {
                return Err(Unsupported::new(
                    Dimension::HeadSize,
                    format!("other than {}", list(h)),
                )
                .value(c.head_size));
            }
        }
        if let Some(m) = self.head_size_multiple_of.filter(|&m| m > 0) {
            if !c.head_size.is_multiple_of(m) {
                return Err(Unsupported::new(
                    Dimension::HeadSize,
                    format!("not a multiple of {m}"),
                )
                .value(c.head_size));
            }
        }
        if let Some(b) = &self.block_sizes {
            if !b.contains(&c.block_size) {
                return Err(Unsupported::new(
                    Dimension::BlockSize,
                    format!("other than {}", list(b)),
                )
                .value(c.block_size));
            }
        }
        if let Some(m) = self.block_size_multiple_of.filter(|&m| m > 0) {
            if !c.block_size.is_multiple_of(m) {
                return Err(Unsupported::new(
                    Dimension::BlockSize,
                    format!("not a multiple of {m}"),
                )
                .value(c.block_size));
            }
        }
        if !self.allows_kind(c.kind) {
            return Err(match c.kind {
                AttentionKind::EncoderDecoder => Unsupported::new(Feature::CrossAttention, ""),
                AttentionKind::EncoderOnly => Unsupported::new(Feature::EncoderOnly, ""),
                AttentionKind::Decoder => Unsupported::new(Dimension::Other, "decoder attention"),
            });
        }
        if let Some(missing) = Feature::ALL
            .into_iter()
            .filter(|x| ![Feature::EncoderOnly, Feature::CrossAttention].contains(x))
            .find(|x| x.used_by(c) && !self.allows_feature(*x))
        {
            return Err(Unsupported::new(missing, ""));
        }
        let kv = KvCacheDtype::of(c);
        if !self.allows_kv_cache(kv) {
            let allowed = self.kv_cache_dtypes.as_deref().unwrap_or(&[]);
            return Err(Unsupported::new(
                Feature::Fp8KvCache,
                format!("KV cache other than {}", list(allowed)),
            )
            .value(kv));
        }
        let layout = KvLayout::of(c);
        if !self.allows_kv_layout(layout) {
            let allowed = self.kv_layouts.as_deref().unwrap_or(&[]);
            return Err(Unsupported::new(
                Dimension::HeadLayout,
                format!("KV layout other than {}", list(allowed)),
            )
            .value(layout));
        }
        if let Some(g) = self.max_group {
            if c.group_size() > g {
                return Err(Unsupported::new(
                    Dimension::HeadLayout,
                    format!("group above {g} query heads per KV head"),
                )
                .value(format!("{}/{}", c.num_heads, c.num_kv_heads)));
            }
        }
        Ok(())
    }

    /// `Err` naming the first feature of the batch not declared or the first batch limit
    /// `batch` breaks.
    pub fn admits_batch(&self, batch: &crate::Batch) -> Result<(), Unsupported> {
        let (seq_lens, query_lens) = (&batch.seq_lens, &batch.query_lens);
        let num_tokens = query_lens.iter().sum::<usize>() + batch.num_padding_tokens;
        let over = |what: &str, limit: usize, value: usize| {
            Unsupported::new(Dimension::BatchShape, format!("{what} above {limit}")).value(value)
        };
        if let Some(f) = Feature::OF_THE_BATCH
            .into_iter()
            .find(|&f| f.used_by_batch(batch) && !self.allows_feature(f))
        {
            return Err(Unsupported::new(f, "not declared"));
        }
        if let Some(m) = self.max_seqs {
            if seq_lens.len() > m {
                return Err(over("sequences per step", m, seq_lens.len()));
            }
        }
        if let Some(m) = self.max_query_len {
            if let Some(&q) = query_lens.iter().max().filter(|&&q| q > m) {
                return Err(over("query length", m, q));
            }
        }
        if let Some(m) = self.max_seq_len {
            if let Some(&l) = seq_lens.iter().max().filter(|&&l| l > m) {
                return Err(over("sequence length", m, l));
            }
        }
        if let Some(m) = self.max_tokens {
            if num_tokens > m {
                return Err(over("tokens per step", m, num_tokens));
            }
        }
        Ok(())
    }

    /// Whether `case` is inside: its config, then its batch.
    pub fn admits(&self, case: &Case) -> Result<(), Unsupported> {
        self.admits_config(&case.config)?;
        self.admits_batch(&case.batch)
    }

    /// `config` moved inside the space, deterministically and changing only what is
    /// outside: a dtype, kind or KV-cache dtype that is not allowed becomes an allowed one,
    /// sizes move to allowed ones, features not implemented are turned off, the group is
    /// capped. The identity on a config already inside (so a full space draws what it
    /// always drew).
    pub fn fit_config(&self, c: &mut AttentionConfig) {
        if let Some(d) = self.dtypes.as_ref().filter(|d| !d.is_empty()) {
            if !d.contains(&c.dtype) {
                let i = DType::ALL.iter().position(|x| *x == c.dtype).unwrap_or(0);
                c.dtype = d[i % d.len()];
            }
        }
        if !self.allows_kind(c.kind) {
            let k = self.kinds.as_deref().unwrap_or(&[]);
            c.kind = if k.contains(&AttentionKind::Decoder) || k.is_empty() {
                AttentionKind::Decoder
            } else {
                k[0]
            };
        }
        c.head_size = fit_size(c.head_size, &self.head_size_values());
        if let Some(m) = &mut c.mla {
            // V stays a prefix of the (possibly smaller) latent entry.
            m.head_size_v = m.head_size_v.min(c.head_size);
        }
        c.block_size = fit_size(c.block_size, &self.block_size_values());
        for f in Feature::ALL {
            if ![Feature::EncoderOnly, Feature::CrossAttention].contains(&f)
                && f.used_by(c)
                && !self.allows_feature(f)
            {
                f.turn_off(c);
            }
        }
        let kv = KvCacheDtype::of(c);
        if !self.allows_kv_cache(kv) {
            let allowed: Vec<KvCacheDtype> = KvCacheDtype::ALL
                .into_iter()
                .filter(|k| self.allows_kv_cache(*k))
                .collect();
            // An FP8 cache keeps its scales in another format; one made from nothing gets
            // scales that are exact in every dtype.
            // An MLA entry is one tensor: one scale for K and V.
            let fresh = if c.mla.is_some() {
                (0.5, 0.5)
            } else {
                (0.5, 0.25)
            };
            c.kv_cache = match allowed.first() {
                Some(KvCacheDtype::Fp8(f)) => {
                    let f = allowed
                        .iter()
                        .find_map(|k| match k {
                            KvCacheDtype::Fp8(g)
                                if Some(*g) != c.kv_cache.as_ref().map(|x| x.dtype) =>
                            {
                                Some(*g)
                            }
                            _ => None,
                        })
                        .unwrap_or(*f);
                    // Only the format changes: the scales and the rest of the cache stay, but
                    // per-token scales, which only E4M3 has.
                    Some(c.kv_cache.take().map_or_else(
                        || crate::Fp8KvCache::new(f, fresh.0, fresh.1),
                        |k| {
                            let scales = match k.scales {
                                crate::KvScales::Token if f != Fp8Format::E4m3 => {
                                    crate::KvScales::Tensor
                                }
                                s => s,
                            };
                            crate::Fp8KvCache {
                                dtype: f,
                                scales,
                                ..k
                            }
                        },
                    ))
                }
                _ => None,
            };
        }
        // Only MLA allowed (`--only kv_layouts=mla`): DeepSeek-V3's latent with the config's
        // heads, dtype, block size and cache format.
        if !self.allows_kv_layout(KvLayout::of(c)) && self.allows_feature(Feature::Mla) {
            Feature::Mla.turn_on(c);
            c.head_size = fit_size(c.head_size, &self.head_size_values());
            if let Some(m) = &mut c.mla {
                m.head_size_v = m.head_size_v.min(c.head_size);
            }
        }
        if let Some(g) = self.max_group.filter(|&g| g >= 1) {
            if c.group_size() > g {
                c.num_heads = c.num_kv_heads * g;
                // Per-head vectors (ALiBi's slopes, the sinks) follow the head count.
                let heads = c.num_heads;
                for v in [&mut c.alibi_slopes, &mut c.sinks].into_iter().flatten() {
                    v.truncate(heads);
                }
            }
        }
    }

    /// Lengths `(context, query)` per sequence and padding tokens moved inside the batch
    /// limits for attention `kind`: sequences past `max_seqs` dropped, queries and contexts
    /// shortened, padding first and then the longest queries cut to fit `max_tokens`. The
    /// identity when already inside.
    pub fn fit_lengths(
        &self,
        kind: AttentionKind,
        seqs: &mut Vec<(usize, usize)>,
        padding: &mut usize,
    ) {
        if let Some(m) = self.max_seqs.filter(|&m| m >= 1) {
            seqs.truncate(m);
        }
        if let Some(m) = self.max_tokens.filter(|&m| m >= 1) {
            seqs.truncate(m);
        }
        let max_q = self.max_query_len.filter(|&m| m >= 1);
        let max_len = self.max_seq_len.filter(|&m| m >= 1);
        for (ctx, q) in seqs.iter_mut() {
            if let Some(m) = max_q {
                *q = (*q).min(m);
            }
            if let Some(m) = max_len {
                match kind {
                    AttentionKind::Decoder => {
                        *q = (*q).min(m);
                        *ctx = (*ctx).min(m - *q);
                    }
                    AttentionKind::EncoderOnly => *q = (*q).min(m),
                    AttentionKind::EncoderDecoder => *ctx = (*ctx).min(m),
                }
            }
        }
        if let Some(m) = self.max_tokens.filter(|&m| m >= 1) {
            let mut real: usize = seqs.iter().map(|s| s.1).sum();
            while real > m {
                let longest = seqs.iter_mut().max_by_key(|s| s.1).expect("real > 0");
                let cut = (real - m).min(longest.1 - 1);
                if cut == 0 {
                    break;
                }
                longest.1 -= cut;
                real -= cut;
            }
            *padding = (*padding).min(m.saturating_sub(real));
        }
    }

    /// `--only`'s `KEY=VALUES` as a space (values comma-separated).
    pub fn parse_only(text: &str) -> Result<Space, String> {
        let (key, values) = text
            .split_once('=')
            .ok_or_else(|| format!("`{text}` is not KEY=VALUES (e.g. dtypes=f16)"))?;
        let key = key.trim();
        let items: Vec<&str> = values
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if key == "features" && (items.is_empty() || items == ["none"]) {
            // No optional feature at all: what a plain backend declares.
            return Ok(Space {
                features: Some(Vec::new()),
                ..Space::default()
            });
        }
        if items.is_empty() {
            return Err(format!("`{key}` has no values"));
        }
        let strings: Vec<String> = items.iter().map(|s| s.to_string()).collect();
        let nums = || -> Result<Vec<usize>, String> {
            items
                .iter()
                .map(|s| {
                    s.parse::<usize>()
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| format!("`{key}`: `{s}` is not a positive integer"))
                })
                .collect()
        };
        let one = || -> Result<usize, String> {
            match nums()?.as_slice() {
                [n] => Ok(*n),
                _ => Err(format!("`{key}` takes one number")),
            }
        };
        fn each<T: FromStr>(key: &str, items: &[String]) -> Result<Vec<T>, String>
        where
            T::Err: fmt::Display,
        {
            items
                .iter()
                .map(|s| s.parse::<T>().map_err(|e| format!("`{key}`: {e}")))
                .collect()
        }
        let mut s = Space::default();
        match key {
            "dtypes" => s.dtypes = Some(each(key, &strings)?),
            "head_sizes" => s.head_sizes = Some(nums()?),
            "head_size_multiple_of" => s.head_size_multiple_of = Some(one()?),
            "block_sizes" => s.block_sizes = Some(nums()?),
            "block_size_multiple_of" => s.block_size_multiple_of = Some(one()?),
            "kinds" => s.kinds = Some(each(key, &strings)?),
            "features" => {
                let f: Vec<Feature> = each(key, &strings)?;
                if let Some(bad) = f.iter().find(|f| !Feature::ALL.contains(f)) {
                    return Err(format!(
                        "`features`: `{bad}` is not an optional feature (known: {})",
                        Feature::ALL.map(Feature::name).join(", ")
                    ));
                }
                s.features = Some(f);
            }
            "max_seqs" => s.max_seqs = Some(one()?),
            "max_query_len" => s.max_query_len = Some(one()?),
            "max_seq_len" => s.max_seq_len = Some(one()?),
            "max_tokens" => s.max_tokens = Some(one()?),
            "max_group" => s.max_group = Some(one()?),
            "kv_cache_dtypes" => s.kv_cache_dtypes = Some(each(key, &strings)?),
            "kv_layouts" => s.kv_layouts = Some(each(key, &strings)?),
            _ => {
                return Err(format!(
                    "unknown key `{key}` (known: {})",
                    Space::KEYS.join(", ")
                ))
            }
        }
        Ok(s)
    }

    /// The space as `--only` arguments, in [`Space::KEYS`] order: what reproduces it.
    pub fn only_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut push = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push(format!("{k}={v}"));
            }
        };
        push("dtypes", self.dtypes.as_deref().map(comma));
        push("head_sizes", self.head_sizes.as_deref().map(comma));
        push(
            "head_size_multiple_of",
            self.head_size_multiple_of.map(|m| m.to_string()),
        );
        push("block_sizes", self.block_sizes.as_deref().map(comma));
        push(
            "block_size_multiple_of",
            self.block_size_multiple_of.map(|m| m.to_string()),
        );
        push("kinds", self.kinds.as_deref().map(comma));
        push(
            "features",
            self.features.as_deref().map(|f| {
                if f.is_empty() {
                    "none".into()
                } else {
                    comma(f)
                }
            }),
        );
        push("max_seqs", self.max_seqs.map(|m| m.to_string()));
        push("max_query_len", self.max_query_len.map(|m| m.to_string()));
        push("max_seq_len", self.max_seq_len.map(|m| m.to_string()));
        push("max_tokens", self.max_tokens.map(|m| m.to_string()));
        push("max_group", self.max_group.map(|m| m.to_string()));
        push(
            "kv_cache_dtypes",
            self.kv_cache_dtypes.as_deref().map(comma),
        );
        push("kv_layouts", self.kv_layouts.as_deref().map(comma));
        out
    }
}

/// `dtypes=f16 head_size_multiple_of=64 max_seqs=1`; `everything` for the full space.
impl fmt::Display for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args = self.only_args();
        if args.is_empty() {
            f.write_str("everything")
        } else {
            f.write_str(&args.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spyre() -> Space {
        serde_json::from_str(
            r#"{"dtypes": ["f16"], "head_size_multiple_of": 64, "max_seqs": 1,
                "kinds": ["decoder"], "features": []}"#,
        )
        .unwrap()
    }

    #[test]
    fn restrictions_name_what_is_missing() {
        let caps: Space = serde_json::from_str(
            r#"{"dtypes": ["bf16", "f32"], "head_sizes": [64, 128], "block_size_multiple_of": 16,
                "kinds": ["decoder"], "features": ["sliding_window"]}"#,
        )
        .unwrap();
        let ok = AttentionConfig::new(4, 2, 64, 32, DType::Bf16);
        assert_eq!(caps.admits_config(&ok), Ok(()));
        let f16 = AttentionConfig {
            dtype: DType::F16,
            ..ok.clone()
        };
        assert_eq!(
            caps.admits_config(&f16).unwrap_err().to_string(),
            "dtype f16: other than bf16, f32"
        );
        let hs = AttentionConfig {
            head_size: 3,
            ..ok.clone()
        };
        assert_eq!(
            caps.admits_config(&hs).unwrap_err().to_string(),
            "head size 3: other than 64, 128"
        );
        let bs = AttentionConfig {
            block_size: 3,
            ..ok.clone()
        };
        assert_eq!(
            caps.admits_config(&bs).unwrap_err().reason(),
            "block size not a multiple of 16"
        );
        let cap = AttentionConfig {
            logits_soft_cap: Some(5.0),
            ..ok
        };
        assert_eq!(
            caps.admits_config(&cap).unwrap_err(),
            Unsupported::new(Feature::LogitsSoftCap, "")
        );
        assert_eq!(Space::default().admits_config(&cap), Ok(()));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        assert!(serde_json::from_str::<Space>(r#"{"head_size": [1]}"#).is_err());
        assert!(serde_json::from_str::<Space>(r#"{"kv_cache_dtypes": ["fp9"]}"#).is_err());
        for key in Space::KEYS {
            assert!(
                Space::parse_only(&format!("{key}=1")).is_ok()
                    || Space::parse_only(&format!("{key}=1"))
                        .unwrap_err()
                        .contains(key),
                "{key}"
            );
        }
        assert!(Space::parse_only("max_seq=1")
            .unwrap_err()
            .contains("unknown key `max_seq`"));
        assert!(Space::parse_only("max_seqs=0")
            .unwrap_err()
            .contains("positive"));
        assert!(Space::parse_only("max_seqs=1,2")
            .unwrap_err()
            .contains("one number"));
        assert!(Space::parse_only("dtypes")
            .unwrap_err()
            .contains("KEY=VALUES"));
        assert!(Space::parse_only("features=trace").is_err());
    }

    #[test]
    fn only_args_round_trip() {
        let mut s = spyre();
        assert!(s.only_args().contains(&"features=none".to_string()));
        s.features = Some(vec![Feature::Fp8KvCache]);
        s.kv_cache_dtypes = Some(vec![KvCacheDtype::Auto, KvCacheDtype::Fp8(Fp8Format::E5m2)]);
        s.block_sizes = Some(vec![16, 64]);
        s.max_tokens = Some(512);
        let mut back = Space::default();
        for a in s.only_args() {
            back = back.intersect(&Space::parse_only(&a).unwrap());
        }
        assert_eq!(back, s);
        assert_eq!(Space::default().to_string(), "everything");
        assert!(s.to_string().starts_with("dtypes=f16 "));
    }

    #[test]
    fn intersection_narrows_every_key() {
        let a: Space = serde_json::from_str(
            r#"{"dtypes": ["f16", "bf16"], "head_size_multiple_of": 64, "max_seqs": 4,
                "kv_cache_dtypes": ["auto", "fp8"]}"#,
        )
        .unwrap();
        let b: Space = serde_json::from_str(
            r#"{"dtypes": ["f16", "f32"], "head_size_multiple_of": 48, "max_seqs": 1,
                "max_tokens": 64, "kv_cache_dtypes": ["fp8_e4m3", "fp8_e5m2"]}"#,
        )
        .unwrap();
        let c = a.intersect(&b);
        assert_eq!(c.dtypes, Some(vec![DType::F16]));
        assert_eq!(c.head_size_multiple_of, Some(192));
        assert_eq!(c.max_seqs, Some(1));
        assert_eq!(c.max_tokens, Some(64));
        assert_eq!(
            c.kv_cache_dtypes,
            Some(vec![KvCacheDtype::Fp8(Fp8Format::E4m3)])
        );
        assert_eq!(c.emptiness(), None);
        let none = a.intersect(&Space::parse_only("dtypes=f32").unwrap());
        assert!(none.emptiness().unwrap().contains("dtypes"));
    }

    #[test]
    fn fitting_a_config_lands_inside_and_keeps_what_is_inside() {
        let space = spyre();
        for dtype in DType::ALL {
            for d in [1, 2, 3, 8, 63, 65, 80, 128, 200, 576, 1000] {
                let mut c = AttentionConfig::new(8, 2, d, 16, dtype);
                c.sliding_window = Some(4);
                c.kind = AttentionKind::EncoderOnly;
                Feature::Sinks.turn_on(&mut c);
                space.fit_config(&mut c);
                assert_eq!(space.admits_config(&c), Ok(()), "{c}");
                assert!(c.validate().is_ok(), "{c}");
            }
        }
        let mut c = AttentionConfig::new(8, 2, 2, 16, DType::F32);
        space.fit_config(&mut c);
        assert_eq!(c.head_size, 128, "small sizes spread over the allowed ones");
        // Inside already: unchanged.
        let full = Space::default();
        let mut c = AttentionConfig::new(8, 2, 3, 5, DType::Bf16);
        Feature::Alibi.turn_on(&mut c);
        let before = c.clone();
        full.fit_config(&mut c);
        assert_eq!(c, before);
        // Groups capped, per-head vectors following.
        let mut c = AttentionConfig::new(16, 2, 64, 16, DType::F16);
        Feature::Alibi.turn_on(&mut c);
        Space::parse_only("max_group=2").unwrap().fit_config(&mut c);
        assert_eq!(
            (c.num_heads, c.alibi_slopes.as_ref().unwrap().len()),
            (4, 4)
        );
        assert!(c.validate().is_ok());
        // FP8 only: a cache in the compute dtype becomes FP8.
        let fp8 = Space::parse_only("kv_cache_dtypes=fp8_e5m2").unwrap();
        let mut c = AttentionConfig::new(2, 1, 8, 4, DType::F32);
        fp8.fit_config(&mut c);
        assert_eq!(KvCacheDtype::of(&c), KvCacheDtype::Fp8(Fp8Format::E5m2));
        assert_eq!(fp8.admits_config(&c), Ok(()));
    }

    #[test]
    fn fitting_lengths_respects_every_batch_limit() {
        let s: Space = serde_json::from_str(
            r#"{"max_seqs": 3, "max_query_len": 5, "max_seq_len": 20, "max_tokens": 9}"#,
        )
        .unwrap();
        for kind in AttentionKind::ALL {
            let mut seqs = vec![(30, 7), (0, 1), (18, 4), (2, 2), (5, 5)];
            let mut padding = 4;
            s.fit_lengths(kind, &mut seqs, &mut padding);
            let lens: Vec<usize> = seqs
                .iter()
                .map(|&(c, q)| match kind {
                    AttentionKind::Decoder => c + q,
                    AttentionKind::EncoderOnly => q,
                    AttentionKind::EncoderDecoder => c,
                })
                .collect();
            let q: Vec<usize> = seqs.iter().map(|s| s.1).collect();
            let batch = crate::Batch {
                seq_lens: lens,
                query_lens: q.clone(),
                num_padding_tokens: padding,
                causal: None,
                prefix_lm: None,
                rswa: None,
            };
            assert_eq!(s.admits_batch(&batch), Ok(()), "{kind}: {seqs:?}");
            assert!(q.iter().all(|&q| q >= 1));
        }
        let mut seqs = vec![(3, 1)];
        let mut padding = 2;
        Space::default().fit_lengths(AttentionKind::Decoder, &mut seqs, &mut padding);
        assert_eq!((seqs, padding), (vec![(3, 1)], 2));
    }

    #[test]
    fn batch_limits_name_the_limit() {
        let s = spyre();
        let batch = crate::Batch {
            seq_lens: vec![3, 4],
            query_lens: vec![1, 1],
            num_padding_tokens: 0,
            causal: None,
            prefix_lm: None,
            rswa: None,
        };
        let e = s.admits_batch(&batch).unwrap_err();
        assert_eq!(e.to_string(), "batch shape 2: sequences per step above 1");
        assert_eq!(e.feature, Dimension::BatchShape);
    }

    #[test]
    fn kv_layouts_aim_a_run_at_mla_and_features_declare_it() {
        let mla = AttentionConfig::deepseek_v3_mla(16, 16, DType::Bf16);
        let mha = AttentionConfig::new(4, 2, 64, 16, DType::Bf16);
        // A backend that lists features without `mla` declines MLA by that feature.
        let plain: Space = serde_json::from_str(r#"{"features": ["sinks"]}"#).unwrap();
        assert_eq!(
            plain.admits_config(&mla).unwrap_err(),
            Unsupported::new(Feature::Mla, "")
        );
        assert!(!plain.allows_feature(Feature::Mla));
        // `--only kv_layouts=mla`: MHA configs are outside, and fitting turns them into MLA.
        let only = Space::parse_only("kv_layouts=mla").unwrap();
        assert_eq!(only.only_args(), vec!["kv_layouts=mla".to_string()]);
        assert_eq!(only.admits_config(&mla), Ok(()));
        let e = only.admits_config(&mha).unwrap_err();
        assert_eq!(e.to_string(), "head layout mha: KV layout other than mla");
        let mut fitted = mha.clone();
        only.fit_config(&mut fitted);
        assert_eq!(only.admits_config(&fitted), Ok(()));
        assert_eq!(fitted.validate(), Ok(()));
        assert_eq!((fitted.num_heads, fitted.block_size), (4, 16));
        // Narrowed to MLA for a backend without it, nothing is left.
        assert!(only.intersect(&plain).emptiness().is_some());
        assert!(only.emptiness().is_none());
        // `kv_layouts=mha` turns MLA off.
        let mut off = mla.clone();
        Space::parse_only("kv_layouts=mha")
            .unwrap()
            .fit_config(&mut off);
        assert_eq!(off.mla, None);
        assert!(Space::parse_only("kv_layouts=gqa")
            .unwrap_err()
            .contains("unknown KV layout"));
    }
}
