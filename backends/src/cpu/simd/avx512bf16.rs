//! Scores with `vdpbf16ps`: each instruction multiplies 16 keys by two query dimensions
//! (exact bf16 products, f32 sums), half the instructions of widening bf16 to f32 first.
//! The cache keeps K^T one dimension per row, so each call first regroups its keys into
//! (dimension 2p, 2p + 1) pairs; that pass is shared by all rows of the call, which is why
//! the kernel is used for tasks with many rows (prefill).

// Register tiles are indexed by row and vector in lockstep; index loops say that best.
#![allow(clippy::needless_range_loop)]

use super::avx512::{lanes, Prefetch};
use super::QkBf16Args;
use std::arch::x86_64::*;

pub fn detected() -> bool {
    super::avx512::detected() && is_x86_feature_detected!("avx512bf16")
}

/// Only reachable through the AVX-512 table built when `detected()` holds.
pub fn qk(mut a: QkBf16Args<'_>) {
    a.check();
    // SAFETY: the table holding this function is only built on a CPU with AVX-512 F/BW/VL
    // and BF16; `check` proved every query pair, key, packed slot and score column touched
    // below lies inside its slice.
    unsafe { qk_impl(&mut a) }
}

/// Reinterpret 32 bf16 values (as 16 u32 pairs) for `vdpbf16ps`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 64-byte vectors for which every bit pattern is valid.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn qk_impl(a: &mut QkBf16Args<'_>) {
    let (d, bs, n) = (a.d, a.bs, a.n);
    let dp = d.div_ceil(2);
    let kt = a.kt.as_ptr() as *const i16;
    let packed = a.packed.as_mut_ptr() as *mut i32;
    let mut pf = Prefetch::new(a.prefetch, dp);
    // packed[p * n + j] = K^T[2p][j0 + j] | K^T[2p + 1][j0 + j] << 16
    for p in 0..dp {
        pf.step();
        let lo_row = kt.add(2 * p * bs + a.j0);
        let mut j = 0;
        while j < n {
            let m = lanes(n - j);
            let lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo_row.add(j)));
            let hi = if 2 * p + 1 < d {
                let hi_row = kt.add((2 * p + 1) * bs + a.j0);
                _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                    m,
                    hi_row.add(j),
                )))
            } else {
                _mm512_setzero_si512()
            };
            _mm512_mask_storeu_epi32(packed.add(p * n + j), m, _mm512_or_si512(lo, hi));
            j += 16;
        }
    }
    let s = a.s.as_mut_ptr();
    let mut r = 0;
    while r < a.rows {
        let rb = (a.rows - r).min(8);
        let t = Tile {
            q2: a.q2.as_ptr().add(r * dp),
            dp,
            packed,
            n,
            s: s.add(r * a.lds + a.c0),
            lds: a.lds,
            scale: a.scale,
        };
        match rb {
            8 => qk_rows::<8>(t),
            7 => qk_rows::<7>(t),
            6 => qk_rows::<6>(t),
            5 => qk_rows::<5>(t),
            4 => qk_rows::<4>(t),
            3 => qk_rows::<3>(t),
            2 => qk_rows::<2>(t),
            _ => qk_rows::<1>(t),
        }
        r += rb;
    }
}

/// One row block of a call as raw pointers (bounds proven by `QkBf16Args::check`).
#[derive(Clone, Copy)]
struct Tile {
    q2: *const u32,
    dp: usize,
    packed: *const i32,
    n: usize,
    s: *mut f32,
    lds: usize,
    scale: f32,
}

/// `R` rows against the packed keys, 32 keys per pass as in the f32 kernel.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn qk_rows<const R: usize>(t: Tile) {
    let Tile {
        q2,
        dp,
        packed,
        n,
        s,
        lds,
        scale,
    } = t;
    let sv = _mm512_set1_ps(scale);
    let mut j = 0;
    while j < n {
        let left = n - j;
        let (m0, m1) = (lanes(left), lanes(left.saturating_sub(16)));
        let mut acc0 = [_mm512_setzero_ps(); R];
        let mut acc1 = [_mm512_setzero_ps(); R];
        if left > 16 {
            for p in 0..dp {
                let kp = packed.wrapping_add(p * n + j);
                let k0 = bh(_mm512_maskz_loadu_epi32(m0, kp));
                let k1 = bh(_mm512_maskz_loadu_epi32(m1, kp.wrapping_add(16)));
                for r in 0..R {
                    let qv = bh(_mm512_set1_epi32(*q2.add(r * dp + p) as i32));
                    acc0[r] = _mm512_dpbf16_ps(acc0[r], k0, qv);
                    acc1[r] = _mm512_dpbf16_ps(acc1[r], k1, qv);
                }
            }
        } else {
            // One key vector: alternate accumulators keep two independent chains per row.
            for p in 0..dp {
                let k0 = bh(_mm512_maskz_loadu_epi32(m0, packed.wrapping_add(p * n + j)));
                for r in 0..R {
                    let qv = bh(_mm512_set1_epi32(*q2.add(r * dp + p) as i32));
                    if p % 2 == 0 {
                        acc0[r] = _mm512_dpbf16_ps(acc0[r], k0, qv);
                    } else {
                        acc1[r] = _mm512_dpbf16_ps(acc1[r], k0, qv);
                    }
                }
            }
            for r in 0..R {
                acc0[r] = _mm512_add_ps(acc0[r], acc1[r]);
            }
        }
        for r in 0..R {
            let row = s.add(r * lds + j);
            _mm512_mask_storeu_ps(row, m0, _mm512_mul_ps(acc0[r], sv));
            if left > 16 {
                _mm512_mask_storeu_ps(row.add(16), m1, _mm512_mul_ps(acc1[r], sv));
            }
        }
        j += 32;
    }
}
