//! The precision tier: each half dtype meets each positional feature at contexts just past
//! the points where that dtype stops holding positions exactly.
//!
//! f16 holds every integer only up to 2,048 (its step is 2 past it, 4 past 4,096, 8 past
//! 8,192), bf16 only up to 256. A backend that builds ALiBi positions, window bounds, chunk
//! starts, look-back edges, PrefixLM ranges or an R-SWA edge in the model's dtype is wrong
//! only for that dtype, with that feature on, past that length: a triple that free drawing
//! leaves to chance. Case `ordinal` of this tier is triple `ordinal`
//! ([`attn_results::precision::triple`], 48 of them), so a default run (one property case in
//! [`PRECISION_EVERY`]) holds every one, whatever the seed.

use crate::pipeline::draw::budget::fit_cost;
use crate::pipeline::recipe::{CaseRecipe, RangesRecipe, RswaRecipe};
use attn_reference::{Feature, Space};
use attn_results::precision::triple;
use proptest::prelude::*;

/// One property case in this many is of the precision tier.
pub const PRECISION_EVERY: usize = 10;
/// Its place in each run of [`PRECISION_EVERY`] indices (clear of the long tier's and MLA's).
pub const PRECISION_AT: usize = 5;
/// The tier's cost ceiling ([`crate::pipeline::recipe::cost`]): twice the small tier's, for up to
/// 8,400 keys under four query heads.
pub const PRECISION_COST: usize = 2 * crate::pipeline::draw::budget::SMALL_COST;

/// Whether property case `index` is of the precision tier (never one of the long tier's).
pub fn is_precision(index: usize) -> bool {
    index % PRECISION_EVERY == PRECISION_AT
}

/// Precision case `ordinal`: one sequence of `length + 64 + 1..=96` keys (so the feature's
/// edges lie past the length too), its last 1 to 4 tokens queried, beside a short second
/// sequence in half the cases; four query heads, so ALiBi's steepest slope is 1/4.
pub fn precision_case(ordinal: usize) -> impl Strategy<Value = CaseRecipe> {
    let (dtype, feature, length) = triple(ordinal);
    (
        1usize..=96,
        prop::sample::select(vec![1usize, 1, 2, 4]),
        prop::sample::select(vec![(1usize, 4usize), (2, 2), (4, 1)]),
        prop::sample::select(vec![16usize, 32]),
        prop::sample::select(vec![16usize, 32]),
        prop::option::of((0usize..=40, 1usize..=4)),
        2usize..=64,
        any::<u64>(),
    )
        .prop_map(
            move |(past, query, (kv, group), head_size, block_size, second, edge, seed)| {
                let len = length + 64 + past;
                let mut seqs = vec![(len - query, query)];
                seqs.extend(second);
                let shape = crate::pipeline::draw::long::LongShape {
                    num_kv_heads: kv,
                    group,
                    head_size,
                    block_size,
                    dtype,
                };
                let mut r = crate::pipeline::draw::long::long_base(shape, seqs, seed);
                // One feature at a time: no padded requests beside it.
                r.padded_requests = 0;
                with_positional(&mut r, feature, edge);
                fit_cost(r, PRECISION_COST, &Space::default())
            },
        )
}

/// `r` with `feature` on, its edges `edge` (2 to 64) tokens before the longest sequence's end.
fn with_positional(r: &mut CaseRecipe, feature: Feature, edge: usize) {
    match feature {
        Feature::Alibi => r.alibi = true,
        Feature::SlidingWindow => r.window = Some(edge),
        Feature::ChunkedLocalAttention => r.chunk = Some(edge),
        Feature::ChunkLookback => {
            r.chunk = Some(edge.div_ceil(2));
            r.lookback = Some(1);
        }
        // The last 0.3% to 1% of the sequence: an image's tokens the queries sit in.
        Feature::PrefixLm => {
            r.prefix_lm = Some(RangesRecipe {
                spans: vec![(990, 997)],
                seqs: u64::MAX,
                clamp: false,
            })
        }
        Feature::Rswa => {
            r.rswa = Some(RswaRecipe::with_longest_prefix(edge, &r.seqs, 995));
        }
        Feature::EncoderOnly
        | Feature::CrossAttention
        | Feature::LogitsSoftCap
        | Feature::Sinks
        | Feature::Fp8KvCache
        | Feature::PaddedRequests
        | Feature::Mla
        | Feature::NonCausal
        | Feature::Fp8Query
        | Feature::KvHeadScales
        | Feature::KvTokenScales => unreachable!("only positional features are drawn"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_results::precision::{bucket, length_class, TRIPLES};
    use proptest::strategy::ValueTree;

    #[test]
    fn every_triple_is_drawn_once_in_a_cycle_and_holds_what_it_names() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let mut seen = std::collections::BTreeSet::new();
        for ordinal in 0..TRIPLES {
            let (dtype, feature, length) = triple(ordinal);
            assert!(seen.insert(bucket(dtype, feature, length).unwrap()));
            let r = precision_case(ordinal)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            let case = r.build();
            assert_eq!(case.config.dtype, dtype);
            assert!(
                feature.used_by(&case.config) || feature.used_by_batch(&case.batch),
                "{ordinal}: {}",
                feature.label()
            );
            let longest = case.batch.seq_lens.iter().copied().max().unwrap();
            assert_eq!(length_class(longest), Some(length), "{ordinal}: {longest}");
            assert!(crate::pipeline::recipe::cost(&r) <= PRECISION_COST);
        }
        assert_eq!(seen.len(), TRIPLES);
    }
}
