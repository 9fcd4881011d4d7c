//! What the cases a backend actually ran (declined ones excluded) covered: each case falls in
//! one bucket of every dimension of `attn_results::coverage::DIMENSIONS` (several for
//! `features`), which declares them so a report can show the empty ones; [`declared`] names
//! the buckets a backend's space rules out.

use crate::pipeline::recipe::shares_blocks;
use attn_reference::{Case, Feature, KvCacheDtype, Poison};
use attn_results::coverage::dimensions;
use attn_results::CoverageReport;

pub mod declared;
pub mod reach;

fn range_bucket(x: usize, edges: &[(usize, &'static str)], above: &'static str) -> &'static str {
    edges
        .iter()
        .find(|(max, _)| x <= *max)
        .map_or(above, |(_, b)| b)
}

const BLOCK_SIZE_EDGES: &[(usize, &str)] =
    &[(1, "1"), (15, "2-15"), (64, "16-64"), (128, "65-128")];
const BLOCK_SIZE_ABOVE: &str = "above 128";
const LONGEST_SEQUENCE_EDGES: &[(usize, &str)] = &[
    (16, "1-16"),
    (256, "17-256"),
    (4096, "257-4096"),
    (16384, "4097-16384"),
];
const LONGEST_SEQUENCE_ABOVE: &str = "above 16384";
const COUNT_EDGES: &[(usize, &str)] = &[(1, "1"), (8, "2-8"), (64, "9-64")];
const COUNT_ABOVE: &str = "above 64";
const SEQUENCES_EDGES: &[(usize, &str)] = &[(1, "1"), (8, "2-8"), (64, "9-64"), (512, "65-512")];
const SEQUENCES_ABOVE: &str = "above 512";
const STEP_TOKENS_EDGES: &[(usize, &str)] = &[(64, "1-64"), (1024, "65-1024"), (8192, "1025-8192")];
const STEP_TOKENS_ABOVE: &str = "above 8192";
const GROUP_EDGES: &[(usize, &str)] = &[(1, "1"), (8, "2-8"), (16, "9-16"), (64, "17-64")];
const GROUP_ABOVE: &str = "65-128";
const QUERY_HEADS_EDGES: &[(usize, &str)] = &[(8, "1-8"), (32, "9-32")];
const QUERY_HEADS_ABOVE: &str = "33-128";

fn kv_cache(k: KvCacheDtype) -> &'static str {
    match k {
        KvCacheDtype::Auto => "compute dtype",
        KvCacheDtype::Fp8(f) => f.name(),
    }
}

fn block_size(b: usize) -> &'static str {
    range_bucket(b, BLOCK_SIZE_EDGES, BLOCK_SIZE_ABOVE)
}

fn head_size(d: usize) -> &'static str {
    match d {
        1..=8 => "1-8",
        _ if !d.is_multiple_of(8) => "d%8≠0",
        _ if !d.is_multiple_of(16) => "d%16=8",
        _ if !d.is_multiple_of(32) => "d%32=16",
        _ if !d.is_multiple_of(64) => "d%64=32",
        _ if d <= 256 => "64k up to 256",
        _ => "64k above 256",
    }
}

fn heads(case: &Case) -> &'static str {
    let (q, kv) = (case.config.num_heads, case.config.num_kv_heads);
    match (kv, q / kv.max(1)) {
        (1, 1) => "single",
        (_, 1) => "MHA",
        (1, _) => "MQA",
        (_, 2..=4) => "GQA 2-4",
        _ => "GQA above 4",
    }
}

fn window(case: &Case) -> &'static str {
    match case.config.sliding_window {
        None => "none",
        Some(1) => "1",
        Some(w) if case.batch.seq_lens.iter().any(|&l| l > w) => "inside the sequence",
        Some(_) => "past the sequence",
    }
}

fn table_order(case: &Case) -> &'static str {
    let bs = case.config.block_size;
    let (mut up, mut down) = (false, false);
    for (s, row) in case.layout.block_table.iter().enumerate() {
        let used = &row[..case.batch.seq_lens[s].div_ceil(bs)];
        for w in used.windows(2) {
            up |= w[1] > w[0];
            down |= w[1] < w[0];
        }
    }
    match (up, down) {
        (_, false) => "ascending",
        (false, true) => "descending",
        (true, true) => "mixed",
    }
}

