//! Element types a case can be expressed in.
//!
//! Every tensor of a case is stored as `f32` values that are exactly representable in the
//! case's dtype, so a backend converting them to its own storage type loses nothing and the
//! oracle sees the very same numbers.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];

    /// Round an `f32` to the nearest value of this dtype (round-to-nearest-even).
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::Bf16 => half::bf16::from_f32(x).to_f32(),
            DType::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// Whether `x` is exactly representable in this dtype.
    pub fn represents(self, x: f32) -> bool {
        let r = self.round(x);
        r == x || (r.is_nan() && x.is_nan())
    }

    /// Unit roundoff (half the distance from 1.0 to the next value).
    pub fn epsilon(self) -> f64 {
        match self {
            DType::F32 => f32::EPSILON as f64 / 2.0,
            DType::Bf16 => 2f64.powi(-8),
            DType::F16 => 2f64.powi(-11),
        }
    }

    /// Largest finite value.
    pub fn max_finite(self) -> f64 {
        match self {
            DType::F32 => f32::MAX as f64,
            DType::Bf16 => half::bf16::MAX.to_f64(),
            DType::F16 => half::f16::MAX.to_f64(),
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "f16" | "float16" | "fp16" | "half" => Ok(DType::F16),
            other => Err(format!(
                "unknown dtype `{other}` (expected f32, bf16 or f16)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_idempotent_and_exact_for_representable_values() {
        for dt in DType::ALL {
            for x in [0.0f32, 1.0, -2.5, 0.1, 1e-3, 65504.0] {
                let r = dt.round(x);
                assert_eq!(dt.round(r), r, "{dt} {x}");
                assert!(dt.represents(r));
            }
        }
        assert!(!DType::Bf16.represents(0.1));
        assert!(DType::F32.represents(0.1));
    }

    #[test]
    fn parses_common_spellings() {
        assert_eq!("bfloat16".parse::<DType>().unwrap(), DType::Bf16);
        assert_eq!("fp16".parse::<DType>().unwrap(), DType::F16);
        assert!("int8".parse::<DType>().unwrap_err().contains("int8"));
    }
}
