//! A Spyre-style PyTorch-native paged-attention backend through `tch`: every computation is
//! a libtorch tensor op, as a backend targeting an accelerator's PyTorch stack is written.
//!
//! - [`cache`]: the `[2, num_blocks, block_size, Hkv, D]` cache and its one-scatter write;
//! - [`step`]: input checks and per-sequence facts; [`plan`]: padded groups of sequences
//!   and their index tensors; [`mask`]: visibility and logit shaping;
//! - [`workspace`]: scratch buffers a call gathers pages into, reused across its groups;
//! - the variants: [`native`] (explicit logits, online softmax over page chunks),
//!   [`sdpa`] (`scaled_dot_product_attention`), [`device`] (static-shape fp16 mode).

mod cache;
mod device;
mod mask;
mod native;
mod plan;
mod sdpa;
mod step;
mod tensors;
mod workspace;
pub use tensors::set_threads;

use crate::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_reference::Dimension;
use attn_reference::{AttentionConfig, DType, Feature};
use cache::SpyreCache;
use plan::{group_sequences, one_per_group, real_rows, GroupCost, GroupIndex};
use std::sync::Arc;
use tch::{TchError, Tensor};
use tensors::{borrow_f32, from_f32, from_i64, init_threads, kind_of, to_host_rounded};
use workspace::Workspace;

/// Which computation a [`Spyre`] backend runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Explicit logits with softmax and P·V accumulated in `working` precision.
    Native { working: DType },
    /// `scaled_dot_product_attention` with `enable_gqa`.
    Sdpa,
    /// fp16, static shapes: keys padded to 256, queries in chunks of 32, one sequence at a time.
    Device,
}

/// Memory budgets of a call, each also held to an eighth of the call's KV cache
/// ([`Budgets::within`]) so that a call's extra memory stays within a quarter of it. Smaller
/// budgets exercise the chunked paths on small cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Native: bytes of gathered K/V and logits per chunk of pages.
    pub chunk_bytes: usize,
    /// SDPA: bytes of gathered K and V per group of sequences, or per chunk of a group's
    /// keys when one sequence alone is larger.
    pub group_kv_bytes: usize,
}

impl Budgets {
    /// Below this, a smaller chunk saves less memory than a call already takes whatever its
    /// budgets (2-12 MiB measured on the small and single specs: libtorch's own buffers, the
    /// queries, masks and output), and costs more rounds of op dispatches (a 1 MiB floor made
    /// single_prefill 4x slower for nothing).
    const FLOOR: usize = 8 << 20;

    /// These budgets, each at most an eighth of a cache of `cache_bytes` (or [`Self::FLOOR`]).
    pub fn within(self, cache_bytes: usize) -> Budgets {
        let cap = (cache_bytes / 8).max(Self::FLOOR);
        Budgets {
            chunk_bytes: self.chunk_bytes.min(cap),
            group_kv_bytes: self.group_kv_bytes.min(cap),
        }
    }
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            chunk_bytes: native::CHUNK_BYTES,
            group_kv_bytes: sdpa::GROUP_KV_BYTES,
        }
    }
}

pub struct Spyre {
    name: String,
    variant: Variant,
    budgets: Budgets,
}

/// Grouping costs (units of one query-token x key product over all heads). The overhead is
/// the dispatch time of a group's ops; gathering and converting a K/V row costs about as
/// much as a few query rows.
const GROUP_OVERHEAD: usize = 1024;
const KV_ROW_COST: usize = 4;

impl Spyre {
    /// `spyre-native`, accumulating in f32 so 16-bit inputs keep their accuracy on long
    /// sequences.
    pub fn native() -> Self {
        Spyre::native_in(DType::F32)
    }

    /// The native variant with softmax and P·V in `working` precision; named
    /// `spyre-native-<dtype>` unless the default f32.
    pub fn native_in(working: DType) -> Self {
        let name = if working == DType::F32 {
            "spyre-native".to_string()
        } else {
            format!("spyre-native-{working}")
        };
        Spyre {
            name,
            variant: Variant::Native { working },
            budgets: Budgets::default(),
        }
    }

