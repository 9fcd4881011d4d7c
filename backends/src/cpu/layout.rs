//! The CPU backend's KV-cache layout and its reshape-and-cache (`write_kv`).
//!
//! Per physical block and kv head one contiguous chunk of `2 * block_size * head_size`
//! elements, so a decode step streams each (block, head) pair as one sequential read:
//!
//! ```text
//! [num_blocks][num_kv_heads][ K^T: head_size x block_size | V: block_size x head_size_v ]
//! ```
//!
//! MLA (one latent head, V its first `head_size_v` dims): the same chunk, V written from
//! each key row's prefix at `write_kv`, so the kernels read V as in any other case (its
//! rows a little narrower). The latent is held twice, a layout choice of this backend.
//!
//! K is stored transposed (`K^T[d][slot]`): the score kernel loads 16 (AVX-512) or 8 (AVX2)
//! consecutive keys of one dimension as a vector and multiplies it by a broadcast query
//! element, so scores come out as full vectors with no horizontal sums. V is stored row-major
//! (`V[slot][d]`): the value kernel adds `p * V[slot][..]` to output rows vector by vector.
//! Elements are kept in the dtype: `f32`, or `bf16`/`f16` (16-bit) through the `half` crate;
//! in an FP8 cache as one-byte codes of `x / scale` (`cpu::fp8`), the scales applied by the
//! kernel to the scores and the output. Per-token scales (one per slot, kv head and K or V,
//! computed as the row is written) are kept beside the elements, per (block, kv head) chunk:
//! `[num_blocks][num_kv_heads][ K scales: block_size | V scales: block_size ]`.

use super::elem::KvElem;
use super::fp8::{self, E4m3, E5m2};
use crate::BackendError;
use attn_reference::{DType, Fp8Format, Fp8KvCache, KvPart, KvScales};
use half::{bf16, f16};

/// The element storage of a cache, one variant per dtype.
#[derive(Debug)]
pub enum KvData {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    Fp8E4m3(Vec<E4m3>),
    Fp8E5m2(Vec<E5m2>),
}

/// Shape of the cache; every offset computation lives here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub num_blocks: usize,
    pub num_kv_heads: usize,
    pub block_size: usize,
    /// Width of K (the latent entry in MLA).
    pub head_size: usize,
    /// Width of V: `head_size` but in MLA.
    pub head_size_v: usize,
}

impl Geometry {
    /// The geometry of `config`'s cache of `num_blocks` blocks.
    pub fn of(config: &attn_reference::AttentionConfig, num_blocks: usize) -> Geometry {
        Geometry {
            num_blocks,
            num_kv_heads: config.num_kv_heads,
            block_size: config.block_size,
            head_size: config.head_size,
            head_size_v: config.head_size_v(),
        }
    }

    /// Elements of one (block, kv head) chunk: K^T then V.
    pub fn chunk_len(&self) -> usize {
        self.block_size * (self.head_size + self.head_size_v)
    }

    /// Start of the K^T part of (block, kv head); V follows at `+ block_size * head_size`.
    pub fn chunk_start(&self, block: usize, kv_head: usize) -> usize {
        (block * self.num_kv_heads + kv_head) * self.chunk_len()
    }

    /// Start of (block, kv head)'s per-token K scales in [`CpuKvCache::token_scales`]; its V
    /// scales follow at `+ block_size`.
    pub fn token_scales_start(&self, block: usize, kv_head: usize) -> usize {
        (block * self.num_kv_heads + kv_head) * 2 * self.block_size
    }

    /// Total elements, or `None` on overflow.
    pub fn total_len(&self) -> Option<usize> {
        self.num_blocks
            .checked_mul(self.num_kv_heads)?
            .checked_mul(self.chunk_len())
    }
}

/// A cache the allocator refused (or that does not fit in the address space).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheAllocError {
    pub geometry: Geometry,
    /// Bytes asked for (`u128::MAX` when even the element count overflows).
    pub bytes: u128,
}

