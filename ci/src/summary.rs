//! The summary `attn-diff check --format json` writes is `attn-results`' [`CheckSummary`]: the
//! bot reads the harness's own types (no mirror, no libtorch), checked by `schema_version`.

pub use attn_results::{
    BackendSummary, CheckSummary, FailureRecord, Shard, UnsupportedGroup, UpstreamRow,
    UpstreamStatus,
};

/// Read a summary from `attn-diff check --format json` output (of this schema version).
pub fn from_json(text: &str) -> Result<CheckSummary, attn_results::ReadError> {
    attn_results::from_json(text)
}

/// The summary as JSON, as the harness writes it.
pub fn to_json(s: &CheckSummary) -> String {
    attn_results::to_json(s)
}