    pub fn sdpa() -> Self {
        Spyre {
            name: "spyre-sdpa".into(),
            variant: Variant::Sdpa,
            budgets: Budgets::default(),
        }
    }

    pub fn device() -> Self {
        Spyre {
            name: "spyre-device".into(),
            variant: Variant::Device,
            budgets: Budgets::default(),
        }
    }

    /// The same variant under other memory budgets.
    pub fn with_budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    fn invalid(&self, message: impl Into<String>) -> BackendError {
        BackendError::InvalidInput {
            backend: self.name.clone(),
            message: message.into(),
        }
    }

    fn failed(&self) -> impl Fn(TchError) -> BackendError + '_ {
        move |e| BackendError::Failed {
            backend: self.name.clone(),
            message: e.to_string(),
        }
    }

    fn group_cost(&self, c: &AttentionConfig, budgets: Budgets) -> GroupCost {
        let max_kv_rows = match self.variant {
            Variant::Sdpa => Some(budgets.group_kv_bytes / sdpa::kv_bytes_per_key(c).max(1)),
            _ => None,
        };
        GroupCost {
            overhead: GROUP_OVERHEAD,
            kv_row: KV_ROW_COST,
            max_kv_rows,
        }
    }

    fn run(
        &self,
        c: &AttentionConfig,
        cache: &SpyreCache,
        step: &StepInputs<'_>,
        seqs: &[step::Seq],
    ) -> Result<Vec<f32>, TchError> {
        let (t, hq, d) = (step.num_tokens, c.num_heads, c.head_size);
        let budgets = self.budgets.within(cache.bytes());
        let groups = match self.variant {
            Variant::Device => one_per_group(seqs, device::Q_CHUNK),
            // One sequence at a time: its token-major pages then feed the matmuls as strided
            // views, where a padded batch would force a per-head copy of every page.
            Variant::Native { .. } => one_per_group(seqs, 1),
            Variant::Sdpa => group_sequences(seqs, &self.group_cost(c, budgets)),
        };
        if groups.is_empty() {
            return Ok(vec![0.0; t * hq * d]);
        }
        // SAFETY: the query is only read (each group copies its rows out with index_select,
        // an FP8 query is a new tensor), and every tensor made from it is dropped before
        // `run` returns, while `step.query` outlives the call.
        let query = unsafe { borrow_f32(step.query, &[t as i64, hq as i64, d as i64])? };
        let query = match c.kv_cache.as_ref().and_then(|k| k.q_scale) {
            // An FP8 query: quantized as the layer does it before the kernel, read back with
            // its scale.
            Some(s) => {
                let s = from_f32(&[s], &[1, 1, 1])?;
                cache::to_fp8(&query, &s, attn_reference::Fp8KvCache::QUERY_FORMAT)?
                    .f_to_kind(tch::Kind::Float)?
                    .f_mul(&s)?
            }
            None => query,
        };
        let mut ws = Workspace::new(budgets);
        // The step's output, filled group by group: a group's rows are dropped once copied
        // in, so no concatenation of every group's rows stands beside it. Padding tokens
        // keep their zeros.
        let mut out = Tensor::f_zeros(
            [t as i64, hq as i64, d as i64],
            (tch::Kind::Float, tensors::CPU),
        )?;
        for g in &groups {
            let pages = match self.variant {
                Variant::Device => device::padded_pages(c, g.len_max),
                _ => g.len_max.div_ceil(c.block_size),
            };
            let idx = GroupIndex::new(c, g, step.block_table, pages)?;
            let o = match self.variant {
                Variant::Native { working } => {
                    native::attend_group(c, cache, &query, g, &idx, kind_of(working), &mut ws)?
                }
                Variant::Sdpa => sdpa::attend_group(c, cache, &query, g, &idx, &mut ws)?,
                Variant::Device => device::attend_sequence(c, cache, &query, g, &idx)?,
            };
            let (rows, tokens) = real_rows(g);
            let o = match rows {
                Some(rows) => o.f_index_select(0, &from_i64(&rows)?)?,
                None => o,
            };
            tensors::in_place(out.f_index_copy_(0, &from_i64(&tokens)?, &o))?;
        }
        to_host_rounded(&out, c.dtype)
    }
}

