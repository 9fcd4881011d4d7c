//! Time one forward call of the `cpu` backend on upstream specs (median of several reps).
//!
//! `cargo run --release -p attn-backends --no-default-features --example cpu_bench -- \
//!    [--specs a,b] [--dtype bf16] [--block 32] [--threads 2] [--reps 11] [--simd avx512] [--kv-cache fp8_e4m3] [--split auto] [--tiles auto] [--cold]`
//!
//! Shape is Llama-3-8B's (32 query heads, 8 kv heads, head size 128). GB/s counts the K and V
//! bytes of every sequence read once.

use attn_backends::cpu::{CpuBackend, CpuSettings, KvTiles, SimdChoice, SimdLevel, SplitKv};
use attn_backends::{prepare_cache, step_inputs, Backend, CacheEvictor};
use attn_reference::{all_specs, build_spec_case, AttentionConfig, DType, Fp8Format, Fp8KvCache};
use std::time::Instant;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let dtype: DType = arg(&args, "--dtype").unwrap_or("bf16".into()).parse()?;
    let block: usize = arg(&args, "--block")
        .unwrap_or("32".into())
        .parse()
        .map_err(|e| format!("--block: {e}"))?;
    let threads: usize = arg(&args, "--threads")
        .unwrap_or("2".into())
        .parse()
        .map_err(|e| format!("--threads: {e}"))?;
    let reps: usize = arg(&args, "--reps")
        .unwrap_or("11".into())
        .parse::<usize>()
        .map_err(|e| format!("--reps: {e}"))?
        .max(1);
    let simd = match arg(&args, "--simd") {
        Some(s) => SimdChoice::Force(s.parse::<SimdLevel>()?),
        None => SimdChoice::Auto,
    };
    let split_kv = match arg(&args, "--split").as_deref() {
        None | Some("auto") => SplitKv::Auto,
        Some("always") => SplitKv::Always,
        Some("never") => SplitKv::Never,
        Some(o) => return Err(format!("--split {o}: expected auto, always or never")),
    };
    // `--kv-cache fp8_e4m3|fp8_e5m2`: an FP8 cache with scales 1 (default: the compute dtype).
    let kv_cache = match arg(&args, "--kv-cache").as_deref() {
        None | Some("auto") => None,
        Some(f) => Some(Fp8KvCache::new(f.parse::<Fp8Format>()?, 1.0, 1.0)),
    };
    let wanted: Option<Vec<String>> =
        arg(&args, "--specs").map(|s| s.split(',').map(str::to_string).collect());
    let kv_tiles = match arg(&args, "--tiles").as_deref() {
        None | Some("auto") => KvTiles::Auto,
        Some("streaming") => KvTiles::Streaming,
        Some("resident") => KvTiles::Resident,
        Some(o) => return Err(format!("--tiles {o}: expected auto, streaming or resident")),
    };
    let backend = CpuBackend::new(CpuSettings {
        threads,
        simd,
        split_kv,
        kv_tiles,
    })
    .map_err(|e| e.to_string())?;
    println!(
        "cpu backend: {} threads, {}, split {:?}, {dtype}, KV cache {}, block {block}, (32, 8, 128)",
        backend.threads(),
        backend.simd_level(),
        split_kv,
        kv_cache.as_ref().map_or("auto".to_string(), |c| c.dtype.to_string())
    );
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>8}",
        "spec", "median ms", "min ms", "KV MB", "GB/s"
    );
    // `--cold`: caches evicted before each call (see `CacheEvictor`).
    let mut evict = args.iter().any(|a| a == "--cold").then(CacheEvictor::new);
    for spec in all_specs() {
        if wanted
            .as_ref()
            .is_some_and(|w| !w.iter().any(|n| n == spec.name))
        {
            continue;
        }
        let mut cfg = AttentionConfig::new(32, 8, 128, block, dtype);
        cfg.kv_cache = kv_cache.clone();
        let case = build_spec_case(&spec, cfg, 0);
        let cfg = &case.config;
        let cache = prepare_cache(&backend, &case).map_err(|e| e.to_string())?;
        let qsl = case.query_start_loc();
        let step = step_inputs(&case, &qsl);
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps + 1 {
            if let Some(e) = &mut evict {
                e.evict();
            }
            let start = Instant::now();
            let out = backend
                .forward(cfg, &cache, &step)
                .map_err(|e| e.to_string())?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(out);
        }
        times.remove(0); // warm-up
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let kv_bytes = case.kv_bytes();
        println!(
            "{:<24} {:>10.3} {:>10.3} {:>10.1} {:>8.1}",
            spec.name,
            median,
            times[0],
            kv_bytes as f64 / 1e6,
            kv_bytes as f64 / 1e6 / median
        );
    }
    Ok(())
}
