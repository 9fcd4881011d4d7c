//! The precision ladder: the oracle's attention computed again under named emulations of
//! how kernels round, so a precision failure can be named by its arithmetic ("exactly what a
//! float16-score softmax gives") instead of by a tolerance it missed.
//!
//! Each [`Rung`] is the oracle's computation (the same keys, masks, soft-cap, ALiBi, sinks
//! and read-back K/V, [`crate::oracle`]) in f64 with explicit rounding at the points the rung
//! names: to f32 where a kernel keeps f32, to the case's dtype where the rung says the kernel
//! keeps the dtype. Dot products and P·V sums accumulate as a matmul does (exactly, then
//! rounded once), so the rungs differ only where they say they do. Every rung's output is
//! rounded to the dtype at the end, as a backend's output is. `harness/tests/ladder.rs` checks
//! the rungs against libtorch's eager computation in the same dtype.

use crate::oracle::{kv_as_read, query_as_read, Visibility};
use crate::{Case, DType};

/// A named way of rounding attention, from the exact computation's nearest neighbour down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rung {
    /// Scores, softmax and P·V in f32, the output rounded to the dtype: what attn-diff's
    /// tolerance assumes (FlashAttention, vLLM's CPU_ATTN and `cpu`).
    F32,
    /// Positions (`k - p`) and ALiBi's bias in the dtype: a position past the dtype's
    /// integers (bf16: 256, f16: 2,048) is rounded before the slope multiplies it.
    PositionsInDtype,
    /// Probabilities rounded to the dtype before P·V, their sum from the unrounded ones
    /// (FlashAttention-2's P cast for its second matmul; Triton kernels that `tl.dot` P).
    ProbsInDtype,
    /// q·k rounded to the dtype (a half-precision matmul's output), then scaled in f32
    /// (a torch-native backend's `q @ k.T * scale` with a dtype matmul).
    ScoresInDtype,
    /// The query scaled and rounded to the dtype before q·k, the score rounded too
    /// (`(q * scale) @ k.T` in the dtype, as PyTorch's SDPA math path does).
    ScaledQueryInDtype,
    /// An online softmax whose state is kept in the dtype: the running sum and the output
    /// accumulator rounded after each key as the running maximum rescales them (kernels
    /// that keep `l` and `acc` in the input dtype to save registers or shared memory).
    SoftmaxStatsInDtype,
    /// Eager attention in the dtype, every op's result rounded: scores, scale, soft-cap,
    /// bias, softmax, P·V (`softmax(q @ k.T * scale) @ v` with half tensors).
    AllInDtype,
}

impl Rung {
    pub const ALL: [Rung; 7] = [
        Rung::F32,
        Rung::PositionsInDtype,
        Rung::ProbsInDtype,
        Rung::ScoresInDtype,
        Rung::ScaledQueryInDtype,
        Rung::SoftmaxStatsInDtype,
        Rung::AllInDtype,
    ];

