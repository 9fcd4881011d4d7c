//! A one-line guess at the bug from where the errors are: which tokens, which heads. The
//! rule that fits is data ([`Pattern`]), so failures can be grouped by it.

use attn_reference::oracle::Visibility;
use attn_reference::{AttentionKind, Case, DType};
use attn_results::compare::Comparison;
use std::collections::BTreeSet;

/// Facts about one real token, for pattern matching.
struct TokenFacts {
    seq: usize,
    pos: usize,
    context_len: usize,
    query_len: usize,
    seq_len: usize,
}

fn facts(case: &Case, (seq, pos): (usize, usize)) -> TokenFacts {
    TokenFacts {
        seq,
        pos,
        context_len: case.context_len(seq),
        query_len: case.batch.query_lens[seq],
        seq_len: case.batch.seq_lens[seq],
    }
}

fn list(v: &BTreeSet<usize>) -> String {
    let shown: Vec<String> = v.iter().take(8).map(|x| x.to_string()).collect();
    if v.len() > 8 {
        format!("{}, … ({} in all)", shown.join(", "), v.len())
    } else {
        shown.join(", ")
    }
}

/// (sequence, position) of every real token in one pass: `Case::locate_token` scans the
/// sequences per call, which over a flood's 8,000 decodes is quadratic.
fn locate_tokens(case: &Case) -> Vec<(usize, usize)> {
    (0..case.num_seqs())
        .flat_map(|s| {
            let ctx = case.context_len(s);
            (0..case.batch.query_lens[s]).map(move |j| (s, ctx + j))
        })
        .collect()
}

/// Which rule of the hint analysis a failure's errors fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pattern {
    NonFinite,
    /// Non-finite rows exactly where the unscaled q·k passes the dtype's largest value.
    DotOverflow,
    /// Non-finite rows of a poisoned case no other rule places: an unwritten slot or a
    /// padding row read and weighed by 0.
    PoisonRead,
    PaddingSlot,
    SkippedBlock,
    WideTileRows,
    Precision,
    PositionPrecision,
    TokensPastLimit,
    KeysPastSplit,
    HeadPack,
    HeadMapping,
    KvHeadData,
    PerHeadParams,
    WindowEdge,
    ChunkEdge,
    PerRequestCausality,
    PrefixLmRange,
    RswaPrefix,
    ChunkedPrefill,
    DecodeOnly,
    PrefillOnly,
    BlockFirstSlot,
    PartialLastBlock,
    SharedPrefix,
    SomeSequences,
    Everywhere,
    /// Some rows diverge, in none of the patterns above.
    NoneFits,
}

/// What two failures of one [`Pattern`] must share besides it to be one bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// Nothing: the pattern names the mechanism (a write into the last slot, a skipped block
    /// read), whatever features the case had.
    Mechanism,
    /// The attention kind: the pattern names a feature's edge, which each kind draws its way.
    Kind,
    /// Every feature left after shrinking: the pattern alone does not tell bugs apart.
    Features,
}

impl Pattern {
    /// What failures of this pattern must share to be one bug.
    pub fn identity(self) -> Identity {
        match self {
            Pattern::PaddingSlot
            | Pattern::DotOverflow
            | Pattern::PoisonRead
            | Pattern::SkippedBlock
            | Pattern::WideTileRows
            | Pattern::TokensPastLimit
            | Pattern::KeysPastSplit
            | Pattern::HeadPack
            | Pattern::PositionPrecision
            | Pattern::BlockFirstSlot
            | Pattern::PartialLastBlock
            | Pattern::SharedPrefix => Identity::Mechanism,
            Pattern::WindowEdge
            | Pattern::ChunkEdge
            | Pattern::PerRequestCausality
            | Pattern::PrefixLmRange
            | Pattern::RswaPrefix => Identity::Kind,
            Pattern::NonFinite
            | Pattern::Precision
            | Pattern::HeadMapping
            | Pattern::KvHeadData
            | Pattern::PerHeadParams
            | Pattern::ChunkedPrefill
            | Pattern::DecodeOnly
            | Pattern::PrefillOnly
            | Pattern::SomeSequences
            | Pattern::Everywhere
            | Pattern::NoneFits => Identity::Features,
        }
    }

