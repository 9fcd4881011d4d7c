//! The device variant: the shapes and numerics a static-shape accelerator imposes, kept so
//! their padding logic is tested on the CPU. fp16 storage only; head size a multiple of 64;
//! one sequence at a time; its keys padded to a multiple of 256; its queries in chunks of 32
//! rows (the last chunk padded); masking by setting hidden keys to -65504 (fp16's lowest
//! finite value) rather than -inf, once the row's largest visible logit is subtracted (added
//! to the raw logits instead, a finite mask stops hiding once real logits fall below it, as
//! extreme logits do). Padding rows are fully masked, as on the device: with a finite mask
//! their softmax stays finite, and their rows are dropped from the output.

use super::cache::SpyreCache;
use super::mask::{alibi_distance, hidden, per_head, zero_unseen, LogitShaping};
use super::plan::{Group, GroupIndex};
use super::tensors::{in_place, kind_of};
use crate::Unsupported;
use attn_reference::Dimension;
use attn_reference::{AttentionConfig, DType};
use tch::{Kind, TchError, Tensor};

/// Keys per sequence are padded to a multiple of this.
pub(crate) const KV_MULTIPLE: usize = 256;
/// Queries are computed in chunks of this many rows.
pub(crate) const Q_CHUNK: usize = 32;
/// The additive mask value for a hidden key.
pub(crate) const MASK_VALUE: f64 = -65504.0;
const HEAD_MULTIPLE: usize = 64;

/// Most sequences of one step the device variant declares: one sequence at a time makes a
/// flood of 8,193 decodes cost a quarter of a minute here, more than a default check holds;
/// 2,048 is where big batches stopped before floods were drawn. Floods past it run on
/// spyre-native and spyre-sdpa, which share this variant's gathering and masks.
const MAX_SEQS: usize = 2048;

/// The device's space: fp16 compute, head sizes in multiples of [`HEAD_MULTIPLE`] (what
/// [`supports`] checks), at most [`MAX_SEQS`] sequences, declared so the strategies draw
/// inside it.
pub(crate) fn space() -> attn_reference::Space {
    attn_reference::Space {
        dtypes: Some(vec![DType::F16]),
        head_size_multiple_of: Some(HEAD_MULTIPLE),
        max_seqs: Some(MAX_SEQS),
        ..Default::default()
    }
}

pub(crate) fn supports(c: &AttentionConfig) -> Result<(), Unsupported> {
    if c.dtype != DType::F16 {
        return Err(Unsupported::new(
            Dimension::Dtype,
            "other than fp16 (the device computes in fp16 only)",
        )
        .value(c.dtype));
    }
    if !c.head_size.is_multiple_of(HEAD_MULTIPLE) {
        return Err(Unsupported::new(
            Dimension::HeadSize,
            format!("not a multiple of {HEAD_MULTIPLE}"),
        )
        .value(c.head_size));
    }
    Ok(())
}

/// Pages to gather for a sequence of `len` keys once padded to [`KV_MULTIPLE`].
pub(crate) fn padded_pages(c: &AttentionConfig, len: usize) -> usize {
    (len.div_ceil(KV_MULTIPLE).max(1) * KV_MULTIPLE).div_ceil(c.block_size)
}

