//! The far reaches of the case space, drawn into [`crate::pipeline::draw`]'s tiers: logits in the
//! tens of thousands, head groups up to 128, steps past 8,192 tokens and decode batches of
//! 512 to 2,048 sequences, batches in the scheduler's order, and features on long-tier cases
//! (so pairs such as sinks × window × a context past a split-KV boundary are reached by
//! design, not by luck).

use crate::pipeline::draw::budget::{fit_big_step, fit_cost, windowed_cost, SMALL_COST};
use crate::pipeline::draw::long::long_shape;
use crate::pipeline::draw::long_masks::{mask_plan, MaskPlan};
use crate::pipeline::recipe::{cost, CaseRecipe, LogitShift};
use attn_reference::{AttentionKind, Fp8KvCache, Space};
use proptest::prelude::*;

/// Shifts of the unscaled q·k: hundreds to a million (scaled, capped at 2e5), so logits pass
/// 1e4 and 1e5 and q·k passes f16's 65504.
pub fn logit_shift() -> impl Strategy<Value = LogitShift> {
    (
        prop::sample::select(vec![3e2f32, 3e3, 3e4, 7e4, 4e5, 1e6]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(dot, negative, alternate)| LogitShift {
            dot: if negative { -dot } else { dot },
            alternate,
            scattered: false,
        })
}

/// How a batch's decodes (query_len 1) and prefills are composed and ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOrder {
    /// As the sequences were drawn, independently.
    AsDrawn,
    /// Every sequence a decode.
    AllDecode,
    /// Every sequence a prefill (two query tokens or more).
    AllPrefill,
    /// vLLM's scheduler order: decodes first, then chunked prefills and fresh prompts; at
    /// least one of each where the batch has two sequences.
    DecodesFirst,
}

impl BatchOrder {
    pub fn apply(self, seqs: &mut [(usize, usize)]) {
        match self {
            BatchOrder::AsDrawn => {}
            BatchOrder::AllDecode => seqs.iter_mut().for_each(|s| s.1 = 1),
            BatchOrder::AllPrefill => seqs.iter_mut().for_each(|s| s.1 = s.1.max(2)),
            BatchOrder::DecodesFirst => {
                let n = seqs.len();
                if n >= 2 {
                    if seqs.iter().all(|s| s.1 != 1) {
                        seqs[0].1 = 1;
                    }
                    if seqs.iter().all(|s| s.1 == 1) {
                        seqs[n - 1].1 = 2 + seqs[n - 1].0 % 7;
                    }
                }
                // A stable sort: decodes keep their order, prefills theirs.
                seqs.sort_by_key(|s| s.1 != 1);
            }
        }
    }
}

pub fn batch_order() -> impl Strategy<Value = BatchOrder> {
    prop_oneof![
        5 => Just(BatchOrder::AsDrawn),
        2 => Just(BatchOrder::AllDecode),
        1 => Just(BatchOrder::AllPrefill),
        3 => Just(BatchOrder::DecodesFirst),
    ]
}

/// (kv heads, query heads per kv head) as large models set them: groups of 9 to 128
/// (granite-20b 48:1, Falcon-7B 71:1, MQA with 128 heads) and many kv heads with small
/// groups; never more than 128 query heads.
pub fn big_heads() -> impl Strategy<Value = (usize, usize)> {
    let groups = vec![9usize, 12, 16, 17, 24, 32, 48, 64, 71, 128];
    prop_oneof![
        3 => (prop::sample::select(groups), prop::sample::select(vec![1usize, 2, 4]))
            .prop_map(|(g, kv)| ((128 / g).min(kv).max(1), g)),
        1 => (prop::sample::select(vec![16usize, 32, 64, 128]), 1usize..=2)
            .prop_map(|(kv, g)| (kv.min(128 / g), g)),
    ]
}