    /// The rung's short name, for a failure class.
    pub fn name(self) -> &'static str {
        match self {
            Rung::F32 => "f32",
            Rung::PositionsInDtype => "positions in the dtype",
            Rung::ProbsInDtype => "probabilities in the dtype",
            Rung::ScoresInDtype => "scores in the dtype",
            Rung::ScaledQueryInDtype => "scaled query in the dtype",
            Rung::SoftmaxStatsInDtype => "online softmax state in the dtype",
            Rung::AllInDtype => "every op in the dtype",
        }
    }

    /// Whether a kernel whose rows match `self` on one case and `other` on another has one
    /// cause: the rungs that keep more or less of the score, softmax and P·V computation in
    /// the dtype are one choice made by degrees (a kernel that rounds at every point matches
    /// whichever of them is the most specific within rounding, case by case), while
    /// positions round another quantity and f32 is no rounding cause at all.
    pub fn same_cause(self, other: Rung) -> bool {
        let core = |r: Rung| !matches!(r, Rung::F32 | Rung::PositionsInDtype);
        self == other || (core(self) && core(other))
    }

    /// The rung as a command line names it (`--judge ladder:2:every-op`).
    pub fn slug(self) -> &'static str {
        match self {
            Rung::F32 => "f32",
            Rung::PositionsInDtype => "positions",
            Rung::ProbsInDtype => "probabilities",
            Rung::ScoresInDtype => "scores",
            Rung::ScaledQueryInDtype => "scaled-query",
            Rung::SoftmaxStatsInDtype => "softmax-state",
            Rung::AllInDtype => "every-op",
        }
    }

    /// The rung a [`Rung::slug`] names.
    pub fn from_slug(slug: &str) -> Option<Rung> {
        Rung::ALL.into_iter().find(|r| r.slug() == slug)
    }

    /// The rung in a few words, in `dtype`.
    pub fn describe(self, dtype: DType) -> String {
        match self {
            Rung::F32 => "scores, softmax and P.V in f32".to_string(),
            Rung::PositionsInDtype => format!("positions and ALiBi biases in {dtype}"),
            Rung::ProbsInDtype => format!("probabilities rounded to {dtype} before P.V"),
            Rung::ScoresInDtype => format!("q.k scores in {dtype}, scaled after"),
            Rung::ScaledQueryInDtype => format!("the query scaled in {dtype} before q.k"),
            Rung::SoftmaxStatsInDtype => {
                format!("an online softmax whose running sum and accumulator are in {dtype}")
            }
            Rung::AllInDtype => format!("eager attention with every op in {dtype}"),
        }
    }

    /// What a kernel that computes this way should change, for a hint.
    pub fn advice(self) -> &'static str {
        match self {
            Rung::F32 => "none: this is the computation the tolerance assumes",
            Rung::PositionsInDtype => "compute positions and ALiBi's k - p in int32 or fp32",
            Rung::ProbsInDtype => "keep P in fp32 for P.V, or accept the dtype's rounding of P",
            Rung::ScoresInDtype | Rung::ScaledQueryInDtype => {
                "compute q.k (and its scale) with fp32 output, not in the dtype"
            }
            Rung::SoftmaxStatsInDtype => {
                "keep the softmax's running sum and the P.V accumulator in fp32"
            }
            Rung::AllInDtype => "accumulate scores, softmax and P.V in fp32",
        }
    }

    /// Whether the rung rounds anything `case` computes differently from [`Rung::F32`].
    pub fn applies_to(self, case: &Case) -> bool {
        match self {
            Rung::PositionsInDtype => case.config.alibi_slopes.is_some(),
            _ => true,
        }
    }
}

/// Where the rung rounds, as switches (one place reads them: [`row`]).
#[derive(Clone, Copy)]
struct Points {
    /// No rounding anywhere, not even to f32: the oracle's arithmetic.
    exact: bool,
    scaled_query: bool,
    scores: bool,
    every_op: bool,
    positions: bool,
    probs: bool,
    stats: bool,
}

impl Points {
    const EXACT: Points = Points {
        exact: true,
        scaled_query: false,
        scores: false,
        every_op: false,
        positions: false,
        probs: false,
        stats: false,
    };

    fn of(rung: Rung) -> Points {
        // Rounding to f32 where a kernel keeps f32, and nowhere to the dtype.
        let none = Points {
            exact: false,
            ..Points::EXACT
        };
        match rung {
            Rung::F32 => none,
            Rung::PositionsInDtype => Points {
                positions: true,
                ..none
            },
            Rung::ProbsInDtype => Points {
                probs: true,
                ..none
            },
            Rung::ScoresInDtype => Points {
                scores: true,
                ..none
            },
            Rung::ScaledQueryInDtype => Points {
                scaled_query: true,
                scores: true,
                ..none
            },
            Rung::SoftmaxStatsInDtype => Points {
                stats: true,
                ..none
            },
            Rung::AllInDtype => Points {
                scores: true,
                every_op: true,
                positions: true,
                probs: true,
                ..none
            },
        }
    }
}

fn to_f32(x: f64) -> f64 {
    x as f32 as f64
}

/// `case`'s output `[num_real_tokens, num_heads, head_size_v]` as a kernel computing the
/// `rung` way gives it (rounded to the case's dtype).
pub fn emulate(case: &Case, rung: Rung) -> Vec<f64> {
    let hq = case.config.num_heads;
    let rows: Vec<(usize, usize)> = (0..case.num_real_tokens())
        .flat_map(|t| (0..hq).map(move |h| (t, h)))
        .collect();
    emulate_rows(case, Some(rung), &rows)
}

