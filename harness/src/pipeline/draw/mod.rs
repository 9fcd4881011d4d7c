//! Drawing property cases: each index's tier ([`tier`]) and its strategy, moved inside a
//! backend's space. One file per tier or family of draws; `draw` builds on `recipe` only.

pub mod budget;
pub mod covering;
pub mod extremes;
pub mod fields;
pub mod long;
pub mod long_masks;
pub mod mla;
pub mod pair;
pub mod precision;
pub mod production;
pub mod reach;
pub mod small;
pub mod tier;
pub mod trace;

use crate::pipeline::recipe::CaseRecipe;
use attn_reference::Space;
use budget::{fit_space, LONG_COST, SMALL_COST};
use long::{decode_batch, huge_cache, long_context};
use proptest::prelude::*;
use small::recipe;
use tier::{StrategyLimits, Tier};

/// The cost ceiling of property case `index`'s tier.
pub fn budget_of(index: usize, limits: StrategyLimits) -> usize {
    match Tier::of(index, limits) {
        Tier::Small => match crate::pipeline::draw::covering::covering_row(index, limits) {
            Some(_) => crate::pipeline::draw::covering::COVERING_COST,
            None if reach::reach_of(index, limits).is_some() => reach::REACH_COST,
            None => SMALL_COST,
        },
        Tier::LongContext | Tier::DecodeBatch | Tier::HugeCache => LONG_COST,
        Tier::BigStep => budget::BIG_STEP_COST,
        Tier::BigBatch => budget::BIG_BATCH_COST,
        Tier::Precision => crate::pipeline::draw::precision::PRECISION_COST,
    }
}

/// The strategy of property case `index` inside `space`: its [`Tier`]'s, each draw moved
/// inside the space ([`fit_space`]; shrinking maps through it too, so it never leaves).
/// Where the space has MLA, some indices draw MLA cases instead
/// ([`crate::pipeline::draw::mla::draws_mla`]); every other index draws what it always drew.
pub fn strategy_for(
    index: usize,
    limits: StrategyLimits,
    space: &Space,
) -> BoxedStrategy<CaseRecipe> {
    if crate::pipeline::draw::mla::draws_mla(index, limits, space) {
        return crate::pipeline::draw::mla::mla_strategy(index, limits, space);
    }
    let space = space.clone();
    let budget = budget_of(index, limits);
    tier_strategy(index, limits)
        .prop_map(move |r| fit_space(r, &space, budget))
        .boxed()
}

/// The strategy of property case `index` over the whole space.
fn tier_strategy(index: usize, limits: StrategyLimits) -> BoxedStrategy<CaseRecipe> {
    use crate::pipeline::draw::extremes::{big_batch, big_step, featured, long_features};
    let ordinal = index / limits.long_every.max(1);
    let budget = budget_of(index, limits);
    let with_features = |s: BoxedStrategy<CaseRecipe>, big: bool| {
        (s, long_features())
            .prop_map(move |(r, f)| featured(r, &f, ordinal, big, budget))
            .boxed()
    };
    match Tier::of(index, limits) {
        Tier::Small => match crate::pipeline::draw::covering::covering_row(index, limits) {
            Some(row) => crate::pipeline::draw::covering::covering_case(row, limits).boxed(),
            None => match reach::reach_of(index, limits) {
                Some((kind, turn)) => reach::reach_case(kind, turn),
                None => recipe(limits).boxed(),
            },
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
        Tier::DecodeBatch => match crate::pipeline::draw::extremes::flood_of(ordinal) {
            Some(flood) => flooded(with_features(big_batch(Some(flood)), false)),
            None => {
                let large =
                    crate::pipeline::draw::long_masks::mask_plan(ordinal) != Default::default();
                with_features(decode_batch(large).boxed(), false)
            }
        },
        Tier::HugeCache => huge_cache().boxed(),
        Tier::BigStep => with_features(big_step().boxed(), true),
        Tier::BigBatch => match crate::pipeline::draw::extremes::flood_of(ordinal) {
            Some(flood) => flooded(with_features(big_batch(Some(flood)), false)),
            None => with_features(big_batch(None), false),
        },
        Tier::Precision => {
            use crate::pipeline::draw::precision::{precision_case, PRECISION_EVERY};
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
