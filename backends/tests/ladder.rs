//! The precision ladder's rungs (`attn_reference::ladder`) against an independent same-dtype
//! implementation: libtorch's eager attention in f16 and bf16, written as a torch-native
//! backend writes it. Each rung must land on torch's rows far closer than on the exact ones.
#![cfg(feature = "spyre")]

use attn_reference::ladder::{emulate, Rung};
use attn_reference::{build_case, reference_output, AttentionConfig, BuildOptions, Case, DType};
use tch::{Kind, Tensor};

const HEADS: usize = 4;
const D: usize = 64;
const TOKENS: usize = 96;

/// One causal prefill of [`TOKENS`] tokens, its queries scaled up so the logits are large
/// enough for the dtype's rounding of scores to show.
fn case(dtype: DType) -> Case {
    let c = AttentionConfig::new(HEADS, HEADS, D, 16, dtype);
    let mut case = build_case(&[TOKENS], &[TOKENS], c, 11, &BuildOptions::default());
    for x in case.tensors.query.iter_mut() {
        *x = dtype.round(*x * 6.0);
    }
    case
}

fn kind(dtype: DType) -> Kind {
    match dtype {
        DType::F16 => Kind::Half,
        DType::Bf16 => Kind::BFloat16,
        DType::F32 => Kind::Float,
    }
}

/// `[heads, tokens, d]` tensors of the case's q, k, v in the dtype.
fn qkv(case: &Case) -> (Tensor, Tensor, Tensor) {
    let k_ = kind(case.config.dtype);
    let (k, v) = case.contiguous_kv(0);
    let n = case.num_real_tokens();
    let t = |x: &[f32]| {
        Tensor::from_slice(x)
            .view([n as i64, HEADS as i64, D as i64])
            .transpose(0, 1)
            .to_kind(k_)
    };
    (t(&case.tensors.query[..n * HEADS * D]), t(&k), t(&v))
}

fn causal_mask(case: &Case) -> Tensor {
    let n = case.num_real_tokens() as i64;
    Tensor::ones([n, n], (Kind::Bool, tch::Device::Cpu)).triu(1)
}

/// Torch's output `[tokens, heads, d]` as f64.
fn rows(out: Tensor) -> Vec<f64> {
    let out = out
        .transpose(0, 1)
        .contiguous()
        .to_kind(Kind::Double)
        .view([-1]);
    Vec::<f64>::try_from(&out).expect("a double tensor")
}

/// `softmax(q @ k.T * scale) @ v` with every tensor in the dtype (eager PyTorch in half).
fn eager_in_dtype(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let scale = case.config.effective_scale();
    let scores =
        (q.matmul(&k.transpose(1, 2)) * scale).masked_fill(&causal_mask(case), f64::NEG_INFINITY);
    rows(scores.softmax(-1, kind(case.config.dtype)).matmul(&v))
}

/// The causal softmax of f32 `scores` and P.V in f32, the output cast to `case`'s dtype.
fn softmax_pv_in_f32(case: &Case, scores: Tensor, v: &Tensor) -> Vec<f64> {
    let p = scores
        .masked_fill(&causal_mask(case), f64::NEG_INFINITY)
        .softmax(-1, Kind::Float);
    rows(
        p.matmul(&v.to_kind(Kind::Float))
            .to_kind(kind(case.config.dtype)),
    )
}

/// `q @ k.T` in the dtype, everything after it in f32, the output cast back.
fn scores_in_dtype(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let scale = case.config.effective_scale();
    let scores = q.matmul(&k.transpose(1, 2)).to_kind(Kind::Float) * scale;
    softmax_pv_in_f32(case, scores, &v)
}

/// `(q * scale) @ k.T` in the dtype (PyTorch's SDPA math path), the softmax in f32.
fn scaled_query_in_dtype(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let scale = case.config.effective_scale();
    let scores = (q * scale).matmul(&k.transpose(1, 2)).to_kind(Kind::Float);
    softmax_pv_in_f32(case, scores, &v)
}

/// Scores, softmax and P.V in f32, the output cast back.
fn all_in_f32(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let f = |t: &Tensor| t.to_kind(Kind::Float);
    let scores = f(&q).matmul(&f(&k).transpose(1, 2)) * case.config.effective_scale();
    softmax_pv_in_f32(case, scores, &v)
}

/// f32 scores; the unnormalised weights cast to the dtype for P.V, their sum from f32.
fn probs_in_dtype(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let f = |t: &Tensor| t.to_kind(Kind::Float);
    let scores = f(&q).matmul(&f(&k).transpose(1, 2)) * case.config.effective_scale();
    let scores = scores.masked_fill(&causal_mask(case), f64::NEG_INFINITY);
    let w = (&scores - scores.amax([-1].as_slice(), true)).exp();
    let denom = w.sum_dim_intlist([-1].as_slice(), true, Kind::Float);
    let p = w.to_kind(kind(case.config.dtype)).to_kind(Kind::Float);
    rows((p.matmul(&f(&v)) / denom).to_kind(kind(case.config.dtype)))
}

