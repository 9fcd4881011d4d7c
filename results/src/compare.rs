//! Comparing a backend's output with the oracle's, element by element, under the case's
//! [`Tolerance`]: how many values fail, the first and the worst, and an error map per token and
//! head for the heat map. NaN or Inf anywhere in a real row is a divergence whatever the
//! tolerance; padding rows are never read (an engine ignores them, and they may be computed
//! from poisoned padding queries). The harness and every backend's own tests judge with this
//! one comparison.

use serde::Serialize;

/// The tolerance lives with the case model (`attn_reference::Tolerance`, where its reasoning
/// is written down), so backend tests and the harness judge with the same numbers.
pub use attn_reference::Tolerance;

/// One element that failed the tolerance.
pub use crate::Mismatch;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub max_abs_err: f64,
    pub max_rel_err: f64,
    /// How many elements failed.
    pub mismatch_count: usize,
    pub first: Option<Mismatch>,
    /// The mismatch with the largest error beyond the tolerance.
    pub worst: Option<Mismatch>,
    /// Whether a real row holds NaN or Inf.
    pub non_finite: bool,
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// (token, head) -> max abs error, `[real_tokens * heads]`, for hints and heat maps.
    #[serde(skip)]
    pub err_map: Vec<f64>,
    /// Whether each element failed, `[real_tokens * heads * head_size]`.
    #[serde(skip)]
    pub failed: Vec<bool>,
    /// NMSE, ulps and the multiple of eager attention's error, when the judge measured them.
    #[serde(skip)]
    pub figures: Option<crate::CaseFigures>,
}

/// A backend's answer that the comparison (or the run) failed: how, in one line, and what
/// there is to show of it.
#[derive(Clone, Debug, Serialize)]
pub struct Divergence {
    pub kind: crate::DivergenceKind,
    pub message: String,
    #[serde(skip)]
    pub comparison: Option<Comparison>,
    /// The backend's full output, when it produced one.
    #[serde(skip)]
    pub output: Option<Vec<f32>>,
}

impl Comparison {
    pub fn passed(&self) -> bool {
        self.mismatch_count == 0 && !self.non_finite
    }
}

/// Compare `actual` (`[num_tokens, heads, d]`, padding rows ignored) with `expected`
/// (`[real_tokens, heads, d]`).
pub fn compare(
    actual: &[f32],
    expected: &[f64],
    heads: usize,
    head_size: usize,
    tol: Tolerance,
) -> Comparison {
    let row = heads * head_size;
    let real_tokens = expected.len().checked_div(row).unwrap_or(0);
    let mut c = Comparison {
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        mismatch_count: 0,
        first: None,
        worst: None,
        non_finite: false,
        tolerance: tol,
        err_map: vec![0.0; real_tokens * heads],
        failed: vec![false; expected.len()],
        figures: None,
    };
    let mut worst_excess = f64::NEG_INFINITY;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let a = a as f64;
        let abs_err = if a.is_finite() {
            (a - e).abs()
        } else {
            f64::INFINITY
        };
        let rel_err = if e == 0.0 {
            if abs_err == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            abs_err / e.abs()
        };
        c.max_abs_err = c.max_abs_err.max(abs_err);
        c.max_rel_err = c
            .max_rel_err
            .max(if e.abs() > tol.atol { rel_err } else { 0.0 });
        let cell = i / head_size;
        c.err_map[cell] = c.err_map[cell].max(abs_err);
        if !a.is_finite() {
            c.non_finite = true;
        }
        if !a.is_finite() || !tol.accepts(a, e) {
            c.failed[i] = true;
            c.mismatch_count += 1;
            let m = Mismatch {
                token: i / row,
                head: (i % row) / head_size,
                dim: i % head_size,
                expected: e,
                actual: a,
                abs_err,
                rel_err,
            };
            let excess = abs_err - tol.allowance(e);
            if excess > worst_excess || (excess.is_nan() && c.worst.is_none()) {
                worst_excess = excess;
                c.worst = Some(m.clone());
            }
            if c.first.is_none() {
                c.first = Some(m);
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::DType;

    #[test]
    fn within_tolerance_passes_and_beyond_fails_with_position() {
        let expected = vec![1.0, 2.0, 3.0, 4.0];
        let tol = Tolerance::for_dtype(DType::Bf16);
        assert!(compare(&[1.005, 2.0, 3.0, 4.0], &expected, 2, 2, tol).passed());
        let c = compare(&[1.0, 2.0, 3.0, 4.2], &expected, 2, 2, tol);
        assert!(!c.passed());
        let m = c.worst.unwrap();
        assert_eq!((m.token, m.head, m.dim), (0, 1, 1));
        assert!((m.abs_err - 0.2).abs() < 1e-6);
    }

    #[test]
    fn nan_and_inf_always_diverge() {
        let tol = Tolerance::rel_abs(1e9, 1e9);
        assert!(compare(&[f32::NAN, 0.0], &[0.0, 0.0], 1, 2, tol).non_finite);
        assert!(!compare(&[0.0, f32::INFINITY], &[0.0, 0.0], 1, 2, tol).passed());
    }

    #[test]
    fn padding_rows_are_ignored() {
        // Two tokens of output, one real: the second row is never looked at.
        let c = compare(
            &[1.0, 1.0, f32::NAN, 1e30],
            &[1.0, 1.0],
            1,
            2,
            Tolerance::for_dtype(DType::F32),
        );
        assert!(c.passed());
    }

    #[test]
    fn conditioning_widens_only_for_large_logits() {
        use attn_reference::{build_case, AttentionConfig, BuildOptions};
        let c = AttentionConfig::new(2, 1, 8, 4, DType::F32);
        let unit = build_case(&[9], &[2], c.clone(), 1, &BuildOptions::default());
        assert!(Tolerance::for_case(&unit).atol < 5e-5);
        let big = build_case(
            &[9],
            &[2],
            c,
            1,
            &BuildOptions {
                std: 12.0,
                ..BuildOptions::default()
            },
        );
        let t = Tolerance::for_case(&big).atol;
        assert!(t > 1e-4 && t < 5e-2, "{t}");
    }

    #[test]
    fn f32_tolerance_is_tight() {
        let tol = Tolerance::for_dtype(DType::F32);
        assert!(tol.accepts(1.000001, 1.0));
        assert!(!tol.accepts(1.0001, 1.0));
    }
}
