//! MLA property cases: one latent kv head whose first `head_size_v` dims are V, the model's
//! scale, decode, speculative and chunked queries. Drawn only for a space that has MLA
//! ([`Feature::Mla`]), at indices of their own, so a backend without MLA draws exactly the
//! cases it always drew, and a backend with it draws the same non-MLA cases elsewhere.
//!
//! What the MLA kernels' bugs need: `Dk != Dv` (a V read with K's width or stride), contexts
//! past 576 keys (where a V row stepped by 512 instead of 576 has drifted a whole entry),
//! group sizes up to 128 (DeepSeek-V3's heads and their tensor-parallel splits, and the small
//! counts that head padding rounds up to 16), scales that are not `Dk^-0.5`.

use crate::pipeline::draw::budget::{fit_mla_cost, MLA_BATCH_SEQS, MLA_COST};
use crate::pipeline::draw::fields::{block_size, values};
use crate::pipeline::draw::tier::{StrategyLimits, Tier};
use crate::pipeline::recipe::{poison_of, CaseRecipe, LatentRecipe};
use attn_reference::mla::{self, KvLayout};
use attn_reference::{DType, Feature, Fp8KvCache, Space};
use proptest::prelude::*;

/// One small-tier index in this many draws MLA where the space has it.
pub const MLA_EVERY: usize = 10;

/// One MLA index in this many draws a decode batch ([`latent_decode_batch`]) instead of 1 to 4
/// sequences.
const MLA_BATCH_EVERY: usize = 8;

/// Query heads: DeepSeek-V3's 128 and its tensor-parallel splits, and the small counts of
/// smaller models and wide splits (Kimi's 12 per rank, V2-Lite's 16 over 2 to 8 ranks).
pub const MLA_HEADS: [usize; 12] = [1, 2, 3, 4, 8, 12, 16, 24, 32, 64, 96, 128];

/// Scales as models set them: `qk_head_dim^-0.5` of DeepSeek (192) and of other shapes, 1,
/// and tiny; never `Dk^-0.5` (see [`model_scale_for`]).
const MLA_SCALES: [usize; 4] = [192, 128, 96, 256];

/// Whether property case `index` of `space` is an MLA case: where MLA is the only layout
/// allowed, every one; where it is allowed, one small-tier index in [`MLA_EVERY`]; never
/// where it is not.
pub fn draws_mla(index: usize, limits: StrategyLimits, space: &Space) -> bool {
    if !space.allows_feature(Feature::Mla) {
        return false;
    }
    if !space.allows_kv_layout(KvLayout::Mha) {
        return true;
    }
    index % MLA_EVERY == MLA_EVERY / 2 + 2 && Tier::of(index, limits) == Tier::Small
}

/// The scale for `qk_head_dim`, unless it happens to equal `head_size^-0.5` (a kernel that
/// ignores the model's scale would then pass): then DeepSeek's.
fn model_scale_for(qk_head_dim: usize, head_size: usize) -> f32 {
    if qk_head_dim == head_size {
        let fallback = if head_size == 192 { 128 } else { 192 };
        return mla::model_scale(fallback);
    }
    mla::model_scale(qk_head_dim)
}

/// (head_size, head_size_v): DeepSeek's 576/512 half the time, small latents (readable and
/// cheap), and now and then V as wide as K.
fn latent_shape() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![
        4 => Just((mla::DEEPSEEK_V3_ENTRY, mla::DEEPSEEK_V3_KV_LORA_RANK)),
        3 => (2usize..=40).prop_flat_map(|dk| (Just(dk), 1..dk)),
        1 => (1usize..=24).prop_map(|d| (d, d)),
    ]
}

/// Contexts at and around 576 keys and its multiples, short ones, anything up to 1200, and
/// now and then a long one (past 4k keys, as latent attention serves long contexts).
fn context() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 0usize..=8,
        3 => prop::sample::select(vec![511usize, 512, 513, 575, 576, 577, 1151, 1152, 1153]),
        2 => 0usize..=1200,
        1 => 4_097usize..=6_000,
    ]
}

