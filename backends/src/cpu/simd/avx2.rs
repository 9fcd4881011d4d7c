//! AVX2 + FMA + F16C kernels: 8 lanes. AVX2 has no masked 16-bit loads, so keys and columns
//! that do not fill a vector are finished with scalar code.

// Register tiles are indexed by row and vector in lockstep; index loops say that best.
#![allow(clippy::needless_range_loop)]

use super::{scalar, Ops, PvArgs, QkArgs, SimdLevel};
use crate::cpu::elem::{ElemKind, KvElem};
use std::arch::x86_64::*;

pub fn detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The table is only handed out on a CPU with the features, which is what makes the safe
/// wrappers below sound.
pub fn ops<T: KvElem>() -> Option<Ops<T>> {
    detected().then_some(Ops {
        level: SimdLevel::Avx2,
        qk: qk::<T>,
        pv: pv::<T>,
        max,
        exp_sum,
        scale,
        normalize: super::normalize_scalar,
        qk_bf16: None,
    })
}

/// Load 8 elements as f32, as the kernels read them (`KvElem::read`; 8 bytes for fp8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load<T: KvElem>(p: *const T) -> __m256 {
    match T::KIND {
        ElemKind::F32 => _mm256_loadu_ps(p as *const f32),
        ElemKind::Bf16 => {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
        ElemKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        ElemKind::Fp8E5m2 => {
            let b = _mm_loadl_epi64(p as *const __m128i);
            _mm256_cvtph_ps(_mm_slli_epi16::<8>(_mm_cvtepu8_epi16(b)))
        }
        ElemKind::Fp8E4m3 => {
            // See `cpu::fp8`: sign-extend, shift into f16 bits, clear the copied sign bit.
            let b = _mm_loadl_epi64(p as *const __m128i);
            let h = _mm_and_si128(
                _mm_slli_epi16::<7>(_mm_cvtepi8_epi16(b)),
                _mm_set1_epi16(0xbfff_u16 as i16),
            );
            _mm256_cvtph_ps(h)
        }
    }
}

/// Load 16 elements as two vectors of f32: FP8 codes are widened to f16 bits 16 at a time
/// (one load, one widening, one shift), then converted in two halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load16<T: KvElem>(p: *const T) -> (__m256, __m256) {
    let halves = |h: __m256i| {
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
        )
    };
    match T::KIND {
        ElemKind::Fp8E5m2 => {
            let b = _mm_loadu_si128(p as *const __m128i);
            halves(_mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(b)))
        }
        ElemKind::Fp8E4m3 => {
            let b = _mm_loadu_si128(p as *const __m128i);
            halves(_mm256_and_si256(
                _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(b)),
                _mm256_set1_epi16(0xbfff_u16 as i16),
            ))
        }
        ElemKind::F32 | ElemKind::Bf16 | ElemKind::F16 => (load(p), load(p.add(8))),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

fn qk<T: KvElem>(mut a: QkArgs<'_, T>) {
    a.check();
    super::prefetch(a.prefetch);
    // SAFETY: reachable only through `ops`, which checked the CPU features; `check` proved
    // that every row, key and score column touched below lies inside the slices, and only
    // whole vectors of keys `< n` are loaded.
    unsafe { qk_impl(&mut a) };
    // Keys that do not fill a vector.
    let done = a.n - a.n % 8;
    if done < a.n {
        scalar_qk_tail(a, done);
    }
}

