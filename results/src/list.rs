//! `attn-diff list --format json`: the backends with what each declines, the declared
//! adapters, and the named specs.

use crate::schema_version;
use attn_reference::Unsupported;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListDocument {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub backends: Vec<BackendEntry>,
    pub adapters: Vec<AdapterEntry>,
    pub specs: Vec<SpecEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendEntry {
    pub name: String,
    pub cache_shape: String,
    pub cache_description: String,
    /// The probes of the optional features (`Feature::ALL`) the backend accepts, e.g.
    /// "sliding window", "KV cache fp8_e4m3".
    #[serde(default)]
    pub runs: Vec<String>,
    /// Each probe the backend declines: what was asked, and its answer.
    pub declines: Vec<Declined>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declined {
    pub probe: String,
    pub reason: Unsupported,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterEntry {
    /// As `--backend` names it: `external:NAME`.
    pub name: String,
    pub command: Vec<String>,
    pub timeout_seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecEntry {
    pub name: String,
    pub kind: String,
    pub seq_lens: Vec<usize>,
    pub query_lens: Vec<usize>,
}
