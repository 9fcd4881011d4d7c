//! What tells one failure from another: a signature made of data (the divergence kind, how
//! far beyond the tolerance, an error's message without its numbers, the hint's pattern, the
//! logits' magnitude), so a run with several bugs reports each once.

use super::arithmetic::Arithmetic;
use super::exception::Exception;
use super::hint::{finding, Identity, Pattern};
use crate::failure::logit_stats::LogitStats;
use attn_reference::ladder::Rung;
use attn_reference::{Case, DType};
use attn_results::compare::Divergence;
use attn_results::DivergenceKind;
use std::fmt;

/// How bad a failure is: part of what a shrink must keep (a case 10× off that shrinks to one
/// just past the tolerance no longer shows what made it fail so badly).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// No output to compare (an error, a crash, a timeout).
    NoOutput,
    NonFinite,
    /// The worst error is beyond 10× the tolerance.
    FarBeyond,
    /// Beyond the tolerance, but within 10× of it.
    Beyond,
    /// Bits that moved between two forms of one request (an invariance pair): no error
    /// against the oracle is measured.
    BitsMoved,
}

/// How many times the tolerance an error must exceed to count as [`Severity::FarBeyond`].
pub const FAR_BEYOND: f64 = 10.0;

impl Severity {
    pub fn of(d: &Divergence) -> Severity {
        if d.kind == DivergenceKind::Variant {
            return Severity::BitsMoved;
        }
        let Some(c) = &d.comparison else {
            return Severity::NoOutput;
        };
        if c.non_finite {
            return Severity::NonFinite;
        }
        let far = c.worst.as_ref().is_some_and(|m| {
            let allowed = c.tolerance.atol.max(c.tolerance.rtol * m.expected.abs());
            m.abs_err > FAR_BEYOND * allowed
        });
        if far {
            Severity::FarBeyond
        } else {
            Severity::Beyond
        }
    }

    fn label(self) -> &'static str {
        match self {
            Severity::NoOutput => "no output",
            Severity::NonFinite => "non-finite",
            Severity::FarBeyond => "beyond 10x the tolerance",
            Severity::Beyond => "within 10x the tolerance",
            Severity::BitsMoved => "bits moved",
        }
    }
}

/// What a shrink candidate must still show to stand for the failure it shrinks: the same
/// kind, severity and (for errors) message. A candidate that fails otherwise belongs to
/// another class and is rejected.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Symptom {
    pub kind: DivergenceKind,
    pub severity: Severity,
    /// An error's exception, normalised ([`Exception::key`]: the last exception of a
    /// traceback, numbers, addresses and paths out); mismatches: none.
    pub message: Option<String>,
}

impl Symptom {
    pub fn of(d: &Divergence) -> Symptom {
        let severity = Severity::of(d);
        Symptom {
            kind: d.kind,
            severity,
            message: match severity {
                Severity::NoOutput => Some(Exception::of(&d.message).key),
                // The relation that broke, in words with no numbers: one class per relation.
                Severity::BitsMoved => d.message.split(';').next().map(str::to_string),
                _ => None,
            },
        }
    }
}

/// The logits' size in a few coarse steps: precision bugs live at the large end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogitScale {
    Ordinary,
    Large,
    Extreme,
}

impl LogitScale {
    pub fn of(case: &Case) -> LogitScale {
        match LogitStats::of(case).max_logit {
            x if x < 1e2 => LogitScale::Ordinary,
            x if x < 1e4 => LogitScale::Large,
            _ => LogitScale::Extreme,
        }
    }

    fn label(self) -> &'static str {
        match self {
            LogitScale::Ordinary => "logits below 1e2",
            LogitScale::Large => "logits 1e2 to 1e4",
            LogitScale::Extreme => "logits past 1e4",
        }
    }
}

/// A failure's class: its symptom, and for wrong values the pattern of where the errors are
/// and how large the logits were. Two failures with equal signatures are one bug as far as
/// the run can tell.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Signature {
    pub symptom: Symptom,
    pub pattern: Option<Pattern>,
    pub logits: Option<LogitScale>,
    /// After shrinking: the features the shrunk case still has (values left out).
    pub features: Option<Vec<String>>,
    /// The precision ladder's rung a 16-bit mismatch's rows are ([`Arithmetic`]): one
    /// precision cause, whatever rows or heads its errors fell on.
    pub arithmetic: Option<Rung>,
}

impl Signature {
    /// The signature of `d`, a divergence on `case` as found (no features yet).
    pub fn of(case: &Case, d: &Divergence) -> Signature {
        let symptom = Symptom::of(d);
        let has_values = !matches!(symptom.severity, Severity::NoOutput | Severity::BitsMoved);
        let arithmetic = (symptom.kind == DivergenceKind::Mismatch)
            .then_some(d.output.as_deref())
            .flatten()
            .and_then(|out| Arithmetic::explain(case, out))
            .map(|a| a.rung);
        Signature {
            // A rung that explains the rows is the pattern: where the errors fell is noise.
            pattern: match arithmetic {
                Some(_) => Some(Pattern::Precision),
                None => d
                    .comparison
                    .as_ref()
                    .and_then(|c| finding(case, c))
                    .map(|f| f.pattern),
            },
            // Only a 16-bit dtype's scores lose precision with the logits' size.
            logits: (has_values && arithmetic.is_none() && case.config.dtype != DType::F32)
                .then(|| LogitScale::of(case)),
            symptom,
            features: None,
            arithmetic,
        }
    }

