//! Three-way coverage of the shape factors ([`attn_results::triples`]): what class of each
//! factor a case is in, and the covering draw that puts every valid triple of classes into
//! a default run. The small-tier cases at even indices from case 100 on are the covering
//! array's rows, in order (its 82 rows end near case 300 of 500); every other case draws
//! freely.
//!
//! A covering case is a small-tier recipe (its features, values, table order and padding
//! drawn as ever) with the row's dtype, head size, block size, kind, step shape and longest
//! sequence imposed, its heads cut to fit [`COVERING_COST`].

use crate::pipeline::draw::tier::{StrategyLimits, Tier};
use crate::pipeline::recipe::{cost, CaseRecipe};
use attn_reference::{AttentionKind, Case, DType, Feature, InputRng, Space};
use attn_results::triples::{covering_array, Levels, FACTORS};
use proptest::prelude::*;
use std::sync::OnceLock;

/// A covering case's cost ceiling ([`cost`]): four times the small tier's, for one
/// encoder-only sequence past 512 tokens at head size 256.
pub const COVERING_COST: usize = 4 * crate::pipeline::draw::budget::SMALL_COST;

/// The covering array's rows, built once.
fn rows() -> &'static [Levels] {
    static ROWS: OnceLock<Vec<Levels>> = OnceLock::new();
    ROWS.get_or_init(covering_array)
}

/// The first property case that may be a covering row: the hundred before it draw freely,
/// as they always have (where most first kills are made, and all of a `--cases 100` run).
pub const COVERING_FROM: usize = 100;

/// The row property case `index` draws, if it is one of the first small-tier cases at even
/// indices from [`COVERING_FROM`] on (MLA's slots are odd: every backend's run numbers rows
/// alike, whatever its space).
pub fn covering_row(index: usize, limits: StrategyLimits) -> Option<usize> {
    let slot = |j: usize| j.is_multiple_of(2) && Tier::of(j, limits) == Tier::Small;
    if index < COVERING_FROM || !slot(index) {
        return None;
    }
    let row = (COVERING_FROM..index).filter(|&j| slot(j)).count();
    (row < rows().len()).then_some(row)
}

/// Covering case `row`: the small tier's draw with the row's classes imposed, and, on
/// decoder rows, the rare draws the rows displace (a big group, a logit shift, one of vLLM
/// 0.33's masks) by turns, so the pairs the free small cases held stay held.
pub fn covering_case(row: usize, limits: StrategyLimits) -> impl Strategy<Value = CaseRecipe> {
    let levels = rows()[row];
    crate::pipeline::draw::small::recipe(limits)
        .prop_map(move |r| with_turns(impose(r, levels), row))
}

/// Decoder row `row`'s turn of a big group (every third), a logit shift (every fourth, and
/// every row with a query chunk past 64 rows) and one of the masks (look-back, non-causal,
/// PrefixLM, R-SWA: four rows in five), where the cost allows.
fn with_turns(mut r: CaseRecipe, row: usize) -> CaseRecipe {
    use crate::pipeline::recipe::{RangesRecipe, RswaRecipe};
    if r.kind != AttentionKind::Decoder {
        return r;
    }
    if row.is_multiple_of(3) {
        let big = CaseRecipe {
            num_kv_heads: 1,
            group: 16,
            ..r.clone()
        };
        if cost(&big) <= COVERING_COST {
            r = big;
        }
    }
    if row % 4 == 1 || r.seqs.iter().any(|&(_, q)| q > 64) {
        // Scattered over the rows, so a chunk's rows 64 apart have maxima far apart (every
        // row with a chunk past 64 rows takes it).
        r.logits = Some(crate::pipeline::recipe::LogitShift {
            dot: 3e4,
            alternate: true,
            scattered: true,
        });
    }
    let longest = r.seqs.iter().map(|&(c, q)| c + q).max().unwrap_or(1);
    match row % 5 {
        1 => {
            r.chunk = Some(longest.div_ceil(3).max(1));
            r.lookback = Some(1);
        }
        2 => r.non_causal = Some(u64::MAX),
        3 => {
            r.rswa = None;
            r.prefix_lm = Some(RangesRecipe {
                spans: vec![(200, 600)],
                seqs: u64::MAX,
                clamp: false,
            });
        }
        4 => {
            r.window = None;
            r.prefix_lm = None;
            r.rswa = Some(RswaRecipe::with_longest_prefix(
                longest.div_ceil(4),
                &r.seqs,
                500,
            ));
        }
        _ => {}
    }
    // One mask row in three without an FP8 cache of its own gets one with scales per kv
    // head or per token, by turns, so each mask meets each scale granularity.
    if row % 3 == 2 && !row.is_multiple_of(5) && r.kv_cache.is_none() {
        let mut rng = InputRng::new(row as u64);
        let mut pick = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
        let top = 2 + (row / 15 % 2) as u64;
        let plain = attn_reference::Fp8KvCache::new(attn_reference::Fp8Format::E4m3, 1.0, 1.0);
        r.kv_cache = Some(crate::pipeline::draw::fields::scale_granularity(
            plain, top, &mut pick,
        ));
    }
    r.without_kind_mismatches()
}

