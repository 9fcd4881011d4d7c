//! `attn-diff check`'s summary: per backend, what ran, what passed, what diverged and how, what
//! was declined (grouped by feature), and the upstream suite's rows.

use crate::coverage::CoverageReport;
use crate::outcome::{CaseSize, DivergenceKind, Mismatch, ShrinkInfo};
use crate::{nullable_f64, schema_version, BackendId};
use attn_reference::{Aspect, Dimension, Space, Unsupported};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One N-th of a run's property cases: case `i` belongs to shard `i % count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    pub fn owns(&self, case_index: usize) -> bool {
        case_index % self.count == self.index
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    /// `I/N` with 0 <= I < N.
    fn from_str(s: &str) -> Result<Self, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("shard `{s}` must look like I/N, e.g. 0/4"))?;
        let index: usize = i
            .trim()
            .parse()
            .map_err(|_| format!("shard index `{i}` is not a number"))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("shard count `{n}` is not a number"))?;
        if count == 0 || index >= count {
            return Err(format!("shard `{s}`: need 0 <= I < N"));
        }
        Ok(Shard { index, count })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSummary {
    #[serde(default = "schema_version")]
    pub schema_version: u32,
    pub seed: u64,
    pub cases: u32,
    pub shard: Shard,
    pub deep: bool,
    /// `--long`: more of the long tier.
    #[serde(default)]
    pub long: bool,
    /// Serving traces (`--traces`), run after the property cases.
    #[serde(default)]
    pub traces: u32,
    /// Invariance pairs (`--pairs`), run after the traces.
    #[serde(default)]
    pub pairs: u32,
    pub oracle_seconds: f64,
    pub backends: Vec<BackendSummary>,
    pub upstream: Vec<UpstreamRow>,
    /// What each backend actually ran, by bucket (absent until a run computes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<CoverageReport>,
    /// `--only`: the space every backend's own was narrowed to (absent: not narrowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only: Option<Space>,
    /// Upstream specs named with `--spec`: each must reach every backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested_specs: Vec<String>,
    /// Why the run stopped before its end (an interrupt, `--max-failures`); absent when it
    /// ran to the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// `--min-run`: cases and traces that must reach every backend.
    #[serde(default = "one")]
    pub min_run: usize,
    /// The verdict policy of the property cases and traces (`--judge`); the upstream suite
    /// keeps vLLM's tolerance.
    #[serde(default)]
    pub judge: attn_reference::Judge,
}

fn one() -> usize {
    1
}

impl CheckSummary {
    pub fn any_divergence(&self) -> bool {
        self.backends.iter().any(|b| b.failed() > 0)
    }

    /// Whether the run passed: no divergence, nothing short ([`CheckSummary::shortfalls`]
    /// at its own `min_run`), not stopped early.
    pub fn passed(&self) -> bool {
        !self.any_divergence() && self.shortfalls(self.min_run).is_empty() && self.stopped.is_none()
    }

    /// One word for the run: `all passed`, `DIVERGENCE`, `NOT TESTED` or `STOPPED`.
    pub fn verdict(&self) -> &'static str {
        if self.any_divergence() {
            "DIVERGENCE"
        } else if !self.shortfalls(self.min_run).is_empty() {
            "NOT TESTED"
        } else if self.stopped.is_some() {
            "STOPPED"
        } else {
            "all passed"
        }
    }

    /// Why this run tested less than it was asked to, one line each: a backend that no
    /// property case, trace, invariance pair or named spec reached although some were sent
    /// (all declined), or that fewer than `min_run` cases, traces and pairs reached in all. A run with any is not a
    /// pass.
    pub fn shortfalls(&self, min_run: usize) -> Vec<Shortfall> {
        let mut out = Vec::new();
        for b in &self.backends {
            let name = &b.backend.name;
            for (part, t) in [
                ("property cases", &b.property),
                ("upstream cases", &b.upstream),
                ("traces", &b.traces),
                ("invariance pairs", &b.pairs),
            ] {
                if t.sent > 0 && t.reached() == 0 {
                    out.push(Shortfall::new(
                        name,
                        format!("ran none of its {} {part}: all were declined", t.sent),
                    ));
                }
            }
            for spec in &self.requested_specs {
                let rows: Vec<&UpstreamRow> = self
                    .upstream
                    .iter()
                    .filter(|r| &r.backend == name && &r.spec == spec)
                    .collect();
                let ran = rows.iter().any(|r| {
                    matches!(
                        r.status,
                        UpstreamStatus::Pass | UpstreamStatus::Diverged { .. }
                    )
                });
                if !rows.is_empty() && !ran {
                    out.push(Shortfall::new(
                        name,
                        format!(
                            "ran none of the {} case(s) of --spec {spec}: {}",
                            rows.len(),
                            rows[0].status
                        ),
                    ));
                }
            }
            // Pairs rerun drawn cases, but a run of pairs alone tested the backend too.
            let reached = b.reached() + b.pairs.reached();
            if reached < min_run {
                out.push(Shortfall::new(
                    name,
                    format!(
                        "{reached} case(s), trace(s) and invariance pair(s) reached it, fewer \
                         than --min-run {min_run}"
                    ),
                ));
            }
        }
        out
    }
}

