//! vLLM's backend correctness test (tests/v1/attention/test_attention_backends.py), ported:
//! the causal test over every batch spec but mixed_large, the sliding-window test (w = 2047)
//! over its six specs, and the encoder-only specs, each at the TP-simulated head configs of
//! Llama-3-8B, bf16, block size 16, with upstream's tolerance (atol = rtol = 1e-2), through
//! every registered backend.

use attn_harness::pipeline::runner::{evaluate, Outcome};
use attn_harness::pipeline::upstream::{UpstreamCase, UpstreamTest};
use attn_reference::reference_output;
use attn_results::compare::Tolerance;
use rstest::rstest;

fn run(test: UpstreamTest, spec: &'static str, heads: (usize, usize)) {
    let uc = UpstreamCase { test, spec, heads };
    let case = uc.build();
    let expected = reference_output(&case);
    let backends = attn_backends::all_backends();
    assert!(
        !backends.is_empty(),
        "no backend registered: the upstream test would test nothing"
    );
    let mut failures = Vec::new();
    for b in &backends {
        match evaluate(b.as_ref(), &case, &expected, Tolerance::upstream()).0 {
            Outcome::Pass(_) => {}
            Outcome::Unsupported(why) => {
                eprintln!("{}: {} unsupported: {why}", uc.label(), b.name())
            }
            Outcome::Diverged(d) => failures.push(format!(
                "{}: {} {}: {}",
                uc.label(),
                b.name(),
                d.kind,
                d.message
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[rstest]
fn causal(
    #[values(
        "small_decode",
        "small_prefill",
        "mixed_small",
        "medium_decode",
        "medium_prefill",
        "mixed_medium",
        "large_decode",
        "large_prefill",
        "single_decode",
        "single_prefill"
    )]
    spec: &'static str,
    #[values((32, 8), (16, 4), (8, 2))] heads: (usize, usize),
) {
    run(UpstreamTest::Causal, spec, heads);
}

#[rstest]
fn sliding_window(
    #[values(
        "small_decode",
        "small_prefill",
        "mixed_medium",
        "large_decode",
        "large_prefill",
        "mixed_large"
    )]
    spec: &'static str,
    #[values((32, 8), (16, 4), (8, 2))] heads: (usize, usize),
) {
    run(UpstreamTest::SlidingWindow, spec, heads);
}

#[rstest]
fn encoder(
    #[values("small_encoder_prefill", "medium_encoder_prefill")] spec: &'static str,
    #[values((32, 8), (16, 4), (8, 2))] heads: (usize, usize),
) {
    run(UpstreamTest::Encoder, spec, heads);
}

/// attn-diff's own cross-attention specs, at the heads of the models they are shaped like.
#[rstest]
fn cross(
    #[values(
        "whisper_cross_prefill",
        "whisper_cross_decode",
        "bart_cross_prefill",
        "bart_cross_decode"
    )]
    spec: &'static str,
) {
    let (q, kv, _) = attn_reference::specs::cross_heads(spec);
    run(UpstreamTest::Cross, spec, (q, kv));
}

#[test]
fn the_port_covers_upstreams_lists() {
    use attn_reference::specs::{CAUSAL_TEST_SPECS, SLIDING_WINDOW_TEST_SPECS};
    let suite = attn_harness::pipeline::upstream::full_suite();
    assert_eq!(
        suite
            .iter()
            .filter(|c| c.test == UpstreamTest::Causal)
            .count(),
        CAUSAL_TEST_SPECS.len() * 3
    );
    assert_eq!(
        suite
            .iter()
            .filter(|c| c.test == UpstreamTest::SlidingWindow)
            .count(),
        SLIDING_WINDOW_TEST_SPECS.len() * 3
    );
    assert!(!CAUSAL_TEST_SPECS.contains(&"mixed_large"));
    assert_eq!(
        suite
            .iter()
            .filter(|c| c.test == UpstreamTest::Cross)
            .count(),
        4
    );
}
