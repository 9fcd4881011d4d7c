//! What bounds `spyre-sdpa`, measured in one process with the same libtorch:
//!
//! - `parts SPEC...`: the contiguous SDPA floor (libtorch's SDPA on K/V already contiguous,
//!   as `adapters/python/torch_sdpa_floor.py` times it), the page gather alone (every
//!   sequence's K and V pages copied out of the paged cache, one sequence at a time as
//!   `spyre-sdpa` groups a long one), the gather followed by SDPA on what it leaves, and the
//!   backend's whole call.
//! - `budgets SPEC...`: each variant's time and peak extra memory for budgets of 1-16 MiB
//!   (SDPA's group and native's chunk budget; each still capped by the cache's size,
//!   `Budgets::within`).
//!
//! `cargo build --release -p attn-backends --example spyre_bounds`, then
//! `./target/release/examples/spyre_bounds parts large_decode large_prefill`. Peak memory is
//! only truthful with `MALLOC_MMAP_THRESHOLD_=65536` (large frees then leave the heap), which
//! slows the timings: read the two from separate runs. bf16, 32/8 heads, head size 128, block
//! 32, 2 threads: the bench's shapes.

use attn_backends::spyre::{set_threads, Budgets, Spyre};
use attn_backends::{prepare_cache, step_inputs, Backend};
use attn_reference::{all_specs, build_spec_case, AttentionConfig, AttentionKind, Case, DType};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

const REPS: usize = 9;

/// Median milliseconds of `f` over [`REPS`] calls after one warm-up.
fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[REPS / 2]
}

fn status_kib(field: &str) -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with(field))?.to_owned();
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Tensor {
    Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, false, None, false)
}

/// The floor, the gather and the gather with SDPA for `case`, on a random cache of its
/// shape and block table (the timings do not depend on the values).
fn parts(name: &str, case: &Case, backend_ms: f64) {
    let c = &case.config;
    let (hkv, g, d, bs) = (
        c.num_kv_heads as i64,
        c.group_size() as i64,
        c.head_size as i64,
        c.block_size as i64,
    );
    let (lens, qlens) = (&case.batch.seq_lens, &case.batch.query_lens);
    let b = lens.len() as i64;
    let lmax = *lens.iter().max().unwrap_or(&1) as i64;
    let qmax = *qlens.iter().max().unwrap_or(&1) as i64;
    let opt = (Kind::BFloat16, Device::Cpu);
    let blocks = case.layout.num_blocks as i64;
    let cache = Tensor::randn([2, blocks, bs * hkv * d], opt);
    let table: Vec<Tensor> = (0..lens.len())
        .map(|s| {
            let pages = lens[s].div_ceil(c.block_size);
            let row: Vec<i64> = case.layout.block_table[s][..pages]
                .iter()
                .map(|&x| x as i64)
                .collect();
            Tensor::from_slice(&row)
        })
        .collect();

    // The floor: K/V contiguous [b, Hkv, Lmax, D], GQA folded into query rows, a mask only
    // where the batch needs one.
    let kc = Tensor::randn([b, hkv, lmax, d], opt);
    let vc = Tensor::randn([b, hkv, lmax, d], opt);
    let q = Tensor::randn([b, hkv, g * qmax, d], opt);
    let unequal = lens.iter().any(|&l| l as i64 != lmax);
    let mask = (qmax > 1 || unequal).then(|| {
        let keys = Tensor::arange(lmax, (Kind::Int64, Device::Cpu)).view([1, 1, lmax]);
        let qpos: Vec<i64> = lens
            .iter()
            .zip(qlens)
            .flat_map(|(&l, &ql)| (0..qmax).map(move |j| (l - ql) as i64 + j.min(ql as i64 - 1)))
            .collect();
        let visible = keys.le_tensor(&Tensor::from_slice(&qpos).view([b, qmax, 1]));
        visible
            .view([b, 1, 1, qmax, lmax])
            .expand([b, 1, g, qmax, lmax], false)
            .reshape([b, 1, g * qmax, lmax])
    });
    let floor = median_ms(|| {
        let _ = sdpa(&q, &kc, &vc, mask.as_ref());
    });

    // One sequence's pages at a time into reused buffers, as `spyre-sdpa` gathers.
    let row = bs * hkv * d;
    let pages_max = table.iter().map(|t| t.size()[0]).max().unwrap_or(1);
    let kbuf = Tensor::empty([pages_max, row], opt);
    let vbuf = Tensor::empty([pages_max, row], opt);
    let gather = |s: usize| {
        let n = table[s].size()[0];
        let ids = &table[s];
        let k = cache
            .select(0, 0)
            .index_select_out(&kbuf.narrow(0, 0, n), 0, ids);
        let v = cache
            .select(0, 1)
            .index_select_out(&vbuf.narrow(0, 0, n), 0, ids);
        let view = |t: Tensor| {
            t.view([1, -1, hkv, d])
                .narrow(1, 0, lens[s] as i64)
                .transpose(1, 2)
        };
        (view(k), view(v))
    };
    let gather_ms = median_ms(|| {
        for s in 0..lens.len() {
            let _ = gather(s);
        }
    });
    let gather_sdpa_ms = median_ms(|| {
        for s in 0..lens.len() {
            let (k, v) = gather(s);
            let s = s as i64;
            let qs = q.narrow(0, s, 1);
            let m = mask
                .as_ref()
                .map(|m| m.narrow(0, s, 1).narrow(3, 0, k.size()[2]));
            let _ = sdpa(&qs, &k, &v, m.as_ref());
        }
    });
    println!(
        "{:<15} {:>9.2} {:>9.2} {:>12.2} {:>11.2} {:>10.2}x {:>10.2}x {:>10.2}x",
        name,
        floor,
        gather_ms,
        gather_sdpa_ms,
        backend_ms,
        gather_ms / floor,
        gather_sdpa_ms / floor,
        backend_ms / floor
    );
}

