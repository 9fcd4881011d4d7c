//! # attn-reference
//!
//! The paged-attention problem and its trusted oracle, with no libtorch and no code shared
//! with any backend:
//! - the case model ([`Case`]) and its validation into typed errors ([`CaseError`]);
//! - vLLM's named batch specs and head configs ([`specs`]) and its KV-cache construction
//!   ([`builder`]), with inputs from a portable seeded RNG ([`rng`]);
//! - the f64 oracle ([`oracle::reference_output`]);
//! - serving traces ([`trace`]): one cache across many scheduled steps;
//! - golden fixtures of the oracle on the upstream specs ([`golden`]).

pub mod builder;
pub mod bytes;
mod case;
mod config;
mod dtype;
mod error;
mod feature;
pub mod fp8;
pub mod golden;
pub mod golden_masks;
pub mod json;
pub mod judge;
pub mod ladder;
pub mod mla;
pub mod oracle;
pub mod poison;
pub mod recorded;
pub mod relation;
pub mod rng;
pub mod space;
pub mod specs;
mod tolerance;
pub mod trace;
mod validate;
mod validate_masks;

pub use builder::{build_case, build_spec_case, BuildOptions, SharedPrefix};
pub use case::{
    is_causal, request_mask, Batch, Case, PagedLayout, PrefixLm, RequestMask, Rswa, SequenceMasks,
    Tensors,
};
pub use config::{AttentionConfig, AttentionKind};
pub use dtype::DType;
pub use error::CaseError;
pub use feature::{Aspect, Dimension, Feature, Unsupported};
pub use fp8::{Fp8Format, Fp8KvCache, KvPart, KvScales};
pub use judge::Judge;
pub use mla::Mla;
pub use oracle::reference_output;
pub use poison::Poison;
pub use recorded::Recorded;
pub use rng::InputRng;
pub use space::{KvCacheDtype, Space};
pub use specs::{all_specs, spec_by_name, BatchSpec};
pub use tolerance::Tolerance;
pub use trace::{Trace, TraceError, TraceRecipe};
pub use validate::{
    validate_cache_size, MAX_ALLOC_BYTES, MAX_BLOCKS, MAX_CASE_FILE_BYTES, MAX_DIM, MAX_HEADS,
};
