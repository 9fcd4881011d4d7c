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
        })
    }
}

/// One output element beyond the tolerance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    pub token: usize,
    pub head: usize,
    pub dim: usize,
    pub expected: f64,
    pub actual: f64,
    pub abs_err: f64,
    pub rel_err: f64,
}

/// How a failing case was shrunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShrinkInfo {
    pub steps: usize,
    pub accepted: usize,
    pub seconds: f64,
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
            self.sequences, self.tokens, self.max_seq_len, self.heads, self.kv_heads, self.head_size
        )
    }
}
