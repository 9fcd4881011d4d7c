//! Three-way coverage of the shape factors: dtype, head-size class, block-size class, kind,
//! step shape and context class. A public bug needed head size 256, a half dtype, block size
//! 16 or 32 and a decode past 32 keys at once; every factor is common, their meeting is not.
//! Pairs cannot show it, every triple of these classes can.
//!
//! Each factor is a coverage dimension ([`crate::coverage::dimensions`]), so a case's levels
//! are its buckets there, triples follow from the buckets alone and shards add up as pairs do.
//! The harness seeds the first property cases of every run from [`covering_array`], so a
//! default run holds every valid triple whatever the seed.

use crate::coverage::CoverageReport;
use std::collections::BTreeMap;

/// The factors, as (coverage dimension, its levels).
pub const FACTORS: &[(&str, &[&str])] = &[
    ("dtype", &["f32", "bf16", "f16"]),
    (
        "head-size class",
        &["up to 32", "33-127", "128", "above 128"],
    ),
    (
        "block-size class",
        &["1-15", "16-31", "32-63", "64 and above"],
    ),
    ("kind", &["decoder", "encoder-only", "cross-attention"]),
    ("step shape", &["decode", "spec-decode", "prefill", "mixed"]),
    (
        "context class",
        &["up to 32 keys", "33-512 keys", "above 512 keys"],
    ),
];

/// One case's levels: an index into each factor's levels, in [`FACTORS`] order.
pub type Levels = [usize; 6];

/// Whether a case can hold `(factor, level)` beside `(other, level)`: encoder-only attention
/// is one prefill of the whole sequence, never a decode or a mix.
fn compatible((f, l): (usize, usize), (g, m): (usize, usize)) -> bool {
    let encoder_only = |f: usize, l: usize| f == 3 && l == 1;
    let not_prefill = |f: usize, l: usize| f == 4 && l != 2;
    !(encoder_only(f, l) && not_prefill(g, m) || encoder_only(g, m) && not_prefill(f, l))
}

/// Whether a whole row of levels is one case can hold.
pub fn valid_row(row: &Levels) -> bool {
    (0..6).all(|f| (f + 1..6).all(|g| compatible((f, row[f]), (g, row[g]))))
}

/// A triple of (factor, level), factors in ascending order.
type Triple = [(usize, usize); 3];

fn triple_valid(t: &Triple) -> bool {
    (0..3).all(|i| (i + 1..3).all(|j| compatible(t[i], t[j])))
}

/// Every valid triple, in a fixed order.
fn all_triples() -> Vec<Triple> {
    let size = |f: usize| FACTORS[f].1.len();
    let factors =
        (0..6).flat_map(|a| (a + 1..6).flat_map(move |b| (b + 1..6).map(move |c| (a, b, c))));
    let mut out = Vec::new();
    for (a, b, c) in factors {
        for la in 0..size(a) {
            for lb in 0..size(b) {
                for lc in 0..size(c) {
                    let t = [(a, la), (b, lb), (c, lc)];
                    if triple_valid(&t) {
                        out.push(t);
                    }
                }
            }
        }
    }
    out
}

/// The key of a triple in a report: `dimension: level` three times, in [`FACTORS`] order.
fn triple_key(t: &Triple) -> String {
    t.iter()
        .map(|&(f, l)| format!("{}: {}", FACTORS[f].0, FACTORS[f].1[l]))
        .collect::<Vec<_>>()
        .join(" × ")
}

/// The triples a row holds.
fn triples_of(row: &Levels) -> impl Iterator<Item = Triple> + '_ {
    (0..6).flat_map(move |a| {
        (a + 1..6)
            .flat_map(move |b| (b + 1..6).map(move |c| [(a, row[a]), (b, row[b]), (c, row[c])]))
    })
}

/// A case's levels from its coverage buckets (None where a factor's bucket is missing).
pub fn levels_of(buckets: &[(&str, &str)]) -> Option<Levels> {
    let mut row = [0; 6];
    for (f, (dim, levels)) in FACTORS.iter().enumerate() {
        let bucket = buckets.iter().find(|(d, _)| d == dim)?.1;
        row[f] = levels.iter().position(|l| *l == bucket)?;
    }
    Some(row)
}

/// A covering array of strength 3 over [`FACTORS`]: rows (valid cases' levels) such that
/// every valid triple lies in at least one. Built greedily and deterministically (each row
/// the best of a few candidates, each candidate filled factor by factor with the level that
/// covers most new triples), so every run and every shard sees the same rows.
pub fn covering_array() -> Vec<Levels> {
    let mut uncovered: std::collections::BTreeSet<Triple> = all_triples().into_iter().collect();
    let mut rows = Vec::new();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    while let Some(&seed) = uncovered.iter().next() {
        let mut best: Option<(usize, Levels)> = None;
        for _ in 0..24 {
            // Start from an uncovered triple, fill the other factors in a random order.
            let mut row = [usize::MAX; 6];
            for (f, l) in seed {
                row[f] = l;
            }
            let mut order: Vec<usize> = (0..6).filter(|&f| row[f] == usize::MAX).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            for f in order {
                let gain = |row: &Levels, l: usize| {
                    let mut r = *row;
                    r[f] = l;
                    if (0..6)
                        .any(|g| g != f && r[g] != usize::MAX && !compatible((f, l), (g, r[g])))
                    {
                        return None;
                    }
                    let fixed: Vec<usize> =
                        (0..6).filter(|&g| g != f && r[g] != usize::MAX).collect();
                    let mut n = 0;
                    for (i, &a) in fixed.iter().enumerate() {
                        for &b in &fixed[i + 1..] {
                            let mut t = [(a, r[a]), (b, r[b]), (f, l)];
                            t.sort_unstable();
                            n += uncovered.contains(&t) as usize;
                        }
                    }
                    Some(n)
                };
                let n = FACTORS[f].1.len();
                let start = (next() % n as u64) as usize;
                let mut pick: Option<(usize, usize)> = None;
                for l in (0..n).map(|i| (start + i) % n) {
                    if let Some(g) = gain(&row, l) {
                        if pick.is_none_or(|(best, _)| g > best) {
                            pick = Some((g, l));
                        }
                    }
                }
                let (_, pick) = pick.expect("every factor has a level compatible with the rest");
                row[f] = pick;
            }
            let covers = triples_of(&row).filter(|t| uncovered.contains(t)).count();
            if best.is_none_or(|(n, _)| covers > n) {
                best = Some((covers, row));
            }
        }
        let (_, row) = best.expect("at least one candidate");
        for t in triples_of(&row) {
            uncovered.remove(&t);
        }
        rows.push(row);
    }
    rows
}

