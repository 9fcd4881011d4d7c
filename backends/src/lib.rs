//! # attn-backends
//!
//! The [`Backend`] trait every paged-attention implementation plugs into, the [`registry`]
//! of backends by name, and [`run::run_case`], which drives a backend through one case as an
//! engine would.

mod backend;
pub mod call_limit;
pub mod cpu;
#[cfg(unix)]
pub mod external;
#[cfg(feature = "mutants")]
pub mod mutants;
pub mod registry;
pub mod run;
#[cfg(feature = "spyre")]
pub mod spyre;
mod step_check;
pub mod threads;
pub mod trace;

pub use backend::{
    cache_as, cache_as_mut, declared_space, declines, declines_batch, declines_case, Backend,
    BackendError, CacheLayout, KvCache, KvWrite, StepInputs, Unsupported,
};
pub use registry::{all_backends, all_thresholds, backend_by_name, backend_names, uses_libtorch};
pub use run::{prepare_cache, run_case, step_inputs, CacheEvictor, CaseRun};
pub use trace::TraceSession;
