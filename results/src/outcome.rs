//! What happened to one case on one backend, as data.

use attn_reference::Case;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a backend's answer is not the oracle's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceKind {
    /// Values beyond the tolerance.
    Mismatch,
    /// NaN or Inf in a real output row.
    NonFinite,
    /// The backend panicked.
    Panic,
    /// The backend returned an error.
    Error,
    /// An external backend did not answer in time.
    Timeout,
    /// An external backend's process died.
    Crashed,
    /// An external backend answered something malformed.
    ProtocolError,
    /// A request's rows changed under an invariance relation the backend declares.
    Variant,
}

impl fmt::Display for DivergenceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DivergenceKind::Mismatch => "mismatch",
            DivergenceKind::NonFinite => "non-finite",
            DivergenceKind::Panic => "panic",
            DivergenceKind::Error => "error",
            DivergenceKind::Timeout => "timeout",
            DivergenceKind::Crashed => "crashed",
            DivergenceKind::ProtocolError => "protocol error",
            DivergenceKind::Variant => "variant",
        })
    }
}

/// One output element beyond the tolerance (NaN and infinities, as JSON null, read back as
/// NaN).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    pub token: usize,
    pub head: usize,
    pub dim: usize,
    #[serde(deserialize_with = "crate::nullable_f64")]
    pub expected: f64,
    #[serde(deserialize_with = "crate::nullable_f64")]
    pub actual: f64,
    #[serde(deserialize_with = "crate::nullable_f64")]
    pub abs_err: f64,
    #[serde(deserialize_with = "crate::nullable_f64")]
    pub rel_err: f64,
}

/// How a failing case was shrunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShrinkInfo {
    pub steps: usize,
    pub accepted: usize,
    pub seconds: f64,
    /// The shrink ended on its step or time budget (or an interrupt), not because nothing
    /// smaller failed: the case may not be minimal.
    #[serde(default)]
    pub exhausted: bool,
    /// How a shrink of a timeout was bounded (other shrinks: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ShrinkLimits>,
}

/// The bounds of a shrink whose every try could cost a timeout.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShrinkLimits {
    /// The limit each try had: scaled to the slowest call that answered, within the timeout.
    pub per_try_seconds: f64,
    /// The most the whole shrink could take.
    pub in_all_seconds: f64,
}

/// The size of a (minimal) case, as tables show it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CaseSize {
    pub sequences: usize,
    pub tokens: usize,
    pub max_seq_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
}

impl CaseSize {
    pub fn of(case: &Case) -> CaseSize {
        CaseSize {
            sequences: case.num_seqs(),
            tokens: case.num_tokens(),
            max_seq_len: case.batch.seq_lens.iter().copied().max().unwrap_or(0),
            heads: case.config.num_heads,
            kv_heads: case.config.num_kv_heads,
            head_size: case.config.head_size,
        }
    }
}

impl fmt::Display for CaseSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} seq, {} tok, len {}, {}/{} heads, d {}",
            self.sequences,
            self.tokens,
            self.max_seq_len,
            self.heads,
            self.kv_heads,
            self.head_size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_finite_mismatch_survives_json() {
        let m = Mismatch {
            token: 0,
            head: 1,
            dim: 2,
            expected: 0.5,
            actual: f64::NAN,
            abs_err: f64::INFINITY,
            rel_err: f64::NAN,
        };
        let back: Mismatch = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!((back.token, back.expected), (0, 0.5));
        assert!(back.actual.is_nan() && back.abs_err.is_nan() && back.rel_err.is_nan());
    }
}