    /// The signature of a shrunk case: as [`Signature::of`], with the features it still has.
    pub fn shrunk(case: &Case, d: &Divergence) -> Signature {
        // The config's, then the batch's (padded requests, non-causal requests).
        let features = case
            .config
            .features()
            .iter()
            .map(|f| f.split('=').next().unwrap_or(f).to_string())
            .chain(attn_reference::Feature::of_batch(&case.batch).map(|f| f.name().to_string()))
            .collect();
        Signature {
            features: Some(features),
            ..Signature::of(case, d)
        }
    }
}

impl Signature {
    /// Whether two shrunk cases show one bug: the same kind and message, the same pattern
    /// and, as far as the pattern needs them ([`Pattern::identity`]), the same features
    /// left. Severity and logits aside: a bug that is 10x off in one case and just past the
    /// tolerance in another is still one bug once both are minimal.
    ///
    /// Wrong values and non-finite ones are one bug when both keep to the same located
    /// pattern: a kernel that reads a slot it should not turns the poison there into NaN and
    /// a stale finite value into a mismatch.
    pub fn same_bug(&self, other: &Signature) -> bool {
        let values =
            |k: DivergenceKind| matches!(k, DivergenceKind::Mismatch | DivergenceKind::NonFinite);
        let located = self.pattern.is_some_and(|p| p != Pattern::NonFinite);
        let same_kind = self.symptom.kind == other.symptom.kind
            || (located && values(self.symptom.kind) && values(other.symptom.kind));
        // A pattern that names the mechanism (a padding write into the last slot, a skipped
        // block read) is one bug whatever else the case had; one that names a feature's edge
        // (the window's, a chunk's) is one bug per attention kind; any other needs the same
        // features left, since they are what tells its bugs apart.
        // One rung of the ladder (or rungs of one cause: `Rung::same_cause`) is one
        // precision cause, whatever the case had.
        if self.arithmetic.is_some() || other.arithmetic.is_some() {
            let same = match (self.arithmetic, other.arithmetic) {
                (Some(a), Some(b)) => a.same_cause(b),
                _ => false,
            };
            return self.symptom.kind == other.symptom.kind && same;
        }
        let features = match self.pattern.map(Pattern::identity) {
            Some(Identity::Mechanism) => true,
            Some(Identity::Kind) => {
                let kind = |s: &Signature| s.features.as_ref().and_then(|f| f.first().cloned());
                kind(self) == kind(other)
            }
            Some(Identity::Features) | None => self.features == other.features,
        };
        same_kind
            && self.symptom.message == other.symptom.message
            && self.pattern == other.pattern
            && features
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {}",
            self.symptom.kind,
            self.symptom.severity.label()
        )?;
        if let Some(m) = &self.symptom.message {
            write!(f, ", \"{m}\"")?;
        }
        if let Some(p) = self.pattern {
            write!(f, ", {}", p.label())?;
        }
        if let Some(l) = self.logits {
            write!(f, ", {}", l.label())?;
        }
        if let Some(r) = self.arithmetic {
            write!(f, ", arithmetic: {}", r.name())?;
        }
        if let Some(fs) = &self.features {
            write!(f, ", features {}", fs.join("+"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::Tolerance;
    use attn_results::compare::Comparison;
    use attn_results::Mismatch;

    fn mismatch(abs_err: f64, expected: f64) -> Divergence {
        Divergence {
            kind: DivergenceKind::Mismatch,
            message: "1 element beyond tolerance".into(),
            comparison: Some(Comparison {
                max_abs_err: abs_err,
                max_rel_err: 0.0,
                mismatch_count: 1,
                first: None,
                worst: Some(Mismatch {
                    token: 0,
                    head: 0,
                    dim: 0,
                    expected,
                    actual: expected + abs_err,
                    abs_err,
                    rel_err: 0.0,
                }),
                non_finite: false,
                tolerance: Tolerance::rel_abs(1e-2, 1e-3),
                err_map: Vec::new(),
                failed: Vec::new(),
                figures: None,
            }),
            output: None,
        }
    }

    #[test]
    fn severity_tells_far_from_near_misses() {
        // allowed = max(1e-3, 1e-2 × 1.0) = 1e-2
        assert_eq!(Severity::of(&mismatch(0.05, 1.0)), Severity::Beyond);
        assert_eq!(Severity::of(&mismatch(0.2, 1.0)), Severity::FarBeyond);
        let mut nan = mismatch(0.05, 1.0);
        nan.comparison.as_mut().unwrap().non_finite = true;
        assert_eq!(Severity::of(&nan), Severity::NonFinite);
    }

    #[test]
    fn errors_differ_by_words_not_numbers() {
        let err = |m: &str| Divergence {
            kind: DivergenceKind::Error,
            message: m.into(),
            comparison: None,
            output: None,
        };
        let a = Symptom::of(&err("block size 32 unsupported (got 32)\ntraceback 12"));
        let b = Symptom::of(&err("block size 8 unsupported (got 8)"));
        let c = Symptom::of(&err("head size 8 unsupported"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            a.message.as_deref(),
            Some("block size # unsupported (got #)")
        );
        assert_ne!(a, Symptom::of(&mismatch(0.05, 1.0)));
    }
}
