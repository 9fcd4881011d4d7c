//! A small scalar paged-attention kernel with one bug switched on: the shape of `cpu`'s
//! split-KV path (two KV splits, each an online softmax, merged by log-sum-exp), written
//! plainly so each bug is a one-line change a reader can find by its `Bug` variant.

use crate::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_reference::oracle::Visibility;
use attn_reference::{
    AttentionConfig, AttentionKind, Feature, Fp8Format, Fp8KvCache, KvPart, KvScales,
};
use std::borrow::Cow;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The correct kernel (the control).
    None,
    DecoderWindowEncoderConvention,
    SlotBlockBoundary,
    CausalOffsetQueryLen,
    SoftmaxNoMax,
    SinkInNumerator,
    SoftCapAfterAlibi,
    PaddingRowNan,
    MaxQueryLenFromCounts,
    LowPrecisionAccumulation,
    /// q·k rounded to the dtype before the scale (a half-precision score matmul).
    ScoresInDtype,
    /// The query scaled and rounded to the dtype before q·k, the score rounded too.
    ScaledQueryInDtype,
    /// A shared-prefix (cascade) path for a crowd (8 or more sequences behind one prefix of
    /// 256 tokens or more): the prefix's and the suffix's partial softmaxes merged without
    /// rescaling the suffix's by exp(m_suffix - m).
    CascadeMergeNoRescale,
    /// A decode path over 3 pages or more that walks each page in 64-key tiles, their count
    /// floored (block size / 64): every page's tail past its last whole tile is never read.
    PageTilesFloored,
    /// A decode path that packs query heads in tiles of 16 and reads every head of a tile
    /// with the kv head of the tile's first: past a group of 16 not a multiple of 16, a tile
    /// crossing a group boundary reads the neighbouring kv head.
    HeadTileCrossesGroup,
    /// Eager attention in the dtype: scores and their scale rounded, the probabilities
    /// normalised and rounded, P·V rounded once.
    EveryOpInDtype,
    SplitMergeDropsRescale,
    LastPartialBlockIgnored,
    SharedBlockGatheredOnce,
    LocalChunkByWholeBlocks,
    LookbackInBlocks,
    CausalFlagOfFirstRequest,
    NonCausalWindowOneSided,
    PrefixLmRangeEndExclusive,
    PrefixLmRangesOfFirstRequest,
    PrefixLmClampIgnored,
    RswaPrefixFromStepStart,
    // Public bugs (see the catalogue in `mutants/mod.rs` for the issue each reproduces).
    WindowOneShort,
    WindowByWholeBlocks,
    DecodeIgnoresWindow,
    WindowIgnoredWithGqa,
    UnhitTableRowsZeroed,
    SoftCapTanhOverflow,
    PvSkippedBelow64,
    CustomScaleIgnored,
    ScaleForgotten,
    Int32WriteOffset,
    Int32ReadOffset,
    PageOffsetPast128,
    // Thresholds.
    PartitionMergeNoRescale,
    SimdTailDropped,
    // FP8 KV caches.
    Fp8ScaleTwice,
    Fp8ScaleMissing,
    Fp8ReadAsFnuz,
    Fp8NoSaturation,
    Fp8PerHeadScale,
    KvHead0ScaleEverywhere,
    TokenScaleOfHead0,
    // Cross-attention.
    CrossCausal,
    CrossDecoderLength,
    CrossCacheRewritten,
    // Extremes: logits in the tens of thousands, big groups, big steps, batch order, pairs.
    FiniteMaxSentinel,
    TileSharesRowMax,
    QkOverflowsF16,
    BlockQZeroAbove16,
    TokensPast8192Skipped,
    DecodeGridPast8192,
    AlibiDroppedInDecodeBatches,
    AlibiPositionsInBf16,
    AlibiPositionsInF16,
    FirstPrefillAsDecode,
    SinkTwiceSplitKv,
    // Skipped blocks.
    WindowMaskedAfterLoad,
    HalfTileRowMax,
    // A corner of four shape factors.
    WideDecodeChunkReread,
}

/// The online max's starting value of kernels that use a finite stand-in for -inf.
const FINITE_MAX_SENTINEL: f32 = -5e4;
/// Query rows of one sequence that share a tile (and, with the tile bug, its first row's max).
const QUERY_TILE: usize = 16;
/// Query rows of the wide tile whose second half reads the first half's maxima.
const WIDE_TILE: usize = 128;
/// Rows a launch grid sized for 8,192 tokens reaches.
const GRID_TOKENS: usize = 8192;
/// Most tokens of one request in a speculative decode (1 + the drafts).
const SPEC_DECODE_TOKENS: usize = 8;
/// Keys per KV split of a split-KV kernel.
const SPLIT_KEYS: usize = 256;