    /// The pattern in a few words, for a class's signature.
    pub fn label(self) -> &'static str {
        match self {
            Pattern::NonFinite => "non-finite rows",
            Pattern::DotOverflow => {
                "non-finite rows where q.k overflows the dtype before the scale"
            }
            Pattern::PoisonRead => "non-finite rows of a case with poisoned unwritten slots",
            Pattern::PaddingSlot => "tokens that read the cache's last slot",
            Pattern::SkippedBlock => "non-finite rows of sequences with skipped blocks",
            Pattern::WideTileRows => "non-finite rows past the 64th of a query chunk",
            Pattern::Precision => "errors growing with |q.k| in a 16-bit dtype",
            Pattern::PositionPrecision => "positions past a 16-bit dtype's integers",
            Pattern::TokensPastLimit => "every token past a power of two",
            Pattern::KeysPastSplit => "tokens that see more keys than a power of two",
            Pattern::HeadPack => "query heads past a pack of each kv group",
            Pattern::HeadMapping => "some heads of a kv group",
            Pattern::KvHeadData => "whole kv groups",
            Pattern::PerHeadParams => "some heads",
            Pattern::WindowEdge => "tokens the window cuts",
            Pattern::ChunkEdge => "tokens their local chunk cuts",
            Pattern::PerRequestCausality => "requests of one causality",
            Pattern::PrefixLmRange => "tokens at PrefixLM ranges",
            Pattern::RswaPrefix => "tokens R-SWA cuts",
            Pattern::ChunkedPrefill => "chunked-prefill tokens",
            Pattern::DecodeOnly => "decode tokens",
            Pattern::PrefillOnly => "prefill tokens",
            Pattern::BlockFirstSlot => "first slot of a block",
            Pattern::PartialLastBlock => "partial last blocks",
            Pattern::SharedPrefix => "sequences behind a shared prefix",
            Pattern::SomeSequences => "some sequences",
            Pattern::Everywhere => "every token and head",
            Pattern::NoneFits => "no known pattern",
        }
    }
}

/// The rule a failure fits and the hint it gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub pattern: Pattern,
    pub text: String,
}

/// Whether every diverging token belongs to a sequence whose table holds a skipped block
/// (the null block inside its `seq_len`) and every token of a sequence without one agrees.
fn only_sequences_with_skipped_blocks(
    case: &Case,
    located: &[(usize, usize)],
    bad: &BTreeSet<usize>,
) -> bool {
    let bs = case.config.block_size;
    let skips: Vec<bool> = (0..case.num_seqs())
        .map(|s| {
            let needed = case.batch.seq_lens[s].div_ceil(bs);
            case.layout.block_table[s][..needed].contains(&0)
        })
        .collect();
    let skipping = |t: usize| located.get(t).is_some_and(|&(s, _)| skips[s]);
    let others_agree = (0..located.len())
        .filter(|&t| !skipping(t))
        .all(|t| !bad.contains(&t));
    !bad.is_empty() && bad.iter().all(|&t| skipping(t)) && others_agree
}

/// Whether every diverging token is past the 64th query row of its sequence (the 64 rows
/// before it, in the same chunk, agree).
fn only_rows_past_64(case: &Case, located: &[(usize, usize)], bad: &BTreeSet<usize>) -> bool {
    !bad.is_empty()
        && bad.iter().all(|&t| {
            located
                .get(t)
                .is_some_and(|&(s, p)| p - case.context_len(s) >= 64)
        })
}

/// Whether a window of `w` cuts keys off the token `f` sees.
fn window_cuts(c: &attn_reference::AttentionConfig, w: usize, f: &TokenFacts) -> bool {
    match c.kind {
        AttentionKind::Decoder => f.pos + 1 > w,
        AttentionKind::EncoderOnly => f.pos + 1 > w || f.pos + w < f.seq_len,
        // Validation rejects a window in cross-attention.
        AttentionKind::EncoderDecoder => false,
    }
}

fn window_edge_text(c: &attn_reference::AttentionConfig, w: usize) -> String {
    format!(
        "only tokens whose window of {w} cuts off keys diverge: check the window edge (w keys including the query: {} )",
        match c.kind {
            AttentionKind::Decoder => "decoder (left, right) = (w-1, 0)",
            AttentionKind::EncoderOnly | AttentionKind::EncoderDecoder => {
                "encoder (left, right) = (w-1, w-1)"
            }
        }
    )
}

