//! The native variant: explicit logits (matmul, shaping, mask, softmax, matmul) with GQA as
//! a reshape of the queries to `[b, Hkv, G * q, D]` against each kv head's keys, so K/V are
//! never copied per query head.
//!
//! Keys are visited in fixed-size chunks of pages: each chunk is gathered from the paged
//! cache with one `index_select` into the call's [`Workspace`], copied head-major while it
//! is still in cache, and folded into a running max / sum / output (online softmax), which
//! bounds the memory of a call.
//!
//! Precision: the head-major copy also converts the chunk to the working precision (default
//! f32), so q·k, the softmax and P·V all run in it. Computing the matmuls in bf16 instead
//! (libtorch rounds a bf16 GEMM's result to bf16) was about twice as fast on large_decode
//! but rounds every logit and probability to 8 bits, which the oracle's 1e-2 tolerance
//! catches on short sequences; `Spyre::native_in(DType::Bf16)` is that trade, opted into.

use super::cache::SpyreCache;
use super::mask::{alibi_distance, hidden, per_head, zero_unseen, LogitShaping};
use super::plan::{Group, GroupIndex};
use super::tensors::{in_place, kind_of};
use super::workspace::{Scratch, Workspace};
use attn_reference::AttentionConfig;
use tch::{Kind, TchError, Tensor};

/// Default bytes of gathered K/V (storage and working copies) and logits one chunk may occupy.
pub(crate) const CHUNK_BYTES: usize = 32 << 20;

/// A floor for the running max: finite in every working kind, so a row whose first chunk is
/// fully masked computes `exp(-inf - floor) = 0` instead of `exp(-inf + inf) = NaN`.
fn max_floor(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -65504.0,
        _ => -1e30,
    }
}

/// Running softmax state of every (sequence, head, query row).
struct Online {
    /// Running max, `[b, Hkv, G, q_max, 1]` (or broadcastable to it).
    m: Tensor,
    /// Running sum of `exp(logit - m)`, same shape as `m`.
    l: Tensor,
    /// Running `sum exp(logit - m) * v`, `[b, Hkv, G * q_max, D]` (or broadcastable).
    o: Tensor,
}

/// Pages per chunk so that one chunk's tensors fit in `budget` bytes.
fn pages_per_chunk(
    c: &AttentionConfig,
    g: &Group,
    pages: usize,
    work: Kind,
    budget: usize,
) -> usize {
    let (b, bs) = (g.b(), c.block_size);
    let row = c.num_kv_heads * c.head_size;
    let work_bytes = work.elt_size_in_bytes();
    // Gathered pages and their head-major working copies, K and V.
    let kv = 2 * b * bs * row * (c.dtype.size_bytes() + work_bytes);
    // Logits and the temporaries of shaping them.
    let logits = 2 * b * c.num_heads * g.q_max * bs * work_bytes;
    (budget / (kv + logits).max(1)).clamp(1, pages.max(1))
}

