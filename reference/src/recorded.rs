//! Where a replay file came from, kept in the file so it is self-contained: the backend it
//! diverged on (and the `--external` flag that declared an adapter given on the command
//! line), the run's origin, seed and `--only`, the tolerance applied and the outcome seen.
//! `attn-diff replay FILE` runs the recorded backend when none is named.

use crate::Space;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recorded {
    /// The backend as `--backend` names it (`cpu`, `external:NAME`).
    pub backend: String,
    /// The `--external NAME=COMMAND` flag that declared the adapter, when it was given on the
    /// command line (an adapter of attn-diff.toml needs none). Replay never runs it by
    /// itself: a replay file is data, and its command is shown for a person to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<String>,
    /// Environment variables the backend declared as changing what it runs, with the
    /// values the failing run had: replay warns where this environment differs.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub environment: std::collections::BTreeMap<String, String>,
    /// Which case of the run it was: `property case 3 (seed 1)`, `trace 2 (seed 1)`, or an
    /// upstream case's label.
    pub origin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// `--only`, when the run was narrowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only: Option<Space>,
    /// The tolerance the comparison applied (of the diverging step, for a trace).
    pub atol: f64,
    pub rtol: f64,
    /// The verdict policy that chose it, when not the default (`--judge ladder`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<crate::Judge>,
    /// What was seen: a divergence kind (`mismatch`, `panic`, …).
    pub outcome: String,
    /// For an invariance pair's file: the form the case's rows were compared with (replay
    /// runs both and compares them bit for bit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<crate::relation::PairOf>,
}
