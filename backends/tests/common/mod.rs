//! What the backend-specific tests share: a comparison with the oracle that names the first
//! mismatches, under the case's `attn_reference::Tolerance` (the harness's own). The topics
//! every backend shares are in the harness's conformance suite (`harness/tests/conformance.rs`).

use attn_reference::{Case, Tolerance};

/// Compare the real rows of `actual` with `expected`; every value of `actual` (padding rows
/// too) must be finite. On failure, a report of the first mismatches with their position.
pub fn compare(case: &Case, actual: &[f32], expected: &[f64]) -> Result<(), String> {
    let (hq, d) = (case.config.num_heads, case.config.head_size_v());
    if let Some(i) = actual.iter().position(|x| !x.is_finite()) {
        return Err(format!(
            "non-finite output {} at token {}, head {}, dim {}",
            actual[i],
            i / (hq * d),
            i / d % hq,
            i % d
        ));
    }
    let tol = Tolerance::for_case(case);
    let mut bad = Vec::new();
    let mut count = 0usize;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let diff = (a as f64 - e).abs();
        if !tol.accepts(a as f64, e) {
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
            "{count} of {} values outside atol {:e}, rtol {:e}:\n{}",
            expected.len(),
            tol.atol,
            tol.rtol,
            bad.join("\n")
        ))
    }
}
