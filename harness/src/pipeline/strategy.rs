//! Random cases for the property runner: a [`CaseRecipe`] is a small description of a case
//! (shapes, features, table order, how values are made) that proptest generates and shrinks;
//! [`CaseRecipe::build`] turns it into a full, valid [`Case`] deterministically.
//!
//! Shrinking moves toward fewer and shorter sequences, one kv head, group 1, tiny head and
//! block sizes, features off, no padding, sequential tables and small-integer values, so a
//! minimal failing case reads like a hand-written one.

use attn_reference::{
    build_case, AttentionConfig, AttentionKind, BuildOptions, Case, DType, Feature, Fp8Format,
    Fp8KvCache, InputRng, Poison, SharedPrefix, Space,
};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

pub use crate::extremes::LogitShift;

/// How physical blocks are assigned to the sequences' logical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TableOrder {
    /// Blocks 1, 2, 3, ... in sequence order.
    Sequential,
    /// Each physical order reversed: later logical blocks sit at lower ids.
    Reversed,
    /// Round-robin between sequences: neighbours in the cache belong to different sequences.
    Interleaved,
    /// A random permutation (block 0 stays the null block), as upstream builds it.
    Permuted(u64),
}

/// How tensor values are made.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Values {
    /// Small integers in [-2, 2]: readable in a report.
    Simple(u64),
    /// Normal values with a standard deviation (large ones push logits into the hundreds).
    Normal { seed: u64, std: f32 },
}

impl Values {
    /// The seed the values are drawn from: what the features derived from it (poison,
    /// padded requests) are a function of.
    pub fn seed(self) -> u64 {
        match self {
            Values::Simple(s) | Values::Normal { seed: s, .. } => s,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseRecipe {
    pub num_kv_heads: usize,
    /// Query heads per kv head.
    pub group: usize,
    pub head_size: usize,
    pub block_size: usize,
    pub dtype: DType,
    pub kind: AttentionKind,
    /// (context_len, query_len) per sequence; encoder-only ignores context_len;
    /// cross-attention takes it as the encoder's length (at least 1).
    pub seqs: Vec<(usize, usize)>,
    pub window: Option<usize>,
    pub soft_cap: Option<f32>,
    pub alibi: bool,
    pub sinks: bool,
    pub padding_tokens: usize,
    pub spare_blocks: usize,
    pub table: TableOrder,
    pub values: Values,
    /// Prefix sharing: the first `group` sequences share their first `blocks` full context
    /// blocks (decoder only; their contexts are lengthened to hold them).
    #[serde(default)]
    pub share: Option<Share>,
    /// A custom softmax scale (None: the default `head_size^-0.5`).
    #[serde(default)]
    pub scale: Option<f32>,
    /// A cache of this many blocks with the case's blocks at its top (huge caches: element
    /// offsets past 2^31); None: just the blocks the case needs.
    #[serde(default)]
    pub cache_blocks: Option<usize>,
    /// An FP8 KV cache (None: the cache holds the compute dtype).
    #[serde(default)]
    pub kv_cache: Option<Fp8KvCache>,
    /// What unwritten slots and padding rows hold (None: large finite stale values).
    #[serde(default)]
    pub poison: Option<Poison>,
    /// Every q·k of a row shifted alike (None: the values' own logits).
    #[serde(default)]
    pub logits: Option<LogitShift>,
    /// Requests of query_len 0 and seq_len 0 after the real ones, as vLLM pads a batch's
    /// request count for CUDA graphs (decoder only).
    #[serde(default)]
    pub padded_requests: usize,
    /// Multi-head latent attention (one latent kv head, V its prefix, the model's scale);
    /// drawn by [`crate::strategy_mla`]. None: ordinary attention.
    #[serde(default)]
    pub mla: Option<LatentRecipe>,
    /// Chunked local attention: positions in chunks of this many (decoder only).
    #[serde(default)]
    pub chunk: Option<usize>,
    /// Chunks before its own a query also sees (only with `chunk`; None: its own only).
    #[serde(default)]
    pub lookback: Option<usize>,
    /// Non-causal requests: bit `s` makes sequence `s` non-causal (decoder only). A mask
    /// rather than a list, so dropping a sequence while shrinking leaves it valid.
    #[serde(default)]
    pub non_causal: Option<u64>,
    /// PrefixLM ranges (decoder only).
    #[serde(default)]
    pub prefix_lm: Option<RangesRecipe>,
    /// R-SWA (decoder only; validation refuses it beside a window or PrefixLM ranges).
    #[serde(default)]
    pub rswa: Option<RswaRecipe>,
}

/// PrefixLM ranges as thousandths of each sequence's length, so shrinking a length keeps
/// them valid: they land at the start, the middle or the end, across the context and the
/// step's tokens, over block and query-chunk edges, one token long where a range is narrow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RangesRecipe {
    /// `[start, end]` in thousandths of a sequence's length (ends inclusive), sorted; one
    /// that lands on or before the previous one's end is dropped.
    pub spans: Vec<(u16, u16)>,
    /// Bit `s`: sequence `s` has the ranges (others have none).
    pub seqs: u64,
    /// Gemma 4's clamp: a range's keys only within the sliding window.
    pub clamp: bool,
}

impl RangesRecipe {
    /// Sequence `s`'s ranges at length `seq_len`.
    pub fn ranges(&self, s: usize, seq_len: usize) -> Vec<(usize, usize)> {
        if s >= 64 || self.seqs >> s & 1 == 0 {
            return Vec::new();
        }
        attn_reference::PrefixLm::ranges_at(&self.spans, seq_len)
    }
}

/// R-SWA's window, and each sequence's prefix as thousandths of its length (sequence `s`
/// shifted by `s * 379`, so the requests of a batch differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RswaRecipe {
    pub window: usize,
    pub prefix: u16,
}

impl RswaRecipe {
    pub fn prefix_len(&self, s: usize, seq_len: usize) -> usize {
        seq_len * ((self.prefix as usize + 379 * s) % 1001) / 1000
    }

