//! A one-line guess at the bug from where the errors are: which tokens, which heads.

use attn_reference::{AttentionKind, Case};
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

fn facts(case: &Case, t: usize) -> TokenFacts {
    let (seq, pos) = case.locate_token(t);
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

/// The hint for a failed comparison, if a pattern stands out.
pub fn hint(case: &Case, c: &Comparison) -> Option<String> {
    let c_cfg = &case.config;
    let hq = c_cfg.num_heads;
    if c.non_finite {
        return Some("NaN/Inf reached a real row: a fully masked row, a padding row or an unguarded softmax (no max subtraction) leaked".into());
    }
    let tokens = case.num_real_tokens();
    let bad_cells: Vec<(usize, usize)> = (0..tokens * hq)
        .filter(|&cell| {
            c.failed[cell * c_cfg.head_size_v()..(cell + 1) * c_cfg.head_size_v()]
                .iter()
                .any(|&f| f)
        })
        .map(|cell| (cell / hq, cell % hq))
        .collect();
    if bad_cells.is_empty() {
        return None;
    }
    let bad_tokens: BTreeSet<usize> = bad_cells.iter().map(|&(t, _)| t).collect();
    let bad_heads: BTreeSet<usize> = bad_cells.iter().map(|&(_, h)| h).collect();

    // Heads: a partial set points at the head mapping or at one kv head's data.
    if bad_heads.len() < hq {
        let kv: BTreeSet<usize> = bad_heads.iter().map(|&h| c_cfg.kv_head_of(h)).collect();
        let whole_groups = kv.iter().all(|&k| {
            (0..c_cfg.group_size()).all(|g| bad_heads.contains(&(k * c_cfg.group_size() + g)))
        });
        if c_cfg.group_size() > 1 && !whole_groups {
            return Some(format!(
                "only heads {} diverge, not whole kv groups: check the query-head to kv-head mapping (h / (Hq/Hkv) = h / {})",
                list(&bad_heads),
                c_cfg.group_size()
            ));
        }
        if c_cfg.num_kv_heads > 1 {
            return Some(format!("only the query heads of kv head(s) {} diverge: check how K/V of those kv heads are stored or read", list(&kv)));
        }
        if c_cfg.alibi_slopes.is_some() || c_cfg.sinks.is_some() {
            return Some(format!(
                "only heads {} diverge: check per-head parameters (ALiBi slopes, sinks)",
                list(&bad_heads)
            ));
        }
    }

    let all: Vec<TokenFacts> = (0..tokens).map(|t| facts(case, t)).collect();
    let bad: Vec<&TokenFacts> = bad_tokens.iter().map(|&t| &all[t]).collect();
    let good: Vec<&TokenFacts> = (0..tokens)
        .filter(|t| !bad_tokens.contains(t))
        .map(|t| &all[t])
        .collect();
    let only = |pred: &dyn Fn(&TokenFacts) -> bool| {
        bad.iter().all(|f| pred(f)) && !good.iter().all(|f| pred(f))
    };

    if let Some(w) = c_cfg.sliding_window {
        let cut = |f: &TokenFacts| match c_cfg.kind {
            AttentionKind::Decoder => f.pos + 1 > w,
            AttentionKind::EncoderOnly => f.pos + 1 > w || f.pos + w < f.seq_len,
            // Validation rejects a window in cross-attention.
            AttentionKind::EncoderDecoder => false,
        };
        if bad.iter().all(|f| cut(f)) {
            return Some(format!(
                "only tokens whose window of {w} cuts off keys diverge: check the window edge (w keys including the query: {} )",
                match c_cfg.kind {
                    AttentionKind::Decoder => "decoder (left, right) = (w-1, 0)",
                    AttentionKind::EncoderOnly | AttentionKind::EncoderDecoder => {
                        "encoder (left, right) = (w-1, w-1)"
                    }
                }
            ));
        }
    }
    if only(&|f| f.context_len > 0 && f.query_len > 1) {
        return Some("only tokens of chunked prefills (context before several new tokens) diverge: check the causal offset (position = context_len + j)".into());
    }
    if only(&|f| f.query_len == 1) {
        return Some("only decode tokens (query_len 1) diverge: check the decode path (split-KV merge, decode-specific kernel)".into());
    }
    if only(&|f| f.query_len > 1) {
        return Some("only prefill tokens (query_len > 1) diverge: check the prefill path and its causal mask".into());
    }
    if only(&|f| f.pos % c_cfg.block_size == 0) {
        return Some("only tokens at the first slot of a block diverge: check block boundaries in slot computation or gathering".into());
    }
    let bs = c_cfg.block_size;
    if only(&|f| f.seq_len % bs != 0) {
        return Some(
            "only sequences whose last block is partial diverge: check the last, partial block"
                .into(),
        );
    }
    let seqs: BTreeSet<usize> = bad.iter().map(|f| f.seq).collect();
    if case.num_seqs() > 1 && seqs.len() < case.num_seqs() {
        return Some(format!(
            "only sequence(s) {} diverge: check their block-table rows and query_start_loc offsets",
            list(&seqs)
        ));
    }
    Some(format!(
        "every token and head diverges: check the scale, the softmax, value gathering, or a feature applied wrongly ({})",
        c_cfg.features().join(", ")
    ))
}
