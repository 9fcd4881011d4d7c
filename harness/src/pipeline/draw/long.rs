//! The long tier: long contexts, decode batches of 16 to 256 sequences, and huge caches.

use super::budget::{fit_cost, LONG_COST};
use super::fields::near_threshold;
use crate::pipeline::recipe::{
    padded_requests_in_batches, padded_requests_of, poison_of, CaseRecipe, TableOrder, Values,
};
use attn_reference::{DType, Space};
use proptest::prelude::*;

/// The heads, sizes and dtype of a long-tier recipe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LongShape {
    pub num_kv_heads: usize,
    pub group: usize,
    pub head_size: usize,
    pub block_size: usize,
    pub dtype: DType,
}

/// A plain decoder recipe of the long tier: few heads, small head sizes, normal values.
pub(crate) fn long_base(shape: LongShape, seqs: Vec<(usize, usize)>, seed: u64) -> CaseRecipe {
    let LongShape {
        num_kv_heads,
        group,
        head_size,
        block_size,
        dtype,
    } = shape;
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

/// Few heads, small head sizes, blocks of 16 to 256, any dtype.
pub(crate) fn long_shape() -> impl Strategy<Value = LongShape> {
    (
        1usize..=2,
        1usize..=2,
        prop::sample::select(vec![8usize, 16, 64]),
        prop::sample::select(vec![16usize, 32, 128, 256]),
        prop::sample::select(DType::ALL.to_vec()),
    )
        .prop_map(
            |(num_kv_heads, group, head_size, block_size, dtype)| LongShape {
                num_kv_heads,
                group,
                head_size,
                block_size,
                dtype,
            },
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
/// layer; backends must allocate lazily or decline (`Dimension::CacheSize`).
pub fn huge_cache() -> impl Strategy<Value = CaseRecipe> {
    let seqs = prop::collection::vec((0usize..=300, 1usize..=8), 1..=2);
    (
        seqs,
        prop::sample::select(DType::ALL.to_vec()),
        any::<u64>(),
    )
        .prop_map(|(seqs, dtype, seed)| {
            let shape = LongShape {
                num_kv_heads: 8,
                group: 1,
                head_size: 128,
                block_size: 16,
                dtype,
            };
            let mut r = long_base(shape, seqs, seed);
            r.cache_blocks = Some(HUGE_CACHE_BLOCKS);
            r
        })
}

/// Blocks of the huge-cache tier: 140,000 × 16 slots × 8 × 128 = 2.3·10^9 elements.
pub const HUGE_CACHE_BLOCKS: usize = 140_000;
