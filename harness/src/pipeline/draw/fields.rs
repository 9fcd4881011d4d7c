//! Draws of single recipe fields shared by the tiers: head and block sizes, FP8 caches,
//! values, table orders and layouts, lengths near the kernels' thresholds, mask ranges.

use crate::pipeline::recipe::{RangesRecipe, RswaRecipe, Share, TableOrder, Values};
use attn_reference::{AttentionKind, Fp8Format, Fp8KvCache, InputRng, KvScales};
use proptest::prelude::*;

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

pub fn head_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        5 => 1usize..=8,
        2 => prop::sample::select(MODEL_HEAD_SIZES.to_vec()),
        2 => prop::sample::select(vector_edge_head_sizes()),
        1 => 1usize..=576,
    ]
}

/// Block sizes: small ones (shrinking goes there), vLLM's, above 128 and not powers of two.
pub fn block_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => prop::sample::select(vec![1usize, 2, 3, 16, 32, 64]),
        1 => prop::sample::select(vec![5usize, 7, 24, 48, 96, 128, 129, 160, 255, 256]),
    ]
}

/// The default scale most of the time; otherwise scales as models set them: 256^-0.5 (a
/// query pre-attention scalar larger than the head size), 1, tiny and large.
pub fn scale() -> impl Strategy<Value = Option<f32>> {
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

pub fn kv_cache() -> impl Strategy<Value = Option<Fp8KvCache>> {
    prop::option::weighted(0.2, kv_cache_of_any_format())
}

/// An FP8 cache of either format with scales from [`FP8_SCALES`] ([`fp8_cache`]), in one of
/// four with scales per kv head and in one of four per token ([`scale_granularity`]).
pub fn kv_cache_of_any_format() -> impl Strategy<Value = Fp8KvCache> {
    any::<u64>().prop_map(|seed| fp8_cache_of_seed(seed, true))
}

/// An FP8 cache of either format with per-tensor scales from [`FP8_SCALES`] (MLA's latent
/// cache has no finer ones).
pub fn kv_cache_per_tensor() -> impl Strategy<Value = Fp8KvCache> {
    any::<u64>().prop_map(|seed| fp8_cache_of_seed(seed, false))
}

/// The FP8 cache `seed` draws ([`fp8_cache`]), with `finer` scales by its top bits.
fn fp8_cache_of_seed(seed: u64, finer: bool) -> Fp8KvCache {
    let mut rng = InputRng::new(seed);
    let mut pick = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let cache = fp8_cache(&mut pick);
    if finer {
        scale_granularity(cache, seed >> 62, &mut pick)
    } else {
        cache
    }
}

/// `cache` with the granularity `top` says (the seed's two top bits: 0 and 1 per tensor, 2
/// per kv head, 3 per token), so a shrinking seed ends per tensor. Per head, eight K and V
/// scales from [`FP8_SCALES`] (a case's kv heads take the first ones, repeated); per token an
/// E4M3 cache, the only format vLLM has them in. Finer scales replace the per-tensor ones,
/// which become 1.
pub fn scale_granularity(
    cache: Fp8KvCache,
    top: u64,
    pick: &mut dyn FnMut(usize, usize) -> usize,
) -> Fp8KvCache {
    let last = FP8_SCALES.len() - 1;
    let scales = match top {
        2 => {
            let mut per_head = || (0..8).map(|_| FP8_SCALES[pick(0, last)]).collect();
            let k = per_head();
            KvScales::Head { k, v: per_head() }
        }
        3 => KvScales::Token,
        _ => return cache,
    };
    let dtype = match scales {
        KvScales::Token => Fp8Format::E4m3,
        _ => cache.dtype,
    };
    Fp8KvCache {
        q_scale: cache.q_scale,
        scales,
        ..Fp8KvCache::new(dtype, 1.0, 1.0)
    }
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
pub fn near_threshold(max: usize) -> impl Strategy<Value = usize> {
    let near: Vec<usize> = attn_backends::all_thresholds()
        .iter()
        .copied()
        .filter(|&t| t <= max)
        .flat_map(|t| [t - 1, t, t + 1])
        .collect();
    prop::sample::select(near)
}

pub fn values() -> impl Strategy<Value = Values> {
    prop_oneof![
        1 => any::<u64>().prop_map(Values::Simple),
        6 => any::<u64>().prop_map(|seed| Values::Normal { seed, std: 1.0 }),
        2 => any::<u64>().prop_map(|seed| Values::Normal { seed, std: 12.0 }),
    ]
}

pub fn table_order() -> impl Strategy<Value = TableOrder> {
    prop_oneof![
        1 => Just(TableOrder::Sequential),
        1 => Just(TableOrder::Reversed),
        1 => Just(TableOrder::Interleaved),
        3 => any::<u64>().prop_map(TableOrder::Permuted),
    ]
}

pub fn kind() -> impl Strategy<Value = AttentionKind> {
    prop_oneof![
        8 => Just(AttentionKind::Decoder),
        2 => Just(AttentionKind::EncoderOnly),
        2 => Just(AttentionKind::EncoderDecoder),
    ]
}

/// Padding tokens, spare blocks, table order, and prefix sharing among up to `max_share`
/// sequences (in one case in seven or so).
pub fn layout(
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
