//! The coverage report's place in the model: per backend, how many cases it actually ran in
//! each bucket of each dimension (dtype, head-size class, …), declined cases excluded.

use attn_reference::Feature;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub use crate::pairs::{
    invalid_pairs, pair_factors, pair_key, pair_lines, pair_rows, pair_summary, PairSummary,
    INVALID_PAIRS,
};

/// The dimensions with fixed buckets (the `features` dimension comes from the feature list:
/// [`dimensions`]).
pub const DIMENSIONS: &[(&str, &[&str])] = &[
    ("dtype", &["f32", "bf16", "f16"]),
    ("kv cache", &["compute dtype", "fp8_e4m3", "fp8_e5m2"]),
    (
        "head size",
        &[
            "1-8",
            "d%8≠0",
            "d%16=8",
            "d%32=16",
            "d%64=32",
            "64k up to 256",
            "64k above 256",
        ],
    ),
    ("block size", &["1", "2-15", "16-64", "65-128", "above 128"]),
    ("heads", &["single", "MHA", "MQA", "GQA 2-4", "GQA above 4"]),
    // Query heads per kv head, and query heads in all (models run up to 128 of each).
    ("group size", &["1", "2-8", "9-16", "17-64", "65-128"]),
    ("query heads", &["1-8", "9-32", "33-128"]),
    ("scale", &["default", "custom"]),
    (
        "window",
        &["none", "1", "inside the sequence", "past the sequence"],
    ),
    (
        "longest sequence",
        &["1-16", "17-256", "257-4096", "4097-16384", "above 16384"],
    ),
    ("longest query", &["1", "2-8", "9-64", "above 64"]),
    ("sequences", &["1", "2-8", "9-64", "65-512", "above 512"]),
    // Tokens in the step (real and padding), what a launch grid is sized by.
    (
        "step tokens",
        &["1-64", "65-1024", "1025-8192", "above 8192"],
    ),
    // Steps of decodes only, plain (one token each) or speculative (2 to 8), by their size:
    // decode paths are launched on grids sized for a CUDA graph's batch.
    (
        "decode-only step",
        &[
            "has a prefill",
            "plain, up to 8192 tokens",
            "plain, above 8192 tokens",
            "speculative, up to 8192 tokens",
            "speculative, above 8192 tokens",
        ],
    ),
    // Decodes (query_len 1) and prefills of the batch, and whether decodes come first as
    // vLLM's scheduler orders them.
    (
        "batch composition",
        &[
            "all decode",
            "all prefill",
            "mixed, decodes first",
            "mixed, other order",
        ],
    ),
    // The largest |scale · q·k| of any query against a key it sees.
    (
        "logit magnitude",
        &["below 1e2", "1e2 to 1e4", "1e4 to 1e5", "above 1e5"],
    ),
    // The largest unscaled |q·k|: past 65504 a q·k held in f16 is infinite.
    ("unscaled q·k", &["within f16 range", "past f16 range"]),
    // How far apart the row maxima of one sequence's query rows (one head) lie: a kernel
    // that reuses one row's max for a query tile overflows or underflows past ~88.
    ("row maxima spread", &["at most 100", "above 100"]),
    // The same within a sequence of more than 64 query rows (half a 128-row query tile).
    (
        "wide chunk spread",
        &["no chunk past 64 rows", "at most 100", "above 100"],
    ),
    (
        "cache elements",
        &["below 2^20", "2^20 to 2^31", "above 2^31"],
    ),
    ("table order", &["ascending", "descending", "mixed"]),
    ("sharing", &["shared blocks", "none"]),
    // The most sequences one physical block serves: a crowd behind one prefix takes the
    // shared-prefix (cascade) paths of kernels that have one.
    ("prefix sharers", &["none", "2-4", "5-16", "above 16"]),
    // A decode spanning 3 pages or more, by block class and dtype: a kernel whose tiles per
    // page are floored misreads every page's tail, seen only over several pages.
    (
        "long decode pages",
        &[
            "no decode past 2 pages",
            "blocks up to 64 · f32",
            "blocks up to 64 · bf16",
            "blocks up to 64 · f16",
            "blocks past 64, ×64 · f32",
            "blocks past 64, ×64 · bf16",
            "blocks past 64, ×64 · f16",
            "blocks past 64, not ×64 · f32",
            "blocks past 64, not ×64 · bf16",
            "blocks past 64, not ×64 · f16",
        ],
    ),
    // The head group of a step with decodes: past 16 and not a multiple of 16 over 2+ kv
    // heads, a 16-head tile crosses a group boundary on the decode path.
    (
        "group at decode",
        &[
            "no decode",
            "up to 16",
            "past 16, 1 kv head",
            "past 16, ×16, 2+ kv heads",
            "past 16, not ×16, 2+ kv heads",
        ],
    ),
    // The invariance relation a pair was judged under (`attn_reference::relation`).
    (
        "invariance relation",
        &["batch", "order", "chunking", "placement", "repetition"],
    ),
    ("padding", &["padding tokens", "none"]),
    // What unwritten slots and padding rows hold (`attn_reference::Poison`).
    ("poison", &["none", "nan", "+inf", "-inf", "huge"]),
    // Multi-head latent attention: V's width against K's and the longest sequence against
    // DeepSeek's 576-wide entry (where V rows stepped by V's width have drifted one entry),
    // and the query heads over the one latent head.
    (
        "mla",
        &[
            "none",
            "Dk = Dv",
            "Dk ≠ Dv, up to 576 keys",
            "Dk ≠ Dv, past 576 keys",
        ],
    ),
    ("mla heads", &["none", "1-8", "9-64", "65-128"]),
    // Traces (counted per trace, not per case).
    ("trace steps", &["1-8", "9-24", "above 24"]),
    // A model's attention layout on every step (heads, kv heads, head size), or drawn ones.
    ("trace layout", &["drawn", "a model's"]),
    ("trace poison", &["none", "nan", "+inf", "-inf", "huge"]),
    (
        "trace events",
        &[
            "freed block reused",
            "prefix hit",
            "preemption",
            "chunked prefill",
            "decode into a new block",
            // A window or local chunk left a block behind (the null block in its table, as
            // vLLM frees it), and another sequence rewrote it while the first still ran.
            "block skipped",
            "skipped block rewritten",
        ],
    ),
];