fn scalar_qk_tail<T: KvElem>(a: QkArgs<'_, T>, done: usize) {
    (scalar::ops::<T>().qk)(QkArgs {
        prefetch: &[],
        j0: a.j0 + done,
        n: a.n - done,
        c0: a.c0 + done,
        ..a
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_impl<T: KvElem>(a: &mut QkArgs<'_, T>) {
    let kt = a.kt.as_ptr().add(a.j0);
    let s = a.s.as_mut_ptr();
    let mut r = 0;
    while r < a.rows {
        let rb = (a.rows - r).min(4);
        let q = a.q.as_ptr().add(r * a.d);
        let s = s.add(r * a.lds + a.c0);
        match rb {
            4 => qk_rows::<T, 4>(q, a.d, kt, a.bs, a.n, s, a.lds),
            3 => qk_rows::<T, 3>(q, a.d, kt, a.bs, a.n, s, a.lds),
            2 => qk_rows::<T, 2>(q, a.d, kt, a.bs, a.n, s, a.lds),
            _ => qk_rows::<T, 1>(q, a.d, kt, a.bs, a.n, s, a.lds),
        }
        r += rb;
    }
}

/// `R` rows against the keys `0..n - n % 8`: 16 keys per pass, then 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qk_rows<T: KvElem, const R: usize>(
    q: *const f32,
    d: usize,
    kt: *const T,
    bs: usize,
    n: usize,
    s: *mut f32,
    lds: usize,
) {
    let mut j = 0;
    while n - j >= 16 {
        let mut acc0 = [_mm256_setzero_ps(); R];
        let mut acc1 = [_mm256_setzero_ps(); R];
        for i in 0..d {
            let (k0, k1) = load16(kt.add(i * bs + j));
            for r in 0..R {
                let qv = _mm256_broadcast_ss(&*q.add(r * d + i));
                acc0[r] = _mm256_fmadd_ps(qv, k0, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(qv, k1, acc1[r]);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(s.add(r * lds + j), acc0[r]);
            _mm256_storeu_ps(s.add(r * lds + j + 8), acc1[r]);
        }
        j += 16;
    }
    if n - j >= 8 {
        let mut acc = [_mm256_setzero_ps(); R];
        for i in 0..d {
            let k0 = load(kt.add(i * bs + j));
            for r in 0..R {
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&*q.add(r * d + i)), k0, acc[r]);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(s.add(r * lds + j), acc[r]);
        }
    }
}

fn pv<T: KvElem>(mut a: PvArgs<'_, T>) {
    a.check();
    // SAFETY: as for `qk`: features checked by `ops`, bounds by `check`; only whole vectors
    // of columns `< d` are loaded and stored.
    unsafe { pv_impl(&mut a) };
    let done = a.d - a.d % 8;
    if done < a.d {
        for r in 0..a.rows {
            for j in 0..a.n {
                let w = a.p[r * a.lds + a.c0 + j];
                let v = &a.v[(a.j0 + j) * a.d..(a.j0 + j + 1) * a.d];
                for i in done..a.d {
                    a.o[r * a.d + i] += w * v[i].read();
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_impl<T: KvElem>(a: &mut PvArgs<'_, T>) {
    let v = a.v.as_ptr().add(a.j0 * a.d);
    let o = a.o.as_mut_ptr();
    let mut r = 0;
    while r < a.rows {
        let rb = (a.rows - r).min(2);
        let p = a.p.as_ptr().add(r * a.lds + a.c0);
        let o = o.add(r * a.d);
        let mut i = 0;
        while a.d - i >= 32 {
            if rb == 2 {
                pv_cols::<T, 2, 4>(p, a.lds, a.n, v.add(i), a.d, o.add(i));
            } else {
                pv_cols::<T, 1, 4>(p, a.lds, a.n, v.add(i), a.d, o.add(i));
            }
            i += 32;
        }
        while a.d - i >= 8 {
            if rb == 2 {
                pv_cols::<T, 2, 1>(p, a.lds, a.n, v.add(i), a.d, o.add(i));
            } else {
                pv_cols::<T, 1, 1>(p, a.lds, a.n, v.add(i), a.d, o.add(i));
            }
            i += 8;
        }
        r += rb;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_cols<T: KvElem, const R: usize, const NV: usize>(
    p: *const f32,
    lds: usize,
    n: usize,
    v: *const T,
    d: usize,
    o: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    for r in 0..R {
        for t in 0..NV {
            acc[r][t] = _mm256_loadu_ps(o.add(r * d + 8 * t));
        }
    }
    for j in 0..n {
        let vp = v.add(j * d);
        let mut vv = [_mm256_setzero_ps(); NV];
        let mut t = 0;
        while t + 2 <= NV {
            (vv[t], vv[t + 1]) = load16(vp.add(8 * t));
            t += 2;
        }
        if t < NV {
            vv[t] = load(vp.add(8 * t));
        }
        for r in 0..R {
            let w = _mm256_broadcast_ss(&*p.add(r * lds + j));
            for t in 0..NV {
                acc[r][t] = _mm256_fmadd_ps(w, vv[t], acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..NV {
            _mm256_storeu_ps(o.add(r * d + 8 * t), acc[r][t]);
        }
    }
}

/// `exp(x)` to about 1 ulp (Cephes' polynomial); inputs below -87.3 (and `-inf`) give 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp(x: __m256) -> __m256 {
    let live = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(-87.3));
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.3),
    );
    let n = _mm256_round_ps::<0x08>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_2e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    let y = _mm256_fmadd_ps(
        _mm256_mul_ps(p, r),
        r,
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_and_ps(_mm256_mul_ps(y, pow2), live)
}

fn max(x: &[f32]) -> f32 {
    // SAFETY: features checked by `ops`; only whole vectors inside `x` are loaded.
    let (mut m, done) = unsafe { max_impl(x) };
    for &v in &x[done..] {
        m = m.max(v);
    }
    m
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn max_impl(x: &[f32]) -> (f32, usize) {
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while x.len() - i >= 8 {
        m = _mm256_max_ps(m, _mm256_loadu_ps(x.as_ptr().add(i)));
        i += 8;
    }
    (hmax(m), i)
}

fn exp_sum(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: features checked by `ops`; only whole vectors inside `x` are touched.
    let (mut sum, done) = unsafe { exp_sum_impl(x, m) };
    sum += scalar::exp_sum(&mut x[done..], m);
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_sum_impl(x: &mut [f32], m: f32) -> (f32, usize) {
    let mv = _mm256_set1_ps(m);
    let mut sum = _mm256_setzero_ps();
    let mut i = 0;
    while x.len() - i >= 8 {
        let p = x.as_mut_ptr().add(i);
        let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
        _mm256_storeu_ps(p, e);
        sum = _mm256_add_ps(sum, e);
        i += 8;
    }
    (hsum(sum), i)
}

fn scale(x: &mut [f32], a: f32) {
    // SAFETY: features checked by `ops`; only whole vectors inside `x` are touched.
    let done = unsafe { scale_impl(x, a) };
    scalar::scale(&mut x[done..], a);
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_impl(x: &mut [f32], a: f32) -> usize {
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while x.len() - i >= 8 {
        let p = x.as_mut_ptr().add(i);
        _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), av));
        i += 8;
    }
    i
}
