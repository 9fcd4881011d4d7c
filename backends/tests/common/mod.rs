//! What the backend tests share: the tolerance and the comparison with the oracle.
//! (The harness has its own, richer comparison; these tests must not depend on it.)

use attn_reference::{Case, DType};

/// `|actual - expected| <= atol + rtol * |expected|`, per dtype (the harness's per-dtype values).
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::Bf16 => (1e-2, 1e-2),
        DType::F16 => (2e-3, 2e-3),
    }
}

/// Compare the real rows of `actual` with `expected`; every value of `actual` (padding rows
/// too) must be finite. On failure, a report of the first mismatches with their position.
pub fn compare(case: &Case, actual: &[f32], expected: &[f64]) -> Result<(), String> {
    let (hq, d) = (case.config.num_heads, case.config.head_size);
    if let Some(i) = actual.iter().position(|x| !x.is_finite()) {
        return Err(format!(
            "non-finite output {} at token {}, head {}, dim {}",
            actual[i],
            i / (hq * d),
            i / d % hq,
            i % d
        ));
    }
    let (atol, rtol) = tolerance(case.config.dtype);
    let mut bad = Vec::new();
    let mut count = 0usize;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let diff = (a as f64 - e).abs();
        if diff > atol + rtol * e.abs() {
            count += 1;
            if bad.len() < 5 {
                bad.push(format!(
                    "  token {} head {} dim {}: got {a}, expected {e:.6}, |diff| {diff:.3e}, rel {:.3e}",
                    i / (hq * d),
                    i / d % hq,
                    i % d,
                    diff / e.abs().max(f64::MIN_POSITIVE)
                ));
            }
        }
    }
    if count == 0 {
        Ok(())
    } else {
        Err(format!(
            "{count} of {} values outside atol {atol:e} + rtol {rtol:e}:\n{}",
            expected.len(),
            bad.join("\n")
        ))
    }
}
