//! The CPU backend's FP8 elements: the cache stores the code bytes, written by a bit-level
//! quantizer (round to nearest even, saturating, as vLLM's conversions) and widened to f32
//! through f16, which every SIMD level converts in hardware:
//! - E5M2 is the top byte of the f16 with the same value: a shift.
//! - E4M3FN `S.EEEE.MMM` becomes the f16 `S.0EEEE.MMM0000000`, whose value is the E4M3 value
//!   times 2^-8 (biases 7 and 15), subnormals included. The kernels read that (`READ_SCALE`):
//!   the ×256 that restores the value is folded into the query's scale and the values'.
//!
//! The cache never holds a NaN code (inputs are finite and writes saturate), so the reader
//! spends no instruction on it: E4M3's NaN code `0x7f` would read as 480.

use super::elem::{ElemKind, KvElem};

/// One E4M3FN code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct E4m3(pub u8);

/// One E5M2 code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct E5m2(pub u8);

/// The f16 bits of an E4M3 code, worth the code's value times 2^-8.
#[inline(always)]
pub fn e4m3_as_f16_bits(code: u8) -> u16 {
    (((code as i8 as i16) << 7) as u16) & 0xbfff
}

/// `x` to the nearest code of a format with `mbits` mantissa bits, exponent `bias`, largest
/// finite code `max_code` (ties to even, saturating; NaN to `0x7f`).
fn encode(x: f32, mbits: u32, bias: i32, max_code: u8) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    let min_normal = f32::from_bits(((1 - bias + 127) as u32) << 23);
    if a < min_normal {
        // Subnormal codes are multiples of min_normal * 2^-mbits; scaling by a power of two
        // is exact, so rounding the quotient rounds the value.
        let quanta = a * f32::from_bits(((127 + bias - 1 + mbits as i32) as u32) << 23);
        return sign | quanta.round_ties_even() as u8;
    }
    let bits = a.to_bits();
    let exp = (bits >> 23) as i32 - 127 + bias;
    if exp > (max_code >> mbits) as i32 {
        return sign | max_code;
    }
    let drop = 23 - mbits;
    let mut code = ((exp as u32) << mbits) | ((bits & 0x7f_ffff) >> drop);
    let rest = bits & ((1 << drop) - 1);
    let half = 1 << (drop - 1);
    if rest > half || (rest == half && code & 1 == 1) {
        code += 1;
    }
    sign | code.min(max_code as u32) as u8
}

impl KvElem for E4m3 {
    const KIND: ElemKind = ElemKind::Fp8E4m3;
    const READ_SCALE: f32 = 256.0;
    #[inline]
    fn from_f32(x: f32) -> Self {
        E4m3(encode(x, 3, 7, 0x7e))
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self.read() * Self::READ_SCALE
    }
    #[inline(always)]
    fn read(self) -> f32 {
        half::f16::from_bits(e4m3_as_f16_bits(self.0)).to_f32()
    }
}

impl KvElem for E5m2 {
    const KIND: ElemKind = ElemKind::Fp8E5m2;
    #[inline]
    fn from_f32(x: f32) -> Self {
        E5m2(encode(x, 2, 15, 0x7b))
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::from_bits((self.0 as u16) << 8).to_f32()
    }
}

/// A zeroed vector of codes, as one zeroed allocation (pages no write touches cost nothing,
/// as for the other dtypes); `None` when the allocator refuses it.
pub fn zeroed<T: Fp8Code>(len: usize) -> Option<Vec<T>> {
    let mut bytes = std::mem::ManuallyDrop::new(super::layout::try_zeroed::<u8>(len)?);
    // SAFETY: `T` is a `repr(transparent)` wrapper of `u8` (the `Fp8Code` contract): same
    // size, alignment and validity, so the allocation, length and capacity carry over.
    Some(unsafe {
        Vec::from_raw_parts(
            bytes.as_mut_ptr().cast::<T>(),
            bytes.len(),
            bytes.capacity(),
        )
    })
}

/// # Safety
/// Implemented only by `repr(transparent)` wrappers of `u8` for which every byte is valid.
pub unsafe trait Fp8Code: Copy {}
// SAFETY: both are `repr(transparent)` over `u8`.
unsafe impl Fp8Code for E4m3 {}
// SAFETY: as above.
unsafe impl Fp8Code for E5m2 {}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::Fp8Format;

    /// f32 values around every code: each code, the midpoints between neighbours (ties) and
    /// values just off them, far beyond the range, and a sweep of bit patterns.
    fn probes(format: Fp8Format) -> Vec<f32> {
        let mut xs = Vec::new();
        let finite: Vec<f64> = (0u8..0x80)
            .map(|c| format.decode(c))
            .filter(|v| v.is_finite())
            .collect();
        for w in finite.windows(2) {
            let mid = ((w[0] + w[1]) / 2.0) as f32;
            xs.extend([w[0] as f32, mid, f32::from_bits(mid.to_bits() + 1)]);
            if mid > 0.0 {
                xs.push(f32::from_bits(mid.to_bits() - 1));
            }
        }
        xs.extend([
            0.0,
            1e-30,
            1e-8,
            460.0,
            464.0,
            470.0,
            1e5,
            6e4,
            1e30,
            f32::MAX,
        ]);
        xs.extend([f32::INFINITY, f32::MIN_POSITIVE, f32::from_bits(1)]);
        xs.extend(
            (0..u32::MAX / 104_729)
                .map(|i| f32::from_bits(i * 104_729))
                .filter(|x| x.is_finite()),
        );
        let negated: Vec<f32> = xs.iter().map(|x| -x).collect();
        xs.extend(negated);
        xs
    }

    #[test]
    fn the_quantizer_matches_the_reference_one() {
        for (format, encode) in [
            (Fp8Format::E4m3, (|x| E4m3::from_f32(x).0) as fn(f32) -> u8),
            (Fp8Format::E5m2, |x| E5m2::from_f32(x).0),
        ] {
            for x in probes(format) {
                assert_eq!(encode(x), format.encode(x as f64), "{format} {x:e}");
            }
            assert_eq!(encode(f32::NAN), format.encode(f64::NAN));
        }
    }

    #[test]
    fn codes_widen_to_their_values() {
        for c in 0..=255u8 {
            let want = Fp8Format::E4m3.decode(c);
            if !want.is_nan() {
                assert_eq!(E4m3(c).to_f32() as f64, want, "e4m3 {c:#x}");
            }
            let want = Fp8Format::E5m2.decode(c);
            let got = E5m2(c).to_f32() as f64;
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "e5m2 {c:#x}"
            );
        }
    }
}
