//! What a query sees and how its logits are shaped between `q·k` and the softmax: the
//! visibility mask (causal, encoder, sliding window, local chunks, sequence end), the soft-cap and the
//! ALiBi bias, all as tensor ops over a group's padded layout.

use super::plan::GroupIndex;
use super::tensors::{from_f32, in_place, CPU};
use attn_reference::{AttentionConfig, AttentionKind};
use tch::{Kind, TchError, Tensor};

/// Key positions `0..len` as `[1, 1, len]`.
fn key_positions(len: usize) -> Result<Tensor, TchError> {
    Tensor::f_arange(len as i64, (Kind::Int64, CPU))?.f_view([1, 1, len as i64])
}

/// `[b, q_max, len]` bool, true where the key is hidden from the query row. Keys past a
/// sequence's end (null-block padding, partial blocks) are always hidden.
pub(crate) fn hidden(
    c: &AttentionConfig,
    idx: &GroupIndex,
    len: usize,
) -> Result<Tensor, TchError> {
    let size = idx.q_pos.size();
    let k = key_positions(len)?;
    let p = idx.q_pos.f_unsqueeze(-1)?;
    let mut hide = k.f_ge_tensor(&idx.seq_lens.f_view([size[0], 1, 1])?)?;
    if c.kind == AttentionKind::Decoder {
        hide = hide.f_logical_or(&k.f_gt_tensor(&p)?)?;
    }
    if let (AttentionKind::Decoder, Some(chunk)) = (c.kind, c.attention_chunk_size) {
        // Local chunks: nothing before the query's chunk start, p - p % chunk.
        let start = p.f_sub(&p.f_remainder(chunk.max(1) as i64)?)?;
        hide = hide.f_logical_or(&k.f_lt_tensor(&start)?)?;
    }
    if let Some((left, right)) = c.window_left_right() {
        hide = hide.f_logical_or(&k.f_lt_tensor(&p.f_sub_scalar(left as i64)?)?)?;
        if c.kind == AttentionKind::EncoderOnly {
            hide = hide.f_logical_or(&k.f_gt_tensor(&p.f_add_scalar(right as i64)?)?)?;
        }
    }
    hide.f_expand([size[0], size[1], len as i64], false)
}

/// Zero the gathered keys or values of positions `k0..k0 + len` that no query of their
/// sequence sees at either end: past its end (the tails of partial pages, the null block of
/// table padding) and before its window's or chunk's start (skipped blocks, which vLLM
/// replaces with the null block and hands to other requests). Those hold whatever the memory
/// held (`torch.empty`: NaN, infinities). Masking their logits is not enough: a hidden value
/// row still meets its probability of 0 in P·V (0 · NaN = NaN), and an additive mask added
/// to a NaN logit stays NaN. `kv` is `[b, Hkv, len, D]` (`keys_last`: `[b, Hkv, D, len]`),
/// `b` the group's sequences. Only those rows are written, one slice per sequence and end
/// (a masked fill of the whole tensor cost more than SDPA itself on large_decode, where no
/// sequence has such rows).
pub(crate) fn zero_unseen(
    kv: &mut Tensor,
    idx: &GroupIndex,
    (k0, len): (i64, i64),
    keys_last: bool,
) -> Result<(), TchError> {
    let keys = if keys_last { 3 } else { 2 };
    for (i, (&start, &end)) in idx.starts.iter().zip(&idx.ends).enumerate() {
        let before = (start - k0).clamp(0, len);
        let after = (end - k0).clamp(before, len);
        for (from, to) in [(0, before), (after, len)] {
            if from < to {
                in_place(
                    kv.f_narrow(0, i as i64, 1)?
                        .f_narrow(keys, from, to - from)?
                        .f_zero_(),
                )?;
            }
        }
    }
    Ok(())
}

/// `[b, q_max, len]` f32 `k - p`, the distance ALiBi scales; `None` without ALiBi.
pub(crate) fn alibi_distance(
    c: &AttentionConfig,
    idx: &GroupIndex,
    len: usize,
) -> Result<Option<Tensor>, TchError> {
    if c.alibi_slopes.is_none() {
        return Ok(None);
    }
    let d = key_positions(len)?
        .f_sub(&idx.q_pos.f_unsqueeze(-1)?)?
        .f_to_kind(Kind::Float)?;
    Ok(Some(d))
}

/// Per query head values (ALiBi slopes, sinks) as `[1, Hkv, G, 1, 1]` in `kind`, so they
/// broadcast over logits laid out `[b, Hkv, G, q, keys]`.
pub(crate) fn per_head(
    c: &AttentionConfig,
    values: &[f32],
    kind: Kind,
) -> Result<Tensor, TchError> {
    let (hkv, g) = (c.num_kv_heads as i64, c.group_size() as i64);
    from_f32(values, &[1, hkv, g, 1, 1])?.f_to_kind(kind)
}

/// The transforms applied to scaled logits before masking, in the reference's order:
/// soft-cap, then ALiBi.
pub(crate) struct LogitShaping {
    soft_cap: Option<f64>,
    /// `[1, Hkv, G, 1, 1]`
    slopes: Option<Tensor>,
}

impl LogitShaping {
    pub fn new(c: &AttentionConfig, kind: Kind) -> Result<Self, TchError> {
        let slopes = c
            .alibi_slopes
            .as_deref()
            .map(|s| per_head(c, s, kind))
            .transpose()?;
        Ok(LogitShaping {
            soft_cap: c.logits_soft_cap.map(f64::from),
            slopes,
        })
    }

    /// Shape `s` (`[b, Hkv, G, q, keys]`, scaled) in place; `distance` is the matching
    /// `[b, q, keys]` slice of [`alibi_distance`].
    pub fn apply(&self, s: &mut Tensor, distance: Option<&Tensor>) -> Result<(), TchError> {
        if let Some(cap) = self.soft_cap {
            in_place(s.f_div_scalar_(cap))?;
            in_place(s.f_tanh_())?;
            in_place(s.f_mul_scalar_(cap))?;
        }
        if let (Some(slopes), Some(d)) = (&self.slopes, distance) {
            in_place(s.f_addcmul_(slopes, &d.f_unsqueeze(1)?.f_unsqueeze(1)?))?;
        }
        Ok(())
    }
}