impl Backend for Spyre {
    fn name(&self) -> &str {
        &self.name
    }

    fn uses_libtorch(&self) -> bool {
        true
    }

    fn supports(&self, config: &AttentionConfig) -> Result<(), Unsupported> {
        match self.variant {
            Variant::Device => device::supports(config),
            Variant::Native { .. } | Variant::Sdpa => Ok(()),
        }
    }

    fn space(&self) -> attn_reference::Space {
        match self.variant {
            Variant::Device => device::space(),
            Variant::Native { .. } | Variant::Sdpa => attn_reference::Space::default(),
        }
    }

    fn optional_features(&self) -> Vec<Feature> {
        let mut f = Feature::ESTABLISHED.to_vec();
        f.extend([
            Feature::Fp8KvCache,
            Feature::CrossAttention,
            Feature::PaddedRequests,
            Feature::ChunkedLocalAttention,
            Feature::Fp8Query,
        ]);
        f
    }

    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            shape: "[2, num_blocks, block_size, num_kv_heads, head_size]",
            description: "token-major pages as a PyTorch paged backend keeps them: one index_select gathers whole pages of K and V",
        }
    }

    fn thresholds(&self) -> Vec<usize> {
        // The device pads keys to a multiple of 256 and computes queries in chunks of 32.
        vec![
            device::KV_MULTIPLE,
            2 * device::KV_MULTIPLE,
            device::Q_CHUNK,
        ]
    }

    fn new_cache(
        &self,
        config: &AttentionConfig,
        num_blocks: usize,
    ) -> Result<KvCache, BackendError> {
        init_threads();
        step::check_config(config).map_err(|m| self.invalid(m))?;
        self.supports(config)?;
        let bytes = 2
            * num_blocks
            * config.block_size
            * config.num_kv_heads
            * config.head_size
            * config.kv_element_bytes();
        if bytes > MAX_CACHE_BYTES {
            return Err(Unsupported::new(
                Dimension::CacheSize,
                "above 1 GiB (libtorch zero-fills every page of the cache)",
            )
            .value(format!("{num_blocks} blocks"))
            .into());
        }
        let cache = SpyreCache::new(config, num_blocks).map_err(self.failed())?;
        Ok(Box::new(cache))
    }

    fn write_kv(
        &self,
        config: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        init_threads();
        let cache = cache_as_mut::<SpyreCache>(&self.name, cache)?;
        step::check_write(config, kv, cache.num_slots(config)).map_err(|m| self.invalid(m))?;
        cache
            .write(config, kv.key, kv.value, kv.slot_mapping)
            .map_err(self.failed())
    }

    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        init_threads();
        step::check_config(config).map_err(|m| self.invalid(m))?;
        self.supports(config)?;
        let cache = cache_as::<SpyreCache>(&self.name, cache)?;
        let seqs = step::sequences(config, step, cache.num_blocks).map_err(|m| self.invalid(m))?;
        self.run(config, cache, step, &seqs).map_err(self.failed())
    }
}

/// The registered spyre variants.
/// The largest KV cache the Spyre backends allocate: `Tensor::zeros` touches every page, so a
/// huge cache would be resident in full (the `cpu` backend allocates lazily instead).
const MAX_CACHE_BYTES: usize = 1 << 30;

pub fn backends() -> Vec<Arc<dyn Backend>> {
    vec![
        Arc::new(Spyre::native()),
        Arc::new(Spyre::sdpa()),
        Arc::new(Spyre::device()),
    ]
}
