//! The backend trait, in the spirit of vLLM's attention backends: a backend names itself,
//! says which configs it cannot run (the harness reports those, never fails or hides them),
//! owns its KV-cache layout, writes K/V through `slot_mapping`, and runs one forward step.
//!
//! **A cache lives across steps.** One cache from [`Backend::new_cache`] serves every step of
//! a trace (see `attn_reference::trace` and [`crate::trace`]): K/V written by
//! [`Backend::write_kv`] stays at its slot until a later write to that slot (freed blocks are
//! handed to other sequences without clearing); [`Backend::forward`] reads the cache where the
//! step's block table says and never changes stored K/V; any state a backend keeps between
//! calls (converted blocks, per-sequence pointers, a persistent batch) must follow the step's
//! block table and slot mapping, whatever earlier steps did. A single case is the one-step
//! trace of a fresh cache.

use attn_reference::{AttentionConfig, AttentionKind, Case, Feature, Space};
use attn_results::{BackendId, BackendRole};
use std::any::Any;
use std::collections::BTreeMap;
use std::time::Duration;
use thiserror::Error;

/// "I can't run this case", naming the [`attn_reference::Feature`]: reported per backend by
/// the harness, grouped by feature.
pub use attn_reference::Unsupported;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum BackendError {
    #[error("unsupported: {0}")]
    Unsupported(Unsupported),
    #[error("invalid input to {backend}: {message}")]
    InvalidInput { backend: String, message: String },
    #[error("{backend} failed: {message}")]
    Failed { backend: String, message: String },
    /// An out-of-process backend did not answer in time (it is killed and restarted).
    #[error("{backend} timed out after {seconds:.1} s")]
    Timeout { backend: String, seconds: f64 },
    /// An out-of-process backend died (EOF or non-zero exit); `message` ends with its stderr.
    #[error("{backend} crashed: {message}")]
    Crashed { backend: String, message: String },
    /// An out-of-process backend answered something malformed.
    #[error("{backend} protocol error: {message}")]
    Protocol { backend: String, message: String },
}

impl From<Unsupported> for BackendError {
    fn from(u: Unsupported) -> Self {
        BackendError::Unsupported(u)
    }
}

/// A description of a backend's KV-cache layout, for `attn-diff list` and reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheLayout {
    /// Symbolic shape, e.g. `[2, num_blocks, block_size, num_kv_heads, head_size]`.
    pub shape: &'static str,
    /// One line on why the layout is the way it is.
    pub description: &'static str,
}

/// A backend's KV cache, opaque to the harness.
pub type KvCache = Box<dyn Any + Send>;

/// K/V rows to store: `key`/`value` are `[n, num_kv_heads, head_size]` (`value` empty in an
/// MLA case: V is the first `head_size_v` dims of each key row), `slot_mapping` is `[n]`
/// with -1 for rows that must not be written.
#[derive(Clone, Copy, Debug)]
pub struct KvWrite<'a> {
    pub key: &'a [f32],
    pub value: &'a [f32],
    pub slot_mapping: &'a [i64],
}

/// The inputs of one forward step, as a model runner passes them.
#[derive(Clone, Copy, Debug)]
pub struct StepInputs<'a> {
    /// `[num_tokens, num_heads, head_size]`, padding tokens included.
    pub query: &'a [f32],
    /// `[num_seqs + 1]`, exclusive prefix sum of query lengths (real tokens only).
    pub query_start_loc: &'a [usize],
    /// `[num_seqs]`, context + new tokens.
    pub seq_lens: &'a [usize],
    /// `[num_seqs][max_blocks_per_seq]`, padded with the null block 0.
    pub block_table: &'a [Vec<u32>],
    /// All tokens of the step (real + padding).
    pub num_tokens: usize,
    /// `[num_seqs]`: whether each request is causal; None: every one is. Only a backend
    /// that implements [`Feature::NonCausal`] is sent a step with a non-causal request.
    pub causal: Option<&'a [bool]>,
    /// PrefixLM ranges per request; only a backend that implements [`Feature::PrefixLm`]
    /// is sent a step with one.
    pub prefix_lm: Option<&'a attn_reference::PrefixLm>,
    /// R-SWA's window and prefix lengths; only for a backend that implements
    /// [`Feature::Rswa`].
    pub rswa: Option<&'a attn_reference::Rswa>,
}