    /// R-SWA with `window` whose longest sequence of `seqs` (context, query) has a prefix of
    /// `thousandths` of its length (the others' follow from the shift by `s * 379`).
    pub fn with_longest_prefix(window: usize, seqs: &[(usize, usize)], thousandths: u16) -> Self {
        let s = (0..seqs.len())
            .max_by_key(|&s| seqs[s].0 + seqs[s].1)
            .unwrap_or(0);
        let prefix = (thousandths as usize % 1001 + 1001 - 379 * s % 1001) % 1001;
        RswaRecipe {
            window,
            prefix: prefix as u16,
        }
    }
}

/// An MLA recipe's latent: the entry's dims past V and the model's scale (which `scale` does
/// not carry: an MLA config without its scale is invalid, so shrinking `scale` leaves this
/// alone).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatentRecipe {
    /// `head_size - head_size_v` (DeepSeek: the 64 rotary dims): kept as the head size
    /// shrinks, so V stays narrower than K down to 2 and 1.
    pub rope: usize,
    pub scale: f32,
}

impl LatentRecipe {
    /// V's width in an entry of `head_size`: at least 1.
    pub fn head_size_v(&self, head_size: usize) -> usize {
        head_size.saturating_sub(self.rope).max(1)
    }
}

/// One decoder case in eight carries 1 to 3 padded requests, how many a function of the
/// values' seed (so the draws of every other field are what they were).
pub fn padded_requests_of(values: Values) -> usize {
    padded_one_in(values, 8)
}

/// 1 to 3 padded requests in one recipe in `n`, which ones a function of the values' seed.
fn padded_one_in(values: Values, n: u64) -> usize {
    let mixed = values.seed().wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 58;
    match mixed % n {
        0 => 1 + (mixed / n) as usize % 3,
        _ => 0,
    }
}

/// Decode batches are what CUDA graphs pad: one in two carries 1 to 3 padded requests.
pub fn padded_requests_in_batches(values: Values) -> usize {
    padded_one_in(values, 2)
}

/// One case in four runs on poisoned memory, which one a function of the values' seed (so
/// the draws of every other field are what they were).
pub fn poison_of(values: Values) -> Option<Poison> {
    let mixed = values.seed().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59;
    Poison::ALL.get(mixed as usize % 16).copied()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub group: usize,
    pub blocks: usize,
}

/// Size limits of generated cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrategyLimits {
    pub max_seqs: usize,
    pub max_context: usize,
    pub max_query: usize,
    /// One case in this many is of the long tier (long contexts, large decode batches, huge
    /// caches; see [`Tier`]).
    pub long_every: usize,
    /// The longest context of the long tier.
    pub max_long_context: usize,
}

impl StrategyLimits {
    /// Small cases where off-by-ones are visible, and one in 25 from the long tier: every run
    /// of 500 holds contexts past 16k and 4k, a 256-sequence decode batch and a huge cache.
    pub const DEFAULT: StrategyLimits = StrategyLimits {
        max_seqs: 8,
        max_context: 80,
        max_query: 24,
        long_every: 25,
        max_long_context: 40_000,
    };
    /// `--deep`: bigger batches and longer sequences.
    pub const DEEP: StrategyLimits = StrategyLimits {
        max_seqs: 32,
        max_context: 1200,
        max_query: 80,
        ..StrategyLimits::DEFAULT
    };

    /// `--long`: the long tier for one case in four, contexts up to 128k.
    pub fn long(self) -> StrategyLimits {
        StrategyLimits {
            long_every: 4,
            max_long_context: 131_072,
            ..self
        }
    }
}

/// Which part of the case space a property case comes from, by its index (so every run of
/// a seed holds the same mix, and shards split it evenly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Small cases, lengths and sizes aimed at thresholds ([`recipe`]).
    Small,
    /// One or two sequences with contexts from 4k up, few heads ([`long_context`]).
    LongContext,
    /// Decode batches of 16 to 256 sequences ([`decode_batch`]).
    DecodeBatch,
    /// A few short sequences whose blocks sit at the top of a cache whose element offsets
    /// pass 2^31 ([`huge_cache`]).
    HugeCache,
    /// A prefill chunk of 8,193 to 32,768 tokens ([`crate::extremes::big_step`]).
    BigStep,
    /// Decode batches of 512 to 2,048 sequences ([`crate::extremes::big_batch`]).
    BigBatch,
    /// A half dtype with a positional feature just past where its positions round
    /// ([`crate::pipeline::precision`]).
    Precision,
}

impl Tier {
    pub fn of(index: usize, limits: StrategyLimits) -> Tier {
        let every = limits.long_every.max(1);
        if index % every != every / 2 {
            if crate::pipeline::precision::is_precision(index) {
                return Tier::Precision;
            }
            return Tier::Small;
        }
        match (index / every) % 8 {
            0 | 2 | 6 => Tier::LongContext,
            1 => Tier::DecodeBatch,
            3 => Tier::HugeCache,
            4 | 7 => Tier::BigStep,
            _ => Tier::BigBatch,
        }
    }
}

/// ALiBi slopes as models define them: a geometric sequence `2^(-8 (h + 1) / H)`.
pub fn alibi_slopes(num_heads: usize) -> Vec<f32> {
    (0..num_heads)
        .map(|h| 2f32.powf(-8.0 * (h as f32 + 1.0) / num_heads as f32))
        .collect()
}

impl CaseRecipe {
    /// One decode token over a short context, f32, one head of size 2, blocks of 2: no
    /// feature, no padding, sequential blocks, small-integer values. Other recipes are this
    /// with fields set (`CaseRecipe { .., ..CaseRecipe::plain() }`), so a new field needs no
    /// edit where recipes are written out.
    pub fn plain() -> CaseRecipe {
        CaseRecipe {
            num_kv_heads: 1,
            group: 1,
            head_size: 2,
            block_size: 2,
            dtype: DType::F32,
            kind: AttentionKind::Decoder,
            seqs: vec![(3, 1)],
            window: None,
            soft_cap: None,
            alibi: false,
            sinks: false,
            padding_tokens: 0,
            spare_blocks: 0,
            table: TableOrder::Sequential,
            values: Values::Simple(1),
            share: None,
            scale: None,
            cache_blocks: None,
            kv_cache: None,
            poison: None,
            padded_requests: 0,
            logits: None,
            mla: None,
            chunk: None,
            lookback: None,
            non_causal: None,
            prefix_lm: None,
            rswa: None,
        }
    }

    pub fn num_heads(&self) -> usize {
        self.num_kv_heads * self.group
    }