/// The window-edge hint, where every diverging token is one the window cuts and some token
/// it does not cut agrees (without other masks, whose edges would read alike).
fn window_edge_first(
    case: &Case,
    located: &[(usize, usize)],
    bad: &BTreeSet<usize>,
) -> Option<String> {
    let c = &case.config;
    let w = c.sliding_window?;
    let b = &case.batch;
    if bad.is_empty()
        || c.attention_chunk_size.is_some()
        || b.prefix_lm.is_some()
        || b.rswa.is_some()
        || b.has_non_causal()
    {
        return None;
    }
    let cut = |t: usize| window_cuts(c, w, &facts(case, located[t]));
    let uncut_agrees = (0..located.len()).any(|t| !bad.contains(&t) && !cut(t));
    (uncut_agrees && bad.iter().all(|&t| t < located.len() && cut(t)))
        .then(|| window_edge_text(c, w))
}

/// Whether the step has a padding token (slot −1) and every diverging token reads the cache's
/// last slot, where a write that indexes with −1 lands.
fn reads_padding_slot(case: &Case, bad: &BTreeSet<usize>) -> bool {
    let c = &case.config;
    let bs = c.block_size;
    let last = (case.layout.num_blocks * bs).checked_sub(1);
    let Some(last) = last.filter(|_| case.layout.slot_mapping.iter().any(|&s| s < 0)) else {
        return false;
    };
    if bad.is_empty() || c.kind == AttentionKind::EncoderDecoder {
        return false;
    }
    bad.iter().all(|&t| {
        let (seq, pos) = case.locate_token(t);
        let len = case.batch.seq_lens[seq];
        let table = &case.layout.block_table[seq];
        Visibility::of_seq(case, seq)
            .keys(pos, len)
            .iter()
            .any(|k| {
                table
                    .get(k / bs)
                    .is_some_and(|&b| b as usize * bs + k % bs == last)
            })
    })
}

/// Whether every non-finite row is one whose unscaled q·k passes the dtype's largest finite
/// value: it overflows wherever it is held in the dtype (the oracle's f64 never does).
fn dot_overflow(case: &Case, bad_cells: &[(usize, usize)]) -> Option<String> {
    let cfg = &case.config;
    let max = cfg.dtype.max_finite();
    if cfg.dtype == DType::F32 || bad_cells.is_empty() {
        return None;
    }
    let scale = cfg.effective_scale().abs();
    // Row by row, stopping at the first that does not overflow: a large case's rows are
    // computed only as far as needed (every row of a case past the size where all of its
    // logits are computed would otherwise leave an overflow unnamed).
    let mut rows = crate::failure::logit_stats::RowLogits::new(case);
    let mut largest: f64 = 0.0;
    for &(t, h) in bad_cells {
        let dot = rows.get(t, h)? / scale;
        // NaN is not past the largest value either.
        if dot.partial_cmp(&max) != Some(std::cmp::Ordering::Greater) {
            return None;
        }
        largest = largest.max(dot);
    }
    Some(format!(
        "NaN/Inf only in rows whose unscaled q.k reaches {largest:.3e}, past {}'s largest value {max:.0} (scaled by {scale:.3e}, it is {:.3e}): check that q.k and the scores are held in fp32, or that q is scaled before the product",
        cfg.dtype,
        largest * scale
    ))
}

/// Row logits below this are no precision problem for a 16-bit dtype's scores.
const PRECISION_LOGITS: f64 = 50.0;

/// In fp16 or bf16: whether the rows that diverge are the rows with the largest |q·k| (their
/// mean logit at least twice the others'), or, when every row diverges, whether the error
/// grows with the logit (rank correlation above 0.6): the scores lost precision.
fn precision(case: &Case, c: &Comparison, bad_cells: &[(usize, usize)]) -> Option<String> {
    let cfg = &case.config;
    if cfg.dtype == DType::F32 {
        return None;
    }
    let logits = crate::failure::logit_stats::row_logits(case)?;
    let hq = cfg.num_heads;
    let largest = logits.iter().copied().fold(0.0, f64::max);
    if largest < PRECISION_LOGITS || logits.len() < 2 {
        return None;
    }
    let bad: BTreeSet<usize> = bad_cells.iter().map(|&(t, h)| t * hq + h).collect();
    let mean = |rows: &mut dyn Iterator<Item = f64>| {
        let (sum, n) = rows.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
        (n > 0).then(|| sum / n as f64)
    };
    let bad_mean = mean(&mut bad.iter().map(|&r| logits[r]))?;
    let grows = match mean(
        &mut (0..logits.len())
            .filter(|r| !bad.contains(r))
            .map(|r| logits[r]),
    ) {
        Some(good_mean) => bad_mean >= 2.0 * good_mean,
        None => rank_correlation(&logits, &c.err_map) > 0.6,
    };
    grows.then(|| format!(
        "the error grows with |q.k| (largest scaled logit {largest:.3e}) in {}: check that scores and the softmax's exponent are computed in fp32, not in the dtype",
        cfg.dtype
    ))
}

