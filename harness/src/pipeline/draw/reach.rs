//! The corners production meets and free draws almost never do, drawn by turns at one small-
//! tier index in ten from case [`REACH_FROM`] on (clear of the precision, MLA and covering
//! slots), so every default run holds each:
//! - **a shared-prefix crowd**: 8 to 64 requests behind one prefix of 256 to 4,096 tokens
//!   (shared as vLLM's prefix cache shares it, in full blocks, each request's own tokens
//!   after it, ending on a block edge or not), beside 1 to 3 requests that share nothing;
//!   decodes or short chunks; with a window, ALiBi or sinks by turns (what turns cascade
//!   attention off), or none. Cascade kernels take their own path for this (vLLM's earlier
//!   releases from 8 sharers of 256 tokens; FlashInfer's multi-level cascade).
//! - **odd pages under long decodes**: decodes spanning 3 to 8 pages of a block size up to
//!   64, past 64 and a multiple of it, or past 64 and not one (96, 160, 208, 255: hybrid
//!   models align attention pages with mamba state), by turns over the three dtypes. A kernel
//!   that floors its tiles per page misreads every page's tail, seen only over several pages.
//! - **big odd head groups at decode**: 17 to 56 query heads per kv head, most not a
//!   multiple of 16, over 2 to 4 kv heads (at most 128 query heads), every request a decode: a head tile that crosses a
//!   group boundary reads the neighbouring kv head only on the decode path.
//! - **a long query chunk with far-apart maxima**: one chunk of 65 to 192 rows over a context,
//!   its rows' logits shifted apart (weights 1, ⅓, −⅓, −1 by row), so the rows of both halves
//!   of a 128-row tile hold maxima hundreds apart.

use super::budget::{fit_cost, SMALL_COST};
use super::tier::{StrategyLimits, Tier};
use crate::pipeline::recipe::{CaseRecipe, LogitShift, Share, TableOrder, Values};
use attn_reference::{DType, Space};
use proptest::prelude::*;

/// The first property case that may be a reach case (the first hundred stay free draws, as
/// a `--cases 100` run gets them).
pub const REACH_FROM: usize = 100;
/// One index in this many, at [`REACH_AT`], is a reach case (if of the small tier).
pub const REACH_EVERY: usize = 10;
pub const REACH_AT: usize = 3;
/// A reach case's cost ceiling: a crowd of 64 over 4k keys under one head of 32.
pub const REACH_COST: usize = 3 * SMALL_COST;

/// The kinds of reach case, taken by turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    Crowd,
    OddPages,
    OddGroups,
    WideChunk,
}

const TURNS: [Reach; 4] = [
    Reach::Crowd,
    Reach::OddPages,
    Reach::OddGroups,
    Reach::WideChunk,
];

/// The reach case property case `index` is, and its ordinal among them; None for others.
pub fn reach_of(index: usize, limits: StrategyLimits) -> Option<(Reach, usize)> {
    if index < REACH_FROM
        || index % REACH_EVERY != REACH_AT
        || Tier::of(index, limits) != Tier::Small
    {
        return None;
    }
    let ordinal = (index - REACH_FROM) / REACH_EVERY;
    Some((TURNS[ordinal % TURNS.len()], ordinal / TURNS.len()))
}

/// Block sizes by class: up to 64, past 64 and a multiple of 64, past 64 and not.
pub const PAGE_CLASSES: [&[usize]; 3] = [&[16, 32, 64], &[128, 192, 256], &[96, 160, 208, 255]];

/// Reach case `turn` of kind `reach`.
pub fn reach_case(reach: Reach, turn: usize) -> BoxedStrategy<CaseRecipe> {
    match reach {
        Reach::Crowd => crowd(turn).boxed(),
        Reach::OddPages => odd_pages(turn).boxed(),
        Reach::OddGroups => odd_groups().boxed(),
        Reach::WideChunk => wide_chunk().boxed(),
    }
}

/// A plain decoder recipe of few heads over normal values, its blocks permuted.
fn base(seed: u64, dtype: DType) -> CaseRecipe {
    CaseRecipe {
        dtype,
        table: TableOrder::Permuted(seed),
        values: Values::Normal { seed, std: 1.0 },
        ..CaseRecipe::plain()
    }
}

