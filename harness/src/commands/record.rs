//! `attn-diff record --out DIR -- COMMAND...`: run a vLLM command with the engine recorder
//! (the Python package's `attn_diff_adapter.recorder`, a vLLM general plugin) switched on in
//! every engine process, then say what it recorded. A run that recorded nothing fails.

use super::outcome::Outcome;
use super::setup::usage;
use crate::cli::RecordArgs;
use std::path::{Path, PathBuf};

/// Folders a checkout's engine needs on PYTHONPATH to load the recorder: the package, and
/// the entry-point shim that names it a vLLM plugin (an installed attn-diff wheel declares
/// the same entry point itself).
fn checkout_paths() -> Vec<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters/python");
    [python.clone(), python.join("engine_plugin")]
        .into_iter()
        .filter(|p| p.is_dir())
        .collect()
}

pub fn run(args: RecordArgs) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(&args.out).map_err(|e| {
        usage(format!(
            "--out {}: cannot create it: {e}",
            args.out.display()
        ))
    })?;
    let out = std::fs::canonicalize(&args.out)?;
    let mut paths = checkout_paths();
    if let Some(existing) = std::env::var_os("PYTHONPATH") {
        paths.extend(std::env::split_paths(&existing));
    }
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| usage("record: give the command to run after `--`"))?;
    let layers: Vec<String> = args.layers.iter().map(|l| l.to_string()).collect();
    let status = std::process::Command::new(program)
        .args(rest)
        .env("ATTN_DIFF_RECORD", &out)
        .env("ATTN_DIFF_RECORD_LAYERS", layers.join(","))
        .env("ATTN_DIFF_RECORD_EVERY", args.every.to_string())
        .env("ATTN_DIFF_RECORD_MAX_CALLS", args.max_calls.to_string())
        .env("ATTN_DIFF_RECORD_MAX_TOKENS", args.max_tokens.to_string())
        .env("PYTHONPATH", std::env::join_paths(paths)?)
        .status()
        .map_err(|e| usage(format!("record: cannot run {program}: {e}")))?;
    let recording = crate::pipeline::recording::load(&out);
    match &recording {
        Ok(r) => {
            let engines: Vec<String> = r
                .engines
                .iter()
                .flat_map(|e| e.backends.iter().cloned())
                .collect();
            println!(
                "recorded {} calls of {} in {} (vLLM {})",
                r.calls.len(),
                engines.join(", "),
                out.display(),
                r.engines.first().map_or("?", |e| e.vllm.as_str())
            );
            for (why, n) in r.left_out() {
                println!("  left out {n}: {why}");
            }
            println!("judge them: attn-diff check --recording {}", out.display());
        }
        Err(e) => eprintln!("attn-diff: {e}"),
    }
    if !status.success() {
        eprintln!("attn-diff: {program} exited with {status}");
    }
    Ok(Outcome::from(status.success() && recording.is_ok()))
}