/// Every dimension with its buckets, as reports show them: [`DIMENSIONS`], the shape factors
/// of [`crate::triples::FACTORS`] after the block size, with `features`
/// (one bucket per optional feature of `attn_reference::Feature`, and `none`) after the window.
pub fn dimensions() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut dims: Vec<(&'static str, Vec<&'static str>)> =
        DIMENSIONS.iter().map(|(d, b)| (*d, b.to_vec())).collect();
    // The shape factors of the three-way table after the block size (the dtype is its own).
    let at = dims
        .iter()
        .position(|(d, _)| *d == "block size")
        .map_or(dims.len(), |i| i + 1);
    let shapes = crate::triples::FACTORS[1..]
        .iter()
        .map(|(d, b)| (*d, b.to_vec()));
    dims.splice(at..at, shapes);
    let features = std::iter::once("none")
        .chain(Feature::ALL.iter().map(|f| f.label()))
        .collect();
    let at = dims
        .iter()
        .position(|(d, _)| *d == "window")
        .map_or(0, |i| i + 1);
    dims.insert(at, ("features", features));
    // Traces are decoder steps of ordinary attention: their features are the config's and
    // the requests' masks, but no kind, padded request or MLA.
    let trace_features = std::iter::once("none")
        .chain(
            Feature::ALL
                .iter()
                .filter(|f| {
                    ![
                        Feature::EncoderOnly,
                        Feature::CrossAttention,
                        Feature::PaddedRequests,
                    ]
                    .contains(f)
                })
                .map(|f| f.label()),
        )
        .collect();
    let at = dims
        .iter()
        .position(|(d, _)| *d == "trace poison")
        .map_or(dims.len(), |i| i + 1);
    dims.insert(at, ("trace features", trace_features));
    // A half dtype with a positional feature past the length where its positions round.
    let precision = std::iter::once("none")
        .chain(crate::precision::buckets().iter().copied())
        .collect();
    let at = dims
        .iter()
        .position(|(d, _)| *d == "features")
        .map_or(dims.len(), |i| i + 1);
    dims.insert(at, ("precision", precision));
    dims
}

