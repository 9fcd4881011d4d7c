//! `attn-diff mutants`: what the harness catches, one row per deliberately wrong backend.

use crate::outcome::CaseSize;
use crate::schema_version;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MutantRow {
    /// The backend's name (`mutant:<name>`, what `--backend` takes).
    pub mutant: String,
    pub description: String,
    /// It only breaks across the steps of a trace (single-step cases cannot kill it).
    #[serde(default)]
    pub trace_only: bool,
    /// The public bug it reproduces (repository and issue or pull request), if any.
    #[serde(default)]
    pub public_bug: Option<String>,
    pub killed: bool,
    /// Property cases run up to the first divergence.
    pub cases_to_kill: Option<usize>,
    /// Traces run up to the first diverging one (after all property cases; a mutant a
    /// property case killed runs none).
    #[serde(default)]
    pub traces_to_kill: Option<usize>,
    /// Invariance pairs run up to the first whose declared relation moved a bit (pairs run
    /// after the traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs_to_kill: Option<usize>,
    pub seconds: f64,
    pub shrunk: Option<CaseSize>,
    /// The hint of the first failure's report (of the shrunk case): what a person is told
    /// to check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Killed by the upstream suite alone (its specs, its 1e-2 tolerance).
    pub killed_by_upstream: bool,
    /// The first upstream case that killed it.
    pub upstream_killer: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MutantsSummary {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub cases: u32,
    /// Traces each mutant runs after its property cases, when none of them killed it.
    #[serde(default)]
    pub traces: u32,
    pub seed: u64,
    pub upstream_cases: usize,
    pub rows: Vec<MutantRow>,
}

impl MutantsSummary {
    pub fn all_killed(&self) -> bool {
        self.rows.iter().all(|r| r.killed)
    }
}
