//! Backends by name, for the CLI and the tests. A backend joins attn-diff by adding one line
//! to [`all_backends`].

use crate::Backend;
use std::sync::Arc;

/// Every registered backend, in a stable order.
// One push per backend (some behind cargo features), so no `vec![]`.
#[allow(clippy::vec_init_then_push)]
pub fn all_backends() -> Vec<Arc<dyn Backend>> {
    #[allow(unused_mut)]
    let mut v: Vec<Arc<dyn Backend>> = Vec::new();
    v.push(Arc::new(crate::cpu::CpuBackend::auto()));
    #[cfg(feature = "spyre")]
    v.extend(crate::spyre::backends());
    v
}

/// Every registered backend, plus `cpu`'s batch-invariant mode and the mutants when the
/// `mutants` feature is on (looked up by name but not part of [`all_backends`]: the mode is
/// `cpu`'s kernel again, and `check` tests real backends).
pub fn lookup_pool() -> Vec<Arc<dyn Backend>> {
    #[allow(unused_mut)]
    let mut v = all_backends();
    v.push(Arc::new(crate::cpu::CpuBackend::batch_invariant()));
    #[cfg(feature = "mutants")]
    v.extend(crate::mutants::all_mutants());
    v
}

/// Every built-in backend's thresholds and the powers of two from 16 to 4096, sorted: the
/// lengths the property strategy aims at (the same list whatever `--backend` selects, so a
/// seed draws the same cases in every run).
/// Computed once: the strategy asks for every property case.
pub fn all_thresholds() -> &'static [usize] {
    static THRESHOLDS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    THRESHOLDS.get_or_init(|| {
        let mut t: Vec<usize> = (4..=12).map(|p| 1usize << p).collect();
        for b in all_backends() {
            t.extend(b.thresholds());
        }
        t.sort_unstable();
        t.dedup();
        t
    })
}

/// Names of every registered backend.
pub fn backend_names() -> Vec<String> {
    all_backends()
        .iter()
        .map(|b| b.name().to_string())
        .collect()
}

/// Whether the backend registered as `name` computes through libtorch (the Spyre backends),
/// so a process about to run it should set libgomp's policy before the library loads.
pub fn uses_libtorch(name: &str) -> bool {
    backend_by_name(name).is_ok_and(|b| b.uses_libtorch())
}

/// The backend registered as `name`, or an error listing what exists.
pub fn backend_by_name(name: &str) -> Result<Arc<dyn Backend>, String> {
    lookup_pool()
        .into_iter()
        .find(|b| b.name() == name)
        .ok_or_else(|| {
            format!(
                "unknown backend `{name}`; registered backends: {}",
                backend_names().join(", ")
            )
        })
}

/// The backend `name` set to use `threads` worker threads (None: its default), for
/// benchmarks that compare backends at equal thread counts.
pub fn backend_with_threads(
    name: &str,
    threads: Option<usize>,
) -> Result<Arc<dyn Backend>, String> {
    let Some(n) = threads else {
        return backend_by_name(name);
    };
    if name == "cpu" || name == crate::cpu::INVARIANT_NAME {
        let settings = crate::cpu::CpuSettings {
            threads: n,
            split_kv: if name == "cpu" {
                crate::cpu::SplitKv::Auto
            } else {
                crate::cpu::SplitKv::Invariant
            },
            ..Default::default()
        };
        return crate::cpu::CpuBackend::new(settings)
            .map(|b| Arc::new(b) as Arc<dyn Backend>)
            .map_err(|e| e.to_string());
    }
    let backend = backend_by_name(name)?;
    #[cfg(feature = "spyre")]
    if backend.uses_libtorch() {
        crate::spyre::set_threads(n);
    }
    Ok(backend)
}