    pub fn config(&self) -> AttentionConfig {
        let h = self.num_heads();
        let mut c = AttentionConfig::new(
            h,
            self.num_kv_heads,
            self.head_size,
            self.block_size,
            self.dtype,
        );
        c.kind = self.kind;
        c.scale = self.scale;
        c.sliding_window = self.window;
        c.attention_chunk_size = self.chunk;
        c.chunk_lookback = self.lookback.filter(|&k| k > 0 && self.chunk.is_some());
        c.logits_soft_cap = self.soft_cap;
        c.kv_cache = self.kv_cache;
        if let Some(m) = self.mla {
            // V stays a prefix of a latent entry shrunk below it.
            c.mla = Some(attn_reference::Mla {
                head_size_v: m.head_size_v(self.head_size),
            });
            c.scale = Some(m.scale);
            return c;
        }
        if self.alibi {
            c.alibi_slopes = Some(alibi_slopes(h));
        }
        if self.sinks {
            // Sinks around the typical logit, so they matter without swamping the keys.
            let mut rng = InputRng::new(0x51c5);
            c.sinks = Some(
                (0..h)
                    .map(|_| self.dtype.round((rng.normal() * 1.5) as f32))
                    .collect(),
            );
        }
        c
    }

    /// This recipe with the optional feature `f` turned off (a shrinking step); None when the
    /// recipe does not use it.
    pub fn without(&self, f: Feature) -> Option<CaseRecipe> {
        let mut c = self.clone();
        let used = match f {
            Feature::PaddedRequests => {
                c.padded_requests = 0;
                self.padded() > 0
            }
            Feature::NonCausal => {
                c.non_causal = None;
                self.causal_flags().is_some()
            }
            Feature::PrefixLm => {
                c.prefix_lm = None;
                self.batch_shape().has_prefix_lm()
            }
            Feature::Rswa => {
                c.rswa = None;
                self.rswa_of(&self.lens().0).is_some()
            }
            Feature::Mla => match c.mla.take() {
                // Ordinary attention with the model's scale: `AttentionConfig`'s turn_off.
                Some(m) => {
                    c.scale = Some(m.scale);
                    true
                }
                None => false,
            },
            // Every feature that is a value of the config: off as the config turns it off.
            _ => {
                let mut config = self.config();
                let used = f.turn_off(&mut config);
                c.take_features_of(&config);
                used
            }
        };
        used.then_some(c)
    }

    /// The config's kind and optional features, as this recipe holds them (an MLA recipe
    /// keeps its latent, which the config has no more of).
    fn take_features_of(&mut self, c: &AttentionConfig) {
        self.kind = c.kind;
        self.window = c.sliding_window;
        self.chunk = c.attention_chunk_size;
        self.lookback = c.chunk_lookback;
        self.soft_cap = c.logits_soft_cap;
        self.alibi = c.alibi_slopes.is_some();
        self.sinks = c.sinks.is_some();
        self.kv_cache = c.kv_cache;
    }

    /// This recipe without the optional features its kind gives no meaning to
    /// ([`Feature::allows_kind`]): a window or ALiBi in cross-attention, local chunks outside
    /// a decoder.
    pub fn without_kind_mismatches(mut self) -> CaseRecipe {
        let c = self.config();
        for f in Feature::OPTIONAL {
            if f.used_by(&c) && !f.allows_kind(self.kind) {
                if let Some(r) = self.without(f) {
                    self = r;
                }
            }
        }
        self
    }

    /// The sharing group actually applied: at least two sequences, decoder only.
    pub fn sharing(&self) -> Option<SharedPrefix> {
        let share = self.share?;
        let n = share.group.min(self.seqs.len());
        (self.kind == AttentionKind::Decoder && n >= 2 && share.blocks >= 1).then(|| SharedPrefix {
            seqs: (0..n).collect(),
            blocks: share.blocks,
        })
    }

    /// Whether the case uses optional feature `f` (of its config or of its batch).
    pub fn uses(&self, f: Feature) -> bool {
        f.used_by(&self.config()) || f.used_by_batch(&self.batch_shape())
    }

    /// Per sequence, whether it is causal; None when every request is (a non-decoder kind,
    /// or no real sequence's bit set).
    pub fn causal_flags(&self) -> Option<Vec<bool>> {
        let bits = self
            .non_causal
            .filter(|_| self.kind == AttentionKind::Decoder)?;
        let real = self.seqs.len();
        let flags: Vec<bool> = (0..real + self.padded())
            .map(|s| s >= real.min(64) || bits >> s & 1 == 0)
            .collect();
        flags.contains(&false).then_some(flags)
    }

    /// The batch's PrefixLM ranges at lengths `seq_lens`; None when no sequence has one (or
    /// not a decoder).
    pub fn prefix_lm_of(&self, seq_lens: &[usize]) -> Option<attn_reference::PrefixLm> {
        let r = self
            .prefix_lm
            .as_ref()
            .filter(|_| self.kind == AttentionKind::Decoder && self.mla.is_none())?;
        let ranges: Vec<Vec<(usize, usize)>> = seq_lens
            .iter()
            .enumerate()
            .map(|(s, &len)| r.ranges(s, len))
            .collect();
        ranges
            .iter()
            .any(|r| !r.is_empty())
            .then_some(attn_reference::PrefixLm {
                ranges,
                clamp_to_window: r.clamp,
            })
    }

    /// The batch's R-SWA at lengths `seq_lens` (decoder only, and never beside a window or
    /// PrefixLM ranges: validation refuses those).
    pub fn rswa_of(&self, seq_lens: &[usize]) -> Option<attn_reference::Rswa> {
        let r = self.rswa.filter(|_| {
            self.kind == AttentionKind::Decoder
                && self.mla.is_none()
                && self.window.is_none()
                && self.prefix_lm_of(seq_lens).is_none()
        })?;
        Some(attn_reference::Rswa {
            window: r.window.max(1),
            prefix_lens: seq_lens
                .iter()
                .enumerate()
                .map(|(s, &len)| r.prefix_len(s, len))
                .collect(),
        })
    }

    /// The batch's shape without its data.
    pub fn batch_shape(&self) -> attn_reference::Batch {
        let (seq_lens, query_lens) = self.lens();
        attn_reference::Batch {
            prefix_lm: self.prefix_lm_of(&seq_lens),
            rswa: self.rswa_of(&seq_lens),
            seq_lens,
            query_lens,
            num_padding_tokens: self.padding_tokens,
            causal: self.causal_flags(),
        }
    }

    /// The padded requests the batch really has (decoder steps only).
    pub fn padded(&self) -> usize {
        if self.kind == AttentionKind::Decoder {
            self.padded_requests
        } else {
            0
        }
    }

