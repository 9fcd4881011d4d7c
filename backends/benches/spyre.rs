//! One forward call of each spyre variant on upstream specs at Llama-3-8B shapes (32 q heads,
//! 8 kv heads, head size 128, block 32, bf16, 2 threads): median time over repetitions and
//! the peak memory the first call adds, next to the KV cache's size.
//!
//! `OMP_WAIT_POLICY=PASSIVE cargo bench -p attn-backends --bench spyre [-- SPEC...]` (decoder
//! specs; what bounds `spyre-sdpa` on them: `backends/examples/spyre_bounds.rs`).
//! On a machine whose cores other processes also use, libgomp's spinning workers make
//! medians 10-100x noisier without the passive policy. Peak memory comes from the kernel's
//! high-water mark (reset before the call); only with `MALLOC_MMAP_THRESHOLD_=65536` do
//! large frees show in it, and that setting slows the timings, so read the two from
//! separate runs.

use attn_backends::spyre::Spyre;
use attn_backends::{prepare_cache, step_inputs, Backend};
use attn_reference::{all_specs, build_spec_case, AttentionConfig, AttentionKind, DType};
use std::time::Instant;

fn status_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Reset the peak-RSS counter to the current RSS; false where the kernel does not allow it.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let config = AttentionConfig::new(32, 8, 128, 32, DType::Bf16);
    let variants = [Spyre::native(), Spyre::sdpa()];
    println!(
        "spec            variant        median_ms   min_ms  reps  peak_extra_MiB  kv_cache_MiB"
    );
    // The decoder specs: the config above is a decoder's (the encoder and cross-attention
    // specs have their own shapes and kinds).
    for spec in all_specs()
        .into_iter()
        .filter(|s| s.kind == AttentionKind::Decoder)
        .filter(|s| wanted.is_empty() || wanted.iter().any(|w| w == s.name))
    {
        let case = build_spec_case(&spec, config.clone(), 7);
        let kv_bytes = 2
            * case.layout.num_blocks
            * config.block_size
            * config.num_kv_heads
            * config.head_size
            * config.dtype.size_bytes();
        let qsl = case.query_start_loc();
        let step = step_inputs(&case, &qsl);
        for b in &variants {
            let cache = prepare_cache(b, &case).expect("cache");
            // Peak memory of the first call, before any warm-up.
            let can_reset = reset_peak();
            let base = status_kib("VmRSS:").unwrap_or(0);
            let out = b.forward(&config, &cache, &step).expect("forward");
            let peak = status_kib("VmHWM:").unwrap_or(0);
            drop(out);
            let peak_mib = if can_reset {
                format!("{:.1}", peak.saturating_sub(base) as f64 / 1024.0)
            } else {
                "n/a".into()
            };

            let start = Instant::now();
            let mut times = Vec::new();
            while times.len() < 5 || (start.elapsed().as_secs_f64() < 2.0 && times.len() < 200) {
                let t0 = Instant::now();
                let out = b.forward(&config, &cache, &step).expect("forward");
                times.push(t0.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(out);
            }
            times.sort_by(f64::total_cmp);
            println!(
                "{:<15} {:<13} {:>10.3} {:>8.3} {:>5} {:>15} {:>13.1}",
                spec.name,
                b.name(),
                times[times.len() / 2],
                times[0],
                times.len(),
                peak_mib,
                kv_bytes as f64 / (1 << 20) as f64
            );
        }
    }
}
