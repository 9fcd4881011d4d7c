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
    let t = |x: &[f32]| {
        Tensor::from_slice(x)
            .view([TOKENS as i64, HEADS as i64, D as i64])
            .transpose(0, 1)
            .to_kind(k_)
    };
    (t(&case.tensors.query[..TOKENS * HEADS * D]), t(&k), t(&v))
}

fn causal_mask() -> Tensor {
    let n = TOKENS as i64;
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
        (q.matmul(&k.transpose(1, 2)) * scale).masked_fill(&causal_mask(), f64::NEG_INFINITY);
    rows(scores.softmax(-1, kind(case.config.dtype)).matmul(&v))
}

/// `q @ k.T` in the dtype, everything after it in f32, the output cast back.
fn scores_in_dtype(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let scale = case.config.effective_scale();
    let scores = q.matmul(&k.transpose(1, 2)).to_kind(Kind::Float) * scale;
    let p = scores
        .masked_fill(&causal_mask(), f64::NEG_INFINITY)
        .softmax(-1, Kind::Float);
    rows(
        p.matmul(&v.to_kind(Kind::Float))
            .to_kind(kind(case.config.dtype)),
    )
}

/// `(q * scale) @ k.T` in the dtype (PyTorch's SDPA math path), the softmax in f32.
fn scaled_query_in_dtype(case: &Case) -> Vec<f64> {
    let (q, k, v) = qkv(case);
    let scale = case.config.effective_scale();
    let scores = (q * scale).matmul(&k.transpose(1, 2)).to_kind(Kind::Float);
    let p = scores
        .masked_fill(&causal_mask(), f64::NEG_INFINITY)
        .softmax(-1, Kind::Float);
    rows(
        p.matmul(&v.to_kind(Kind::Float))
            .to_kind(kind(case.config.dtype)),
    )
}

fn distance(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn each_rung_is_what_torch_computes_that_way_in_the_same_dtype() {
    type Torch = fn(&Case) -> Vec<f64>;
    let cases: [(Rung, Torch); 3] = [
        (Rung::AllInDtype, eager_in_dtype),
        (Rung::ScoresInDtype, scores_in_dtype),
        (Rung::ScaledQueryInDtype, scaled_query_in_dtype),
    ];
    for dtype in [DType::F16, DType::Bf16] {
        let case = case(dtype);
        let exact = reference_output(&case);
        for (rung, torch) in cases {
            let torch = torch(&case);
            let emulated = emulate(&case, rung);
            let (to_rung, to_exact) = (distance(&torch, &emulated), distance(&torch, &exact));
            println!(
                "{dtype} {rung:?}: torch is {to_rung:.2e} from the rung, {to_exact:.2e} from exact"
            );
            assert!(
                to_rung * 4.0 <= to_exact,
                "{dtype} {rung:?}: torch is {to_rung:.2e} from the rung and {to_exact:.2e} from exact"
            );
        }
    }
}