fn crowd(turn: usize) -> impl Strategy<Value = CaseRecipe> {
    // The sharer counts by turns: 5-16 and past 16 (the coverage buckets), from 8 up.
    let sharers = if turn.is_multiple_of(2) {
        8usize..=16
    } else {
        17usize..=64
    };
    (
        sharers,
        256usize..=4096,
        prop::sample::select(vec![16usize, 32, 64]),
        prop::collection::vec(
            (0usize..=40, prop_oneof![4 => Just(1usize), 1 => 2usize..=6]),
            64,
        ),
        prop::collection::vec((0usize..=600, 1usize..=8), 1..=3),
        prop::sample::select(DType::ALL.to_vec()),
        (1usize..=2, prop::sample::select(vec![16usize, 32, 64])),
        any::<u64>(),
    )
        .prop_map(
            move |(n, prefix, bs, own, others, dtype, (group, head_size), seed)| {
                let blocks = prefix / bs;
                let mut seqs: Vec<(usize, usize)> = own[..n]
                    .iter()
                    .map(|&(extra, q)| (blocks * bs + extra, q))
                    .collect();
                seqs.extend(others);
                let mut r = CaseRecipe {
                    group,
                    head_size,
                    block_size: bs,
                    seqs,
                    share: Some(Share { group: n, blocks }),
                    ..base(seed, dtype)
                };
                // What turns cascade attention off, by turns.
                match turn / 2 % 4 {
                    1 => r.window = Some(64 + (seed % 512) as usize),
                    2 => r.alibi = true,
                    3 => r.sinks = true,
                    _ => {}
                }
                fit_cost(r, REACH_COST, &Space::default())
            },
        )
}

fn odd_pages(turn: usize) -> impl Strategy<Value = CaseRecipe> {
    // Block class × dtype by turns: each of the nine within nine turns.
    let class = PAGE_CLASSES[turn % 3];
    let dtype = DType::ALL[turn / 3 % 3];
    (
        prop::sample::select(class.to_vec()),
        prop::collection::vec((3usize..=8, 0usize..=255), 1..=4),
        prop::option::of(1usize..=16),
        (
            1usize..=2,
            1usize..=4,
            prop::sample::select(vec![8usize, 16, 32, 64]),
        ),
        any::<u64>(),
    )
        .prop_map(
            move |(bs, decodes, prefill, (kv, group, head_size), seed)| {
                // A decode's keys span `pages` pages, its last one partly filled.
                let mut seqs: Vec<(usize, usize)> = decodes
                    .iter()
                    .map(|&(pages, tail)| ((pages - 1) * bs + 1 + tail % bs, 1))
                    .collect();
                if let Some(q) = prefill {
                    seqs.push((bs + q, q));
                }
                let r = CaseRecipe {
                    num_kv_heads: kv,
                    group,
                    head_size,
                    block_size: bs,
                    seqs,
                    ..base(seed, dtype)
                };
                shrink_heads_to(r, REACH_COST)
            },
        )
}

/// Groups past 16, most not a multiple of 16, that fit 2 kv heads within the 128 query
/// heads models run.
const ODD_GROUPS: [usize; 7] = [17, 20, 24, 34, 40, 48, 56];

fn odd_groups() -> impl Strategy<Value = CaseRecipe> {
    (
        prop::sample::select(ODD_GROUPS.to_vec()),
        2usize..=4,
        prop::sample::select(vec![8usize, 16, 32, 64]),
        prop::collection::vec(0usize..=300, 1..=6),
        prop::sample::select(vec![16usize, 32, 64]),
        prop::sample::select(DType::ALL.to_vec()),
        any::<u64>(),
    )
        .prop_map(|(group, kv, head_size, contexts, bs, dtype, seed)| {
            let r = CaseRecipe {
                num_kv_heads: kv.min(128 / group).max(2),
                group,
                head_size,
                block_size: bs,
                seqs: contexts.into_iter().map(|c| (c, 1)).collect(),
                ..base(seed, dtype)
            };
            // Keep the group and its kv heads: shorten the contexts instead.
            shorten_to(r, REACH_COST)
        })
}

fn wide_chunk() -> impl Strategy<Value = CaseRecipe> {
    (
        65usize..=192,
        0usize..=200,
        prop::sample::select(vec![3e2f32, 1e3, 3e3]),
        prop::sample::select(vec![16usize, 32, 64]),
        prop::sample::select(DType::ALL.to_vec()),
        (1usize..=2, prop::sample::select(vec![8usize, 16, 32])),
        prop::collection::vec((0usize..=40, 1usize..=2), 0..=2),
        any::<u64>(),
    )
        .prop_map(|(q, ctx, dot, bs, dtype, (group, head_size), more, seed)| {
            let mut seqs = vec![(ctx, q)];
            seqs.extend(more);
            let r = CaseRecipe {
                group,
                head_size,
                block_size: bs,
                seqs,
                logits: Some(LogitShift {
                    dot,
                    alternate: true,
                    scattered: true,
                }),
                ..base(seed, dtype)
            };
            shrink_heads_to(r, REACH_COST)
        })
}

