//! `Case::validate`: every inconsistency becomes a typed [`CaseError`] naming the field.
//!
//! Checks run in an order that keeps later checks cheap and safe: config, then shapes and
//! tensor lengths (which bound every length by data actually in memory), then the paged
//! layout, then values.

use crate::{AttentionKind, Case, CaseError, Feature};
use std::collections::HashMap;

/// Largest case file `Case::load` reads.
pub const MAX_CASE_FILE_BYTES: u64 = 2 << 30;
/// Largest block size and head size accepted (far beyond any model).
pub const MAX_DIM: usize = 1 << 16;
/// Largest number of heads accepted.
pub const MAX_HEADS: usize = 1 << 12;
/// Largest cache accepted, in blocks.
pub const MAX_BLOCKS: usize = 1 << 26;
/// Largest number of bytes one allocation sized from a case may reach: the KV cache (K and
/// V of every slot of `num_blocks` blocks), the K/V a backend gathers through the block table
/// (every entry of every row, as a gather-then-attend backend reads it), and the step's query
/// and output rows. Counted at the compute dtype (the largest element any backend keeps; an
/// FP8 cache is smaller), so the bound holds whatever a backend chooses.
///
/// 64 GiB admits every case the strategies draw with room to spare: the largest, the
/// huge-cache tier, is 140,000 blocks × 16 slots × 8 kv heads × 128 × 2 (K and V) × 4 bytes
/// (f32) = 17.1 GiB, which backends allocate lazily (pages no write touches cost nothing) or
/// decline (`Dimension::CacheSize`). It also admits a real model's layer at serving size
/// (8 kv heads of 128 in bf16 hold 16M tokens in 64 GiB), while a case that would need a
/// machine's whole address space (a 633 TB cache) is rejected before any backend allocates.
pub const MAX_ALLOC_BYTES: u64 = 64 << 30;

pub(crate) fn nonzero(v: usize, field: &'static str) -> Result<(), CaseError> {
    if v == 0 {
        Err(CaseError::Zero { field })
    } else {
        Ok(())
    }
}

fn at_most(v: usize, limit: usize, field: &str) -> Result<(), CaseError> {
    if v > limit {
        Err(CaseError::TooLarge {
            field: field.to_string(),
            size: v as u64,
            limit: limit as u64,
        })
    } else {
        Ok(())
    }
}

/// Bytes as a person reads them (`17.1 GiB`).
fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `Err` naming `field` when the product of `factors` (each `(count, what)`) times the
/// compute dtype's bytes exceeds [`MAX_ALLOC_BYTES`].
fn bounded_bytes(
    field: &str,
    factors: &[(usize, &str)],
    element_bytes: usize,
) -> Result<(), CaseError> {
    let bytes = factors.iter().fold(element_bytes as u128, |acc, &(n, _)| {
        acc.saturating_mul(n as u128)
    });
    if bytes <= MAX_ALLOC_BYTES as u128 {
        return Ok(());
    }
    let what = factors
        .iter()
        .map(|(n, what)| format!("{n} {what}"))
        .chain([format!("{element_bytes} bytes")])
        .collect::<Vec<_>>()
        .join(" × ");
    Err(CaseError::TooManyBytes {
        field: field.to_string(),
        what,
        bytes: human_bytes(bytes),
        limit: human_bytes(MAX_ALLOC_BYTES as u128),
    })
}

/// The KV cache a case (or a trace) of `num_blocks` blocks makes a backend allocate: K and V
/// of every slot at the compute dtype, at most [`MAX_ALLOC_BYTES`]; `field` names
/// `num_blocks` in the error.
pub fn validate_cache_size(
    config: &crate::AttentionConfig,
    num_blocks: usize,
    field: &str,
) -> Result<(), CaseError> {
    bounded_bytes(
        field,
        &[
            (num_blocks, "blocks"),
            (config.block_size, "slots"),
            (config.num_kv_heads, "kv heads"),
            (config.head_size, "elements"),
            (2, "(K and V)"),
        ],
        config.dtype.size_bytes(),
    )
}

