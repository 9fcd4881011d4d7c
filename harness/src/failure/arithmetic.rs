//! A precision failure named by its arithmetic. The oracle's precision ladder
//! ([`attn_reference::ladder`]) computes a 16-bit case the ways kernels round; a backend whose
//! rows are what one of those ways gives (far closer to it than to the exact result) has that
//! precision cause, whatever rows or heads its errors happen to fall on, and its report says
//! so with the numbers: how far it is from the rung, from the exact result, and how much
//! closer an f32 computation lands. A 16-bit mismatch no rung explains is a logic bug.

use attn_reference::ladder::{emulate_rows, sample_rows, Rung};
use attn_reference::{Case, DType};

/// What explains a precision failure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arithmetic {
    pub rung: Rung,
    /// Another rung that gives this case's rows exactly as closely (two roundings the case
    /// cannot tell apart: a power-of-two scale makes scaling the query exact), named too.
    pub tied: Option<Rung>,
    pub how: Match,
    pub dtype: DType,
    /// The backend's largest distance from the rung's output.
    pub to_rung: f64,
    /// The backend's largest distance from the exact output.
    pub to_exact: f64,
    /// The f32 computation's largest distance from the exact output.
    pub f32_to_exact: f64,
}

/// A backend explained by a rung is at least this many times closer to it than to the exact
/// result: two kernels of one rung differ in summation order, far less than a rung's rounding.
const CLOSER: f64 = 4.0;

/// Multiply-adds per rung past which a case is judged on a sample of its rows: each rung
/// costs what the oracle does, and a failure's class must not take longer than its shrink.
const MAX_WORK: usize = 20_000_000;

/// How a backend's rows match a rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// Element by element: [`CLOSER`] times closer to the rung than to the exact result.
    Exact,
    /// In size and shape: its errors as large as the rung's (within [`SIZE_RATIO`]) on the
    /// same rows (the rows' errors rank-correlated, [`ROW_CORRELATION`]), as two
    /// kernels of one rounding that sum in different orders are.
    Profile,
}

/// How far apart a backend's error and a rung's may be in size to be one rounding.
const SIZE_RATIO: f64 = 3.0;
/// How alike their errors' distribution over rows must be at least (and significantly so:
/// three standard errors of a correlation over the rows, where that is more).
const ROW_CORRELATION: f64 = 0.3;
/// Fewer rows than this tell nothing by their correlation (a shrunk case's one or two).
const ROWS_FOR_CORRELATION: usize = 8;

impl Arithmetic {
    /// The rung that explains `output` (`[num_tokens, heads, head_size_v]`, padding rows
    /// after the real ones) on `case`, if one does: a 16-bit dtype, finite rows, a case of at
    /// most [`MAX_WORK`], an error well past the f32 computation's, and the rows matching a
    /// rung ([`Match`]); the closest exact match first, else the closest in size.
    pub fn explain(case: &Case, output: &[f32]) -> Option<Arithmetic> {
        let dtype = case.config.dtype;
        if dtype == DType::F32 {
            return None;
        }
        let dv = case.config.head_size_v();
        let rows = sample_rows(case, MAX_WORK);
        let hq = case.config.num_heads;
        let mut actual = Vec::with_capacity(rows.len() * dv);
        for &(t, h) in &rows {
            let at = (t * hq + h) * dv;
            let row = output.get(at..at + dv)?;
            if row.iter().any(|x| !x.is_finite()) {
                return None;
            }
            actual.extend(row.iter().map(|&x| x as f64));
        }
        let exact = emulate_rows(case, None, &rows);
        let to_exact = distance(&actual, &exact);
        let f32_to_exact = distance(&emulate_rows(case, Some(Rung::F32), &rows), &exact);
        if to_exact <= 2.0 * f32_to_exact {
            return None;
        }
        let errors = row_errors(&actual, &exact, dv);
        let mut exact_matches = Vec::new();
        let mut profiles = Vec::new();
        for rung in Rung::ALL
            .into_iter()
            .filter(|&r| r != Rung::F32 && r.applies_to(case))
        {
            let emulated = emulate_rows(case, Some(rung), &rows);
            let to_rung = distance(&actual, &emulated);
            if to_rung * CLOSER <= to_exact {
                exact_matches.push((rung, to_rung));
                continue;
            }
            let rung_error = distance(&emulated, &exact);
            let size = (to_exact / rung_error.max(f64::MIN_POSITIVE)).ln().abs();
            let alike = if errors.len() < ROWS_FOR_CORRELATION {
                1.0
            } else {
                super::hint::rank_correlation(&errors, &row_errors(&emulated, &exact, dv))
            };
            let significant = if errors.len() < ROWS_FOR_CORRELATION {
                0.0
            } else {
                ROW_CORRELATION.max(3.0 / (errors.len() as f64).sqrt())
            };
            if size <= SIZE_RATIO.ln() && alike >= significant {
                profiles.push((rung, to_rung, alike, size));
            }
        }
        // The closest exact match; else the rung whose errors fall on the rows most alike.
        exact_matches.sort_by(|a, b| a.1.total_cmp(&b.1));
        let tied = match exact_matches.as_slice() {
            [(_, best), (other, d), ..] if *d <= best * 1.01 + 1e-12 * to_exact => Some(*other),
            _ => None,
        };
        let exact_match = exact_matches.first().map(|&(r, d)| (r, d, Match::Exact));
        // Most alike first; among equals (a small case's few rows), closest in size.
        let profile = || {
            profiles
                .into_iter()
                .max_by(|a, b| a.2.total_cmp(&b.2).then(b.3.total_cmp(&a.3)))
                .map(|(r, d, _, _)| (r, d, Match::Profile))
        };
        let (rung, to_rung, how) = exact_match.or_else(profile)?;
        Some(Arithmetic {
            rung,
            tied: tied.filter(|_| how == Match::Exact),
            how,
            dtype,
            to_rung,
            to_exact,
            f32_to_exact,
        })
    }

