//! Which policy turns a backend's output into a verdict.
//!
//! - [`Judge::Tolerance`], the default: attn-diff's tolerance per dtype, widened by what the
//!   case's conditioning explains ([`Tolerance::for_case`]).
//! - [`Judge::Ladder`]: the output's error against the exact result at most `factor` times a
//!   named rung's own error ([`crate::ladder`]), plus one rounding of the largest output. This
//!   is how PyTorch's flex_attention tests hold a kernel (1.1 times the error of the eager
//!   computation in the same dtype, both against f64) and FlashAttention's tests (twice it):
//!   a kernel is judged against what its dtype can do, not against a fixed number.
//!
//! The ladder judges 16-bit cases. An f32 case keeps the per-dtype tolerance: the ladder's
//! rungs accumulate dot products exactly and round once, which no f32 kernel does, and the f32
//! tolerance is what that accumulation explains.
//!
//! Both come out as a [`Tolerance`] per case, so comparing, reporting and shrinking are the
//! same whichever judged; every summary and report says which did.

use crate::ladder::{emulate, Rung};
use crate::{Case, DType, Tolerance};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum Judge {
    /// attn-diff's tolerance per dtype ([`Tolerance::for_case`]).
    #[default]
    Tolerance,
    /// At most `factor` times the error of `rung` (its slug in JSON), against the exact result.
    Ladder {
        #[serde(with = "rung_slug")]
        rung: Rung,
        factor: f64,
    },
}

/// The factor `--judge ladder` allows: FlashAttention's tests' 2.
pub const DEFAULT_FACTOR: f64 = 2.0;
/// The rung `--judge ladder` measures against: eager attention in the case's dtype.
pub const DEFAULT_RUNG: Rung = Rung::AllInDtype;

impl Judge {
    /// `tolerance`, `ladder`, `ladder:K` or `ladder:K:RUNG` (a [`Rung::slug`]).
    pub fn parse(s: &str) -> Result<Judge, String> {
        let mut parts = s.split(':');
        match parts.next() {
            Some("tolerance") if parts.next().is_none() => return Ok(Judge::Tolerance),
            Some("ladder") => {}
            _ => {
                return Err(format!(
                    "--judge `{s}`: expected `tolerance`, `ladder`, `ladder:K` or `ladder:K:RUNG`"
                ))
            }
        }
        let factor = match parts.next() {
            None => DEFAULT_FACTOR,
            Some(k) => k
                .parse::<f64>()
                .ok()
                .filter(|k| k.is_finite() && *k >= 1.0)
                .ok_or_else(|| format!("--judge `{s}`: the factor `{k}` is not a number >= 1"))?,
        };
        let rung = match parts.next() {
            None => DEFAULT_RUNG,
            Some(r) => Rung::from_slug(r).ok_or_else(|| {
                let known: Vec<&str> = Rung::ALL.iter().map(|r| r.slug()).collect();
                format!("--judge `{s}`: no rung `{r}` (rungs: {})", known.join(", "))
            })?,
        };
        if parts.next().is_some() {
            return Err(format!("--judge `{s}`: too many parts"));
        }
        Ok(Judge::Ladder { rung, factor })
    }

    /// The tolerance this policy judges `case` with; `expected` is the oracle's output.
    pub fn tolerance(&self, case: &Case, expected: &[f64]) -> Tolerance {
        match *self {
            Judge::Tolerance => Tolerance::for_case(case),
            Judge::Ladder { .. } if case.config.dtype == DType::F32 => Tolerance::for_case(case),
            Judge::Ladder { rung, factor } => {
                let rung_error = emulate(case, rung)
                    .iter()
                    .zip(expected)
                    .map(|(r, e)| (r - e).abs())
                    .fold(0.0, f64::max);
                // A kernel's own rounding of its output: half an ulp of each value, at most
                // one ulp of the largest.
                let largest = expected.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                let floor = case.config.dtype.epsilon() * largest;
                Tolerance::rel_abs(0.0, factor * rung_error + floor)
            }
        }
    }

    /// The policy in words, for reports.
    pub fn describe(&self) -> String {
        match self {
            Judge::Tolerance => "attn-diff's tolerance per dtype (--judge tolerance)".to_string(),
            Judge::Ladder { rung, factor } => format!(
                "the precision ladder: error at most {factor}x that of {} plus one output ulp, f32 cases by the tolerance (--judge {})",
                rung.name(),
                self.flag_value()
            ),
        }
    }

    /// The `--judge` value that selects this policy.
    pub fn flag_value(&self) -> String {
        match self {
            Judge::Tolerance => "tolerance".to_string(),
            Judge::Ladder { rung, factor } => format!("ladder:{factor}:{}", rung.slug()),
        }
    }

    /// The flag a replay line needs to judge as this run did: none for the default.
    pub fn flag(&self) -> Option<String> {
        (*self != Judge::Tolerance).then(|| format!("--judge {}", self.flag_value()))
    }
}

impl fmt::Display for Judge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

mod rung_slug {
    use crate::ladder::Rung;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(r: &Rung, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(r.slug())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Rung, D::Error> {
        let slug = String::deserialize(d)?;
        Rung::from_slug(&slug).ok_or_else(|| serde::de::Error::custom(format!("no rung `{slug}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_case, reference_output, AttentionConfig, BuildOptions, DType};

    #[test]
    fn parses_every_form_and_names_what_is_wrong() {
        assert_eq!(Judge::parse("tolerance"), Ok(Judge::Tolerance));
        assert_eq!(
            Judge::parse("ladder"),
            Ok(Judge::Ladder {
                rung: Rung::AllInDtype,
                factor: 2.0
            })
        );
        assert_eq!(
            Judge::parse("ladder:1.1:scores"),
            Ok(Judge::Ladder {
                rung: Rung::ScoresInDtype,
                factor: 1.1
            })
        );
        for (bad, says) in [
            ("ladder:0.5", "factor"),
            ("ladder:x", "factor"),
            ("ladder:2:nope", "no rung `nope`"),
            ("ladder:2:scores:x", "too many"),
            ("exact", "expected"),
        ] {
            let e = Judge::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // What a summary writes reads back.
        let j = Judge::parse("ladder:3:probabilities").unwrap();
        let json = serde_json::to_value(j).unwrap();
        assert_eq!(json["rung"], "probabilities");
        assert_eq!(serde_json::from_value::<Judge>(json).unwrap(), j);
        assert_eq!(Judge::parse(&j.flag_value()), Ok(j));
    }

    #[test]
    fn the_ladder_allows_what_the_dtype_does_and_no_more() {
        let c = AttentionConfig::new(4, 2, 64, 16, DType::Bf16);
        let case = build_case(&[40, 90], &[40, 1], c, 5, &BuildOptions::default());
        let exact = reference_output(&case);
        let judge = Judge::parse("ladder").unwrap();
        let tol = judge.tolerance(&case, &exact);
        // Eager bf16 itself passes, being within 1x of itself.
        let eager = emulate(&case, Rung::AllInDtype);
        assert!(eager.iter().zip(&exact).all(|(a, e)| tol.accepts(*a, *e)));
        // The f32 computation lands far closer still.
        let f32 = emulate(&case, Rung::F32);
        assert!(f32.iter().zip(&exact).all(|(a, e)| tol.accepts(*a, *e)));
        // An error three times eager's largest does not.
        let worst = eager
            .iter()
            .zip(&exact)
            .map(|(a, e)| (a - e).abs())
            .fold(0.0, f64::max);
        assert!(!tol.accepts(exact[0] + 3.0 * worst + 0.02, exact[0]));
    }
}
