//! Pairwise coverage: which pairs of factors (optional features and shape classes) the cases
//! a backend ran held together. Bugs live in combinations (sinks with a window past a split-KV
//! boundary, ALiBi in an all-decode batch), which single-dimension buckets cannot show.
//!
//! A factor is a set of coverage buckets (`crate::coverage::DIMENSIONS`, the `features`
//! dimension): a case holds it when it falls in any of them, so pairs follow from the buckets
//! alone and shards add up like the buckets do.

use crate::coverage::CoverageReport;
use attn_reference::{AttentionKind, Feature};

/// The shape classes of the pairwise table, each as the buckets that make it.
const CLASSES: &[(&str, &[(&str, &str)])] = &[
    (
        "long context",
        &[
            ("longest sequence", "4097-16384"),
            ("longest sequence", "above 16384"),
        ],
    ),
    ("big step", &[("step tokens", "above 8192")]),
    (
        "large batch",
        &[("sequences", "65-512"), ("sequences", "above 512")],
    ),
    (
        "group above 8",
        &[
            ("group size", "9-16"),
            ("group size", "17-64"),
            ("group size", "65-128"),
        ],
    ),
    (
        "extreme logits",
        &[
            ("logit magnitude", "1e4 to 1e5"),
            ("logit magnitude", "above 1e5"),
        ],
    ),
    ("all-decode batch", &[("batch composition", "all decode")]),
    (
        "mixed batch",
        &[
            ("batch composition", "mixed, decodes first"),
            ("batch composition", "mixed, other order"),
        ],
    ),
    // The compute dtype: a path written for one dtype (f16's range, bf16's rounding) meets
    // every feature and shape class.
    ("f32", &[("dtype", "f32")]),
    ("bf16", &[("dtype", "bf16")]),
    ("f16", &[("dtype", "f16")]),
];

/// Pairs no case can hold, with the reason: not gaps.
pub const INVALID_PAIRS: &[(&str, &str, &str)] = &[
    (
        "FP8 cache scales per kv head",
        "FP8 cache scales per token and kv head",
        "one scale granularity per cache",
    ),
    (
        "sliding window",
        "R-SWA prefixes",
        "R-SWA replaces the sliding window (the case model refuses both: vLLM's kernels disagree)",
    ),
    (
        "PrefixLM ranges",
        "R-SWA prefixes",
        "the case model refuses both (vLLM's Triton and FlexAttention kernels order them differently)",
    ),
    (
        "encoder-only attention",
        "cross-attention",
        "one attention kind per case",
    ),
    (
        "encoder-only attention",
        "all-decode batch",
        "encoder-only attention has no decodes (query_len = seq_len)",
    ),
    (
        "encoder-only attention",
        "mixed batch",
        "encoder-only attention has no decodes (query_len = seq_len)",
    ),
    (
        "all-decode batch",
        "mixed batch",
        "a batch is all decodes or mixed",
    ),
    ("f32", "bf16", "one compute dtype per case"),
    ("f32", "f16", "one compute dtype per case"),
    ("bf16", "f16", "one compute dtype per case"),
];

/// Every pair no case can hold: [`INVALID_PAIRS`], then each attention kind with the
/// optional features it gives no meaning to ([`Feature::allows_kind`]), then MLA with the
/// features no MLA model has ([`Feature::NOT_WITH_MLA`]).
pub fn invalid_pairs() -> Vec<(&'static str, &'static str, String)> {
    let kinds = [
        (
            Feature::EncoderOnly,
            AttentionKind::EncoderOnly,
            "is causal decoder attention",
        ),
        (
            Feature::CrossAttention,
            AttentionKind::EncoderDecoder,
            "needs key positions relative to the query, which cross-attention has not",
        ),
    ];
    let by_kind = kinds.into_iter().flat_map(|(k, kind, why)| {
        Feature::ALL
            .into_iter()
            .filter(move |f| !f.allows_kind(kind))
            .map(move |f| (k.label(), f.label(), format!("{} {why}", f.label())))
    });
    let not_with_mla = Feature::NOT_WITH_MLA.into_iter().map(|f| {
        (
            f.label(),
            Feature::Mla.label(),
            "no MLA model has it (the case model refuses it)".to_string(),
        )
    });
    INVALID_PAIRS
        .iter()
        .map(|&(a, b, why)| (a, b, why.to_string()))
        .chain(by_kind)
        .chain(not_with_mla)
        .collect()
}