/// Attention of one group in working precision `work`: `[b * q_max, Hq, D]` f32.
/// `query` is the step's `[T, Hq, D]` f32 queries.
pub(crate) fn attend_group(
    c: &AttentionConfig,
    cache: &SpyreCache,
    query: &Tensor,
    g: &Group,
    idx: &GroupIndex,
    work: Kind,
    ws: &mut Workspace,
) -> Result<Tensor, TchError> {
    let store = kind_of(c.dtype);
    let (b, qm) = (g.b() as i64, g.q_max as i64);
    let (hkv, grp, d, bs) = (
        c.num_kv_heads as i64,
        c.group_size() as i64,
        c.head_size as i64,
        c.block_size as i64,
    );
    let rows = grp * qm;
    let padded_len = idx.pages * c.block_size;

    // [b * q_max, Hq, D] -> [b, Hkv, G * q_max, D], scaled once here rather than per logit.
    let q = query
        .f_index_select(0, &idx.q_rows)?
        .f_view([b, qm, hkv, grp, d])?
        .f_permute([0, 2, 3, 1, 4])?
        .f_reshape([b, hkv, rows, d])?
        .f_mul_scalar(c.effective_scale())?
        .f_to_kind(work)?;
    let hide = hidden(c, idx, padded_len)?.f_unsqueeze(1)?.f_unsqueeze(1)?;
    let distance = alibi_distance(c, idx, padded_len)?;
    let shaping = LogitShaping::new(c, work)?;
    let floor = max_floor(work);

    // A sink is a logit every row starts with: it joins the running sum, adds no value.
    let mut state = match &c.sinks {
        Some(s) => {
            let sinks = per_head(c, s, work)?;
            let m = sinks.f_clamp_min(floor)?;
            let l = sinks.f_sub(&m)?.f_exp()?;
            Some(Online {
                m,
                l,
                o: Tensor::f_zeros([1, 1, 1, 1], (work, tch::Device::Cpu))?,
            })
        }
        None => None,
    };

    let chunk = pages_per_chunk(c, g, idx.pages, work, ws.budgets.chunk_bytes);
    for first_page in (0..idx.pages).step_by(chunk) {
        let n = chunk.min(idx.pages - first_page) as i64;
        let (k0, len) = (first_page as i64 * bs, n * bs);
        let ids = idx
            .blocks
            .f_narrow(1, first_page as i64, n)?
            .f_reshape([-1])?;
        // Gathered token-major, then copied head-major while the chunk is still in cache,
        // so both matmuls are plain batched GEMMs on contiguous operands.
        let row = bs * hkv * d;
        let heads = |pages: &mut Scratch, out: &mut Scratch, part| -> Result<Tensor, TchError> {
            let gathered = cache.gather_pages(part, &ids, &pages.get(&[b * n, row], store)?)?;
            let mut dst = out.get(&[b, hkv, len, d], work)?;
            dst.f_copy_(&gathered.f_view([b, len, hkv, d])?.f_transpose(1, 2)?)?;
            Ok(dst)
        };
        let k = heads(&mut ws.k_pages, &mut ws.k_heads, 0)?.f_transpose(2, 3)?; // [b, Hkv, D, len]
        let mut v = heads(&mut ws.v_pages, &mut ws.v_heads, 1)?; // [b, Hkv, len, D]

        // Hidden keys' logits are replaced by the mask below; hidden values are not.
        zero_unseen(&mut v, idx, (k0, len), false)?;

        let mut s = q
            .f_matmul(&k)?
            .f_to_kind(work)?
            .f_view([b, hkv, grp, qm, len])?;
        let dist = distance
            .as_ref()
            .map(|t| t.f_narrow(2, k0, len))
            .transpose()?;
        shaping.apply(&mut s, dist.as_ref())?;
        in_place(s.f_masked_fill_(&hide.f_narrow(4, k0, len)?, f64::NEG_INFINITY))?;

        let chunk_max = s.f_amax([-1], true)?;
        let m = match &state {
            None => chunk_max.f_clamp_min(floor)?,
            Some(st) => st.m.f_maximum(&chunk_max)?,
        };
        in_place(s.f_sub_(&m))?;
        in_place(s.f_exp_())?;
        let l = s.f_sum_dim_intlist([-1i64].as_slice(), true, work)?;
        let o = s.f_view([b, hkv, rows, len])?.f_matmul(&v)?;
        state = Some(match state {
            None => Online { m, l, o },
            Some(st) => {
                let alpha = st.m.f_sub(&m)?.f_exp()?;
                let l = st.l.f_mul(&alpha)?.f_add(&l)?;
                let o =
                    st.o.f_mul(
                        &alpha
                            .f_expand([b, hkv, grp, qm, 1], false)?
                            .f_reshape([b, hkv, rows, 1])?,
                    )?
                    .f_add(&o)?;
                Online { m, l, o }
            }
        });
    }
    let st = state.ok_or_else(|| TchError::Shape("a group with no key pages".into()))?;
    // No row is fully masked (padding rows see key 0), so l >= 1; the floor only keeps a
    // broken invariant from turning into NaN.
    let l =
        st.l.f_to_kind(Kind::Float)?
            .f_clamp_min(1e-30)?
            .f_expand([b, hkv, grp, qm, 1], false)?
            .f_reshape([b, hkv, rows, 1])?;
    st.o.f_to_kind(Kind::Float)?
        .f_div(&l)?
        .f_view([b, hkv, grp, qm, d])?
        .f_permute([0, 3, 1, 2, 4])?
        .f_reshape([b * qm, hkv * grp, d])
}