/// Cases run, by backend, then dimension, then bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoverageReport {
    pub backends: BTreeMap<String, BTreeMap<String, BTreeMap<String, usize>>>,
    /// Buckets outside the space a backend declares (by backend, then dimension): no case
    /// of them was drawn for it, and none should be; not gaps.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub not_declared: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Cases run per pair of factors (features and shape classes, [`pair_factors`]), by
    /// backend, then pair ([`pair_key`]); pairs never met are absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pairs: BTreeMap<String, BTreeMap<String, usize>>,
    /// Cases run per triple of shape factors ([`crate::triples::FACTORS`]), by backend, then
    /// triple; triples never met are absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub triples: BTreeMap<String, BTreeMap<String, usize>>,
}

/// What a table cell shows for a bucket outside the backend's declared space.
pub const NOT_DECLARED: &str = "not declared";

impl CoverageReport {
    /// Count one case that `backend` ran, in `bucket` of `dimension`.
    pub fn count(&mut self, backend: &str, dimension: &str, bucket: &str) {
        *self
            .backends
            .entry(backend.to_string())
            .or_default()
            .entry(dimension.to_string())
            .or_default()
            .entry(bucket.to_string())
            .or_default() += 1;
    }

    /// Mark `bucket` of `dimension` as outside `backend`'s declared space.
    pub fn mark_not_declared(&mut self, backend: &str, dimension: &str, bucket: &str) {
        self.not_declared
            .entry(backend.to_string())
            .or_default()
            .entry(dimension.to_string())
            .or_default()
            .insert(bucket.to_string());
    }

    /// Whether `bucket` of `dimension` is outside `backend`'s declared space.
    pub fn is_not_declared(&self, backend: &str, dimension: &str, bucket: &str) -> bool {
        self.not_declared
            .get(backend)
            .and_then(|d| d.get(dimension))
            .is_some_and(|b| b.contains(bucket))
    }

    /// Count one case that `backend` ran in every pair of the factors its `buckets` hold.
    pub fn count_pairs(&mut self, backend: &str, buckets: &[(&str, &str)]) {
        let factors = crate::pairs::factors_of(buckets);
        if factors.len() < 2 {
            return;
        }
        let counts = self.pairs.entry(backend.to_string()).or_default();
        for (i, a) in factors.iter().enumerate() {
            for b in &factors[i + 1..] {
                *counts.entry(pair_key(a, b)).or_default() += 1;
            }
        }
    }

    /// Add another shard's counts (the declared spaces are the same in every shard).
    pub fn merge(&mut self, other: &CoverageReport) {
        for (backend, pairs) in &other.pairs {
            let mine = self.pairs.entry(backend.clone()).or_default();
            for (pair, n) in pairs {
                *mine.entry(pair.clone()).or_default() += n;
            }
        }
        for (backend, triples) in &other.triples {
            let mine = self.triples.entry(backend.clone()).or_default();
            for (triple, n) in triples {
                *mine.entry(triple.clone()).or_default() += n;
            }
        }
        for (backend, dims) in &other.not_declared {
            for (dim, buckets) in dims {
                for b in buckets {
                    self.mark_not_declared(backend, dim, b);
                }
            }
        }
        for (backend, dims) in &other.backends {
            for (dim, buckets) in dims {
                for (bucket, n) in buckets {
                    *self
                        .backends
                        .entry(backend.clone())
                        .or_default()
                        .entry(dim.clone())
                        .or_default()
                        .entry(bucket.clone())
                        .or_default() += n;
                }
            }
        }
    }