/// A backend tested less than the run asked ([`CheckSummary::shortfalls`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub backend: String,
    pub message: String,
}

impl Shortfall {
    fn new(backend: &str, message: String) -> Self {
        Shortfall {
            backend: backend.to_string(),
            message,
        }
    }
}

/// "spyre-device: ran none of its 40 property cases: all were declined".
impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.backend, self.message)
    }
}

/// Cases one backend declined for one reason (a feature and a value-free detail), with the
/// distinct values of the cases it declined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnsupportedGroup {
    pub feature: Aspect,
    pub detail: String,
    pub cases: usize,
    /// The declined cases' distinct values (head sizes, dtypes, …); empty for on/off features.
    #[serde(default)]
    pub values: BTreeSet<String>,
}

impl UnsupportedGroup {
    /// The reason in words, without values ("head size not a multiple of 64").
    pub fn reason(&self) -> String {
        Unsupported::new(self.feature, self.detail.clone()).reason()
    }
}

/// "head size not a multiple of 64 (17 sizes)".
impl fmt::Display for UnsupportedGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason())?;
        match self.values.len() {
            0 => Ok(()),
            1 => write!(f, " ({})", self.values.iter().next().unwrap()),
            n => write!(f, " ({n} {})", value_noun(self.feature)),
        }
    }
}

fn value_noun(feature: Aspect) -> &'static str {
    match feature {
        Aspect::Dimension(Dimension::HeadSize | Dimension::BlockSize) => "sizes",
        Aspect::Dimension(Dimension::Dtype) => "dtypes",
        Aspect::Dimension(Dimension::HeadLayout) => "head layouts",
        Aspect::Dimension(
            Dimension::BatchShape
            | Dimension::CacheSize
            | Dimension::Host
            | Dimension::Trace
            | Dimension::Other,
        )
        | Aspect::Feature(_) => "values",
    }
}

/// Where a failure comes from, typed: never a display string to parse or compare.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Origin {
    /// Property case `index` of `seed`.
    Property { seed: u64, index: usize },
    /// A case of vLLM's backend test.
    Upstream {
        test: String,
        spec: String,
        heads: (usize, usize),
    },
    /// Step `step` (of `steps`) of trace `index` of `seed`.
    Trace {
        seed: u64,
        index: usize,
        step: usize,
        steps: usize,
    },
    /// Invariance pair `index` of `seed`: a drawn case and its form under `relation`.
    Invariance {
        seed: u64,
        index: usize,
        relation: attn_reference::relation::Relation,
    },
    /// Call `call` of layer `layer` of a real engine, recorded in `file`.
    Recorded {
        file: String,
        layer: String,
        call: usize,
    },
    /// A replay file (and the step of a trace file).
    Replay {
        file: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<(usize, usize)>,
    },
}

impl Origin {
    /// The part of a check it belongs to (none for a replay).
    pub fn part(&self) -> Option<RunPart> {
        match self {
            Origin::Property { .. } => Some(RunPart::Property),
            Origin::Upstream { .. } => Some(RunPart::Upstream),
            Origin::Trace { .. } => Some(RunPart::Traces),
            Origin::Recorded { .. } => Some(RunPart::Recorded),
            Origin::Invariance { .. } | Origin::Replay { .. } => None,
        }
    }
}

/// "property case 3 (seed 1)", "upstream causal small_decode heads 8/2", "trace 2 (seed 1),
/// step 4 of 9", "FILE".
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Property { seed, index } => write!(f, "property case {index} (seed {seed})"),
            Origin::Upstream { test, spec, heads } => {
                write!(f, "upstream {test} {spec} heads {}/{}", heads.0, heads.1)
            }
            Origin::Trace {
                seed,
                index,
                step,
                steps,
            } => write!(f, "trace {index} (seed {seed}), step {step} of {steps}"),
            Origin::Invariance {
                seed,
                index,
                relation,
            } => write!(f, "invariance pair {index} (seed {seed}, {relation})"),
            Origin::Recorded { file, layer, call } => {
                write!(f, "recorded call {call} of {layer} ({file})")
            }
            Origin::Replay { file, step: None } => f.write_str(file),
            Origin::Replay {
                file,
                step: Some((step, steps)),
            } => write!(f, "{file}, step {step} of {steps}"),
        }
    }
}

