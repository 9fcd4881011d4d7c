//! Scores with `vdpbf16ps`: each instruction multiplies 16 keys by two query dimensions
//! (exact bf16 products, f32 sums), half the FMAs of widening bf16 to f32 first and no
//! widening at all. The cache keeps K^T one dimension per row; rows `2p` and `2p + 1` are
//! interleaved into (dimension 2p, 2p + 1) pairs in registers, as they are loaded.

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
    // and BF16; `check` proved every query pair, key and score column touched below lies
    // inside its slice.
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
    let dp = a.d.div_ceil(2);
    // One prefetch step per dimension pair, spread over the first row block.
    let mut pf = Prefetch::new(a.prefetch, dp);
    let s = a.s.as_mut_ptr();
    let mut r = 0;
    while r < a.rows {
        let rb = (a.rows - r).min(8);
        let t = Tile {
            q2: a.q2.as_ptr().add(r * dp),
            d: a.d,
            kt: (a.kt.as_ptr() as *const i16).wrapping_add(a.j0),
            bs: a.bs,
            n: a.n,
            s: s.add(r * a.lds + a.c0),
            lds: a.lds,
            scale: a.scale,
        };
        match rb {
            8 => qk_rows::<8>(t, &mut pf),
            7 => qk_rows::<7>(t, &mut pf),
            6 => qk_rows::<6>(t, &mut pf),
            5 => qk_rows::<5>(t, &mut pf),
            4 => qk_rows::<4>(t, &mut pf),
            3 => qk_rows::<3>(t, &mut pf),
            2 => qk_rows::<2>(t, &mut pf),
            _ => qk_rows::<1>(t, &mut pf),
        }
        r += rb;
    }
}

/// One row block of a call as raw pointers (bounds proven by `QkBf16Args::check`).
#[derive(Clone, Copy)]
struct Tile {
    q2: *const u32,
    d: usize,
    /// K^T of the block, already offset to key `j0`; row `i` starts at `kt + i * bs`.
    kt: *const i16,
    bs: usize,
    n: usize,
    s: *mut f32,
    lds: usize,
    scale: f32,
}

/// `R` rows, 32 keys per pass as in the f32 kernel. `vpunpck{l,h}wd` pair the keys of rows
/// `2p` and `2p + 1` within each 128-bit lane, so the two accumulators hold keys in the
/// order (0-3, 8-11, ..) and (4-7, 12-15, ..); one `vpermt2ps` per 16 scores restores key
/// order before the store.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn qk_rows<const R: usize>(t: Tile, pf: &mut Prefetch) {
    let Tile {
        q2,
        d,
        kt,
        bs,
        n,
        s,
        lds,
        scale,
    } = t;
    let dp = d.div_ceil(2);
    let sv = _mm512_set1_ps(scale);
    let first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    let second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    let mut j = 0;
    while j < n {
        let left = n - j;
        let (m0, m1) = (lanes(left), lanes(left.saturating_sub(16)));
        let mut acc0 = [_mm512_setzero_ps(); R];
        let mut acc1 = [_mm512_setzero_ps(); R];
        if left > 16 {
            let m = if left >= 32 {
                u32::MAX
            } else {
                (1u32 << left) - 1
            };
            for p in 0..dp {
                pf.step();
                let lo = _mm512_maskz_loadu_epi16(m, kt.wrapping_add(2 * p * bs + j));
                let hi = if 2 * p + 1 < d {
                    _mm512_maskz_loadu_epi16(m, kt.wrapping_add((2 * p + 1) * bs + j))
                } else {
                    _mm512_setzero_si512()
                };
                let k0 = bh(_mm512_unpacklo_epi16(lo, hi));
                let k1 = bh(_mm512_unpackhi_epi16(lo, hi));
                for r in 0..R {
                    let qv = bh(_mm512_set1_epi32(*q2.add(r * dp + p) as i32));
                    acc0[r] = _mm512_dpbf16_ps(acc0[r], k0, qv);
                    acc1[r] = _mm512_dpbf16_ps(acc1[r], k1, qv);
                }
            }
            for r in 0..R {
                let (a0, a1) = (acc0[r], acc1[r]);
                acc0[r] = _mm512_permutex2var_ps(a0, first, a1);
                acc1[r] = _mm512_permutex2var_ps(a0, second, a1);
            }
        } else {
            // 16 keys or fewer: widen both rows to 32 bits and merge; alternate
            // accumulators keep two independent chains per row.
            for p in 0..dp {
                pf.step();
                let lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                    m0,
                    kt.wrapping_add(2 * p * bs + j),
                ));
                let pair = if 2 * p + 1 < d {
                    let hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                        m0,
                        kt.wrapping_add((2 * p + 1) * bs + j),
                    ));
                    _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi))
                } else {
                    lo
                };
                let k0 = bh(pair);
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
