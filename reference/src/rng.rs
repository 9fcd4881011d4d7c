//! Deterministic inputs from a seed, identical on every machine and every libtorch.
//!
//! ChaCha8 (`rand_chacha`, whose output stream is value-stable across versions) gives the
//! bits; a Box–Muller transform with `libm`'s pure-Rust `ln`/`sin`/`cos` turns them into
//! standard normals, so no platform math library is involved. Values are then rounded to the
//! case dtype.

use crate::DType;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

pub struct InputRng {
    rng: ChaCha8Rng,
    spare: Option<f64>,
}

impl InputRng {
    pub fn new(seed: u64) -> Self {
        InputRng {
            rng: ChaCha8Rng::seed_from_u64(seed),
            spare: None,
        }
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (n > 0), by rejection so it is unbiased.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.rng.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// A standard normal value.
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        // 1 - u is in (0, 1], so ln never sees 0.
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        let r = libm::sqrt(-2.0 * libm::log(u1));
        let theta = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * libm::sin(theta));
        r * libm::cos(theta)
    }

    /// `n` normal values times `std`, rounded to `dtype`.
    pub fn normal_vec(&mut self, n: usize, std: f64, dtype: DType) -> Vec<f32> {
        (0..n)
            .map(|_| dtype.round((self.normal() * std) as f32))
            .collect()
    }

    /// [`InputRng::normal_vec`], or `None` (the stream left where it was) when `n` values
    /// cannot be allocated: for buffers sized from a case, where an abort is not an answer.
    pub fn try_normal_vec(&mut self, n: usize, std: f64, dtype: DType) -> Option<Vec<f32>> {
        let mut v = Vec::new();
        v.try_reserve_exact(n).ok()?;
        v.extend((0..n).map(|_| dtype.round((self.normal() * std) as f32)));
        Some(v)
    }

    /// A uniformly random permutation of `0..n` (Fisher–Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i as u64 + 1) as usize;
            p.swap(i, j);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let a = InputRng::new(7).normal_vec(64, 1.0, DType::F32);
        let b = InputRng::new(7).normal_vec(64, 1.0, DType::F32);
        let c = InputRng::new(8).normal_vec(64, 1.0, DType::F32);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn the_fallible_stream_is_the_same_stream() {
        let mut a = InputRng::new(3);
        let mut b = InputRng::new(3);
        assert_eq!(
            a.try_normal_vec(33, 2.0, DType::F16),
            Some(b.normal_vec(33, 2.0, DType::F16))
        );
        assert_eq!(a.try_normal_vec(usize::MAX, 1.0, DType::F32), None);
        assert_eq!(a.normal(), b.normal());
    }

    #[test]
    fn stream_is_pinned() {
        // Golden fixtures depend on this exact stream: a change here is a breaking change.
        assert_eq!(
            InputRng::new(0).normal_vec(3, 1.0, DType::Bf16),
            vec![-1.5390625, 0.33398438, 1.4375]
        );
        assert_eq!(
            InputRng::new(42).permutation(10),
            vec![1, 5, 9, 6, 3, 2, 0, 8, 4, 7]
        );
    }

    #[test]
    fn normals_have_unit_moments() {
        let v = InputRng::new(1).normal_vec(100_000, 1.0, DType::F32);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }
}