/// The sequences of an MLA decode batch: short contexts, and now and then one around 576
/// keys (the long tier's `strategy::decode_batch` draws whole MHA recipes, not these).
fn latent_decode_batch() -> impl Strategy<Value = Vec<(usize, usize)>> {
    let context = prop_oneof![
        4 => 0usize..=24,
        1 => prop::sample::select(vec![575usize, 576, 577]),
    ];
    prop::collection::vec((context, Just(1usize)), MLA_BATCH_SEQS)
}

/// Whether MLA property case `index` draws a decode batch: one MLA index in
/// [`MLA_BATCH_EVERY`], by index, so the other MLA indices draw what they always drew.
fn draws_batch(index: usize) -> bool {
    (index / MLA_EVERY) % MLA_BATCH_EVERY == MLA_BATCH_EVERY / 2
}

/// Decode mostly, speculative decode (2 to 8 tokens) and chunked-prefill chunks.
fn query() -> impl Strategy<Value = usize> {
    prop_oneof![5 => Just(1usize), 3 => 2usize..=8, 1 => 9usize..=32]
}

/// One MLA case in eight with extreme logits (rows shifted alike, alternating), which one a
/// function of the values' seed.
fn logit_shift_of(
    values: crate::pipeline::recipe::Values,
) -> Option<crate::pipeline::recipe::LogitShift> {
    let mixed = values.seed().wrapping_mul(0xA24B_AED4_963E_E407) >> 58;
    mixed
        .is_multiple_of(8)
        .then_some(crate::pipeline::recipe::LogitShift {
            dot: if mixed & 8 == 0 { 3e5 } else { -1e6 },
            alternate: mixed & 16 == 0,
            scattered: false,
        })
}