/// In fp16 or bf16 with a positional feature on: whether every diverging token sits past, or
/// sees a key past, the last position the dtype holds exactly (f16: 2,048, bf16: 256), with
/// evidence that a rounded position is the cause. Under ALiBi a rounded position costs a head
/// in proportion to its slope: the diverging heads are the steepest ones. Otherwise every
/// diverging position is one the dtype cannot hold, while a token at or below the limit
/// agrees.
fn position_precision(
    case: &Case,
    located: &[(usize, usize)],
    bad_tokens: &BTreeSet<usize>,
    bad_heads: &BTreeSet<usize>,
) -> Option<String> {
    let cfg = &case.config;
    let exact = match cfg.dtype {
        DType::F16 => 2048,
        DType::Bf16 => 256,
        DType::F32 => return None,
    };
    let positional: Vec<&str> = attn_results::precision::POSITIONAL_FEATURES
        .into_iter()
        .filter(|f| f.used_by(cfg) || f.used_by_batch(&case.batch))
        .map(|f| f.label())
        .collect();
    let position = |t: usize| located[t].1;
    // The furthest position a token's logits use: its own, or a later key it sees (a
    // non-causal request, a PrefixLM range).
    let furthest = |t: usize| {
        let (seq, pos) = located[t];
        let keys = Visibility::of_seq(case, seq).keys(pos, case.batch.seq_lens[seq]);
        let last_key = keys
            .spans()
            .last()
            .map_or(0, |&(_, end)| end.saturating_sub(1));
        pos.max(last_key)
    };
    if positional.is_empty() || !bad_tokens.iter().all(|&t| furthest(t) > exact) {
        return None;
    }
    let evidence = match &cfg.alibi_slopes {
        Some(slopes) => {
            let steeper = |a: usize, b: usize| slopes[a].abs() > slopes[b].abs();
            (0..cfg.num_heads)
                .all(|h| bad_heads.contains(&h) || !bad_heads.iter().any(|&b| steeper(h, b)))
        }
        None => {
            let agrees_below = (0..case.num_real_tokens())
                .any(|t| !bad_tokens.contains(&t) && furthest(t) <= exact);
            agrees_below
                && bad_tokens
                    .iter()
                    .all(|&t| !cfg.dtype.represents(position(t) as f32))
        }
    };
    evidence.then(|| format!(
        "only tokens at or reading positions past {exact} diverge, where {} stops holding every integer, with {} on: check that positions (ALiBi's k - p, window, chunk and range edges) are computed in int32 or fp32, not in the model's dtype",
        cfg.dtype,
        positional.join(", ")
    ))
}

/// The power of two `p` (64 to 8,192) that splits the tokens: every diverging token sees
/// more than `p` keys, and a token that sees `p` or fewer agrees. Only where no mask edge
/// (window, chunk, R-SWA, PrefixLM range, causality per request) decides how many keys a
/// token sees: those rules, later, place the errors better.
fn keys_past_split(
    case: &Case,
    located: &[(usize, usize)],
    bad_tokens: &BTreeSet<usize>,
) -> Option<usize> {
    let c = &case.config;
    let edges = c.sliding_window.is_some()
        || c.attention_chunk_size.is_some()
        || case.batch.has_non_causal()
        || case.batch.prefix_lm.is_some()
        || case.batch.rswa.is_some();
    if edges || c.kind != AttentionKind::Decoder {
        return None;
    }
    let seen: Vec<usize> = located
        .iter()
        .map(|&(seq, pos)| {
            Visibility::of_seq(case, seq)
                .keys(pos, case.batch.seq_lens[seq])
                .count()
        })
        .collect();
    let fewest_bad = bad_tokens.iter().map(|&t| seen[t]).min()?;
    let split = 1usize << (fewest_bad - 1).checked_ilog2()?;
    let agrees_below = (0..seen.len()).any(|t| !bad_tokens.contains(&t) && seen[t] <= split);
    ((64..=8192).contains(&split) && agrees_below).then_some(split)
}

