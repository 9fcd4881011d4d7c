//! Padded requests (query length 0, seq_len 0 after the real ones, as vLLM pads a batch's
//! request count for CUDA graphs): the oracle gives them no rows and leaves the real rows
//! alone, the default run draws them for backends that declare them, and a backend that
//! does not is never sent one.

use attn_backends::cpu::CpuBackend;
mod support;

use attn_backends::{declines_case, Backend};
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
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
fn without_padded() -> support::CpuWith {
    support::CpuWith {
        without: vec![Feature::PaddedRequests],
        before_forward: |step| {
            assert!(
                step.query_start_loc.windows(2).all(|w| w[1] > w[0]),
                "sent a padded request: {:?}",
                step.query_start_loc
            );
            Ok(())
        },
        ..support::CpuWith::new("cpu-without-padded-requests")
    }
}

#[test]
fn the_default_run_draws_them_only_for_backends_that_declare_them() {
    let backends: Vec<Arc<dyn Backend>> =
        vec![Arc::new(CpuBackend::auto()), Arc::new(without_padded())];
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
    let refused = declines_case(&without_padded(), &padded).unwrap_err();
    assert_eq!(refused.feature, Feature::PaddedRequests);
    assert_eq!(declines_case(&CpuBackend::auto(), &padded), Ok(()));
}