    /// The hint a failure explained by this rung gives.
    pub fn hint(&self) -> String {
        let closer = if self.f32_to_exact > 0.0 {
            format!(
                "; an f32 computation lands {:.0}x closer ({:.1e})",
                self.to_exact / self.f32_to_exact,
                self.f32_to_exact
            )
        } else {
            "; an f32 computation lands exactly".to_string()
        };
        let matched = match self.how {
            Match::Exact => format!(
                "exactly what {}{} gives (within {:.1e}",
                self.rung.describe(self.dtype),
                self.tied.map_or(String::new(), |t| format!(
                    " (or, the same on this case, {})",
                    t.describe(self.dtype)
                )),
                self.to_rung
            ),
            Match::Profile => format!(
                "errors of the size and on the rows of {} (the rung's own summation order aside",
                self.rung.describe(self.dtype)
            ),
        };
        format!(
            "precision: {matched}, the exact result is {:.1e} away){closer}: {}",
            self.to_exact,
            self.rung.advice()
        )
    }
}

fn distance(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Each output row's largest error (`row` values a row).
fn row_errors(a: &[f64], b: &[f64], row: usize) -> Vec<f64> {
    a.chunks(row.max(1))
        .zip(b.chunks(row.max(1)))
        .map(|(x, y)| distance(x, y))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::ladder::emulate;
    use attn_reference::{build_case, reference_output, AttentionConfig, BuildOptions};

    fn case(dtype: DType) -> Case {
        let c = AttentionConfig::new(4, 2, 64, 16, dtype);
        let mut case = build_case(&[40, 200], &[40, 1], c, 3, &BuildOptions::default());
        for x in case.tensors.query.iter_mut() {
            *x = dtype.round(*x * 8.0);
        }
        case
    }

    #[test]
    fn a_backend_that_rounds_a_rung_is_named_by_it() {
        for dtype in [DType::Bf16, DType::F16] {
            let case = case(dtype);
            for rung in [
                Rung::ScoresInDtype,
                Rung::SoftmaxStatsInDtype,
                Rung::AllInDtype,
            ] {
                let output: Vec<f32> = emulate(&case, rung).iter().map(|&x| x as f32).collect();
                let a = Arithmetic::explain(&case, &output).expect("explained");
                assert_eq!(a.rung, rung, "{dtype}");
                assert!(a.hint().contains(&rung.describe(dtype)), "{}", a.hint());
            }
        }
    }

    /// Rounding P before P·V is what FlashAttention-2 and Triton kernels do, and the
    /// tolerance allows one rounding of max|v| for it: no mutant rounds at this rung, because
    /// a kernel that does is not wrong.
    #[test]
    fn probabilities_in_the_dtype_pass_the_tolerance() {
        use attn_results::compare::{compare, Tolerance};
        for dtype in [DType::Bf16, DType::F16] {
            let case = case(dtype);
            let out: Vec<f32> = emulate(&case, Rung::ProbsInDtype)
                .iter()
                .map(|&x| x as f32)
                .collect();
            let c = &case.config;
            let cmp = compare(
                &out,
                &reference_output(&case),
                c.num_heads,
                c.head_size_v(),
                Tolerance::for_case(&case),
            );
            assert!(cmp.passed(), "{dtype}: {cmp:?}");
        }
    }

    #[test]
    fn a_logic_bug_is_explained_by_no_rung() {
        let case = case(DType::Bf16);
        // Every output row off by a constant: no rounding does that.
        let output: Vec<f32> = reference_output(&case)
            .iter()
            .map(|&x| x as f32 + 0.05)
            .collect();
        assert_eq!(Arithmetic::explain(&case, &output), None);
        // And f32 has no ladder.
        let exact = case_f32();
        let out: Vec<f32> = reference_output(&exact).iter().map(|&x| x as f32).collect();
        assert_eq!(Arithmetic::explain(&exact, &out), None);
    }

    fn case_f32() -> Case {
        let c = AttentionConfig::new(2, 1, 16, 16, DType::F32);
        build_case(&[10], &[10], c, 1, &BuildOptions::default())
    }
}
