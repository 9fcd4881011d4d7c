//! The SDPA variant: each group's pages gathered into the call's [`Workspace`], viewed as
//! `[b, Hkv, len, D]` and handed to libtorch's `scaled_dot_product_attention` with the
//! visibility mask.
//!
//! GQA folds the group of query heads into the query rows (`[b, Hkv, G * q, D]` against
//! each kv head's keys) instead of passing `enable_gqa`: libtorch 2.13's CPU SDPA serves
//! `enable_gqa` from its math path, which copies K/V per query head and ran 8x slower on
//! large_decode; the fold gives the same result with the fused kernel and no K/V copies.
//!
//! Keys are split when a group's gathered K/V would pass its budget (a long sequence, a
//! small cache): each chunk of pages goes through libtorch's fused CPU kernel, which also
//! returns each row's log-sum-exp, and the chunks' outputs are merged by it (the partial
//! softmaxes of a split-KV kernel). Within budget a group is one call.
//!
//! Features SDPA has no argument for are expressed around it: ALiBi becomes an additive f32
//! mask; a sink joins only the denominator, so it enters the merge as a log-sum-exp of its
//! own with no value. A soft-cap acts on the logits inside the softmax, which SDPA never
//! exposes, so soft-capped configs compute their logits explicitly with the native
//! variant's f32 path.

use super::cache::SpyreCache;
use super::mask::{alibi_distance, hidden, per_head, zero_unseen};
use super::native;
use super::plan::{Group, GroupIndex};
use super::tensors::{in_place, kind_of, CPU};
use super::workspace::{Scratch, Workspace};
use attn_reference::AttentionConfig;
use tch::{Kind, TchError, Tensor};

/// Default gathered K/V bytes (K and V together) one group may hold before its keys are
/// split. Small enough that a group's pages are still in cache when SDPA reads them: on
/// large_decode one sequence per group ran faster than four, and the call's peak memory
/// fell with it.
pub(crate) const GROUP_KV_BYTES: usize = 8 << 20;

/// The kind SDPA runs in: the cache's dtype, or f32 when the mask carries real-valued
/// biases (ALiBi distances would lose their precision in a 16-bit mask).
pub(crate) fn compute_kind(c: &AttentionConfig) -> Kind {
    if c.alibi_slopes.is_some() {
        Kind::Float
    } else {
        kind_of(c.dtype)
    }
}

/// Bytes one key position of one sequence takes once gathered: its K and V rows of every kv
/// head, in the wider of the cache's dtype and the kind SDPA runs in. What the grouping and
/// the key chunks budget by.
pub(crate) fn kv_bytes_per_key(c: &AttentionConfig) -> usize {
    let elt = kind_of(c.dtype)
        .elt_size_in_bytes()
        .max(compute_kind(c).elt_size_in_bytes());
    2 * c.num_kv_heads * c.head_size * elt
}

/// Pages per key chunk so that the group's gathered K and V fit in `budget` bytes: all of
/// them when the group's own keys do (the grouping keeps every group of several sequences
/// within the budget), so only a sequence longer than the budget is split.
fn pages_per_chunk(c: &AttentionConfig, g: &Group, pages: usize, budget: usize) -> usize {
    let token = g.b() * kv_bytes_per_key(c);
    if g.len_max * token <= budget {
        return pages.max(1);
    }
    (budget / (c.block_size * token).max(1)).clamp(1, pages.max(1))
}

/// The softmax-weighted merge of key chunks' outputs by their log-sum-exps: f32 running
/// max `m`, denominator `l` (both `[b, Hkv, rows, 1]`) and numerator `o`.
struct Merge {
    m: Tensor,
    l: Tensor,
    o: Option<Tensor>,
}

/// A floor for the running max: a row that sees no key of a chunk has a log-sum-exp of
/// -inf there, and `exp(-inf - -inf)` would be NaN.
const LSE_FLOOR: f64 = -1e30;

