//! Error figures beside the verdict: how far a backend's outputs are from the exact ones, in
//! the numbers precision is argued with rather than a pass against a tolerance:
//! - NMSE, `Σ (actual − exact)² / Σ exact²` (llama.cpp's `test-backend-ops`);
//! - the largest error in units in the last place of the dtype at the exact value (values
//!   below 1/64 of the output's largest measured at that size: near zero a kernel's error is
//!   absolute, its accumulator's rounding at the scale of the output, not of the value);
//! - the error as a multiple of eager attention's in the same dtype, both against the exact
//!   result (PyTorch's flex_attention tests hold a kernel to 1.1 times it, FlashAttention's
//!   to twice): below 1, the kernel is more accurate than computing in its dtype would be.
//!
//! Kept per backend and dtype, as sums that add across cases and shards.

use attn_reference::ladder::EagerSample;
use attn_reference::{Case, DType};
use serde::{Deserialize, Serialize};

/// One judged output's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CaseFigures {
    pub dtype: DType,
    pub values: u64,
    pub sum_sq_err: f64,
    pub sum_sq_exact: f64,
    pub max_ulps: f64,
    /// The error on the eager sample's rows over eager attention's (None: not sampled, or
    /// eager attention exact there).
    pub eager_ratio: Option<f64>,
}

impl CaseFigures {
    /// The figures of `actual` (`[num_tokens, heads, head_size_v]`, padding rows after the
    /// real ones) against `expected` on `case`; None when a real row is not finite (a
    /// divergence whatever the numbers).
    pub fn of(
        case: &Case,
        actual: &[f32],
        expected: &[f64],
        eager: Option<&EagerSample>,
    ) -> Option<CaseFigures> {
        let dtype = case.config.dtype;
        let floor = expected.iter().fold(0.0f64, |m, x| m.max(x.abs())) / ULP_FLOOR;
        let (mut sum_sq_err, mut sum_sq_exact, mut max_ulps) = (0.0, 0.0, 0.0f64);
        for (&a, &e) in actual.iter().zip(expected) {
            if !a.is_finite() {
                return None;
            }
            let err = a as f64 - e;
            sum_sq_err += err * err;
            sum_sq_exact += e * e;
            max_ulps = max_ulps.max(err.abs() / ulp(dtype, e.abs().max(floor)));
        }
        Some(CaseFigures {
            dtype,
            values: expected.len().min(actual.len()) as u64,
            sum_sq_err,
            sum_sq_exact,
            max_ulps,
            eager_ratio: eager.and_then(|s| s.ratio(case, actual, expected)),
        })
    }
}

/// Values below the output's largest divided by this are measured in ulps at that size.
const ULP_FLOOR: f64 = 64.0;

/// The spacing of `dtype`'s values at `x` (at the smallest normal one below it).
pub fn ulp(dtype: DType, x: f64) -> f64 {
    let min_exponent = match dtype {
        DType::F32 | DType::Bf16 => -126,
        DType::F16 => -14,
    };
    let exponent = if x == 0.0 {
        min_exponent
    } else {
        (x.abs().log2().floor() as i32).max(min_exponent)
    };
    // `epsilon` is the unit roundoff, half the spacing at 1.
    2.0 * dtype.epsilon() * 2f64.powi(exponent)
}

/// A backend's figures in one dtype, over every output judged in it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorFigures {
    pub dtype: DType,
    /// Outputs (cases) and values compared.
    pub outputs: u64,
    pub values: u64,
    pub sum_sq_err: f64,
    pub sum_sq_exact: f64,
    pub max_ulps: f64,
    /// Outputs measured against eager attention in the dtype.
    pub eager_outputs: u64,
    /// Σ ln(error / eager's error) over them (their geometric mean is `exp` of the mean).
    pub eager_log_ratio_sum: f64,
    /// The largest error / eager's error.
    pub eager_ratio_max: f64,
}

impl ErrorFigures {
    pub fn new(dtype: DType) -> ErrorFigures {
        ErrorFigures {
            dtype,
            outputs: 0,
            values: 0,
            sum_sq_err: 0.0,
            sum_sq_exact: 0.0,
            max_ulps: 0.0,
            eager_outputs: 0,
            eager_log_ratio_sum: 0.0,
            eager_ratio_max: 0.0,
        }
    }

    /// NMSE over every value (None: none compared, or every exact value 0).
    pub fn nmse(&self) -> Option<f64> {
        (self.sum_sq_exact > 0.0).then(|| self.sum_sq_err / self.sum_sq_exact)
    }

    /// The geometric mean of error / eager's error (None: never measured).
    pub fn eager_ratio_mean(&self) -> Option<f64> {
        (self.eager_outputs > 0)
            .then(|| (self.eager_log_ratio_sum / self.eager_outputs as f64).exp())
    }

    pub fn add(&mut self, c: &CaseFigures) {
        self.outputs += 1;
        self.values += c.values;
        self.sum_sq_err += c.sum_sq_err;
        self.sum_sq_exact += c.sum_sq_exact;
        self.max_ulps = self.max_ulps.max(c.max_ulps);
        // An exact output (ratio 0) has no logarithm: it counts as a tiny fraction.
        if let Some(r) = c.eager_ratio {
            self.eager_outputs += 1;
            self.eager_log_ratio_sum += r.max(1e-6).ln();
            self.eager_ratio_max = self.eager_ratio_max.max(r);
        }
    }