pub(crate) fn expect_len(
    field: impl Into<String>,
    expected: Option<usize>,
    actual: usize,
) -> Result<(), CaseError> {
    match expected {
        Some(e) if e == actual => Ok(()),
        Some(e) => Err(CaseError::LengthMismatch {
            field: field.into(),
            expected: e,
            actual,
        }),
        None => Err(CaseError::TooLarge {
            field: field.into(),
            size: u64::MAX,
            limit: usize::MAX as u64,
        }),
    }
}

/// Scales finer than the tensor replace the per-tensor ones, which must then be 1: a kernel
/// that multiplies both would otherwise be right and the case ambiguous.
fn validate_kv_scales(cache: &crate::Fp8KvCache, kv_heads: usize) -> Result<(), CaseError> {
    use crate::KvScales;
    if cache.scales.is_tensor() {
        return Ok(());
    }
    for (field, v) in [
        ("config.kv_cache.k_scale", cache.k_scale),
        ("config.kv_cache.v_scale", cache.v_scale),
    ] {
        if v != 1.0 {
            return Err(CaseError::InvalidParam {
                field: field.into(),
                reason: format!(
                    "{v} beside scales per {}: the finer scales replace it, so it must be 1",
                    cache.scales.name()
                ),
            });
        }
    }
    match &cache.scales {
        KvScales::Tensor => {}
        KvScales::Head { k, v } => {
            for (name, list) in [("k", k), ("v", v)] {
                let field = format!("config.kv_cache.scales.{name}");
                expect_len(field.as_str(), Some(kv_heads), list.len())?;
                for (h, &x) in list.iter().enumerate() {
                    finite_param(x, format!("{field}[{h}]"), true)?;
                }
            }
        }
        KvScales::Token => {
            if cache.dtype != crate::Fp8Format::E4m3 {
                return Err(CaseError::InvalidParam {
                    field: "config.kv_cache.scales".into(),
                    reason: format!(
                        "per-token scales are vLLM's fp8_per_token_head cache, E4M3 only, not {}",
                        cache.dtype
                    ),
                });
            }
        }
    }
    Ok(())
}

fn finite_param(v: f32, field: String, positive: bool) -> Result<(), CaseError> {
    if !v.is_finite() {
        return Err(CaseError::InvalidParam {
            field,
            reason: format!("{v} is not finite"),
        });
    }
    if positive && v <= 0.0 {
        return Err(CaseError::InvalidParam {
            field,
            reason: format!("{v} must be > 0"),
        });
    }
    Ok(())
}

fn check_values(field: &str, values: &[f32], dtype: crate::DType) -> Result<(), CaseError> {
    for (i, &v) in values.iter().enumerate() {
        if !v.is_finite() {
            return Err(CaseError::NonFinite {
                field: field.to_string(),
                index: i,
                value: v,
            });
        }
        if !dtype.represents(v) {
            return Err(CaseError::NotRepresentable {
                field: field.to_string(),
                index: i,
                value: v,
                dtype,
            });
        }
    }
    Ok(())
}

/// Who owns a slot, for collision messages.
#[derive(Clone, Copy)]
struct Owner {
    seq: usize,
    pos: usize,
    /// Index into slot_mapping for new tokens; None for context tokens.
    token: Option<usize>,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.token {
            Some(t) => write!(
                f,
                "sequence {} position {} (new token, layout.slot_mapping[{t}])",
                self.seq, self.pos
            ),
            None => write!(f, "sequence {} position {} (context)", self.seq, self.pos),
        }
    }
}

impl Case {
    /// Check that the case is internally consistent. Never panics, whatever was deserialized.
    pub fn validate(&self) -> Result<(), CaseError> {
        self.validate_config()?;
        self.validate_shapes()?;
        self.validate_layout()?;
        self.validate_values()
    }

