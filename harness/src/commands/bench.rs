//! `attn-diff bench`: one attention call per backend and upstream spec, timed side by side.

use super::setup::{spec_named, usage};
use crate::cli::{BenchArgs, GlobalArgs};
use crate::external::ExternalArgs;
use crate::pipeline::bench::{run_bench, BenchEvent, BenchOptions};
use crate::pipeline::upstream;
use crate::progress::Progress;
use crate::render::bench::{plot, render_markdown, render_text};
use crate::render::Format;
use attn_backends::Backend;
use attn_reference::{AttentionConfig, AttentionKind, BatchSpec};
use attn_results::BackendRef;
use std::sync::Arc;

/// Environment variable that tells an adapter how many threads `--threads` asks for (the
/// shipped adapters pass it to `torch.set_num_threads`).
pub const THREADS_ENV: &str = "ATTN_DIFF_THREADS";

/// A built-in backend with `threads` workers, or an adapter told the same.
fn bench_backend(
    backend: &BackendRef,
    threads: Option<usize>,
    external: &ExternalArgs,
) -> anyhow::Result<Arc<dyn Backend>> {
    let Some(adapter) = backend.adapter() else {
        let name = backend.to_string();
        return attn_backends::registry::backend_with_threads(&name, threads).map_err(|e| {
            usage(format!(
                "{e}{}",
                super::setup::backend_suggestion(&name, external)
            ))
        });
    };
    let mut spec = external.spec(adapter).map_err(|e| usage(e.to_string()))?;
    if let Some(n) = threads {
        spec.env.insert(THREADS_ENV.into(), n.to_string());
    }
    Ok(Arc::new(attn_backends::external::ExternalBackend::start(
        spec,
    )?))
}

pub fn run(args: BenchArgs, global: GlobalArgs) -> anyhow::Result<bool> {
    let mut config = if args.mla {
        if args.heads.kv != 1 {
            return Err(usage(format!(
                "--mla has one latent kv head: --heads {},1, not {},{}",
                args.heads.query, args.heads.query, args.heads.kv
            )));
        }
        AttentionConfig::deepseek_v3_mla(args.heads.query, args.block_size, args.dtype)
    } else {
        AttentionConfig::new(
            args.heads.query,
            args.heads.kv,
            args.head_size,
            args.block_size,
            args.dtype,
        )
    };
    config.validate().map_err(|e| usage(e.to_string()))?;
    config.kind = AttentionKind::Decoder;
    super::setup::check_config(&args.external)?;
    let specs: Vec<BatchSpec> = if args.specs.is_empty() {
        attn_reference::all_specs()
            .into_iter()
            .filter(|s| s.kind == AttentionKind::Decoder)
            .collect()
    } else {
        args.specs
            .iter()
            .map(|n| spec_named(n))
            .collect::<anyhow::Result<_>>()?
    };
    // Cases too large to build are refused before anything is allocated.
    for spec in &specs {
        super::setup::check_spec_size(spec, &config)?;
    }
    let refs: Vec<BackendRef> = if args.backend.is_empty() {
        attn_backends::backend_names()
            .iter()
            .map(|n| BackendRef::parse(n))
            .collect()
    } else {
        super::setup::dedupe(&args.backend)
    };
    let backends = refs
        .iter()
        .map(|n| bench_backend(n, args.threads, &args.external))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<String> = refs.iter().map(BackendRef::to_string).collect();
    if args.reps == 0 {
        return Err(usage("--reps must be at least 1"));
    }
    if let Some(b) = &args.baseline {
        if !names.contains(b) {
            return Err(usage(format!(
                "baseline `{b}` is not among the benchmarked backends ({})",
                names.join(", ")
            )));
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let progress = Progress::new(
        global.quiet,
        (specs.len() * backends.len() * args.kv_cache.len().max(1)) as u64,
        "spec × backend",
    );
    progress.phase("measuring read bandwidth");
    let bar = progress.handle();
    let reps = args.reps;
    let kv_caches = args
        .kv_cache
        .iter()
        .map(|k| match k.as_str() {
            "auto" => Ok(None),
            f => f.parse().map(Some).map_err(usage),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let opts = BenchOptions {
        backends,
        specs,
        config,
        kv_caches,
        reps,
        threads: args.threads.unwrap_or(cores),
        baseline: args.baseline.or_else(|| names.first().cloned()),
        seed: upstream::UPSTREAM_SEED,
        cold: args.cold,
        on_event: Some(Box::new(move |e| match e {
            BenchEvent::Spec { spec } => bar.phase(format!("{spec}: {reps} reps")),
            BenchEvent::Done { .. } => bar.step(),
        })),
    };
    let summary = run_bench(&opts);
    progress.finish();
    let text = match args.format {
        Format::Text => render_text(&summary),
        Format::Markdown => render_markdown(&summary),
        Format::Json => attn_results::to_json(&summary),
    };
    println!("{text}");
    if let Some(path) = args.plot {
        plot(&summary, &path).map_err(|e| usage(format!("cannot draw {}: {e}", path.display())))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(summary.all_ok())
}
