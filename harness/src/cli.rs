//! The `attn-diff` command line.

use crate::check::{run_check, CheckOptions, Shard};
use crate::external::ExternalArgs;
use crate::replay::replay_case;
use crate::runner::Outcome;
use crate::shrink::ShrinkBudget;
use crate::summary::{render_json, render_markdown, render_text};
use crate::upstream;
use attn_backends::{all_backends, backend_by_name, Backend};
use attn_reference::Case;
use clap::{Parser, Subcommand, ValueEnum};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(
    name = "attn-diff",
    version,
    about = "Differential correctness harness for paged-attention backends"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Markdown,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Property cases (and named upstream specs) through backends against the oracle.
    Check {
        /// Comma-separated backend names (default: every registered backend); `external:NAME`
        /// runs an adapter declared in attn-diff.toml or with --external.
        #[arg(long, value_delimiter = ',')]
        backend: Vec<String>,
        #[command(flatten)]
        external: ExternalArgs,
        /// Property cases to run (default: PROPTEST_CASES, else 500).
        #[arg(long)]
        cases: Option<u32>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run only shard I of N (I/N): N shards together run exactly one run's cases.
        #[arg(long, default_value = "0/1")]
        shard: Shard,
        /// Also run these upstream specs (at every TP head config, in every upstream test that uses them).
        #[arg(long = "spec")]
        specs: Vec<String>,
        /// Also run the whole upstream suite (every spec, TP config and test).
        #[arg(long)]
        upstream: bool,
        /// Bigger batches and longer sequences.
        #[arg(long)]
        deep: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Where replay files of failures go.
        #[arg(long, default_value = "target/attn-diff/failures")]
        out: PathBuf,
    },
    /// Run a saved case (replay file) again.
    Replay {
        file: PathBuf,
        /// Backend to run (default: every registered backend).
        #[arg(long, value_delimiter = ',')]
        backend: Vec<String>,
        #[command(flatten)]
        external: ExternalArgs,
    },
    /// Write a case's tensors and the oracle's output to a safetensors file.
    Export {
        /// An upstream spec to build the case from.
        #[arg(long, conflicts_with = "case", required_unless_present = "case")]
        spec: Option<String>,
        /// A replay file (JSON case) to export instead.
        #[arg(long)]
        case: Option<PathBuf>,
        /// Query heads and kv heads, e.g. 32,8.
        #[arg(long, value_delimiter = ',', num_args = 2, default_values_t = [32usize, 8])]
        heads: Vec<usize>,
        #[arg(long, default_value_t = 128)]
        head_size: usize,
        #[arg(long, default_value = "bf16")]
        dtype: attn_reference::DType,
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        #[arg(long)]
        window: Option<usize>,
        #[arg(long, default_value_t = upstream::UPSTREAM_SEED)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// Time one attention call per backend and upstream spec, side by side.
    Bench {
        /// Comma-separated backend names (default: every registered backend).
        #[arg(long, value_delimiter = ',')]
        backend: Vec<String>,
        /// Upstream specs to time (default: every decoder spec).
        #[arg(long = "spec")]
        specs: Vec<String>,
        #[arg(long, default_value = "bf16")]
        dtype: attn_reference::DType,
        #[arg(long, default_value_t = 32)]
        block_size: usize,
        /// Query heads and kv heads, e.g. 32,8.
        #[arg(long, value_delimiter = ',', num_args = 2, default_values_t = [32usize, 8])]
        heads: Vec<usize>,
        #[arg(long, default_value_t = 128)]
        head_size: usize,
        /// Worker threads of every backend (default: the machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Timed calls per backend and spec (after one warm-up call).
        #[arg(long, default_value_t = 20)]
        reps: usize,
        /// Evict the CPU caches (256 MB written) before every timed call, as the other layers of
        /// a model do between two calls for one layer; without it, K/V that fits in the
        /// last-level cache is read from there.
        #[arg(long)]
        cold: bool,
        /// Backend the others are compared with (default: the first one).
        #[arg(long)]
        baseline: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write a bar chart of the times (PNG).
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Backends with what each supports, and the named specs.
    List {
        #[command(flatten)]
        external: ExternalArgs,
    },
    /// Every mutant (deliberately wrong backend) through the property runner and through the
    /// upstream suite alone: what each catches.
    #[cfg(feature = "mutants")]
    Mutants {
        /// Property cases per mutant (default: the check's default budget).
        #[arg(long)]
        cases: Option<u32>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run the upstream suite at every TP head config (default: only 8/2, the cheapest;
        /// the others hold the same specs with more heads).
        #[arg(long)]
        upstream_all_heads: bool,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        #[arg(long, default_value = "target/attn-diff/mutants")]
        out: PathBuf,
    },
}

/// Load a case from a replay file: JSON, or a safetensors file written by `export`.
pub fn load_case(path: &std::path::Path) -> anyhow::Result<Case> {
    let name = path.display();
    if path.extension().is_some_and(|e| e == "safetensors") {
        let meta =
            std::fs::metadata(path).map_err(|e| usage(format!("cannot read {name}: {e}")))?;
        if meta.is_dir() {
            return Err(usage(format!("cannot read {name}: is a directory")));
        }
        let bytes = std::fs::read(path).map_err(|e| usage(format!("cannot read {name}: {e}")))?;
        let (case, _) = crate::export::case_from_safetensors(&bytes)
            .map_err(|e| usage(format!("{name}: {e}")))?;
        return Ok(case);
    }
    Case::load(path).map_err(|e| usage(format!("{name}: {e}")))
}

/// An error of usage or set-up (exit 2), as opposed to a divergence (exit 1).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Backends by name; `external:NAME` adapters come from `./attn-diff.toml`.
pub fn select_backends(names: &[String]) -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    select_backends_with(names, &ExternalArgs::default())
}

/// Backends by name; `external:NAME` adapters are declared by `external` (started here, so a
/// broken adapter is a set-up error).
pub fn select_backends_with(
    names: &[String],
    external: &ExternalArgs,
) -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    if names.is_empty() {
        let all = all_backends();
        if all.is_empty() {
            return Err(usage("no backends are registered in this build"));
        }
        return Ok(all);
    }
    names
        .iter()
        .map(|n| match n.trim().strip_prefix(crate::external::PREFIX) {
            Some(adapter) => {
                crate::external::start_backend(adapter, external).map_err(|e| usage(e.to_string()))
            }
            None => backend_by_name(n.trim()).map_err(usage),
        })
        .collect()
}

/// Run the CLI; Ok(true) when everything passed.
pub fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Check {
            backend,
            external,
            cases,
            seed,
            shard,
            specs,
            upstream,
            deep,
            format,
            out,
        } => {
            let mut up = if upstream {
                upstream::full_suite()
            } else {
                upstream::small_suite()
            };
            if !specs.is_empty() {
                let named = upstream::cases_for_specs(&specs).map_err(usage)?;
                for c in named {
                    if !up.contains(&c) {
                        up.push(c);
                    }
                }
            }
            let backends = select_backends_with(&backend, &external)?;
            let cases = cases.unwrap_or_else(CheckOptions::default_cases);
            let progress = (format == Format::Text && std::io::stderr().is_terminal()).then(|| {
                let bar = indicatif::ProgressBar::new(cases as u64 / shard.count as u64);
                bar.set_style(
                    indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} cases {elapsed}")
                        .expect("valid template"),
                );
                bar
            });
            let on_case = progress
                .clone()
                .map(|b| Box::new(move || b.inc(1)) as Box<dyn Fn() + Send>);
            let summary = run_check(CheckOptions {
                backends,
                cases,
                seed,
                shard,
                deep,
                upstream: up,
                out_dir: out,
                shrink: ShrinkBudget::default(),
                on_case,
            });
            if let Some(b) = progress {
                b.finish_and_clear();
            }
            let text = match format {
                Format::Text => render_text(&summary),
                Format::Json => render_json(&summary),
                Format::Markdown => render_markdown(&summary),
            };
            println!("{text}");
            Ok(!summary.any_divergence())
        }
        Command::Replay {
            file,
            backend,
            external,
        } => {
            let case = load_case(&file)?;
            let backends = select_backends_with(&backend, &external)?;
            let mut ok = true;
            for r in replay_case(&case, &file.display().to_string(), &backends) {
                match (&r.outcome, &r.report) {
                    (Outcome::Pass(c), _) => println!(
                        "{}: pass (max abs {:.2e}, max rel {:.2e})",
                        r.backend, c.max_abs_err, c.max_rel_err
                    ),
                    (Outcome::Unsupported(why), _) => {
                        println!("{}: unsupported ({why})", r.backend)
                    }
                    (Outcome::Diverged(_), Some(rep)) => {
                        ok = false;
                        println!("{}", rep.text);
                    }
                    (Outcome::Diverged(d), None) => {
                        ok = false;
                        println!("{}: {} ({})", r.backend, d.kind, d.message);
                    }
                }
            }
            Ok(ok)
        }
        Command::Export {
            spec,
            case,
            heads,
            head_size,
            dtype,
            block_size,
            window,
            seed,
            out,
        } => {
            let case = match (spec, case) {
                (Some(name), _) => {
                    let spec = attn_reference::spec_by_name(&name).ok_or_else(|| {
                        usage(format!(
                            "unknown spec `{name}`; known specs: {}",
                            attn_reference::specs::spec_names().join(", ")
                        ))
                    })?;
                    let mut config = attn_reference::AttentionConfig::new(
                        heads[0], heads[1], head_size, block_size, dtype,
                    );
                    config.sliding_window = window;
                    config.kind = spec.kind;
                    // Check the config before building anything from it.
                    config.validate().map_err(|e| usage(e.to_string()))?;
                    attn_reference::build_spec_case(&spec, config, seed)
                }
                (None, Some(path)) => load_case(&path)?,
                (None, None) => return Err(usage("export needs --spec NAME or --case FILE")),
            };
            let expected = attn_reference::reference_output(&case);
            let bytes = crate::export::case_to_safetensors(&case, Some(&expected));
            attn_reference::golden::write_atomic(&out, &bytes)
                .map_err(|e| usage(format!("cannot write {}: {e}", out.display())))?;
            eprintln!(
                "wrote {} ({} bytes): {}",
                out.display(),
                bytes.len(),
                case.shape_summary()
            );
            Ok(true)
        }
        #[cfg(feature = "mutants")]
        Command::Mutants {
            cases,
            seed,
            upstream_all_heads,
            format,
            out,
        } => {
            let suite: Vec<_> = upstream::full_suite()
                .into_iter()
                .filter(|c| upstream_all_heads || c.heads == (8, 2))
                .collect();
            let summary = crate::mutants::run_mutants(
                cases.unwrap_or_else(CheckOptions::default_cases),
                seed,
                &suite,
                out,
            );
            let text = match format {
                Format::Text => crate::mutants::render_text(&summary),
                Format::Markdown => crate::mutants::render_markdown(&summary),
                Format::Json => serde_json::to_string_pretty(&summary).unwrap_or_default(),
            };
            println!("{text}");
            Ok(summary.all_killed())
        }
        Command::Bench {
            backend,
            specs,
            dtype,
            block_size,
            heads,
            head_size,
            threads,
            reps,
            cold,
            baseline,
            format,
            plot,
        } => {
            let mut config = attn_reference::AttentionConfig::new(
                heads[0], heads[1], head_size, block_size, dtype,
            );
            config.validate().map_err(|e| usage(e.to_string()))?;
            config.kind = attn_reference::AttentionKind::Decoder;
            let specs: Vec<attn_reference::BatchSpec> = if specs.is_empty() {
                attn_reference::all_specs()
                    .into_iter()
                    .filter(|s| s.kind == attn_reference::AttentionKind::Decoder)
                    .collect()
            } else {
                specs
                    .iter()
                    .map(|n| {
                        attn_reference::spec_by_name(n).ok_or_else(|| {
                            usage(format!(
                                "unknown spec `{n}`; known specs: {}",
                                attn_reference::specs::spec_names().join(", ")
                            ))
                        })
                    })
                    .collect::<anyhow::Result<_>>()?
            };
            let names: Vec<String> = if backend.is_empty() {
                attn_backends::backend_names()
            } else {
                backend
            };
            let backends = names
                .iter()
                .map(|n| {
                    attn_backends::registry::backend_with_threads(n.trim(), threads).map_err(usage)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            if reps == 0 {
                return Err(usage("--reps must be at least 1"));
            }
            if let Some(b) = &baseline {
                if !names.contains(b) {
                    return Err(usage(format!(
                        "baseline `{b}` is not among the benchmarked backends ({})",
                        names.join(", ")
                    )));
                }
            }
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let opts = crate::bench::BenchOptions {
                backends,
                specs,
                config,
                reps,
                threads: threads.unwrap_or(cores),
                baseline: baseline.or_else(|| names.first().cloned()),
                seed: upstream::UPSTREAM_SEED,
                cold,
            };
            let summary = crate::bench::run_bench(&opts);
            let text = match format {
                Format::Text => crate::bench::render_text(&summary),
                Format::Markdown => crate::bench::render_markdown(&summary),
                Format::Json => serde_json::to_string_pretty(&summary).unwrap_or_default(),
            };
            println!("{text}");
            if let Some(path) = plot {
                crate::bench::plot(&summary, &path)
                    .map_err(|e| usage(format!("cannot draw {}: {e}", path.display())))?;
                eprintln!("wrote {}", path.display());
            }
            Ok(summary
                .rows
                .iter()
                .all(|r| !r.status.starts_with("WRONG") && !r.status.starts_with("error")))
        }
        Command::List { external } => {
            println!("backends:");
            for b in all_backends() {
                let layout = b.cache_layout();
                println!(
                    "  {:<16} cache {}  ({})",
                    b.name(),
                    layout.shape,
                    layout.description
                );
                for (what, cfg) in probe_configs(b.as_ref()) {
                    if let Err(u) = b.supports(&cfg) {
                        println!("  {:<16}   no {what}: {u}", "");
                    }
                }
            }
            // Declared adapters are listed, not started: starting one runs its command.
            let declared = external.declared().map_err(|e| usage(e.to_string()))?;
            for a in &declared {
                println!(
                    "  {:<16} adapter `{}`, timeout {:.0} s (started on use)",
                    format!("external:{}", a.name),
                    a.command.join(" "),
                    a.timeout.as_secs_f64()
                );
            }
            println!("specs:");
            for s in attn_reference::all_specs() {
                println!(
                    "  {:<24} {:<12} seq_lens {:?} query_lens {:?}",
                    s.name,
                    s.kind.to_string(),
                    s.seq_lens,
                    s.query_lens
                );
            }
            Ok(true)
        }
    }
}