    /// (seq_lens, query_lens) as the batch sees them, padded requests last.
    pub fn lens(&self) -> (Vec<usize>, Vec<usize>) {
        let shared = self.sharing();
        self.seqs
            .iter()
            .enumerate()
            .map(|(s, &(ctx, q))| match self.kind {
                AttentionKind::Decoder => {
                    let min_ctx = shared
                        .as_ref()
                        .filter(|g| g.seqs.contains(&s))
                        .map_or(0, |g| g.blocks * self.block_size);
                    let ctx = ctx.max(min_ctx);
                    (ctx + q, q)
                }
                AttentionKind::EncoderOnly => (q, q),
                AttentionKind::EncoderDecoder => (ctx.max(1), q),
            })
            .chain(std::iter::repeat_n((0, 0), self.padded()))
            .unzip()
    }

    /// The full case, deterministically.
    pub fn build(&self) -> Case {
        let (seq_lens, query_lens) = self.lens();
        let (seed, std) = match self.values {
            Values::Simple(seed) => (seed, 1.0),
            Values::Normal { seed, std } => (seed, std as f64),
        };
        let opts = BuildOptions {
            permute_blocks: false,
            spare_blocks: self.spare_blocks,
            padding_tokens: self.padding_tokens,
            std,
            shared_prefixes: self.sharing().into_iter().collect(),
        };
        let mut case = build_case(&seq_lens, &query_lens, self.config(), seed, &opts);
        case.batch.causal = self.causal_flags();
        case.batch.prefix_lm = self.prefix_lm_of(&seq_lens);
        case.batch.rswa = self.rswa_of(&seq_lens);
        case.poison = self.poison;
        if let Values::Simple(seed) = self.values {
            simplify_values(&mut case, seed, self.sharing().as_ref());
        }
        if let Some(shift) = self.logits {
            shift.apply(&mut case);
        }
        self.lay_out_blocks(&mut case);
        if let Some(total) = self.cache_blocks {
            move_to_the_top(&mut case, total);
        }
        debug_assert_eq!(case.validate(), Ok(()), "{self:?}");
        case
    }

    fn lay_out_blocks(&self, case: &mut Case) {
        let bs = self.block_size;
        let blocks: Vec<usize> = case.batch.seq_lens.iter().map(|l| l.div_ceil(bs)).collect();
        let sharing = self.sharing();
        // Blocks of sharing members that reuse the leader's physical block get no id of their own.
        let reused = |s: usize, i: usize| {
            sharing
                .as_ref()
                .is_some_and(|g| s != g.seqs[0] && g.seqs.contains(&s) && i < g.blocks)
        };
        let num_blocks = case.layout.num_blocks;
        // Order in which (seq, logical block) pairs receive physical ids 1, 2, ...
        let mut order: Vec<(usize, usize)> = Vec::new();
        match self.table {
            TableOrder::Interleaved => {
                let most = blocks.iter().copied().max().unwrap_or(0);
                for i in 0..most {
                    for (s, &nb) in blocks.iter().enumerate() {
                        if i < nb {
                            order.push((s, i));
                        }
                    }
                }
            }
            _ => {
                for (s, &nb) in blocks.iter().enumerate() {
                    order.extend((0..nb).map(|i| (s, i)));
                }
            }
        }
        let physical: Vec<u32> = match self.table {
            TableOrder::Sequential | TableOrder::Interleaved => (1..num_blocks as u32).collect(),
            TableOrder::Reversed => (1..num_blocks as u32).rev().collect(),
            TableOrder::Permuted(seed) => InputRng::new(seed)
                .permutation(num_blocks - 1)
                .into_iter()
                .map(|b| b as u32 + 1)
                .collect(),
        };
        order.retain(|&(s, i)| !reused(s, i));
        for (n, &(s, i)) in order.iter().enumerate() {
            case.layout.block_table[s][i] = physical[n];
        }
        if let Some(g) = &sharing {
            for &m in &g.seqs[1..] {
                for i in 0..g.blocks {
                    case.layout.block_table[m][i] = case.layout.block_table[g.seqs[0]][i];
                }
            }
        }
        if case.config.kind == AttentionKind::EncoderDecoder {
            // A cross-attention step writes nothing: its slots stay -1.
            return;
        }
        let starts = case.query_start_loc();
        for (s, &start) in starts.iter().take(case.num_seqs()).enumerate() {
            let ctx = case.context_len(s);
            for j in 0..case.batch.query_lens[s] {
                case.layout.slot_mapping[start + j] = case.slot_of(s, ctx + j);
            }
        }
    }
}

/// Grow the cache to `total` blocks and move every block the case uses (all but the null
/// block) to its top, so block ids and element offsets are as large as the cache allows.
fn move_to_the_top(case: &mut Case, total: usize) {
    let n = case.layout.num_blocks;
    if total <= n {
        return;
    }
    let shift = (total - n) as u32;
    let bs = case.config.block_size as i64;
    for b in case.layout.block_table.iter_mut().flatten() {
        if *b != 0 {
            *b += shift;
        }
    }
    for s in case.layout.slot_mapping.iter_mut().filter(|s| **s >= bs) {
        *s += shift as i64 * bs;
    }
    case.layout.num_blocks = total;
}

/// Replace every tensor value with a small integer in [-2, 2] (exact in every dtype),
/// keeping shared prefix tokens identical.
fn simplify_values(case: &mut Case, seed: u64, sharing: Option<&SharedPrefix>) {
    let mut rng = InputRng::new(seed ^ 0x5151);
    let mut fill = |v: &mut Vec<f32>| v.iter_mut().for_each(|x| *x = rng.below(5) as f32 - 2.0);
    let t = &mut case.tensors;
    fill(&mut t.query);
    fill(&mut t.key);
    fill(&mut t.value);
    t.context_key.iter_mut().for_each(&mut fill);
    t.context_value.iter_mut().for_each(&mut fill);
    if let Some(g) = sharing {
        let per_block = g.blocks * case.config.block_size;
        let n = per_block * case.config.num_kv_heads * case.config.head_size;
        let n_v = per_block * case.config.value_row();
        let (k, v) = (
            t.context_key[g.seqs[0]][..n].to_vec(),
            t.context_value[g.seqs[0]][..n_v].to_vec(),
        );
        for &m in &g.seqs[1..] {
            t.context_key[m][..n].copy_from_slice(&k);
            t.context_value[m][..n_v].copy_from_slice(&v);
        }
    }
}

/// Head sizes models use.
pub const MODEL_HEAD_SIZES: [usize; 13] =
    [16, 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512, 576];