/// Every factor with the buckets that make it: the optional features, then [`CLASSES`].
pub fn pair_factors() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    Feature::ALL
        .iter()
        .map(|f| (f.label(), vec![("features", f.label())]))
        .chain(CLASSES.iter().map(|(name, b)| (*name, b.to_vec())))
        .collect()
}

/// The key of a pair in a report: the two factors in [`pair_factors`] order.
pub fn pair_key(a: &str, b: &str) -> String {
    format!("{a} × {b}")
}

/// The factors `buckets` hold, in [`pair_factors`] order.
pub(crate) fn factors_of(buckets: &[(&str, &str)]) -> Vec<&'static str> {
    pair_factors()
        .into_iter()
        .filter(|(_, fb)| fb.iter().any(|x| buckets.contains(x)))
        .map(|(name, _)| name)
        .collect()
}

fn invalid(invalid: &[(&str, &str, String)], a: &str, b: &str) -> bool {
    invalid
        .iter()
        .any(|&(x, y, _)| (x, y) == (a, b) || (x, y) == (b, a))
}

/// Where one backend stands on pairs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairSummary {
    /// Valid pairs inside the backend's declared space, each with the cases that held it.
    pub pairs: Vec<(String, usize)>,
    /// Valid pairs with a factor outside the declared space.
    pub not_declared: usize,
}

impl PairSummary {
    pub fn covered(&self) -> usize {
        self.pairs.iter().filter(|(_, n)| *n > 0).count()
    }

    /// The pairs no case held.
    pub fn missing(&self) -> Vec<&str> {
        self.pairs
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(p, _)| p.as_str())
            .collect()
    }

    /// Covered pairs as a percentage of the valid declared ones (100 when there are none).
    pub fn percent(&self) -> f64 {
        if self.pairs.is_empty() {
            return 100.0;
        }
        100.0 * self.covered() as f64 / self.pairs.len() as f64
    }
}

/// `backend`'s pairs: every valid pair, its count, and how many lie outside its declared
/// space (a factor none of whose buckets is declared).
pub fn pair_summary(report: &CoverageReport, backend: &str) -> PairSummary {
    let factors = pair_factors();
    let declared = |fb: &[(&str, &str)]| {
        fb.iter()
            .any(|(d, b)| !report.is_not_declared(backend, d, b))
    };
    let counts = report.pairs.get(backend);
    let mut out = PairSummary {
        pairs: Vec::new(),
        not_declared: 0,
    };
    let never = invalid_pairs();
    for (i, (a, fa)) in factors.iter().enumerate() {
        for (b, fb) in &factors[i + 1..] {
            if invalid(&never, a, b) {
                continue;
            }
            if !declared(fa) || !declared(fb) {
                out.not_declared += 1;
                continue;
            }
            let key = pair_key(a, b);
            let n = counts.and_then(|c| c.get(&key)).copied().unwrap_or(0);
            out.pairs.push((key, n));
        }
    }
    out
}

/// One line per backend: covered valid pairs, their share, and the pairs still missing.
pub fn pair_lines(report: &CoverageReport, backends: &[String]) -> Vec<String> {
    backends
        .iter()
        .map(|name| {
            let s = pair_summary(report, name);
            let missing = s.missing();
            let mut l = format!(
                "{name}: {} of {} valid pairs ({:.0}%)",
                s.covered(),
                s.pairs.len(),
                s.percent().floor()
            );
            if !missing.is_empty() {
                let shown: Vec<&str> = missing.iter().take(6).copied().collect();
                let more = match missing.len() {
                    n if n > 6 => format!(", … {} more", n - 6),
                    _ => String::new(),
                };
                l.push_str(&format!("; empty: {}{more}", shown.join(", ")));
            }
            if s.not_declared > 0 {
                l.push_str(&format!("; {} not declared", s.not_declared));
            }
            l
        })
        .collect()
}

