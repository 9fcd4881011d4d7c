//! vLLM 0.33's masks (chunk look-back, non-causal requests, PrefixLM ranges, R-SWA) on
//! long-tier cases: which ones a case carries is a fixed plan by its ordinal, so each mask
//! meets each long shape (a long context, a big step, a large batch) in every default run,
//! whatever the seed; their parameters are drawn.

use crate::pipeline::recipe::{CaseRecipe, RangesRecipe, RswaRecipe};
use attn_reference::AttentionKind;
use proptest::prelude::*;

/// The masks one long-tier case carries (a decoder's; other kinds give them no meaning).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskPlan {
    pub non_causal: bool,
    pub prefix_lm: bool,
    pub rswa: bool,
    pub lookback: bool,
}

const fn plan(non_causal: bool, prefix_lm: bool, rswa: bool, lookback: bool) -> MaskPlan {
    MaskPlan {
        non_causal,
        prefix_lm,
        rswa,
        lookback,
    }
}

/// The plan by ordinal modulo [`PLAN_CYCLE`], for the decoder ordinals of
/// [`crate::pipeline::draw::long_masks::long_kind`] (the tier in a comment: LC a long context, DB a decode
/// batch, BS a big step, BB a big batch). A default run's 20 long cases are ordinals 0-19:
/// every mask meets every long shape there. PrefixLM and R-SWA never share a case (the case
/// model refuses both), so the large batches hold them in turn (ordinals 1 and 5). Some
/// decoder cases carry none: the long shapes' plain paths stay drawn.
const PLANS: &[(usize, MaskPlan)] = &[
    (0, plan(true, true, false, false)),   // LC
    (1, plan(false, false, true, true)),   // DB, past 64 sequences
    (4, plan(true, true, false, true)),    // BS
    (5, plan(true, true, false, true)),    // BB
    (8, plan(false, false, true, true)),   // LC
    (12, plan(false, false, true, false)), // BS
    (22, plan(true, false, false, false)), // LC
    (23, plan(true, false, true, false)),  // BS
    (25, plan(false, true, false, true)),  // DB, past 64 sequences
    (29, plan(true, false, true, false)),  // BB
    (30, plan(false, true, false, true)),  // LC
];

/// The cycle of [`crate::pipeline::draw::long_masks::long_kind`] and the long tiers together.
pub const PLAN_CYCLE: usize = 32;

/// The masks long-tier case `ordinal` carries.
pub fn mask_plan(ordinal: usize) -> MaskPlan {
    PLANS
        .iter()
        .find(|(o, _)| *o == ordinal % PLAN_CYCLE)
        .map_or(MaskPlan::default(), |(_, p)| *p)
}

/// The drawn parameters of every mask; [`MaskPlan`] says which a case uses.
#[derive(Clone, Debug)]
pub struct LongMasks {
    lookback: usize,
    /// The chunk when the case drew none of its own.
    lookback_chunk: usize,
    non_causal: u64,
    prefix_lm: RangesRecipe,
    rswa_window: usize,
    /// The longest sequence's R-SWA prefix, in thousandths of its length.
    rswa_prefix: u16,
}

/// Image-sized PrefixLM ranges: one to three spans of at most 4% of a sequence each (256 to
/// 1,600 tokens at 8k to 40k keys, as Gemma's image spans), so a range's bidirectional
/// square stays within a long case's budget.
fn image_spans() -> impl Strategy<Value = RangesRecipe> {
    (
        prop::collection::vec((0u16..=960, 0u16..=40), 1..=3),
        prop_oneof![1 => Just(u64::MAX), 2 => 1u64..=u64::MAX],
        prop::bool::weighted(0.33),
    )
        .prop_map(|(mut spans, seqs, clamp)| {
            spans.sort_unstable();
            RangesRecipe {
                spans: spans.into_iter().map(|(a, w)| (a, a + w)).collect(),
                seqs,
                clamp,
            }
        })
}

pub fn long_masks() -> impl Strategy<Value = LongMasks> {
    (
        1usize..=3,
        prop::sample::select(vec![63usize, 256, 1024, 8192]),
        prop_oneof![Just(u64::MAX), 1u64..=u64::MAX],
        image_spans(),
        prop::sample::select(vec![1usize, 64, 257, 4096]),
        0u16..=40,
    )
        .prop_map(
            |(lookback, lookback_chunk, non_causal, prefix_lm, rswa_window, rswa_prefix)| {
                LongMasks {
                    lookback,
                    lookback_chunk,
                    non_causal,
                    prefix_lm,
                    rswa_window,
                    rswa_prefix,
                }
            },
        )
}

impl LongMasks {
    /// `r` with the masks `plan` names (decoders only). R-SWA takes the place of the case's
    /// sliding window (its window, where it has one: a big step's stays short); look-back
    /// needs local chunks, and draws a chunk where the case has none.
    pub fn apply(&self, mut r: CaseRecipe, plan: MaskPlan) -> CaseRecipe {
        if r.kind != AttentionKind::Decoder {
            return r;
        }
        if plan.lookback {
            r.chunk = r.chunk.or(Some(self.lookback_chunk));
            r.lookback = Some(self.lookback);
        }
        if plan.non_causal {
            r.non_causal = Some(self.non_causal);
        }
        if plan.prefix_lm {
            r.prefix_lm = Some(self.prefix_lm.clone());
        }
        if plan.rswa && !plan.prefix_lm {
            let window = r.window.take().unwrap_or(self.rswa_window);
            r.rswa = Some(RswaRecipe::with_longest_prefix(
                window,
                &r.seqs,
                self.rswa_prefix,
            ));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::draw::extremes::long_kind;
    use crate::pipeline::draw::tier::{StrategyLimits, Tier};

    /// In ordinals 0-19 (a default run's long cases), every mask meets a long context, a big
    /// step and a large batch on a decoder, and PrefixLM never meets R-SWA.
    #[test]
    fn a_default_runs_long_cases_plan_every_mask_with_every_long_shape() {
        let limits = StrategyLimits::DEFAULT;
        let every = limits.long_every;
        let mut met = std::collections::HashSet::new();
        for ordinal in 0..20 {
            let p = mask_plan(ordinal);
            assert!(!(p.prefix_lm && p.rswa), "ordinal {ordinal}");
            if p != MaskPlan::default() {
                assert_eq!(long_kind(ordinal), AttentionKind::Decoder, "{ordinal}");
            }
            let tier = Tier::of(ordinal * every + every / 2, limits);
            // A big step's chunk and a big batch's outliers are long contexts too.
            let shapes: &[&str] = match tier {
                Tier::LongContext => &["long"],
                Tier::BigStep => &["long", "step"],
                Tier::DecodeBatch => &["batch"],
                Tier::BigBatch => &["batch"],
                _ => &[],
            };
            for (on, mask) in [
                (p.non_causal, "non-causal"),
                (p.prefix_lm, "prefix"),
                (p.rswa, "rswa"),
                (p.lookback, "lookback"),
            ] {
                for s in shapes.iter().filter(|_| on) {
                    met.insert((mask, *s));
                }
            }
        }
        for mask in ["non-causal", "prefix", "rswa", "lookback"] {
            for shape in ["long", "step", "batch"] {
                assert!(met.contains(&(mask, shape)), "{mask} × {shape}");
            }
        }
    }
}
