//! `attn-diff bench`: the time of one attention call per backend and upstream spec, measured
//! side by side in one run (backends interleaved A B A B ... so machine drift hits all alike),
//! with the machine's streaming read bandwidth measured in the same run as the physical limit
//! beside each decode number, and each backend's output checked against the oracle once per
//! spec (a fast wrong backend is reported as wrong, not fast). A backend in another process
//! is timed by the kernel time it reports ([`Backend::reported_kernel_time`]), so the
//! exchange between the processes is not counted.

use attn_backends::{prepare_cache, step_inputs, Backend, BackendError, CacheEvictor, KvCache};
use attn_reference::{
    build_spec_case, reference_output, AttentionConfig, BatchSpec, Fp8Format, Fp8KvCache,
    KvCacheDtype,
};
use attn_results::compare::{compare, Tolerance};
pub use attn_results::{BackendId, BenchRow, BenchStatus, BenchSummary};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct BenchOptions {
    pub backends: Vec<Arc<dyn Backend>>,
    pub specs: Vec<BatchSpec>,
    /// Config the specs run at (its kind is taken from each spec).
    pub config: AttentionConfig,
    /// KV-cache variants timed side by side, each backend once per variant: `None` is the
    /// compute dtype, a format an FP8 cache with scales 1 (vLLM's default without
    /// calibration). Rows of an FP8 variant carry its KV-cache dtype in their `BackendId`.
    pub kv_caches: Vec<Option<Fp8Format>>,
    pub reps: usize,
    pub threads: usize,
    /// The backend the others are compared with, by name: its first row of each spec (the
    /// compute-dtype variant when that runs).
    pub baseline: Option<String>,
    pub seed: u64,
    /// Evict the caches before every timed call ([`CacheEvictor`]).
    pub cold: bool,
    /// Told what is being timed, for a progress display.
    pub on_event: Option<OnBenchEvent>,
}

