//! The JSON summary `attn-diff check --format json` writes, as the bot reads it.
//!
//! The JSON is the contract between the harness and the bot, so attn-ci reads it with types
//! of its own rather than linking the harness (and libtorch): the bot's merge and reply steps
//! stay light. `deny_unknown_fields` makes a field added to the harness an error here rather
//! than something a merge silently drops; `tests/contract.rs` round-trips a real run's JSON
//! through these types so such a change fails `cargo test` first. Fields the bot only passes
//! along (mismatch details, shrink statistics) stay untyped JSON values.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSummary {
    pub seed: u64,
    pub cases: u32,
    pub shard: Shard,
    pub deep: bool,
    pub oracle_seconds: f64,
    pub backends: Vec<BackendSummary>,
    pub upstream: Vec<UpstreamRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSummary {
    pub backend: String,
    pub cases_run: usize,
    pub passed: usize,
    pub failed: usize,
    /// Cases the backend declined, by its reason.
    pub unsupported: BTreeMap<String, usize>,
    /// Failed cases by kind (`mismatch`, `non_finite`, `panic`, ...).
    pub divergences: BTreeMap<String, usize>,
    #[serde(deserialize_with = "nullable_f64")]
    pub worst_abs_err: f64,
    #[serde(deserialize_with = "nullable_f64")]
    pub worst_rel_err: f64,
    pub backend_seconds: f64,
    pub wall_seconds: f64,
    pub shared_block_cases: usize,
    /// Cases run (in that shard) up to its first divergence.
    #[serde(default)]
    pub first_divergence_at: Option<usize>,
    pub failures: Vec<FailureReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSize {
    pub sequences: usize,
    pub tokens: usize,
    pub max_seq_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureReport {
    pub backend: String,
    /// Which case failed first: `property case I (seed S)` or an upstream case's label.
    pub origin: String,
    pub kind: String,
    pub message: String,
    pub size: CaseSize,
    /// Path of the replay file as the shard wrote it.
    pub replay: Option<String>,
    pub shrink: Option<Value>,
    pub first: Option<Value>,
    pub worst: Option<Value>,
    pub hint: Option<String>,
    pub heatmap: Option<String>,
    /// The report as `attn-diff` prints it.
    pub text: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamRow {
    pub backend: String,
    pub test: String,
    pub spec: String,
    pub heads: (usize, usize),
    /// `pass`, `unsupported: REASON` or `FAIL (KIND)`.
    pub status: String,
    /// NaN (JSON null) when the case did not run.
    #[serde(deserialize_with = "nullable_f64")]
    pub max_abs_err: f64,
    #[serde(deserialize_with = "nullable_f64")]
    pub max_rel_err: f64,
}

/// serde_json writes a NaN as null; read null back as NaN.
fn nullable_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl CheckSummary {
    /// Read a summary from `attn-diff check --format json` output.
    pub fn from_json(text: &str) -> Result<CheckSummary, serde_json::Error> {
        serde_json::from_str(text)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}
