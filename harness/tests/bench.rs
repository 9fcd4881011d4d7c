//! `bench` runs on a tiny spec and its correctness check rejects a wrong backend. No test
//! here asserts a time.

mod support;

use attn_backends::Backend;
use attn_harness::bench::{run_bench, BenchOptions, BenchStatus};
use attn_reference::{spec_by_name, AttentionConfig, DType};
use std::sync::Arc;
use support::{Naive, Plant};

#[test]
fn bench_runs_and_reports_a_wrong_backend_as_wrong() {
    let wrong = Naive::with(
        "naive-gqa",
        Plant {
            gqa_modulo: true,
            ..Plant::default()
        },
    );
    let backends: Vec<Arc<dyn Backend>> = vec![Arc::new(Naive::correct()), Arc::new(wrong)];
    let opts = BenchOptions {
        backends,
        specs: vec![spec_by_name("small_decode").unwrap()],
        config: AttentionConfig::new(4, 2, 16, 16, DType::Bf16),
        reps: 3,
        threads: 1,
        baseline: Some("naive".into()),
        seed: 1,
        cold: false,
        on_event: None,
    };
    let s = run_bench(&opts);
    assert_eq!(s.rows.len(), 2);
    let (good, bad) = (&s.rows[0], &s.rows[1]);
    assert_eq!(good.status, BenchStatus::Ok);
    assert!(
        matches!(bad.status, BenchStatus::Wrong { .. }),
        "{}",
        bad.status
    );
    assert!(good.median_ms.is_finite() && good.min_ms <= good.median_ms);
    assert_eq!(good.ratio_to_baseline, Some(1.0));
    assert!(
        good.fraction_of_bandwidth.is_finite(),
        "small_decode is a decode spec"
    );
    assert!(s.read_bandwidth_gb_per_s > 0.0);
    let md = attn_harness::render::bench::render_markdown(&s);
    assert!(
        md.contains("| naive-gqa | small_decode |") && md.contains("WRONG"),
        "{md}"
    );
}

/// `cold` evicts the caches before each timed call; the rows are checked as in a warm run and
/// the summary says how they were timed.
#[test]
fn cold_bench_times_and_checks_every_backend() {
    let opts = BenchOptions {
        backends: vec![Arc::new(Naive::correct())],
        specs: vec![spec_by_name("small_decode").unwrap()],
        config: AttentionConfig::new(4, 2, 16, 16, DType::Bf16),
        reps: 2,
        threads: 1,
        baseline: None,
        seed: 1,
        cold: true,
        on_event: None,
    };
    let s = run_bench(&opts);
    assert!(s.cold);
    assert_eq!(s.rows.len(), 1);
    assert_eq!(s.rows[0].status, BenchStatus::Ok);
    assert!(s.rows[0].median_ms.is_finite());
    let md = attn_harness::render::bench::render_markdown(&s);
    assert!(md.contains("caches evicted before each call"), "{md}");
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["cold"], true);
}