/// The output rows `(token, query head)` of `case`, `[rows.len(), head_size_v]`, as `rung`
/// computes them, or exactly (no rounding at all: the oracle's result) for `None`. What
/// lets a large case be judged on a sample of its rows.
pub fn emulate_rows(case: &Case, rung: Option<Rung>, rows: &[(usize, usize)]) -> Vec<f64> {
    let c = &case.config;
    let (hq, hkv, d, dv) = (c.num_heads, c.num_kv_heads, c.head_size, c.head_size_v());
    let group = hq / hkv;
    let starts = case.query_start_loc();
    let points = rung.map_or(Points::EXACT, Points::of);
    let mut out = vec![0.0f64; rows.len() * dv];
    // The last sequence read, and its K and V: rows come a sequence at a time.
    let mut read: Option<(usize, ReadKv)> = None;
    for (i, &(token, h)) in rows.iter().enumerate() {
        let s = starts.partition_point(|&x| x <= token) - 1;
        if read.as_ref().is_none_or(|(seq, _)| *seq != s) {
            read = Some((s, kv_as_read(case, s)));
        }
        let Some((_, (k, v))) = &read else { continue };
        let p = case.context_len(s) + token - starts[s];
        let kv = KvRows {
            k,
            v,
            hkv,
            kvh: h / group,
            d,
            dv,
        };
        let keys = Visibility::of_seq(case, s).keys(p, case.batch.seq_lens[s]);
        let o = &mut out[i * dv..(i + 1) * dv];
        row(
            case,
            points,
            &query_as_read(case, token, h),
            h,
            p,
            keys,
            kv,
            o,
        );
    }
    out
}

/// The (token, query head) rows of `case` that cost at most about `max_work` multiply-adds
/// per rung: all of them in a small case, else an even sample (the first row and then every
/// n-th, n coprime with the head count so that every sequence and head is met).
pub fn sample_rows(case: &Case, max_work: usize) -> Vec<(usize, usize)> {
    let c = &case.config;
    let hq = c.num_heads;
    let starts = case.query_start_loc();
    let cost = |t: usize| {
        let s = starts.partition_point(|&x| x <= t) - 1;
        case.batch.seq_lens[s] * (c.head_size + c.head_size_v())
    };
    let all: Vec<(usize, usize)> = (0..case.num_real_tokens())
        .flat_map(|t| (0..hq).map(move |h| (t, h)))
        .collect();
    let total: usize = all.iter().map(|&(t, _)| cost(t)).sum();
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let mut stride = total.div_ceil(max_work.max(1)).max(1);
    while stride > 1 && gcd(stride, hq) > 1 {
        stride += 1;
    }
    all.into_iter().step_by(stride).collect()
}

/// Eager attention in the case's own dtype ([`Rung::AllInDtype`]) on a sample of its rows:
/// the error a same-dtype computation makes, which a kernel's error is measured against
/// (PyTorch's flex_attention tests hold a kernel to 1.1 times it, FlashAttention's to twice).
#[derive(Clone, Debug, PartialEq)]
pub struct EagerSample {
    /// The (token, query head) rows sampled.
    pub rows: Vec<(usize, usize)>,
    /// Eager attention's largest error on them against the exact result.
    pub error: f64,
}

impl EagerSample {
    /// Eager attention on at most about `max_work` multiply-adds of `case`'s rows;
    /// `expected` is the oracle's output. None for an f32 case: the rungs accumulate dot
    /// products exactly, which eager f32 attention does not, so its error would be too small.
    pub fn of(case: &Case, expected: &[f64], max_work: usize) -> Option<EagerSample> {
        if case.config.dtype == DType::F32 {
            return None;
        }
        let rows = sample_rows(case, max_work);
        let eager = emulate_rows(case, Some(Rung::AllInDtype), &rows);
        let (hq, dv) = (case.config.num_heads, case.config.head_size_v());
        let mut error = 0.0f64;
        for (i, &(t, h)) in rows.iter().enumerate() {
            let exact = &expected[(t * hq + h) * dv..][..dv];
            for (e, x) in eager[i * dv..][..dv].iter().zip(exact) {
                error = error.max((e - x).abs());
            }
        }
        Some(EagerSample { rows, error })
    }

    /// A backend's largest error on the sampled rows of its `output` (`[num_tokens, heads,
    /// head_size_v]`), against `expected`, divided by eager attention's; None when eager
    /// attention is exact there or a row is not finite.
    pub fn ratio(&self, case: &Case, output: &[f32], expected: &[f64]) -> Option<f64> {
        let (hq, dv) = (case.config.num_heads, case.config.head_size_v());
        let mut error = 0.0f64;
        for &(t, h) in &self.rows {
            let at = (t * hq + h) * dv;
            let (row, exact) = (output.get(at..at + dv)?, expected.get(at..at + dv)?);
            for (&a, &x) in row.iter().zip(exact) {
                if !a.is_finite() {
                    return None;
                }
                error = error.max((a as f64 - x).abs());
            }
        }
        (self.error > 0.0).then(|| error / self.error)
    }
}