fn impose(mut r: CaseRecipe, levels: Levels) -> CaseRecipe {
    let level = |f: usize| FACTORS[f].1[levels[f]];
    let mut rng = InputRng::new(r.values.seed() ^ 0xC0_7E_21);
    let mut one_of = |v: &[usize]| v[rng.below(v.len() as u64) as usize];
    r.dtype = [DType::F32, DType::Bf16, DType::F16][levels[0]];
    r.head_size = match level(1) {
        "up to 32" if r.head_size <= 32 => r.head_size,
        "up to 32" => one_of(&[4, 8, 13, 16, 32]),
        "33-127" => one_of(&[40, 64, 80, 96]),
        "128" => 128,
        _ => one_of(&[192, 256, 256]),
    };
    r.block_size = match level(2) {
        "1-15" if r.block_size < 16 => r.block_size,
        "1-15" => one_of(&[1, 2, 5, 8]),
        "16-31" => 16,
        "32-63" => 32,
        _ => one_of(&[64, 128]),
    };
    r.kind = [
        AttentionKind::Decoder,
        AttentionKind::EncoderOnly,
        AttentionKind::EncoderDecoder,
    ][levels[3]];
    // The longest sequence's length in its class; prefills of 9 tokens and more fit in all.
    let longest = match level(5) {
        "up to 32 keys" => one_of(&[9, 17, 24, 32]),
        "33-512 keys" => one_of(&[33, 40, 100, 257, 512]),
        _ => one_of(&[513, 520, 540]),
    };
    let shape = level(4);
    let n = r.seqs.len().clamp(if shape == "mixed" { 2 } else { 1 }, 4);
    r.seqs = (0..n)
        .map(|s| {
            let len = if s == 0 {
                longest
            } else {
                one_of(&[1, 9, 16, 33]).min(longest)
            };
            let query = match (shape, s) {
                ("decode", _) | ("mixed", 1) => 1,
                ("spec-decode", 0) => one_of(&[2, 4, 8]),
                ("spec-decode", _) => one_of(&[1, 2, 3, 8]),
                // Past 64 rows too: the halves of a 128-row query tile.
                ("mixed", 0) | ("prefill", _) => one_of(&[9, 16, 33, 96]),
                _ => one_of(&[1, 2, 9, 16]),
            };
            match r.kind {
                // One prefill of the whole sequence.
                AttentionKind::EncoderOnly => (0, len),
                // The encoder's length is the context; decoder tokens come on their own.
                AttentionKind::EncoderDecoder => (len, query),
                AttentionKind::Decoder => {
                    let len = len.max(if query > 8 { 9 } else { 1 });
                    let query = query.min(len);
                    (len - query, query)
                }
            }
        })
        .collect();
    // Prefix sharing lengthens contexts past their class; MLA keeps its own shapes.
    r.share = None;
    r.mla = None;
    r = r.without_kind_mismatches();
    // Kv heads go first, then the other sequences, then the group (a big group is rare,
    // and what some pairs need): the row's classes stay.
    while cost(&r) > COVERING_COST && r.num_kv_heads > 1 {
        r.num_kv_heads /= 2;
    }
    while cost(&r) > COVERING_COST && r.seqs.len() > if shape == "mixed" { 2 } else { 1 } {
        r.seqs.pop();
    }
    while cost(&r) > COVERING_COST && r.group > 1 {
        r.group /= 2;
    }
    r
}

