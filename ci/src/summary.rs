//! The summary `attn-diff check --format json` writes is `attn-results`' [`CheckSummary`]: the
//! bot reads the harness's own types (no mirror, no libtorch), checked by `schema_version`.

/// Read and write them with `attn_results::from_json` (which checks the version) and
/// `attn_results::to_json`.
pub use attn_results::{
    BackendSummary, CheckSummary, FailureRecord, Shard, UnsupportedGroup, UpstreamRow,
    UpstreamStatus,
};