    /// Another shard's figures of the same dtype.
    pub fn merge(&mut self, o: &ErrorFigures) {
        self.outputs += o.outputs;
        self.values += o.values;
        self.sum_sq_err += o.sum_sq_err;
        self.sum_sq_exact += o.sum_sq_exact;
        self.max_ulps = self.max_ulps.max(o.max_ulps);
        self.eager_outputs += o.eager_outputs;
        self.eager_log_ratio_sum += o.eager_log_ratio_sum;
        self.eager_ratio_max = self.eager_ratio_max.max(o.eager_ratio_max);
    }

    /// One line: `bf16: NMSE 3.1e-7, max 2 ulps, 0.42x eager bf16's error (geometric mean
    /// of 388 outputs; at most 0.97x)`.
    pub fn describe(&self) -> String {
        let nmse = self
            .nmse()
            .map_or("NMSE -".to_string(), |n| format!("NMSE {n:.1e}"));
        let eager = match self.eager_ratio_mean() {
            Some(m) => format!(
                ", {m:.2}x the error of eager {} attention (geometric mean of {} outputs; at most {:.2}x)",
                self.dtype, self.eager_outputs, self.eager_ratio_max
            ),
            None => String::new(),
        };
        format!(
            "{}: {nmse}, max {:.1} ulps over {} values of {} outputs{eager}",
            self.dtype, self.max_ulps, self.values, self.outputs
        )
    }
}

/// `figures` with `c` added to its dtype's entry (entries kept in dtype order).
pub fn add_to(figures: &mut Vec<ErrorFigures>, c: &CaseFigures) {
    match figures.iter_mut().find(|f| f.dtype == c.dtype) {
        Some(f) => f.add(c),
        None => {
            let mut f = ErrorFigures::new(c.dtype);
            f.add(c);
            figures.push(f);
            figures.sort_by_key(|f| f.dtype.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::{build_case, reference_output, AttentionConfig, BuildOptions};

    #[test]
    fn ulps_are_the_dtype_spacing() {
        assert_eq!(ulp(DType::Bf16, 1.0), 2f64.powi(-7));
        assert_eq!(ulp(DType::Bf16, 1.5), 2f64.powi(-7));
        assert_eq!(ulp(DType::F16, 2.0), 2f64.powi(-9));
        assert_eq!(ulp(DType::F32, 1.0), f32::EPSILON as f64);
        // Below the smallest normal value the spacing stops shrinking.
        assert_eq!(ulp(DType::F16, 1e-9), ulp(DType::F16, 2f64.powi(-14)));
        assert_eq!(ulp(DType::F16, 0.0), ulp(DType::F16, 2f64.powi(-14)));
    }

    #[test]
    fn figures_measure_the_error_and_compare_it_with_eager_attention() {
        let c = AttentionConfig::new(4, 2, 32, 16, DType::Bf16);
        let case = build_case(&[30, 70], &[30, 1], c, 2, &BuildOptions::default());
        let exact = reference_output(&case);
        let sample = EagerSample::of(&case, &exact, 1 << 20).unwrap();
        assert!(sample.error > 0.0);
        // The exact result rounded to bf16: at most half an ulp, far below eager's error.
        let rounded: Vec<f32> = exact.iter().map(|&x| DType::Bf16.round(x as f32)).collect();
        let f = CaseFigures::of(&case, &rounded, &exact, Some(&sample)).unwrap();
        assert!(f.max_ulps <= 0.5 + 1e-9, "{f:?}");
        assert!(f.eager_ratio.unwrap() < 1.0, "{f:?}");
        // Every value off by 0.05: NMSE is about 0.05² / mean(exact²).
        let off: Vec<f32> = exact.iter().map(|&x| x as f32 + 0.05).collect();
        let g = CaseFigures::of(&case, &off, &exact, Some(&sample)).unwrap();
        let mean_sq = exact.iter().map(|x| x * x).sum::<f64>() / exact.len() as f64;
        let nmse = g.sum_sq_err / g.sum_sq_exact;
        assert!((nmse / (0.0025 / mean_sq) - 1.0).abs() < 0.05, "{nmse}");
        assert!(g.eager_ratio.unwrap() > 1.0, "{g:?}");
        // A NaN output has no figures: it is a divergence whatever they are.
        let mut nan = rounded.clone();
        nan[3] = f32::NAN;
        assert_eq!(CaseFigures::of(&case, &nan, &exact, None), None);
        // Summed per dtype, and merged across shards to the same numbers.
        let mut all = Vec::new();
        add_to(&mut all, &f);
        add_to(&mut all, &g);
        let mut halves = [
            ErrorFigures::new(DType::Bf16),
            ErrorFigures::new(DType::Bf16),
        ];
        halves[0].add(&f);
        halves[1].add(&g);
        let (a, b) = halves.split_at_mut(1);
        a[0].merge(&b[0]);
        assert_eq!(all, vec![a[0].clone()]);
        assert_eq!(all[0].outputs, 2);
        assert!(
            all[0].describe().starts_with("bf16: NMSE"),
            "{}",
            all[0].describe()
        );
    }
}
