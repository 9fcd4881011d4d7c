//! The coverage buckets of Reach IV's corners ([`crate::pipeline::draw::reach`]): how many
//! sequences share a block, whether a decode spans 3 pages or more (by block class and
//! dtype), and the head group of a step with decodes.

use attn_reference::{AttentionKind, Case, DType, Space};
use std::collections::HashMap;

/// The buckets of `case` in the three dimensions.
pub fn buckets(case: &Case) -> [(&'static str, &'static str); 3] {
    [
        ("prefix sharers", sharers(case)),
        ("long decode pages", long_decode_pages(case)),
        ("group at decode", group_at_decode(case)),
    ]
}

/// The most sequences that read one physical block.
fn sharers(case: &Case) -> &'static str {
    let bs = case.config.block_size.max(1);
    let mut readers: HashMap<u32, usize> = HashMap::new();
    for s in 0..case.num_seqs() {
        let used = case.batch.seq_lens[s].div_ceil(bs);
        let mut mine: Vec<u32> = case.layout.block_table[s][..used].to_vec();
        mine.sort_unstable();
        mine.dedup();
        for b in mine {
            *readers.entry(b).or_default() += 1;
        }
    }
    match readers.values().copied().max().unwrap_or(0) {
        0 | 1 => "none",
        2..=4 => "2-4",
        5..=16 => "5-16",
        _ => "above 16",
    }
}

/// The block class of a block size: up to 64, past 64 and a multiple of 64, past 64 and not.
pub fn block_class(bs: usize) -> usize {
    match bs {
        0..=64 => 0,
        _ if bs.is_multiple_of(64) => 1,
        _ => 2,
    }
}

const LONG_DECODE: [[&str; 3]; 3] = [
    [
        "blocks up to 64 · f32",
        "blocks up to 64 · bf16",
        "blocks up to 64 · f16",
    ],
    [
        "blocks past 64, ×64 · f32",
        "blocks past 64, ×64 · bf16",
        "blocks past 64, ×64 · f16",
    ],
    [
        "blocks past 64, not ×64 · f32",
        "blocks past 64, not ×64 · bf16",
        "blocks past 64, not ×64 · f16",
    ],
];

fn dtype_index(d: DType) -> usize {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0)
}

/// Decodes of a decoder step (query length 1).
fn decodes(case: &Case) -> impl Iterator<Item = usize> + '_ {
    let decoder = case.config.kind == AttentionKind::Decoder;
    (0..case.num_seqs()).filter(move |&s| decoder && case.batch.query_lens[s] == 1)
}

/// The long decode pages bucket of block class `class` in `dtype`.
pub fn long_decode_bucket(class: usize, dtype: DType) -> &'static str {
    LONG_DECODE[class][dtype_index(dtype)]
}

fn long_decode_pages(case: &Case) -> &'static str {
    let bs = case.config.block_size.max(1);
    if decodes(case).any(|s| case.batch.seq_lens[s].div_ceil(bs) >= 3) {
        long_decode_bucket(block_class(bs), case.config.dtype)
    } else {
        "no decode past 2 pages"
    }
}

fn group_at_decode(case: &Case) -> &'static str {
    let c = &case.config;
    let g = c.group_size();
    if decodes(case).next().is_none() {
        "no decode"
    } else if g <= 16 {
        "up to 16"
    } else if c.num_kv_heads == 1 {
        "past 16, 1 kv head"
    } else if g.is_multiple_of(16) {
        "past 16, ×16, 2+ kv heads"
    } else {
        "past 16, not ×16, 2+ kv heads"
    }
}

/// The buckets outside `space`: sharers past its batch size, block classes and dtypes it
/// leaves out, groups past its largest; none of them without decoders.
pub fn not_declared(space: &Space) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let decoders = space.allows_kind(AttentionKind::Decoder);
    let seqs = if decoders {
        space.max_seqs.unwrap_or(usize::MAX)
    } else {
        1
    };
    for (bucket, least) in [("2-4", 2), ("5-16", 5), ("above 16", 17)] {
        if seqs < least {
            out.push(("prefix sharers", bucket));
        }
    }
    let sizes = space.block_size_values();
    for (class, row) in LONG_DECODE.iter().enumerate() {
        let has_class = sizes
            .as_ref()
            .is_none_or(|v| v.iter().any(|&b| block_class(b) == class));
        for (d, bucket) in DType::ALL.iter().zip(row) {
            if !decoders || !has_class || !space.allows_dtype(*d) {
                out.push(("long decode pages", *bucket));
            }
        }
    }
    let group = if decoders {
        space.max_group.unwrap_or(usize::MAX)
    } else {
        0
    };
    if !decoders {
        out.push(("group at decode", "up to 16"));
    }
    if group <= 16 {
        out.extend(
            [
                "past 16, 1 kv head",
                "past 16, ×16, 2+ kv heads",
                "past 16, not ×16, 2+ kv heads",
            ]
            .map(|b| ("group at decode", b)),
        );
    } else if group < 32 {
        out.push(("group at decode", "past 16, ×16, 2+ kv heads"));
    }
    out
}
