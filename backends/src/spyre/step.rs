//! Checking one step's inputs against the config and the cache, and the per-sequence facts
//! (where its queries are, how long its context is) every variant plans from.

use crate::{KvWrite, StepInputs};
use attn_reference::AttentionConfig;

/// One sequence of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seq {
    /// Index of the sequence in the batch (its block-table row).
    pub index: usize,
    /// First token of its queries in the step.
    pub q_start: usize,
    pub q_len: usize,
    /// Context + new tokens.
    pub seq_len: usize,
}

impl Seq {
    /// Absolute position of the first new token (cross-attention queries, which may
    /// outnumber the encoder's keys and see all of them, get 0).
    pub fn context_len(&self) -> usize {
        self.seq_len.saturating_sub(self.q_len)
    }
}

/// A config every variant can compute with; anything else is a caller error.
pub(crate) fn check_config(c: &AttentionConfig) -> Result<(), String> {
    if c.num_heads == 0 || c.num_kv_heads == 0 || c.head_size == 0 || c.block_size == 0 {
        return Err("num_heads, num_kv_heads, head_size and block_size must all be >= 1".into());
    }
    if !c.num_heads.is_multiple_of(c.num_kv_heads) {
        return Err(format!(
            "num_heads {} is not a multiple of num_kv_heads {}",
            c.num_heads, c.num_kv_heads
        ));
    }
    if c.sliding_window == Some(0) {
        return Err("sliding_window must be >= 1".into());
    }
    for (name, v) in [("alibi_slopes", &c.alibi_slopes), ("sinks", &c.sinks)] {
        if let Some(v) = v {
            if v.len() != c.num_heads {
                return Err(format!(
                    "{name} has {} values, expected one per query head ({})",
                    v.len(),
                    c.num_heads
                ));
            }
            if v.iter().any(|x| !x.is_finite()) {
                return Err(format!("{name} must be finite"));
            }
        }
    }
    if let Some(cap) = c.logits_soft_cap {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(format!("logits_soft_cap {cap} must be finite and > 0"));
        }
    }
    if let Some(s) = c.scale {
        if !s.is_finite() {
            return Err(format!("scale {s} must be finite"));
        }
    }
    Ok(())
}

/// Check a K/V write; returns nothing but a reason on failure.
pub(crate) fn check_write(
    c: &AttentionConfig,
    kv: &KvWrite<'_>,
    num_slots: usize,
) -> Result<(), String> {
    let row = c.num_kv_heads * c.head_size;
    let n = kv.slot_mapping.len();
    if kv.key.len() != n * row || kv.value.len() != n * row {
        return Err(format!(
            "key/value hold {}/{} values, expected {} ([{n}, {}, {}])",
            kv.key.len(),
            kv.value.len(),
            n * row,
            c.num_kv_heads,
            c.head_size
        ));
    }
    if let Some((i, &s)) = kv
        .slot_mapping
        .iter()
        .enumerate()
        .find(|(_, &s)| s < -1 || s >= num_slots as i64)
    {
        return Err(format!(
            "slot_mapping[{i}] = {s} is outside the cache's {num_slots} slots (and not -1)"
        ));
    }
    Ok(())
}

/// Check a step and describe its sequences. Sequences without queries are dropped: they
/// produce no output rows.
pub(crate) fn sequences(
    c: &AttentionConfig,
    step: &StepInputs<'_>,
    num_blocks: usize,
) -> Result<Vec<Seq>, String> {
    step.validate(c, num_blocks)?;
    let b = step.seq_lens.len();
    // Beyond the shared rules: the gather reads a sequence's whole block-table row.
    for (s, row) in step.block_table[..b].iter().enumerate() {
        if let Some((i, &blk)) = row
            .iter()
            .enumerate()
            .find(|(_, &blk)| blk as usize >= num_blocks)
        {
            return Err(format!(
                "sequence {s}: block_table[{s}][{i}] = {blk} is outside the cache's {num_blocks} blocks (the gather reads the whole row)"
            ));
        }
    }
    let mut seqs = Vec::with_capacity(b);
    for s in 0..b {
        let (start, end) = (step.query_start_loc[s], step.query_start_loc[s + 1]);
        let (q_len, seq_len) = (end - start, step.seq_lens[s]);
        if q_len > 0 {
            seqs.push(Seq {
                index: s,
                q_start: start,
                q_len,
                seq_len,
            });
        }
    }
    Ok(seqs)
}