/// `r` with `heads` = (kv heads, group), its lengths and head size cut (not its heads) until
/// it fits `budget`: what the big heads are drawn for must survive [`fit_cost`], which drops
/// heads first.
pub fn with_big_heads(mut r: CaseRecipe, (kv, group): (usize, usize), budget: usize) -> CaseRecipe {
    r.num_kv_heads = kv;
    r.group = group;
    // Models with big groups serve from CUDA graphs too.
    r.padded_requests = r
        .padded_requests
        .max(crate::pipeline::recipe::padded_requests_in_batches(
            r.values,
        ));
    while cost(&r) > budget {
        if r.head_size > 64 {
            r.head_size = 64;
        } else if let Some(q) = r.seqs.iter_mut().filter(|s| s.1 > 1).max_by_key(|s| s.1) {
            q.1 /= 2;
        } else if let Some(s) = r.seqs.iter_mut().filter(|s| s.0 > 0).max_by_key(|s| s.0) {
            s.0 /= 2;
        } else if r.head_size > 8 {
            r.head_size = 8;
        } else if r.seqs.len() > 1 {
            r.seqs.pop();
        } else {
            break;
        }
    }
    r
}

/// Features a long-tier case carries besides its shape.
#[derive(Clone, Debug)]
pub struct LongFeatures {
    window: Option<usize>,
    soft_cap: Option<f32>,
    alibi: bool,
    sinks: bool,
    kv_cache: Option<Fp8KvCache>,
    logits: Option<LogitShift>,
    heads: Option<(usize, usize)>,
    chunk: Option<usize>,
    masks: crate::pipeline::draw::long_masks::LongMasks,
}

/// Each feature on about half the time, so each of a handful of long cases of a tier
/// carries several and every feature meets every long shape.
pub fn long_features() -> impl Strategy<Value = LongFeatures> {
    (
        prop::option::of(prop::sample::select(vec![1usize, 64, 257, 513, 2048])),
        prop::option::of(prop::sample::select(vec![5.0f32, 30.0, 50.0])),
        any::<bool>(),
        any::<bool>(),
        prop::option::weighted(
            0.25,
            crate::pipeline::draw::fields::kv_cache_of_any_format(),
        ),
        prop::option::weighted(0.35, logit_shift()),
        prop::option::weighted(0.3, big_heads()),
        // Drawn last, so every feature above draws what it drew before local chunks.
        prop::option::weighted(
            0.25,
            prop::sample::select(vec![1usize, 63, 256, 1024, 8192]),
        ),
        // Drawn after local chunks, so every feature above draws what it drew before.
        crate::pipeline::draw::long_masks::long_masks(),
    )
        .prop_map(
            |(window, soft_cap, alibi, sinks, kv_cache, logits, heads, chunk, masks)| {
                LongFeatures {
                    window,
                    soft_cap,
                    alibi,
                    sinks,
                    kv_cache,
                    logits,
                    heads,
                    chunk,
                    masks,
                }
            },
        )
}

/// The attention kind of long-tier case `ordinal` (its index over `long_every`): half
/// decoder, a quarter each encoder-only and cross-attention, turning by one every cycle of
/// eight tiers so each tier meets the other kinds within a few cycles, whatever the seed.
pub fn long_kind(ordinal: usize) -> AttentionKind {
    match (ordinal + ordinal / 8) % 4 {
        2 => AttentionKind::EncoderOnly,
        3 => AttentionKind::EncoderDecoder,
        _ => AttentionKind::Decoder,
    }
}

