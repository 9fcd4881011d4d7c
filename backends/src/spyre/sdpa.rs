//! The SDPA variant: each group's pages gathered into the call's [`Workspace`], viewed as
//! `[b, Hkv, len, D]` and handed to libtorch's `scaled_dot_product_attention` with the
//! visibility mask.
//!
//! GQA folds the group of query heads into the query rows (`[b, Hkv, G * q, D]` against
//! each kv head's keys) instead of passing `enable_gqa`: libtorch 2.13's CPU SDPA serves
//! `enable_gqa` from its math path, which copies K/V per query head and ran 8x slower on
//! large_decode; the fold gives the same result with the fused kernel and no K/V copies.
//!
//! Features SDPA has no argument for are expressed around it: ALiBi becomes an additive f32
//! mask; a sink becomes one extra key of zeros (value zeros) whose additive mask entry is the
//! sink, so its logit is exactly the sink and it joins only the denominator. A soft-cap acts
//! on the logits inside the softmax, which SDPA never exposes, so soft-capped configs
//! compute their logits explicitly with the native variant's f32 path.

use super::cache::SpyreCache;
use super::mask::{alibi_distance, hidden, per_head, zero_past_end};
use super::native;
use super::plan::{Group, GroupIndex};
use super::tensors::{in_place, kind_of, CPU};
use super::workspace::{Scratch, Workspace};
use attn_reference::AttentionConfig;
use tch::{Kind, TchError, Tensor};

/// Default gathered K/V bytes one group may hold; a group is split before it exceeds this
/// (a single sequence longer than this is still gathered whole). Small enough that a
/// group's pages are still in cache when SDPA reads them: on large_decode one sequence per
/// group (8 MiB) ran faster than four (32 MiB), and the call's peak memory fell with it.
pub(crate) const GROUP_KV_BYTES: usize = 8 << 20;

/// The kind SDPA runs in: the cache's dtype, or f32 when the mask carries real-valued
/// biases (ALiBi distances and sinks would lose their precision in a 16-bit mask).
pub(crate) fn compute_kind(c: &AttentionConfig) -> Kind {
    if c.alibi_slopes.is_some() || c.sinks.is_some() {
        Kind::Float
    } else {
        kind_of(c.dtype)
    }
}

/// Attention of one group: `[b * q_max, Hq, D]` f32.
pub(crate) fn attend_group(
    c: &AttentionConfig,
    cache: &SpyreCache,
    query: &Tensor,
    g: &Group,
    idx: &GroupIndex,
    ws: &mut Workspace,
) -> Result<Tensor, TchError> {
    if c.logits_soft_cap.is_some() {
        return native::attend_group(c, cache, query, g, idx, Kind::Float, ws);
    }
    let (b, qm, len) = (g.b() as i64, g.q_max as i64, g.len_max as i64);
    let (hkv, grp, d) = (
        c.num_kv_heads as i64,
        c.group_size() as i64,
        c.head_size as i64,
    );
    let rows = grp * qm;
    let kind = compute_kind(c);

    let ids = idx.blocks.f_reshape([-1])?;
    let row = (c.block_size * c.num_kv_heads * c.head_size) as i64;
    let gather = |part, out: &mut Scratch| -> Result<Tensor, TchError> {
        let out = out.get(&[ids.size()[0], row], kind_of(c.dtype))?;
        cache
            .gather_pages(part, &ids, &out)?
            .f_view([b, -1, hkv, d])?
            .f_narrow(1, 0, len)?
            .f_to_kind(kind)?
            .f_transpose(1, 2) // [b, Hkv, len, D], strided
    };
    let mut k = gather(0, &mut ws.k_pages)?;
    let mut v = gather(1, &mut ws.v_pages)?;
    // SDPA adds its mask to the logits: a NaN key past a sequence's end would survive it.
    zero_past_end(&mut k, idx, (0, len), false)?;
    zero_past_end(&mut v, idx, (0, len), false)?;
    let q = query
        .f_index_select(0, &idx.q_rows)?
        .f_view([b, qm, hkv, grp, d])?
        .f_permute([0, 2, 3, 1, 4])?
        .f_reshape([b, hkv, rows, d])?
        .f_to_kind(kind)?;
    // [b, 1, 1, q_max, len]: the same for every head.
    let hide = hidden(c, idx, g.len_max)?.f_unsqueeze(1)?.f_unsqueeze(1)?;

    let mask = if c.alibi_slopes.is_none() && c.sinks.is_none() {
        hide.f_logical_not()?
            .f_expand([b, 1, grp, qm, len], false)?
            .f_reshape([b, 1, rows, len])?
    } else {
        let mut bias = match (&c.alibi_slopes, alibi_distance(c, idx, g.len_max)?) {
            (Some(slopes), Some(dist)) => {
                per_head(c, slopes, Kind::Float)?.f_mul(&dist.f_unsqueeze(1)?.f_unsqueeze(1)?)?
            }
            _ => Tensor::f_zeros([b, 1, 1, qm, len], (Kind::Float, CPU))?,
        };
        in_place(bias.f_masked_fill_(&hide, f64::NEG_INFINITY))?;
        let mut keys = len;
        if let Some(sinks) = &c.sinks {
            let zero = Tensor::f_zeros([b, hkv, 1, d], (kind, CPU))?;
            k = Tensor::f_cat(&[&k, &zero], 2)?;
            v = Tensor::f_cat(&[&v, &zero], 2)?;
            let sink = per_head(c, sinks, Kind::Float)?.f_expand([b, hkv, grp, qm, 1], false)?;
            bias = Tensor::f_cat(&[&bias.f_expand([b, hkv, grp, qm, len], false)?, &sink], 4)?;
            keys += 1;
        }
        bias.f_expand([b, hkv, grp, qm, keys], false)?
            .f_reshape([b, hkv, rows, keys])?
    };
    let out = Tensor::f_scaled_dot_product_attention(
        &q,
        &k,
        &v,
        Some(&mask),
        0.0,
        false,
        c.effective_scale(),
        false,
    )?;
    out.f_view([b, hkv, grp, qm, d])?
        .f_permute([0, 3, 1, 2, 4])?
        .f_reshape([b * qm, hkv * grp, d])?
        .f_to_kind(Kind::Float)
}
