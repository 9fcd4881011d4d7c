//! How large a case's logits are, for the coverage report: kernels that start the online max
//! at a finite sentinel, hold q·k in f16 or reuse one row's max for a query tile are only
//! wrong at extremes, so the report shows whether a run reached them.
//!
//! Exact over every (query, visible key) pair, on the keys a kernel reads (an FP8 cache's
//! read-back values), but only when a cheap Cauchy–Schwarz bound says the answer could be
//! other than "small": ordinary cases cost O(tensor size). Past [`EXACT_WORK`] multiply-adds
//! (long-tier cases) every n-th query row and key is visited: a lower bound, exact for a
//! [`crate::pipeline::recipe::LogitShift`], which moves every key of a row alike.

use attn_reference::oracle::Visibility;
use attn_reference::Case;

/// The most multiply-adds spent on one case's exact pass.
const EXACT_WORK: usize = 10_000_000;

/// Unscaled |q·k| past this is infinite in f16.
const F16_MAX: f64 = 65504.0;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LogitStats {
    /// The largest |scale · q·k| over every query and key it sees.
    pub max_logit: f64,
    /// The largest unscaled |q·k|.
    pub max_dot: f64,
    /// The largest difference between two row maxima (scaled) of one sequence's query rows,
    /// one head.
    pub row_max_spread: f64,
    /// The same over sequences of more than [`WIDE_CHUNK`] query rows only (`None`: the
    /// case has none), where a 128-row query tile's halves can mix up their maxima.
    pub wide_chunk_spread: Option<f64>,
}

/// Query rows of one sequence past which a chunk counts as wide: half a 128-row tile.
pub const WIDE_CHUNK: usize = 64;

impl LogitStats {
    pub fn of(case: &Case) -> LogitStats {
        let c = &case.config;
        let d = c.head_size.max(1);
        let scale = c.effective_scale();
        let norm = |r: &[f64]| r.iter().map(|x| x * x).sum::<f64>().sqrt();
        let keys: Vec<Vec<f64>> = (0..case.num_seqs()).map(|s| read_keys(case, s)).collect();
        let q: Vec<f64> = case.tensors.query.iter().map(|&x| x as f64).collect();
        let max_q = q.chunks(d).map(norm).fold(0.0, f64::max);
        let max_k = keys
            .iter()
            .flat_map(|k| k.chunks(d))
            .map(norm)
            .fold(0.0, f64::max);
        let bound = StatsBound {
            dot: max_q * max_k,
            logit: scale * max_q * max_k,
        };
        // Below every bucket edge: the bound is the answer's bucket.
        if bound.logit <= 50.0 && bound.dot <= F16_MAX {
            let wide = case.batch.query_lens.iter().any(|&q| q > WIDE_CHUNK);
            return LogitStats {
                max_logit: bound.logit,
                max_dot: bound.dot,
                row_max_spread: 2.0 * bound.logit,
                wide_chunk_spread: wide.then_some(2.0 * bound.logit),
            };
        }
        exact(case, &q, &keys)
    }

    /// The (dimension, bucket) pairs of `logit magnitude`, `unscaled q·k`,
    /// `row maxima spread` and `wide chunk spread`.
    pub fn buckets(&self) -> [(&'static str, &'static str); 4] {
        let magnitude = match self.max_logit {
            x if x < 1e2 => "below 1e2",
            x if x < 1e4 => "1e2 to 1e4",
            x if x <= 1e5 => "1e4 to 1e5",
            _ => "above 1e5",
        };
        let dot = if self.max_dot > F16_MAX {
            "past f16 range"
        } else {
            "within f16 range"
        };
        let spread = if self.row_max_spread > 100.0 {
            "above 100"
        } else {
            "at most 100"
        };
        let wide = match self.wide_chunk_spread {
            None => "no chunk past 64 rows",
            Some(x) if x <= 100.0 => "at most 100",
            Some(_) => "above 100",
        };
        [
            ("logit magnitude", magnitude),
            ("unscaled q·k", dot),
            ("row maxima spread", spread),
            ("wide chunk spread", wide),
        ]
    }
}

struct StatsBound {
    dot: f64,
    logit: f64,
}

/// Each real (token, head) row's largest |scale · q·k| over the keys it sees, `[tokens *
/// heads]`; `None` past [`EXACT_WORK`] (the precision hint then stays silent).
pub fn row_logits(case: &Case) -> Option<Vec<f64>> {
    let c = &case.config;
    let (hq, d) = (c.num_heads, c.head_size);
    let work: usize = (0..case.num_seqs())
        .map(|s| case.batch.query_lens[s] * case.batch.seq_lens[s])
        .sum::<usize>()
        * hq
        * d;
    if work > EXACT_WORK {
        return None;
    }
    let mut rows = RowLogits::new(case);
    (0..case.num_real_tokens() * hq)
        .map(|cell| rows.get(cell / hq, cell % hq))
        .collect()
}

/// Rows' largest |scale · q·k| over the keys they see, each computed when asked: a rule
/// that looks at a few rows (and stops at the first that does not fit) costs only those,
/// whatever the case's size.
pub struct RowLogits<'a> {
    case: &'a Case,
    starts: Vec<usize>,
    query: Vec<f64>,
    /// Per sequence, its keys as a kernel reads them, read once.
    keys: Vec<Option<Vec<f64>>>,
}