impl Merge {
    /// Nothing seen yet, or only the sinks: each row's sink is a logit with no value.
    fn new(c: &AttentionConfig, (b, rows, qm): (i64, i64, i64)) -> Result<Self, TchError> {
        let hkv = c.num_kv_heads as i64;
        Ok(match &c.sinks {
            Some(s) => {
                let m = per_head(c, s, Kind::Float)?
                    .f_expand([1, hkv, c.group_size() as i64, qm, 1], false)?
                    .f_reshape([1, hkv, rows, 1])?
                    .f_clamp_min(LSE_FLOOR)?;
                Merge {
                    l: m.f_ones_like()?,
                    m,
                    o: None,
                }
            }
            None => Merge {
                m: Tensor::f_full([b, hkv, rows, 1], LSE_FLOOR, (Kind::Float, CPU))?,
                l: Tensor::f_zeros([b, hkv, rows, 1], (Kind::Float, CPU))?,
                o: None,
            },
        })
    }

    /// Fold in one chunk's output `o` (`[b, Hkv, rows, D]`) and log-sum-exp (`[b, Hkv, rows]`);
    /// `blind` (`[b, 1, rows]`) marks the rows that see no key of the chunk, for which the
    /// fused kernel gives a log-sum-exp of 0, not -inf.
    fn add(&mut self, o: &Tensor, lse: &Tensor, blind: &Tensor) -> Result<(), TchError> {
        let lse = lse
            .f_to_kind(Kind::Float)?
            .f_masked_fill(blind, f64::NEG_INFINITY)?
            .f_unsqueeze(-1)?;
        let m = self.m.f_maximum(&lse)?;
        let alpha = self.m.f_sub(&m)?.f_exp()?;
        let w = lse.f_sub(&m)?.f_exp()?;
        // A row that saw no key of this chunk: weight 0, and its output must not turn the
        // sum into NaN.
        let o = o.f_to_kind(Kind::Float)?.f_nan_to_num(0.0, 0.0, 0.0)?;
        self.l = self.l.f_mul(&alpha)?.f_add(&w)?;
        self.o = Some(match &self.o {
            None => o.f_mul(&w)?,
            Some(prev) => prev.f_mul(&alpha)?.f_add(&o.f_mul(&w)?)?,
        });
        self.m = m;
        Ok(())
    }