/// `r` within `budget`, by halving its head size (to 8), then its group and kv heads.
fn shrink_heads_to(mut r: CaseRecipe, budget: usize) -> CaseRecipe {
    while crate::pipeline::recipe::cost(&r) > budget {
        if r.head_size > 8 {
            r.head_size /= 2;
        } else if r.group > 1 {
            r.group /= 2;
        } else if r.num_kv_heads > 1 {
            r.num_kv_heads -= 1;
        } else {
            return shorten_to(r, budget);
        }
    }
    r
}

/// `r` within `budget`, by halving its longest context.
fn shorten_to(mut r: CaseRecipe, budget: usize) -> CaseRecipe {
    while crate::pipeline::recipe::cost(&r) > budget {
        match r.seqs.iter_mut().filter(|s| s.0 > 0).max_by_key(|s| s.0) {
            Some(s) => s.0 /= 2,
            None => break,
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    fn draw(reach: Reach, turn: usize) -> CaseRecipe {
        let mut runner = TestRunner::deterministic();
        reach_case(reach, turn)
            .new_tree(&mut runner)
            .unwrap()
            .current()
    }

    #[test]
    fn every_default_run_has_its_turns_of_each_kind() {
        let limits = StrategyLimits::DEFAULT;
        let kinds: Vec<(Reach, usize)> = (0..500).filter_map(|i| reach_of(i, limits)).collect();
        for k in TURNS {
            // Odd pages: nine turns hold every block class with every dtype.
            assert!(
                kinds.iter().filter(|(r, _)| *r == k).count() >= 9,
                "{k:?}: {kinds:?}"
            );
        }
        // Clear of the precision, MLA and covering slots.
        for (i, _) in (0..500).filter_map(|i| reach_of(i, limits).map(|r| (i, r))) {
            assert!(!crate::pipeline::draw::precision::is_precision(i));
            assert!(crate::pipeline::draw::covering::covering_row(i, limits).is_none());
        }
    }

    #[test]
    fn every_page_class_holds_only_its_own_block_sizes() {
        for (class, sizes) in PAGE_CLASSES.iter().enumerate() {
            for &bs in *sizes {
                assert_eq!(
                    crate::pipeline::coverage::reach::block_class(bs),
                    class,
                    "{bs}"
                );
            }
        }
    }

    #[test]
    fn each_kind_draws_what_it_names_and_builds_a_valid_case() {
        for turn in 0..9 {
            let c = draw(Reach::Crowd, turn);
            let share = c.share.unwrap();
            assert!((8..=64).contains(&share.group), "{c:?}");
            assert!(share.blocks * c.block_size >= 256 - c.block_size, "{c:?}");
            assert!(c.seqs.len() > share.group);
            c.build();

            let p = draw(Reach::OddPages, turn);
            assert!(PAGE_CLASSES[turn % 3].contains(&p.block_size));
            // The turn's bucket as coverage counts it, not as this file names it.
            let want = crate::pipeline::coverage::reach::long_decode_bucket(turn % 3, p.dtype);
            let case = p.build();
            assert_eq!(
                crate::pipeline::coverage::reach::buckets(&case)[1],
                ("long decode pages", want),
                "{p:?}"
            );
            assert_eq!(p.dtype, DType::ALL[turn / 3 % 3]);
            let decodes: Vec<_> = p.seqs.iter().filter(|s| s.1 == 1).collect();
            assert!(
                decodes
                    .iter()
                    .all(|s| (s.0 + 1).div_ceil(p.block_size) >= 3),
                "{p:?}"
            );

            let g = draw(Reach::OddGroups, turn);
            assert!(g.group > 16 && g.num_kv_heads >= 2, "{g:?}");
            assert!(g.seqs.iter().all(|s| s.1 == 1));
            g.build();

            let w = draw(Reach::WideChunk, turn);
            assert!(w.seqs[0].1 > 64 && w.logits.is_some_and(|l| l.scattered));
            w.build();
        }
    }
}