/// The backend's median time on `case`, and the peak resident memory one call adds (after
/// a warm-up call, so libtorch's one-time allocations are not counted).
fn run(b: &Spyre, case: &Case) -> (f64, f64) {
    let cache = prepare_cache(b, case).expect("cache");
    let qsl = case.query_start_loc();
    let step = step_inputs(case, &qsl);
    let call = || b.forward(&case.config, &cache, &step).expect("forward");
    drop(call());
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_kib("VmRSS:");
    let out = call();
    let peak = if reset {
        (status_kib("VmHWM:") - before) as f64 / 1024.0
    } else {
        f64::NAN
    };
    drop(out);
    (
        median_ms(|| {
            std::hint::black_box(call());
        }),
        peak,
    )
}

fn main() {
    set_threads(2);
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    let wanted: Vec<String> = args.collect();
    let config = AttentionConfig::new(32, 8, 128, 32, DType::Bf16);
    let specs: Vec<_> = all_specs()
        .into_iter()
        .filter(|s| s.kind == AttentionKind::Decoder)
        .filter(|s| wanted.is_empty() || wanted.iter().any(|w| w == s.name))
        .collect();
    match mode.as_str() {
        "parts" => println!(
            "{:<15} {:>9} {:>9} {:>12} {:>11} {:>11} {:>11} {:>11}",
            "spec",
            "floor_ms",
            "gather_ms",
            "gather+sdpa",
            "backend_ms",
            "gather/fl",
            "g+sdpa/fl",
            "backend/fl"
        ),
        "budgets" => {
            println!(
                "spec            variant quarter_MiB  then per budget: median_ms / peak_extra_MiB"
            )
        }
        _ => {
            eprintln!("usage: spyre_bounds parts|budgets [SPEC...]");
            std::process::exit(2);
        }
    }
    for spec in specs {
        let case = build_spec_case(&spec, config.clone(), 7);
        let kv_mib = (2
            * case.layout.num_blocks
            * config.block_size
            * config.num_kv_heads
            * config.head_size
            * config.dtype.size_bytes()) as f64
            / (1 << 20) as f64;
        if mode == "parts" {
            let (ms, _) = run(&Spyre::sdpa(), &case);
            parts(spec.name, &case, ms);
        } else {
            for variant in [Spyre::sdpa, Spyre::native] {
                let name = variant().name().trim_start_matches("spyre-").to_owned();
                let mut line = format!("{:<15} {name:<7} {:>11.1} ", spec.name, kv_mib / 4.0);
                for mib in [1usize, 2, 4, 8, 16] {
                    let budgets = Budgets {
                        chunk_bytes: mib << 20,
                        group_kv_bytes: mib << 20,
                    };
                    let (ms, peak) = run(&variant().with_budgets(budgets), &case);
                    line += &format!(" {mib:>2} MiB: {ms:>7.2} / {peak:>5.1}");
                }
                println!("{line}");
            }
        }
    }
}