/// A sequence's read-back K and V ([`kv_as_read`]).
type ReadKv = (Vec<f64>, Vec<f64>);

/// One kv head's rows of a sequence's read-back K and V.
#[derive(Clone, Copy)]
struct KvRows<'a> {
    k: &'a [f64],
    v: &'a [f64],
    hkv: usize,
    kvh: usize,
    d: usize,
    dv: usize,
}

impl KvRows<'_> {
    fn k(&self, key: usize) -> &[f64] {
        let at = (key * self.hkv + self.kvh) * self.d;
        &self.k[at..at + self.d]
    }
    fn v(&self, key: usize) -> &[f64] {
        let at = (key * self.hkv + self.kvh) * self.dv;
        &self.v[at..at + self.dv]
    }
}

/// One output row (query head `h` at position `p`) the way `pt` rounds.
#[allow(clippy::too_many_arguments)]
fn row(
    case: &Case,
    pt: Points,
    q: &[f64],
    h: usize,
    p: usize,
    keys: crate::oracle::Keys,
    kv: KvRows<'_>,
    o: &mut [f64],
) {
    let c = &case.config;
    let dtype = c.dtype;
    let exact = pt.exact;
    let rd = |x: f64| {
        if exact {
            x
        } else {
            dtype.round(x as f32) as f64
        }
    };
    let f32r = |x: f64| if exact { x } else { to_f32(x) };
    // Each op's result: in the dtype where the rung rounds every op, else in f32.
    let op = |x: f64| if pt.every_op { rd(x) } else { f32r(x) };
    let scale = c.effective_scale();
    let q: Vec<f64> = if pt.scaled_query {
        q.iter().map(|&x| rd(x * scale)).collect()
    } else {
        q.to_vec()
    };
    let logits: Vec<f64> = keys
        .iter()
        .map(|key| {
            let dot: f64 = q.iter().zip(kv.k(key)).map(|(a, b)| a * b).sum();
            let mut l = if pt.scores { rd(dot) } else { f32r(dot) };
            if !pt.scaled_query {
                l = op(l * scale);
            }
            if let Some(cap) = c.logits_soft_cap {
                let cap = cap as f64;
                l = op(cap * op((l / cap).tanh()));
            }
            if let Some(slopes) = &c.alibi_slopes {
                let distance = if pt.positions {
                    rd(key as f64) - rd(p as f64)
                } else {
                    key as f64 - p as f64
                };
                l = op(l + op(slopes[h] as f64 * distance));
            }
            l
        })
        .collect();
    let sink = c.sinks.as_ref().map(|s| s[h] as f64);
    if pt.stats {
        online_in_dtype(&logits, sink, keys, kv, dtype, o);
        return;
    }
    let m = logits
        .iter()
        .copied()
        .chain(sink)
        .fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = logits.iter().map(|&l| f32r((l - m).exp())).collect();
    let denom = f32r(sink.map_or(0.0, |s| (s - m).exp()) + weights.iter().sum::<f64>());
    o.fill(0.0);
    for (w, key) in weights.iter().zip(keys.iter()) {
        // The weight P·V multiplies: a probability in the dtype (every op), the unnormalised
        // weight rounded to the dtype (P rounded), or as computed.
        let w = if pt.every_op {
            rd(w / denom)
        } else if pt.probs {
            rd(*w)
        } else {
            *w
        };
        for (acc, &x) in o.iter_mut().zip(kv.v(key)) {
            *acc += w * x;
        }
    }
    for acc in o.iter_mut() {
        *acc = if pt.every_op {
            rd(*acc)
        } else {
            rd(f32r(*acc / denom))
        };
    }
}