/// Representative configs `list` asks every backend about.
/// Each feature is probed on a plain config in a dtype the backend supports, so a backend
/// that refuses a dtype is not also reported as refusing every feature.
fn probe_configs(backend: &dyn Backend) -> Vec<(&'static str, attn_reference::AttentionConfig)> {
    use attn_reference::{AttentionConfig, AttentionKind, DType};
    let plain = |dt| AttentionConfig::new(8, 2, 128, 16, dt);
    let base = [DType::Bf16, DType::F16, DType::F32]
        .into_iter()
        .map(plain)
        .find(|c| backend.supports(c).is_ok())
        .unwrap_or_else(|| plain(DType::Bf16));
    let mut v = Vec::new();
    for dt in DType::ALL {
        v.push((
            dt.name(),
            AttentionConfig {
                dtype: dt,
                ..base.clone()
            },
        ));
    }
    v.push((
        "encoder-only",
        AttentionConfig {
            kind: AttentionKind::EncoderOnly,
            ..base.clone()
        },
    ));
    v.push((
        "sliding window",
        AttentionConfig {
            sliding_window: Some(64),
            ..base.clone()
        },
    ));
    v.push((
        "soft-cap",
        AttentionConfig {
            logits_soft_cap: Some(30.0),
            ..base.clone()
        },
    ));
    v.push((
        "ALiBi",
        AttentionConfig {
            alibi_slopes: Some(vec![0.5; 8]),
            ..base.clone()
        },
    ));
    v.push((
        "sinks",
        AttentionConfig {
            sinks: Some(vec![0.0; 8]),
            ..base.clone()
        },
    ));
    v.push((
        "head size 3",
        AttentionConfig {
            head_size: 3,
            ..base.clone()
        },
    ));
    v.push((
        "block size 1",
        AttentionConfig {
            block_size: 1,
            ..base.clone()
        },
    ));
    v.push((
        "9/3 heads",
        AttentionConfig {
            num_heads: 9,
            num_kv_heads: 3,
            ..base
        },
    ));
    v
}