/// The parts of a check, each with its own [`Tally`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunPart {
    Property,
    Upstream,
    Traces,
    /// A real engine's recorded attention calls.
    Recorded,
}

impl RunPart {
    pub const ALL: [RunPart; 4] = [
        RunPart::Property,
        RunPart::Upstream,
        RunPart::Traces,
        RunPart::Recorded,
    ];

    /// Words for a person: "property cases", "upstream suite", "traces", "recorded calls".
    pub fn label(self) -> &'static str {
        match self {
            RunPart::Property => "property cases",
            RunPart::Upstream => "upstream suite",
            RunPart::Traces => "traces",
            RunPart::Recorded => "recorded calls",
        }
    }
}

/// What one part of a run (property cases, upstream cases or traces) did on one backend.
/// Every case sent ends in exactly one of passed, failed and declined; tallies of shards add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tally {
    /// Cases (or traces) sent to the backend.
    pub sent: usize,
    pub passed: usize,
    pub failed: usize,
    pub declined: usize,
}

impl Tally {
    pub fn is_empty(&self) -> bool {
        self.sent == 0
    }

    /// Cases that reached the backend: sent, less declined.
    pub fn reached(&self) -> usize {
        self.passed + self.failed
    }

    /// "40 (38 passed, 1 failed, 1 declined)".
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("{} passed", self.passed)];
        if self.failed > 0 {
            parts.push(format!("{} failed", self.failed));
        }
        if self.declined > 0 {
            parts.push(format!("{} declined", self.declined));
        }
        format!("{} ({})", self.sent, parts.join(", "))
    }
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.sent += o.sent;
        self.passed += o.passed;
        self.failed += o.failed;
        self.declined += o.declined;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSummary {
    pub backend: BackendId,
    /// The property cases (small and long tiers).
    pub property: Tally,
    /// The upstream suite's cases inside the backend's space (those outside are `not
    /// declared` rows, never sent).
    pub upstream: Tally,
    /// Serving traces; a trace passes when every step does.
    pub traces: Tally,
    /// A real engine's recorded attention calls (`check --recording`), each judged as one
    /// case.
    #[serde(default, skip_serializing_if = "Tally::is_empty")]
    pub recorded: Tally,
    /// Invariance pairs: a pair fails when a relation the backend declares moved a bit;
    /// one the backend declined or failed a form of is declined here (the property cases
    /// judge such failures). What each relation did is in `invariance`.
    #[serde(default, skip_serializing_if = "Tally::is_empty")]
    pub pairs: Tally,
    /// Steps of traces compared (up to and including a diverging one).
    pub trace_steps: usize,
    /// Declined cases and traces of every part, one group per (feature, detail), most
    /// frequent first.
    pub unsupported: Vec<UnsupportedGroup>,
    pub divergences: BTreeMap<DivergenceKind, usize>,
    /// NaN (JSON null) when nothing was compared.
    #[serde(deserialize_with = "nullable_f64")]
    pub worst_abs_err: f64,
    #[serde(deserialize_with = "nullable_f64")]
    pub worst_rel_err: f64,
    /// Error figures per dtype (NMSE, ulps, the multiple of eager attention's error) over
    /// the property and upstream cases it produced finite output for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub figures: Vec<crate::ErrorFigures>,
    /// Time in the backend's forward calls.
    pub backend_seconds: f64,
    /// Wall time spent on this backend's cases (write + forward + compare).
    pub wall_seconds: f64,
    /// Property cases whose batch shares KV blocks between sequences.
    pub shared_block_cases: usize,
    /// The index of the first property case that diverged (what `--case-index` re-runs).
    #[serde(default)]
    pub first_failing_case: Option<usize>,
    /// The index of the first trace that diverged.
    #[serde(default)]
    pub first_failing_trace: Option<usize>,
    /// The index of the first invariance pair whose declared relation moved a bit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failing_pair: Option<usize>,
    pub failures: Vec<FailureRecord>,
    /// The space this backend's cases and traces were drawn from: what it declares,
    /// narrowed by `--only` (absent: everything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<Space>,
    /// Why the run stopped sending this backend cases (the same failure again and again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gave_up: Option<String>,
    /// Per invariance relation tried: how often it held, and how far rows moved where not
    /// (`crate::invariance`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub invariance: BTreeMap<attn_reference::relation::Relation, crate::invariance::RelationTally>,
}