/// An online softmax over `logits` whose state (the running sum and the output
/// accumulator, rescaled by `exp(m_old - m_new)` as the maximum grows) is rounded to the
/// dtype after every key; the sink joins the sum at the end.
fn online_in_dtype(
    logits: &[f64],
    sink: Option<f64>,
    keys: crate::oracle::Keys,
    kv: KvRows<'_>,
    dtype: DType,
    o: &mut [f64],
) {
    let rd = |x: f64| dtype.round(x as f32) as f64;
    let f32r = to_f32;
    let (mut m, mut sum) = (f64::NEG_INFINITY, 0.0);
    o.fill(0.0);
    for (&l, key) in logits.iter().zip(keys.iter()) {
        let new_m = m.max(l);
        let rescale = if m == f64::NEG_INFINITY {
            1.0
        } else {
            f32r((m - new_m).exp())
        };
        let w = f32r((l - new_m).exp());
        sum = rd(sum * rescale + w);
        for (acc, &x) in o.iter_mut().zip(kv.v(key)) {
            *acc = rd(*acc * rescale + w * x);
        }
        m = new_m;
    }
    let last = m.max(sink.unwrap_or(f64::NEG_INFINITY));
    let kept = if m == f64::NEG_INFINITY {
        0.0
    } else {
        f32r((m - last).exp())
    };
    let denom = f32r(sum * kept + sink.map_or(0.0, |s| f32r((s - last).exp())));
    for acc in o.iter_mut() {
        *acc = rd(f32r(*acc * kept / denom));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_case, AttentionConfig, BuildOptions};

    #[test]
    fn the_rungs_of_the_core_computation_are_one_cause_and_positions_another() {
        let core = [
            Rung::ProbsInDtype,
            Rung::ScoresInDtype,
            Rung::ScaledQueryInDtype,
            Rung::SoftmaxStatsInDtype,
            Rung::AllInDtype,
        ];
        for a in core {
            for b in core {
                assert!(a.same_cause(b), "{a:?} {b:?}");
            }
            assert!(!a.same_cause(Rung::PositionsInDtype), "{a:?}");
            assert!(!Rung::F32.same_cause(a), "{a:?}");
        }
        assert!(Rung::PositionsInDtype.same_cause(Rung::PositionsInDtype));
    }

    fn case(dtype: DType, alibi: bool, values_scale: f32) -> Case {
        let mut c = AttentionConfig::new(4, 2, 64, 16, dtype);
        if alibi {
            c.alibi_slopes = Some(vec![0.5, 0.25, 0.125, 0.0625]);
        }
        let mut case = build_case(&[300, 600], &[300, 1], c, 7, &BuildOptions::default());
        for x in case.tensors.query.iter_mut() {
            *x = dtype.round(*x * values_scale);
        }
        case
    }

    fn max_diff(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn no_rung_is_the_oracle() {
        let case = case(DType::F16, true, 2.0);
        let rows: Vec<(usize, usize)> = (0..case.num_real_tokens())
            .flat_map(|t| (0..4).map(move |h| (t, h)))
            .collect();
        let exact = crate::reference_output(&case);
        assert!(max_diff(&emulate_rows(&case, None, &rows), &exact) < 1e-9);
        // A sample of rows is those rows of the whole.
        let some = [(0, 1), (250, 3), (300, 0)];
        let whole = emulate(&case, Rung::ScoresInDtype);
        let sampled = emulate_rows(&case, Some(Rung::ScoresInDtype), &some);
        for (i, &(t, h)) in some.iter().enumerate() {
            assert_eq!(
                sampled[i * 64..(i + 1) * 64],
                whole[(t * 4 + h) * 64..(t * 4 + h + 1) * 64]
            );
        }
    }

    #[test]
    fn f32_is_the_exact_result_rounded_to_the_dtype() {
        let case = case(DType::Bf16, false, 1.0);
        let exact = crate::reference_output(&case);
        let f32 = emulate(&case, Rung::F32);
        let eps = DType::Bf16.epsilon();
        for (e, r) in exact.iter().zip(&f32) {
            assert!((e - r).abs() <= 2.0 * eps * e.abs().max(1e-3), "{e} vs {r}");
        }
    }

    #[test]
    fn each_rung_moves_the_output_and_half_rungs_move_it_more_in_bf16() {
        // Large logits: the dtype's rounding of scores shows.
        let case = case(DType::Bf16, true, 8.0);
        let exact = crate::reference_output(&case);
        let f32_err = max_diff(&emulate(&case, Rung::F32), &exact);
        for rung in Rung::ALL.into_iter().filter(|&r| r != Rung::F32) {
            let err = max_diff(&emulate(&case, rung), &exact);
            assert!(err > f32_err, "{rung:?}: {err} not past f32's {f32_err}");
        }
    }
}