impl LongFeatures {
    /// `r` with these features and `kind`; big heads only where smaller head sizes fit them
    /// within `budget` by `cost` (the tier's lengths are what it is about).
    pub fn apply(
        &self,
        mut r: CaseRecipe,
        kind: AttentionKind,
        masks: MaskPlan,
        budget: usize,
        cost: fn(&CaseRecipe) -> usize,
    ) -> CaseRecipe {
        r.kind = kind;
        match kind {
            AttentionKind::EncoderOnly => {
                // The whole sequence is the query: a long one costs its square (and backends
                // that build a dense mask, its square in memory).
                for s in &mut r.seqs {
                    s.1 = (s.0 + s.1).min(5_000);
                }
                r.head_size = r.head_size.min(2);
                r.share = None;
            }
            AttentionKind::EncoderDecoder => r.share = None,
            AttentionKind::Decoder => {}
        }
        if r.window.is_none() {
            r.window = self.window;
        }
        r.chunk = self.chunk;
        // After the window and chunk: R-SWA takes the window's place, look-back needs chunks.
        r = self.masks.apply(r, masks);
        r.soft_cap = self.soft_cap;
        r.alibi = self.alibi;
        r.sinks = self.sinks;
        r.kv_cache = self.kv_cache.clone();
        // A shift the tier drew for itself (big batches) stays unless the features draw one.
        // Long query chunks scatter an alternating shift over their rows, so rows a tile's
        // half apart (64, say) have maxima far apart too.
        let scattered = self.logits.map(|l| LogitShift {
            scattered: l.alternate,
            ..l
        });
        r.logits = scattered.or(r.logits);
        if let Some((kv, group)) = self.heads {
            let mut big = CaseRecipe {
                num_kv_heads: kv,
                group,
                ..r.clone()
            };
            while cost(&big) > budget && big.head_size > 1 {
                big.head_size /= 2;
            }
            if cost(&big) <= budget {
                r = big;
            }
        }
        // The kind may give a feature no meaning (a window in cross-attention).
        r.without_kind_mismatches()
    }
}

/// Prefill chunks of 8,193 to 32,768 tokens (one or two sequences, behind decodes in the
/// scheduler's order sometimes), as engines run them: kernels that size a grid for 8,192
/// tokens skip the rest. Cut to [`BIG_STEP_COST`] by the window, head size and context; the chunk
/// stays past 8,192. The chunks are windowed: a causal chunk of 8,193 tokens alone is 3·10^7
/// pairs, past what the default run affords per case.
pub fn big_step() -> impl Strategy<Value = CaseRecipe> {
    let chunk = prop_oneof![3 => 8_193usize..=8_400, 1 => 8_401usize..=32_768];
    // Behind none, a few, or hundreds of decodes (a large mixed batch).
    let decodes = prop_oneof![2 => Just(0usize), 1 => 1usize..=16, 1 => 65usize..=600];
    (
        long_shape(),
        chunk,
        0usize..=8_192,
        decodes,
        prop::sample::select(vec![1usize, 16, 64, 257]),
        any::<u64>(),
    )
        .prop_map(|(shape, chunk, context, decodes, window, seed)| {
            let mut seqs: Vec<(usize, usize)> = (0..decodes).map(|i| (i * 37 % 300, 1)).collect();
            seqs.push((context, chunk));
            let mut r = crate::pipeline::draw::long::long_base(shape, seqs, seed);
            r.window = Some(window);
            r
        })
}

/// A big batch that is all decodes and past 8,192 tokens, as a server at full load steps: a
/// kernel (or a launch grid, or a CUDA-graph size) sized for 8,192 decode tokens does nothing
/// for the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flood {
    /// 8,193 to 9,000 decodes of one token.
    Plain,
    /// Speculative decodes of 2 to 5 tokens each (1 + the drafts), 8,193 tokens or more.
    Speculative,
}

/// The flood long-tier case `ordinal` draws, if any: in every cycle of 32 long ordinals the
/// first decode batch (ordinal 1) and the first big batch (ordinal 5), both decoders in a
/// default run.
pub fn flood_of(ordinal: usize) -> Option<Flood> {
    match ordinal % 32 {
        1 => Some(Flood::Plain),
        5 => Some(Flood::Speculative),
        _ => None,
    }
}