/// The MLA buckets of `case`: its latent shape and context, and its query heads.
fn mla_buckets(case: &Case) -> [(&'static str, &'static str); 2] {
    let c = &case.config;
    let Some(m) = c.mla else {
        return [("mla", "none"), ("mla heads", "none")];
    };
    let longest = case.batch.seq_lens.iter().copied().max().unwrap_or(0);
    let shape = match (m.head_size_v == c.head_size, longest > 576) {
        (true, _) => "Dk = Dv",
        (false, false) => "Dk ≠ Dv, up to 576 keys",
        (false, true) => "Dk ≠ Dv, past 576 keys",
    };
    let heads = range_bucket(c.num_heads, &[(8, "1-8"), (64, "9-64")], "65-128");
    [("mla", shape), ("mla heads", heads)]
}

/// The precision triples `case` holds (its dtype, each positional feature it uses, the
/// greatest length its longest sequence passes), or `none`.
fn precision(case: &Case) -> Vec<&'static str> {
    use attn_results::precision::{bucket, length_class, POSITIONAL_FEATURES};
    let longest = case.batch.seq_lens.iter().copied().max().unwrap_or(0);
    let triples: Vec<&'static str> = length_class(longest)
        .map(|length| {
            POSITIONAL_FEATURES
                .into_iter()
                .filter(|f| f.used_by(&case.config) || f.used_by_batch(&case.batch))
                .filter_map(|f| bucket(case.config.dtype, f, length))
                .collect()
        })
        .unwrap_or_default();
    if triples.is_empty() {
        vec!["none"]
    } else {
        triples
    }
}

/// The buckets `case` falls in, as (dimension, bucket).
pub fn buckets(case: &Case) -> Vec<(&'static str, &'static str)> {
    let c = &case.config;
    let mut v = vec![
        ("dtype", c.dtype.name()),
        ("kv cache", kv_cache(KvCacheDtype::of(c))),
        ("head size", head_size(c.head_size)),
        ("block size", block_size(c.block_size)),
        ("heads", heads(case)),
        (
            "scale",
            if c.scale.is_some() {
                "custom"
            } else {
                "default"
            },
        ),
        ("window", window(case)),
    ];
    let mut features: Vec<&'static str> = Feature::ALL
        .into_iter()
        .filter(|f| f.used_by(c) || f.used_by_batch(&case.batch))
        .map(Feature::label)
        .collect();
    if features.is_empty() {
        features.push("none");
    }
    v.extend(features.into_iter().map(|f| ("features", f)));
    v.extend(precision(case).into_iter().map(|b| ("precision", b)));
    v.extend([
        (
            "group size",
            range_bucket(c.group_size(), GROUP_EDGES, GROUP_ABOVE),
        ),
        (
            "query heads",
            range_bucket(c.num_heads, QUERY_HEADS_EDGES, QUERY_HEADS_ABOVE),
        ),
    ]);
    v.extend(crate::failure::logit_stats::LogitStats::of(case).buckets());
    v.extend(crate::pipeline::draw::covering::shape_buckets(case));
    v.extend(reach::buckets(case));
    let longest = case.batch.seq_lens.iter().copied().max().unwrap_or(0);
    let longest_query = case.batch.query_lens.iter().copied().max().unwrap_or(0);
    let elements =
        case.layout.num_blocks as u128 * (c.block_size * c.num_kv_heads * c.head_size) as u128;
    v.extend([
        (
            "longest sequence",
            range_bucket(longest, LONGEST_SEQUENCE_EDGES, LONGEST_SEQUENCE_ABOVE),
        ),
        (
            "longest query",
            range_bucket(longest_query, COUNT_EDGES, COUNT_ABOVE),
        ),
        (
            "sequences",
            range_bucket(case.num_seqs(), SEQUENCES_EDGES, SEQUENCES_ABOVE),
        ),
        (
            "step tokens",
            range_bucket(case.num_tokens(), STEP_TOKENS_EDGES, STEP_TOKENS_ABOVE),
        ),
        ("batch composition", batch_composition(case)),
        ("decode-only step", decode_only_step(case)),
        (
            "cache elements",
            if elements < 1 << 20 {
                "below 2^20"
            } else if elements <= 1 << 31 {
                "2^20 to 2^31"
            } else {
                "above 2^31"
            },
        ),
        ("table order", table_order(case)),
        (
            "sharing",
            if shares_blocks(case) {
                "shared blocks"
            } else {
                "none"
            },
        ),
        ("poison", case.poison.map_or("none", Poison::name)),
        mla_buckets(case)[0],
        mla_buckets(case)[1],
        (
            "padding",
            if case.num_tokens() > case.num_real_tokens() {
                "padding tokens"
            } else {
                "none"
            },
        ),
    ]);
    v
}