/// Head sizes at the edges of the vector widths (8, 16, 32, 64 floats): one below and one
/// above a multiple, and multiples of 8 that are not of 16, of 16 not of 32, of 32 not of 64.
pub fn vector_edge_head_sizes() -> Vec<usize> {
    let mut v: Vec<usize> = [8usize, 16, 32, 64, 128, 192, 256, 512, 576]
        .iter()
        .flat_map(|&w| [w - 1, w + 1])
        .chain([
            24, 40, 48, 72, 88, 96, 104, 120, 136, 160, 224, 288, 320, 544,
        ])
        .filter(|&d| d <= 576)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn head_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        5 => 1usize..=8,
        2 => prop::sample::select(MODEL_HEAD_SIZES.to_vec()),
        2 => prop::sample::select(vector_edge_head_sizes()),
        1 => 1usize..=576,
    ]
}

/// Block sizes: small ones (shrinking goes there), vLLM's, above 128 and not powers of two.
pub(crate) fn block_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => prop::sample::select(vec![1usize, 2, 3, 16, 32, 64]),
        1 => prop::sample::select(vec![5usize, 7, 24, 48, 96, 128, 129, 160, 255, 256]),
    ]
}

/// The default scale most of the time; otherwise scales as models set them: 256^-0.5 (a
/// query pre-attention scalar larger than the head size), 1, tiny and large.
fn scale() -> impl Strategy<Value = Option<f32>> {
    prop_oneof![
        6 => Just(None),
        1 => prop::sample::select(vec![0.0625f32, 1.0, 1e-3, 0.01, 2.0, 4.0]).prop_map(Some),
    ]
}

/// FP8 KV-cache scales: powers of two and 3/16, whose `fp8 * scale` is exact in every
/// compute dtype (at most 4 significant bits; see `Tolerance`), so the tolerance stays the
/// dtype's. 2^-8 saturates E4M3 from |x| > 1.75 on (as an underestimated calibration does);
/// 4 puts small values among the subnormal codes.
pub const FP8_SCALES: [f32; 6] = [0.00390625, 0.0625, 0.1875, 0.5, 1.0, 4.0];

fn kv_cache() -> impl Strategy<Value = Option<Fp8KvCache>> {
    prop::option::weighted(0.2, kv_cache_of_any_format())
}

/// An FP8 cache of either format with scales from [`FP8_SCALES`] ([`fp8_cache`]).
pub fn kv_cache_of_any_format() -> impl Strategy<Value = Fp8KvCache> {
    any::<u64>().prop_map(|seed| {
        let mut rng = InputRng::new(seed);
        fp8_cache(&mut |lo, hi| lo + rng.below((hi - lo + 1) as u64) as usize)
    })
}

/// The one draw of an FP8 cache, shared by every tier and by traces (each passes its own
/// `pick(lo, hi)`, inclusive): either format, scales from [`FP8_SCALES`], and in one of
/// three an FP8 query (its scale drawn last, so the rest is what it was without it).
pub fn fp8_cache(pick: &mut dyn FnMut(usize, usize) -> usize) -> Fp8KvCache {
    let last = FP8_SCALES.len() - 1;
    let format = Fp8Format::ALL[pick(0, Fp8Format::ALL.len() - 1)];
    let k_scale = FP8_SCALES[pick(0, last)];
    let v_scale = FP8_SCALES[pick(0, last)];
    let q_scale = (pick(0, 2) == 0).then(|| FP8_SCALES[pick(0, last)]);
    Fp8KvCache {
        q_scale,
        ..Fp8KvCache::new(format, k_scale, v_scale)
    }
}

/// A length just below, at or just above one of `thresholds` no larger than `max`.
fn near_threshold(max: usize) -> impl Strategy<Value = usize> {
    let near: Vec<usize> = attn_backends::all_thresholds()
        .iter()
        .copied()
        .filter(|&t| t <= max)
        .flat_map(|t| [t - 1, t, t + 1])
        .collect();
    prop::sample::select(near)
}

pub(crate) fn values() -> impl Strategy<Value = Values> {
    prop_oneof![
        1 => any::<u64>().prop_map(Values::Simple),
        6 => any::<u64>().prop_map(|seed| Values::Normal { seed, std: 1.0 }),
        2 => any::<u64>().prop_map(|seed| Values::Normal { seed, std: 12.0 }),
    ]
}

pub(crate) fn table_order() -> impl Strategy<Value = TableOrder> {
    prop_oneof![
        1 => Just(TableOrder::Sequential),
        1 => Just(TableOrder::Reversed),
        1 => Just(TableOrder::Interleaved),
        3 => any::<u64>().prop_map(TableOrder::Permuted),
    ]
}

fn kind() -> impl Strategy<Value = AttentionKind> {
    prop_oneof![
        8 => Just(AttentionKind::Decoder),
        2 => Just(AttentionKind::EncoderOnly),
        2 => Just(AttentionKind::EncoderDecoder),
    ]
}

/// Work of a recipe in multiply-adds of the oracle: every query against every key it may
/// see, for every head and dimension (windows ignored: an upper bound).
pub fn cost(r: &CaseRecipe) -> usize {
    let (seq_lens, query_lens) = r.lens();
    let pairs: usize = seq_lens.iter().zip(&query_lens).map(|(&l, &q)| l * q).sum();
    pairs * r.num_heads() * r.head_size
}

/// The small tier's cost ceiling: the default run stays within its time budget.
pub const SMALL_COST: usize = 20_000_000;
/// The long tier's: long contexts with few heads and small head sizes.
pub const LONG_COST: usize = 200_000_000;

/// Make `r` fit `budget` ([`cost`]) deterministically: fewer heads first, then a smaller head
/// size, then shorter queries, then shorter contexts, so the lengths (what the tier is
/// about) go last. Head sizes stay among those `space` allows.
pub fn fit_cost(mut r: CaseRecipe, budget: usize, space: &Space) -> CaseRecipe {
    let allowed = space.head_size_values();
    // The largest allowed head size at most `target` (the smallest allowed one if none is).
    let head_at_most = |target: usize| match &allowed {
        None => target,
        Some(a) => a
            .iter()
            .rev()
            .find(|&&d| d <= target)
            .or(a.first())
            .copied()
            .unwrap_or(target),
    };
    while cost(&r) > budget {
        if r.group > 1 {
            r.group = 1;
        } else if r.num_kv_heads > 1 {
            r.num_kv_heads = 1;
        } else if r.head_size > head_at_most(64) {
            r.head_size = head_at_most(64);
        } else if let Some(q) = r.seqs.iter_mut().filter(|s| s.1 > 8).max_by_key(|s| s.1) {
            q.1 = (q.1 / 2).max(8);
        } else if r.head_size > head_at_most(8) {
            r.head_size = head_at_most(8);
        } else if let Some(s) = r.seqs.iter_mut().filter(|s| s.0 > 0).max_by_key(|s| s.0) {
            s.0 /= 2;
        } else {
            break;
        }
    }
    r
}

