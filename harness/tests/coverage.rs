//! The default run reaches the whole case space: every declared coverage bucket (dtypes,
//! head-size tails, block sizes above 128, custom scales, windows, contexts past 16k, decode
//! batches past 512, steps past 8,192 tokens, groups past 64, logits past 1e5 and q·k past
//! f16's range, every batch composition, caches past 2^31 elements, …) holds at least one
//! case `cpu` ran, and its cases hold at least 95% of the valid pairs of features and shape
//! classes.

use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::{CheckOptions, DEFAULT_CASES};
use attn_reference::Feature;

#[test]
fn the_default_run_covers_every_bucket_for_cpu() {
    let run = run_check(CheckOptions::new(
        vec![attn_backends::backend_by_name("cpu").expect("cpu")],
        DEFAULT_CASES,
        std::env::temp_dir().join("attn-diff-coverage"),
    ));
    let b = &run.summary.backends[0];
    assert_eq!(b.failed(), 0, "{:?}", b.failures.first().map(|f| &f.text));
    let report = run.summary.coverage.as_ref().expect("a coverage report");
    let names = vec!["cpu".to_string()];
    for l in attn_results::coverage::summary_lines(report, &names) {
        println!("{l}");
    }
    assert_eq!(report.uncovered("cpu"), vec![], "empty buckets");
    for l in attn_results::coverage::pair_lines(report, &names) {
        println!("{l}");
    }
    let pairs = attn_results::coverage::pair_summary(report, "cpu");
    // vLLM 0.33's masks are drawn in every tier: none of their pairs is empty.
    let masks = [
        Feature::ChunkLookback,
        Feature::NonCausal,
        Feature::PrefixLm,
        Feature::Rswa,
    ]
    .map(Feature::label);
    let empty: Vec<&str> = pairs
        .missing()
        .into_iter()
        .filter(|p| masks.iter().any(|m| p.contains(m)))
        .collect();
    assert_eq!(
        empty,
        Vec::<&str>::new(),
        "empty pairs of vLLM 0.33's masks"
    );
    // vLLM 0.33's masks meet the long shapes by plan (`pipeline::long_masks`); what is left
    // empty is a few pairs of two random long-tier draws.
    assert!(
        pairs.percent() >= 95.0,
        "pairs covered: {:.1}%, empty: {:?}",
        pairs.percent(),
        pairs.missing()
    );
}