/// The pairwise table: one row per valid pair, a count per backend in `backends` order
/// ([`crate::coverage::NOT_DECLARED`] where a factor lies outside a backend's space).
pub fn pair_rows(report: &CoverageReport, backends: &[String]) -> Vec<Vec<String>> {
    let summaries: Vec<PairSummary> = backends.iter().map(|b| pair_summary(report, b)).collect();
    let factors = pair_factors();
    let never = invalid_pairs();
    let mut rows = Vec::new();
    for (i, (a, _)) in factors.iter().enumerate() {
        for (b, _) in &factors[i + 1..] {
            if invalid(&never, a, b) {
                continue;
            }
            let key = pair_key(a, b);
            let mut row = vec![key.clone()];
            row.extend(summaries.iter().map(|s| {
                s.pairs
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map_or(crate::coverage::NOT_DECLARED.to_string(), |(_, n)| {
                        n.to_string()
                    })
            }));
            rows.push(row);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coverage::dimensions;

    #[test]
    fn every_factor_bucket_and_invalid_pair_is_declared() {
        let dims = dimensions();
        let names: Vec<&str> = pair_factors().iter().map(|(n, _)| *n).collect();
        for (name, buckets) in pair_factors() {
            for (d, b) in buckets {
                assert!(
                    dims.iter().any(|(dd, bs)| *dd == d && bs.contains(&b)),
                    "{name}: {d} {b}"
                );
            }
        }
        let never = invalid_pairs();
        for (a, b, _) in &never {
            assert!(names.contains(a) && names.contains(b), "{a} × {b}");
        }
        // Each pair once.
        for (i, (a, b, _)) in never.iter().enumerate() {
            assert!(!invalid(&never[i + 1..], a, b), "{a} × {b} twice");
        }
    }

    #[test]
    fn pairs_count_once_per_case_and_merge_by_addition() {
        let mut r = CoverageReport::default();
        let buckets = [
            ("features", "ALiBi"),
            ("features", "attention sinks"),
            ("batch composition", "all decode"),
            ("dtype", "f32"),
        ];
        r.count_pairs("x", &buckets);
        let mut twice = r.clone();
        twice.merge(&r);
        let s = pair_summary(&twice, "x");
        // Four factors (two features, a batch class, the dtype): six pairs.
        assert_eq!(s.covered(), 6);
        let n = |p: &str| s.pairs.iter().find(|(k, _)| k == p).map(|(_, n)| *n);
        assert_eq!(n("ALiBi × attention sinks"), Some(2));
        assert_eq!(n("ALiBi × all-decode batch"), Some(2));
        assert_eq!(n("ALiBi × f32"), Some(2));
        assert_eq!(n("ALiBi × f16"), Some(0));
        // One dtype per case: dtype pairs are invalid, not gaps.
        assert_eq!(n("f32 × f16"), None);
        // Invalid pairs are not in the table; every other pair is.
        assert_eq!(n("cross-attention × ALiBi"), None);
        let k = pair_factors().len();
        assert_eq!(s.pairs.len(), k * (k - 1) / 2 - invalid_pairs().len());
        assert!(s.percent() < 10.0);
    }

    #[test]
    fn pairs_with_an_undeclared_factor_are_not_gaps() {
        let mut r = CoverageReport::default();
        r.mark_not_declared("x", "features", "ALiBi");
        let s = pair_summary(&r, "x");
        assert!(s.pairs.iter().all(|(p, _)| !p.contains("ALiBi")));
        assert!(s.not_declared > 0);
    }
}