/// `r` moved inside `space` ([`Space::fit_config`], [`Space::fit_lengths`]), then within
/// `budget`: what every strategy and every shrink candidate goes through, so a case drawn or
/// shrunk for a backend is one it declares it runs. The identity on the full space.
pub fn fit_space(mut r: CaseRecipe, space: &Space, budget: usize) -> CaseRecipe {
    if space.is_full() {
        return r;
    }
    let mut c = r.config();
    space.fit_config(&mut c);
    crate::strategy_mla::fit_latent(&mut r, &c);
    r.dtype = c.dtype;
    r.head_size = c.head_size;
    r.block_size = c.block_size;
    r.group = c.group_size();
    r.take_features_of(&c);
    // The fitted kind may give a feature no meaning (a window in cross-attention).
    let mut r = r.without_kind_mismatches();
    space.fit_lengths(r.kind, &mut r.seqs, &mut r.padding_tokens);
    // Padded requests count among the step's requests.
    if !space.allows_feature(Feature::PaddedRequests) {
        r.padded_requests = 0;
    }
    if !space.allows_feature(Feature::NonCausal) {
        r.non_causal = None;
    }
    if !space.allows_feature(Feature::PrefixLm) {
        r.prefix_lm = None;
    }
    if !space.allows_feature(Feature::Rswa) {
        r.rswa = None;
    }
    if let Some(m) = space.max_seqs {
        r.padded_requests = r.padded_requests.min(m.saturating_sub(r.seqs.len()));
    }
    // A shared prefix lengthens the contexts of its group: not past the longest allowed.
    if let Some(m) = space.max_seq_len {
        if r.lens().0.iter().any(|&l| l > m) {
            r.share = None;
        }
    }
    if r.mla.is_some() {
        // MLA recipes have their own cost model (K's and V's widths; heads kept longest).
        return crate::strategy_mla::fit_mla_cost(r, crate::strategy_mla::MLA_COST);
    }
    fit_cost(r, budget, space)
}

/// The cost ceiling of property case `index`'s tier.
pub fn budget_of(index: usize, limits: StrategyLimits) -> usize {
    match Tier::of(index, limits) {
        Tier::Small => match crate::pipeline::covering::covering_row(index, limits) {
            Some(_) => crate::pipeline::covering::COVERING_COST,
            None => SMALL_COST,
        },
        Tier::LongContext | Tier::DecodeBatch | Tier::HugeCache => LONG_COST,
        Tier::BigStep => crate::extremes::BIG_STEP_COST,
        Tier::BigBatch => crate::extremes::BIG_BATCH_COST,
        Tier::Precision => crate::pipeline::precision::PRECISION_COST,
    }
}

/// The strategy of property case `index` inside `space`: its [`Tier`]'s, each draw moved
/// inside the space ([`fit_space`]; shrinking maps through it too, so it never leaves).
/// Where the space has MLA, some indices draw MLA cases instead
/// ([`crate::strategy_mla::draws_mla`]); every other index draws what it always drew.
pub fn strategy_for(
    index: usize,
    limits: StrategyLimits,
    space: &Space,
) -> BoxedStrategy<CaseRecipe> {
    if crate::strategy_mla::draws_mla(index, limits, space) {
        return crate::strategy_mla::mla_strategy(index, limits, space);
    }
    if space.is_full() {
        return tier_strategy(index, limits);
    }
    let space = space.clone();
    let budget = budget_of(index, limits);
    tier_strategy(index, limits)
        .prop_map(move |r| fit_space(r, &space, budget))
        .boxed()
}

/// The strategy of property case `index` over the whole space.
fn tier_strategy(index: usize, limits: StrategyLimits) -> BoxedStrategy<CaseRecipe> {
    use crate::extremes::{big_batch, big_step, featured, long_features};
    let ordinal = index / limits.long_every.max(1);
    let budget = budget_of(index, limits);
    let with_features = |s: BoxedStrategy<CaseRecipe>, big: bool| {
        (s, long_features())
            .prop_map(move |(r, f)| featured(r, &f, ordinal, (big, budget)))
            .boxed()
    };
    match Tier::of(index, limits) {
        Tier::Small => match crate::pipeline::covering::covering_row(index, limits) {
            Some(row) => crate::pipeline::covering::covering_case(row, limits).boxed(),
            None => recipe(limits).boxed(),
        },
        Tier::LongContext => {
            // Past 16k keys, or between 4k and 16k.
            let min = if ordinal % 8 == 2 { 4_097 } else { 16_385 };
            with_features(
                long_context(min, limits.max_long_context.max(min)).boxed(),
                false,
            )
        }
        // A batch that carries masks is a large one (past 64 sequences), as the plan counts.
        Tier::DecodeBatch => match crate::extremes::flood_of(ordinal) {
            Some(flood) => flooded(with_features(big_batch(Some(flood)), false)),
            None => {
                let large = crate::pipeline::long_masks::mask_plan(ordinal) != Default::default();
                with_features(decode_batch(large).boxed(), false)
            }
        },
        Tier::HugeCache => huge_cache().boxed(),
        Tier::BigStep => with_features(big_step().boxed(), true),
        Tier::BigBatch => match crate::extremes::flood_of(ordinal) {
            Some(flood) => flooded(with_features(big_batch(Some(flood)), false)),
            None => with_features(big_batch(None), false),
        },
        Tier::Precision => {
            use crate::pipeline::precision::{precision_case, PRECISION_EVERY};
            precision_case(index / PRECISION_EVERY).boxed()
        }
    }
}

/// A flood (an all-decode step past 8,192 tokens) with one or two heads of at most 8: the
/// step's size is its point, and its thousands of requests are judged one by one. It has no
/// logit shift: a decode's one row shifted far below zero leaves all the weight to a sink
/// (every output row 0), and one shifted far above widens the tolerance toward the values
/// themselves, so a kernel that never writes a row would pass either way.
fn flooded(s: BoxedStrategy<CaseRecipe>) -> BoxedStrategy<CaseRecipe> {
    s.prop_map(|mut r| {
        r.num_kv_heads = 1;
        r.group = r.group.min(2);
        r.head_size = r.head_size.min(8);
        r.logits = None;
        r
    })
    .boxed()
}

