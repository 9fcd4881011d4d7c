//! `bench` runs on a tiny spec and its correctness check rejects a wrong backend. No test
//! here asserts a time.

mod support;

use attn_backends::Backend;
use attn_harness::pipeline::bench::{run_bench, BenchOptions, BenchStatus};
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
        kv_caches: vec![],
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
        kv_caches: vec![],
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

/// A backend that says how long its kernel took (as an adapter in another process does).
struct SelfTimed(Naive);

impl Backend for SelfTimed {
    fn name(&self) -> &str {
        "self-timed"
    }
    fn supports(&self, c: &AttentionConfig) -> Result<(), attn_backends::Unsupported> {
        self.0.supports(c)
    }
    fn cache_layout(&self) -> attn_backends::CacheLayout {
        self.0.cache_layout()
    }
    fn new_cache(
        &self,
        c: &AttentionConfig,
        n: usize,
    ) -> Result<attn_backends::KvCache, attn_backends::BackendError> {
        self.0.new_cache(c, n)
    }
    fn write_kv(
        &self,
        c: &AttentionConfig,
        cache: &mut attn_backends::KvCache,
        kv: &attn_backends::KvWrite<'_>,
    ) -> Result<(), attn_backends::BackendError> {
        self.0.write_kv(c, cache, kv)
    }
    fn forward(
        &self,
        c: &AttentionConfig,
        cache: &attn_backends::KvCache,
        step: &attn_backends::StepInputs<'_>,
    ) -> Result<Vec<f32>, attn_backends::BackendError> {
        self.0.forward(c, cache, step)
    }
    fn reported_kernel_time(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(250))
    }
}

/// A backend that reports its own kernel time is timed by it, not by the wall clock around
/// the call, and its memory (another process's) is not measured here.
#[test]
fn a_backend_reporting_its_kernel_time_is_timed_by_it() {
    let opts = BenchOptions {
        backends: vec![
            Arc::new(Naive::correct()),
            Arc::new(SelfTimed(Naive::correct())),
        ],
        specs: vec![spec_by_name("small_decode").unwrap()],
        config: AttentionConfig::new(4, 2, 16, 16, DType::Bf16),
        kv_caches: vec![],
        reps: 3,
        threads: 1,
        baseline: None,
        seed: 1,
        cold: false,
        on_event: None,
    };
    let s = run_bench(&opts);
    let (wall, reported) = (&s.rows[0], &s.rows[1]);
    assert_eq!(reported.status, BenchStatus::Ok);
    assert_eq!(reported.median_ms, 250.0);
    assert_eq!(reported.min_ms, 250.0);
    assert!(reported.peak_extra_mib.is_nan());
    assert!(wall.median_ms < 250.0 && wall.peak_extra_mib.is_finite());
}

/// KV-cache variants are timed side by side, one row per backend and variant, each checked
/// against the oracle of its own case; a backend without FP8 caches says so in its row.
#[test]
fn fp8_variants_are_rows_of_their_own() {
    use attn_reference::Fp8Format;
    let opts = BenchOptions {
        backends: vec![
            attn_backends::backend_by_name("cpu").unwrap(),
            Arc::new(Naive::correct()),
        ],
        specs: vec![spec_by_name("small_decode").unwrap()],
        config: AttentionConfig::new(4, 2, 16, 16, DType::Bf16),
        kv_caches: vec![None, Some(Fp8Format::E4m3), Some(Fp8Format::E5m2)],
        reps: 2,
        threads: 1,
        baseline: Some("cpu".into()),
        seed: 1,
        cold: false,
        on_event: None,
    };
    let s = run_bench(&opts);
    let ids: Vec<(&str, Option<String>)> = s
        .rows
        .iter()
        .map(|r| {
            let kv = r.backend.kv_cache_dtype.map(|k| k.to_string());
            (r.backend.name.as_str(), kv)
        })
        .collect();
    let fp8 = |f: &str| Some(f.to_string());
    assert_eq!(
        ids,
        [
            ("cpu", None),
            ("naive", None),
            ("cpu", fp8("fp8_e4m3")),
            ("naive", fp8("fp8_e4m3")),
            ("cpu", fp8("fp8_e5m2")),
            ("naive", fp8("fp8_e5m2"))
        ]
    );
    for r in &s.rows {
        match (r.backend.name.as_str(), r.backend.kv_cache_dtype) {
            ("naive", Some(_)) => assert!(
                matches!(r.status, BenchStatus::Unsupported { .. }),
                "{}",
                r.status
            ),
            _ => assert_eq!(r.status, BenchStatus::Ok, "{}", r.backend),
        }
    }
    // Rows of a variant are compared with the baseline's first row of the spec.
    assert!(s.rows[2].ratio_to_baseline.is_some_and(f64::is_finite));
}
