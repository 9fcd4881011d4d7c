//! What a property case is before it is built: a [`CaseRecipe`] is a small description of a
//! case (shapes, features, table order, how values are made) that draws generate and shrinking
//! simplifies; [`CaseRecipe::build`] (in `build.rs`) turns it into a full, valid [`Case`].
//!
//! Shrinking moves toward fewer and shorter sequences, one kv head, group 1, tiny head and
//! block sizes, features off, no padding, sequential tables and small-integer values, so a
//! minimal failing case reads like a hand-written one.

mod build;
mod features;

use attn_reference::{AttentionKind, Case, DType, Feature, Fp8KvCache, Poison, SharedPrefix};
use serde::{Deserialize, Serialize};

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
    /// drawn by [`crate::pipeline::draw::mla`]. None: ordinary attention.
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

/// Every q·k of a query row shifted by the same amount (`dot`, before the softmax scale): one
/// dimension of every key is set to a power of two `b`, the same dimension of every query to
/// `±dot / b`. A row's softmax is unchanged in exact arithmetic, its logits are not: kernels
/// that start the online max at a finite sentinel (-5e4), hold q·k in f16 or reuse one row's
/// max for a query tile go wrong.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogitShift {
    /// The unscaled shift of a row's q·k (negative: every logit far below zero).
    pub dot: f32,
    /// Alternate the rows of each sequence between `+dot` and `-dot`: row maxima of one
    /// query chunk differ by `2 · scale · dot`.
    pub alternate: bool,
    /// Each row's shift instead `dot` times a weight of 1, ⅓, −⅓ or −1 picked by a hash of
    /// its index in the sequence: rows far apart in one long query chunk (64 rows, a tile's
    /// half) differ as often as neighbours, by up to `2 · scale · dot`.
    #[serde(default)]
    pub scattered: bool,
}

/// The weight of row `j` of a scattered shift.
fn scattered_weight(j: usize) -> f64 {
    let h = (j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61;
    [1.0, 1.0 / 3.0, -1.0 / 3.0, -1.0][(h % 4) as usize]
}

/// The largest scaled shift: past it the tolerance's conditioning term (f32 logits carry an
/// error of `eps · |logit|`) grows toward max|v| and the case could not judge a kernel.
const MAX_SCALED_SHIFT: f64 = 2e5;

impl LogitShift {
    pub fn apply(&self, case: &mut Case) {
        let c = &case.config;
        let (hq, d) = (c.num_heads, c.head_size);
        let scale = c.effective_scale();
        let dtype = c.dtype;
        let dot = (self.dot as f64).clamp(-MAX_SCALED_SHIFT / scale, MAX_SCALED_SHIFT / scale);
        if dot == 0.0 || d == 0 {
            return;
        }
        // b = 2^round(log2 sqrt|dot|): exact in every dtype, and q = dot / b stays in range.
        let b = 2f64.powi((dot.abs().sqrt().log2().round() as i32).min(15));
        let starts = case.query_start_loc();
        let num_seqs = case.num_seqs();
        let t = &mut case.tensors;
        let key_rows = t
            .key
            .chunks_mut(d)
            .chain(t.context_key.iter_mut().flat_map(|k| k.chunks_mut(d)));
        for row in key_rows {
            row[0] = b as f32;
        }
        for w in starts.windows(2).take(num_seqs) {
            for (j, token) in (w[0]..w[1]).enumerate() {
                let sign = if self.scattered {
                    scattered_weight(j)
                } else if self.alternate && j % 2 == 1 {
                    -1.0
                } else {
                    1.0
                };
                let qv = dtype.round((sign * dot / b) as f32);
                for h in 0..hq {
                    t.query[(token * hq + h) * d] = qv;
                }
            }
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
            Feature::EncoderOnly
            | Feature::CrossAttention
            | Feature::SlidingWindow
            | Feature::LogitsSoftCap
            | Feature::Alibi
            | Feature::Sinks
            | Feature::Fp8KvCache
            | Feature::ChunkedLocalAttention
            | Feature::ChunkLookback
            | Feature::Fp8Query
            | Feature::KvHeadScales
            | Feature::KvTokenScales => {
                let mut config = self.config();
                let used = f.turn_off(&mut config);
                c.take_features_of(&config);
                used
            }
        };
        used.then_some(c)
    }

    /// This recipe without the optional features its kind gives no meaning to
    /// ([`Feature::allows_kind`]): a window or ALiBi in cross-attention, local chunks outside
    /// a decoder.
    pub fn without_kind_mismatches(mut self) -> CaseRecipe {
        let c = self.config();
        for f in Feature::ALL {
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
}

/// Work of a recipe in multiply-adds of the oracle: every query against every key it may
/// see, for every head and dimension (windows ignored: an upper bound).
pub fn cost(r: &CaseRecipe) -> usize {
    let (seq_lens, query_lens) = r.lens();
    let pairs: usize = seq_lens.iter().zip(&query_lens).map(|(&l, &q)| l * q).sum();
    pairs * r.num_heads() * r.head_size
}

/// Work of an MLA recipe: every query against every key it may see, for every head, over
/// K's and V's widths.
pub fn mla_cost(r: &CaseRecipe) -> usize {
    let (seq_lens, query_lens) = r.lens();
    let pairs: usize = seq_lens.iter().zip(&query_lens).map(|(&l, &q)| l * q).sum();
    let dv = r.mla.map_or(r.head_size, |m| m.head_size_v(r.head_size));
    pairs * r.num_heads() * (r.head_size + dv)
}

/// Whether a case's block tables share a physical block between live positions.
pub fn shares_blocks(case: &Case) -> bool {
    let bs = case.config.block_size;
    let mut seen = std::collections::HashSet::new();
    (0..case.num_seqs()).any(|s| {
        (0..case.batch.seq_lens[s].div_ceil(bs))
            .any(|i| !seen.insert(case.layout.block_table[s][i]))
    })
}
