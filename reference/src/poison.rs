//! What unwritten cache slots and padding tokens' rows (query, key and value) hold. Real engines hand kernels
//! `torch.empty` memory: the tails of partial blocks, spare and freed blocks and the rows of
//! padding tokens can hold NaN, infinities or huge values. A kernel that multiplies a masked
//! value row by a probability of 0, loads a whole tile past a sequence's end, or lets padding
//! rows into a reduction is right on finite stale data and wrong on these (0 · NaN = NaN).
//! The oracle never reads those slots or rows, so a poisoned case has the same expected
//! output as a clean one; a backend that reads them diverges.

use crate::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Poison {
    Nan,
    PosInf,
    NegInf,
    /// The dtype's largest finite value (its square overflows f32).
    Huge,
}

impl Poison {
    pub const ALL: [Poison; 4] = [Poison::Nan, Poison::PosInf, Poison::NegInf, Poison::Huge];

    /// The value written, in `dtype` (exact in it).
    pub fn value(self, dtype: DType) -> f32 {
        match self {
            Poison::Nan => f32::NAN,
            Poison::PosInf => f32::INFINITY,
            Poison::NegInf => f32::NEG_INFINITY,
            Poison::Huge => dtype.max_finite() as f32,
        }
    }

    /// The stable name (JSON, coverage buckets).
    pub fn name(self) -> &'static str {
        match self {
            Poison::Nan => "nan",
            Poison::PosInf => "+inf",
            Poison::NegInf => "-inf",
            Poison::Huge => "huge",
        }
    }
}

impl fmt::Display for Poison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