    /// The buckets inside `backend`'s declared space that it ran no case in: its gaps.
    pub fn uncovered(&self, backend: &str) -> Vec<(&'static str, &'static str)> {
        let counts = self.backends.get(backend);
        dimensions()
            .into_iter()
            .flat_map(|(dim, buckets)| buckets.into_iter().map(move |b| (dim, b)))
            .filter(|(dim, b)| {
                !self.is_not_declared(backend, dim, b)
                    && counts
                        .and_then(|c| c.get(*dim))
                        .and_then(|c| c.get(*b))
                        .is_none_or(|&n| n == 0)
            })
            .collect()
    }

    /// How many of the coverage table's buckets lie outside `backend`'s declared space
    /// (marks of other factors, which the pairs and triples read, are not buckets here: a
    /// backend that declines everything once read "159 of 156 buckets empty").
    pub fn not_declared_count(&self, backend: &str) -> usize {
        dimensions()
            .into_iter()
            .flat_map(|(dim, buckets)| buckets.into_iter().map(move |b| (dim, b)))
            .filter(|(dim, b)| self.is_not_declared(backend, dim, b))
            .count()
    }
}

/// The report as table rows: one per declared (dimension, bucket), a count per backend in
/// `backends` order ("0" where a backend ran none). Shared by every renderer.
pub fn rows(report: &CoverageReport, backends: &[String]) -> Vec<Vec<String>> {
    dimensions()
        .into_iter()
        .flat_map(|(dim, buckets)| buckets.into_iter().map(move |b| (dim, b)))
        .map(|(dim, bucket)| {
            let mut row = vec![dim.to_string(), bucket.to_string()];
            row.extend(backends.iter().map(|name| {
                if report.is_not_declared(name, dim, bucket) {
                    return NOT_DECLARED.to_string();
                }
                report
                    .backends
                    .get(name)
                    .and_then(|d| d.get(dim))
                    .and_then(|b| b.get(bucket))
                    .copied()
                    .unwrap_or(0)
                    .to_string()
            }));
            row
        })
        .collect()
}

/// One line per backend: every bucket covered, or which are empty.
pub fn summary_lines(report: &CoverageReport, backends: &[String]) -> Vec<String> {
    let total: usize = dimensions().iter().map(|(_, b)| b.len()).sum();
    backends
        .iter()
        .map(|name| {
            let empty = report.uncovered(name);
            let outside = report.not_declared_count(name);
            let total = total - outside;
            let undeclared = if outside > 0 {
                format!("; {outside} bucket(s) not declared")
            } else {
                String::new()
            };
            if empty.is_empty() {
                format!("{name}: all {total} buckets covered{undeclared}")
            } else {
                let shown: Vec<String> = empty
                    .iter()
                    .take(8)
                    .map(|(d, b)| format!("{d} {b}"))
                    .collect();
                let more = if empty.len() > 8 {
                    format!(", … {} more", empty.len() - 8)
                } else {
                    String::new()
                };
                format!(
                    "{name}: {} of {total} buckets empty ({}{more}){undeclared}",
                    empty.len(),
                    shown.join(", ")
                )
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tables_buckets_count_as_not_declared() {
        let mut r = CoverageReport::default();
        let (dim, buckets) = dimensions().into_iter().next().unwrap();
        r.mark_not_declared("b", dim, buckets[0]);
        r.mark_not_declared("b", "a factor only the pairs read", "x");
        assert_eq!(r.not_declared_count("b"), 1);
        let total: usize = dimensions().iter().map(|(_, b)| b.len()).sum();
        let line = &summary_lines(&r, &["b".to_string()])[0];
        let expected = format!("{} of {} buckets empty", total - 1, total - 1);
        assert!(line.contains(&expected), "{line}");
    }
}
