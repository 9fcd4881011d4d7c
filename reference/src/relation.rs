//! Invariance relations: transformations of a decoder case under which a request's output
//! rows must not change, bit for bit, in a backend that is batch-invariant. Each relation
//! maps a case to the cases to run instead and pairs every compared row of the original
//! with its row there. The oracle is not involved: the backend's outputs are compared with
//! each other.

use crate::{AttentionKind, Case, InputRng};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a relation changes about a request's surroundings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// The request alone in its batch: the other requests (other lengths, other phases)
    /// removed.
    Batch,
    /// The batch's requests in reverse order (the scheduler's order: longest first or last).
    Order,
    /// The request's new tokens computed in two steps (chunked prefill, or a prefix-cache
    /// hit for the first part) instead of one.
    Chunking,
    /// Every block at another physical id, with unused blocks between them.
    Placement,
    /// The very same call made again (run-to-run determinism).
    Repetition,
}

/// Which form of a case an invariance pair compared it with: the relation and the choices
/// it made, so [`transform`] rebuilds the other form exactly (what a pair's replay file
/// records).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairOf {
    pub relation: Relation,
    pub pick: u64,
    /// The run held the backend to the relation (`check --hold`) though it does not
    /// declare it: replay judges it so too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held_to: bool,
}

impl Relation {
    pub const ALL: [Relation; 5] = [
        Relation::Batch,
        Relation::Order,
        Relation::Chunking,
        Relation::Placement,
        Relation::Repetition,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Relation::Batch => "batch",
            Relation::Order => "order",
            Relation::Chunking => "chunking",
            Relation::Placement => "placement",
            Relation::Repetition => "repetition",
        }
    }

    /// What was changed, in words a hint can use.
    pub fn change(self) -> &'static str {
        match self {
            Relation::Batch => "the request ran alone instead of in its batch",
            Relation::Order => "the batch's requests ran in reverse order",
            Relation::Chunking => "the request's new tokens ran in two steps instead of one",
            Relation::Placement => "the cache's blocks moved to other physical ids",
            Relation::Repetition => "the same call ran again",
        }
    }

    /// Where a bug that breaks it usually lives.
    pub fn suspect(self) -> &'static str {
        match self {
            Relation::Batch => {
                "a work split (split-KV count, tile or thread partition) chosen from the batch's \
                 size or total tokens"
            }
            Relation::Order => "a reduction or work split that depends on a request's position",
            Relation::Chunking => {
                "a prefill path that rounds differently from the path of a shorter query or a \
                 longer context (another tile shape, a decode kernel, a merged split)"
            }
            Relation::Placement => {
                "arithmetic that depends on physical block ids (a block walk's order or split by \
                 id, a stale cache read)"
            }
            Relation::Repetition => {
                "non-determinism: a thread-count or scheduling dependent sum, atomics, or \
                 uninitialised memory"
            }
        }
    }

    /// The relation named `name`.
    pub fn parse(name: &str) -> Option<Relation> {
        Relation::ALL.into_iter().find(|r| r.name() == name)
    }

    /// A comma-separated list of relation names (`all`: every one), or an error naming the
    /// unknown one and the known.
    pub fn parse_list(text: &str) -> Result<Vec<Relation>, String> {
        if text == "all" {
            return Ok(Relation::ALL.to_vec());
        }
        text.split(',')
            .map(|n| {
                Relation::parse(n.trim()).ok_or_else(|| {
                    let known: Vec<&str> = Relation::ALL.iter().map(|r| r.name()).collect();
                    format!(
                        "unknown relation `{n}` (known: {}, or all)",
                        known.join(", ")
                    )
                })
            })
            .collect()
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A case transformed under one relation.
#[derive(Clone, Debug)]
pub struct Transformed {
    pub relation: Relation,
    /// The cases run instead of the original (two for chunking, one otherwise).
    pub cases: Vec<Case>,
    /// The compared rows: (token row of the original, index into `cases`, token row there).
    pub rows: Vec<(usize, usize, usize)>,
    /// The request the relation is about; `None`: every request's rows are compared.
    pub request: Option<usize>,
}

/// `case` under `relation`, its choices (which request, where to split, where blocks go)
/// made from `pick`; `None` where the relation does not apply (a decoder case only; two or
/// more requests for batch and order; a causal request of two or more new tokens and no
/// PrefixLM range for chunking) or a transformed case would not be valid.
pub fn transform(case: &Case, relation: Relation, pick: u64) -> Option<Transformed> {
    if case.config.kind != AttentionKind::Decoder || case.num_tokens() == 0 {
        return None;
    }
    let rows = TokenRows::of(case)?;
    let scheduled: Vec<usize> = (0..case.num_seqs())
        .filter(|&s| case.batch.query_lens[s] > 0)
        .collect();
    let chosen = |among: &[usize]| among[(pick % among.len().max(1) as u64) as usize];
    let t = match relation {
        Relation::Batch => {
            if case.num_seqs() < 2 || scheduled.is_empty() {
                return None;
            }
            let r = chosen(&scheduled);
            let (alone, map) = reorder(case, &rows, &[r]);
            Transformed {
                relation,
                cases: vec![alone],
                rows: map.into_iter().map(|(a, b)| (a, 0, b)).collect(),
                request: Some(r),
            }
        }
        Relation::Order => {
            if scheduled.len() < 2 {
                return None;
            }
            let order: Vec<usize> = (0..case.num_seqs()).rev().collect();
            let (reversed, map) = reorder(case, &rows, &order);
            Transformed {
                relation,
                cases: vec![reversed],
                rows: map.into_iter().map(|(a, b)| (a, 0, b)).collect(),
                request: None,
            }
        }
        Relation::Chunking => {
            let splittable: Vec<usize> = (0..case.num_seqs())
                .filter(|&s| {
                    case.batch.query_lens[s] >= 2
                        && crate::is_causal(case.batch.causal.as_deref(), s)
                        && case
                            .batch
                            .prefix_lm
                            .as_ref()
                            .is_none_or(|p| p.ranges.get(s).is_none_or(Vec::is_empty))
                })
                .collect();
            if splittable.is_empty() {
                return None;
            }
            let r = chosen(&splittable);
            let q = case.batch.query_lens[r];
            let split = 1 + ((pick >> 16) % (q as u64 - 1)) as usize;
            chunked(case, &rows, r, split)
        }
        Relation::Placement => placed(case, pick),
        Relation::Repetition => Transformed {
            relation,
            cases: vec![case.clone()],
            rows: (0..case.num_real_tokens()).map(|t| (t, 0, t)).collect(),
            request: None,
        },
    };
    t.cases.iter().all(|c| c.validate().is_ok()).then_some(t)
}

/// `case` with only the sequences `seqs`, in that order, its values kept (padding tokens
/// kept at the end): what shrinking a fixed case (a recorded engine call) tries. `None` where
/// the result would not be valid.
pub fn keep_sequences(case: &Case, seqs: &[usize]) -> Option<Case> {
    let rows = TokenRows::of(case)?;
    if seqs.iter().any(|&s| s >= case.num_seqs()) {
        return None;
    }
    let (out, _) = reorder(case, &rows, seqs);
    out.validate().is_ok().then_some(out)
}

/// `case` with sequence `seq` cut after its first `keep` new tokens (the later ones not yet
/// scheduled), values kept: a causal request's earlier rows do not depend on the rest.
/// `None` where that does not apply (a non-causal request, PrefixLM ranges, `keep` not
/// below its new tokens) or the result would not be valid.
pub fn first_tokens(case: &Case, seq: usize, keep: usize) -> Option<Case> {
    let rows = TokenRows::of(case)?;
    let q = *case.batch.query_lens.get(seq)?;
    let ranged = case
        .batch
        .prefix_lm
        .as_ref()
        .is_some_and(|p| p.ranges.get(seq).is_some_and(|r| !r.is_empty()));
    if keep == 0
        || keep >= q
        || ranged
        || case.config.kind != AttentionKind::Decoder
        || !crate::is_causal(case.batch.causal.as_deref(), seq)
    {
        return None;
    }
    let out = chunked(case, &rows, seq, keep).cases.into_iter().next()?;
    out.validate().is_ok().then_some(out)
}

/// `case` without its padding tokens (rows that belong to no sequence).
pub fn without_padding(case: &Case) -> Option<Case> {
    let rows = TokenRows::of(case)?;
    let real = case.num_real_tokens();
    let mut out = case.clone();
    out.recorded = None;
    out.batch.num_padding_tokens = 0;
    out.layout.slot_mapping.truncate(real);
    let t = &case.tensors;
    out.tensors.query = gather(&t.query, rows.query, 0..real);
    out.tensors.key = gather(&t.key, rows.key, 0..real);
    out.tensors.value = gather(&t.value, rows.value, 0..real);
    out.validate().is_ok().then_some(out)
}

/// The widths of one token's rows in a case's per-token tensors.
struct TokenRows {
    query: usize,
    key: usize,
    value: usize,
}

impl TokenRows {
    fn of(case: &Case) -> Option<TokenRows> {
        let n = case.num_tokens();
        let width = |len: usize| len.is_multiple_of(n).then_some(len / n);
        Some(TokenRows {
            query: width(case.tensors.query.len())?,
            key: width(case.tensors.key.len())?,
            value: width(case.tensors.value.len())?,
        })
    }
}

/// The first token row of each sequence.
fn starts(case: &Case) -> Vec<usize> {
    let mut at = 0;
    case.batch
        .query_lens
        .iter()
        .map(|&q| {
            let s = at;
            at += q;
            s
        })
        .collect()
}

/// Token rows `rows` of `v`, `width` values each, in that order.
fn gather(v: &[f32], width: usize, rows: impl Iterator<Item = usize>) -> Vec<f32> {
    rows.flat_map(|t| v[t * width..(t + 1) * width].iter().copied())
        .collect()
}

/// `case` with only the sequences `seqs`, in that order (its padding tokens kept at the
/// end), and the row map (original row, new row) of their tokens.
fn reorder(case: &Case, w: &TokenRows, seqs: &[usize]) -> (Case, Vec<(usize, usize)>) {
    let start = starts(case);
    let real = case.num_real_tokens();
    let mut token_order: Vec<usize> = seqs
        .iter()
        .flat_map(|&s| start[s]..start[s] + case.batch.query_lens[s])
        .collect();
    let map: Vec<(usize, usize)> = token_order
        .iter()
        .enumerate()
        .map(|(new, &old)| (old, new))
        .collect();
    token_order.extend(real..case.num_tokens());
    let pick = |v: &[_]| seqs.iter().map(|&s| v[s]).collect::<Vec<_>>();
    let mut out = case.clone();
    out.recorded = None;
    let b = &mut out.batch;
    b.seq_lens = pick(&case.batch.seq_lens);
    b.query_lens = pick(&case.batch.query_lens);
    b.causal = case.batch.causal.as_ref().map(|c| {
        seqs.iter()
            .map(|&s| c.get(s).copied().unwrap_or(true))
            .collect()
    });
    if let (Some(p), Some(orig)) = (b.prefix_lm.as_mut(), case.batch.prefix_lm.as_ref()) {
        p.ranges = seqs
            .iter()
            .map(|&s| orig.ranges.get(s).cloned().unwrap_or_default())
            .collect();
    }
    if let (Some(r), Some(orig)) = (b.rswa.as_mut(), case.batch.rswa.as_ref()) {
        r.prefix_lens = seqs
            .iter()
            .map(|&s| orig.prefix_lens.get(s).copied().unwrap_or(0))
            .collect();
    }
    out.layout.block_table = seqs
        .iter()
        .map(|&s| case.layout.block_table[s].clone())
        .collect();
    out.layout.slot_mapping = token_order
        .iter()
        .map(|&t| case.layout.slot_mapping[t])
        .collect();
    let t = &case.tensors;
    out.tensors.query = gather(&t.query, w.query, token_order.iter().copied());
    out.tensors.key = gather(&t.key, w.key, token_order.iter().copied());
    out.tensors.value = gather(&t.value, w.value, token_order.iter().copied());
    out.tensors.context_key = seqs.iter().map(|&s| t.context_key[s].clone()).collect();
    out.tensors.context_value = seqs.iter().map(|&s| t.context_value[s].clone()).collect();
    (out, map)
}

/// `case` with sequence `r`'s new tokens computed in two steps: the first `split` of them
/// (the later ones not yet scheduled), then the rest with the first part already in the
/// cache as context.
fn chunked(case: &Case, w: &TokenRows, r: usize, split: usize) -> Transformed {
    let start = starts(case)[r];
    let q = case.batch.query_lens[r];
    let all: Vec<usize> = (0..case.num_tokens()).collect();
    let keep = |drop: std::ops::Range<usize>| -> Vec<usize> {
        all.iter().copied().filter(|t| !drop.contains(t)).collect()
    };
    let with_tokens = |case: &Case, tokens: &[usize]| -> Case {
        let mut out = case.clone();
        out.recorded = None;
        out.layout.slot_mapping = tokens
            .iter()
            .map(|&t| case.layout.slot_mapping[t])
            .collect();
        let t = &case.tensors;
        out.tensors.query = gather(&t.query, w.query, tokens.iter().copied());
        out.tensors.key = gather(&t.key, w.key, tokens.iter().copied());
        out.tensors.value = gather(&t.value, w.value, tokens.iter().copied());
        out
    };
    // First step: the first `split` new tokens; the sequence ends there.
    let mut first = with_tokens(case, &keep(start + split..start + q));
    first.batch.seq_lens[r] -= q - split;
    first.batch.query_lens[r] = split;
    // Second step: the rest, the first part's K/V now read from the cache as context.
    let mut second = with_tokens(case, &keep(start..start + split));
    second.batch.query_lens[r] = q - split;
    let t = &case.tensors;
    second.tensors.context_key[r].extend(gather(&t.key, w.key, start..start + split));
    second.tensors.context_value[r].extend(gather(&t.value, w.value, start..start + split));
    let rows = (0..case.num_real_tokens())
        .filter_map(|t| {
            if t < start || t >= start + q {
                return None;
            }
            let k = t - start;
            Some(if k < split {
                (t, 0, t)
            } else {
                (t, 1, start + k - split)
            })
        })
        .collect();
    Transformed {
        relation: Relation::Chunking,
        cases: vec![first, second],
        rows,
        request: Some(r),
    }
}

/// Caches past this many blocks are permuted in place rather than spread over twice the
/// blocks (the cache's memory stays what the case asked for).
const SPREAD_UP_TO: usize = 1 << 14;

/// `case` with every block but the null block 0 at another physical id, drawn from `pick`:
/// a cache of up to [`SPREAD_UP_TO`] blocks grows to twice its blocks, so unused blocks lie
/// between the used ones.
fn placed(case: &Case, pick: u64) -> Transformed {
    let n = case.layout.num_blocks;
    let total = if n <= SPREAD_UP_TO { 2 * n } else { n };
    let mut ids: Vec<u32> = (1..total.max(1) as u32).collect();
    let mut rng = InputRng::new(pick ^ 0x5EED_B10C);
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let moved = |b: u32| if b == 0 { 0 } else { ids[b as usize - 1] };
    let bs = case.config.block_size as i64;
    let mut out = case.clone();
    out.recorded = None;
    out.layout.num_blocks = total.max(n);
    for row in &mut out.layout.block_table {
        for b in row.iter_mut() {
            *b = moved(*b);
        }
    }
    for s in &mut out.layout.slot_mapping {
        if *s >= 0 {
            *s = moved((*s / bs) as u32) as i64 * bs + *s % bs;
        }
    }
    Transformed {
        relation: Relation::Placement,
        cases: vec![out],
        rows: (0..case.num_real_tokens()).map(|t| (t, 0, t)).collect(),
        request: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_case, reference_output, AttentionConfig, BuildOptions, DType};

    fn row(v: &[f64], t: usize, width: usize) -> &[f64] {
        &v[t * width..(t + 1) * width]
    }

    /// The oracle computes each row alone, in one order: under every relation the mapped
    /// rows of the transformed cases are the original's, bit for bit. A transformation that
    /// moved a token, a block or a context row wrongly would change some row.
    fn holds_for_the_oracle(case: &Case) -> usize {
        let expected = reference_output(case);
        let width = expected.len() / case.num_real_tokens();
        let mut applied = 0;
        for relation in Relation::ALL {
            for pick in [0u64, 1, 7, 0x1_0003] {
                let Some(t) = transform(case, relation, pick) else {
                    continue;
                };
                applied += 1;
                let outs: Vec<Vec<f64>> = t.cases.iter().map(reference_output).collect();
                assert!(!t.rows.is_empty(), "{relation}: no rows compared");
                for &(a, c, b) in &t.rows {
                    assert_eq!(
                        row(&expected, a, width),
                        row(&outs[c], b, width),
                        "{relation} pick {pick}: row {a} vs case {c} row {b}"
                    );
                }
            }
        }
        applied
    }

    #[test]
    fn every_relation_keeps_the_oracles_rows() {
        let mut config = AttentionConfig::new(8, 2, 16, 16, DType::F32);
        config.sliding_window = Some(21);
        let opts = BuildOptions {
            spare_blocks: 3,
            padding_tokens: 2,
            ..BuildOptions::default()
        };
        let case = build_case(&[40, 7, 33], &[5, 1, 33], config, 3, &opts);
        // Every relation applies to this batch, at every pick.
        assert_eq!(holds_for_the_oracle(&case), 4 * Relation::ALL.len());
    }

    #[test]
    fn relations_keep_mla_rows_too() {
        let config = AttentionConfig::deepseek_v3_mla(4, 16, DType::Bf16);
        let case = build_case(&[20, 18], &[4, 3], config, 5, &BuildOptions::default());
        assert!(holds_for_the_oracle(&case) > 0);
    }

    #[test]
    fn what_does_not_apply_is_none() {
        let config = AttentionConfig::new(4, 4, 8, 16, DType::F32);
        let one = build_case(&[9], &[1], config.clone(), 1, &BuildOptions::default());
        assert!(transform(&one, Relation::Batch, 0).is_none());
        assert!(transform(&one, Relation::Order, 0).is_none());
        // A single new token cannot be split.
        assert!(transform(&one, Relation::Chunking, 0).is_none());
        assert!(transform(&one, Relation::Placement, 0).is_some());
        let mut encoder = config;
        encoder.kind = AttentionKind::EncoderOnly;
        let enc = build_case(&[6, 6], &[6, 6], encoder, 1, &BuildOptions::default());
        assert!(Relation::ALL
            .iter()
            .all(|&r| transform(&enc, r, 0).is_none()));
    }

    #[test]
    fn names_parse_back() {
        for r in Relation::ALL {
            assert_eq!(Relation::parse(r.name()), Some(r));
        }
        assert_eq!(Relation::parse("nope"), None);
    }
}