    fn finish(self) -> Result<Tensor, TchError> {
        let o = self
            .o
            .ok_or_else(|| TchError::Shape("a group with no key pages".into()))?;
        // Every row sees a key (padding rows see key 0), so l > 0; the floor keeps a broken
        // invariant from turning into NaN.
        o.f_div(&self.l.f_clamp_min(1e-30)?)
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
    let (b, qm) = (g.b() as i64, g.q_max as i64);
    let (hkv, grp, d, bs) = (
        c.num_kv_heads as i64,
        c.group_size() as i64,
        c.head_size as i64,
        c.block_size as i64,
    );
    let rows = grp * qm;
    let kind = compute_kind(c);
    let q = query
        .f_index_select(0, &idx.q_rows)?
        .f_view([b, qm, hkv, grp, d])?
        .f_permute([0, 2, 3, 1, 4])?
        .f_reshape([b, hkv, rows, d])?
        .f_to_kind(kind)?;
    let len = g.len_max as i64;
    let padded_len = idx.pages * c.block_size;
    // [b, 1, 1, q_max, keys]: the same for every head.
    let hide = hidden(c, idx, padded_len)?.f_unsqueeze(1)?.f_unsqueeze(1)?;
    let distance = alibi_distance(c, idx, padded_len)?;
    let slopes = c
        .alibi_slopes
        .as_deref()
        .map(|s| per_head(c, s, Kind::Float))
        .transpose()?;

    let chunk = pages_per_chunk(c, g, idx.pages, ws.budgets.group_kv_bytes);
    let split = chunk < idx.pages || c.sinks.is_some();
    let mut merge = if split {
        Some(Merge::new(c, (b, rows, qm))?)
    } else {
        None
    };
    let row = (c.block_size * c.num_kv_heads * c.head_size) as i64;
    for first_page in (0..idx.pages).step_by(chunk) {
        let n = chunk.min(idx.pages - first_page) as i64;
        // Keys of this chunk: the whole pages, except the last chunk stops at len_max.
        let k0 = first_page as i64 * bs;
        let keys = (n * bs).min(len - k0);
        let ids = idx
            .blocks
            .f_narrow(1, first_page as i64, n)?
            .f_reshape([-1])?;
        let gather = |part, out: &mut Scratch| -> Result<Tensor, TchError> {
            let out = out.get(&[b * n, row], kind_of(c.dtype))?;
            cache
                .gather_pages(part, &ids, &out)?
                .f_view([b, -1, hkv, d])?
                .f_narrow(1, 0, keys)?
                .f_to_kind(kind)?
                .f_transpose(1, 2) // [b, Hkv, keys, D], strided
        };
        let mut k = gather(0, &mut ws.k_pages)?;
        let mut v = gather(1, &mut ws.v_pages)?;
        // SDPA adds its mask to the logits: a NaN key past a sequence's end would survive it.
        zero_unseen(&mut k, idx, (k0, keys), false)?;
        zero_unseen(&mut v, idx, (k0, keys), false)?;
        let hide = hide.f_narrow(4, k0, keys)?;
        let mask = match (&slopes, &distance) {
            (Some(slopes), Some(dist)) => {
                let dist = dist.f_narrow(2, k0, keys)?.f_unsqueeze(1)?.f_unsqueeze(1)?;
                let mut bias = slopes.f_mul(&dist)?; // [b, Hkv, G, q_max, keys]
                in_place(bias.f_masked_fill_(&hide, f64::NEG_INFINITY))?;
                bias.f_reshape([b, hkv, rows, keys])?
            }
            // libtorch's SDPA takes a bool mask (true: attend); its fused kernel called
            // directly wants an additive one of the query's kind.
            _ if merge.is_some() => {
                let mut add = Tensor::f_zeros([b, 1, grp, qm, keys], (kind, CPU))?;
                in_place(add.f_masked_fill_(&hide, f64::NEG_INFINITY))?;
                add.f_reshape([b, 1, rows, keys])?
            }
            _ => hide
                .f_logical_not()?
                .f_expand([b, 1, grp, qm, keys], false)?
                .f_reshape([b, 1, rows, keys])?,
        };
        match &mut merge {
            None => {
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
                return finish(out.f_to_kind(Kind::Float)?, (b, qm, hkv, grp, d));
            }
            Some(merge) => {
                let (o, lse) = Tensor::f_internal_scaled_dot_product_flash_attention_for_cpu(
                    &q,
                    &k,
                    &v,
                    0.0,
                    false,
                    Some(&mask),
                    c.effective_scale(),
                )?;
                let blind = hide
                    .f_all_dim(-1, false)? // [b, 1, 1, q_max]
                    .f_expand([b, 1, grp, qm], false)?
                    .f_reshape([b, 1, rows])?;
                merge.add(&o, &lse, &blind)?;
            }
        }
    }
    let merged = merge
        .ok_or_else(|| TchError::Shape("a group with no key pages".into()))?
        .finish()?;
    finish(merged, (b, qm, hkv, grp, d))
}

/// `[b, Hkv, G * q_max, D]` f32 back to the group's `[b * q_max, Hq, D]`.
fn finish(
    out: Tensor,
    (b, qm, hkv, grp, d): (i64, i64, i64, i64, i64),
) -> Result<Tensor, TchError> {
    out.f_view([b, hkv, grp, qm, d])?
        .f_permute([0, 3, 1, 2, 4])?
        .f_reshape([b * qm, hkv * grp, d])
}