    fn validate_config(&self) -> Result<(), CaseError> {
        self.config.validate()
    }
}

impl crate::AttentionConfig {
    /// Check the config alone (sizes, head ratio, window, parameters).
    pub fn validate(&self) -> Result<(), CaseError> {
        let c = self;
        nonzero(c.num_heads, "config.num_heads")?;
        nonzero(c.num_kv_heads, "config.num_kv_heads")?;
        nonzero(c.head_size, "config.head_size")?;
        nonzero(c.block_size, "config.block_size")?;
        at_most(c.num_heads, MAX_HEADS, "config.num_heads")?;
        at_most(c.head_size, MAX_DIM, "config.head_size")?;
        at_most(c.block_size, MAX_DIM, "config.block_size")?;
        if !c.num_heads.is_multiple_of(c.num_kv_heads) {
            return Err(CaseError::HeadsNotMultiple {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
            });
        }
        if c.sliding_window == Some(0) {
            return Err(CaseError::WindowZero);
        }
        if let Some(chunk) = c.attention_chunk_size {
            nonzero(chunk, "config.attention_chunk_size")?;
        }
        if let Some(k) = c.chunk_lookback {
            let reason = if c.attention_chunk_size.is_none() {
                Some(format!(
                    "a look-back of {k} chunks needs config.attention_chunk_size"
                ))
            } else if k == 0 {
                Some("look-back 0 is plain local chunks: leave chunk_lookback out".to_string())
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(CaseError::InvalidParam {
                    field: "config.chunk_lookback".into(),
                    reason,
                });
            }
        }
        if let Some(s) = c.scale {
            finite_param(s, "config.scale".into(), true)?;
        }
        if let Some(cap) = c.logits_soft_cap {
            finite_param(cap, "config.logits_soft_cap".into(), true)?;
        }
        if let Some(cache) = &c.kv_cache {
            finite_param(cache.k_scale, "config.kv_cache.k_scale".into(), true)?;
            finite_param(cache.v_scale, "config.kv_cache.v_scale".into(), true)?;
            if let Some(q) = cache.q_scale {
                finite_param(q, "config.kv_cache.q_scale".into(), true)?;
            }
            validate_kv_scales(cache, c.num_kv_heads)?;
        }
        for (name, v) in [
            ("config.alibi_slopes", &c.alibi_slopes),
            ("config.sinks", &c.sinks),
        ] {
            if let Some(v) = v {
                expect_len(name, Some(c.num_heads), v.len())?;
                for (h, &x) in v.iter().enumerate() {
                    finite_param(x, format!("{name}[{h}]"), false)?;
                }
            }
        }
        self.validate_mla()?;
        self.validate_kind()
    }

    /// Every optional feature in use means something for the config's kind
    /// ([`Feature::allows_kind`]).
    fn validate_kind(&self) -> Result<(), CaseError> {
        let c = self;
        match Feature::ALL
            .into_iter()
            .find(|f| f.used_by(c) && !f.allows_kind(c.kind))
        {
            None => Ok(()),
            Some(f) => Err(CaseError::InvalidParam {
                field: f.field().into(),
                reason: match c.kind {
                    AttentionKind::EncoderDecoder => {
                        "cross-attention (encoder_decoder) has no key positions relative to the query".into()
                    }
                    k => format!("{} is causal decoder attention, got {k}", f.label()),
                },
            }),
        }
    }