/// Count a case that `backend` ran, by its [`buckets`] (computed once per case).
/// The buckets of a trace: its length and the serving events it holds (several or none).
pub fn trace_buckets(trace: &attn_reference::Trace) -> Vec<(&'static str, &'static str)> {
    use attn_reference::trace::{FreeReason, Phase};
    let steps = range_bucket(trace.steps.len(), &[(8, "1-8"), (24, "9-24")], "above 24");
    let c = &trace.config;
    let model = crate::pipeline::draw::production::all_layouts().any(|l| {
        (l.num_heads, l.num_kv_heads, l.head_size) == (c.num_heads, c.num_kv_heads, c.head_size)
    });
    let mut out = vec![
        ("trace steps", steps),
        ("trace layout", if model { "a model's" } else { "drawn" }),
        ("trace poison", trace.poison.map_or("none", Poison::name)),
    ];
    let requests = trace.whole_batch();
    let mut features: Vec<&'static str> = Feature::ALL
        .into_iter()
        .filter(|f| f.used_by(&trace.config) || f.used_by_batch(&requests))
        .map(Feature::label)
        .collect();
    if features.is_empty() {
        features.push("none");
    }
    out.extend(features.into_iter().map(|f| ("trace features", f)));
    let bs = trace.config.block_size;
    let mut freed = std::collections::HashSet::new();
    let (mut reused, mut preempted, mut chunked, mut new_block) = (false, false, false, false);
    // Blocks a sequence left behind, while it still holds the rest of its table.
    let mut skipped: Vec<(usize, u32)> = Vec::new();
    let (mut skips, mut rewritten) = (false, false);
    for st in &trace.steps {
        for f in st.freed.iter().filter(|f| f.reason != FreeReason::Finished) {
            preempted |= f.reason == FreeReason::Preempted;
            skips |= f.reason == FreeReason::Skipped;
            if f.reason == FreeReason::Skipped {
                skipped.extend(f.blocks.iter().map(|&b| (f.seq, b)));
            } else {
                skipped.retain(|&(s, _)| s != f.seq);
            }
            freed.extend(f.blocks.iter().copied());
        }
        for s in &st.seqs {
            let written = &s.block_table[s.context_len / bs..];
            reused |= written.iter().any(|b| freed.contains(b));
            rewritten |= skipped.iter().any(|&(o, b)| {
                o != s.seq && written.contains(&b) && st.seqs.iter().any(|x| x.seq == o)
            });
            chunked |= s.phase == Phase::ChunkedPrefill;
            new_block |= s.phase == Phase::Decode && s.context_len.is_multiple_of(bs);
        }
        for f in st.freed.iter().filter(|f| f.reason == FreeReason::Finished) {
            skipped.retain(|&(s, _)| s != f.seq);
            freed.extend(f.blocks.iter().copied());
        }
    }
    let hit = trace.steps.iter().any(|s| !s.prefix_hits.is_empty());
    for (on, bucket) in [
        (reused, "freed block reused"),
        (hit, "prefix hit"),
        (preempted, "preemption"),
        (chunked, "chunked prefill"),
        (new_block, "decode into a new block"),
        (skips, "block skipped"),
        (rewritten, "skipped block rewritten"),
    ] {
        if on {
            out.push(("trace events", bucket));
        }
    }
    out
}

