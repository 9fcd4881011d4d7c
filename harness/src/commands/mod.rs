//! One file per subcommand: each takes its parsed arguments, runs the pipeline, writes the
//! artifacts and prints the rendered result. `Ok(true)`: everything agreed (exit 0);
//! `Ok(false)`: a divergence (exit 1); `Err`: a usage or set-up error (exit 2).

mod bench;
mod check;
mod export;
mod list;
#[cfg(feature = "mutants")]
mod mutants;
mod replay;

use crate::cli::{Cli, Command};
use crate::external::ExternalArgs;
use attn_backends::{all_backends, backend_by_name, Backend};
use attn_reference::Case;
use std::path::Path;
use std::sync::Arc;

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<bool> {
    let global = cli.global;
    match cli.command {
        Command::Check(args) => check::run(args, global),
        Command::Replay(args) => replay::run(args),
        Command::Export(args) => export::run(args),
        Command::Bench(args) => bench::run(args, global),
        Command::List(args) => list::run(args),
        #[cfg(feature = "mutants")]
        Command::Mutants(args) => mutants::run(args, global),
    }
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

pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// Load a case from a replay file: JSON, or a safetensors file written by `export`.
pub fn load_case(path: &Path) -> anyhow::Result<Case> {
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

/// The named upstream spec, or a usage error listing the known ones.
pub(crate) fn spec_named(name: &str) -> anyhow::Result<attn_reference::BatchSpec> {
    attn_reference::spec_by_name(name).ok_or_else(|| {
        usage(format!(
            "unknown spec `{name}`; known specs: {}",
            attn_reference::specs::spec_names().join(", ")
        ))
    })
}
