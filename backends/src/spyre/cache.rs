//! The paged KV cache: one tensor `[2, num_blocks, block_size, num_kv_heads, head_size]` in
//! the layer's dtype (K at index 0, V at 1), written through `slot_mapping` with a single
//! vectorized `index_copy_`, as a PyTorch backend's reshape-and-cache does.

use super::tensors::{from_f32, from_i64, in_place, kind_of, CPU};
use attn_reference::AttentionConfig;
use tch::{TchError, Tensor};

pub(crate) struct SpyreCache {
    /// `[2, num_blocks, block_size, num_kv_heads, head_size]`.
    pub kv: Tensor,
    pub num_blocks: usize,
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
        let kv = Tensor::f_zeros(shape, (kind_of(config.dtype), CPU))?;
        Ok(SpyreCache { kv, num_blocks })
    }

    /// Gather whole pages `ids` of K (`part` 0) or V (1) into `out`
    /// (`[ids.len(), block_size * Hkv * D]`, the cache's kind) and return it. Each page is
    /// one contiguous row of the cache viewed as `[num_blocks, block_size * Hkv * D]`, so
    /// the gather is a row copy into an already mapped buffer.
    pub fn gather_pages(&self, part: i64, ids: &Tensor, out: &Tensor) -> Result<Tensor, TchError> {
        self.kv
            .f_select(0, part)?
            .f_view([self.num_blocks as i64, -1])?
            .f_index_select_out(out, 0, ids)
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
        let src = src.f_to_kind(kind_of(config.dtype))?;
        let mut flat = self.kv.f_view([2, -1, hkv, d])?;
        in_place(flat.f_index_copy_(1, &from_i64(&targets)?, &src))?;
        Ok(())
    }
}