/// An online softmax, key by key, whose running sum and accumulator are dtype tensors.
fn online_state_in_dtype(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let f = |t: &Tensor| t.to_kind(Kind::Float);
    let dtype = kind(case.config.dtype);
    let scores = f(&q).matmul(&f(&k).transpose(1, 2)) * case.config.effective_scale();
    let scores = scores.masked_fill(&causal_mask(case), f64::NEG_INFINITY);
    let (h, n) = (HEADS as i64, case.num_real_tokens() as i64);
    let mut m = Tensor::full(
        [h, n, 1],
        f64::NEG_INFINITY,
        (Kind::Float, tch::Device::Cpu),
    );
    let mut sum = Tensor::zeros([h, n, 1], (dtype, tch::Device::Cpu));
    let mut acc = Tensor::zeros([h, n, D as i64], (dtype, tch::Device::Cpu));
    for key in 0..n {
        let l = scores.narrow(2, key, 1);
        let new_m = m.maximum(&l);
        let rescale = (&m - &new_m)
            .exp()
            .where_self(&m.isfinite(), &l.ones_like());
        let w = (&l - &new_m)
            .exp()
            .where_self(&l.isfinite(), &l.zeros_like());
        let vk = f(&v.narrow(1, key, 1)); // [h, 1, d]
        sum = (f(&sum) * &rescale + &w).to_kind(dtype);
        acc = (f(&acc) * &rescale + &w * vk).to_kind(dtype);
        m = new_m;
    }
    rows((f(&acc) / f(&sum)).to_kind(dtype))
}

fn distance_of(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn each_rung_is_what_torch_computes_that_way_in_the_same_dtype() {
    type Torch = fn(&Case) -> Vec<f64>;
    let cases: [(Rung, Torch); 6] = [
        (Rung::AllInDtype, eager_in_dtype),
        (Rung::ScoresInDtype, scores_in_dtype),
        (Rung::ScaledQueryInDtype, scaled_query_in_dtype),
        (Rung::F32, all_in_f32),
        (Rung::ProbsInDtype, probs_in_dtype),
        (Rung::SoftmaxStatsInDtype, online_state_in_dtype),
    ];
    for dtype in [DType::F16, DType::Bf16] {
        let case = case(dtype);
        let exact = reference_output(&case);
        for (rung, torch) in cases {
            let torch = torch(&case);
            let emulated = emulate(&case, rung);
            let (to_rung, to_exact) = (distance_of(&torch, &emulated), distance_of(&torch, &exact));
            println!(
                "{dtype} {rung:?}: torch is {to_rung:.2e} from the rung, {to_exact:.2e} from exact"
            );
            // Torch lands on the rung: four times closer than on the exact result, or within
            // one unit in the last place of the output where the rung itself moves it no more
            // than that (the f32 rung; P rounded over this few keys), where two correct
            // implementations may round the output either way.
            let largest = torch.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let ulp = 2.0 * dtype.epsilon() * largest;
            let bound = (to_exact / 4.0).max(ulp);
            assert!(
                to_rung <= bound,
                "{dtype} {rung:?}: torch is {to_rung:.2e} from the rung and {to_exact:.2e} from exact"
            );
        }
    }
}

/// ALiBi's positions built in bf16 (`arange` in the model's dtype), everything else in f32:
/// past 256 tokens neighbours share a position.
#[test]
fn the_positions_rung_is_torch_building_alibi_positions_in_the_dtype() {
    let dtype = DType::Bf16;
    let slopes = [0.5f32, 0.25, 0.125, 0.0625];
    let mut c = AttentionConfig::new(HEADS, HEADS, D, 16, dtype);
    c.alibi_slopes = Some(slopes.to_vec());
    let n = 320;
    let case = build_case(&[n], &[n], c, 5, &BuildOptions::default());
    let (q, k, v) = qkv(&case);
    let f = |t: &Tensor| t.to_kind(Kind::Float);
    let positions =
        Tensor::arange(n as i64, (Kind::BFloat16, tch::Device::Cpu)).to_kind(Kind::Float);
    let distance = positions.unsqueeze(0) - positions.unsqueeze(1); // [query, key]: k - p
    let bias = Tensor::from_slice(&slopes).view([HEADS as i64, 1, 1]) * distance.unsqueeze(0);
    let scores = f(&q).matmul(&f(&k).transpose(1, 2)) * case.config.effective_scale() + bias;
    let torch = softmax_pv_in_f32(&case, scores, &v);
    let (to_rung, to_exact) = (
        distance_of(&torch, &emulate(&case, Rung::PositionsInDtype)),
        distance_of(&torch, &reference_output(&case)),
    );
    println!(
        "bf16 PositionsInDtype: torch is {to_rung:.2e} from the rung, {to_exact:.2e} from exact"
    );
    assert!(to_rung * 4.0 <= to_exact, "{to_rung:.2e} vs {to_exact:.2e}");
}
