//! The small tier: recipes within the limits, lengths and sizes aimed at thresholds, where
//! off-by-ones are visible.

use super::budget::{fit_cost, SMALL_COST};
use super::fields::*;
use super::tier::StrategyLimits;
use crate::pipeline::recipe::{padded_requests_of, poison_of, CaseRecipe};
use attn_reference::{DType, Space};
use proptest::prelude::*;

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
        crate::pipeline::draw::extremes::batch_order(),
        prop::option::weighted(0.06, crate::pipeline::draw::extremes::big_heads()),
        prop::option::weighted(0.12, crate::pipeline::draw::extremes::logit_shift()),
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
                let (order, heads, logits) = extremes;
                let r = crate::pipeline::draw::extremes::small_extremes(r, order, heads, logits);
                fit_cost(r, SMALL_COST, &Space::default())
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::recipe::{shares_blocks, Values};
    use attn_reference::{AttentionKind, Feature, Fp8Format};
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
            assert!(rs
                .iter()
                .any(|r| r.kv_cache.as_ref().is_some_and(|c| c.dtype == f)));
        }
        // Turning a feature off in the recipe turns it off in the case, and only that one.
        for r in &rs {
            for f in Feature::ALL {
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
        assert!(rs.iter().any(|r| shares_blocks(&r.build())));
        assert!(rs.iter().any(|r| r.group == 3 && r.num_kv_heads == 3));
        assert!(rs.iter().any(|r| r.head_size == 128));
        assert!(rs.iter().any(|r| matches!(r.values, Values::Simple(_))));
        for dt in DType::ALL {
            assert!(rs.iter().any(|r| r.dtype == dt));
        }
    }
}
