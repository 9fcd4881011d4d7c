//! The coverage buckets outside a backend's declared space: no case drawn inside it can fall
//! there, so a report shows them as not declared rather than as gaps.

use super::*;
use attn_reference::{DType, Feature, Space};

/// The buckets of a range dimension whose smallest value is above `limit`.
fn above_limit(
    edges: &[(usize, &'static str)],
    above: &'static str,
    limit: usize,
) -> Vec<&'static str> {
    let mut lower = 1;
    let mut out = Vec::new();
    for &(max, b) in edges {
        if lower > limit {
            out.push(b);
        }
        lower = max + 1;
    }
    if lower > limit {
        out.push(above);
    }
    out
}

/// The buckets outside `space`: no case drawn inside it can fall there, so a report shows
/// them as not declared rather than as gaps.
pub fn not_declared(space: &Space) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    for d in DType::ALL.into_iter().filter(|d| !space.allows_dtype(*d)) {
        out.push(("dtype", d.name()));
    }
    for k in KvCacheDtype::ALL
        .into_iter()
        .filter(|k| !space.allows_kv_cache(*k))
    {
        out.push(("kv cache", kv_cache(k)));
    }
    let unreached =
        |dim: &'static str, values: Option<Vec<usize>>, bucket: fn(usize) -> &'static str| {
            let dims = dimensions();
            let all = dims
                .iter()
                .find(|(d, _)| *d == dim)
                .map(|(_, b)| b.clone())
                .unwrap_or_default();
            values.map_or_else(Vec::new, |v| {
                let reached: Vec<&str> = v.into_iter().map(bucket).collect();
                all.into_iter()
                    .filter(|b| !reached.contains(b))
                    .map(|b| (dim, b))
                    .collect::<Vec<_>>()
            })
        };
    out.extend(unreached("head size", space.head_size_values(), head_size));
    out.extend(unreached(
        "block size",
        space.block_size_values(),
        block_size,
    ));
    if let Some(g) = space.max_group {
        let mut heads = Vec::new();
        if g < 2 {
            heads.extend(["MQA", "GQA 2-4"]);
        }
        if g < 5 {
            heads.push("GQA above 4");
        }
        out.extend(heads.into_iter().map(|b| ("heads", b)));
        out.extend(
            above_limit(GROUP_EDGES, GROUP_ABOVE, g)
                .into_iter()
                .map(|b| ("group size", b)),
        );
    }
    if !space.allows_feature(Feature::SlidingWindow) {
        out.extend(["1", "inside the sequence", "past the sequence"].map(|b| ("window", b)));
    }
    // Only a window or local chunks leave blocks behind.
    if !space.allows_feature(Feature::SlidingWindow)
        && !space.allows_feature(Feature::ChunkedLocalAttention)
    {
        out.extend(["block skipped", "skipped block rewritten"].map(|b| ("trace events", b)));
    }
    for f in Feature::ALL
        .into_iter()
        .filter(|f| !space.allows_feature(*f))
    {
        // Traces draw their features from the same space as single cases.
        out.push(("features", f.label()));
        out.push(("trace features", f.label()));
    }
    out.extend(mla_not_declared(space));
    out.extend(crate::pipeline::draw::covering::shape_not_declared(space));
    out.extend(precision_not_declared(space));
    out.extend(super::reach::not_declared(space));
    // Production traces keep their layout's head size: none where the space allows none.
    let layouts: Vec<_> = crate::pipeline::draw::production::all_layouts().collect();
    if crate::pipeline::draw::trace::draws_traces(space)
        && space
            .head_size_values()
            .is_some_and(|v| !layouts.iter().any(|l| v.contains(&l.head_size)))
    {
        out.push(("trace layout", "a model's"));
    }
    if !crate::pipeline::draw::trace::draws_traces(space) {
        // A space with no trace to draw (MLA alone, encoders alone): every trace bucket.
        for (dim, buckets) in dimensions()
            .into_iter()
            .filter(|(d, _)| d.starts_with("trace "))
        {
            out.extend(buckets.into_iter().map(|b| (dim, b)));
        }
    }
    if let Some(m) = space.max_seq_len {
        out.extend(
            above_limit(LONGEST_SEQUENCE_EDGES, LONGEST_SEQUENCE_ABOVE, m)
                .into_iter()
                .map(|b| ("longest sequence", b)),
        );
    }
    if let Some(m) = space.max_query_len {
        out.extend(
            above_limit(COUNT_EDGES, COUNT_ABOVE, m)
                .into_iter()
                .map(|b| ("longest query", b)),
        );
    }
    out.extend(decode_only_not_declared(space));
    if let Some(m) = space.max_seqs {
        out.extend(
            above_limit(SEQUENCES_EDGES, SEQUENCES_ABOVE, m)
                .into_iter()
                .map(|b| ("sequences", b)),
        );
        if m < 2 {
            // Sharing blocks takes two sequences.
            out.push(("sharing", "shared blocks"));
        }
    }
    out
}

/// The MLA buckets outside `space`: all but `none` without MLA.
fn mla_not_declared(space: &Space) -> Vec<(&'static str, &'static str)> {
    if space.allows_feature(Feature::Mla) {
        return Vec::new();
    }
    let mut out: Vec<(&'static str, &'static str)> = [
        "Dk = Dv",
        "Dk ≠ Dv, up to 576 keys",
        "Dk ≠ Dv, past 576 keys",
    ]
    .map(|b| ("mla", b))
    .to_vec();
    out.extend(["1-8", "9-64", "65-128"].map(|b| ("mla heads", b)));
    out
}

/// The precision triples outside `space`: a dtype or feature it leaves out, or a length its
/// sequences never pass.
fn precision_not_declared(space: &Space) -> Vec<(&'static str, &'static str)> {
    use attn_results::precision::{buckets, triple};
    buckets()
        .iter()
        .enumerate()
        .filter(|&(n, _)| {
            let (dtype, feature, length) = triple(n);
            !space.allows_dtype(dtype)
                || !space.allows_feature(feature)
                || space.max_seq_len.is_some_and(|m| m <= length)
        })
        .map(|(_, b)| ("precision", *b))
        .collect()
}

/// The decode-only steps outside `space`: none without decoders, no speculative ones when
/// queries stop at 1, none past 8,192 tokens when its steps or its sequences stop short.
fn decode_only_not_declared(space: &Space) -> Vec<(&'static str, &'static str)> {
    let decoders = space.allows_kind(attn_reference::AttentionKind::Decoder);
    let speculative = space.max_query_len.is_none_or(|m| m >= 2);
    // Past 8,192 tokens: that many plain decodes, or an eighth as many speculative ones.
    let steps_past = space.max_tokens.is_none_or(|m| m > 8192);
    let seqs_past = |width: usize| space.max_seqs.is_none_or(|m| m * width > 8192);
    [
        ("plain, up to 8192 tokens", decoders),
        (
            "plain, above 8192 tokens",
            decoders && steps_past && seqs_past(1),
        ),
        ("speculative, up to 8192 tokens", decoders && speculative),
        (
            "speculative, above 8192 tokens",
            decoders && speculative && steps_past && seqs_past(8),
        ),
    ]
    .into_iter()
    .filter(|(_, declared)| !declared)
    .map(|(b, _)| ("decode-only step", b))
    .collect()
}
