//! Deliberately wrong backends that prove the harness bites (cargo feature `mutants`).
//!
//! Each mutant is one realistic bug, registered as `mutant:<name>`:
//! - [`wrap`] mutants wrap the real `cpu` backend and change what it is given (a config, the
//!   slot mapping, the block table, the query heads), as a buggy caller would;
//! - [`plain`] mutants are a small scalar copy of a paged-attention kernel (online softmax in
//!   two KV splits merged by log-sum-exp, the shape of `cpu`'s split-KV path) with one
//!   switch flipped, for bugs that live inside a kernel.

mod plain;
mod wrap;

use crate::Backend;
use std::sync::Arc;

pub use plain::{Bug, PlainBackend};
pub use wrap::{Mutation, WrappedMutant};

/// One mutant of the catalogue.
pub struct MutantInfo {
    pub name: &'static str,
    pub description: &'static str,
}

/// The catalogue: (name, the bug it imitates).
pub const CATALOGUE: &[MutantInfo] = &[
    MutantInfo { name: "window-off-by-one", description: "a decoder window of w sees w + 1 keys" },
    MutantInfo { name: "decoder-window-encoder-convention", description: "a decoder window applied as |p - k| < w, so queries see future keys" },
    MutantInfo { name: "gqa-modulo", description: "query head h reads kv head h % Hkv instead of h / (Hq / Hkv)" },
    MutantInfo { name: "slot-block-boundary", description: "the first key of a block is read through the previous logical block" },
    MutantInfo { name: "padding-slot-written", description: "a padding token's slot -1 wraps to the cache's last slot and is written" },
    MutantInfo { name: "neighbour-table-row", description: "a sequence's last logical block is looked up in the next sequence's table row" },
    MutantInfo { name: "causal-offset-query-len", description: "the causal mask places query j at query_len + j instead of context_len + j" },
    MutantInfo { name: "softmax-no-max", description: "softmax without subtracting the running max (overflows on large logits)" },
    MutantInfo { name: "sink-in-numerator", description: "the attention sink is added to the numerator as if it carried a value of 1" },
    MutantInfo { name: "soft-cap-after-alibi", description: "the logit soft-cap is applied after the ALiBi bias instead of before" },
    MutantInfo { name: "alibi-sign-flipped", description: "ALiBi adds slope * (p - k) instead of slope * (k - p)" },
    MutantInfo { name: "scale-applied-twice", description: "logits are scaled by scale^2" },
    MutantInfo { name: "padding-row-nan", description: "a fully masked padding row computes 0/0 and the NaN leaks into a real row" },
    MutantInfo { name: "low-precision-accumulation", description: "softmax sums and P·V accumulate in the input dtype (bf16/f16) instead of f32" },
    MutantInfo { name: "split-merge-drops-rescale", description: "the split-KV merge forgets to rescale the second split by exp(m2 - m)" },
    MutantInfo { name: "last-partial-block-ignored", description: "keys in a sequence's last, partially filled block are skipped" },
    MutantInfo { name: "shared-block-gathered-once", description: "a gather that assumes each block belongs to one sequence: a block already gathered for an earlier sequence reads as zeros" },
];

/// Every mutant, as a backend named `mutant:<name>`.
pub fn all_mutants() -> Vec<Arc<dyn Backend>> {
    CATALOGUE
        .iter()
        .map(|m| mutant(m.name).expect("catalogue names are known"))
        .collect()
}

/// The mutant called `name` (without the `mutant:` prefix).
pub fn mutant(name: &str) -> Option<Arc<dyn Backend>> {
    let wrap = |m: Mutation| Some(Arc::new(WrappedMutant::new(name, m)) as Arc<dyn Backend>);
    let plain = |b: Bug| {
        Some(Arc::new(PlainBackend::new(&format!("mutant:{name}"), b)) as Arc<dyn Backend>)
    };
    match name {
        "window-off-by-one" => wrap(Mutation::WindowOneWider),
        "gqa-modulo" => wrap(Mutation::GqaModulo),
        "padding-slot-written" => wrap(Mutation::PaddingSlotWraps),
        "neighbour-table-row" => wrap(Mutation::NeighbourTableRow),
        "alibi-sign-flipped" => wrap(Mutation::AlibiSignFlipped),
        "scale-applied-twice" => wrap(Mutation::ScaleTwice),
        "decoder-window-encoder-convention" => plain(Bug::DecoderWindowEncoderConvention),
        "slot-block-boundary" => plain(Bug::SlotBlockBoundary),
        "causal-offset-query-len" => plain(Bug::CausalOffsetQueryLen),
        "softmax-no-max" => plain(Bug::SoftmaxNoMax),
        "sink-in-numerator" => plain(Bug::SinkInNumerator),
        "soft-cap-after-alibi" => plain(Bug::SoftCapAfterAlibi),
        "padding-row-nan" => plain(Bug::PaddingRowNan),
        "low-precision-accumulation" => plain(Bug::LowPrecisionAccumulation),
        "split-merge-drops-rescale" => plain(Bug::SplitMergeDropsRescale),
        "last-partial-block-ignored" => plain(Bug::LastPartialBlockIgnored),
        "shared-block-gathered-once" => plain(Bug::SharedBlockGatheredOnce),
        _ => None,
    }
}
