//! # attn-results
//!
//! attn-diff's results as typed data, one model for every producer and consumer: the harness
//! fills it (without I/O), its renderers (text, markdown, JSON) and artifact writers read it,
//! and the pull-request bot (`attn-ci`) merges and replies from the same types. Nothing here
//! is a display string meant to be parsed back.
//!
//! Every JSON document carries [`SCHEMA_VERSION`]; a reader refuses another version.

pub mod backend_id;
pub mod backend_ref;
pub mod bench;
pub mod check;
pub mod check_view;
pub mod compare;
pub mod coverage;
pub mod figures;
pub mod invariance;
pub mod list;
pub mod markdown;
pub mod mutants;
pub mod outcome;
pub mod pairs;
pub mod precision;
pub mod triples;

pub use backend_id::{BackendId, BackendRole};
pub use backend_ref::BackendRef;
pub use bench::{BenchRow, BenchStatus, BenchSummary};
pub use check::{
    BackendSummary, CheckSummary, FailureClass, FailureRecord, Origin, RunPart, Shard, Tally,
    UnsupportedGroup, UpstreamRow, UpstreamStatus,
};
pub use coverage::CoverageReport;
pub use figures::{CaseFigures, ErrorFigures};
pub use list::{AdapterEntry, BackendEntry, Declined, ListDocument, SpecEntry};
pub use mutants::{MutantRow, MutantsSummary};
pub use outcome::{CaseSize, DivergenceKind, Mismatch, ShrinkInfo, ShrinkLimits};

/// The version of every JSON document attn-diff writes. Raised when a field changes meaning
/// or disappears; a reader of another version refuses rather than misreads.
pub const SCHEMA_VERSION: u32 = 4;

/// serde's default for `schema_version` fields.
pub fn schema_version() -> u32 {
    SCHEMA_VERSION
}

/// A document read with the wrong `schema_version`, or malformed.
#[derive(Debug)]
pub enum ReadError {
    Json(serde_json::Error),
    Version { found: u64 },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Json(e) => write!(f, "malformed attn-diff JSON: {e}"),
            ReadError::Version { found } => write!(
                f,
                "attn-diff JSON has schema_version {found}; this build reads {SCHEMA_VERSION}"
            ),
        }
    }
}

impl std::error::Error for ReadError {}

/// Read a document of this schema version: the version is checked before the fields, so an
/// old or new document is named as such rather than as a missing field.
pub fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ReadError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ReadError::Json)?;
    let found = value
        .get("schema_version")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    if found != u64::from(SCHEMA_VERSION) {
        return Err(ReadError::Version { found });
    }
    serde_json::from_value(value).map_err(ReadError::Json)
}

/// Pretty JSON of a document (NaN becomes null, as serde_json writes it).
pub fn to_json<T: serde::Serialize>(doc: &T) -> String {
    serde_json::to_string_pretty(doc)
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot serialize: {e}\"}}"))
}

/// serde_json writes a NaN (or an infinity) as null; read null back as NaN.
pub(crate) fn nullable_f64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    use serde::Deserialize;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_of_another_schema_is_refused_by_name() {
        // Version 2 counted property, upstream and trace outcomes together (`cases_run`,
        // `passed`, `failed`); version 3 keeps a tally per part.
        let old = r#"{"schema_version": 2, "seed": 1, "cases": 1, "shard": {"index": 0, "count": 1},
            "deep": false, "oracle_seconds": 0, "backends": [{"backend": "cpu", "cases_run": 1,
            "passed": 1, "failed": 0}], "upstream": []}"#;
        let e = from_json::<CheckSummary>(old).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("attn-diff JSON has schema_version 2; this build reads {SCHEMA_VERSION}")
        );
        // Version 3 named a backend by a string whose prefix told a mutant; version 4's
        // `backend` is a `BackendId` with its role.
        let v3 = r#"{"schema_version": 3, "seed": 1, "cases": 1, "shard": {"index": 0, "count": 1},
            "deep": false, "oracle_seconds": 0, "backends": [{"backend": "mutant:x"}], "upstream": []}"#;
        assert_eq!(
            from_json::<CheckSummary>(v3).unwrap_err().to_string(),
            format!("attn-diff JSON has schema_version 3; this build reads {SCHEMA_VERSION}")
        );
        let none = r#"{"seed": 1}"#;
        assert!(from_json::<CheckSummary>(none)
            .unwrap_err()
            .to_string()
            .contains("schema_version 0"));
        // Its own documents round-trip.
        let s = CheckSummary {
            schema_version: SCHEMA_VERSION,
            seed: 3,
            cases: 1,
            shard: Shard::ALL,
            deep: false,
            long: false,
            traces: 0,
            pairs: 0,
            oracle_seconds: 0.0,
            backends: vec![BackendSummary::new(BackendId::builtin("cpu"))],
            upstream: vec![],
            coverage: None,
            only: None,
            requested_specs: vec![],
            stopped: None,
            min_run: 1,
            judge: attn_reference::Judge::Tolerance,
        };
        let back: CheckSummary = from_json(&to_json(&s)).unwrap();
        assert_eq!(back.backends[0].backend, BackendId::builtin("cpu"));
        assert_eq!(back.seed, 3);
    }
}