/// More than this share of a backend's cases declined is worth a warning: its declared space
/// misses something it declines.
pub const DECLINED_WARNING_SHARE: f64 = 0.1;

impl BackendSummary {
    pub fn new(backend: BackendId) -> Self {
        BackendSummary {
            backend,
            ..Default::default()
        }
    }

    /// Count a declined case into its group.
    pub fn add_unsupported(&mut self, u: &Unsupported, cases: usize) {
        let values = u.value.iter().cloned().collect();
        self.add_group(UnsupportedGroup {
            feature: u.feature,
            detail: u.detail.clone(),
            cases,
            values,
        });
    }

    /// Merge a group (from this run or another shard's) into this summary's groups.
    pub fn add_group(&mut self, g: UnsupportedGroup) {
        match self
            .unsupported
            .iter_mut()
            .find(|x| x.feature == g.feature && x.detail == g.detail)
        {
            Some(x) => {
                x.cases += g.cases;
                x.values.extend(g.values);
            }
            None => self.unsupported.push(g),
        }
        self.unsupported.sort_by(|a, b| {
            b.cases
                .cmp(&a.cases)
                .then(a.feature.cmp(&b.feature))
                .then(a.detail.cmp(&b.detail))
        });
    }

    /// "3 (2 mismatch, 1 panic)", or "0".
    pub fn failed_by_kind(&self) -> String {
        if self.failed() == 0 {
            return "0".into();
        }
        let kinds: Vec<String> = self
            .divergences
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        format!("{} ({})", self.failed(), kinds.join(", "))
    }

    pub fn unsupported_cases(&self) -> usize {
        self.unsupported.iter().map(|g| g.cases).sum()
    }

    /// The tally of one part.
    pub fn tally(&self, part: RunPart) -> Tally {
        match part {
            RunPart::Property => self.property,
            RunPart::Upstream => self.upstream,
            RunPart::Traces => self.traces,
            RunPart::Recorded => self.recorded,
        }
    }

    /// The tally of one part, to count into.
    pub fn tally_mut(&mut self, part: RunPart) -> &mut Tally {
        match part {
            RunPart::Property => &mut self.property,
            RunPart::Upstream => &mut self.upstream,
            RunPart::Traces => &mut self.traces,
            RunPart::Recorded => &mut self.recorded,
        }
    }

    /// Every part's tally together.
    pub fn total(&self) -> Tally {
        let mut t = self.property;
        t += self.upstream;
        t += self.traces;
        t += self.recorded;
        t
    }

    /// Cases, traces and invariance pairs that failed, every part together. (Pairs rerun
    /// drawn cases, so what reached a backend counts cases and traces only.)
    pub fn failed(&self) -> usize {
        self.total().failed + self.pairs.failed
    }

    /// Cases and traces sent to this backend, declined ones included.
    pub fn drawn(&self) -> usize {
        self.total().sent
    }

    /// Cases and traces that really reached it (sent, less declined).
    pub fn reached(&self) -> usize {
        self.total().reached()
    }

    /// Whether more than [`DECLINED_WARNING_SHARE`] of what was drawn was declined.
    pub fn declined_too_often(&self) -> bool {
        self.unsupported_cases() as f64 > DECLINED_WARNING_SHARE * self.drawn() as f64
    }

    /// Cases reaching the backend per second of wall time; None when none did.
    pub fn cases_per_second(&self) -> Option<f64> {
        let n = self.property.reached() + self.upstream.reached();
        (n > 0 && self.wall_seconds > 0.0).then(|| n as f64 / self.wall_seconds)
    }
}

/// One upstream case on one backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum UpstreamStatus {
    Pass,
    Unsupported {
        reason: Unsupported,
    },
    Diverged {
        kind: DivergenceKind,
    },
    /// Outside the space the backend is checked in (what it declares, narrowed by
    /// `--only`): not sent to it, and not counted among its cases.
    NotDeclared {
        reason: Unsupported,
    },
}

impl fmt::Display for UpstreamStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamStatus::Pass => f.write_str("pass"),
            UpstreamStatus::Unsupported { reason } => write!(f, "unsupported: {reason}"),
            UpstreamStatus::Diverged { kind } => write!(f, "FAIL ({kind})"),
            UpstreamStatus::NotDeclared { reason } => write!(f, "not declared: {reason}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamRow {
    pub backend: String,
    pub test: String,
    pub spec: String,
    pub heads: (usize, usize),
    pub status: UpstreamStatus,
    /// NaN (JSON null) when the case did not run to a comparison.
    #[serde(deserialize_with = "nullable_f64")]
    pub max_abs_err: f64,
    #[serde(deserialize_with = "nullable_f64")]
    pub max_rel_err: f64,
}

