//! How close a backend's output must be to the oracle's: a tolerance chosen per dtype.
//!
//! An element passes: `|actual - expected| <= atol`, or
//! `<= rtol * max(|actual|, |expected|)` (an absolute floor near zero, relative above). Every real
//! row is compared; NaN or Inf anywhere in a real row is a divergence whatever the tolerance.
//!
//! ## Why these numbers
//! Inputs are exact in the dtype and the oracle works in f64, so a correct backend's error is
//! its output rounding (half an ulp: 2^-9 relative in bf16, 2^-12 in f16, 2^-24 in f32) plus
//! f32 accumulation over at most a few thousand keys, plus, for backends that round softmax
//! probabilities to the dtype before P·V, about one rounding of `max|v|`. The tolerance sits
//! above that: bf16 1e-2 (five times its 2^-9 rounding), f16 2e-3 (four times 2^-11), f32 1e-5.
//! A single-key window off-by-one on a short sequence (n <= 8 keys, inputs ~N(0,1)) moves an
//! output by about `(v_extra - mean_v) / (n + 1)`, typically 0.1 or more: ten times the bf16
//! tolerance, so the property runner (short sequences) sees it at once. Upstream's 1e-2 on a
//! 2047-key window moves outputs by ~5e-4 and cannot see it, which is why attn-diff explores
//! small cases.
//!
//! ## FP8 KV caches
//! The oracle works on what the cache gives back (`fp8(x / scale) * scale`), so quantization
//! error is no part of a comparison (the quantizer is tested on its own) and a correct
//! kernel's error is the same as with a cache in the compute dtype: the dtype's tolerance,
//! computed with the read-back keys and values. Only when `fp8 * scale` is not exact in the
//! compute dtype (scales the strategy never draws) may two correct conventions of reading
//! the cache differ; `dequantized_rounding` bounds that.

use crate::{Case, DType};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Tolerance {
    pub const fn rel_abs(rtol: f64, atol: f64) -> Self {
        Tolerance { atol, rtol }
    }

    /// attn-diff's tolerance for outputs in `dtype` (see the module docs).
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F32 => Tolerance::rel_abs(1e-5, 1e-5),
            DType::Bf16 => Tolerance::rel_abs(1e-2, 1e-2),
            DType::F16 => Tolerance::rel_abs(2e-3, 2e-3),
        }
    }

    /// attn-diff's tolerance for a case: the dtype's, widened by the case's conditioning and
    /// by one rounding of max|v| in the dtype (probabilities rounded before P·V).
    ///
    /// Backends compute logits in f32; an f32 logit carries an error of about
    /// `eps_f32 * |logit|`, and softmax turns a logit error `δ` into an output error of about
    /// `δ * max|v|`. With logits in the hundreds (large inputs) that exceeds the f32
    /// tolerance although nothing is wrong, so the absolute tolerance grows by
    /// `16 * eps_f32 * L * V`, with `L = scale * max‖q‖ * max‖k‖` bounding |logit| and
    /// `V = max|v|`. For unit-normal inputs this term is ~1e-5 (f32 only notices); a real bug
    /// moves outputs by O(0.1 V) and stays far outside it.
    pub fn for_case(case: &Case) -> Self {
        let base = Tolerance::for_dtype(case.config.dtype);
        let d = case.config.head_size.max(1);
        let max_norm = |v: &[f64]| {
            v.chunks(d)
                .map(|r| r.iter().map(|&x| x * x).sum::<f64>().sqrt())
                .fold(0.0, f64::max)
        };
        let t = &case.tensors;
        let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let q = max_norm(&widen(&t.query));
        // The keys and values a kernel reads: the inputs, or what an FP8 cache gives back.
        let (keys, values): (Vec<f64>, Vec<f64>) = {
            let (k32, v32) = case.all_kv();
            match &case.config.kv_cache {
                Some(cache) => (
                    cache.read_back_k(&k32, case.config.num_kv_heads, case.config.head_size),
                    cache.read_back_v(&v32, case.config.num_kv_heads, case.config.head_size_v()),
                ),
                None => (widen(&k32), widen(&v32)),
            }
        };
        let k = max_norm(&keys);
        let v = values.iter().fold(0.0f64, |m, &x| m.max(x.abs()));
        let logit_bound = case.config.effective_scale() * q * k;
        let conditioning = 16.0 * (f32::EPSILON as f64 / 2.0) * logit_bound * v;
        // Backends that round the softmax probabilities to the dtype before P·V (as flash
        // kernels and libtorch's reduced-precision SDPA do) are off by up to one rounding of
        // max|v|: with probabilities near uniform (a tiny scale) and values in the tens, that
        // passes the dtype's base tolerance although nothing is wrong.
        let eps = case.config.dtype.epsilon();
        let probability_rounding = eps * v;
        Tolerance {
            atol: base.atol
                + conditioning
                + probability_rounding
                + dequantized_rounding(case, &keys, &values, logit_bound, v),
            rtol: base.rtol,
        }
    }

    /// Whether this tolerance cannot judge `case`: an absolute tolerance as large as the
    /// largest value an output row can hold (max |v|, every output being a convex
    /// combination of values) accepts any output, so nothing could diverge. That happens when
    /// the logits' conditioning term explodes (a query of 1e38: logits past what f32 holds).
    /// Returns that max |v|.
    pub fn vacuous_for(&self, case: &Case) -> Option<f64> {
        let (_, v32) = case.all_kv();
        let values = v32.iter();
        let v = match &case.config.kv_cache {
            Some(c) => c
                .read_back_v(&v32, case.config.num_kv_heads, case.config.head_size_v())
                .iter()
                .fold(0.0f64, |m, x| m.max(x.abs())),
            None => values.fold(0.0f64, |m, &x| m.max((x as f64).abs())),
        };
        (v > 0.0 && (self.atol >= v || !self.atol.is_finite())).then_some(v)
    }

    /// vLLM's backend test: atol = rtol = 1e-2 for every dtype.
    pub fn upstream() -> Self {
        Tolerance::rel_abs(
            crate::specs::UPSTREAM_TOLERANCE,
            crate::specs::UPSTREAM_TOLERANCE,
        )
    }

    /// `|actual - expected| <= atol`, or `<= rtol * max(|actual|, |expected|)`; equal values
    /// pass, NaN never does, an infinity only equals itself.
    pub fn accepts(&self, actual: f64, expected: f64) -> bool {
        if actual == expected {
            return true;
        }
        if actual.is_infinite() || expected.is_infinite() {
            return false;
        }
        let diff = (actual - expected).abs();
        diff <= self.atol || diff <= self.rtol * actual.abs().max(expected.abs())
    }

    /// The largest error `accepts` allows around `expected` (ignoring the `|actual|` term).
    pub fn allowance(&self, expected: f64) -> f64 {
        self.atol.max(self.rtol * expected.abs())
    }
}

