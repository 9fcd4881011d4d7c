//! `attn-diff bench`'s summary: one row per backend and spec, timed side by side.

use crate::{nullable_f64, schema_version, BackendId};
use attn_reference::Unsupported;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Whether a row's time means anything: only a backend whose warm-up output matched the
/// oracle is fast rather than wrong.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BenchStatus {
    Ok,
    /// The warm-up output diverged from the oracle; the time is still measured and shown.
    Wrong {
        mismatches: usize,
        #[serde(deserialize_with = "crate::nullable_f64")]
        max_abs_err: f64,
    },
    Unsupported {
        reason: Unsupported,
    },
    Error {
        message: String,
    },
}

impl BenchStatus {
    /// A wrong answer or an error: the bench run fails.
    pub fn is_failure(&self) -> bool {
        matches!(self, BenchStatus::Wrong { .. } | BenchStatus::Error { .. })
    }

    /// Whether timed calls run for this row.
    pub fn is_timed(&self) -> bool {
        matches!(self, BenchStatus::Ok | BenchStatus::Wrong { .. })
    }
}

impl fmt::Display for BenchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchStatus::Ok => f.write_str("ok"),
            BenchStatus::Wrong {
                mismatches,
                max_abs_err,
            } => write!(
                f,
                "WRONG ({mismatches} values off, max abs err {max_abs_err:.2e})"
            ),
            BenchStatus::Unsupported { reason } => write!(f, "unsupported: {reason}"),
            BenchStatus::Error { message } => write!(f, "error: {message}"),
        }
    }
}

/// (No `deny_unknown_fields`: serde does not support it beside a flattened field.)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// The backend, with the KV cache of an FP8 variant.
    pub backend: BackendId,
    pub spec: String,
    #[serde(flatten)]
    pub status: BenchStatus,
    /// NaN (null) for rows that were not timed, here and below.
    #[serde(deserialize_with = "nullable_f64")]
    pub median_ms: f64,
    #[serde(deserialize_with = "nullable_f64")]
    pub min_ms: f64,
    #[serde(deserialize_with = "nullable_f64")]
    pub tokens_per_s: f64,
    /// KV bytes the call must read (every visible K and V once) per second of median time.
    #[serde(deserialize_with = "nullable_f64")]
    pub kv_gb_per_s: f64,
    /// `kv_gb_per_s` over the measured read bandwidth (decode specs are bandwidth-bound).
    #[serde(deserialize_with = "nullable_f64")]
    pub fraction_of_bandwidth: f64,
    /// Peak resident memory added by one call, MiB.
    #[serde(deserialize_with = "nullable_f64")]
    pub peak_extra_mib: f64,
    /// median / baseline's median on the same spec.
    pub ratio_to_baseline: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchSummary {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub threads: usize,
    pub reps: usize,
    /// Caches evicted before every timed call.
    pub cold: bool,
    pub dtype: String,
    pub heads: (usize, usize),
    pub head_size: usize,
    /// V's width in an MLA run (`--mla`: one latent head, V its first 512 dims).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla_head_size_v: Option<usize>,
    pub block_size: usize,
    pub read_bandwidth_gb_per_s: f64,
    pub baseline: Option<String>,
    pub rows: Vec<BenchRow>,
}

impl BenchSummary {
    /// No row is wrong or an error.
    pub fn all_ok(&self) -> bool {
        !self.rows.iter().any(|r| r.status.is_failure())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::Dimension;

    #[test]
    fn the_status_is_a_tagged_field_of_the_row() {
        let row = BenchRow {
            backend: BackendId::builtin("cpu"),
            spec: "small_decode".into(),
            status: BenchStatus::Unsupported {
                reason: Unsupported::new(Dimension::Dtype, "other than fp16").value("bf16"),
            },
            median_ms: f64::NAN,
            min_ms: f64::NAN,
            tokens_per_s: f64::NAN,
            kv_gb_per_s: f64::NAN,
            fraction_of_bandwidth: f64::NAN,
            peak_extra_mib: f64::NAN,
            ratio_to_baseline: None,
        };
        let json = serde_json::to_value(&row).unwrap();
        assert_eq!(json["status"], "unsupported");
        assert_eq!(json["reason"]["feature"], "dtype");
        let back: BenchRow = serde_json::from_value(json).unwrap();
        assert_eq!(back.status, row.status);
        assert!(!back.status.is_failure() && !back.status.is_timed());
        let wrong = BenchStatus::Wrong {
            mismatches: 3,
            max_abs_err: 0.5,
        };
        assert!(wrong.is_failure() && wrong.is_timed());
    }
}
