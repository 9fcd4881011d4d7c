//! AVX-512 (F, BW, VL) kernels: 16 lanes, masked loads for block and head-size tails, so
//! every block size and head size runs vectorised. bf16 and f16 are widened to f32 on load
//! (a shift for bf16, `vcvtph2ps` for f16, through f16 for fp8); all arithmetic is f32.

// Register tiles are indexed by row and vector in lockstep; index loops say that best.
#![allow(clippy::needless_range_loop)]

use super::{Ops, PvArgs, QkArgs, SimdLevel};
use crate::cpu::elem::{ElemKind, KvElem};
use attn_reference::DType;
use std::arch::x86_64::*;

pub fn detected() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

/// The table is only handed out on a CPU with the features, which is what makes the safe
/// wrappers below sound.
/// With `bf16_dot` (a CPU with avx512bf16), bf16 caches also get the pair-dot score kernel.
pub fn ops<T: KvElem>(bf16_dot: bool) -> Option<Ops<T>> {
    let bf16_dot = bf16_dot && T::KIND == ElemKind::Bf16;
    detected().then_some(Ops {
        level: if bf16_dot {
            SimdLevel::Avx512Bf16
        } else {
            SimdLevel::Avx512
        },
        qk: qk::<T>,
        pv: pv::<T>,
        max,
        exp_sum,
        scale,
        normalize,
        qk_bf16: if bf16_dot {
            Some(super::avx512bf16::qk)
        } else {
            None
        },
    })
}

/// Lanes `0..k` set (all 16 for `k >= 16`).
#[inline(always)]
pub(super) fn lanes(k: usize) -> __mmask16 {
    if k >= 16 {
        0xffff
    } else {
        ((1u32 << k) - 1) as __mmask16
    }
}

/// Load up to 16 elements (lanes outside `m` are neither read nor returned) as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load<T: KvElem>(p: *const T, m: __mmask16) -> __m512 {
    match T::KIND {
        ElemKind::F32 => _mm512_maskz_loadu_ps(m, p as *const f32),
        ElemKind::Bf16 => {
            let h = _mm256_maskz_loadu_epi16(m, p as *const i16);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
        ElemKind::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16)),
        ElemKind::Fp8E5m2 => {
            let b = _mm_maskz_loadu_epi8(m, p as *const i8);
            _mm512_cvtph_ps(_mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(b)))
        }
        ElemKind::Fp8E4m3 => {
            // See `cpu::fp8`: sign-extend, shift into f16 bits, clear the copied sign bit.
            let b = _mm_maskz_loadu_epi8(m, p as *const i8);
            let h = _mm256_and_si256(
                _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(b)),
                _mm256_set1_epi16(0xbfff_u16 as i16),
            );
            _mm512_cvtph_ps(h)
        }
    }
}