impl<'a> StepInputs<'a> {
    /// Whether sequence `seq` is causal.
    pub fn is_causal(&self, seq: usize) -> bool {
        attn_reference::is_causal(self.causal, seq)
    }

    /// What bounds sequence `seq`'s keys besides the config.
    pub fn request_mask(&self, seq: usize) -> attn_reference::RequestMask<'a> {
        attn_reference::request_mask(self.causal, self.prefix_lm, self.rswa, seq)
    }
}

pub trait Backend: Send + Sync {
    /// The registered name, e.g. `cpu` or `spyre-sdpa`: what `--backend` takes and the key
    /// of its summary. Nothing is read out of it; what a backend is says [`Backend::role`].
    fn name(&self) -> &str;

    /// What this backend is there for: shipped, external, or a mutant (which passes by
    /// diverging).
    fn role(&self) -> BackendRole {
        BackendRole::Builtin
    }

    /// Whether it computes through libtorch, so a process about to run it sets libgomp's
    /// wait policy before the library starts its threads.
    fn uses_libtorch(&self) -> bool {
        false
    }

    /// Its typed identity in results.
    fn id(&self) -> BackendId {
        BackendId::new(self.name(), self.role())
    }

    /// `Err` with a reason when this backend cannot run `config` (beyond the optional
    /// features, which [`declines`] checks from [`Backend::optional_features`]).
    fn supports(&self, config: &AttentionConfig) -> Result<(), Unsupported>;

    /// The optional features (of `Feature::ALL`) this backend implements. A case using
    /// any other is declined for that feature before `supports` is asked.
    fn optional_features(&self) -> Vec<Feature> {
        Feature::ESTABLISHED.to_vec()
    }

    /// The case space this backend runs beyond its optional features: dtypes, head and
    /// block sizes, batch limits, KV-cache dtypes ([`Space`]'s keys). The strategies draw
    /// inside it and the shrinker stays inside it, so a narrow backend gets its whole budget
    /// rather than a declined majority; [`declines`] checks it. `supports` remains for what
    /// a space cannot say.
    fn space(&self) -> Space {
        Space::default()
    }

    fn cache_layout(&self) -> CacheLayout;

    /// Lengths where this backend changes code path (tile widths, split-KV sizes, query
    /// chunks, padding multiples), in keys or query tokens: the strategy draws lengths just
    /// below, at and just above each, where off-by-ones live.
    fn thresholds(&self) -> Vec<usize> {
        Vec::new()
    }

    /// `Err` when this backend cannot keep a cache across the steps of a trace (an adapter
    /// speaking a protocol without sessions), naming [`Dimension::Trace`]. Built-in backends
    /// can: their caches are plain memory kept between calls (the module's contract).
    fn runs_traces(&self) -> Result<(), Unsupported> {
        Ok(())
    }

    /// A cache of `num_blocks` blocks for `config`; see the module's contract for its life
    /// across steps.
    fn new_cache(
        &self,
        config: &AttentionConfig,
        num_blocks: usize,
    ) -> Result<KvCache, BackendError>;

