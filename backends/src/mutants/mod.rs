//! Deliberately wrong backends that prove the harness bites (cargo feature `mutants`).
//!
//! Each mutant is one realistic bug, registered as `mutant:<name>`:
//! - [`wrap`] mutants wrap the real `cpu` backend and change what it is given (a config, the
//!   slot mapping, the block table, the query heads), as a buggy caller would;
//! - [`plain`] mutants are a small scalar copy of a paged-attention kernel (online softmax in
//!   two KV splits merged by log-sum-exp, the shape of `cpu`'s split-KV path) with one
//!   switch flipped, for bugs that live inside a kernel;
//! - [`stateful`] mutants keep state between steps and break only when a cache lives across
//!   a trace's steps (single cases and the upstream suite cannot see them);
//! - [`invariance`] mutants compute every row right but let its bits depend on the rest of
//!   the batch while declaring they do not (only invariance pairs kill them);
//! - [`mla`] mutants are a small scalar MLA decode kernel (one latent entry per slot) with
//!   one switch flipped, for bugs of multi-head latent attention.

mod invariance;
mod mla;
mod plain;
mod stateful;
mod wrap;

use crate::Backend;
use std::sync::Arc;

pub use invariance::{Variance, VariantMutant};
pub use mla::{MlaBug, MlaMutant};
pub use plain::{Bug, PlainBackend};
pub use stateful::{StatefulMutant, StepBug};
pub use wrap::{Mutation, WrappedMutant};

/// One mutant of the catalogue.
pub struct MutantInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// The public bug it reproduces (repository and issue or pull request), if it is one.
    pub public_bug: Option<&'static str>,
    /// It only breaks across the steps of a trace: every single step it runs alone is right.
    pub trace_only: bool,
    /// Every row it computes is right: only an invariance pair of a relation it declares
    /// sees that its bits depend on the batch.
    pub pairs_only: bool,
}

const fn m(name: &'static str, description: &'static str) -> MutantInfo {
    MutantInfo {
        name,
        description,
        public_bug: None,
        trace_only: false,
        pairs_only: false,
    }
}

const fn public(name: &'static str, bug: &'static str, description: &'static str) -> MutantInfo {
    MutantInfo {
        public_bug: Some(bug),
        ..m(name, description)
    }
}

/// A mutant that only breaks across steps (a cache kept between them).
const fn across_steps(name: &'static str, description: &'static str) -> MutantInfo {
    MutantInfo {
        trace_only: true,
        ..m(name, description)
    }
}

/// A mutant whose rows are right and whose bits move with the batch.
const fn variant(name: &'static str, description: &'static str) -> MutantInfo {
    MutantInfo {
        pairs_only: true,
        ..m(name, description)
    }
}