impl CoverageReport {
    /// Count one case that `backend` ran in every shape triple its `buckets` hold.
    pub fn count_triples(&mut self, backend: &str, buckets: &[(&str, &str)]) {
        let Some(row) = levels_of(buckets) else {
            return;
        };
        let counts = self.triples.entry(backend.to_string()).or_default();
        for t in triples_of(&row) {
            *counts.entry(triple_key(&t)).or_default() += 1;
        }
    }
}

/// Where one backend stands on shape triples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TripleSummary {
    /// Valid triples inside the declared space, with the cases that held each.
    pub triples: Vec<(String, usize)>,
    /// Valid triples with a level outside the declared space.
    pub not_declared: usize,
}

impl TripleSummary {
    pub fn covered(&self) -> usize {
        self.triples.iter().filter(|(_, n)| *n > 0).count()
    }

    pub fn missing(&self) -> Vec<&str> {
        self.triples
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(t, _)| t.as_str())
            .collect()
    }
}

/// `backend`'s shape triples: every valid one, its count, and how many lie outside its
/// declared space (a level whose bucket is not declared).
pub fn triple_summary(report: &CoverageReport, backend: &str) -> TripleSummary {
    let empty = BTreeMap::new();
    let counts = report.triples.get(backend).unwrap_or(&empty);
    let mut out = TripleSummary {
        triples: Vec::new(),
        not_declared: 0,
    };
    for t in all_triples() {
        if t.iter()
            .any(|&(f, l)| report.is_not_declared(backend, FACTORS[f].0, FACTORS[f].1[l]))
        {
            out.not_declared += 1;
            continue;
        }
        let key = triple_key(&t);
        let n = counts.get(&key).copied().unwrap_or(0);
        out.triples.push((key, n));
    }
    out
}

/// One line per backend: covered valid triples and the first few still missing.
pub fn triple_lines(report: &CoverageReport, backends: &[String]) -> Vec<String> {
    backends
        .iter()
        .map(|name| {
            let s = triple_summary(report, name);
            let missing = s.missing();
            let mut l = format!(
                "{name}: {} of {} valid shape triples",
                s.covered(),
                s.triples.len()
            );
            if !missing.is_empty() {
                let shown: Vec<&str> = missing.iter().take(3).copied().collect();
                let more = match missing.len() {
                    n if n > 3 => format!(", … {} more", n - 3),
                    _ => String::new(),
                };
                l.push_str(&format!("; empty: {}{more}", shown.join("; ")));
            }
            if s.not_declared > 0 {
                l.push_str(&format!("; {} not declared", s.not_declared));
            }
            l
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_covering_array_holds_every_valid_triple_in_valid_rows() {
        let rows = covering_array();
        assert!(rows.iter().all(valid_row));
        let held: std::collections::BTreeSet<Triple> = rows
            .iter()
            .flat_map(|r| triples_of(r).collect::<Vec<_>>())
            .collect();
        let all = all_triples();
        assert!(all.iter().all(|t| held.contains(t)));
        // At least the largest three factors' product, and not far past it.
        println!("{} rows", rows.len());
        assert!(rows.len() >= 4 * 4 * 4, "{}", rows.len());
        assert!(rows.len() <= 140, "{} rows", rows.len());
        assert_eq!(rows, covering_array(), "deterministic");
    }

    #[test]
    fn triples_count_from_buckets_and_skip_undeclared_levels() {
        let mut r = CoverageReport::default();
        let buckets = [
            ("dtype", "bf16"),
            ("head-size class", "above 128"),
            ("block-size class", "16-31"),
            ("kind", "decoder"),
            ("step shape", "decode"),
            ("context class", "33-512 keys"),
        ];
        r.count_triples("x", &buckets);
        let s = triple_summary(&r, "x");
        assert_eq!(s.covered(), 20);
        assert!(s.triples.iter().any(|(k, n)| *n == 1
            && k == "dtype: bf16 × head-size class: above 128 × block-size class: 16-31"));
        // Encoder-only decodes are not triples at all.
        assert!(!s
            .triples
            .iter()
            .any(|(k, _)| k.contains("encoder-only") && k.contains("step shape: decode")));
        r.mark_not_declared("x", "dtype", "f16");
        let t = triple_summary(&r, "x");
        assert!(t.not_declared > 0 && t.triples.iter().all(|(k, _)| !k.contains("dtype: f16")));
    }
}
