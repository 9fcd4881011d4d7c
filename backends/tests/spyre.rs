//! The spyre variants against the f64 oracle: the small upstream specs, then one small case
//! per feature, each run through `run_case` (stale data in unused slots, context written,
//! new tokens written through slot_mapping, forward).
#![cfg(feature = "spyre")]

mod common;

use attn_backends::spyre::{Budgets, Spyre};
use attn_backends::{run_case, Backend, BackendError};
use attn_reference::{
    build_case, build_spec_case, reference_output, spec_by_name, AttentionConfig, BuildOptions,
    Case, DType,
};
use common::compare;

/// Run `case` through `backend` and compare with the oracle.
#[track_caller]
fn check(backend: &dyn Backend, case: &Case) {
    let run = run_case(backend, case)
        .unwrap_or_else(|e| panic!("{}: {e}\ncase: {}", backend.name(), case.shape_summary()));
    let expected = reference_output(case);
    if let Err(report) = compare(case, &run.output, &expected) {
        panic!(
            "{} diverges from the oracle on {}\n{report}",
            backend.name(),
            case.shape_summary()
        );
    }
}

fn variants() -> Vec<Spyre> {
    vec![Spyre::native(), Spyre::sdpa(), Spyre::device()]
}

/// Every variant that supports the case's config; the device variant is expected to run
/// every fp16 case with a head size that is a multiple of 64.
#[track_caller]
fn check_all(case: &Case) {
    let mut ran = 0;
    for b in variants() {
        if b.supports(&case.config).is_ok() {
            check(&b, case);
            ran += 1;
        }
    }
    let device_fits = case.config.dtype == DType::F16 && case.config.head_size.is_multiple_of(64);
    assert_eq!(
        ran,
        2 + usize::from(device_fits),
        "unexpected Unsupported for {}",
        case.config
    );
}

/// Tiny budgets: one page per native chunk, one sequence per SDPA group, so the online
/// softmax merges many chunks and the SDPA grouping splits.
fn chunked(v: Spyre) -> Spyre {
    v.with_budgets(Budgets {
        chunk_bytes: 1,
        group_kv_bytes: 1,
    })
}

fn cfg(hq: usize, hkv: usize, d: usize, bs: usize, dtype: DType) -> AttentionConfig {
    AttentionConfig::new(hq, hkv, d, bs, dtype)
}

fn case(config: AttentionConfig, seq_lens: &[usize], query_lens: &[usize], seed: u64) -> Case {
    build_case(seq_lens, query_lens, config, seed, &BuildOptions::default())
}

/// A mixed batch: decode, chunked prefill (context and several new tokens), full prefill.
const MIXED_SEQS: [usize; 4] = [9, 1, 23, 17];
const MIXED_QUERIES: [usize; 4] = [1, 1, 6, 17];

// ---------------------------------------------------------------- the comparison bites

#[test]
fn comparison_fails_for_a_wrong_expectation() {
    let c = case(cfg(4, 2, 16, 4, DType::F32), &[9, 5], &[3, 1], 1);
    let run = run_case(&Spyre::native(), &c).unwrap();
    let mut expected = reference_output(&c);
    assert!(compare(&c, &run.output, &expected).is_ok());
    // One value off by a few units of the tolerance must be caught and located.
    expected[17] += 1e-4;
    let report = compare(&c, &run.output, &expected).unwrap_err();
    assert!(report.contains("token 0 head 1 dim 1"), "{report}");
    let mut nan = run.output.clone();
    nan[3] = f32::NAN;
    assert!(compare(&c, &nan, &reference_output(&c))
        .unwrap_err()
        .contains("non-finite"));
}

// ---------------------------------------------------------------- upstream specs

fn upstream(name: &str, dtype: DType) -> Case {
    let spec = spec_by_name(name).unwrap();
    build_spec_case(&spec, cfg(32, 8, 128, 16, dtype), 0x5eed)
}

// ---------------------------------------------------------------- batches and layouts

#[test]
fn chunked_online_softmax_and_split_groups() {
    for dtype in DType::ALL {
        let c = case(cfg(6, 2, 16, 3, dtype), &MIXED_SEQS, &MIXED_QUERIES, 20);
        check(&chunked(Spyre::native()), &c);
        check(&chunked(Spyre::sdpa()), &c);
    }
}

#[test]
fn query_len_equals_seq_len() {
    check_all(&case(cfg(4, 4, 64, 8, DType::F16), &[13, 7], &[13, 7], 30));
    check_all(&case(cfg(4, 1, 32, 8, DType::F32), &[20], &[20], 31));
}