/// The catalogue: (name, the bug it imitates).
pub const CATALOGUE: &[MutantInfo] = &[
    public("window-off-by-one", "sgl-project/sglang#34273", "a decoder window of w sees w + 1 keys"),
    public("decoder-window-encoder-convention", "ModelTC/LightLLM#1311", "a decoder window applied as |p - k| < w, so queries see future keys"),
    m("gqa-modulo", "query head h reads kv head h % Hkv instead of h / (Hq / Hkv)"),
    m("slot-block-boundary", "the first key of a block is read through the previous logical block"),
    m("padding-slot-written", "a padding token's slot -1 wraps to the cache's last slot and is written"),
    m("neighbour-table-row", "a sequence's last logical block is looked up in the next sequence's table row"),
    m("causal-offset-query-len", "the causal mask places query j at query_len + j instead of context_len + j"),
    m("softmax-no-max", "softmax without subtracting the running max (overflows on large logits)"),
    m("sink-in-numerator", "the attention sink is added to the numerator as if it carried a value of 1"),
    m("soft-cap-after-alibi", "the logit soft-cap is applied after the ALiBi bias instead of before"),
    m("alibi-sign-flipped", "ALiBi adds slope * (p - k) instead of slope * (k - p)"),
    m("scale-applied-twice", "logits are scaled by scale^2"),
    m("padding-row-nan", "a fully masked padding row computes 0/0 and the NaN leaks into a real row"),
    m("max-query-len-from-counts", "the longest query is taken as num_tokens - num_seqs + 1 (true while every request has a token): with padded requests of query length 0 a request's last queries are never computed"),
    m("low-precision-accumulation", "softmax sums and P·V accumulate in the input dtype (bf16/f16) instead of f32"),
    m("scores-in-dtype", "q·k rounded to the input dtype (bf16/f16) before the scale, as a half-precision score matmul gives it"),
    m("scaled-query-in-dtype", "the query scaled and rounded to the input dtype before q·k, the score rounded too"),
    m("cascade-merge-no-rescale", "a crowd's shared-prefix (cascade) path merges the prefix's and suffix's softmaxes without rescaling the suffix's (8+ sequences behind 256+ prefix tokens)"),
    m("page-tiles-floored", "decodes over 3+ pages walk each page in 64-key tiles whose count is floored: a page's tail past its last whole tile (block sizes past 64, not a multiple of 64) is never read"),
    m("head-tile-crosses-group", "decode packs query heads in tiles of 16 read with the tile's first head's kv head: a tile crossing a group boundary (groups past 16, not a multiple of 16) reads the neighbouring kv head"),
    m("every-op-in-dtype", "eager attention in the input dtype: scores, their scale and the normalised probabilities rounded, P·V rounded once"),
    m("split-merge-drops-rescale", "the split-KV merge forgets to rescale the second split by exp(m2 - m)"),
    m("last-partial-block-ignored", "keys in a sequence's last, partially filled block are skipped"),
    m("shared-block-gathered-once", "a gather that assumes each block belongs to one sequence: a block already gathered for an earlier sequence reads as zeros"),
    m("fp8-query-descale-missing", "an FP8 query is read as its codes: the kernel computes with fp8(q / q_scale) and never multiplies q_scale back"),
    m("local-chunk-by-whole-blocks", "chunked local attention gathers whole pages: a chunk that starts inside a block also attends the previous chunk's keys in that block"),
    m("causal-flag-of-first-request", "the batch's first request's causal flag applied to every request: a causal request behind a non-causal one sees its future keys, and the reverse"),
    m("non-causal-window-one-sided", "a non-causal request's sliding window reaches back only, as a causal kernel draws it: the w - 1 keys after the query are dropped"),
    m("prefix-lm-range-end-exclusive", "PrefixLM ranges read as [start, end) where upstream's ends are inclusive: no query of a range sees its last token"),
    m("prefix-lm-ranges-of-first-request", "the batch's first request's PrefixLM ranges applied to every request"),
    m("prefix-lm-clamp-ignored", "Gemma 4's clamp ignored: a PrefixLM range's keys are seen past the sliding window"),
    m("rswa-prefix-from-step-start", "the R-SWA prefix measured from the step's first token, not the sequence's: context keys past the prefix stay visible outside the window"),
    m("lookback-in-blocks", "chunked attention's look-back counted in cache blocks instead of chunks: a query sees k blocks before its chunk, not k chunks"),
    // The bug zoo: public bugs of paged-attention kernels, each as it behaved.
    public("window-one-short", "vllm-project/vllm#3385", "a decoder window of w attends w - 1 keys (one fewer than the model's convention)"),
    public("window-by-whole-blocks", "vllm-project/vllm#4768", "the window starts at a block boundary, so a few keys before it are attended too"),
    public("decode-ignores-window", "EricLBuehler/mistral.rs#2094", "the paged decode kernel is called without the window: decode tokens attend the whole context"),
    public("window-ignored-with-gqa", "vllm-project/vllm#17476", "the sliding window is lost when query heads share kv heads (GQA/MQA only)"),
    public("unhit-table-rows-zeroed", "vllm-project/vllm#7018", "when some sequences hit the prefix cache, the table rows of those that did not are left zeroed"),
    public("soft-cap-tanh-overflow", "vLLM CPU_ATTN, docs/findings.md", "tanh computed through exp(2x) in f32: a soft-capped logit past ~44 * cap turns the output into NaN"),
    public("pv-skipped-below-64", "vllm-project/vllm#34570", "the P·V loop runs head_size / 64 times: no value is accumulated for head sizes below 64"),
    public("custom-scale-ignored", "tenstorrent/tt-metal#33304", "the scale argument is ignored: logits use head_size^-0.5 whatever the model sets"),
    public("scale-forgotten", "mlc-ai/mlc-llm#3426", "a fallback path passes no softmax scale: logits are not scaled at all"),
    public("int32-write-offset", "vllm-project/vllm#1486", "reshape-and-cache computes element offsets in int32: past 2^31 elements a write lands elsewhere"),
    public("int32-read-offset", "vllm-project/vllm#50427", "paged K/V offsets computed in int32: past 2^31 elements a read comes from elsewhere"),
    public("page-offset-past-128", "flashinfer-ai/flashinfer#4347", "with pages above 128 tokens, the offset inside a page wraps at 128"),
    // Thresholds where kernels change path.
    m("partition-merge-no-rescale", "partitions of 256 keys merged without the max rescale (wrong only past 256 keys)"),
    m("simd-tail-dropped", "q·k skips the last head_size % 8 dimensions (a vector loop without its scalar tail)"),
    // Trace-only: state kept between steps.
    across_steps("trace-new-block-into-previous", "a decode token that starts a new block is written into the sequence's previous block"),
    across_steps("trace-stale-row-table", "a batch row keeps its last sequence's block table: not invalidated when blocks are freed and reused"),
    across_steps("trace-prefix-hit-overwritten", "a sequence admitted with a prefix hit also writes its first tokens over the last hit block"),
    across_steps("trace-stale-block-snapshot", "full blocks kept converted across steps: a block reused by a shorter sequence reads the old contents"),
    across_steps("trace-chunk-off-by-one", "a continuing chunk of a chunked prefill is written one position early"),
    across_steps("trace-head-pack-accumulator", "query heads run in packs of 16 per kv head, and the accumulator of each pack past the first is scratch not zeroed between calls: with more than 16 query heads per kv head (MQA over 48 or 128 heads) those heads start from the previous call's values"),
    across_steps("trace-stale-row-masks", "a batch row keeps the per-request masks (causal flag, PrefixLM ranges, R-SWA prefix) of the first request it held"),
    // FP8 KV caches.
    m("fp8-scale-applied-twice", "an FP8 cache read as fp8 * scale^2: the scale applied when dequantizing and again on the scores and output"),
    m("fp8-scale-not-applied", "an FP8 cache read without its scale: the stored fp8(x / scale) taken for x"),
    m("fp8-e4m3fn-read-as-fnuz", "E4M3FN codes decoded as E4M3FNUZ (bias 8): every value halved, and a stored -0 reads as NaN"),
    m("fp8-no-saturation", "cache writes convert without saturation: past 448 * scale an E4M3 value is stored as NaN (E5M2: infinity)"),
    m("fp8-per-head-scale", "the per-tensor k/v scale read as a per-head array: kv head 0 gets it, every other kv head reads 1"),
    m("kv-head-0-scale-everywhere", "per-kv-head FP8 scales read with kv head 0's scale for every head (the scale array indexed without the head)"),
    m("token-scale-of-head-0", "per-token FP8 scales read from the scale cache without its head stride: every kv head of a slot reads kv head 0's scale"),
    // Cross-attention.
    m("cross-attention-causal", "cross-attention run with the causal mask on: decoder token j sees encoder keys up to seq_len - query_len + j"),
    m("cross-attention-decoder-length", "the decoder's length used for the encoder cache: cross-attention reads query_len keys instead of the encoder's seq_len"),
    m("cross-cache-rewritten", "the cross cache rewritten every step: a later decoder step's own K/V is written over the encoder's first positions"),
    // Extreme logits (rows shifted past 1e4, q·k past f16's range, row maxima far apart).
    public("finite-max-sentinel", "flashinfer-ai/flashinfer#4267", "the online max starts at a finite -5e4 instead of -inf: a row whose every logit lies below it outputs zeros"),
    m("tile-shares-row-max", "the rows of a 16-row query tile all use the first row's max: rows whose maxima differ by more than ~88 overflow or underflow"),
    m("half-tile-row-max", "rows 64 to 127 of each 128-row query tile rescale by the row max of the row 64 before them (the tile's second half reading the first half's registers): right while their maxima are within ~80, NaN once a long chunk's rows are further apart"),
    m("qk-overflows-f16", "with f16 inputs the unscaled q·k tile is held in f16: past 65504 it is infinite and the row turns NaN"),
    // Big head groups.
    public("block-q-zero-above-16", "vllm-project/vllm#23424", "BLOCK_Q = 16 // (query heads per kv head): more than 16 per kv head divides by zero"),
    // Big steps.
    m("tokens-past-8192-skipped", "a launch grid sized for 8,192 query tokens: rows past it are never computed and read as zeros"),
    m("decode-grid-past-8192", "the decode path (plain or speculative decodes only) runs on a grid captured for 8,192 decode tokens: in an all-decode step past it the rest are never computed and read as zeros"),
    // Batch composition, in the scheduler's order.
    public("alibi-dropped-in-decode-batches", "HabanaAI/vllm-fork#437", "the decode path runs without ALiBi: a batch of decodes only attends without its bias"),
    m("alibi-positions-in-bf16", "with bf16 inputs ALiBi's positions are rounded to bf16 before the slope multiplies them: past 256 keys neighbours share a bias"),
    public("alibi-positions-in-f16", "HabanaAI/vllm-fork#503", "with f16 inputs ALiBi's positions are built in f16 (an arange in the model's dtype): past 2,048 keys neighbours share a bias"),
    m("first-prefill-as-decode", "the decode/prefill split is off by one: the first prefill behind the decodes runs through the decode path, every row at the sequence's last position"),
    // Feature pairs.
    public("sink-twice-split-kv", "ROCm/rocm-libraries#12227", "with a sliding window, a KV split wholly before the window publishes the sink and the next split seeds it again: the sink counts twice once the window starts past 256 keys"),
    // Skipped blocks: vLLM puts the null block where a window has left a block behind.
    MutantInfo {
        trace_only: true,
        ..public("window-masked-after-load", "vllm-project/vllm#49588", "the paged kernel loads every block from 0 and applies the sliding window (or local chunk) as a score mask afterwards (kernel_paged_attention_2d before vllm-project/vllm#49588): the keys before it weigh 0, but the values of a skipped block (the null block, stale memory) still enter P·V as 0 · v, and 0 · NaN is NaN")
    },
    // A corner of shape factors, each common, rarely all at once.
    public("wide-decode-chunk-reread", "tenstorrent/tt-metal#56171", "the decode path for head size 256 and up in a half dtype over blocks of 16 or 32 tokens re-reads its first 32-key chunk for every later one: right until a decode attends past 32 keys"),
    // Multi-head latent attention (one latent entry per token, V its prefix).
    m("mla-v-rows-by-dk", "MLA: V kept as rows of head_size_v but read with K's row stride head_size"),
    public("mla-v-tile-by-dv", "ikawrakow/ik_llama.cpp#2031", "MLA vec decode: keys walked in tiles of Dk rows, V stepped Dv rows per tile, so values lag their keys once a context passes Dk (576) keys"),
    m("mla-v-into-rope", "MLA: V read from the entry's last head_size_v dims, past the latent (512) into the rotary part"),
    m("mla-default-scale", "MLA: the default head_size^-0.5 (576^-0.5) used instead of the model's scale (DeepSeek: 192^-0.5)"),
    m("mla-head-padding-unpadded", "MLA under tensor-parallel splits: fewer than 16 heads per rank padded to 16 by repeating each, the output taken back as the first num_heads padded rows"),
    // Batch invariance declared and broken (only invariance pairs see these).
    variant("split-count-from-batch", "declares batch invariance, but splits a decode along its keys only when its request is alone in the step (a split count chosen from the batch size, as flash-decoding's heuristics do): the merged split rounds differently"),
    variant("split-by-batch-position", "declares order invariance, but splits the decodes of the requests at odd positions of the step and not the others (work handed out by batch position)"),
    variant("split-every-other-call", "declares run-to-run determinism, but whether a decode splits along its keys alternates from one call to the next (a split-K merge by atomic adds, whose order follows which worker arrives first): the same call repeated rounds differently"),
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
        Some(Arc::new(PlainBackend::new(
            &attn_results::BackendRef::mutant(name).to_string(),
            b,
        )) as Arc<dyn Backend>)
    };
    let variant = |v: Variance| Some(Arc::new(VariantMutant::new(name, v)) as Arc<dyn Backend>);
    let step = |b: StepBug| Some(Arc::new(StatefulMutant::new(name, b)) as Arc<dyn Backend>);
    let latent = |b: MlaBug| {
        Some(Arc::new(MlaMutant::new(
            &attn_results::BackendRef::mutant(name).to_string(),
            b,
        )) as Arc<dyn Backend>)
    };
    match name {
        "window-off-by-one" => wrap(Mutation::WindowOneWider),
        "gqa-modulo" => wrap(Mutation::GqaModulo),
        "padding-slot-written" => wrap(Mutation::PaddingSlotWraps),
        "neighbour-table-row" => wrap(Mutation::NeighbourTableRow),
        "alibi-sign-flipped" => wrap(Mutation::AlibiSignFlipped),
        "scale-applied-twice" => wrap(Mutation::ScaleTwice),
        "fp8-query-descale-missing" => wrap(Mutation::QueryDescaleMissing),
        "decoder-window-encoder-convention" => plain(Bug::DecoderWindowEncoderConvention),
        "slot-block-boundary" => plain(Bug::SlotBlockBoundary),
        "causal-offset-query-len" => plain(Bug::CausalOffsetQueryLen),
        "softmax-no-max" => plain(Bug::SoftmaxNoMax),
        "sink-in-numerator" => plain(Bug::SinkInNumerator),
        "soft-cap-after-alibi" => plain(Bug::SoftCapAfterAlibi),
        "padding-row-nan" => plain(Bug::PaddingRowNan),
        "max-query-len-from-counts" => plain(Bug::MaxQueryLenFromCounts),
        "low-precision-accumulation" => plain(Bug::LowPrecisionAccumulation),
        "scores-in-dtype" => plain(Bug::ScoresInDtype),
        "scaled-query-in-dtype" => plain(Bug::ScaledQueryInDtype),
        "every-op-in-dtype" => plain(Bug::EveryOpInDtype),
        "cascade-merge-no-rescale" => plain(Bug::CascadeMergeNoRescale),
        "page-tiles-floored" => plain(Bug::PageTilesFloored),
        "head-tile-crosses-group" => plain(Bug::HeadTileCrossesGroup),
        "split-merge-drops-rescale" => plain(Bug::SplitMergeDropsRescale),
        "last-partial-block-ignored" => plain(Bug::LastPartialBlockIgnored),
        "shared-block-gathered-once" => plain(Bug::SharedBlockGatheredOnce),
        "local-chunk-by-whole-blocks" => plain(Bug::LocalChunkByWholeBlocks),
        "lookback-in-blocks" => plain(Bug::LookbackInBlocks),
        "prefix-lm-range-end-exclusive" => plain(Bug::PrefixLmRangeEndExclusive),
        "prefix-lm-ranges-of-first-request" => plain(Bug::PrefixLmRangesOfFirstRequest),
        "prefix-lm-clamp-ignored" => plain(Bug::PrefixLmClampIgnored),
        "rswa-prefix-from-step-start" => plain(Bug::RswaPrefixFromStepStart),
        "causal-flag-of-first-request" => plain(Bug::CausalFlagOfFirstRequest),
        "non-causal-window-one-sided" => plain(Bug::NonCausalWindowOneSided),
        "window-one-short" => plain(Bug::WindowOneShort),
        "window-by-whole-blocks" => plain(Bug::WindowByWholeBlocks),
        "decode-ignores-window" => plain(Bug::DecodeIgnoresWindow),
        "window-ignored-with-gqa" => plain(Bug::WindowIgnoredWithGqa),
        "unhit-table-rows-zeroed" => plain(Bug::UnhitTableRowsZeroed),
        "soft-cap-tanh-overflow" => plain(Bug::SoftCapTanhOverflow),
        "pv-skipped-below-64" => plain(Bug::PvSkippedBelow64),
        "custom-scale-ignored" => plain(Bug::CustomScaleIgnored),
        "scale-forgotten" => plain(Bug::ScaleForgotten),
        "int32-write-offset" => plain(Bug::Int32WriteOffset),
        "int32-read-offset" => plain(Bug::Int32ReadOffset),
        "page-offset-past-128" => plain(Bug::PageOffsetPast128),
        "partition-merge-no-rescale" => plain(Bug::PartitionMergeNoRescale),
        "simd-tail-dropped" => plain(Bug::SimdTailDropped),
        "split-count-from-batch" => variant(Variance::SplitWhenAlone),
        "split-by-batch-position" => variant(Variance::SplitByPosition),
        "split-every-other-call" => variant(Variance::SplitEveryOtherCall),
        "trace-new-block-into-previous" => step(StepBug::NewBlockIntoPrevious),
        "trace-stale-row-table" => step(StepBug::StaleRowTable),
        "trace-prefix-hit-overwritten" => step(StepBug::PrefixHitOverwritten),
        "trace-stale-block-snapshot" => step(StepBug::StaleBlockSnapshot),
        "trace-chunk-off-by-one" => step(StepBug::ChunkOffByOne),
        "trace-stale-row-masks" => step(StepBug::StaleRowMasks),
        "trace-head-pack-accumulator" => step(StepBug::HeadPackAccumulator),
        "fp8-scale-applied-twice" => plain(Bug::Fp8ScaleTwice),
        "fp8-scale-not-applied" => plain(Bug::Fp8ScaleMissing),
        "fp8-e4m3fn-read-as-fnuz" => plain(Bug::Fp8ReadAsFnuz),
        "fp8-no-saturation" => plain(Bug::Fp8NoSaturation),
        "fp8-per-head-scale" => plain(Bug::Fp8PerHeadScale),
        "kv-head-0-scale-everywhere" => plain(Bug::KvHead0ScaleEverywhere),
        "token-scale-of-head-0" => plain(Bug::TokenScaleOfHead0),
        "cross-attention-causal" => plain(Bug::CrossCausal),
        "cross-attention-decoder-length" => plain(Bug::CrossDecoderLength),
        "cross-cache-rewritten" => plain(Bug::CrossCacheRewritten),
        "finite-max-sentinel" => plain(Bug::FiniteMaxSentinel),
        "tile-shares-row-max" => plain(Bug::TileSharesRowMax),
        "half-tile-row-max" => plain(Bug::HalfTileRowMax),
        "qk-overflows-f16" => plain(Bug::QkOverflowsF16),
        "block-q-zero-above-16" => plain(Bug::BlockQZeroAbove16),
        "tokens-past-8192-skipped" => plain(Bug::TokensPast8192Skipped),
        "decode-grid-past-8192" => plain(Bug::DecodeGridPast8192),
        "alibi-dropped-in-decode-batches" => plain(Bug::AlibiDroppedInDecodeBatches),
        "alibi-positions-in-bf16" => plain(Bug::AlibiPositionsInBf16),
        "alibi-positions-in-f16" => plain(Bug::AlibiPositionsInF16),
        "first-prefill-as-decode" => plain(Bug::FirstPrefillAsDecode),
        "sink-twice-split-kv" => plain(Bug::SinkTwiceSplitKv),
        "window-masked-after-load" => plain(Bug::WindowMaskedAfterLoad),
        "wide-decode-chunk-reread" => plain(Bug::WideDecodeChunkReread),
        "mla-v-rows-by-dk" => latent(MlaBug::VRowsByDk),
        "mla-v-tile-by-dv" => latent(MlaBug::VTileByDv),
        "mla-v-into-rope" => latent(MlaBug::VIntoRope),
        "mla-default-scale" => latent(MlaBug::DefaultScale),
        "mla-head-padding-unpadded" => latent(MlaBug::HeadPaddingUnpadded),
        _ => None,
    }
}