impl<'a> RowLogits<'a> {
    pub fn new(case: &'a Case) -> RowLogits<'a> {
        RowLogits {
            case,
            starts: case.query_start_loc(),
            query: case.tensors.query.iter().map(|&x| x as f64).collect(),
            keys: vec![None; case.num_seqs()],
        }
    }

    /// Row (`t`, `h`)'s largest |scale · q·k|; `None` for a padding token.
    pub fn get(&mut self, t: usize, h: usize) -> Option<f64> {
        let case = self.case;
        let c = &case.config;
        let (hq, hkv, d) = (c.num_heads, c.num_kv_heads.max(1), c.head_size);
        let s = (0..case.num_seqs())
            .find(|&s| (self.starts[s]..self.starts[s] + case.batch.query_lens[s]).contains(&t))?;
        let k = self.keys[s].get_or_insert_with(|| read_keys(case, s));
        let j = t - self.starts[s];
        let keys =
            Visibility::of_seq(case, s).keys(case.context_len(s) + j, case.batch.seq_lens[s]);
        let qr = &self.query[(t * hq + h) * d..][..d];
        let kvh = h / (hq / hkv);
        let scale = c.effective_scale();
        Some(
            keys.iter()
                .map(|key| {
                    let kr = &k[(key * hkv + kvh) * d..][..d];
                    (scale * qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>()).abs()
                })
                .fold(0.0, f64::max),
        )
    }
}

/// Sequence `s`'s keys as a kernel reads them, `[seq_len, num_kv_heads, head_size]`.
fn read_keys(case: &Case, s: usize) -> Vec<f64> {
    let (k, _) = case.contiguous_kv(s);
    match &case.config.kv_cache {
        Some(cache) => cache.read_back_k(&k, case.config.num_kv_heads, case.config.head_size),
        None => k.iter().map(|&x| x as f64).collect(),
    }
}

fn exact(case: &Case, q: &[f64], keys: &[Vec<f64>]) -> LogitStats {
    let c = &case.config;
    let (hq, hkv, d) = (c.num_heads, c.num_kv_heads, c.head_size);
    let group = hq / hkv.max(1);
    let scale = c.effective_scale();
    let starts = case.query_start_loc();
    let work: usize = (0..case.num_seqs())
        .map(|s| case.batch.query_lens[s] * case.batch.seq_lens[s])
        .sum::<usize>()
        * hq
        * d;
    // Visit every stride-th row and key: stride² less work.
    let stride = (1..)
        .find(|s: &usize| work / (s * s) <= EXACT_WORK)
        .unwrap_or(1);
    let mut out = LogitStats::default();
    for (s, k) in keys.iter().enumerate() {
        let seq_len = case.batch.seq_lens[s];
        let ctx = case.context_len(s);
        for h in 0..hq {
            let kvh = h / group;
            let (mut lowest, mut highest) = (f64::INFINITY, f64::NEG_INFINITY);
            for j in (0..case.batch.query_lens[s]).step_by(stride) {
                let t = starts[s] + j;
                let qr = &q[(t * hq + h) * d..][..d];
                let keys = Visibility::of_seq(case, s).keys(ctx + j, seq_len);
                let mut row_max = f64::NEG_INFINITY;
                for key in keys.iter().step_by(stride) {
                    let kr = &k[(key * hkv + kvh) * d..][..d];
                    let dot: f64 = qr.iter().zip(kr).map(|(a, b)| a * b).sum();
                    out.max_dot = out.max_dot.max(dot.abs());
                    out.max_logit = out.max_logit.max((scale * dot).abs());
                    row_max = row_max.max(scale * dot);
                }
                lowest = lowest.min(row_max);
                highest = highest.max(row_max);
            }
            if highest > lowest {
                out.row_max_spread = out.row_max_spread.max(highest - lowest);
                if case.batch.query_lens[s] > WIDE_CHUNK {
                    let w = out.wide_chunk_spread.get_or_insert(0.0);
                    *w = w.max(highest - lowest);
                }
            }
        }
        if case.batch.query_lens[s] > WIDE_CHUNK {
            out.wide_chunk_spread.get_or_insert(0.0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::recipe::{CaseRecipe, LogitShift, Values};

    #[test]
    fn a_row_shift_reaches_the_buckets_it_names() {
        let small = CaseRecipe {
            head_size: 8,
            seqs: vec![(20, 4)],
            values: Values::Normal { seed: 3, std: 1.0 },
            ..CaseRecipe::plain()
        };
        let b = LogitStats::of(&small.build()).buckets();
        assert_eq!(b[0].1, "below 1e2");
        assert_eq!(b[1].1, "within f16 range");
        let big = CaseRecipe {
            logits: Some(LogitShift {
                dot: 4.0e5,
                alternate: true,
                scattered: false,
            }),
            ..small
        };
        let s = LogitStats::of(&big.build());
        let b = s.buckets();
        // scale 8^-0.5 · 4e5 ≈ 1.4e5; rows alternate between +shift and -shift.
        assert_eq!(b[0].1, "above 1e5", "{s:?}");
        assert_eq!(b[1].1, "past f16 range");
        assert_eq!(b[2].1, "above 100");
    }
}
