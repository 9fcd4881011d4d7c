//! What the backend-specific tests share: the harness's own comparison with the oracle
//! (`attn_results::compare`, under the case's `attn_reference::Tolerance`), as a report that
//! names the first mismatches. The topics every backend shares are in the harness's
//! conformance suite (`harness/tests/conformance.rs`).

use attn_reference::{Case, Tolerance};
use attn_results::compare::compare as judge;

/// Compare the real rows of `actual` with `expected` as the harness does (padding rows are
/// not read; NaN or Inf in a real row fails). On failure, the count, the first and the
/// worst mismatch with their position.
pub fn compare(case: &Case, actual: &[f32], expected: &[f64]) -> Result<(), String> {
    let (hq, d) = (case.config.num_heads, case.config.head_size_v());
    let tol = Tolerance::for_case(case);
    let c = judge(actual, expected, hq, d, tol);
    if c.passed() {
        return Ok(());
    }
    let at = |m: &attn_results::Mismatch| {
        format!(
            "token {} head {} dim {}: got {}, expected {:.6}",
            m.token, m.head, m.dim, m.actual, m.expected
        )
    };
    Err(format!(
        "{} of {} values outside atol {:e}, rtol {:e}{}; first {}; worst {}",
        c.mismatch_count,
        expected.len(),
        tol.atol,
        tol.rtol,
        if c.non_finite {
            " (non-finite values)"
        } else {
            ""
        },
        c.first.as_ref().map_or("-".into(), at),
        c.worst.as_ref().map_or("-".into(), at),
    ))
}
