//! Rounding f32 values to the case's dtype, as the kernel's output and its bf16 query pairs
//! need it (shared by the portable kernel and the SIMD paths).

use attn_reference::DType;
use half::{f16, slice::HalfFloatSliceExt};

/// The bf16 nearest to `v` (ties to even), as its 16 bits: bf16 keeps the top 16 bits of
/// an f32, and adding 0x7fff plus the kept lsb first rounds. Inputs are finite (validation
/// rejects NaN), so no NaN payload can be disturbed.
#[inline(always)]
pub fn bf16_bits(v: f32) -> u32 {
    let b = v.to_bits();
    b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16
}

/// Round every value to the nearest value of `dtype` (ties to even), in place.
pub fn round_to(dtype: DType, x: &mut [f32]) {
    match dtype {
        DType::F32 => {}
        DType::Bf16 => x
            .iter_mut()
            .for_each(|v| *v = f32::from_bits(bf16_bits(*v) << 16)),
        DType::F16 => {
            let mut buf = [f16::ZERO; 64];
            for chunk in x.chunks_mut(64) {
                let h = &mut buf[..chunk.len()];
                h.convert_from_f32_slice(chunk);
                h.convert_to_f32_slice(chunk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_the_dtype() {
        let xs: Vec<f32> = (0..2000)
            .map(|i| ((i as f32) * 0.37).sin() * 10f32.powi(i % 7 - 3))
            .chain([0.0, -0.0, 65504.0, 1e-8])
            .collect();
        for dtype in DType::ALL {
            let mut ours = xs.clone();
            round_to(dtype, &mut ours);
            for (&x, &y) in xs.iter().zip(&ours) {
                assert_eq!(y.to_bits(), dtype.round(x).to_bits(), "{dtype} {x}");
            }
        }
    }
}
