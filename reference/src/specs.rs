//! vLLM's named batch specs and head configurations (tests/v1/attention/test_attention_backends.py).

use crate::AttentionKind;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BatchSpec {
    pub name: &'static str,
    pub seq_lens: Vec<usize>,
    pub query_lens: Vec<usize>,
    pub kind: AttentionKind,
}

fn spec(name: &'static str, seq_lens: Vec<usize>, query_lens: Vec<usize>) -> BatchSpec {
    BatchSpec {
        name,
        seq_lens,
        query_lens,
        kind: AttentionKind::Decoder,
    }
}

fn encoder(name: &'static str, seq_lens: Vec<usize>) -> BatchSpec {
    BatchSpec {
        name,
        query_lens: seq_lens.clone(),
        seq_lens,
        kind: AttentionKind::EncoderOnly,
    }
}

/// Cross-attention specs: `seq_lens` are the encoders' lengths, `query_lens` the decoder
/// tokens of the step.
fn cross(name: &'static str, seq_lens: Vec<usize>, query_lens: Vec<usize>) -> BatchSpec {
    BatchSpec {
        name,
        seq_lens,
        query_lens,
        kind: AttentionKind::EncoderDecoder,
    }
}

/// The head configs (query heads, kv heads, head size) of the models the cross-attention
/// specs are shaped like: Whisper large-v3 (20 heads of 64, 1500 encoder frames from 30 s
/// of audio, a 4-token decoder prompt) and BART-large (16 heads of 64, encoders up to 1024
/// tokens).
pub fn cross_heads(spec: &str) -> (usize, usize, usize) {
    if spec.starts_with("whisper") {
        (20, 20, 64)
    } else {
        (16, 16, 64)
    }
}

/// Every named spec, in upstream's order, then the cross-attention specs (attn-diff's own).
pub fn all_specs() -> Vec<BatchSpec> {
    vec![
        spec("small_decode", vec![32, 40], vec![1, 1]),
        spec("small_prefill", vec![32, 40], vec![8, 8]),
        spec("mixed_small", vec![32, 40, 48, 56], vec![1, 1, 5, 5]),
        spec(
            "medium_decode",
            vec![128, 256, 512, 1024, 128, 256, 512, 1024],
            vec![1; 8],
        ),
        spec("medium_prefill", vec![256, 512, 1024, 2048], vec![16; 4]),
        spec(
            "mixed_medium",
            vec![512, 1024, 2048, 512, 1024, 2048],
            vec![1, 1, 1, 7, 7, 7],
        ),
        spec("large_decode", vec![2048; 32], vec![1; 32]),
        spec("large_prefill", vec![4096; 8], vec![32; 8]),
        spec(
            "mixed_large",
            vec![1024, 2048, 4096, 1024, 2048, 4096],
            vec![1, 1, 1, 32, 32, 32],
        ),
        spec("single_decode", vec![1024], vec![1]),
        spec("single_prefill", vec![1024], vec![64]),
        encoder("small_encoder_prefill", vec![32, 64, 128, 256]),
        encoder("medium_encoder_prefill", vec![256, 512, 1024, 2048]),
        cross("whisper_cross_prefill", vec![1500, 1500], vec![4, 4]),
        cross("whisper_cross_decode", vec![1500; 8], vec![1; 8]),
        cross("bart_cross_prefill", vec![1024, 77], vec![16, 100]),
        cross("bart_cross_decode", vec![1024, 512, 300, 77], vec![1; 4]),
    ]
}

pub fn spec_by_name(name: &str) -> Option<BatchSpec> {
    all_specs().into_iter().find(|s| s.name == name)
}

pub fn spec_names() -> Vec<&'static str> {
    all_specs().iter().map(|s| s.name).collect()
}

/// Specs upstream's causal test runs (every decoder spec but mixed_large).
pub const CAUSAL_TEST_SPECS: &[&str] = &[
    "small_decode",
    "small_prefill",
    "mixed_small",
    "medium_decode",
    "medium_prefill",
    "mixed_medium",
    "large_decode",
    "large_prefill",
    "single_decode",
    "single_prefill",
];

/// Specs upstream's sliding-window test runs.
pub const SLIDING_WINDOW_TEST_SPECS: &[&str] = &[
    "small_decode",
    "small_prefill",
    "mixed_medium",
    "large_decode",
    "large_prefill",
    "mixed_large",
];

/// The window upstream's sliding-window test uses.
pub const UPSTREAM_SLIDING_WINDOW: usize = 2047;

/// Llama-3-8B (32 q heads, 8 kv heads, head size 128) at tensor parallel 1, 2 and 4.
pub const TP_HEAD_CONFIGS: &[(usize, usize)] = &[(32, 8), (16, 4), (8, 2)];
pub const UPSTREAM_HEAD_SIZE: usize = 128;
pub const UPSTREAM_BLOCK_SIZE: usize = 16;
/// Upstream's tolerance (atol = rtol).
pub const UPSTREAM_TOLERANCE: f64 = 1e-2;