/// The small tier: recipes within `limits`, lengths and sizes aimed at thresholds.
pub fn recipe(limits: StrategyLimits) -> impl Strategy<Value = CaseRecipe> {
    let heads = (
        1usize..=4,
        prop::sample::select(vec![1usize, 2, 3, 4, 6, 8]),
    );
    let shape = (
        head_size(),
        block_size(),
        prop::sample::select(DType::ALL.to_vec()),
        kind(),
    );
    let seq = (
        prop_oneof![
            6 => 0usize..=8,
            3 => 0usize..=limits.max_context,
            2 => near_threshold(limits.max_context.max(600)),
        ],
        prop_oneof![
            4 => 1usize..=2,
            2 => 2usize..=8,
            2 => 1usize..=limits.max_query,
            1 => near_threshold(64),
        ],
    );
    let seqs = prop::collection::vec(seq, 1..=limits.max_seqs);
    let longest = limits.max_context.max(600) + limits.max_query.max(65);
    let features = (
        prop::option::weighted(
            0.35,
            prop_oneof![2 => 1usize..=8, 1 => 1usize..=longest + 2, 1 => near_threshold(longest)],
        ),
        prop::option::weighted(0.2, prop::sample::select(vec![1.0f32, 5.0, 30.0, 50.0])),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        scale(),
    );
    let layout = layout(4);
    // Drawn last, so every field above draws what it drew before they existed.
    let extremes = (
        crate::extremes::batch_order(),
        prop::option::weighted(0.06, crate::extremes::big_heads()),
        prop::option::weighted(0.12, crate::extremes::logit_shift()),
    );
    // Local chunks: one key, a few, around a threshold, or up to the longest sequence.
    let chunk = prop::option::weighted(
        0.1,
        prop_oneof![2 => 1usize..=8, 1 => near_threshold(longest), 1 => 1usize..=longest + 2],
    );
    // Look-back (it means something only with chunks), then non-causal requests (one case
    // in eight: every request, or some of them), drawn after everything else.
    let lookback = prop::option::weighted(0.4, 1usize..=3);
    let non_causal =
        prop::option::weighted(0.12, prop_oneof![1 => Just(u64::MAX), 2 => 1u64..=u64::MAX]);
    // vLLM 0.33's PrefixLM ranges and R-SWA, drawn after everything else.
    let masks = (
        prop::option::weighted(0.12, prefix_lm_ranges()),
        prop::option::weighted(0.1, rswa(longest)),
    );
    (
        heads,
        shape,
        seqs,
        features,
        layout,
        values(),
        kv_cache(),
        (extremes, chunk, lookback, non_causal),
        masks,
    )
        .prop_map(
            |(
                (num_kv_heads, group),
                (head_size, block_size, dtype, kind),
                seqs,
                (window, soft_cap, alibi, sinks, scale),
                (padding_tokens, spare_blocks, table, share),
                values,
                kv_cache,
                (extremes, chunk, lookback, non_causal),
                (prefix_lm, rswa),
            )| {
                let r = CaseRecipe {
                    num_kv_heads,
                    group,
                    head_size,
                    block_size,
                    dtype,
                    kind,
                    seqs,
                    window,
                    chunk,
                    lookback: lookback.filter(|_| chunk.is_some()),
                    non_causal,
                    prefix_lm,
                    rswa,
                    soft_cap,
                    alibi,
                    sinks,
                    padding_tokens,
                    spare_blocks,
                    table,
                    values,
                    share,
                    scale,
                    kv_cache,
                    poison: poison_of(values),
                    padded_requests: padded_requests_of(values),
                    ..CaseRecipe::plain()
                }
                .without_kind_mismatches();
                let r = crate::extremes::small_extremes(r, extremes);
                fit_cost(r, SMALL_COST, &Space::default())
            },
        )
}

/// Padding tokens, spare blocks, table order, and prefix sharing among up to `max_share`
/// sequences (in one case in seven or so).
pub(crate) fn layout(
    max_share: usize,
) -> impl Strategy<Value = (usize, usize, TableOrder, Option<Share>)> {
    (
        prop_oneof![4 => Just(0usize), 1 => 1usize..=4],
        prop_oneof![1 => Just(0usize), 1 => 1usize..=6],
        table_order(),
        prop::option::weighted(
            0.15,
            (2usize..=max_share, 1usize..=3).prop_map(|(group, blocks)| Share { group, blocks }),
        ),
    )
}

/// A plain decoder recipe of the long tier: few heads, small head sizes, normal values.
pub(crate) fn long_base(
    (num_kv_heads, group, head_size, block_size, dtype): (usize, usize, usize, usize, DType),
    seqs: Vec<(usize, usize)>,
    seed: u64,
) -> CaseRecipe {
    CaseRecipe {
        num_kv_heads,
        group,
        head_size,
        block_size,
        dtype,
        seqs,
        table: TableOrder::Permuted(seed),
        values: Values::Normal { seed, std: 1.0 },
        poison: poison_of(Values::Normal { seed, std: 1.0 }),
        padded_requests: padded_requests_of(Values::Normal { seed, std: 1.0 }),
        ..CaseRecipe::plain()
    }
}

pub(crate) fn long_shape() -> impl Strategy<Value = (usize, usize, usize, usize, DType)> {
    (
        1usize..=2,
        1usize..=2,
        prop::sample::select(vec![8usize, 16, 64]),
        prop::sample::select(vec![16usize, 32, 128, 256]),
        prop::sample::select(DType::ALL.to_vec()),
    )
}

/// Contexts of `min..=max` keys (often just around a power of two), decode or a speculative
/// or chunked-prefill query, sometimes a window.
pub fn long_context(min: usize, max: usize) -> impl Strategy<Value = CaseRecipe> {
    let near: Vec<usize> = (12..=17)
        .map(|p| 1usize << p)
        .filter(|&t| t > min && t < max)
        .flat_map(|t| [t - 1, t, t + 1])
        .chain([min])
        .collect();
    let context = prop_oneof![1 => prop::sample::select(near), 1 => min..=max];
    let query = prop_oneof![3 => 1usize..=8, 1 => 9usize..=2048];
    let seqs = prop::collection::vec((context, query), 1..=2);
    let window = prop::option::weighted(
        0.3,
        prop::sample::select(vec![1usize, 257, 513, 2048, 4096]),
    );
    (long_shape(), seqs, window, any::<u64>()).prop_map(|(shape, seqs, window, seed)| {
        let mut r = long_base(shape, seqs, seed);
        r.window = window;
        fit_cost(r, LONG_COST, &Space::default())
    })
}