/// The head-size class of head size `d`.
fn head_class(d: usize) -> &'static str {
    match d {
        0..=32 => "up to 32",
        33..=127 => "33-127",
        128 => "128",
        _ => "above 128",
    }
}

/// The block-size class of block size `b`.
fn block_class(b: usize) -> &'static str {
    match b {
        0..=15 => "1-15",
        16..=31 => "16-31",
        32..=63 => "32-63",
        _ => "64 and above",
    }
}

/// The shape classes of `case` (the dtype is its own dimension), as coverage buckets.
pub fn shape_buckets(case: &Case) -> [(&'static str, &'static str); 5] {
    let c = &case.config;
    let (head, block) = (head_class(c.head_size), block_class(c.block_size));
    let kind = match c.kind {
        AttentionKind::Decoder => "decoder",
        AttentionKind::EncoderOnly => "encoder-only",
        AttentionKind::EncoderDecoder => "cross-attention",
    };
    let queries: Vec<usize> = case.batch.scheduled_query_lens().collect();
    let step = if c.kind == AttentionKind::EncoderOnly || queries.iter().all(|&q| q > 8) {
        "prefill"
    } else if queries.iter().all(|&q| q == 1) {
        "decode"
    } else if queries.iter().all(|&q| q <= 8) {
        "spec-decode"
    } else {
        "mixed"
    };
    let longest = case.batch.seq_lens.iter().copied().max().unwrap_or(0);
    let context = match longest {
        0..=32 => "up to 32 keys",
        33..=512 => "33-512 keys",
        _ => "above 512 keys",
    };
    [
        ("head-size class", head),
        ("block-size class", block),
        ("kind", kind),
        ("step shape", step),
        ("context class", context),
    ]
}

/// The shape classes outside `space`: head and block sizes it allows none of, kinds it
/// refuses, contexts past its longest sequence.
pub fn shape_not_declared(space: &Space) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    // The levels of `dim` that none of the space's `values` falls in (none when it allows all).
    let unreached =
        |dim: &'static str, values: Option<Vec<usize>>, class: fn(usize) -> &'static str| {
            let levels = FACTORS
                .iter()
                .find(|(d, _)| *d == dim)
                .map_or(&[][..], |f| f.1);
            values.map_or_else(Vec::new, |v| {
                levels
                    .iter()
                    .filter(|l| !v.iter().any(|&x| class(x) == **l))
                    .map(|l| (dim, *l))
                    .collect::<Vec<_>>()
            })
        };
    out.extend(unreached(
        "head-size class",
        space.head_size_values(),
        head_class,
    ));
    out.extend(unreached(
        "block-size class",
        space.block_size_values(),
        block_class,
    ));
    if !space.allows_feature(Feature::EncoderOnly) {
        out.push(("kind", "encoder-only"));
    }
    if !space.allows_feature(Feature::CrossAttention) {
        out.push(("kind", "cross-attention"));
    }
    match space.max_seq_len {
        Some(m) if m <= 32 => out.extend([
            ("context class", "33-512 keys"),
            ("context class", "above 512 keys"),
        ]),
        Some(m) if m <= 512 => out.push(("context class", "above 512 keys")),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_results::triples::levels_of;
    use proptest::strategy::ValueTree;

    #[test]
    fn every_covering_case_holds_its_rows_classes_within_its_budget() {
        let limits = StrategyLimits::DEFAULT;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        for _ in 0..3 {
            for (row, levels) in rows().iter().enumerate() {
                let r = covering_case(row, limits)
                    .new_tree(&mut runner)
                    .unwrap()
                    .current();
                let case = r.build();
                case.validate().unwrap();
                let mut buckets = vec![("dtype", case.config.dtype.name())];
                buckets.extend(shape_buckets(&case));
                assert_eq!(levels_of(&buckets), Some(*levels), "row {row}: {r:?}");
                assert!(cost(&r) <= COVERING_COST, "row {row}: {}", cost(&r));
            }
        }
    }

    #[test]
    fn the_rows_are_even_small_cases_of_a_default_run() {
        let limits = StrategyLimits::DEFAULT;
        let drawn: Vec<usize> = (0..crate::pipeline::check::DEFAULT_CASES as usize)
            .filter_map(|i| covering_row(i, limits))
            .collect();
        assert_eq!(drawn, (0..rows().len()).collect::<Vec<_>>());
        assert_eq!(covering_row(1, limits), None);
    }
}