/// An element offset computed in int32, as the buggy kernels do: past 2^31 it wraps, and the
/// access lands elsewhere in the buffer (in C it lands outside it; here it stays inside so
/// the divergence is a wrong value rather than a crash).
fn int32_offset(offset: usize, len: usize) -> usize {
    (offset as i32 as i64).rem_euclid(len.max(1) as i64) as usize
}

/// tanh as `(e^{2x} - 1) / (e^{2x} + 1)` in f32: inf / inf = NaN once 2x passes ln(f32::MAX).
fn tanh_by_exp(x: f32) -> f32 {
    let e = (2.0 * x).exp();
    (e - 1.0) / (e + 1.0)
}

pub struct PlainBackend {
    name: String,
    bug: Bug,
}

impl PlainBackend {
    pub fn new(name: &str, bug: Bug) -> Self {
        PlainBackend {
            name: name.to_string(),
            bug,
        }
    }
}

/// E4M3FNUZ (AMD's format: bias 8, no negative zero, NaN at 0x80): what an E4M3FN code reads
/// as when decoded in it.
fn decode_fnuz(code: u8) -> f64 {
    match code {
        0x80 => f64::NAN,
        0x7f => 240.0,
        0xff => -240.0,
        c => Fp8Format::E4m3.decode(c) / 2.0,
    }
}

/// A conversion without saturation: past the largest finite value plus half a step, E4M3FN
/// (no infinity) gives NaN and E5M2 an infinity.
fn encode_unsaturated(f: Fp8Format, q: f32) -> u8 {
    let (limit, overflow) = match f {
        Fp8Format::E4m3 => (464.0, 0x7f),
        Fp8Format::E5m2 => (61440.0, 0x7c),
    };
    if (q.abs() as f64) < limit {
        f.encode(q as f64)
    } else if f == Fp8Format::E5m2 && q < 0.0 {
        0xfc
    } else {
        overflow
    }
}

impl PlainBackend {
    /// What the kernel reads for `x` of kv head `kv_head` in an FP8 cache with `scale` (K's
    /// or V's, of that element's row) and `read_scale` (what the read multiplies by: `scale`
    /// but in the scale-indexing bugs): the write (quantize) and the read (decode, scale)
    /// together, with this mutant's FP8 bug. The cache keeps this read-back value, so each
    /// slot reads as written.
    fn fp8_read_back(
        &self,
        f: &Fp8KvCache,
        x: f32,
        scale: f32,
        read_scale: f32,
        kv_head: usize,
    ) -> f32 {
        let scaled = f.scaled_for_write(x, scale);
        let code = if self.bug == Bug::Fp8NoSaturation {
            encode_unsaturated(f.dtype, scaled)
        } else {
            f.dtype.encode(scaled as f64)
        };
        let raw = if self.bug == Bug::Fp8ReadAsFnuz && f.dtype == Fp8Format::E4m3 {
            decode_fnuz(code)
        } else {
            f.dtype.decode(code)
        };
        let read_scale = match self.bug {
            Bug::Fp8ScaleTwice => scale * scale,
            Bug::Fp8ScaleMissing => 1.0,
            // A per-head scale array indexed with a per-tensor scale: past head 0 it reads 1.
            Bug::Fp8PerHeadScale if kv_head > 0 => 1.0,
            _ => read_scale,
        };
        (raw * read_scale as f64) as f32
    }
}

impl PlainBackend {
    /// What the read multiplies each head's row by: the scale it was written with, or in the
    /// two scale-indexing bugs kv head 0's (an index that lost its head stride).
    fn read_scales(&self, f: &Fp8KvCache, written: &[f32]) -> Vec<f32> {
        let head_0 = matches!(
            (self.bug, &f.scales),
            (Bug::KvHead0ScaleEverywhere, KvScales::Head { .. })
                | (Bug::TokenScaleOfHead0, KvScales::Token)
        );
        match written.first() {
            Some(&first) if head_0 => vec![first; written.len()],
            _ => written.to_vec(),
        }
    }
}

/// K and V per slot: `[num_slots, num_kv_heads, head_size]` each (in an FP8 cache, the values
/// the kernel reads back).
struct SlotCache {
    k: Vec<f32>,
    v: Vec<f32>,
    /// K and V rows of the last write (the step's own, in a cross-attention case), for the
    /// bug that writes them into the cross cache.
    last_write: (Vec<f32>, Vec<f32>),
}

/// Running softmax state of one split.
#[derive(Clone)]
struct Partial {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

impl Backend for PlainBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn role(&self) -> attn_results::BackendRole {
        attn_results::BackendRole::Mutant
    }

