//! Runtime SIMD dispatch. Each level provides the same five kernels over plain slices:
//! scores of a row block against the keys of one cache block (`qk`), the weighted sum of
//! values (`pv`), and three row operations for the online softmax. A level is chosen once
//! per call (`Ops::for_level`), and a level's table can only be built on a CPU that has it.

use super::elem::KvElem;
use attn_reference::DType;
use std::fmt;
use std::str::FromStr;

mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512bf16;

/// Ask the CPU to start loading `data` into cache (at most `MAX_PREFETCH_BYTES` of it), so
/// the next cache block streams in while the current one is computed on. Block tables send
/// consecutive blocks anywhere in memory, where the hardware prefetcher cannot follow.
pub fn prefetch<T>(data: &[T]) {
    const MAX_PREFETCH_BYTES: usize = 64 * 1024;
    let bytes = std::mem::size_of_val(data).min(MAX_PREFETCH_BYTES);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = data.as_ptr() as *const i8;
        for off in (0..bytes).step_by(64) {
            // SAFETY: `off < bytes <= size_of_val(data)`, so the address lies inside `data`;
            // a prefetch never faults and changes no state visible to the program.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// An instruction-set level of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Plain Rust, any CPU.
    Scalar,
    /// AVX2 + FMA + F16C, 8 lanes.
    Avx2,
    /// AVX-512 F/BW/VL, 16 lanes, masked tails.
    Avx512,
    /// AVX-512 plus `vdpbf16ps`: bf16 scores of many-row tasks as bf16 pair dot products
    /// (exact products, f32 sums); everything else as `Avx512`.
    Avx512Bf16,
}

impl SimdLevel {
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Avx512Bf16,
    ];

    /// Whether this CPU can run the level.
    pub fn is_available(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => avx2::detected(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => avx512::detected(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Bf16 => avx512bf16::detected(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this CPU can run, slowest first.
    pub fn available() -> Vec<SimdLevel> {
        SimdLevel::ALL
            .into_iter()
            .filter(|l| l.is_available())
            .collect()
    }

    /// The fastest level this CPU can run.
    pub fn best() -> SimdLevel {
        SimdLevel::available()
            .into_iter()
            .max()
            .unwrap_or(SimdLevel::Scalar)
    }

    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Bf16 => "avx512bf16",
        }
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SimdLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SimdLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown SIMD level `{s}` (expected scalar, avx2, avx512 or avx512bf16)")
            })
    }
}

/// `s[r * lds + c0 + j] = sum_i q[r * d + i] * kt[i * bs + j0 + j]` for `r < rows`, `j < n`:
/// scores of `rows` (pre-scaled) query rows against keys `j0..j0 + n` of one block's K^T.
pub struct QkArgs<'a, T> {
    pub q: &'a [f32],
    pub rows: usize,
    pub d: usize,
    pub kt: &'a [T],
    pub bs: usize,
    pub j0: usize,
    pub n: usize,
    pub s: &'a mut [f32],
    pub lds: usize,
    pub c0: usize,
    /// Data the caller reads next (the next cache block): loaded into cache while the
    /// scores are computed, paced over the loop where the level can.
    pub prefetch: &'a [T],
}

impl<T> QkArgs<'_, T> {
    /// The bounds every implementation relies on; a failure is a bug in the caller.
    fn check(&self) {
        assert!(
            self.q.len() >= self.rows * self.d,
            "qk: query tile too short"
        );
        assert!(
            self.kt.len() >= self.d * self.bs && self.j0 + self.n <= self.bs,
            "qk: keys outside the block"
        );
        assert!(
            self.c0 + self.n <= self.lds,
            "qk: columns outside the score row"
        );
        assert!(
            self.rows == 0 || self.s.len() >= (self.rows - 1) * self.lds + self.c0 + self.n,
            "qk: score tile too short"
        );
    }
}

/// `s[r * lds + c0 + j] = scale * sum_i q[r][i] * kt[i * bs + j0 + j]` with the query rows
/// given as bf16 pairs: `q2[r * dp + p]` holds dimension `2p` in its low and `2p + 1` in its
/// high half (0 past `d`), `dp = ceil(d / 2)`.
pub struct QkBf16Args<'a> {
    pub q2: &'a [u32],
    pub rows: usize,
    pub d: usize,
    pub kt: &'a [half::bf16],
    pub bs: usize,
    pub j0: usize,
    pub n: usize,
    pub s: &'a mut [f32],
    pub lds: usize,
    pub c0: usize,
    pub scale: f32,
    pub prefetch: &'a [half::bf16],
}

