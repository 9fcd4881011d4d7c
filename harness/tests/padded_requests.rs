//! Padded requests (query length 0, seq_len 0 after the real ones, as vLLM pads a batch's
//! request count for CUDA graphs): the oracle gives them no rows and leaves the real rows
//! alone, the default run draws them for backends that declare them, and a backend that
//! does not is never sent one.

use attn_backends::cpu::CpuBackend;
use attn_backends::{
    declines_case, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs, Unsupported,
};
use attn_harness::check::{run_check, CheckOptions};
use attn_reference::{build_case, reference_output, AttentionConfig, BuildOptions, DType, Feature};
use std::sync::Arc;

const PADDED: &str = "padded requests (query length 0)";

#[test]
fn the_oracle_gives_padded_requests_no_rows_and_keeps_the_real_ones() {
    let config = AttentionConfig::new(4, 2, 8, 4, DType::F32);
    let opts = BuildOptions::default();
    let real = build_case(&[9, 4], &[3, 1], config.clone(), 5, &opts);
    let padded = build_case(&[9, 4, 0, 0], &[3, 1, 0, 0], config, 5, &opts);
    assert_eq!(padded.validate(), Ok(()));
    assert_eq!(reference_output(&real), reference_output(&padded));
}

/// `cpu` without the feature: it must never see a request of query length 0.
struct WithoutPadded(CpuBackend);

impl Backend for WithoutPadded {
    fn name(&self) -> &str {
        "cpu-without-padded-requests"
    }
    fn supports(&self, c: &AttentionConfig) -> Result<(), Unsupported> {
        self.0.supports(c)
    }
    fn optional_features(&self) -> Vec<Feature> {
        let mut f = self.0.optional_features();
        f.retain(|f| *f != Feature::PaddedRequests);
        f
    }
    fn cache_layout(&self) -> CacheLayout {
        self.0.cache_layout()
    }
    fn new_cache(&self, c: &AttentionConfig, num_blocks: usize) -> Result<KvCache, BackendError> {
        self.0.new_cache(c, num_blocks)
    }
    fn write_kv(
        &self,
        c: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        self.0.write_kv(c, cache, kv)
    }
    fn forward(
        &self,
        c: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        assert!(
            step.query_start_loc.windows(2).all(|w| w[1] > w[0]),
            "sent a padded request: {:?}",
            step.query_start_loc
        );
        self.0.forward(c, cache, step)
    }
}

#[test]
fn the_default_run_draws_them_only_for_backends_that_declare_them() {
    let backends: Vec<Arc<dyn Backend>> = vec![
        Arc::new(CpuBackend::auto()),
        Arc::new(WithoutPadded(CpuBackend::auto())),
    ];
    let run = run_check(CheckOptions {
        traces: 0,
        ..CheckOptions::new(backends, 200, std::env::temp_dir().join("attn-diff-padded"))
    });
    let coverage = run.summary.coverage.expect("coverage");
    let reached = |b: &str| {
        coverage
            .backends
            .get(b)
            .and_then(|d| d.get("features"))
            .and_then(|f| f.get(PADDED))
            .copied()
            .unwrap_or_default()
    };
    assert!(
        reached("cpu") >= 5,
        "cpu ran {} padded batches",
        reached("cpu")
    );
    assert_eq!(reached("cpu-without-padded-requests"), 0);
    for b in &run.summary.backends {
        assert_eq!(b.failed(), 0, "{}: {:?}", b.backend, b.failures);
        assert_eq!(
            b.property.declined, 0,
            "{} declined: drawn outside its space",
            b.backend
        );
    }

    let config = AttentionConfig::new(4, 2, 8, 4, DType::F32);
    let padded = build_case(&[9, 0], &[3, 0], config, 5, &BuildOptions::default());
    let refused = declines_case(&WithoutPadded(CpuBackend::auto()), &padded).unwrap_err();
    assert_eq!(refused.feature, Feature::PaddedRequests);
    assert_eq!(declines_case(&CpuBackend::auto(), &padded), Ok(()));
}