/// The widening an FP8 cache needs when `fp8 * scale` is not exact in the compute dtype.
///
/// vLLM's kernels read an FP8 cache in one of two ways: some round `fp8 * scale` to the
/// compute dtype before the dot products (triton_unified_attention, the paged CUDA kernels),
/// others keep the raw FP8 value and apply the scale to the scores and the output (flash
/// attention's descale). They agree exactly when every `fp8 * scale` is exact in the dtype
/// (a scale of at most 4 significant bits: 4 for E4M3 plus 4 fits bf16's 8; the strategy
/// draws only such scales), and then this is 0. Otherwise a value's rounding moves it by
/// at most `eps * |v|`, the output by `eps * V`; a key's rounding moves a logit by at most
/// `eps * scale * ‖q‖ * ‖k‖ <= eps * L`, and a softmax turns a logit error `δ` into an
/// output error of at most `2 δ V`.
///
/// Per-token scales are not widened for: every FP8 value is exact in every compute dtype, and
/// vLLM's per-token-head kernel applies each key's scale to its f32 score and each value's to
/// its weight (`triton_unified_attention`), as `cpu` does; a kernel that rounds `fp8 * s` to
/// the dtype first is off by `eps * L` in the logits, which past logits of a few hundred is
/// as large as any output (no case could be judged).
fn dequantized_rounding(case: &Case, keys: &[f64], values: &[f64], l: f64, v: f64) -> f64 {
    match &case.config.kv_cache {
        None => return 0.0,
        Some(c) if c.scales == crate::KvScales::Token => return 0.0,
        Some(_) => {}
    }
    let dtype = case.config.dtype;
    let exact = |x: &f64| (*x as f32) as f64 == *x && dtype.represents(*x as f32);
    if keys.iter().chain(values).all(exact) {
        return 0.0;
    }
    let eps = dtype.epsilon();
    eps * v + 2.0 * eps * l * v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_absolute_near_zero_relative_above() {
        let t = Tolerance::rel_abs(1e-2, 1e-3);
        assert!(t.accepts(0.0005, 0.0));
        assert!(!t.accepts(0.002, 0.0));
        assert!(t.accepts(100.9, 100.0));
        assert!(!t.accepts(102.0, 100.0));
        assert!(!t.accepts(f64::NAN, 0.0) && !t.accepts(f64::NAN, f64::NAN));
        assert!(t.accepts(f64::INFINITY, f64::INFINITY));
        assert!(!t.accepts(f64::INFINITY, 1e300));
    }
}
