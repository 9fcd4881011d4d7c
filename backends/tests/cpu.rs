//! The `cpu` backend against the f64 oracle: every SIMD level this machine has, with and
//! without split-KV, every dtype, on small targeted cases and on the smaller upstream specs.

mod common;

use attn_backends::cpu::{CpuBackend, CpuSettings, KvTiles, SimdChoice, SimdLevel, SplitKv};
use attn_backends::{run_case, Backend, BackendError, KvWrite, StepInputs};
use attn_reference::{
    build_case, reference_output, AttentionConfig, AttentionKind, BuildOptions, Case, DType,
};
use common::compare;
use proptest::prelude::*;
use std::io::Write;

/// Every code path: each available SIMD level, split always (with narrow decode tiles,
/// prefetching far ahead, and the f32 score kernel for decode) and never (with wide tiles,
/// no prefetching, and the bf16 pair-dot score kernel for every task where the CPU has it),
/// 2 threads; and one single-threaded run with automatic settings, which takes the no-pool
/// path and, on these small cases, prefetches the next block.
fn variants() -> Vec<(String, CpuBackend)> {
    let mut v = Vec::new();
    for level in SimdLevel::available() {
        for (split_kv, kv_tiles) in [
            (SplitKv::Always, KvTiles::Streaming),
            (SplitKv::Never, KvTiles::Resident),
        ] {
            let settings = CpuSettings {
                threads: 2,
                simd: SimdChoice::Force(level),
                split_kv,
                kv_tiles,
            };
            let name = format!("{level}/split={split_kv:?}/tiles={kv_tiles:?}");
            v.push((name, CpuBackend::new(settings).expect("an available level")));
        }
    }
    let single = CpuSettings {
        threads: 1,
        ..CpuSettings::default()
    };
    v.push((
        "auto/1 thread".into(),
        CpuBackend::new(single).expect("auto settings"),
    ));
    v
}