    /// MLA's rules: one latent head, V a prefix of it, the model's scale, causal decoder
    /// attention with none of the features no MLA model has.
    fn validate_mla(&self) -> Result<(), CaseError> {
        let c = self;
        let Some(m) = c.mla else { return Ok(()) };
        let invalid = |field: &str, reason: String| {
            Err(CaseError::InvalidParam {
                field: field.into(),
                reason,
            })
        };
        nonzero(m.head_size_v, "config.mla.head_size_v")?;
        if m.head_size_v > c.head_size {
            return invalid(
                "config.mla.head_size_v",
                format!(
                    "{} exceeds config.head_size ({}): V is the first head_size_v dims of the latent entry",
                    m.head_size_v, c.head_size
                ),
            );
        }
        if c.num_kv_heads != 1 {
            return invalid(
                "config.num_kv_heads",
                format!(
                    "MLA caches one latent head per token, got {}",
                    c.num_kv_heads
                ),
            );
        }
        if c.scale.is_none() {
            return invalid(
                "config.scale",
                "MLA needs the model's scale (DeepSeek-V3: qk_head_dim 192, 192^-0.5); the default head_size^-0.5 is not MLA's".into(),
            );
        }
        if c.kind != AttentionKind::Decoder {
            return invalid(
                "config.kind",
                format!("MLA is causal decoder attention, got {}", c.kind),
            );
        }
        if let Some(f) = Feature::NOT_WITH_MLA.into_iter().find(|f| f.used_by(c)) {
            return invalid(
                f.field(),
                "no MLA model or backend has it (config.mla is set)".into(),
            );
        }
        if let Some(cache) = &c.kv_cache {
            if cache.v_scale != cache.k_scale {
                return invalid(
                    "config.kv_cache.v_scale",
                    format!(
                        "{} differs from k_scale {}: an MLA cache entry is one tensor with one scale",
                        cache.v_scale, cache.k_scale
                    ),
                );
            }
        }
        Ok(())
    }
}

impl Case {
    fn validate_shapes(&self) -> Result<(), CaseError> {
        let c = &self.config;
        let b = &self.batch;
        if b.seq_lens.is_empty() {
            return Err(CaseError::EmptyBatch);
        }
        let n = b.seq_lens.len();
        expect_len("batch.query_lens", Some(n), b.query_lens.len())?;
        crate::validate_masks::validate_masks(c, b, crate::validate_masks::MaskField::Batch)?;
        let mut padded_from = None;
        for (s, (&q, &l)) in b.query_lens.iter().zip(&b.seq_lens).enumerate() {
            if q == 0 {
                if l != 0 {
                    return Err(CaseError::QueryLenZero { seq: s, seq_len: l });
                }
                padded_from.get_or_insert(s);
                continue;
            }
            if let Some(padded) = padded_from {
                return Err(CaseError::PaddedRequestBeforeReal {
                    seq: padded,
                    real: s,
                });
            }
            if q > l && c.kind != AttentionKind::EncoderDecoder {
                return Err(CaseError::QueryLenExceedsSeqLen {
                    seq: s,
                    query_len: q,
                    seq_len: l,
                });
            }
            if c.kind == AttentionKind::EncoderOnly && q != l {
                return Err(CaseError::EncoderNeedsFullQuery {
                    seq: s,
                    query_len: q,
                    seq_len: l,
                });
            }
        }
        if padded_from == Some(0) {
            return Err(CaseError::OnlyPaddedRequests);
        }
        // Lengths of tensors in memory bound every count below, so no loop runs away.
        let tokens = b
            .query_lens
            .iter()
            .try_fold(b.num_padding_tokens, |acc, &q| acc.checked_add(q))
            .ok_or_else(|| CaseError::TooLarge {
                field: "batch.query_lens".into(),
                size: u64::MAX,
                limit: usize::MAX as u64,
            })?;
        // The step's query and output rows (padding included), held as f32: the shape
        // `tensors.query` declares.
        bounded_bytes(
            "tensors.query",
            &[
                (tokens, "tokens"),
                (c.num_heads, "heads"),
                (c.head_size, "elements"),
            ],
            4,
        )?;
        let q_row = c.num_heads.checked_mul(c.head_size);
        let kv_row = c.num_kv_heads.checked_mul(c.head_size);
        // An MLA case carries no V: it is the prefix of each key row.
        let v_row = if c.mla.is_some() { Some(0) } else { kv_row };
        let t = &self.tensors;
        expect_len(
            "tensors.query",
            q_row.and_then(|r| r.checked_mul(tokens)),
            t.query.len(),
        )?;
        expect_len(
            "tensors.key",
            kv_row.and_then(|r| r.checked_mul(tokens)),
            t.key.len(),
        )?;
        expect_len(
            "tensors.value",
            v_row.and_then(|r| r.checked_mul(tokens)),
            t.value.len(),
        )?;
        expect_len("tensors.context_key", Some(n), t.context_key.len())?;
        expect_len("tensors.context_value", Some(n), t.context_value.len())?;
        for s in 0..n {
            let ctx = self.context_len(s);
            expect_len(
                format!("tensors.context_key[{s}]"),
                kv_row.and_then(|r| r.checked_mul(ctx)),
                t.context_key[s].len(),
            )?;
            expect_len(
                format!("tensors.context_value[{s}]"),
                v_row.and_then(|r| r.checked_mul(ctx)),
                t.context_value[s].len(),
            )?;
        }
        expect_len(
            "layout.slot_mapping",
            Some(tokens),
            self.layout.slot_mapping.len(),
        )?;
        Ok(())
    }