/// Decode batches of 512 to 2,048 sequences over short contexts, as engines batch them (some
/// with a long context among them, some with prefills behind the decodes); or a [`Flood`].
pub fn big_batch(flood: Option<Flood>) -> BoxedStrategy<CaseRecipe> {
    match flood {
        None => ordinary_big_batch().boxed(),
        Some(f) => flood_batch(f).boxed(),
    }
}

fn ordinary_big_batch() -> impl Strategy<Value = CaseRecipe> {
    let context = || prop_oneof![12 => 0usize..=32, 1 => 4_097usize..=5_000];
    (
        long_shape(),
        prop::collection::vec((context(), Just(1usize)), 512..=2_048),
        prop::option::weighted(
            0.4,
            prop::collection::vec((0usize..=64, 2usize..=64), 1..=3),
        ),
        any::<u64>(),
    )
        .prop_map(|(shape, mut seqs, prefills, seed)| {
            seqs.extend(prefills.unwrap_or_default());
            batch_of(shape, seqs, seed)
        })
}

/// An all-decode step past 8,192 tokens over short contexts (the step's size is the point);
/// the speculative one, of fewer requests, has a long context among them as big batches do.
fn flood_batch(flood: Flood) -> impl Strategy<Value = CaseRecipe> {
    let width = match flood {
        Flood::Plain => Just(1usize).boxed(),
        Flood::Speculative => (2usize..=5).boxed(),
    };
    (long_shape(), width, 0usize..=800, any::<u64>()).prop_flat_map(
        move |(shape, width, extra, seed)| {
            let n = 8_192 / width + 1 + extra;
            let context = match flood {
                Flood::Plain => (0usize..=32).boxed(),
                Flood::Speculative => {
                    prop_oneof![12 => 0usize..=32, 1 => 4_097usize..=5_000].boxed()
                }
            };
            prop::collection::vec((context, Just(width)), n..=n)
                .prop_map(move |seqs| batch_of(shape, seqs, seed))
        },
    )
}

/// A big batch of `seqs`: padded requests in one in two, extreme logits in one in two, small
/// heads.
fn batch_of(
    shape: crate::pipeline::draw::long::LongShape,
    seqs: Vec<(usize, usize)>,
    seed: u64,
) -> CaseRecipe {
    let mut r = crate::pipeline::draw::long::long_base(shape, seqs, seed);
    r.padded_requests = crate::pipeline::recipe::padded_requests_in_batches(r.values);
    // One big batch in two with extreme logits (past 1e4 once scaled), alternating
    // rows, as outliers do.
    if seed % 2 == 1 {
        r.logits = Some(LogitShift {
            dot: if seed % 4 == 1 { 2e5 } else { -4e5 },
            alternate: true,
            scattered: false,
        });
    }
    // Thousands of sequences: small heads keep the tensors (and their drawing) cheap.
    r.head_size = r.head_size.min(16);
    r
}

/// A long-tier recipe with `features` on, within `budget`; big steps (`big`) keep their chunk.
pub fn featured(
    r: CaseRecipe,
    features: &LongFeatures,
    ordinal: usize,
    big: bool,
    budget: usize,
) -> CaseRecipe {
    if big {
        let r = features.apply(
            r,
            long_kind(ordinal),
            mask_plan(ordinal),
            budget,
            windowed_cost,
        );
        let mut r = fit_big_step(r, budget);
        if windowed_cost(&r) > budget {
            // PrefixLM ranges see past the window, and fitting cuts neither them nor the
            // chunk below 8,193 tokens: where they are still over the budget, they go.
            r.prefix_lm = None;
            r = fit_big_step(r, budget);
        }
        r
    } else {
        let r = features.apply(r, long_kind(ordinal), mask_plan(ordinal), budget, cost);
        fit_cost(r, budget, &Space::default())
    }
}