/// An MLA recipe drawn whole (then moved inside `space` and under [`MLA_COST`]).
pub fn mla_strategy(
    index: usize,
    limits: StrategyLimits,
    space: &Space,
) -> BoxedStrategy<CaseRecipe> {
    let space = space.clone();
    // A space whose head sizes leave out a drawn latent gets DeepSeek's where it has 576
    // (fitting the head size alone would keep the drawn rope width, not V's 512).
    let allowed = space.head_size_values();
    let outside = move |dk: usize| {
        allowed
            .as_ref()
            .is_some_and(|a| !a.contains(&dk) && a.contains(&mla::DEEPSEEK_V3_ENTRY))
    };
    let seqs = if draws_batch(index) {
        latent_decode_batch().boxed()
    } else {
        prop::collection::vec((context(), query()), 1..=limits.max_seqs.clamp(1, 4)).boxed()
    };
    let layout = crate::pipeline::draw::fields::layout(3);
    // The shared FP8-cache draw; a latent entry is one tensor, so V's scale is K's.
    let fp8 = prop::option::weighted(
        0.2,
        crate::pipeline::draw::fields::kv_cache_per_tensor().prop_map(|k| Fp8KvCache {
            v_scale: k.k_scale,
            ..k
        }),
    );
    (
        prop::sample::select(MLA_HEADS.to_vec()),
        latent_shape(),
        prop_oneof![2 => prop::sample::select(vec![1usize, 16, 64]), 1 => block_size()],
        prop::sample::select(DType::ALL.to_vec()),
        prop::sample::select(MLA_SCALES.to_vec()),
        seqs,
        layout,
        values(),
        fp8,
    )
        .prop_map(
            move |(
                heads,
                (head_size, head_size_v),
                block_size,
                dtype,
                qk_head_dim,
                seqs,
                (padding_tokens, spare_blocks, table, share),
                values,
                fp8,
            )| {
                let (head_size, head_size_v) = if outside(head_size) {
                    (mla::DEEPSEEK_V3_ENTRY, mla::DEEPSEEK_V3_KV_LORA_RANK)
                } else {
                    (head_size, head_size_v)
                };
                let r = CaseRecipe {
                    num_kv_heads: 1,
                    group: heads,
                    head_size,
                    block_size,
                    dtype,
                    seqs,
                    padding_tokens,
                    spare_blocks,
                    table,
                    values,
                    share,
                    kv_cache: fp8,
                    poison: poison_of(values),
                    padded_requests: crate::pipeline::recipe::padded_requests_of(values),
                    logits: logit_shift_of(values),
                    mla: Some(LatentRecipe {
                        rope: head_size - head_size_v,
                        scale: model_scale_for(qk_head_dim, head_size),
                    }),
                    ..CaseRecipe::plain()
                };
                let r = crate::pipeline::draw::budget::fit_space(r, &space, usize::MAX);
                fit_mla_cost(r, MLA_COST)
            },
        )
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::recipe::mla_cost;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    /// `n` draws at the indices that draw 1 to 4 sequences.
    fn draws(space: &Space, n: usize) -> Vec<CaseRecipe> {
        draws_at(space, (0..).filter(|&i| !draws_batch(i)).take(n))
    }

    fn draws_at(space: &Space, indices: impl Iterator<Item = usize>) -> Vec<CaseRecipe> {
        let mut runner = TestRunner::deterministic();
        indices
            .map(|i| {
                mla_strategy(i, StrategyLimits::DEFAULT, space)
                    .new_tree(&mut runner)
                    .unwrap()
                    .current()
            })
            .collect()
    }

    #[test]
    fn mla_recipes_build_valid_cases_that_reach_what_mla_bugs_need() {
        let rs = draws(&Space::default(), 300);
        for r in &rs {
            let case = r.build();
            assert_eq!(case.validate(), Ok(()), "{r:?}");
            assert!(case.config.mla.is_some());
            assert!(mla_cost(r) <= MLA_COST, "{r:?}");
            let s = case.config.effective_scale();
            assert!(
                (s - 1.0 / (r.head_size as f64).sqrt()).abs() > 1e-6,
                "{r:?}"
            );
        }
        let dv = |r: &CaseRecipe| r.mla.unwrap().head_size_v(r.head_size);
        let dsv3 = |r: &CaseRecipe| r.head_size == 576 && dv(r) == 512;
        // Dk != Dv, contexts past 576 keys, and every group size up to 128.
        assert!(rs.iter().any(|r| dv(r) < r.head_size));
        assert!(rs.iter().any(|r| dv(r) == r.head_size));
        assert!(rs
            .iter()
            .any(|r| dsv3(r) && r.lens().0.iter().any(|&l| l > 576)));
        assert!(rs
            .iter()
            .any(|r| dsv3(r) && r.group == 128 && r.lens().0.iter().any(|&l| l > 576)));
        for h in MLA_HEADS {
            assert!(rs.iter().any(|r| r.group == h), "{h} heads");
        }
        assert!(rs.iter().any(|r| r.lens().1.iter().any(|&q| q > 8)));
        assert!(rs
            .iter()
            .any(|r| r.lens().1.iter().any(|&q| (2..=8).contains(&q))));
        assert!(rs.iter().any(|r| r.kv_cache.is_some()));
        assert!(rs
            .iter()
            .any(|r| crate::pipeline::recipe::shares_blocks(&r.build())));
        for b in [1, 16, 64] {
            assert!(rs.iter().any(|r| r.block_size == b));
        }
    }

    #[test]
    fn one_mla_index_in_eight_draws_a_decode_batch_that_keeps_its_sequences() {
        let batch_indices = (0..).filter(|&i| draws_batch(i));
        let rs = draws_at(&Space::default(), batch_indices.take(40));
        for r in &rs {
            assert_eq!(r.build().validate(), Ok(()), "{r:?}");
            assert!(mla_cost(r) <= MLA_COST, "{r:?}");
            // Past 64 sequences (the large-batch class), all decodes, whatever the heads.
            assert!(MLA_BATCH_SEQS.contains(&r.seqs.len()), "{r:?}");
            assert!(r.seqs.iter().all(|s| s.1 == 1), "{r:?}");
        }
        assert!(rs.iter().any(|r| r.head_size == mla::DEEPSEEK_V3_ENTRY));
        assert!(rs.iter().any(|r| r.lens().0.iter().any(|&l| l > 576)));
        assert!(rs.iter().any(|r| r.group >= 16));
    }

    #[test]
    fn mla_is_drawn_only_where_the_space_has_it() {
        let limits = StrategyLimits::DEFAULT;
        let without: Space = serde_json::from_str(r#"{"features": ["sinks"]}"#).unwrap();
        let full = Space::default();
        let only = Space::parse_only("kv_layouts=mla").unwrap();
        let mla_indices: Vec<usize> = (0..500).filter(|&i| draws_mla(i, limits, &full)).collect();
        assert!(
            (40..=60).contains(&mla_indices.len()),
            "{}",
            mla_indices.len()
        );
        assert!((0..500).all(|i| !draws_mla(i, limits, &without)));
        assert!((0..500).all(|i| draws_mla(i, limits, &only)));
        // Every other index of the full space draws what a space with every feature but
        // MLA draws (what every backend drew before MLA existed).
        let all_but_mla = Space {
            features: Some(
                Feature::ALL
                    .into_iter()
                    .filter(|f| *f != Feature::Mla)
                    .collect(),
            ),
            ..Space::default()
        };
        let (mut a, mut b) = (TestRunner::deterministic(), TestRunner::deterministic());
        for i in (0..100).filter(|i| !mla_indices.contains(i)) {
            let draw = |space: &Space, runner: &mut TestRunner| {
                crate::pipeline::draw::strategy_for(i, limits, space)
                    .new_tree(runner)
                    .unwrap()
                    .current()
            };
            let x = draw(&full, &mut a);
            assert_eq!(x, draw(&all_but_mla, &mut b), "case {i}");
            assert!(x.mla.is_none());
        }
    }

    #[test]
    fn a_space_of_576_alone_draws_deepseeks_latent() {
        let space = Space::parse_only("head_sizes=576").unwrap();
        for r in draws(&space, 60) {
            assert_eq!((r.head_size, r.config().head_size_v()), (576, 512));
        }
    }

    #[test]
    fn a_shrinking_latent_keeps_v_narrower_than_k() {
        let r = CaseRecipe {
            head_size: 576,
            mla: Some(LatentRecipe {
                rope: 64,
                scale: 0.1,
            }),
            ..CaseRecipe::plain()
        };
        for (dk, dv) in [(576, 512), (288, 224), (65, 1), (2, 1), (1, 1)] {
            let c = CaseRecipe {
                head_size: dk,
                ..r.clone()
            }
            .config();
            assert_eq!((c.head_size, c.head_size_v()), (dk, dv));
            assert_eq!(c.validate(), Ok(()));
        }
    }

    #[test]
    fn turning_mla_off_keeps_the_models_scale() {
        let r = draws(&Space::default(), 1).remove(0);
        let off = r.without(Feature::Mla).unwrap();
        let mut expected = r.config();
        Feature::Mla.turn_off(&mut expected);
        assert_eq!(off.config(), expected);
        assert_eq!(off.build().validate(), Ok(()));
        // A space without MLA fits an MLA recipe out of it, valid.
        let without: Space = serde_json::from_str(r#"{"features": ["sinks"]}"#).unwrap();
        let fitted = crate::pipeline::draw::budget::fit_space(r, &without, usize::MAX);
        assert!(fitted.mla.is_none());
        assert_eq!(fitted.build().validate(), Ok(()));
    }
}