    fn validate_layout(&self) -> Result<(), CaseError> {
        let bs = self.config.block_size;
        let l = &self.layout;
        let n = self.num_seqs();
        nonzero(l.num_blocks, "layout.num_blocks")?;
        at_most(l.num_blocks, MAX_BLOCKS, "layout.num_blocks")?;
        validate_cache_size(&self.config, l.num_blocks, "layout.num_blocks")?;
        expect_len("layout.block_table", Some(n), l.block_table.len())?;
        let width = l.block_table[0].len();
        // A backend that gathers the K/V of every table entry (padding included) before
        // attending allocates this much.
        bounded_bytes(
            "layout.block_table",
            &[
                (n, "rows"),
                (width, "blocks"),
                (bs, "slots"),
                (self.config.num_kv_heads, "kv heads"),
                (self.config.head_size, "elements"),
                (2, "(K and V)"),
            ],
            self.config.dtype.size_bytes(),
        )?;
        for (s, row) in l.block_table.iter().enumerate() {
            if row.len() != width {
                return Err(CaseError::RaggedBlockTable {
                    seq: s,
                    expected: width,
                    actual: row.len(),
                });
            }
            let seq_len = self.batch.seq_lens[s];
            let needed = seq_len.div_ceil(bs);
            if row.len() < needed {
                return Err(CaseError::TableRowTooShort {
                    seq: s,
                    needed,
                    actual: row.len(),
                    seq_len,
                });
            }
            for (i, &blk) in row.iter().enumerate() {
                if blk as usize >= l.num_blocks {
                    return Err(CaseError::BlockOutOfRange {
                        seq: s,
                        index: i,
                        block: blk as u64,
                        num_blocks: l.num_blocks,
                    });
                }
            }
            self.validate_null_blocks(s)?;
        }

        // Every new token's slot must be where the table puts it; padding tokens write nowhere,
        // nor does a cross-attention step.
        let starts = self.query_start_loc();
        if self.config.kind == AttentionKind::EncoderDecoder {
            if let Some((token, &actual)) =
                l.slot_mapping.iter().enumerate().find(|(_, &s)| s != -1)
            {
                return Err(CaseError::CrossAttentionWrite { token, actual });
            }
            return self.validate_block_ownership();
        }
        for (s, &start) in starts.iter().take(n).enumerate() {
            let ctx = self.context_len(s);
            for j in 0..self.batch.query_lens[s] {
                let token = start + j;
                let expected = self.slot_of(s, ctx + j);
                let actual = l.slot_mapping[token];
                if actual != expected {
                    return Err(CaseError::SlotMismatch {
                        token,
                        seq: s,
                        pos: ctx + j,
                        expected,
                        actual,
                    });
                }
            }
        }
        for token in self.num_real_tokens()..self.num_tokens() {
            let actual = l.slot_mapping[token];
            if actual != -1 {
                return Err(CaseError::PaddingSlot { token, actual });
            }
        }
        self.validate_block_ownership()
    }