    fn supports(&self, _: &AttentionConfig) -> Result<(), Unsupported> {
        Ok(())
    }

    fn optional_features(&self) -> Vec<Feature> {
        let mut f = Feature::ESTABLISHED.to_vec();
        f.extend([
            Feature::Fp8KvCache,
            Feature::KvHeadScales,
            Feature::KvTokenScales,
            Feature::CrossAttention,
            Feature::PaddedRequests,
            Feature::ChunkedLocalAttention,
            Feature::ChunkLookback,
            Feature::NonCausal,
            Feature::PrefixLm,
            Feature::Rswa,
        ]);
        f
    }

    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            shape: "[num_blocks * block_size, num_kv_heads, head_size] for K and for V",
            description: "one row per slot, the simplest paged layout",
        }
    }

    fn new_cache(&self, c: &AttentionConfig, num_blocks: usize) -> Result<KvCache, BackendError> {
        let n = num_blocks * c.block_size * c.num_kv_heads * c.head_size;
        Ok(Box::new(SlotCache {
            k: vec![0.0; n],
            v: vec![0.0; n],
            last_write: (Vec::new(), Vec::new()),
        }))
    }

    fn write_kv(
        &self,
        c: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let cache = cache_as_mut::<SlotCache>(&self.name, cache)?;
        let row = c.num_kv_heads * c.head_size;
        let slots = cache.k.len() / row.max(1);
        if self.bug == Bug::CrossCacheRewritten {
            cache.last_write = (kv.key.to_vec(), kv.value.to_vec());
        }
        for (t, &slot) in kv.slot_mapping.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let s = slot as usize;
            if s >= slots {
                return Err(BackendError::InvalidInput {
                    backend: self.name.clone(),
                    message: format!("slot {slot} past the cache ({slots} slots)"),
                });
            }
            let at = if self.bug == Bug::Int32WriteOffset {
                int32_offset(s * row, cache.k.len() - row + 1)
            } else {
                s * row
            };
            let (k, v) = (&kv.key[t * row..][..row], &kv.value[t * row..][..row]);
            match &c.kv_cache {
                None => {
                    cache.k[at..at + row].copy_from_slice(k);
                    cache.v[at..at + row].copy_from_slice(v);
                }
                Some(f) => {
                    let d = c.head_size;
                    // The scale each kv head's row of this token is written with.
                    let scales = |part: KvPart, rows: &[f32]| -> Vec<f32> {
                        let row = |h: usize| &rows[h * d..(h + 1) * d];
                        (0..c.num_kv_heads)
                            .map(|h| f.row_scale(part, h, row(h)))
                            .collect()
                    };
                    let (ks, vs) = (scales(KvPart::K, k), scales(KvPart::V, v));
                    let (kr, vr) = (self.read_scales(f, &ks), self.read_scales(f, &vs));
                    for i in 0..row {
                        let h = i / d;
                        cache.k[at + i] = self.fp8_read_back(f, k[i], ks[h], kr[h], h);
                        cache.v[at + i] = self.fp8_read_back(f, v[i], vs[h], vr[h], h);
                    }
                }
            }
        }
        Ok(())
    }

    fn forward(
        &self,
        c: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let cache = cache_as::<SlotCache>(&self.name, cache)?;
        let (hq, hkv, d, bs) = (c.num_heads, c.num_kv_heads, c.head_size, c.block_size);
        let group = hq / hkv;
        if self.bug == Bug::BlockQZeroAbove16 && group > 16 {
            // BLOCK_Q = BLOCK_M // num_queries_per_kv with BLOCK_M = 16.
            return Err(BackendError::Failed {
                backend: self.name.clone(),
                message: format!("integer division or modulo by zero (BLOCK_Q = 16 // {group})"),
            });
        }
        let all_decode = step.query_start_loc.windows(2).all(|w| w[1] - w[0] == 1);
        // The first sequence with more than one query token after one or more decodes: the
        // one a decode/prefill split off by one runs through the decode path.
        let first_prefill = (0..step.seq_lens.len())
            .find(|&s| step.query_start_loc[s + 1] - step.query_start_loc[s] > 1);
        let first_prefill = first_prefill.filter(|&s| s > 0);
        let scale = match self.bug {
            Bug::CustomScaleIgnored => 1.0 / (d as f32).sqrt(),
            Bug::ScaleForgotten => 1.0,
            _ => c.effective_scale() as f32,
        };
        // Sequences whose tables share a block with another's (a prefix-cache hit): only the
        // table-row bug needs them, and the scan is quadratic in the batch.
        let find_hits = self.bug == Bug::UnhitTableRowsZeroed;
        let hit: Vec<bool> = (0..step.seq_lens.len())
            .map(|s| {
                if !find_hits {
                    return false;
                }
                let mine = &step.block_table[s][..step.seq_lens[s].div_ceil(bs)];
                (0..step.seq_lens.len()).any(|o| {
                    o != s
                        && step.block_table[o][..step.seq_lens[o].div_ceil(bs)]
                            .iter()
                            .any(|b| mine.contains(b))
                })
            })
            .collect();
        let any_hit = hit.iter().any(|&h| h);
        let round = |x: f32| {
            if self.bug == Bug::LowPrecisionAccumulation {
                c.dtype.round(x)
            } else {
                x
            }
        };
        let mut out = vec![0.0f32; step.num_tokens * hq * d];
        // Which sequence first gathered each physical block (for the gather-once bug).
        let mut owner: HashMap<u32, usize> = HashMap::new();
        let zeros = vec![0.0f32; d];
        // The cross cache as the rewriting bug leaves it: each later step writes its own K/V
        // rows over the encoder's first positions, as if it were the request's first step.
        let mut rewritten = (Cow::Borrowed(&cache.k[..]), Cow::Borrowed(&cache.v[..]));
        if self.bug == Bug::CrossCacheRewritten && c.kind == AttentionKind::EncoderDecoder {
            let row = hkv * d;
            let (rk, rv) = (rewritten.0.to_mut(), rewritten.1.to_mut());
            let (k, v) = &cache.last_write;
            for s in 0..step.seq_lens.len() {
                let (q0, q1) = (step.query_start_loc[s], step.query_start_loc[s + 1]);
                for t in q0..q1.min(k.len() / row.max(1)) {
                    let j = t - q0;
                    if j >= step.seq_lens[s] {
                        break;
                    }
                    let at = (step.block_table[s][j / bs] as usize * bs + j % bs) * row;
                    rk[at..at + row].copy_from_slice(&k[t * row..(t + 1) * row]);
                    rv[at..at + row].copy_from_slice(&v[t * row..(t + 1) * row]);
                }
            }
        }

        // The longest query "is" num_tokens - num_seqs + 1 when every request has a token:
        // a grid sized by it drops the last queries of a request once padded requests
        // (query length 0) join the count.
        let n = step.seq_lens.len();
        let grid = (step.query_start_loc[n] + 1).saturating_sub(n);
        // The cascade bug's shared prefix of each sequence, in keys: its leading blocks that
        // 8 or more sequences read, when they make 256 keys or more.
        let crowd_prefix: Vec<usize> = if self.bug == Bug::CascadeMergeNoRescale {
            let mut readers: HashMap<u32, usize> = HashMap::new();
            for s in 0..n {
                let mut mine = step.block_table[s][..step.seq_lens[s].div_ceil(bs)].to_vec();
                mine.sort_unstable();
                mine.dedup();
                for b in mine {
                    *readers.entry(b).or_default() += 1;
                }
            }
            (0..n)
                .map(|s| {
                    let used = &step.block_table[s][..step.seq_lens[s].div_ceil(bs)];
                    let shared = used.iter().take_while(|b| readers[*b] >= 8).count() * bs;
                    if shared >= 256 {
                        shared.min(step.seq_lens[s])
                    } else {
                        0
                    }
                })
                .collect()
        } else {
            vec![0; n]
        };
        for (s, &seq_hit) in hit.iter().enumerate() {
            let (q0, q1) = (step.query_start_loc[s], step.query_start_loc[s + 1]);
            let seq_len = step.seq_lens[s];
            if seq_len == 0 {
                continue; // a padded request: nothing to attend, no output row
            }
            let query_len = q1 - q0;
            let q1 = if self.bug == Bug::MaxQueryLenFromCounts {
                q1.min(q0 + grid)
            } else {
                q1
            };
            // Cross-attention: every key is the encoder's; queries have no position among
            // them (and may outnumber them).
            let cross = c.kind == AttentionKind::EncoderDecoder;
            let ctx = seq_len.saturating_sub(query_len);
            let zeroed = vec![0u32; step.block_table[s].len()];
            let row = if self.bug == Bug::UnhitTableRowsZeroed && any_hit && !seq_hit {
                &zeroed
            } else {
                &step.block_table[s]
            };
            for &blk in &row[..seq_len.div_ceil(bs)] {
                owner.entry(blk).or_insert(s);
            }
            for t in q0..q1 {
                let p = if self.bug == Bug::FirstPrefillAsDecode
                    && first_prefill == Some(s)
                    && c.kind == AttentionKind::Decoder
                {
                    // The decode path puts its one query at the sequence's last position.
                    seq_len - 1
                } else {
                    ctx + t - q0
                };
                let p_mask = if self.bug == Bug::CausalOffsetQueryLen {
                    (query_len + t - q0).min(seq_len - 1)
                } else {
                    p
                };
                let window = match (self.bug, c.sliding_window) {
                    (Bug::DecodeIgnoresWindow, _) if query_len == 1 => None,
                    (Bug::WindowIgnoredWithGqa, _) if group > 1 => None,
                    (Bug::WindowOneShort, Some(w)) if c.kind == AttentionKind::Decoder => {
                        Some(w.saturating_sub(1).max(1))
                    }
                    (_, w) => w,
                };
                let mut request = step.request_mask(s);
                let shortened: Vec<(usize, usize)>;
                match self.bug {
                    Bug::CausalFlagOfFirstRequest => request.causal = step.is_causal(0),
                    Bug::PrefixLmRangesOfFirstRequest => {
                        request.ranges = step.request_mask(0).ranges
                    }
                    Bug::PrefixLmRangeEndExclusive => {
                        // `[a, b)` read where upstream means `[a, b]`.
                        shortened = request
                            .ranges
                            .iter()
                            .filter(|r| r.0 < r.1)
                            .map(|&(a, b)| (a, b - 1))
                            .collect();
                        request.ranges = &shortened;
                    }
                    Bug::PrefixLmClampIgnored => request.clamp_to_window = false,
                    Bug::RswaPrefixFromStepStart => {
                        request.rswa = request.rswa.map(|(w, n)| (w, (ctx + n).min(seq_len)))
                    }
                    _ => {}
                }
                let causal = request.causal;
                let visible = Visibility {
                    window,
                    request,
                    ..Visibility::of(c)
                }
                .keys(p_mask, seq_len);
                let (base_lo, base_hi) = visible.bounds().expect("a query sees itself");
                let (mut lo, mut hi) = (base_lo, base_hi);
                if self.bug == Bug::NonCausalWindowOneSided && !causal && window.is_some() {
                    // The window's right edge as a causal kernel draws it, whatever the request.
                    hi = hi.min(p_mask);
                }
                if self.bug == Bug::WindowByWholeBlocks && c.sliding_window.is_some() {
                    lo = lo / bs * bs;
                }
                if self.bug == Bug::LocalChunkByWholeBlocks && c.attention_chunk_size.is_some() {
                    lo = lo / bs * bs;
                }
                if let (Bug::LookbackInBlocks, Some(chunk), Some(back)) =
                    (self.bug, c.attention_chunk_size, c.chunk_lookback)
                {
                    // The look-back counted in cache blocks, not chunks.
                    let own = p_mask - p_mask % chunk;
                    let window_lo = c
                        .sliding_window
                        .map_or(0, |w| (p_mask + 1).saturating_sub(w));
                    lo = own.saturating_sub(back * bs).max(window_lo);
                }
                if self.bug == Bug::DecoderWindowEncoderConvention
                    && c.kind == AttentionKind::Decoder
                {
                    if let Some(w) = c.sliding_window {
                        lo = (p + 1).saturating_sub(w);
                        hi = (p + w - 1).min(seq_len - 1);
                    }
                }
                // The bugs above move the edges; the gaps R-SWA and PrefixLM ranges leave
                // between them stay (a range of another request may reach past this one).
                let rswa_keeps = |k: usize| {
                    request
                        .rswa
                        .is_none_or(|(w, prefix)| k < prefix || p_mask < k + w)
                };
                let mut keys: Vec<usize> = (lo..=hi)
                    .filter(|&k| {
                        (!(base_lo..=base_hi).contains(&k) && rswa_keeps(k)) || visible.contains(k)
                    })
                    .filter(|&k| k < seq_len)
                    .collect();
                // A PrefixLM range is no edge: the edge bugs above leave its keys as they were
                // (a kernel ORs the range in after its window, causal and chunk bounds).
                if let Some((a, b)) = request.range_of(p_mask) {
                    keys.extend((a..=b.min(seq_len - 1)).filter(|&k| visible.contains(k)));
                    keys.sort_unstable();
                    keys.dedup();
                }
                if cross && self.bug == Bug::CrossCausal {
                    // Causal, aligned bottom-right as a causal kernel aligns it: decoder
                    // token j sees keys up to seq_len - query_len + j.
                    let last = (seq_len + (t - q0)).checked_sub(query_len);
                    keys.retain(|&k| last.is_some_and(|l| k <= l));
                }
                if cross && self.bug == Bug::CrossDecoderLength {
                    // As many keys as decoder tokens, read through the table row.
                    keys = (0..query_len.min(row.len() * bs)).collect();
                }
                if self.bug == Bug::LastPartialBlockIgnored && !seq_len.is_multiple_of(bs) {
                    keys.retain(|&k| k < seq_len / bs * bs);
                }
                let decode = query_len == 1 && c.kind == AttentionKind::Decoder;
                if self.bug == Bug::PageTilesFloored
                    && decode
                    && bs > 64
                    && seq_len.div_ceil(bs) >= 3
                {
                    let tiled = bs / 64 * 64;
                    keys.retain(|&k| k % bs < tiled);
                }
                // The corner bug's decode path (head size 256 and up, a half dtype, blocks of
                // 16 or 32): its second 32-key chunk re-reads the first.
                let corner = self.bug == Bug::WideDecodeChunkReread
                    && query_len == 1
                    && c.kind == AttentionKind::Decoder
                    && c.head_size >= 256
                    && c.dtype != attn_reference::DType::F32
                    && (bs == 16 || bs == 32);
                let slot = |k: usize| {
                    let k = if corner { k % 32 } else { k };
                    let block =
                        if self.bug == Bug::SlotBlockBoundary && k.is_multiple_of(bs) && k > 0 {
                            (k - 1) / bs
                        } else {
                            k / bs
                        };
                    let offset = if self.bug == Bug::PageOffsetPast128 && bs > 128 {
                        k % bs % 128
                    } else {
                        k % bs
                    };
                    row[block] as usize * bs + offset
                };
                for h in 0..hq {
                    let kvh = if self.bug == Bug::HeadTileCrossesGroup
                        && decode
                        && group > 16
                        && !group.is_multiple_of(16)
                    {
                        (h / 16 * 16) / group
                    } else {
                        h / group
                    };
                    let q = &step.query[(t * hq + h) * d..][..d];
                    let (kc, vc, zeros, owner) = (&*rewritten.0, &*rewritten.1, &zeros, &owner);
                    let read = move |value: bool, k: usize| -> &[f32] {
                        let buf = if value { vc } else { kc };
                        let blk = row[k / bs];
                        if self.bug == Bug::SharedBlockGatheredOnce
                            && owner.get(&blk).is_some_and(|&o| o != s)
                        {
                            return zeros;
                        }
                        let at = (slot(k) * hkv + kvh) * d;
                        let at = if self.bug == Bug::Int32ReadOffset {
                            int32_offset(at, buf.len() - d + 1)
                        } else {
                            at
                        };
                        &buf[at..][..d]
                    };
                    let logit_of = |q: &[f32], p: usize, k: usize| {
                        let kr = read(false, k);
                        // The vector width's multiple of the head size, for the tail bug.
                        let dims = if self.bug == Bug::SimdTailDropped && d > 8 {
                            d / 8 * 8
                        } else {
                            d
                        };
                        let scaled_query = self.bug == Bug::ScaledQueryInDtype;
                        let mut dot = q[..dims]
                            .iter()
                            .zip(&kr[..dims])
                            .map(|(a, b)| {
                                if scaled_query {
                                    c.dtype.round(a * scale) * b
                                } else {
                                    a * b
                                }
                            })
                            .sum::<f32>();
                        if matches!(
                            self.bug,
                            Bug::ScoresInDtype | Bug::ScaledQueryInDtype | Bug::EveryOpInDtype
                        ) {
                            dot = c.dtype.round(dot);
                        }
                        if self.bug == Bug::QkOverflowsF16
                            && c.dtype == attn_reference::DType::F16
                            && dot.abs() > 65504.0
                        {
                            // The unscaled q·k tile is held in f16.
                            dot = dot.signum() * f32::INFINITY;
                        }
                        let mut l = match self.bug {
                            Bug::ScaledQueryInDtype => dot,
                            Bug::EveryOpInDtype => c.dtype.round(scale * dot),
                            _ => scale * dot,
                        };
                        // Positions as ALiBi's bias sees them: rounded to bf16 or f16 when
                        // the bias is built in the compute dtype.
                        let position = |x: usize| match (self.bug, c.dtype) {
                            (Bug::AlibiPositionsInBf16, attn_reference::DType::Bf16)
                            | (Bug::AlibiPositionsInF16, attn_reference::DType::F16) => {
                                c.dtype.round(x as f32)
                            }
                            _ => x as f32,
                        };
                        let alibi = match &c.alibi_slopes {
                            Some(_)
                                if self.bug == Bug::AlibiDroppedInDecodeBatches && all_decode =>
                            {
                                0.0
                            }
                            Some(a) => a[h] * (position(k) - position(p)),
                            None => 0.0,
                        };
                        match (self.bug, c.logits_soft_cap) {
                            (Bug::SoftCapAfterAlibi, Some(cap)) => {
                                l = cap * ((l + alibi) / cap).tanh()
                            }
                            (Bug::SoftCapTanhOverflow, Some(cap)) => {
                                l = cap * tanh_by_exp(l / cap) + alibi
                            }
                            (_, Some(cap)) => l = cap * (l / cap).tanh() + alibi,
                            (_, None) => l += alibi,
                        }
                        l
                    };
                    let logit = |k: usize| logit_of(q, p, k);
                    // The tile bug's max: that of the tile's first row, for every row.
                    // The half-tile bug: a row in the second half of a 128-row tile uses
                    // the max of the row 64 before it (the first half's registers).
                    let half = WIDE_TILE / 2;
                    let other_row = match self.bug {
                        Bug::TileSharesRowMax => Some(q0 + (t - q0) / QUERY_TILE * QUERY_TILE),
                        Bug::HalfTileRowMax if (t - q0) % WIDE_TILE >= half => Some(t - half),
                        _ => None,
                    };
                    let tile_max = other_row.map(|t0| {
                        let p0 = ctx + t0 - q0;
                        let q0r = &step.query[(t0 * hq + h) * d..][..d];
                        Visibility {
                            window,
                            request: step.request_mask(s),
                            ..Visibility::of(c)
                        }
                        .keys(p0, seq_len)
                        .iter()
                        .map(|k| logit_of(q0r, p0, k))
                        .fold(f32::NEG_INFINITY, f32::max)
                    });
                    // Two splits over the visible keys, each an online softmax; the partition
                    // bug splits at 256 keys, as a partitioned decode kernel does.
                    let cascade = crowd_prefix[s] > 0;
                    let mid = if self.bug == Bug::PartitionMergeNoRescale {
                        keys.len().min(256)
                    } else if cascade {
                        keys.partition_point(|&k| k < crowd_prefix[s])
                    } else {
                        keys.len() / 2
                    };
                    let split = |ks: &[usize]| {
                        let mut part = Partial {
                            max: if self.bug == Bug::FiniteMaxSentinel {
                                FINITE_MAX_SENTINEL
                            } else {
                                f32::NEG_INFINITY
                            },
                            sum: 0.0,
                            acc: vec![0.0; d],
                        };
                        for &k in ks {
                            let l = logit(k);
                            let m = if self.bug == Bug::SoftmaxNoMax {
                                0.0
                            } else if let Some(m) = tile_max {
                                m
                            } else {
                                part.max.max(l)
                            };
                            let rescale =
                                if part.max == f32::NEG_INFINITY || self.bug == Bug::SoftmaxNoMax {
                                    1.0
                                } else {
                                    (part.max - m).exp()
                                };
                            let w = (l - m).exp();
                            let vr = read(true, k);
                            part.sum = round(part.sum * rescale + w);
                            // A P·V loop whose trip count is head_size / 64: none below 64.
                            if !(self.bug == Bug::PvSkippedBelow64 && d < 64) {
                                for (a, v) in part.acc.iter_mut().zip(vr) {
                                    *a = round(*a * rescale + w * v);
                                }
                            }
                            part.max = m;
                        }
                        part
                    };
                    if self.bug == Bug::EveryOpInDtype {
                        // Eager attention with half tensors: the logits as rounded above, the
                        // softmax's probabilities in the dtype, P·V rounded once.
                        let rd = |x: f32| c.dtype.round(x);
                        let logits: Vec<f32> = keys.iter().map(|&k| logit(k)).collect();
                        let sink = c.sinks.as_ref().map(|x| x[h]);
                        let m = logits
                            .iter()
                            .copied()
                            .chain(sink)
                            .fold(f32::NEG_INFINITY, f32::max);
                        let weights: Vec<f32> = logits.iter().map(|&l| (l - m).exp()).collect();
                        let denom =
                            sink.map_or(0.0, |x| (x - m).exp()) + weights.iter().sum::<f32>();
                        let o = &mut out[(t * hq + h) * d..][..d];
                        o.fill(0.0);
                        for (&w, &k) in weights.iter().zip(&keys) {
                            let p = rd(w / denom);
                            for (o, v) in o.iter_mut().zip(read(true, k)) {
                                *o += p * v;
                            }
                        }
                        o.iter_mut().for_each(|x| *x = rd(*x));
                        continue;
                    }
                    let (mut a, b) = (split(&keys[..mid]), split(&keys[mid..]));
                    let masked_edge =
                        c.sliding_window.is_some() || c.attention_chunk_size.is_some();
                    if self.bug == Bug::WindowMaskedAfterLoad && masked_edge {
                        // Every block from 0 is loaded and the window (or local chunk) is a
                        // score mask: the keys before it get a weight of exactly 0, and their
                        // values still enter P·V (a skipped block's null block: 0 · NaN = NaN).
                        for k in 0..base_lo {
                            for (acc, v) in a.acc.iter_mut().zip(read(true, k)) {
                                *acc += 0.0 * v;
                            }
                        }
                    }
                    let sink = c.sinks.as_ref().map(|x| x[h]);
                    let m = a.max.max(b.max).max(sink.unwrap_or(f32::NEG_INFINITY));
                    let fa = if a.max == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (a.max - m).exp()
                    };
                    let fb = if b.max == f32::NEG_INFINITY {
                        0.0
                    } else if self.bug == Bug::SplitMergeDropsRescale
                        || (self.bug == Bug::PartitionMergeNoRescale && keys.len() > 256)
                        || cascade
                    {
                        1.0
                    } else {
                        (b.max - m).exp()
                    };
                    let mut ws = sink.map_or(0.0, |x| (x - m).exp());
                    if self.bug == Bug::SinkTwiceSplitKv
                        && c.sliding_window.is_some()
                        && keys.first().is_some_and(|&k| k >= SPLIT_KEYS)
                    {
                        // KV split 0 lies wholly before the window: it publishes the sink as
                        // its result, and the first split with keys seeds it again.
                        ws *= 2.0;
                    }
                    let denom = a.sum * fa + b.sum * fb + ws;
                    let o = &mut out[(t * hq + h) * d..][..d];
                    for (i, o) in o.iter_mut().enumerate() {
                        let mut num = a.acc[i] * fa + b.acc[i] * fb;
                        if self.bug == Bug::SinkInNumerator {
                            num += ws;
                        }
                        *o = if self.bug == Bug::FiniteMaxSentinel && denom == 0.0 {
                            // Every weight underflowed: the kernel's 0-denominator guard.
                            0.0
                        } else {
                            c.dtype.round(num / denom)
                        };
                    }
                }
            }
        }
        let real = step.query_start_loc.last().copied().unwrap_or(0);
        if self.bug == Bug::TokensPast8192Skipped && step.num_tokens > GRID_TOKENS {
            // The grid has no program for these rows: they keep what the buffer held.
            out[GRID_TOKENS * hq * d..].fill(0.0);
        }
        // The decode path (plain or speculative: every request at most 8 tokens) launched on
        // a grid captured for 8,192 decode tokens.
        let decode_only = c.kind == AttentionKind::Decoder
            && step
                .query_start_loc
                .windows(2)
                .all(|w| w[1] - w[0] <= SPEC_DECODE_TOKENS);
        if self.bug == Bug::DecodeGridPast8192 && decode_only && step.num_tokens > GRID_TOKENS {
            out[GRID_TOKENS * hq * d..].fill(0.0);
        }
        if self.bug == Bug::PaddingRowNan && step.num_tokens > real && real > 0 {
            // A padding row sees no key: 0 / 0. A tile-wide epilogue then mixes it into the
            // last real row (0 * NaN is NaN).
            let row = hq * d;
            for i in 0..row {
                let pad = f32::NAN;
                out[real * row + i] = pad;
                out[(real - 1) * row + i] += 0.0 * pad;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_case;
    use attn_reference::{build_case, reference_output, BuildOptions, DType};

    #[test]
    fn the_control_kernel_is_correct() {
        for kv_cache in [
            None,
            Some(Fp8KvCache::new(Fp8Format::E4m3, 0.00390625, 0.5)),
            Some(Fp8KvCache::new(Fp8Format::E5m2, 4.0, 0.1875)),
        ] {
            control_on(kv_cache);
        }
    }

    fn control_on(kv_cache: Option<Fp8KvCache>) {
        let mut c = AttentionConfig::new(6, 2, 5, 3, DType::F32);
        c.kv_cache = kv_cache;
        c.sliding_window = Some(4);
        c.alibi_slopes = Some(vec![0.5, 0.25, 0.125, 0.1, 0.05, 0.01]);
        c.sinks = Some(vec![0.0, 1.0, -1.0, 0.5, 0.0, 2.0]);
        c.logits_soft_cap = Some(5.0);
        let case = build_case(
            &[9, 4, 1],
            &[3, 4, 1],
            c,
            2,
            &BuildOptions {
                padding_tokens: 2,
                ..Default::default()
            },
        );
        let out = run_case(&PlainBackend::new("plain", Bug::None), &case)
            .unwrap()
            .output;
        let exp = reference_output(&case);
        for (a, e) in out.iter().zip(&exp) {
            assert!((*a as f64 - e).abs() < 1e-5, "{a} vs {e}");
        }
    }
}