/// A progress callback of [`run_bench`].
pub type OnBenchEvent = Box<dyn Fn(BenchEvent<'_>) + Send>;

/// What `run_bench` is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchEvent<'a> {
    /// The backends' calls on `spec` are being checked and timed (interleaved).
    Spec { spec: &'a str },
    /// `backend` is done with `spec`.
    Done {
        spec: &'a str,
        backend: &'a BackendId,
    },
}

/// Best-of-3 streaming read bandwidth over a 1 GiB buffer with `threads` threads, GB/s.
pub fn measure_read_bandwidth(threads: usize) -> f64 {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads.max(1));
    let mut best = 0.0f64;
    for _ in 0..3 {
        let start = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(chunk)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max((words * 8) as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Resident memory now and its high-water mark since the last reset, in bytes (Linux).
fn rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Peak resident memory one call adds: freed heap memory is returned to the OS first (so the
/// call's allocations must fault in fresh pages), then the high-water mark is reset.
fn peak_extra_bytes(call: impl FnOnce()) -> Option<f64> {
    // SAFETY: malloc_trim only releases free heap memory back to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    let (before, _) = rss()?;
    call();
    let (_, peak) = rss()?;
    Some(peak.saturating_sub(before) as f64)
}

struct Prepared {
    backend: Arc<dyn Backend>,
    /// The row's backend, with the KV-cache variant.
    id: BackendId,
    /// Which variant's case it runs.
    case: usize,
    cache: KvCache,
    times: Vec<Duration>,
    status: BenchStatus,
    peak: f64,
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    if v.is_empty() {
        Duration::ZERO
    } else {
        v[v.len() / 2]
    }
}

pub fn run_bench(opts: &BenchOptions) -> BenchSummary {
    let bandwidth = measure_read_bandwidth(opts.threads);
    let mut evictor = opts.cold.then(CacheEvictor::new);
    let mut rows = Vec::new();
    let tell = |e: BenchEvent<'_>| {
        if let Some(f) = &opts.on_event {
            f(e)
        }
    };
    for spec in &opts.specs {
        tell(BenchEvent::Spec { spec: spec.name });
        let variants: Vec<Option<Fp8Format>> = if opts.kv_caches.is_empty() {
            vec![None]
        } else {
            opts.kv_caches.clone()
        };
        let cases: Vec<_> = variants
            .iter()
            .map(|kv| {
                let mut config = opts.config.clone();
                config.kv_cache = kv.map(|f| Fp8KvCache::new(f, 1.0, 1.0));
                build_spec_case(spec, config, opts.seed)
            })
            .collect();
        let expected: Vec<Vec<f64>> = cases.iter().map(reference_output).collect();
        let tols: Vec<Tolerance> = cases.iter().map(Tolerance::for_case).collect();
        let qsls: Vec<Vec<usize>> = cases.iter().map(|c| c.query_start_loc()).collect();
        let steps: Vec<_> = cases
            .iter()
            .zip(&qsls)
            .map(|(c, q)| step_inputs(c, q))
            .collect();
        let mut prepared: Vec<Prepared> = variants
            .iter()
            .enumerate()
            .flat_map(|(i, kv)| opts.backends.iter().map(move |b| (i, kv, b)))
            .map(|(i, kv, b)| {
                let id = match kv {
                    None => b.id(),
                    Some(f) => b.id().with_kv_cache(KvCacheDtype::Fp8(*f)),
                };
                let (cache, status) = match prepare_cache(b.as_ref(), &cases[i]) {
                    Ok(cache) => (cache, BenchStatus::Ok),
                    Err(BackendError::Unsupported(u)) => (
                        Box::new(()) as KvCache,
                        BenchStatus::Unsupported { reason: u },
                    ),
                    Err(e) => (
                        Box::new(()) as KvCache,
                        BenchStatus::Error {
                            message: e.to_string(),
                        },
                    ),
                };
                Prepared {
                    backend: b.clone(),
                    id,
                    case: i,
                    cache,
                    times: Vec::new(),
                    status,
                    peak: f64::NAN,
                }
            })
            .collect();
        // Warm-up call: correctness against the oracle and the memory high-water mark.
        for p in prepared.iter_mut().filter(|p| p.status == BenchStatus::Ok) {
            let mut result = None;
            let case = &cases[p.case];
            let peak = peak_extra_bytes(|| {
                result = Some(p.backend.forward(&case.config, &p.cache, &steps[p.case]))
            });
            // A backend in another process grows that process, not this one.
            p.peak = match p.backend.reported_kernel_time() {
                Some(_) => f64::NAN,
                None => peak.unwrap_or(f64::NAN),
            };
            match result {
                Some(Ok(out)) => {
                    let cmp = compare(
                        &out,
                        &expected[p.case],
                        case.config.num_heads,
                        case.config.head_size_v(),
                        tols[p.case],
                    );
                    if !cmp.passed() {
                        p.status = BenchStatus::Wrong {
                            mismatches: cmp.mismatch_count,
                            max_abs_err: cmp.max_abs_err,
                        };
                    }
                }
                Some(Err(e)) => {
                    p.status = BenchStatus::Error {
                        message: e.to_string(),
                    }
                }
                None => {
                    p.status = BenchStatus::Error {
                        message: "no result".into(),
                    }
                }
            }
        }
        // Timed calls, interleaved across backends.
        for _ in 0..opts.reps {
            for p in prepared.iter_mut().filter(|p| p.status.is_timed()) {
                if let Some(e) = evictor.as_mut() {
                    e.evict();
                }
                let start = Instant::now();
                let out = p
                    .backend
                    .forward(&cases[p.case].config, &p.cache, &steps[p.case]);
                let wall = start.elapsed();
                p.times
                    .push(p.backend.reported_kernel_time().unwrap_or(wall));
                std::hint::black_box(out.ok());
            }
        }
        let mut spec_rows: Vec<BenchRow> = prepared
            .iter_mut()
            .map(|p| {
                let case = &cases[p.case];
                let decode = case.batch.query_lens.iter().all(|&q| q == 1);
                let min = p.times.iter().min().copied().unwrap_or_default();
                let med = median(&mut p.times);
                let secs = med.as_secs_f64();
                let gbs = if secs > 0.0 {
                    case.kv_bytes() as f64 / secs / 1e9
                } else {
                    f64::NAN
                };
                BenchRow {
                    backend: p.id.clone(),
                    spec: spec.name.to_string(),
                    status: p.status.clone(),
                    median_ms: if p.times.is_empty() {
                        f64::NAN
                    } else {
                        secs * 1e3
                    },
                    min_ms: if p.times.is_empty() {
                        f64::NAN
                    } else {
                        min.as_secs_f64() * 1e3
                    },
                    tokens_per_s: if secs > 0.0 {
                        case.num_real_tokens() as f64 / secs
                    } else {
                        f64::NAN
                    },
                    kv_gb_per_s: gbs,
                    fraction_of_bandwidth: if decode { gbs / bandwidth } else { f64::NAN },
                    peak_extra_mib: p.peak / (1 << 20) as f64,
                    ratio_to_baseline: None,
                }
            })
            .collect();
        if let Some(base) = opts.baseline.as_ref().and_then(|b| {
            spec_rows
                .iter()
                .find(|r| &r.backend.name == b)
                .map(|r| r.median_ms)
        }) {
            for r in spec_rows.iter_mut() {
                r.ratio_to_baseline =
                    (base.is_finite() && r.median_ms.is_finite()).then(|| r.median_ms / base);
            }
        }
        for r in &spec_rows {
            tell(BenchEvent::Done {
                spec: spec.name,
                backend: &r.backend,
            });
        }
        rows.extend(spec_rows);
    }
    BenchSummary {
        schema_version: attn_results::SCHEMA_VERSION,
        threads: opts.threads,
        reps: opts.reps,
        cold: opts.cold,
        dtype: opts.config.dtype.to_string(),
        heads: (opts.config.num_heads, opts.config.num_kv_heads),
        head_size: opts.config.head_size,
        mla_head_size_v: opts.config.mla.map(|m| m.head_size_v),
        block_size: opts.config.block_size,
        read_bandwidth_gb_per_s: bandwidth,
        baseline: opts.baseline.clone(),
        rows,
    }
}