#[track_caller]
fn check(label: &str, case: &Case) {
    let expected = reference_output(case);
    let mut failures = Vec::new();
    for (name, backend) in variants() {
        let run = run_case(&backend, case).unwrap_or_else(|e| panic!("{label} [{name}]: {e}"));
        if let Err(e) = compare(case, &run.output, &expected) {
            failures.push(format!("[{name}] {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{label}: {}\n{}",
        case.shape_summary(),
        failures.join("\n")
    );
}

fn config(hq: usize, hkv: usize, d: usize, bs: usize, dtype: DType) -> AttentionConfig {
    AttentionConfig::new(hq, hkv, d, bs, dtype)
}

fn case(seq_lens: &[usize], query_lens: &[usize], cfg: AttentionConfig, seed: u64) -> Case {
    build_case(seq_lens, query_lens, cfg, seed, &BuildOptions::default())
}

/// Decode, chunked prefill, a one-token sequence and query_len == seq_len in one batch.
const SEQS: &[usize] = &[1, 5, 17, 40, 33];
const QUERIES: &[usize] = &[1, 5, 3, 1, 9];

#[test]
fn head_and_block_sizes() {
    for dtype in DType::ALL {
        for (d, bs) in [
            (1, 1),
            (3, 3),
            (80, 16),
            (128, 3),
            (128, 32),
            (5, 1),
            (17, 7),
            (64, 48),
        ] {
            check(
                &format!("d={d} bs={bs} {dtype}"),
                &case(SEQS, QUERIES, config(4, 2, d, bs, dtype), 2),
            );
        }
    }
}

fn slopes(n: usize) -> Vec<f32> {
    (0..n).map(|h| 2f32.powi(-(h as i32 + 1))).collect()
}

#[test]
fn large_logits() {
    // Scores in the hundreds: the online softmax must neither overflow nor lose the max.
    for dtype in DType::ALL {
        let mut cfg = config(4, 2, 16, 4, dtype);
        cfg.scale = Some(30.0);
        check(
            &format!("logits in the hundreds {dtype}"),
            &case(SEQS, QUERIES, cfg, 13),
        );
    }
}

#[test]
fn thread_counts_agree() {
    let c = case(
        &[300, 7, 1],
        &[1, 7, 1],
        config(8, 2, 64, 16, DType::F32),
        16,
    );
    let expected = reference_output(&c);
    for threads in [1, 2, 3, 8] {
        for split_kv in [SplitKv::Auto, SplitKv::Always] {
            let b = CpuBackend::new(CpuSettings {
                threads,
                split_kv,
                ..CpuSettings::default()
            })
            .expect("auto");
            let out = run_case(&b, &c).expect("runs").output;
            compare(&c, &out, &expected)
                .unwrap_or_else(|e| panic!("{threads} threads, {split_kv:?}: {e}"));
        }
    }
}

type Mutation = fn(&mut AttentionConfig);

#[test]
fn concurrent_calls_on_one_backend_agree() {
    let b = CpuBackend::new(CpuSettings {
        threads: 2,
        ..CpuSettings::default()
    })
    .expect("auto");
    let cases: Vec<Case> = (0..4)
        .map(|i| {
            case(
                &[200, 9, 1],
                &[1, 9, 1],
                config(8, 2, 64, 16, DType::Bf16),
                30 + i,
            )
        })
        .collect();
    std::thread::scope(|scope| {
        for c in &cases {
            let b = &b;
            scope.spawn(move || {
                let expected = reference_output(c);
                for _ in 0..20 {
                    let out = run_case(b, c).expect("runs").output;
                    compare(c, &out, &expected).unwrap_or_else(|e| panic!("concurrent call: {e}"));
                }
            });
        }
    });
}

/// A comparison that cannot fail proves nothing: wrong configs must be caught.
#[test]
fn wrong_configs_are_caught() {
    let mut base = config(8, 2, 16, 4, DType::Bf16);
    base.sliding_window = Some(3);
    let good = case(SEQS, QUERIES, base, 17);
    let mutations: [(&str, Mutation); 7] = [
        ("window off by one", |c| c.sliding_window = Some(4)),
        ("no window", |c| c.sliding_window = None),
        ("soft-cap", |c| c.logits_soft_cap = Some(0.5)),
        ("alibi", |c| c.alibi_slopes = Some(vec![0.5; 8])),
        ("sinks", |c| c.sinks = Some(vec![2.0; 8])),
        ("scale", |c| c.scale = Some(0.5)),
        ("encoder", |c| c.kind = AttentionKind::EncoderOnly),
    ];
    for (what, mutate) in mutations {
        let mut wrong = good.clone();
        mutate(&mut wrong.config);
        let expected = reference_output(&good);
        for (name, backend) in variants() {
            let out = run_case(&backend, &wrong).expect("runs").output;
            assert!(
                compare(&good, &out, &expected).is_err(),
                "[{name}] a backend run with {what} passed the comparison"
            );
        }
    }
    let mut nan = vec![0.0f32; 4];
    nan[2] = f32::NAN;
    let tiny = case(&[1], &[1], config(1, 1, 4, 1, DType::F32), 1);
    assert!(compare(&tiny, &nan, &[0.0; 4]).is_err());
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let b = CpuBackend::new(CpuSettings {
        threads: 2,
        ..CpuSettings::default()
    })
    .expect("auto");
    let cfg = config(4, 2, 8, 4, DType::F32);
    let mut cache = b.new_cache(&cfg, 3).expect("cache");
    let row = vec![0.0f32; 2 * 8];
    let bad_slot = KvWrite {
        key: &row,
        value: &row,
        slot_mapping: &[12],
    };
    assert!(matches!(
        b.write_kv(&cfg, &mut cache, &bad_slot),
        Err(BackendError::InvalidInput { .. })
    ));
    let short = KvWrite {
        key: &row[..3],
        value: &row,
        slot_mapping: &[0],
    };
    assert!(b.write_kv(&cfg, &mut cache, &short).is_err());
    let skip = KvWrite {
        key: &row,
        value: &row,
        slot_mapping: &[-1],
    };
    assert!(b.write_kv(&cfg, &mut cache, &skip).is_ok());

    let q = vec![0.0f32; 4 * 8];
    let table = vec![vec![7u32]];
    let step = StepInputs {
        query: &q,
        query_start_loc: &[0, 1],
        seq_lens: &[1],
        block_table: &table,
        num_tokens: 1,
        causal: None,
        prefix_lm: None,
        rswa: None,
    };
    assert!(
        b.forward(&cfg, &cache, &step).is_err(),
        "block outside the cache"
    );
    let table = vec![vec![1u32]];
    let step = StepInputs {
        query: &q,
        query_start_loc: &[0, 2],
        seq_lens: &[1],
        block_table: &table,
        num_tokens: 1,
        causal: None,
        prefix_lm: None,
        rswa: None,
    };
    assert!(
        b.forward(&cfg, &cache, &step).is_err(),
        "more queries than tokens"
    );
    let step = StepInputs {
        query: &q,
        query_start_loc: &[0, 1],
        seq_lens: &[5],
        block_table: &table,
        num_tokens: 1,
        causal: None,
        prefix_lm: None,
        rswa: None,
    };
    assert!(
        b.forward(&cfg, &cache, &step).is_err(),
        "table row too short"
    );
    let other = config(4, 2, 16, 4, DType::F32);
    assert!(
        b.forward(&other, &cache, &step).is_err(),
        "cache of another config"
    );
    let uneven = config(5, 2, 8, 4, DType::F32);
    assert!(b.supports(&uneven).is_err());
}

#[test]
fn registered_as_cpu() {
    assert!(attn_backends::backend_by_name("cpu").is_ok());
}

#[test]
fn this_machine_runs_every_level_it_has() {
    let names: Vec<String> = variants().iter().map(|(n, _)| n.clone()).collect();
    // Written past the test harness's capture, so every run's log says which SIMD paths
    // this machine ran.
    let levels: Vec<&str> = SimdLevel::available().iter().map(|l| l.name()).collect();
    let _ = writeln!(
        std::io::stderr(),
        "cpu SIMD levels on this machine, each tested: {levels:?} (variants: {names:?})"
    );
    for level in SimdLevel::available() {
        assert!(
            names.iter().any(|n| n.starts_with(level.name())),
            "{level} is not tested"
        );
    }
    if std::env::var_os("ATTN_DIFF_REQUIRE_AVX512").is_some() {
        assert!(
            SimdLevel::Avx512.is_available(),
            "AVX-512 required but not detected"
        );
    }
}

/// Random configs and batches: every feature combination the fixed cases above do not name.
fn random_case() -> impl Strategy<Value = Case> {
    let heads = (1usize..=3, 1usize..=4).prop_map(|(kv, g)| (kv * g, kv));
    let dims = (
        prop::sample::select(vec![1usize, 2, 3, 7, 16, 31, 64, 80, 128]),
        prop::sample::select(vec![1usize, 2, 3, 5, 8, 16, 32, 33]),
    );
    let features = (
        prop::sample::select(DType::ALL.to_vec()),
        any::<bool>(),
        prop::option::of(1usize..=24),
        prop::option::of(prop::sample::select(vec![1.0f32, 5.0, 30.0])),
        any::<bool>(),
        any::<bool>(),
    );
    let batch = (
        prop::collection::vec((1usize..=70, 0.0f64..=1.0), 1..=4),
        0usize..=3,
        any::<u64>(),
    );
    (heads, dims, features, batch).prop_map(
        |(
            (hq, hkv),
            (d, bs),
            (dtype, encoder, window, cap, alibi, sinks),
            (seqs, padding, seed),
        )| {
            let mut cfg = AttentionConfig::new(hq, hkv, d, bs, dtype);
            if encoder {
                cfg.kind = AttentionKind::EncoderOnly;
            }
            cfg.sliding_window = window;
            cfg.logits_soft_cap = cap;
            cfg.alibi_slopes = alibi.then(|| slopes(hq));
            cfg.sinks = sinks.then(|| (0..hq).map(|h| h as f32 * 0.7 - 1.0).collect());
            let seq_lens: Vec<usize> = seqs.iter().map(|s| s.0).collect();
            let query_lens: Vec<usize> = seqs
                .iter()
                .map(|&(l, f)| {
                    if encoder {
                        l
                    } else {
                        ((l as f64 * f).ceil() as usize).clamp(1, l)
                    }
                })
                .collect();
            let opts = BuildOptions {
                padding_tokens: padding,
                spare_blocks: 1,
                ..BuildOptions::default()
            };
            build_case(&seq_lens, &query_lens, cfg, seed, &opts)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_cases_match_the_oracle(case in random_case()) {
        let expected = reference_output(&case);
        for (name, backend) in variants() {
            let out = run_case(&backend, &case).map_err(|e| TestCaseError::fail(format!("[{name}] {e}")))?.output;
            if let Err(e) = compare(&case, &out, &expected) {
                return Err(TestCaseError::fail(format!("[{name}] {}\n{e}", case.shape_summary())));
            }
        }
    }
}

/// A cache no machine holds (67,108,864 blocks of 256 slots, 8 kv heads of 576: 633 TB in
/// f32, past the address space) is declined as `cache_size`, in every dtype and as an FP8
/// cache; `vec![0; n]` used to abort the process here.
#[test]
fn a_cache_past_the_address_space_is_declined_not_an_abort() {
    let b = CpuBackend::auto();
    for dtype in [DType::F32, DType::Bf16, DType::F16] {
        for fp8 in [None, Some(attn_reference::Fp8Format::E4m3)] {
            let mut c = config(8, 8, 576, 256, dtype);
            c.kv_cache = fp8.map(|f| attn_reference::Fp8KvCache::new(f, 1.0, 1.0));
            for num_blocks in [67_108_864, usize::MAX / 2] {
                match b.new_cache(&c, num_blocks) {
                    Err(BackendError::Unsupported(u)) => {
                        assert_eq!(u.feature, attn_reference::Dimension::CacheSize, "{u}")
                    }
                    Err(e) => panic!("{dtype:?} {fp8:?} {num_blocks}: {e}"),
                    Ok(_) => panic!("{dtype:?} {fp8:?} {num_blocks}: allocated"),
                }
            }
        }
    }
    // A cache that fits is still made, lazily.
    assert!(b
        .new_cache(&config(8, 8, 128, 16, DType::F32), 140_000)
        .is_ok());
}

/// An MLA config: `hq` heads over one latent entry of `dk`, V its first `dv`, scale 192^-0.5.
fn mla(hq: usize, dk: usize, dv: usize, bs: usize, dtype: DType) -> AttentionConfig {
    let mut c = AttentionConfig::new(hq, 1, dk, bs, dtype);
    c.mla = Some(attn_reference::Mla { head_size_v: dv });
    c.scale = Some(attn_reference::mla::model_scale(192));
    c
}

/// DeepSeek-V3's latent (576/512) under its tensor-parallel head counts and the small ones
/// head padding rounds up, block sizes 1, 16 and 64, decode and speculative queries over
/// contexts around and past 576 keys, every dtype.
#[test]
fn mla_at_deepseek_v3_shapes() {
    for (hq, bs, dtype) in [
        (128, 16, DType::Bf16),
        (16, 1, DType::F32),
        (8, 64, DType::F16),
        (2, 16, DType::Bf16),
    ] {
        let c = AttentionConfig {
            dtype,
            ..AttentionConfig::deepseek_v3_mla(hq, bs, DType::Bf16)
        };
        check(
            &format!("mla {hq} heads, block {bs}"),
            &case(&[577, 1, 700, 130], &[1, 1, 3, 2], c, 31),
        );
    }
}

/// Small latents (V narrower than K, as wide, a single dim), chunked queries, padding, a
/// shared prefix, and FP8 latent caches.
#[test]
fn mla_small_latents_and_fp8() {
    for (dk, dv) in [(3, 2), (17, 16), (8, 8), (40, 1)] {
        for dtype in DType::ALL {
            let opts = BuildOptions {
                padding_tokens: 2,
                spare_blocks: 2,
                shared_prefixes: vec![attn_reference::SharedPrefix {
                    seqs: vec![0, 1],
                    blocks: 2,
                }],
                ..BuildOptions::default()
            };
            let c = build_case(&[40, 12, 5], &[9, 3, 1], mla(6, dk, dv, 3, dtype), 7, &opts);
            check(&format!("mla {dk}/{dv} {dtype}"), &c);
        }
    }
    for f in attn_reference::Fp8Format::ALL {
        let mut c = mla(4, 24, 16, 16, DType::Bf16);
        c.kv_cache = Some(attn_reference::Fp8KvCache::new(f, 0.0625, 0.0625));
        check(&format!("mla {f}"), &case(&[600, 3], &[1, 2], c, 8));
    }
}

/// A write that carries V for an MLA cache (or none for an ordinary one) is an error.
#[test]
fn mla_writes_carry_no_value() {
    let b = CpuBackend::auto();
    let c = mla(2, 4, 3, 2, DType::F32);
    let mut cache = b.new_cache(&c, 4).unwrap();
    let key = [1.0f32; 4];
    let with_v = KvWrite {
        key: &key,
        value: &key,
        slot_mapping: &[2],
    };
    assert!(matches!(
        b.write_kv(&c, &mut cache, &with_v),
        Err(BackendError::InvalidInput { .. })
    ));
    let latent = KvWrite {
        value: &[],
        ..with_v
    };
    assert_eq!(b.write_kv(&c, &mut cache, &latent), Ok(()));
    let plain = config(2, 1, 4, 2, DType::F32);
    let mut plain_cache = b.new_cache(&plain, 4).unwrap();
    assert!(b.write_kv(&plain, &mut plain_cache, &latent).is_err());
    // A cache made for MLA is not one for the same shapes without it.
    assert!(b
        .write_kv(&config(2, 1, 4, 2, DType::F32), &mut cache, &with_v)
        .is_err());
}