#[test]
fn one_token_sequences() {
    for dtype in DType::ALL {
        check_all(&case(cfg(4, 2, 64, 4, dtype), &[1, 1, 1], &[1, 1, 1], 40));
    }
}

#[test]
fn block_size_one_and_odd_block_sizes() {
    for bs in [1, 3, 7, 32] {
        check_all(&case(
            cfg(4, 2, 64, bs, DType::F16),
            &MIXED_SEQS,
            &MIXED_QUERIES,
            50 + bs as u64,
        ));
        check_all(&case(
            cfg(4, 2, 8, bs, DType::F32),
            &MIXED_SEQS,
            &MIXED_QUERIES,
            60 + bs as u64,
        ));
    }
}

#[test]
fn any_head_size() {
    for d in [1, 3, 80, 96] {
        check_all(&case(
            cfg(4, 2, d, 4, DType::F32),
            &MIXED_SEQS,
            &MIXED_QUERIES,
            90 + d as u64,
        ));
    }
    check_all(&case(cfg(2, 1, 192, 16, DType::F16), &[40, 3], &[2, 3], 95));
}

// ---------------------------------------------------------------- precision and errors

#[test]
fn native_in_bf16_working_precision_on_a_short_case() {
    let c = case(cfg(4, 2, 32, 4, DType::Bf16), &[9, 5], &[2, 5], 200);
    check(&Spyre::native_in(DType::Bf16), &c);
}

#[test]
fn device_rejects_what_the_device_cannot_run() {
    let d = Spyre::device();
    let u = d.supports(&cfg(4, 2, 64, 4, DType::Bf16)).unwrap_err();
    assert_eq!(u.feature, attn_reference::Dimension::Dtype);
    assert!(u.reason().contains("fp16"), "{u}");
    let u = d.supports(&cfg(4, 2, 80, 4, DType::F16)).unwrap_err();
    assert_eq!(u.feature, attn_reference::Dimension::HeadSize);
    assert_eq!(u.reason(), "head size not a multiple of 64");
    assert_eq!(u.value.as_deref(), Some("80"));
    let c = case(cfg(4, 2, 32, 4, DType::F16), &[3], &[1], 1);
    assert!(matches!(
        run_case(&d, &c),
        Err(BackendError::Unsupported(_))
    ));
}

#[test]
fn registered_by_name() {
    for name in ["spyre-native", "spyre-sdpa", "spyre-device"] {
        assert_eq!(attn_backends::backend_by_name(name).unwrap().name(), name);
    }
}

#[test]
fn malformed_steps_are_errors_not_panics() {
    let c = case(cfg(4, 2, 16, 4, DType::F32), &[9], &[2], 1);
    let b = Spyre::native();
    let mut cache = b.new_cache(&c.config, c.layout.num_blocks).unwrap();
    let key = vec![0f32; 2 * 16];
    let bad_slot = attn_backends::KvWrite {
        key: &key,
        value: &key,
        slot_mapping: &[1 << 40],
    };
    assert!(matches!(
        b.write_kv(&c.config, &mut cache, &bad_slot),
        Err(BackendError::InvalidInput { .. })
    ));
    let qsl = c.query_start_loc();
    let short_table = vec![vec![c.layout.block_table[0][0]]];
    let step = attn_backends::StepInputs {
        query: &c.tensors.query,
        query_start_loc: &qsl,
        seq_lens: &c.batch.seq_lens,
        block_table: &short_table,
        num_tokens: c.num_tokens(),
        causal: None,
        prefix_lm: None,
        rswa: None,
    };
    assert!(matches!(
        b.forward(&c.config, &cache, &step),
        Err(BackendError::InvalidInput { .. })
    ));
}

/// The larger upstream specs, causal and with upstream's window of 2047 (slow in debug
/// builds: `cargo test --test spyre -- --ignored`).
#[test]
#[ignore]
fn upstream_large_specs_bf16() {
    for name in [
        "medium_decode",
        "medium_prefill",
        "mixed_medium",
        "large_decode",
        "large_prefill",
        "mixed_large",
        "single_prefill",
    ] {
        for window in [None, Some(2047)] {
            let mut c = upstream(name, DType::Bf16);
            c.config.sliding_window = window;
            check(&Spyre::native(), &c);
            check(&Spyre::sdpa(), &c);
        }
    }
}