/// Attention of a one-sequence group whose `q_max` is a multiple of [`Q_CHUNK`]:
/// `[q_max, Hq, D]` f32 holding fp16 values.
pub(crate) fn attend_sequence(
    c: &AttentionConfig,
    cache: &SpyreCache,
    query: &Tensor,
    g: &Group,
    idx: &GroupIndex,
) -> Result<Tensor, TchError> {
    let (hq, hkv, grp, d) = (
        c.num_heads as i64,
        c.num_kv_heads as i64,
        c.group_size() as i64,
        c.head_size as i64,
    );
    let len = (g.len_max.div_ceil(KV_MULTIPLE).max(1) * KV_MULTIPLE) as i64;
    debug_assert!(idx.pages * c.block_size >= len as usize);
    let chunk = Q_CHUNK as i64;

    let ids = idx.blocks.f_reshape([-1])?;
    let kv = cache
        .select_pages(&ids, kind_of(c.dtype))?
        .f_view([2, -1, hkv, d])?
        .f_narrow(1, 0, len)?;
    let mut k = kv
        .f_select(0, 0)?
        .f_permute([1, 2, 0])?
        .f_to_kind(Kind::Float)?
        .f_unsqueeze(0)?; // [1, Hkv, D, len]
    let mut v = kv
        .f_select(0, 1)?
        .f_transpose(0, 1)?
        .f_to_kind(Kind::Float)?
        .f_unsqueeze(0)?; // [1, Hkv, len, D]

    // Keys past the sequence's end or before its window are stale memory: the additive mask
    // cannot hide a NaN logit, and a hidden value still meets its probability of 0.
    zero_unseen(&mut k, idx, (0, len), true)?;
    zero_unseen(&mut v, idx, (0, len), false)?;
    let (k, v) = (k.f_squeeze_dim(0)?, v.f_squeeze_dim(0)?);
    let q = query
        .f_index_select(0, &idx.q_rows)?
        .f_to_kind(Kind::Half)?; // [q_max, Hq, D]

    // The fp16 additive mask of the whole padded sequence; padding rows hide every key.
    let hide = hidden(c, idx, len as usize)?
        .f_squeeze_dim(0)? // [q_max, len]
        .f_logical_or(&idx.q_real.f_logical_not()?.f_view([-1, 1])?)?;
    let distance = alibi_distance(c, idx, len as usize)?;
    let shaping = LogitShaping::new(c, Kind::Float)?;
    let sinks = c
        .sinks
        .as_deref()
        .map(|s| per_head(c, s, Kind::Float))
        .transpose()?;

    let mut outs = Vec::with_capacity(g.q_max / Q_CHUNK);
    for first in (0..g.q_max as i64).step_by(Q_CHUNK) {
        let qc = q
            .f_narrow(0, first, chunk)?
            .f_view([chunk, hkv, grp, d])?
            .f_permute([1, 2, 0, 3])?
            .f_reshape([hkv, grp * chunk, d])?
            .f_to_kind(Kind::Float)?
            .f_mul_scalar(c.effective_scale())?;
        let mut s = qc.f_matmul(&k)?.f_view([1, hkv, grp, chunk, len])?;
        let dist = distance
            .as_ref()
            .map(|t| t.f_narrow(1, first, chunk))
            .transpose()?;
        shaping.apply(&mut s, dist.as_ref())?;
        let hide = hide.f_narrow(0, first, chunk)?;

        // The largest visible logit (0 for a padding row, which sees none).
        let visible = s
            .f_masked_fill(&hide, f64::NEG_INFINITY)?
            .f_amax([-1], true)?;
        let mut m = visible.f_masked_fill(&visible.f_isinf()?, 0.0)?;
        if let Some(sinks) = &sinks {
            m = m.f_maximum(sinks)?;
        }
        in_place(s.f_sub_(&m))?;
        let mut s = s.f_masked_fill(&hide, MASK_VALUE)?;
        in_place(s.f_exp_())?;
        let mut l = s.f_sum_dim_intlist([-1i64].as_slice(), true, Kind::Float)?;
        if let Some(sinks) = &sinks {
            in_place(l.f_add_(&sinks.f_sub(&m)?.f_exp()?))?;
        }
        let o = s
            .f_view([hkv, grp * chunk, len])?
            .f_matmul(&v)?
            .f_div(&l.f_view([hkv, grp * chunk, 1])?)?;
        // The device writes fp16 activations.
        let o = o
            .f_to_kind(Kind::Half)?
            .f_view([hkv, grp, chunk, d])?
            .f_permute([2, 0, 1, 3])?
            .f_reshape([chunk, hq, d])?;
        outs.push(o);
    }
    Tensor::f_cat(&outs, 0)?.f_to_kind(Kind::Float)
}