/// A small-tier recipe with the extremes drawn for it: the scheduler's batch order, big
/// heads (cut to fit the small budget), a logit shift.
pub fn small_extremes(
    mut r: CaseRecipe,
    order: BatchOrder,
    heads: Option<(usize, usize)>,
    logits: Option<LogitShift>,
) -> CaseRecipe {
    if r.kind != AttentionKind::EncoderOnly {
        order.apply(&mut r.seqs);
    }
    r.logits = logits;
    match heads {
        Some(h) => with_big_heads(r, h, SMALL_COST),
        None => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::draw::budget::BIG_STEP_COST;
    use crate::pipeline::recipe::Values;

    #[test]
    fn decodes_first_puts_decodes_first_and_mixes() {
        let mut s = vec![(3, 4), (5, 1), (2, 2), (7, 1)];
        BatchOrder::DecodesFirst.apply(&mut s);
        assert_eq!(s, vec![(5, 1), (7, 1), (3, 4), (2, 2)]);
        let mut all = vec![(3, 1), (5, 1)];
        BatchOrder::DecodesFirst.apply(&mut all);
        assert_eq!(all.iter().filter(|s| s.1 == 1).count(), 1);
        assert_eq!(all[0].1, 1);
    }

    #[test]
    fn a_logit_shift_keeps_the_case_valid_and_its_softmax() {
        let plain = CaseRecipe {
            head_size: 4,
            seqs: vec![(6, 3), (2, 1)],
            values: Values::Normal { seed: 9, std: 1.0 },
            ..CaseRecipe::plain()
        };
        let shifted = CaseRecipe {
            logits: Some(LogitShift {
                dot: -3e4,
                alternate: true,
                scattered: false,
            }),
            ..plain.clone()
        };
        let case = shifted.build();
        assert_eq!(case.validate(), Ok(()));
        // Every key shares the shifted dimension: the rows' maxima are far apart.
        let b = case.tensors.context_key[0][0];
        assert!(b.is_finite() && b > 100.0);
        assert!(case.tensors.context_key[0].chunks(4).all(|k| k[0] == b));
    }

    #[test]
    fn the_small_tier_draws_big_groups_logit_shifts_and_every_batch_order() {
        use crate::pipeline::draw::small::recipe;
        use crate::pipeline::draw::tier::StrategyLimits;
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let s = recipe(StrategyLimits::DEFAULT);
        let rs: Vec<CaseRecipe> = (0..400)
            .map(|_| s.new_tree(&mut runner).unwrap().current())
            .collect();
        assert!(rs.iter().any(|r| r.group > 16));
        assert!(rs.iter().any(|r| r.num_heads() > 32));
        assert!(rs
            .iter()
            .all(|r| r.num_heads() <= 128 && cost(r) <= SMALL_COST));
        assert!(rs.iter().any(|r| r.logits.is_some_and(|l| l.alternate)));
        let decoders = || rs.iter().filter(|r| r.kind == AttentionKind::Decoder);
        assert!(decoders().any(|r| r.seqs.len() > 2 && r.seqs.iter().all(|s| s.1 == 1)));
        assert!(decoders().any(|r| r.seqs.len() > 2 && r.seqs.iter().all(|s| s.1 > 1)));
        assert!(decoders().any(|r| {
            let d: Vec<bool> = r.seqs.iter().map(|s| s.1 == 1).collect();
            d.contains(&true) && d.contains(&false) && d.windows(2).all(|w| w[0] || !w[1])
        }));
    }

    #[test]
    fn big_steps_stay_past_8192_tokens_within_the_long_budget() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        for _ in 0..40 {
            let r = big_step().new_tree(&mut runner).unwrap().current();
            let r = fit_big_step(r, BIG_STEP_COST);
            assert!(windowed_cost(&r) <= BIG_STEP_COST, "{r:?}");
            assert!(r.seqs.iter().any(|s| s.1 > 8_192), "{:?}", r.seqs);
        }
    }
}
