//! What the subcommands share: usage errors (exit 2), loading a case or trace file, and
//! selecting backends and upstream specs by name.

use crate::external::ExternalArgs;
use attn_backends::{all_backends, backend_by_name, Backend};
use attn_reference::Case;
use attn_results::BackendRef;
use std::path::Path;
use std::sync::Arc;

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
    Case::load(path).map_err(|e| {
        // A trace file read as a case fails on its first trace field: say what it is.
        if matches!(e, attn_reference::CaseError::Parse { .. }) && is_trace_file(path) {
            return usage(format!(
                "{name} is a trace file (several steps on one cache), not a case: `attn-diff \
                 replay {name}` runs it; export takes a single case"
            ));
        }
        usage(format!("{name}: {e}"))
    })
}

/// A JSON file whose top level has `steps` (read only up to the size limit of cases).
pub(crate) fn is_trace_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "json")
        && std::fs::metadata(path)
            .is_ok_and(|m| m.is_file() && m.len() <= attn_reference::MAX_CASE_FILE_BYTES)
        && std::fs::read_to_string(path).is_ok_and(|t| attn_reference::Trace::looks_like_trace(&t))
}

/// `names` without repeats, in their first order (`--backend cpu,cpu` runs cpu once).
pub(crate) fn dedupe(names: &[BackendRef]) -> Vec<BackendRef> {
    let mut seen = std::collections::HashSet::new();
    names.iter().filter(|n| seen.insert(*n)).cloned().collect()
}

/// `; did you mean `X`?` for an unknown backend `name`, among the registered backends and the
/// adapters declared by `external` (as `external:NAME`), or nothing.
pub(crate) fn backend_suggestion(name: &str, external: &ExternalArgs) -> String {
    let mut known = attn_backends::backend_names();
    if let Ok(declared) = external.declared() {
        known.extend(
            declared
                .iter()
                .map(|a| BackendRef::external(&a.name).to_string()),
        );
    }
    crate::suggest::did_you_mean(name, &known)
}

/// A `--config FILE` that does not exist or does not parse is an error, whether or not the
/// run names an adapter (it used to be ignored unless one was).
pub(crate) fn check_config(external: &ExternalArgs) -> anyhow::Result<()> {
    if external.config.is_some() {
        external.declared().map_err(|e| usage(e.to_string()))?;
    }
    Ok(())
}

/// Backends by name; `external:NAME` adapters come from `./attn-diff.toml`.
pub fn select_backends(names: &[BackendRef]) -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    select_backends_with(names, &ExternalArgs::default())
}

/// Backends by name; `external:NAME` adapters are declared by `external` (started here, so a
/// broken adapter is a set-up error).
pub fn select_backends_with(
    names: &[BackendRef],
    external: &ExternalArgs,
) -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    check_config(external)?;
    if names.is_empty() {
        let all = all_backends();
        if all.is_empty() {
            return Err(usage("no backends are registered in this build"));
        }
        return Ok(all);
    }
    dedupe(names)
        .iter()
        .map(|n| match n.adapter() {
            Some(adapter) => {
                crate::external::start_backend(adapter, external).map_err(|e| usage(e.to_string()))
            }
            None => {
                let n = n.to_string();
                backend_by_name(&n)
                    .map_err(|e| usage(format!("{e}{}", backend_suggestion(&n, external))))
            }
        })
        .collect()
}

/// A usage error when the case of `spec` at `config` would pass the allocation bound of a
/// case ([`attn_reference::MAX_ALLOC_BYTES`]): its cache, or its inputs as built (K/V of every
/// key, the queries). Checked before building, which would allocate them.
pub(crate) fn check_spec_size(
    spec: &attn_reference::BatchSpec,
    config: &attn_reference::AttentionConfig,
) -> anyhow::Result<()> {
    let blocks = spec.seq_lens.iter().fold(1usize, |acc, l| {
        acc.saturating_add(l.div_ceil(config.block_size))
    });
    let at = || {
        format!(
            "spec `{}` at {} heads / {} kv heads of {}, block size {}",
            spec.name, config.num_heads, config.num_kv_heads, config.head_size, config.block_size
        )
    };
    attn_reference::validate_cache_size(config, blocks, "its cache")
        .map_err(|e| usage(format!("{}: {e}", at())))?;
    let keys: u128 = spec.seq_lens.iter().map(|&l| l as u128).sum();
    let tokens: u128 = spec.query_lens.iter().map(|&q| q as u128).sum();
    let values = 2 * keys * (config.num_kv_heads * config.head_size) as u128
        + tokens * (config.num_heads * config.head_size) as u128;
    if values.saturating_mul(4) > attn_reference::MAX_ALLOC_BYTES as u128 {
        return Err(usage(format!(
            "{}: its inputs ({values} f32 values) are over the limit of {} GiB for one case",
            at(),
            attn_reference::MAX_ALLOC_BYTES >> 30
        )));
    }
    Ok(())
}

/// The named upstream spec, or a usage error listing the known ones.
pub(crate) fn spec_named(name: &str) -> anyhow::Result<attn_reference::BatchSpec> {
    attn_reference::spec_by_name(name).ok_or_else(|| usage(crate::suggest::unknown_spec(name)))
}
