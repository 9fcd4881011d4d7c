//! One forward call of the `cpu` backend on vLLM's batch specs (Llama-3-8B heads: 32 query,
//! 8 kv, head size 128), bf16, block size 32, 2 threads. Throughput is the K/V bytes the
//! call reads, so criterion reports GB/s of KV read.
//!
//! `cargo bench -p attn-backends --no-default-features --bench cpu_kernel`
//! (`ATTN_BENCH_SPECS=large_decode,small_decode` picks specs, `ATTN_BENCH_DTYPE=f32` the dtype.)

use attn_backends::cpu::{CpuBackend, CpuSettings};
use attn_backends::{prepare_cache, step_inputs, Backend};
use attn_reference::{all_specs, build_spec_case, AttentionConfig, DType};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;

const DEFAULT_SPECS: &[&str] = &[
    "small_decode",
    "small_prefill",
    "mixed_small",
    "medium_decode",
    "medium_prefill",
    "mixed_medium",
    "large_decode",
    "single_decode",
    "single_prefill",
];

fn bench(c: &mut Criterion) {
    let dtype: DType = std::env::var("ATTN_BENCH_DTYPE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DType::Bf16);
    let wanted: Vec<String> = std::env::var("ATTN_BENCH_SPECS")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|_| DEFAULT_SPECS.iter().map(|s| s.to_string()).collect());
    let backend = CpuBackend::new(CpuSettings {
        threads: 2,
        ..CpuSettings::default()
    })
    .expect("backend");
    let mut group = c.benchmark_group(format!("cpu_forward_{dtype}_block32_2threads"));
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for spec in all_specs()
        .into_iter()
        .filter(|s| wanted.iter().any(|w| w == s.name))
    {
        let case = build_spec_case(&spec, AttentionConfig::new(32, 8, 128, 32, dtype), 0);
        let cache = prepare_cache(&backend, &case).expect("cache");
        let qsl = case.query_start_loc();
        let step = step_inputs(&case, &qsl);
        group.throughput(Throughput::Bytes(case.kv_bytes() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(spec.name), &step, |b, step| {
            b.iter(|| {
                black_box(
                    backend
                        .forward(&case.config, &cache, step)
                        .expect("forward"),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