fn qk<T: KvElem>(a: QkArgs<'_, T>) {
    a.check();
    // SAFETY: reachable only through `ops`, which checked the CPU features; `check` proved
    // that every row, key and score column touched below lies inside the slices.
    unsafe { qk_impl(a) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn qk_impl<T: KvElem>(a: QkArgs<'_, T>) {
    let s = a.s.as_mut_ptr();
    // Spread the prefetch over the first row block's loop over `d`: a few lines per step
    // keep the memory system busy without flooding its miss buffers.
    let mut pf = Prefetch::new(a.prefetch, a.d);
    let mut r = 0;
    while r < a.rows {
        let rb = (a.rows - r).min(8);
        let t = Tile {
            q: a.q.as_ptr().add(r * a.d),
            d: a.d,
            kt: a.kt.as_ptr().wrapping_add(a.j0),
            bs: a.bs,
            n: a.n,
            s: s.add(r * a.lds + a.c0),
            lds: a.lds,
        };
        match rb {
            8 => qk_rows::<T, 8>(t, &mut pf),
            7 => qk_rows::<T, 7>(t, &mut pf),
            6 => qk_rows::<T, 6>(t, &mut pf),
            5 => qk_rows::<T, 5>(t, &mut pf),
            4 => qk_rows::<T, 4>(t, &mut pf),
            3 => qk_rows::<T, 3>(t, &mut pf),
            2 => qk_rows::<T, 2>(t, &mut pf),
            _ => qk_rows::<T, 1>(t, &mut pf),
        }
        r += rb;
    }
}

/// One row block of a `qk` call as raw pointers (bounds proven by `QkArgs::check`).
#[derive(Clone, Copy)]
struct Tile<T> {
    q: *const f32,
    d: usize,
    kt: *const T,
    bs: usize,
    n: usize,
    s: *mut f32,
    lds: usize,
}

/// `R` query rows against `n` keys, 32 keys (two vectors) per pass: `2R` independent
/// accumulators keep both FMA pipes busy while each K^T vector is loaded once for all rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn qk_rows<T: KvElem, const R: usize>(t: Tile<T>, pf: &mut Prefetch) {
    let Tile {
        q,
        d,
        kt,
        bs,
        n,
        s,
        lds,
    } = t;
    let mut j = 0;
    while j < n {
        let left = n - j;
        let (m0, m1) = (lanes(left), lanes(left.saturating_sub(16)));
        let mut acc0 = [_mm512_setzero_ps(); R];
        let mut acc1 = [_mm512_setzero_ps(); R];
        if left > 16 {
            for i in 0..d {
                pf.step();
                let kp = kt.wrapping_add(i * bs + j);
                let k0 = load(kp, m0);
                let k1 = load(kp.wrapping_add(16), m1);
                for r in 0..R {
                    let qv = _mm512_set1_ps(*q.add(r * d + i));
                    acc0[r] = _mm512_fmadd_ps(qv, k0, acc0[r]);
                    acc1[r] = _mm512_fmadd_ps(qv, k1, acc1[r]);
                }
            }
        } else {
            // One key vector: even and odd dimensions go to separate accumulators, so each
            // row still has two independent FMA chains (block size 16 and tails).
            let mut i = 0;
            while i + 1 < d {
                pf.step();
                pf.step();
                let k0 = load(kt.wrapping_add(i * bs + j), m0);
                let k1 = load(kt.wrapping_add((i + 1) * bs + j), m0);
                for r in 0..R {
                    acc0[r] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * d + i)), k0, acc0[r]);
                    acc1[r] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * d + i + 1)), k1, acc1[r]);
                }
                i += 2;
            }
            if i < d {
                let k0 = load(kt.wrapping_add(i * bs + j), m0);
                for r in 0..R {
                    acc0[r] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(r * d + i)), k0, acc0[r]);
                }
            }
            for r in 0..R {
                acc0[r] = _mm512_add_ps(acc0[r], acc1[r]);
            }
        }
        for r in 0..R {
            let row = s.add(r * lds + j);
            _mm512_mask_storeu_ps(row, m0, acc0[r]);
            if left > 16 {
                _mm512_mask_storeu_ps(row.add(16), m1, acc1[r]);
            }
        }
        j += 32;
    }
}

/// Cache lines of a region to prefetch, a fixed number per loop step.
#[derive(Clone, Copy)]
pub(super) struct Prefetch {
    next: *const i8,
    end: *const i8,
    per_step: usize,
}

impl Prefetch {
    pub(super) fn new<T>(data: &[T], steps: usize) -> Prefetch {
        let bytes = std::mem::size_of_val(data);
        let lines = bytes.div_ceil(64);
        let next = data.as_ptr() as *const i8;
        Prefetch {
            next,
            end: next.wrapping_add(bytes),
            per_step: lines.div_ceil(steps.max(1)),
        }
    }

    #[inline(always)]
    pub(super) fn step(&mut self) {
        for _ in 0..self.per_step {
            if self.next >= self.end {
                return;
            }
            // SAFETY: `next` lies inside the slice given to `new` (checked against `end`
            // just above); a prefetch never faults and changes no visible state.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.next) };
            self.next = self.next.wrapping_add(64);
        }
    }
}