pub fn count(report: &mut CoverageReport, backend: &str, buckets: &[(&str, &str)]) {
    for (dim, bucket) in buckets {
        report.count(backend, dim, bucket);
    }
    report.count_pairs(backend, buckets);
    report.count_triples(backend, buckets);
}

/// A step of decodes only, plain (every real request one token) or speculative (at most 8:
/// 1 + the drafts), and whether its tokens pass 8,192; `has a prefill` otherwise (encoder-only
/// steps have no decodes).
fn decode_only_step(case: &Case) -> &'static str {
    let queries: Vec<usize> = case.batch.scheduled_query_lens().collect();
    let big = case.num_real_tokens() > 8192;
    if case.config.kind == attn_reference::AttentionKind::EncoderOnly
        || queries.iter().any(|&q| q > 8)
    {
        "has a prefill"
    } else if queries.iter().all(|&q| q == 1) {
        if big {
            "plain, above 8192 tokens"
        } else {
            "plain, up to 8192 tokens"
        }
    } else if big {
        "speculative, above 8192 tokens"
    } else {
        "speculative, up to 8192 tokens"
    }
}

/// Decodes are sequences with one query token (vLLM's `split_decodes_and_prefills` with its
/// default threshold); encoder-only attention has none. vLLM's scheduler puts them first.
fn batch_composition(case: &Case) -> &'static str {
    // Padded requests (query length 0) are padding: neither decodes nor prefills.
    let decode: Vec<bool> = case
        .batch
        .query_lens
        .iter()
        .filter(|&&q| q > 0)
        .map(|&q| q == 1 && case.config.kind != attn_reference::AttentionKind::EncoderOnly)
        .collect();
    if decode.iter().all(|&d| d) {
        "all decode"
    } else if decode.iter().all(|&d| !d) {
        "all prefill"
    } else if decode.windows(2).all(|w| w[0] || !w[1]) {
        "mixed, decodes first"
    } else {
        "mixed, other order"
    }
}

#[cfg(test)]
mod tests {
    use super::declared::not_declared;
    use super::*;

    use attn_results::coverage::dimensions;

    #[test]
    fn features_outside_the_space_are_not_declared_for_traces_either() {
        let plain = attn_reference::Space::parse_only("features=none").unwrap();
        let out = not_declared(&plain);
        // Every optional feature a case of this space cannot have, a trace cannot either.
        let outside: Vec<_> = Feature::ALL
            .into_iter()
            .filter(|f| out.contains(&("features", f.label())))
            .collect();
        assert!(outside.contains(&Feature::Alibi), "{outside:?}");
        for f in outside {
            assert!(
                out.contains(&("trace features", f.label())),
                "{}",
                f.label()
            );
        }
        assert!(!out.contains(&("trace features", "none")));
        assert!(!out.iter().any(|(d, _)| *d == "trace steps"));
        let mla = attn_reference::Space::parse_only("kv_layouts=mla").unwrap();
        let out = not_declared(&mla);
        assert!(out.contains(&("trace steps", "1-8")), "{out:?}");
        assert!(out.contains(&("trace events", "prefix hit")), "{out:?}");
    }

    #[test]
    fn every_bucket_a_case_falls_in_is_declared() {
        use crate::pipeline::draw::strategy_for;
        use crate::pipeline::draw::tier::StrategyLimits;
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        for index in 0..60 {
            let limits = StrategyLimits::DEFAULT;
            let r = strategy_for(index, limits, &attn_reference::Space::default())
                .new_tree(&mut runner)
                .unwrap()
                .current();
            for (dim, bucket) in buckets(&r.build()) {
                let declared = dimensions()
                    .into_iter()
                    .find(|(d, _)| *d == dim)
                    .map(|(_, b)| b);
                assert!(
                    declared.is_some_and(|b| b.contains(&bucket)),
                    "{dim}: {bucket}"
                );
            }
        }
    }
}