/// Decode batches of 16 to 256 sequences (half of them past 64; all of them when `large`).
pub fn decode_batch(large: bool) -> impl Strategy<Value = CaseRecipe> {
    let context = || prop_oneof![2 => 0usize..=64, 1 => near_threshold(600)];
    let seqs = if large {
        prop::collection::vec((context(), Just(1usize)), 65..=256).boxed()
    } else {
        prop_oneof![
            prop::collection::vec((context(), Just(1usize)), 16..=64),
            prop::collection::vec((context(), Just(1usize)), 65..=256),
        ]
        .boxed()
    };
    (long_shape(), seqs, any::<u64>()).prop_map(|(shape, seqs, seed)| {
        let mut r = long_base(shape, seqs, seed);
        r.padded_requests = padded_requests_in_batches(r.values);
        fit_cost(r, LONG_COST, &Space::default())
    })
}

/// The blocks of a few short sequences at the top of a cache of 140,000 blocks of 16 tokens,
/// 8 kv heads of 128: element offsets past 2^31 (2.3·10^9 elements), as in a large model's
/// layer; backends must allocate lazily or decline (`Feature::CacheSize`).
pub fn huge_cache() -> impl Strategy<Value = CaseRecipe> {
    let seqs = prop::collection::vec((0usize..=300, 1usize..=8), 1..=2);
    (
        seqs,
        prop::sample::select(DType::ALL.to_vec()),
        any::<u64>(),
    )
        .prop_map(|(seqs, dtype, seed)| {
            let mut r = long_base((8, 1, 128, 16, dtype), seqs, seed);
            r.cache_blocks = Some(HUGE_CACHE_BLOCKS);
            r
        })
}

/// Blocks of the huge-cache tier: 140,000 × 16 slots × 8 × 128 = 2.3·10^9 elements.
pub const HUGE_CACHE_BLOCKS: usize = 140_000;

/// PrefixLM ranges: one to three, for every request or some, clamped to the window in one
/// case in three (Gemma 4).
pub fn prefix_lm_ranges() -> impl Strategy<Value = RangesRecipe> {
    (
        prop::collection::vec(0u16..=1000, 2..=6),
        prop_oneof![1 => Just(u64::MAX), 2 => 1u64..=u64::MAX],
        prop::bool::weighted(0.33),
    )
        .prop_map(|(mut points, seqs, clamp)| {
            points.sort_unstable();
            RangesRecipe {
                spans: points.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
                seqs,
                clamp,
            }
        })
}

/// R-SWA: a window of a few keys or up to the longest sequence, and any prefix.
pub fn rswa(longest: usize) -> impl Strategy<Value = RswaRecipe> {
    (
        prop_oneof![2 => 1usize..=8, 1 => 1usize..=longest + 2],
        0u16..=1000,
    )
        .prop_map(|(window, prefix)| RswaRecipe { window, prefix })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    proptest! {
        #[test]
        fn every_recipe_builds_a_valid_case(r in recipe(StrategyLimits::DEFAULT)) {
            let case = r.build();
            prop_assert_eq!(case.validate(), Ok(()));
            prop_assert_eq!(case.num_seqs(), r.seqs.len() + r.padded());
        }
    }

    #[test]
    fn table_orders_place_blocks_as_named() {
        let mut r = CaseRecipe {
            seqs: vec![(3, 1), (3, 1)],
            ..CaseRecipe::plain()
        };
        assert_eq!(r.build().layout.block_table, vec![vec![1, 2], vec![3, 4]]);
        r.table = TableOrder::Reversed;
        assert_eq!(r.build().layout.block_table, vec![vec![4, 3], vec![2, 1]]);
        r.table = TableOrder::Interleaved;
        assert_eq!(r.build().layout.block_table, vec![vec![1, 3], vec![2, 4]]);
        r.table = TableOrder::Sequential;
        r.share = Some(Share {
            group: 2,
            blocks: 1,
        });
        assert_eq!(r.build().layout.block_table, vec![vec![1, 2], vec![1, 3]]);
    }

    #[test]
    fn generation_covers_every_feature() {
        let mut runner = TestRunner::deterministic();
        let s = recipe(StrategyLimits::DEFAULT);
        let rs: Vec<CaseRecipe> = (0..400)
            .map(|_| s.new_tree(&mut runner).unwrap().current())
            .collect();
        assert!(rs.iter().any(|r| r.kind == AttentionKind::EncoderOnly));
        assert!(rs
            .iter()
            .any(|r| r.kind == AttentionKind::EncoderDecoder && r.seqs.iter().any(|s| s.1 > s.0)));
        assert!(rs.iter().any(|r| r.window == Some(1)));
        for f in Fp8Format::ALL {
            assert!(rs.iter().any(|r| r.kv_cache.is_some_and(|c| c.dtype == f)));
        }
        // Turning a feature off in the recipe turns it off in the case, and only that one.
        for r in &rs {
            for f in Feature::OPTIONAL {
                let used = r.uses(f);
                match r.without(f) {
                    Some(off) => {
                        assert!(used, "{f}");
                        assert!(!off.uses(f), "{f}");
                        let mut expected = r.config();
                        f.turn_off(&mut expected);
                        assert_eq!(off.config(), expected, "{f}");
                    }
                    None => assert!(!used, "{f}"),
                }
            }
        }
        assert!(
            rs.iter()
                .any(|r| r.soft_cap.is_some() && r.alibi && r.sinks)
                || (rs.iter().any(|r| r.alibi) && rs.iter().any(|r| r.sinks))
        );
        assert!(rs.iter().any(|r| r.padding_tokens > 0));
        assert!(rs.iter().any(|r| r.padded() > 0));
        assert!(rs.iter().any(|r| crate::check::shares_blocks(&r.build())));
        assert!(rs.iter().any(|r| r.group == 3 && r.num_kv_heads == 3));
        assert!(rs.iter().any(|r| r.head_size == 128));
        assert!(rs.iter().any(|r| matches!(r.values, Values::Simple(_))));
        for dt in DType::ALL {
            assert!(rs.iter().any(|r| r.dtype == dt));
        }
    }
}
