//! The paged KV cache: one tensor `[2, num_blocks, block_size, num_kv_heads, head_size]` in
//! the layer's dtype (K at index 0, V at 1), written through `slot_mapping` with a single
//! vectorized `index_copy_`, as a PyTorch backend's reshape-and-cache does.
//!
//! An FP8 cache holds the codes as bytes (libtorch's float8 kinds do the conversions;
//! gathers and scatters move bytes): written as `fp8(clamp(x / scale))` (libtorch's cast does
//! not saturate: past 464 an E4M3FN cast gives NaN, so the clamp is what vLLM's quantizers do
//! too), read as `fp8 * scale` in f32, then in the compute dtype (triton_unified_attention's
//! convention).

use super::tensors::{from_f32, from_i64, in_place, kind_of, CPU};
use attn_reference::{AttentionConfig, Fp8Format, Fp8KvCache};
use tch::{Kind, TchError, Tensor};

pub(crate) struct SpyreCache {
    /// `[2, num_blocks, block_size, num_kv_heads, head_size]`.
    pub kv: Tensor,
    pub num_blocks: usize,
    /// The format and scales of an FP8 cache (`kv` then holds code bytes).
    fp8: Option<Fp8KvCache>,
}

fn fp8_kind(f: Fp8Format) -> Kind {
    match f {
        Fp8Format::E4m3 => Kind::Float8e4m3fn,
        Fp8Format::E5m2 => Kind::Float8e5m2,
    }
}

/// `fp8(x / scales)` in `format`, saturating as vLLM's quantizers do (libtorch's cast alone
/// gives NaN past the largest value). `scales` is a tensor that broadcasts over `x`, not a
/// scalar: libtorch then divides element by element, as the reference does (no reciprocal).
pub(crate) fn to_fp8(x: &Tensor, scales: &Tensor, format: Fp8Format) -> Result<Tensor, TchError> {
    let max = format.max_finite();
    x.f_div(scales)?
        .f_clamp(-max, max)?
        .f_to_kind(fp8_kind(format))
}

impl SpyreCache {
    pub fn new(config: &AttentionConfig, num_blocks: usize) -> Result<Self, TchError> {
        let shape = [
            2,
            num_blocks as i64,
            config.block_size as i64,
            config.num_kv_heads as i64,
            config.head_size as i64,
        ];
        // Zeros, not uninitialised memory: a backend bug that reads a never-written slot
        // should see stale finite data, never NaN from garbage bits.
        let kind = match &config.kv_cache {
            Some(_) => Kind::Uint8,
            None => kind_of(config.dtype),
        };
        let kv = Tensor::f_zeros(shape, (kind, CPU))?;
        Ok(SpyreCache {
            kv,
            num_blocks,
            fp8: config.kv_cache.clone(),
        })
    }

    /// FP8 codes of K (`part` 0) or V (1) as the kernel reads them: `fp8 * scale` in f32,
    /// then in `kind`.
    fn dequantize(
        &self,
        f: &Fp8KvCache,
        codes: &Tensor,
        part: i64,
        kind: Kind,
    ) -> Result<Tensor, TchError> {
        let scale = if part == 0 { f.k_scale } else { f.v_scale };
        codes
            .f_view_dtype(fp8_kind(f.dtype))?
            .f_to_kind(Kind::Float)?
            .f_mul_scalar(scale as f64)?
            .f_to_kind(kind)
    }

    /// Pages `ids` of K and V together, `[2, ids.len() * block_size * Hkv * D]` flattened per
    /// part as the cache is, in `kind` (an FP8 cache's dequantized).
    pub fn select_pages(&self, ids: &Tensor, kind: Kind) -> Result<Tensor, TchError> {
        let pages = self.kv.f_index_select(1, ids)?;
        match &self.fp8 {
            None => Ok(pages),
            Some(f) => Tensor::f_stack(
                &[
                    self.dequantize(f, &pages.f_select(0, 0)?, 0, kind)?,
                    self.dequantize(f, &pages.f_select(0, 1)?, 1, kind)?,
                ],
                0,
            ),
        }
    }

    /// Gather whole pages `ids` of K (`part` 0) or V (1) into `out`
    /// (`[ids.len(), block_size * Hkv * D]`, the cache's kind) and return it. Each page is
    /// one contiguous row of the cache viewed as `[num_blocks, block_size * Hkv * D]`, so
    /// the gather is a row copy into an already mapped buffer.
    /// An FP8 cache gathers its code bytes and returns them dequantized in `out`'s kind (a
    /// new tensor).
    pub fn gather_pages(&self, part: i64, ids: &Tensor, out: &Tensor) -> Result<Tensor, TchError> {
        let pages = self
            .kv
            .f_select(0, part)?
            .f_view([self.num_blocks as i64, -1])?;
        match &self.fp8 {
            None => pages.f_index_select_out(out, 0, ids),
            Some(f) => self.dequantize(f, &pages.f_index_select(0, ids)?, part, out.kind()),
        }
    }

    /// Bytes the cache holds, K and V together.
    pub fn bytes(&self) -> usize {
        self.kv.numel() * self.kv.kind().elt_size_in_bytes()
    }

    pub fn num_slots(&self, config: &AttentionConfig) -> usize {
        self.num_blocks * config.block_size
    }

    /// Store rows `i` with `slots[i] >= 0` of `key`/`value` (`[n, Hkv, D]`). `slots` must
    /// already be checked against the cache's size.
    pub fn write(
        &mut self,
        config: &AttentionConfig,
        key: &[f32],
        value: &[f32],
        slots: &[i64],
    ) -> Result<(), TchError> {
        let (hkv, d) = (config.num_kv_heads as i64, config.head_size as i64);
        let n = slots.len() as i64;
        let rows: Vec<i64> = (0..n).filter(|&i| slots[i as usize] >= 0).collect();
        if rows.is_empty() {
            return Ok(());
        }
        let targets: Vec<i64> = rows.iter().map(|&i| slots[i as usize]).collect();
        // K and V side by side as [2, n, Hkv, D], so one scatter writes both.
        let src = Tensor::f_stack(
            &[from_f32(key, &[n, hkv, d])?, from_f32(value, &[n, hkv, d])?],
            0,
        )?;
        let src = if rows.len() as i64 == n {
            src
        } else {
            src.f_index_select(1, &from_i64(&rows)?)?
        };
        let src = match &self.fp8 {
            None => src.f_to_kind(kind_of(config.dtype))?,
            Some(f) => {
                let scales = from_f32(&[f.k_scale, f.v_scale], &[2, 1, 1, 1])?;
                to_fp8(&src, &scales, f.dtype)?.f_view_dtype(Kind::Uint8)?
            }
        };
        let mut flat = self.kv.f_view([2, -1, hkv, d])?;
        in_place(flat.f_index_copy_(1, &from_i64(&targets)?, &src))?;
        Ok(())
    }
}