impl QkBf16Args<'_> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn check(&self) {
        let dp = self.d.div_ceil(2);
        assert!(
            self.q2.len() >= self.rows * dp,
            "qk_bf16: query tile too short"
        );
        assert!(
            self.kt.len() >= self.d * self.bs && self.j0 + self.n <= self.bs,
            "qk_bf16: keys outside the block"
        );
        assert!(
            self.c0 + self.n <= self.lds,
            "qk_bf16: columns outside the score row"
        );
        assert!(
            self.rows == 0 || self.s.len() >= (self.rows - 1) * self.lds + self.c0 + self.n,
            "qk_bf16: score tile too short"
        );
    }
}

/// `o[r * d + i] += sum_j p[r * lds + c0 + j] * v[(j0 + j) * d + i]`: weighted values of keys
/// `j0..j0 + n` of one block's V added to `rows` output rows.
pub struct PvArgs<'a, T> {
    pub p: &'a [f32],
    pub lds: usize,
    pub c0: usize,
    pub rows: usize,
    pub n: usize,
    pub v: &'a [T],
    pub j0: usize,
    pub d: usize,
    pub o: &'a mut [f32],
}

impl<T> PvArgs<'_, T> {
    fn check(&self) {
        assert!(
            self.c0 + self.n <= self.lds,
            "pv: columns outside the weight row"
        );
        assert!(
            self.rows == 0 || self.p.len() >= (self.rows - 1) * self.lds + self.c0 + self.n,
            "pv: weight tile too short"
        );
        assert!(
            self.v.len() >= (self.j0 + self.n) * self.d,
            "pv: values outside the block"
        );
        assert!(
            self.o.len() >= self.rows * self.d,
            "pv: output tile too short"
        );
    }
}

/// The portable `normalize`, for levels without their own.
pub fn normalize_scalar(src: &[f32], a: f32, dtype: DType, dst: &mut [f32]) {
    dst.iter_mut().zip(src).for_each(|(y, &x)| *y = x * a);
    super::rounding::round_to(dtype, dst);
}

/// The kernels of one SIMD level for one element type.
pub struct Ops<T> {
    pub level: SimdLevel,
    pub qk: fn(QkArgs<'_, T>),
    pub pv: fn(PvArgs<'_, T>),
    /// Largest element (`-inf` for an empty or fully masked row).
    pub max: fn(&[f32]) -> f32,
    /// `x = exp(x - m)` in place (masked `-inf` entries become 0); returns the sum.
    pub exp_sum: fn(&mut [f32], f32) -> f32,
    /// `x *= a` in place.
    pub scale: fn(&mut [f32], f32),
    /// `dst = round(src * a)` to the dtype: one finished output row.
    pub normalize: fn(&[f32], f32, DType, &mut [f32]),
    /// Scores from bf16 pairs, where the level has them and the cache is bf16.
    pub qk_bf16: Option<fn(QkBf16Args<'_>)>,
}

impl<T: KvElem> Ops<T> {
    /// The kernels of `level`, or `None` when this CPU cannot run it.
    pub fn for_level(level: SimdLevel) -> Option<Ops<T>> {
        match level {
            SimdLevel::Scalar => Some(scalar::ops()),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => avx2::ops(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => avx512::ops(false),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Bf16 => avx512::ops(avx512bf16::detected()),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// Every level's `normalize` rounds exactly as the portable one (ties, f16 subnormals,
    /// overflow to infinity, the masked tail).
    #[test]
    fn normalize_matches_the_portable_path_bit_for_bit() {
        let mut src: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) * 0.618).sin() * 10f32.powi(i % 11 - 6))
            .collect();
        // Exact bf16 and f16 ties, f16's largest finite value and beyond.
        src.extend([
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            1.0 + 1.0 / 2048.0,
            65504.0,
            65520.0,
        ]);
        src.extend([bf16::from_f32(3.0).to_f32(), -0.0, 6.0e-8, 1.0e-5]);
        for level in SimdLevel::available() {
            let ops = Ops::<bf16>::for_level(level).expect("available level");
            for dtype in DType::ALL {
                for a in [1.0f32, 0.37, 3.0] {
                    let mut want = vec![0.0; src.len()];
                    let mut got = vec![0.0; src.len()];
                    normalize_scalar(&src, a, dtype, &mut want);
                    (ops.normalize)(&src, a, dtype, &mut got);
                    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                        assert_eq!(w.to_bits(), g.to_bits(), "{level} {dtype} x{a}: {}", src[i]);
                    }
                }
            }
        }
    }
}