fn pv<T: KvElem>(a: PvArgs<'_, T>) {
    a.check();
    // SAFETY: as for `qk`: features checked by `ops`, bounds by `check`.
    unsafe { pv_impl(a) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_impl<T: KvElem>(a: PvArgs<'_, T>) {
    let v = a.v.as_ptr().wrapping_add(a.j0 * a.d);
    let o = a.o.as_mut_ptr();
    let mut r = 0;
    while r < a.rows {
        let rb = (a.rows - r).min(4);
        let p = a.p.as_ptr().add(r * a.lds + a.c0);
        let o = o.add(r * a.d);
        match rb {
            4 => pv_rows::<T, 4>(p, a.lds, a.n, v, a.d, o),
            3 => pv_rows::<T, 3>(p, a.lds, a.n, v, a.d, o),
            2 => pv_rows::<T, 2>(p, a.lds, a.n, v, a.d, o),
            _ => pv_rows::<T, 1>(p, a.lds, a.n, v, a.d, o),
        }
        r += rb;
    }
}

/// `R` output rows, 64 columns (four vectors) at a time, then 16 at a time for the rest.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_rows<T: KvElem, const R: usize>(
    p: *const f32,
    lds: usize,
    n: usize,
    v: *const T,
    d: usize,
    o: *mut f32,
) {
    let mut i = 0;
    while d - i >= 64 {
        pv_cols::<T, R, 4>(p, lds, n, v.wrapping_add(i), d, o.add(i), [0xffff; 4]);
        i += 64;
    }
    while i < d {
        pv_cols::<T, R, 1>(p, lds, n, v.wrapping_add(i), d, o.add(i), [lanes(d - i)]);
        i += 16;
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pv_cols<T: KvElem, const R: usize, const NV: usize>(
    p: *const f32,
    lds: usize,
    n: usize,
    v: *const T,
    d: usize,
    o: *mut f32,
    m: [__mmask16; NV],
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for r in 0..R {
        for t in 0..NV {
            acc[r][t] = _mm512_maskz_loadu_ps(m[t], o.wrapping_add(r * d + 16 * t));
        }
    }
    for j in 0..n {
        let vp = v.wrapping_add(j * d);
        let mut vv = [_mm512_setzero_ps(); NV];
        for t in 0..NV {
            vv[t] = load(vp.wrapping_add(16 * t), m[t]);
        }
        for r in 0..R {
            let w = _mm512_set1_ps(*p.add(r * lds + j));
            for t in 0..NV {
                acc[r][t] = _mm512_fmadd_ps(w, vv[t], acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..NV {
            _mm512_mask_storeu_ps(o.wrapping_add(r * d + 16 * t), m[t], acc[r][t]);
        }
    }
}

/// `exp(x)` to about 1 ulp (Cephes' polynomial); inputs below -104 (and `-inf`) give 0.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-104.0)),
        _mm512_set1_ps(88.7),
    );
    let n =
        _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_2e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
    let y = _mm512_fmadd_ps(
        _mm512_mul_ps(p, r),
        r,
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_scalef_ps(y, n)
}

fn max(x: &[f32]) -> f32 {
    // SAFETY: features checked by `ops`; each masked load stays inside `x`.
    unsafe { max_impl(x) }
}

#[target_feature(enable = "avx512f")]
unsafe fn max_impl(x: &[f32]) -> f32 {
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < x.len() {
        let k = lanes(x.len() - i);
        m = _mm512_max_ps(
            m,
            _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), k, x.as_ptr().add(i)),
        );
        i += 16;
    }
    _mm512_reduce_max_ps(m)
}

fn exp_sum(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: features checked by `ops`; each masked load and store stays inside `x`.
    unsafe { exp_sum_impl(x, m) }
}

#[target_feature(enable = "avx512f")]
unsafe fn exp_sum_impl(x: &mut [f32], m: f32) -> f32 {
    let mv = _mm512_set1_ps(m);
    let mut sum = _mm512_setzero_ps();
    let mut i = 0;
    while i < x.len() {
        let k = lanes(x.len() - i);
        let p = x.as_mut_ptr().add(i);
        let e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p), mv));
        _mm512_mask_storeu_ps(p, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
        i += 16;
    }
    _mm512_reduce_add_ps(sum)
}

fn scale(x: &mut [f32], a: f32) {
    let p = x.as_mut_ptr();
    // SAFETY: features checked by `ops`; `normalize_impl` reads each vector before it writes
    // it back, so source and destination may be the same row; masked loads and stores stay
    // inside `x`.
    unsafe { normalize_impl(p, a, DType::F32, p, x.len()) }
}

fn normalize(src: &[f32], a: f32, dtype: DType, dst: &mut [f32]) {
    assert!(src.len() >= dst.len(), "normalize: source row too short");
    // SAFETY: features checked by `ops`; masked loads stay inside `src` (at least as long as
    // `dst`), masked stores inside `dst`.
    unsafe { normalize_impl(src.as_ptr(), a, dtype, dst.as_mut_ptr(), dst.len()) }
}

/// `dst[..n] = round(src[..n] * a)`. bf16: add 0x7fff plus the kept lsb, then keep the top
/// 16 bits (inputs are finite); f16: through the hardware conversion, to nearest even.
/// `dst` may be `src` (`scale`).
#[target_feature(enable = "avx512f")]
unsafe fn normalize_impl(src: *const f32, a: f32, dtype: DType, dst: *mut f32, n: usize) {
    let av = _mm512_set1_ps(a);
    let (bias, one, top) = (
        _mm512_set1_epi32(0x7fff),
        _mm512_set1_epi32(1),
        _mm512_set1_epi32(0xffff_0000u32 as i32),
    );
    let mut i = 0;
    while i < n {
        let k = lanes(n - i);
        let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src.add(i)), av);
        let r = match dtype {
            DType::F32 => v,
            DType::Bf16 => {
                let b = _mm512_castps_si512(v);
                let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), one);
                let up = _mm512_add_epi32(b, _mm512_add_epi32(bias, lsb));
                _mm512_castsi512_ps(_mm512_and_si512(up, top))
            }
            DType::F16 => _mm512_cvtph_ps(_mm512_cvtps_ph::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(v)),
        };
        _mm512_mask_storeu_ps(dst.add(i), k, r);
        i += 16;
    }
}