/// The pack size `p` (a power of two from 2 up) when the diverging heads are exactly those
/// at place `p` or later within their kv group, in every group.
fn head_pack(cfg: &attn_reference::AttentionConfig, bad_heads: &BTreeSet<usize>) -> Option<usize> {
    let group = cfg.group_size();
    let first = bad_heads.iter().map(|h| h % group).min()?;
    let exact = (0..cfg.num_heads).all(|h| bad_heads.contains(&h) == (h % group >= first));
    (first >= 2 && first.is_power_of_two() && exact).then_some(first)
}

/// Spearman's rank correlation of `a` and `b` (ties by order).
pub(crate) fn rank_correlation(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    if n < 2 {
        return 0.0;
    }
    let ranks = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
        let mut r = vec![0.0; n];
        for (rank, &i) in idx.iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let (ra, rb) = (ranks(a), ranks(b));
    let d2: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - y) * (x - y)).sum();
    let n = n as f64;
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

/// The hint for a failed comparison, if a pattern stands out.
pub fn hint(case: &Case, c: &Comparison) -> Option<String> {
    finding(case, c).map(|f| f.text)
}

/// The rule a failed comparison fits and its hint, if a pattern stands out.
pub fn finding(case: &Case, c: &Comparison) -> Option<Finding> {
    let found = |pattern: Pattern, text: String| Some(Finding { pattern, text });
    let c_cfg = &case.config;
    let hq = c_cfg.num_heads;
    let tokens = case.num_real_tokens();
    let bad_cells: Vec<(usize, usize)> = (0..tokens * hq)
        .filter(|&cell| {
            c.failed[cell * c_cfg.head_size_v()..(cell + 1) * c_cfg.head_size_v()]
                .iter()
                .any(|&f| f)
        })
        .map(|cell| (cell / hq, cell % hq))
        .collect();
    let bad_tokens: BTreeSet<usize> = bad_cells.iter().map(|&(t, _)| t).collect();
    let bad_heads: BTreeSet<usize> = bad_cells.iter().map(|&(_, h)| h).collect();
    let located = locate_tokens(case);

    // Before the window and sequence rules: a padding write into the last slot looks like
    // either, depending on who reads that slot. Before the non-finite rule too: what the
    // padding row held (NaN under poison, a finite value otherwise) decides which symptom
    // it gives, the place is the same.
    if reads_padding_slot(case, &bad_tokens) {
        return found(Pattern::PaddingSlot, "only tokens that read the cache's last slot diverge, and the step has padding tokens (slot -1): check that the KV write skips slot -1 instead of indexing the last slot with it".into());
    }
    // A skipped block is the null block: stale memory, NaN under poison. Non-finite rows
    // only where a table holds one point at a kernel that loads it and masks afterwards.
    if c.non_finite && only_sequences_with_skipped_blocks(case, &located, &bad_tokens) {
        return found(Pattern::SkippedBlock, "NaN/Inf only in sequences whose block table holds skipped blocks (the null block where a window or local chunk left a block behind, as vLLM frees them): check that the kernel never loads keys or values before the first block its queries see; a masked key's value still meets its weight of 0 in P·V (0 · NaN = NaN)".into());
    }
    if c.non_finite && only_rows_past_64(case, &located, &bad_tokens) {
        return found(Pattern::WideTileRows, "NaN/Inf only in rows past the 64th of a sequence's query chunk, while its first 64 rows agree: check what a wide query tile (128 rows, say) shares between its halves; a row rescaled by another row's running max overflows or underflows once their maxima lie far apart".into());
    }
    if c.non_finite {
        if let Some(text) = dot_overflow(case, &bad_cells) {
            return found(Pattern::DotOverflow, text);
        }
        if let Some(p) = case.poison {
            return found(Pattern::PoisonRead, format!(
                "NaN/Inf reached a real row of a case whose unwritten cache slots and padding rows hold {p} (the oracle never reads them): check that the kernel neither loads an unwritten slot (a partial last block's tail, a spare or freed block) nor a padding row, or that it masks them before P.V, since a weight of 0 times {p} is NaN"
            ));
        }
        return found(Pattern::NonFinite, "NaN/Inf reached a real row: a fully masked row, a padding row or an unguarded softmax (no max subtraction) leaked".into());
    }
    if bad_cells.is_empty() {
        return None;
    }

    // Every token from a power of two on (but those whose expected row is about 0 anyway),
    // none before: a grid, buffer or graph size.
    if let Some(&first) = bad_tokens.first().filter(|&&t| t >= 256) {
        let limit = 1usize << first.ilog2();
        let tail = bad_tokens.len() * 10 >= (tokens - limit) * 9;
        if tail {
            return found(Pattern::TokensPastLimit, format!(
                "the tokens from the step's {limit}th on diverge and none before: check a launch grid, buffer or CUDA-graph size of {limit} tokens (a kernel that silently stops there)"
            ));
        }
    }

    if let Some(split) = keys_past_split(case, &located, &bad_tokens) {
        return found(Pattern::KeysPastSplit, format!(
            "only tokens that see more than {split} keys diverge, and those that see {split} or fewer agree: check where the kernel splits the keys in {split}-key partitions (the merge's rescale by exp(m_i - m), a partition's bounds)"
        ));
    }

    if let Some(text) = precision(case, c, &bad_cells) {
        return found(Pattern::Precision, text);
    }

    if let Some(text) = position_precision(case, &located, &bad_tokens, &bad_heads) {
        return found(Pattern::PositionPrecision, text);
    }

    // The window's edge before the heads: an off-by-one there errs on some heads only (the
    // extra key matters more to some), which reads like a head mapping, but only the
    // window-cut tokens diverge while an uncut one agrees.
    if let Some(text) = window_edge_first(case, &located, &bad_tokens) {
        return found(Pattern::WindowEdge, text);
    }

    // Heads: a partial set points at the head mapping or at one kv head's data.
    if let Some(pack) = head_pack(c_cfg, &bad_heads) {
        return found(Pattern::HeadPack, format!(
            "only query heads past the first {pack} of each kv group diverge (group of {}): check what the kernel keeps per pack of {pack} heads past the first (an accumulator or scratch not reset between calls, a pack's offsets)",
            c_cfg.group_size()
        ));
    }
    if bad_heads.len() < hq {
        let kv: BTreeSet<usize> = bad_heads.iter().map(|&h| c_cfg.kv_head_of(h)).collect();
        let whole_groups = kv.iter().all(|&k| {
            (0..c_cfg.group_size()).all(|g| bad_heads.contains(&(k * c_cfg.group_size() + g)))
        });
        if c_cfg.group_size() > 1 && !whole_groups {
            return found(Pattern::HeadMapping, format!(
                "only heads {} diverge, not whole kv groups: check the query-head to kv-head mapping (h / (Hq/Hkv) = h / {})",
                list(&bad_heads),
                c_cfg.group_size()
            ));
        }
        if c_cfg.num_kv_heads > 1 {
            return found(Pattern::KvHeadData, format!("only the query heads of kv head(s) {} diverge: check how K/V of those kv heads are stored or read", list(&kv)));
        }
        if c_cfg.alibi_slopes.is_some() || c_cfg.sinks.is_some() {
            return found(
                Pattern::PerHeadParams,
                format!(
                    "only heads {} diverge: check per-head parameters (ALiBi slopes, sinks)",
                    list(&bad_heads)
                ),
            );
        }
    }

    let all: Vec<TokenFacts> = located.iter().map(|&l| facts(case, l)).collect();
    let bad: Vec<&TokenFacts> = bad_tokens.iter().map(|&t| &all[t]).collect();
    let good: Vec<&TokenFacts> = (0..tokens)
        .filter(|t| !bad_tokens.contains(t))
        .map(|t| &all[t])
        .collect();
    let only = |pred: &dyn Fn(&TokenFacts) -> bool| {
        bad.iter().all(|f| pred(f)) && !good.iter().all(|f| pred(f))
    };

    // PrefixLM before the window: a range clamped to the window, or not, errs where the
    // window cuts. The errors keep to positions inside a range, of the token's own request
    // or of another's (ranges read through the wrong row).
    if let Some(p) = &case.batch.prefix_lm {
        let in_a_range = |f: &&TokenFacts| {
            p.ranges
                .iter()
                .flatten()
                .any(|&(a, b)| a <= f.pos && f.pos <= b)
        };
        // A range that reaches past the step's keys: vLLM passes it whole while chunked
        // prefill is inside it, and a kernel that reads its keys up to its end reads past
        // the sequence.
        let in_a_range_past_the_keys = |f: &&TokenFacts| {
            p.ranges.get(f.seq).is_some_and(|r| {
                r.iter()
                    .any(|&(a, b)| a <= f.pos && f.pos <= b && b >= case.batch.seq_lens[f.seq])
            })
        };
        if bad.iter().all(in_a_range_past_the_keys) {
            return found(
                Pattern::PrefixLmRange,
                "only tokens in PrefixLM ranges that reach past the step's seq_len diverge: vLLM passes an image's whole range while chunked prefill is inside it; read a range's keys only up to seq_len - 1".into(),
            );
        }
        if bad.iter().all(in_a_range) {
            return found(Pattern::PrefixLmRange, format!(
                "only tokens at positions of PrefixLM ranges diverge: check a range's end (inclusive: [a, b] holds b - a + 1 tokens), that each request reads its own ranges (batch.prefix_lm.ranges[seq]){}",
                if p.clamp_to_window { ", and that the window clamps a range's keys (p - k < w, Gemma 4)" } else { "" }
            ));
        }
    }
    // R-SWA: the errors keep to tokens whose window leaves a gap after the prefix.
    if let Some(r) = &case.batch.rswa {
        let gap = |f: &&TokenFacts| f.pos + 1 > r.window + r.prefix_lens[f.seq];
        if bad.iter().all(gap) {
            return found(Pattern::RswaPrefix, format!(
                "only tokens past their R-SWA prefix and window of {} diverge: check that keys below the request's prefix length (batch.rswa.prefix_lens[seq], counted from the sequence's first token, not the step's) stay visible, the rest only within the window",
                r.window
            ));
        }
    }
    if let Some(w) = c_cfg.sliding_window {
        if bad.iter().all(|f| window_cuts(c_cfg, w, f)) {
            return found(Pattern::WindowEdge, window_edge_text(c_cfg, w));
        }
    }
    // Per-request causality: the errors keep to the non-causal requests, or to the causal
    // ones beside them.
    if case.batch.has_non_causal() {
        let causal = |f: &&TokenFacts| case.batch.is_causal(f.seq);
        // Keys after the query: what only a non-causal request sees.
        let sees_later = |f: &&TokenFacts| f.pos + 1 < f.seq_len && c_cfg.sliding_window != Some(1);
        if bad.iter().all(|f| !causal(f) && sees_later(f)) {
            return found(Pattern::PerRequestCausality, "only tokens of non-causal requests diverge: check that such a request sees every key of its sequence, and a window both ways (|p - k| < w)".into());
        }
        if bad.iter().all(causal) {
            return found(Pattern::PerRequestCausality, "only causal requests diverge, in a batch with non-causal ones: check that causality is read per request (batch.causal[seq]), not once per batch".into());
        }
    }
    if let (AttentionKind::Decoder, Some(chunk)) = (c_cfg.kind, c_cfg.attention_chunk_size) {
        let back = c_cfg.chunk_lookback.unwrap_or(0);
        let start = |f: &TokenFacts| (f.pos / chunk).saturating_sub(back) * chunk;
        if bad.iter().all(|f| start(f) > 0) && !good.iter().all(|f| start(f) > 0) {
            return found(Pattern::ChunkEdge, format!(
                "only tokens whose local chunk cuts off earlier keys diverge: check the chunk's first key, (p / {chunk} - {back}) * {chunk} (the chunk size {chunk}, a look-back of {back} chunks, not blocks)"
            ));
        }
    }
    // A crowd behind one prefix: the errors keep to its sequences while others agree.
    let crowd = crowd_of(case);
    if let Some((readers, members)) = &crowd {
        let bad_seqs: BTreeSet<usize> = bad.iter().map(|f| f.seq).collect();
        let others_agree = good.iter().any(|f| !members.contains(&f.seq));
        // A crowd of 8 or more is what cascade paths take: named even when every sequence
        // of the case is in it.
        if bad_seqs.is_subset(members) && (others_agree || *readers >= 8) {
            let which = if others_agree {
                "and the others agree".to_string()
            } else {
                format!("sequence(s) {} of them", list(&bad_seqs))
            };
            return found(Pattern::SharedPrefix, format!(
                "only sequences behind a prefix {readers} sequences share diverge ({which}): check the shared-prefix (cascade) path, the prefix's and each suffix's partial softmaxes merged by their maxima and sums (exp(m_i - m) on both), and those sequences' block-table rows"
            ));
        }
    }
    if only(&|f| f.context_len > 0 && f.query_len > 1) {
        return found(Pattern::ChunkedPrefill, "only tokens of chunked prefills (context before several new tokens) diverge: check the causal offset (position = context_len + j)".into());
    }
    if only(&|f| f.query_len == 1) {
        return found(Pattern::DecodeOnly, "only decode tokens (query_len 1) diverge: check the decode path (split-KV merge, decode-specific kernel)".into());
    }
    if only(&|f| f.query_len > 1) {
        return found(Pattern::PrefillOnly, "only prefill tokens (query_len > 1) diverge: check the prefill path and its causal mask".into());
    }
    if only(&|f| f.pos % c_cfg.block_size == 0) {
        return found(Pattern::BlockFirstSlot, "only tokens at the first slot of a block diverge: check block boundaries in slot computation or gathering".into());
    }
    let bs = c_cfg.block_size;
    if only(&|f| f.seq_len % bs != 0) {
        return found(
            Pattern::PartialLastBlock,
            "only sequences whose last block is partial diverge: check the last, partial block"
                .into(),
        );
    }
    let seqs: BTreeSet<usize> = bad.iter().map(|f| f.seq).collect();
    if case.num_seqs() > 1 && seqs.len() < case.num_seqs() {
        return found(
            Pattern::SomeSequences,
            format!(
            "only sequence(s) {} diverge: check their block-table rows and query_start_loc offsets",
            list(&seqs)
        ),
        );
    }
    if bad_cells.len() < tokens * hq {
        return found(
            Pattern::NoneFits,
            format!(
                "no rule fits: {} of {} (token, head) rows diverge in no pattern the hint knows (tokens {}, heads {})",
                bad_cells.len(),
                tokens * hq,
                list(&bad_tokens),
                list(&bad_heads)
            ),
        );
    }
    let features: Vec<String> = c_cfg
        .features()
        .into_iter()
        .chain(attn_reference::Feature::of_batch(&case.batch).map(|f| f.label().to_string()))
        .collect();
    // The case's corners a kernel takes a path of its own for, as suspects.
    let mut corners = features;
    if let Some((readers, _)) = &crowd {
        corners.push(format!(
            "a prefix {readers} sequences share: a cascade path"
        ));
    }
    if let Some(tail) = odd_page_tail(case) {
        corners.push(format!(
            "decodes over 3+ pages of {bs} keys: a page walked in 64-key tiles leaves {tail} keys"
        ));
    }
    found(Pattern::Everywhere, format!(
        "every token and head diverges: check the scale, the softmax, value gathering, or a feature applied wrongly ({})",
        corners.join(", ")
    ))
}