    /// Store K/V rows at their slots (reshape-and-cache), skipping slot -1.
    fn write_kv(
        &self,
        config: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError>;

    /// Attention for every token of the step: `[num_tokens, num_heads, head_size_v]`
    /// (`head_size` but in MLA), values in the config's dtype carried as f32. Rows of padding
    /// tokens may hold anything finite.
    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError>;

    /// The time the backend itself measured for its last `forward`, when it runs somewhere
    /// a wall clock around the call would mismeasure (another process: the exchange and
    /// the translation of inputs are not the kernel). `bench` times with it when given.
    fn reported_kernel_time(&self) -> Option<Duration> {
        None
    }

    /// The most one call may take before it is a timeout, for a backend that enforces one (an
    /// adapter's `timeout_seconds`); `None` for one that runs in this process.
    fn call_timeout(&self) -> Option<Duration> {
        None
    }

    /// The longest a call that answered with an output has taken so far (for a backend with
    /// a [`Backend::call_timeout`]): what limits on later calls are scaled from.
    fn slowest_answer(&self) -> Option<Duration> {
        None
    }

    /// Environment variables that change what this backend runs (an adapter's plugin path,
    /// say), with their values: replay files and replay lines carry them.
    fn environment(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// The invariance relations this backend guarantees: under each, a request's output rows
    /// stay the same bits. Where one is declared, any bit that moves is a failure (a
    /// `variant`); where not, the drift is measured and reported.
    fn invariant_under(&self) -> Vec<attn_reference::relation::Relation> {
        Vec::new()
    }

    /// What a person should know about a failure of this backend on `config` that the
    /// numbers cannot say (capabilities it inherited rather than declared, say).
    fn failure_caveat(&self, _config: &AttentionConfig) -> Option<String> {
        None
    }
}

/// The whole space `backend` declares: [`Backend::space`] with the optional features it does
/// not implement turned off (and the kinds they stand for left out).
pub fn declared_space(backend: &dyn Backend) -> Space {
    let implemented = backend.optional_features();
    let kinds = AttentionKind::ALL
        .into_iter()
        .filter(|k| match k {
            AttentionKind::Decoder => true,
            AttentionKind::EncoderOnly => implemented.contains(&Feature::EncoderOnly),
            AttentionKind::EncoderDecoder => implemented.contains(&Feature::CrossAttention),
        })
        .collect();
    let features = Feature::ALL
        .into_iter()
        .filter(|f| ![Feature::EncoderOnly, Feature::CrossAttention].contains(f))
        .filter(|f| implemented.contains(f))
        .collect();
    let own = backend.space();
    let by_features = Space {
        kinds: Some(kinds),
        features: Some(features),
        ..Space::default()
    };
    // Keep "no restriction" where the backend implements everything, so a full space
    // stays full (and draws what it always drew).
    let mut s = own.intersect(&by_features);
    if s.kinds
        .as_ref()
        .is_some_and(|k| k.len() == AttentionKind::ALL.len())
        && own.kinds.is_none()
    {
        s.kinds = None;
    }
    let all_features = Feature::ALL.len() - 2;
    if s.features.as_ref().is_some_and(|f| f.len() == all_features) && own.features.is_none() {
        s.features = None;
    }
    s
}

/// Whether `backend` declines `config`: an optional feature it does not implement, then its
/// declared [`Backend::space`], then its own `supports`. Everything that asks a backend
/// whether it runs a config asks this.
pub fn declines(backend: &dyn Backend, config: &AttentionConfig) -> Result<(), Unsupported> {
    let implemented = backend.optional_features();
    if let Some(f) = Feature::ALL
        .into_iter()
        .find(|f| f.used_by(config) && !implemented.contains(f))
    {
        return Err(Unsupported::new(f, "not implemented"));
    }
    backend.space().admits_config(config)?;
    backend.supports(config)
}

/// [`declines`] for a whole case: its config, then its batch against the declared limits
/// (sequences, query and sequence lengths, tokens per step).
pub fn declines_case(backend: &dyn Backend, case: &Case) -> Result<(), Unsupported> {
    declines(backend, &case.config)?;
    declines_batch(backend, &case.batch)?;
    backend.space().admits_batch(&case.batch)
}

/// Whether `backend` declines `batch` for a feature of the batch
/// ([`Feature::OF_THE_BATCH`]) it does not implement.
pub fn declines_batch(
    backend: &dyn Backend,
    batch: &attn_reference::Batch,
) -> Result<(), Unsupported> {
    let implemented = backend.optional_features();
    match Feature::OF_THE_BATCH
        .into_iter()
        .find(|f| f.used_by_batch(batch) && !implemented.contains(f))
    {
        Some(f) => Err(Unsupported::new(f, "not implemented")),
        None => Ok(()),
    }
}

/// Downcast a cache to the backend's own type, with an error rather than a panic when a
/// cache from another backend is passed in.
pub fn cache_as<'a, T: 'static>(backend: &str, cache: &'a KvCache) -> Result<&'a T, BackendError> {
    cache
        .downcast_ref::<T>()
        .ok_or_else(|| BackendError::InvalidInput {
            backend: backend.to_string(),
            message: "KV cache was not created by this backend".into(),
        })
}

pub fn cache_as_mut<'a, T: 'static>(
    backend: &str,
    cache: &'a mut KvCache,
) -> Result<&'a mut T, BackendError> {
    cache
        .downcast_mut::<T>()
        .ok_or_else(|| BackendError::InvalidInput {
            backend: backend.to_string(),
            message: "KV cache was not created by this backend".into(),
        })
}