    /// The null block (0) may stand only where vLLM's sliding-window and chunked-local
    /// managers put it: on a block wholly before every key the sequence's queries see (a
    /// skipped block, freed and maybe rewritten by another request). A block some query
    /// reads, or a new token is written to, must be real.
    fn validate_null_blocks(&self, s: usize) -> Result<(), CaseError> {
        let bs = self.config.block_size;
        let row = &self.layout.block_table[s];
        let seq_len = self.batch.seq_lens[s];
        let needed = seq_len.div_ceil(bs);
        let Some(first_null) = row[..needed].iter().position(|&b| b == 0) else {
            return Ok(());
        };
        // The keys the sequence's queries see, merged: a null block may meet none of them.
        let visibility = crate::oracle::Visibility::of_seq(self, s);
        let mut spans: Vec<(usize, usize)> = (self.context_len(s)..seq_len)
            .flat_map(|p| visibility.keys(p, seq_len).spans().to_vec())
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (a, b) in spans {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        // Block i is read when the first merged span ending past its start begins before its end.
        let read = |i: usize| {
            let (lo, hi) = (i * bs, (i + 1) * bs);
            let at = merged.partition_point(|&(_, b)| b <= lo);
            merged.get(at).is_some_and(|&(a, _)| a < hi)
        };
        match (first_null..needed).find(|&i| row[i] == 0 && read(i)) {
            Some(index) => Err(CaseError::NullBlockUsed { seq: s, index }),
            None => Ok(()),
        }
    }

    /// A physical block may be live in two places only as prefix sharing: a full context block
    /// of both, with identical contents. Anything else is two tokens on one slot.
    fn validate_block_ownership(&self) -> Result<(), CaseError> {
        let bs = self.config.block_size;
        let starts = self.query_start_loc();
        // physical block -> (seq, logical index) of its first live use
        let mut first_use: HashMap<u32, (usize, usize)> = HashMap::new();
        for s in 0..self.num_seqs() {
            let seq_len = self.batch.seq_lens[s];
            for i in 0..seq_len.div_ceil(bs) {
                let blk = self.layout.block_table[s][i];
                if blk == 0 {
                    continue; // a skipped block (validated as unread): nobody's tokens
                }
                let Some(&(s0, i0)) = first_use.get(&blk) else {
                    first_use.insert(blk, (s, i));
                    continue;
                };
                let full_ctx = |seq: usize, idx: usize| (idx + 1) * bs <= self.context_len(seq);
                if full_ctx(s0, i0) && full_ctx(s, i) {
                    // Prefix sharing: the same logical block, and every block before it shared too.
                    // (A block one of them skipped matches whatever the other holds there.)
                    let prefix = i0 == i
                        && (0..i).all(|j| {
                            let (a, b) = (
                                self.layout.block_table[s0][j],
                                self.layout.block_table[s][j],
                            );
                            a == b || a == 0 || b == 0
                        });
                    if !prefix {
                        return Err(CaseError::SharedBlockNotPrefix {
                            block: blk,
                            seq_a: s0,
                            seq_b: s,
                            index_a: i0,
                            index_b: i,
                        });
                    }
                    self.compare_shared_block(blk, (s0, i0), (s, i))?;
                    continue;
                }
                // Both uses start at offset 0 of the block, so they meet at least there;
                // name the first offset where a new token is involved, if any.
                let len0 = (self.batch.seq_lens[s0] - i0 * bs).min(bs);
                let len1 = (seq_len - i * bs).min(bs);
                let owner = |seq: usize, idx: usize, off: usize| {
                    let pos = idx * bs + off;
                    let c = self.context_len(seq);
                    Owner {
                        seq,
                        pos,
                        token: (pos >= c).then(|| starts[seq] + pos - c),
                    }
                };
                // Whether every shared slot is a new token of one sequence that another
                // reads as context with the very same K/V: vLLM's prefix cache hits a block a
                // request of the same step computes (its writes land before attention runs).
                let mut computed_here = true;
                for off in 0..len0.min(len1) {
                    let a = owner(s0, i0, off);
                    let b = owner(s, i, off);
                    let slot = blk as i64 * bs as i64 + off as i64;
                    match (a.token, b.token) {
                        (None, None) => computed_here = false,
                        (Some(_), Some(_)) => {
                            return Err(CaseError::SlotCollision {
                                slot,
                                first: a.to_string(),
                                second: b.to_string(),
                            })
                        }
                        (Some(t), None) | (None, Some(t)) => {
                            let (writer, other) = if a.token.is_some() { (a, b) } else { (b, a) };
                            if !self.writes_what_context_holds(t, other.seq, other.pos) {
                                return Err(CaseError::NewTokenInSharedBlock {
                                    token: t,
                                    seq: writer.seq,
                                    other: other.seq,
                                    block: blk,
                                    slot,
                                });
                            }
                        }
                    }
                }
                if computed_here {
                    continue;
                }
                return Err(CaseError::SharedBlockNotFullContext {
                    block: blk,
                    seq_a: s0,
                    seq_b: s,
                    index_a: i0,
                    index_b: i,
                });
            }
        }
        Ok(())
    }

    /// Whether new token `token` writes exactly the K and V that sequence `seq` holds as
    /// context at position `pos`.
    fn writes_what_context_holds(&self, token: usize, seq: usize, pos: usize) -> bool {
        let t = &self.tensors;
        let k_row = self.config.num_kv_heads * self.config.head_size;
        let v_row = self.config.value_row();
        let same = |new: &[f32], ctx: &[f32], row: usize| {
            row == 0
                || new.get(token * row..(token + 1) * row) == ctx.get(pos * row..(pos + 1) * row)
        };
        same(&t.key, &t.context_key[seq], k_row)
            && (t.value.is_empty() || same(&t.value, &t.context_value[seq], v_row))
    }

    fn compare_shared_block(
        &self,
        blk: u32,
        (s0, i0): (usize, usize),
        (s1, i1): (usize, usize),
    ) -> Result<(), CaseError> {
        let bs = self.config.block_size;
        let k_row = self.config.num_kv_heads * self.config.head_size;
        let t = &self.tensors;
        for (field, a, b, row) in [
            ("K", &t.context_key[s0], &t.context_key[s1], k_row),
            (
                "V",
                &t.context_value[s0],
                &t.context_value[s1],
                self.config.value_row(),
            ),
        ] {
            let a = &a[i0 * bs * row..(i0 + 1) * bs * row];
            let b = &b[i1 * bs * row..(i1 + 1) * bs * row];
            if a != b {
                let name = if field == "K" {
                    "tensors.context_key"
                } else {
                    "tensors.context_value"
                };
                return Err(CaseError::SharedBlockDiffers {
                    block: blk,
                    seq_a: s0,
                    seq_b: s1,
                    index: i1,
                    field: name,
                });
            }
        }
        Ok(())
    }

    fn validate_values(&self) -> Result<(), CaseError> {
        let t = &self.tensors;
        let dt = self.config.dtype;
        check_values("tensors.query", &t.query, dt)?;
        check_values("tensors.key", &t.key, dt)?;
        check_values("tensors.value", &t.value, dt)?;
        for s in 0..self.num_seqs() {
            check_values(&format!("tensors.context_key[{s}]"), &t.context_key[s], dt)?;
            check_values(
                &format!("tensors.context_value[{s}]"),
                &t.context_value[s],
                dt,
            )?;
        }
        Ok(())
    }
}