/// A divergence, reported: the (shrunk) case's size, where it diverged, a hint, the replay
/// file that reproduces it, and the report as printed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureRecord {
    pub backend: String,
    /// Which case of the run failed first (before shrinking); its `Display` is how reports
    /// name it, its equality is what a shard merge keeps one of.
    pub origin: Origin,
    pub kind: DivergenceKind,
    pub message: String,
    pub size: CaseSize,
    /// Where the replay file is (or will be, once artifacts are written).
    pub replay: Option<String>,
    pub shrink: Option<ShrinkInfo>,
    pub first: Option<Mismatch>,
    pub worst: Option<Mismatch>,
    pub hint: Option<String>,
    /// The error heat map, when one is drawn.
    pub heatmap: Option<String>,
    /// The hint of the case as found, before shrinking, when it differs from `hint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_unshrunk: Option<String>,
    /// The tolerance the comparison applied (absent when there was no output to compare).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<attn_reference::Tolerance>,
    /// The verdict policy that chose that tolerance, when it was not the default
    /// (`--judge ladder`); the upstream suite always keeps vLLM's tolerance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<attn_reference::Judge>,
    /// Other cases that failed the very same way (kind and message), folded into this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
    /// The `--external NAME=COMMAND` flag that declared the backend, when it was given on
    /// the command line: the replay command needs it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<String>,
    /// Environment variables the backend declared as changing what it runs, with their
    /// values: the replay command sets them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub environment: std::collections::BTreeMap<String, String>,
    /// What the backend says a person should know about this failure beyond the numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
    /// The failures of the run that fell in this failure's class (this one included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<FailureClass>,
    /// The report as `attn-diff` prints it (for people; never parsed).
    pub text: String,
}

/// One class of failures: what sets it apart from the run's other failures, and which
/// property cases and traces fell in it (the reported one is its representative).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureClass {
    /// The class's signature, in words (kind, severity, pattern, features).
    pub signature: String,
    /// Property case indices in the class, in run order.
    #[serde(default)]
    pub cases: Vec<usize>,
    /// Trace indices in the class, in run order.
    #[serde(default)]
    pub traces: Vec<usize>,
    /// Invariance pair indices in the class, in run order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<usize>,
    /// Upstream case indices in the class (in the run's suite), in run order; their labels
    /// beside the reported one are the failure's `also`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<usize>,
    /// Recorded engine calls in the class (indices in the recording, file-name order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recorded: Vec<usize>,
}

impl FailureClass {
    /// Cases, traces, invariance pairs, upstream cases and recorded calls in the class.
    pub fn count(&self) -> usize {
        self.cases.len()
            + self.traces.len()
            + self.pairs.len()
            + self.upstream.len()
            + self.recorded.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::Feature;

    #[test]
    fn declined_cases_group_by_reason_not_by_value() {
        let mut b = BackendSummary::new(BackendId::builtin("spyre-device"));
        for d in [80, 96, 80, 160] {
            let u = Unsupported::new(Dimension::HeadSize, "not a multiple of 64").value(d);
            b.add_unsupported(&u, 1);
        }
        b.add_unsupported(
            &Unsupported::new(Dimension::Dtype, "other than fp16").value("bf16"),
            1,
        );
        assert_eq!(b.unsupported.len(), 2);
        assert_eq!(b.unsupported_cases(), 5);
        assert_eq!(
            b.unsupported[0].to_string(),
            "head size not a multiple of 64 (3 sizes)"
        );
        assert_eq!(b.unsupported[1].to_string(), "dtype other than fp16 (bf16)");
    }

    #[test]
    fn upstream_status_is_tagged_json() {
        let s = UpstreamStatus::Unsupported {
            reason: Unsupported::new(Feature::Alibi, ""),
        };
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"outcome": "unsupported", "reason": {"feature": "alibi", "detail": ""}})
        );
        assert_eq!(serde_json::from_value::<UpstreamStatus>(json).unwrap(), s);
        assert_eq!(s.to_string(), "unsupported: ALiBi");
    }

    #[test]
    fn shards_parse_and_partition() {
        let s: Shard = "1/3".parse().unwrap();
        assert!(s.owns(4) && !s.owns(3));
        for bad in ["3/3", "1", "x/2", "0/0"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