impl std::fmt::Display for CacheAllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.geometry;
        write!(
            f,
            "{} blocks x {} kv heads x {} slots x ({} + {}) elements ({:.1} GiB)",
            g.num_blocks,
            g.num_kv_heads,
            g.block_size,
            g.head_size,
            g.head_size_v,
            self.bytes as f64 / (1u64 << 30) as f64
        )
    }
}

/// Types whose all-zero bit pattern is a valid value.
///
/// # Safety
/// Implemented only for types for which every all-zero byte pattern is a valid value.
pub unsafe trait ZeroBits: Copy {}
// SAFETY: 0.0 and 0 are all-zero bits.
unsafe impl ZeroBits for f32 {}
// SAFETY: as above.
unsafe impl ZeroBits for u16 {}
// SAFETY: as above.
unsafe impl ZeroBits for u8 {}

/// `len` zeroed elements as one zeroed allocation (pages no write touches cost nothing), or
/// `None` when the allocator refuses it: an allocation sized from a case fails softly,
/// where `vec![0; len]` would abort the process.
pub fn try_zeroed<T: ZeroBits>(len: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` elements of `T`
    // (what a `Vec<T>` of capacity `len` uses), and all `len` are zero bits, valid (`ZeroBits`).
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// A paged KV cache in this backend's layout.
#[derive(Debug)]
pub struct CpuKvCache {
    pub dtype: DType,
    /// The FP8 format and scales, for an FP8 cache.
    pub fp8: Option<Fp8KvCache>,
    pub geometry: Geometry,
    pub data: KvData,
    /// Per-token scales (`Geometry::token_scales_start`), for a cache with
    /// [`KvScales::Token`]; empty otherwise.
    pub token_scales: Vec<f32>,
}

impl CpuKvCache {
    /// A zeroed cache; `Err` with the bytes asked for when it does not fit in the address
    /// space or the allocator refuses it (never an abort).
    pub fn new(
        dtype: DType,
        fp8: Option<Fp8KvCache>,
        geometry: Geometry,
    ) -> Result<Self, CacheAllocError> {
        let element_bytes = if fp8.is_some() { 1 } else { dtype.size_bytes() };
        let refused = || CacheAllocError {
            geometry,
            bytes: geometry
                .total_len()
                .map_or(u128::MAX, |n| n as u128 * element_bytes as u128),
        };
        let len = geometry
            .total_len()
            .filter(|&n| {
                n.checked_mul(element_bytes)
                    .is_some_and(|b| b <= isize::MAX as usize)
            })
            .ok_or_else(refused)?;
        // Zeroed allocations (the allocator's zeroed memory): pages no write touches cost
        // nothing, so a huge cache of which a case uses a few blocks is cheap. bf16/f16 zeros
        // are all-zero bits, so they come as u16 zeros.
        use half::vec::HalfBitsVecExt;
        let data = match (fp8.as_ref().map(|c| c.dtype), dtype) {
            (Some(Fp8Format::E4m3), _) => KvData::Fp8E4m3(fp8::zeroed(len).ok_or_else(refused)?),
            (Some(Fp8Format::E5m2), _) => KvData::Fp8E5m2(fp8::zeroed(len).ok_or_else(refused)?),
            (None, DType::F32) => KvData::F32(try_zeroed::<f32>(len).ok_or_else(refused)?),
            (None, DType::Bf16) => KvData::Bf16(
                try_zeroed::<u16>(len)
                    .ok_or_else(refused)?
                    .reinterpret_into(),
            ),
            (None, DType::F16) => KvData::F16(
                try_zeroed::<u16>(len)
                    .ok_or_else(refused)?
                    .reinterpret_into(),
            ),
        };
        let token_scales = match fp8.as_ref().map(|c| &c.scales) {
            Some(KvScales::Token) => geometry
                .num_blocks
                .checked_mul(geometry.num_kv_heads * 2 * geometry.block_size)
                .and_then(try_zeroed::<f32>)
                .ok_or_else(refused)?,
            _ => Vec::new(),
        };
        Ok(CpuKvCache {
            dtype,
            fp8,
            geometry,
            data,
            token_scales,
        })
    }

    /// Store rows `key`/`value` (`[n, num_kv_heads, head_size]`) at their slots, skipping -1.
    /// With `latent` (MLA), `value` is empty and V is each key row's first `head_size_v`.
    pub fn write(
        &mut self,
        backend: &str,
        key: &[f32],
        value: &[f32],
        slot_mapping: &[i64],
        latent: bool,
    ) -> Result<(), BackendError> {
        let g = self.geometry;
        let row = g.num_kv_heads * g.head_size;
        let invalid = |message: String| BackendError::InvalidInput {
            backend: backend.to_string(),
            message,
        };
        let want = slot_mapping
            .len()
            .checked_mul(row)
            .ok_or_else(|| invalid("slot_mapping too long".into()))?;
        let want_v = if latent { 0 } else { want };
        if key.len() != want || value.len() != want_v {
            return Err(invalid(format!(
                "write_kv: key/value hold {}/{} values, expected {want}/{want_v} ([{}, {}, {}])",
                key.len(),
                value.len(),
                slot_mapping.len(),
                g.num_kv_heads,
                g.head_size
            )));
        }
        let slots = g.num_blocks * g.block_size;
        for &s in slot_mapping {
            if s < -1 || (s >= 0 && s as u64 >= slots as u64) {
                return Err(invalid(format!(
                    "write_kv: slot {s} outside the cache's {slots} slots"
                )));
            }
        }
        let rows = Rows {
            key,
            // MLA: V is read from the key rows (each row's first `head_size_v`).
            value: if latent { key } else { value },
            slot_mapping,
            fp8: self.fp8.as_ref(),
        };
        let scales = &mut self.token_scales;
        match &mut self.data {
            KvData::F32(d) => scatter(d, scales, g, rows),
            KvData::Bf16(d) => scatter(d, scales, g, rows),
            KvData::F16(d) => scatter(d, scales, g, rows),
            KvData::Fp8E4m3(d) => scatter(d, scales, g, rows),
            KvData::Fp8E5m2(d) => scatter(d, scales, g, rows),
        }
        Ok(())
    }
}

/// What one `write` stores: rows, their slots, and the FP8 cache whose scales they are
/// divided by (none: stored as they are).
#[derive(Clone, Copy)]
struct Rows<'a> {
    key: &'a [f32],
    value: &'a [f32],
    slot_mapping: &'a [i64],
    fp8: Option<&'a Fp8KvCache>,
}

/// Store `rows` at their slots; per-token scales, computed from each row, go to
/// `token_scales`.
fn scatter<T: KvElem>(data: &mut [T], token_scales: &mut [f32], g: Geometry, rows: Rows<'_>) {
    let Rows {
        key,
        value,
        slot_mapping,
        fp8,
    } = rows;
    let (bs, d, dv) = (g.block_size, g.head_size, g.head_size_v);
    let row = g.num_kv_heads * d;
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let Ok(slot) = usize::try_from(slot) else {
            continue;
        };
        let (block, off) = (slot / bs, slot % bs);
        for h in 0..g.num_kv_heads {
            let src = t * row + h * d;
            let base = g.chunk_start(block, h);
            // Codes of x / scale; dividing by 1 leaves the other dtypes exact.
            let (ks, vs) = match fp8 {
                None => (1.0, 1.0),
                Some(c) => (
                    c.row_scale(KvPart::K, h, &key[src..src + d]),
                    c.row_scale(KvPart::V, h, &value[src..src + dv]),
                ),
            };
            // Per-token scales are kept for the kernel (`run_item`) to read.
            if fp8.is_some_and(|c| c.scales == KvScales::Token) {
                let at = g.token_scales_start(block, h) + off;
                token_scales[at] = ks;
                token_scales[at + bs] = vs;
            }
            let scaled = |x: f32, s: f32| fp8.map_or(x, |c| c.scaled_for_write(x, s));
            for i in 0..d {
                data[base + i * bs + off] = T::from_f32(scaled(key[src + i], ks));
            }
            // V rows are `head_size_v` wide: all of a value row, or a latent key's prefix.
            let v = &mut data[base + bs * d + off * dv..base + bs * d + (off + 1) * dv];
            for (dst, &x) in v.iter_mut().zip(&value[src..src + dv]) {
                *dst = T::from_f32(scaled(x, vs));
            }
        }
    }
}