/// The crowd of `case`: the most sequences one block is read by (5 or more) and the
/// sequences that read such a block.
fn crowd_of(case: &Case) -> Option<(usize, BTreeSet<usize>)> {
    let bs = case.config.block_size.max(1);
    let used = |s: usize| &case.layout.block_table[s][..case.batch.seq_lens[s].div_ceil(bs)];
    let mut readers: std::collections::HashMap<u32, BTreeSet<usize>> = Default::default();
    for s in 0..case.num_seqs() {
        for &b in used(s) {
            readers.entry(b).or_default().insert(s);
        }
    }
    let most = readers.values().map(BTreeSet::len).max().unwrap_or(0);
    (most >= 5).then(|| {
        let members = readers
            .values()
            .filter(|r| r.len() >= 5)
            .flatten()
            .copied()
            .collect();
        (most, members)
    })
}

/// The keys past a page's last 64-key tile, when `case` decodes over 3 pages or more of a
/// block size past 64 and not a multiple of it.
fn odd_page_tail(case: &Case) -> Option<usize> {
    let bs = case.config.block_size;
    let long_decode = (0..case.num_seqs())
        .any(|s| case.batch.query_lens[s] == 1 && case.batch.seq_lens[s].div_ceil(bs.max(1)) >= 3);
    (case.config.kind == AttentionKind::Decoder && bs > 64 && !bs.is_multiple_of(64) && long_decode)
        .then_some(bs % 64)
}
