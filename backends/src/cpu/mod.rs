//! `cpu`: a native paged-attention backend in Rust, in the manner of vLLM's CPU_ATTN.
//!
//! - [`layout`]: the cache (per block and kv head: K transposed, then V), `write_kv`;
//! - [`scheduler`]: tasks (kv head x sequence x query tile) and split-KV work items;
//! - `claims`: items dealt to threads ahead of time, with stealing; `pool`: helper threads
//!   that spin briefly between calls (the calling thread is one of the workers);
//! - [`kernel`]: one work item (online softmax over KV tiles) and the split merge;
//! - [`simd`]: the inner kernels at each SIMD level, chosen at run time.
//!
//! [`CpuSettings`] force a SIMD level, the thread count, the split policy and how K/V is
//! read (tile width and prefetch), so tests can reach every path.

mod claims;
mod elem;
mod fp8;
pub mod kernel;
pub mod layout;
mod mask;
mod partial;
mod pool;
mod rounding;
pub mod scheduler;
pub mod simd;

use crate::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_reference::Dimension;
use attn_reference::{AttentionConfig, Feature};
use elem::KvElem;
use kernel::{KvSource, Problem, Scratch};
use layout::{CpuKvCache, Geometry, KvData};
use pool::Pool;
use simd::Ops;
pub use simd::SimdLevel;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

const NAME: &str = "cpu";
/// The name of `cpu` in its batch-invariant mode ([`SplitKv::Invariant`]).
pub const INVARIANT_NAME: &str = "cpu-batch-invariant";

/// Steps whose estimated cost (see `scheduler`) is below this run on the calling thread
/// alone: a few microseconds of work, about what handing work to a helper costs.
const INLINE_COST: u64 = 2_000;

/// Steps below this cost also run on the calling thread alone when every helper is asleep:
/// a futex wake-up takes tens of microseconds here, as long as the whole call. small_decode
/// (cost about 5,600) with the caches evicted before each call, as between two calls for one
/// layer of a model: 0.048 ms on one thread, 0.065 ms on two when the helper had to be woken.
const WAKE_COST: u64 = 20_000;

/// Which SIMD level the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SimdChoice {
    /// The fastest level the CPU has.
    #[default]
    Auto,
    /// This level; creating the backend fails when the CPU lacks it.
    Force(SimdLevel),
}

/// When decode work items are split along the keys (flash-decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SplitKv {
    /// When there are fewer tasks than threads.
    #[default]
    Auto,
    /// Batch-invariant: a decode task's splits follow from its own keys and the thread
    /// count alone, never from the rest of the batch, so a request's rows keep their bits
    /// whatever it is batched with (the `cpu-batch-invariant` backend).
    Invariant,
    /// Every decode task with at least two keys (to test the merge).
    Always,
    Never,
}

/// How K/V is read: the width of decode tiles (see `kernel::tile_keys`) and how far ahead
/// blocks are prefetched (see `kernel::KvSource`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvTiles {
    /// Wide tiles, next block prefetched, when the step's K/V fits in the last-level cache;
    /// otherwise as `Streaming`.
    #[default]
    Auto,
    /// Narrow tiles, blocks 32 KiB ahead prefetched, as for K/V streamed from memory.
    Streaming,
    /// Wide tiles and no prefetching, for K/V known to be in cache already (a benchmark
    /// repeating one step). Slower than `Auto` when it is not.
    Resident,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSettings {
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
    pub simd: SimdChoice,
    pub split_kv: SplitKv,
    pub kv_tiles: KvTiles,
}

impl Default for CpuSettings {
    fn default() -> Self {
        CpuSettings {
            threads: 0,
            simd: SimdChoice::Auto,
            split_kv: SplitKv::Auto,
            kv_tiles: KvTiles::Auto,
        }
    }
}

pub struct CpuBackend {
    settings: CpuSettings,
    threads: usize,
    level: SimdLevel,
    /// `threads - 1` helpers (the calling thread is the other worker), built on first use
    /// so listing backends spawns no threads.
    pool: OnceLock<Option<Pool>>,
    scratch: Vec<Mutex<Scratch>>,
    /// Partial results of the work items, reused across calls.
    staging: Mutex<Vec<f32>>,
}

impl CpuBackend {
    pub fn new(settings: CpuSettings) -> Result<Self, BackendError> {
        let threads = match settings.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let level = match settings.simd {
            SimdChoice::Auto => SimdLevel::best(),
            SimdChoice::Force(level) if level.is_available() => level,
            SimdChoice::Force(level) => {
                return Err(
                    Unsupported::new(Dimension::Host, "lacks the instruction set")
                        .value(level)
                        .into(),
                );
            }
        };
        Ok(Self::with(settings, threads, level))
    }

    /// The batch-invariant mode: auto settings but [`SplitKv::Invariant`].
    pub fn batch_invariant() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let settings = CpuSettings {
            split_kv: SplitKv::Invariant,
            ..CpuSettings::default()
        };
        Self::with(settings, threads, SimdLevel::best())
    }

    /// Auto settings: every core, the best SIMD level.
    pub fn auto() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with(CpuSettings::default(), threads, SimdLevel::best())
    }

    fn with(settings: CpuSettings, threads: usize, level: SimdLevel) -> Self {
        CpuBackend {
            settings,
            threads,
            level,
            pool: OnceLock::new(),
            scratch: (0..threads)
                .map(|_| Mutex::new(Scratch::default()))
                .collect(),
            staging: Mutex::default(),
        }
    }

    pub fn settings(&self) -> &CpuSettings {
        &self.settings
    }

    pub fn simd_level(&self) -> SimdLevel {
        self.level
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn pool(&self) -> Option<&Pool> {
        self.pool
            .get_or_init(|| (self.threads > 1).then(|| Pool::new(self.threads - 1)))
            .as_ref()
    }

    fn invalid(&self, message: String) -> BackendError {
        BackendError::InvalidInput {
            backend: NAME.into(),
            message,
        }
    }

    fn check_cache(
        &self,
        config: &AttentionConfig,
        cache: &CpuKvCache,
    ) -> Result<(), BackendError> {
        let g = cache.geometry;
        if cache.dtype != config.dtype
            || cache.fp8 != config.kv_cache
            || g.num_kv_heads != config.num_kv_heads
            || g.head_size != config.head_size
            || g.head_size_v != config.head_size_v()
            || g.block_size != config.block_size
        {
            return Err(self.invalid(format!(
                "cache was created for {:?} {:?} {:?}, not for {config}",
                cache.dtype, cache.fp8, g
            )));
        }
        Ok(())
    }

    fn run<T: KvElem>(
        &self,
        config: &AttentionConfig,
        cache: &[T],
        token_scales: &[f32],
        geometry: Geometry,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let ops = Ops::<T>::for_level(self.level).ok_or_else(|| {
            Unsupported::new(Dimension::Host, "lacks the instruction set").value(self.level)
        })?;
        let sched = scheduler::plan(
            config,
            step.query_start_loc,
            step.seq_lens,
            |seq| step.request_mask(seq),
            self.threads,
            self.settings.split_kv,
        );
        let kv_source = match self.settings.kv_tiles {
            KvTiles::Streaming => KvSource::Memory,
            KvTiles::Resident => KvSource::Warm,
            // The batch-invariant mode keeps one tile width: the auto choice follows the
            // whole batch's K/V size, which would make a request's bits depend on its batch.
            KvTiles::Auto if self.settings.split_kv == SplitKv::Invariant => KvSource::Memory,
            KvTiles::Auto => {
                let kv_bytes = step.seq_lens.iter().sum::<usize>()
                    * geometry.num_kv_heads
                    * (geometry.head_size + geometry.head_size_v)
                    * std::mem::size_of::<T>();
                KvSource::for_size(kv_bytes, last_level_cache_bytes())
            }
        };
        // An FP8 cache's k_scale (its kv head's, with scales per head) joins the softmax
        // scale on the query, as does what reads of the cache are off by
        // (`KvElem::READ_SCALE`); v_scale is applied to the finished rows (`finalize_task`).
        // Per-token scales are applied to each key's score and weight (`run_item`).
        let scales: Vec<f32> = (0..config.num_kv_heads)
            .map(|h| {
                let k_scale = config.kv_cache.as_ref().map_or(1.0, |c| c.head_scales(h).0);
                (config.effective_scale() * k_scale as f64 * T::READ_SCALE as f64) as f32
            })
            .collect();
        // An FP8 query is quantized as the layer does it before the kernel and read back with
        // its scale, once per step.
        let q_scale = config.kv_cache.as_ref().and_then(|c| c.q_scale);
        let fp8_query: Option<Vec<f32>> = q_scale.map(|s| {
            let read_back = |x: f32| fp8::E4m3::from_f32(x / s).to_f32() * s;
            step.query.iter().map(|&x| read_back(x)).collect()
        });
        let problem = Problem {
            cfg: config,
            geometry,
            scales: &scales,
            token_scales: (!token_scales.is_empty()).then_some(token_scales),
            group: config.num_heads / config.num_kv_heads,
            cache,
            query: fp8_query.as_deref().unwrap_or(step.query),
            seq_lens: step.seq_lens,
            causal: step.causal,
            prefix_lm: step.prefix_lm,
            rswa: step.rswa,
            block_table: step.block_table,
            ops: &ops,
            kv_source,
        };

        // Each split item owns a disjoint piece of the staging buffer (every item writes all
        // of its piece, so stale contents are harmless); unsplit tasks need none. Items
        // are dealt to the threads (`claims`). A concurrent call on the same
        // backend gets a buffer of its own.
        // Rows of output, partials and staging are V's width (`head_size_v` in MLA).
        let d = geometry.head_size_v;
        let mut shared = self.staging.try_lock().ok();
        let mut own = Vec::new();
        let staging = shared.as_deref_mut().unwrap_or(&mut own);
        let no_memory = |what: &str, values: usize| BackendError::Failed {
            backend: NAME.into(),
            message: format!("cannot allocate {what} ({values} f32 values)"),
        };
        if staging.len() < sched.staging_len {
            staging
                .try_reserve_exact(sched.staging_len - staging.len())
                .map_err(|_| no_memory("the split-KV staging buffer", sched.staging_len))?;
            staging.resize(sched.staging_len, 0.0);
        }
        let mut pieces = Vec::with_capacity(sched.items.len());
        let mut rest = &mut staging[..sched.staging_len];
        for item in &sched.items {
            let (mine, tail) = rest.split_at_mut(sched.tasks[item.task].split_len(d));
            pieces.push(Mutex::new(mine));
            rest = tail;
        }
        let splits_left: Vec<AtomicUsize> = sched
            .tasks
            .iter()
            .map(|t| AtomicUsize::new(t.splits))
            .collect();
        let rows = step.num_tokens.saturating_mul(config.num_heads);
        let mut output = kernel::OutputRows::new(rows, d)
            .ok_or_else(|| no_memory("the output", rows.saturating_mul(d)))?;
        let seq_tokens = step.query_start_loc[step.seq_lens.len()];
        output.zero_from(seq_tokens * config.num_heads);
        let lock = |i: usize| pieces[i].lock().unwrap_or_else(|e| e.into_inner());

        let claims = claims::Claims::new(&sched.lists);
        let work = |thread: usize| {
            let mut scratch = self.scratch[thread % self.scratch.len()]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut row = Vec::new();
            while let Some(idx) = claims.next(thread) {
                let item = &sched.items[idx];
                let task = &sched.tasks[item.task];
                kernel::run_item(&problem, task, item.keys.clone(), &mut scratch);
                let mine = scratch.partial(task.rows, d);
                if task.splits == 1 {
                    // SAFETY: an unsplit task has one item, run once: finalised once. The
                    // scheduler gives every output row to one task.
                    unsafe {
                        kernel::finalize_task(config, task, &[mine], &output, &mut row, &ops)
                    };
                    continue;
                }
                mine.store(&mut lock(idx));
                // The thread that finishes a task's last split merges it into the output.
                if splits_left[item.task].fetch_sub(1, Ordering::AcqRel) == 1 {
                    let first = task.first_item;
                    let guards: Vec<_> = (first..first + task.splits).map(lock).collect();
                    let parts: Vec<_> = guards
                        .iter()
                        .map(|g| partial::Partial::from_staging(g, task.rows, d))
                        .collect();
                    // SAFETY: the counter reaches 0 once per task, so it is finalised once.
                    unsafe { kernel::finalize_task(config, task, &parts, &output, &mut row, &ops) };
                }
            }
        };
        // The calling thread works too; helpers join when they wake. Tiny steps stay on the
        // calling thread, where waking helpers would cost more than they save.
        let total: u64 = sched.items.iter().map(|i| i.cost).sum();
        match self.pool() {
            Some(pool)
                if !crate::threads::caller_only()
                    && sched.items.len() > 1
                    && total >= INLINE_COST
                    && (total >= WAKE_COST || !pool.asleep()) =>
            {
                pool.run(&work)
            }
            _ => work(0),
        }
        Ok(output.finish())
    }
}

/// Size of the largest CPU cache sysfs reports (0 when it reports none: every step then
/// counts as streaming, the safe choice for large steps).
fn last_level_cache_bytes() -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| {
        (0..8)
            .filter_map(|i| {
                let path = format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size");
                parse_cache_size(std::fs::read_to_string(path).ok()?.trim())
            })
            .max()
            .unwrap_or(0)
    })
}

/// `"32768K"`, `"1M"` or `"512"` (bytes) as bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let n: usize = digits.parse().ok()?;
    n.checked_mul(match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    })
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        match self.settings.split_kv {
            SplitKv::Invariant => INVARIANT_NAME,
            _ => NAME,
        }
    }

    /// Reordering, moving blocks and repeating a call change no bit: the schedule depends on
    /// the tasks' lengths and count only, every item is computed alone and merged in split
    /// order. The default split policy depends on the batch's task count (a short batch
    /// splits its decodes, and the auto tile width follows the batch's K/V size), so only the
    /// invariant mode, which fixes both, holds the batch relation. Neither holds
    /// chunking: a query tile's key tiles are sized by its rows (measured, not declared).
    fn invariant_under(&self) -> Vec<attn_reference::relation::Relation> {
        use attn_reference::relation::Relation;
        let mut held = vec![Relation::Order, Relation::Placement, Relation::Repetition];
        if self.settings.split_kv == SplitKv::Invariant {
            held.insert(0, Relation::Batch);
        }
        held
    }

    fn supports(&self, config: &AttentionConfig) -> Result<(), Unsupported> {
        let (hq, hkv) = (config.num_heads, config.num_kv_heads);
        if hq == 0 || hkv == 0 || hq % hkv != 0 {
            return Err(Unsupported::new(
                Dimension::HeadLayout,
                "query heads not a multiple of kv heads",
            )
            .value(format!("{hq}/{hkv}")));
        }
        if config.head_size == 0 || config.block_size == 0 {
            return Err(Unsupported::new(
                Dimension::HeadSize,
                "and block size must be at least 1",
            ));
        }
        for (feature, v) in [
            (Feature::Alibi, &config.alibi_slopes),
            (Feature::Sinks, &config.sinks),
        ] {
            if let Some(v) = v {
                if v.len() != hq {
                    return Err(Unsupported::new(feature, "needs one entry per query head")
                        .value(format!("{} for {hq}", v.len())));
                }
            }
        }
        Ok(())
    }

    fn optional_features(&self) -> Vec<Feature> {
        let mut f = Feature::ESTABLISHED.to_vec();
        f.extend([
            Feature::Fp8KvCache,
            Feature::CrossAttention,
            Feature::PaddedRequests,
            Feature::Mla,
            Feature::ChunkedLocalAttention,
            Feature::ChunkLookback,
            Feature::NonCausal,
            Feature::PrefixLm,
            Feature::Rswa,
            Feature::Fp8Query,
            Feature::KvHeadScales,
            Feature::KvTokenScales,
        ]);
        f
    }

    fn thresholds(&self) -> Vec<usize> {
        let mut t = kernel::TILE_THRESHOLDS.to_vec();
        t.extend(scheduler::SPLIT_THRESHOLDS);
        t
    }

    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            shape: "[num_blocks, num_kv_heads, (K^T [head_size, block_size], V [block_size, head_size_v])]",
            description: "head-major blocks, K transposed for key-vector score loads, V row-major for value FMAs; one sequential read per (block, kv head); MLA: V the latent's prefix, written twice",
        }
    }

    fn new_cache(
        &self,
        config: &AttentionConfig,
        num_blocks: usize,
    ) -> Result<KvCache, BackendError> {
        self.supports(config)?;
        let geometry = Geometry::of(config, num_blocks);
        // A cache the machine cannot hold is declined, not an abort.
        let cache =
            CpuKvCache::new(config.dtype, config.kv_cache.clone(), geometry).map_err(|e| {
                Unsupported::new(
                    Dimension::CacheSize,
                    "cannot allocate the cache on this machine",
                )
                .value(e)
            })?;
        Ok(Box::new(cache))
    }

    fn write_kv(
        &self,
        config: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let cache = cache_as_mut::<CpuKvCache>(NAME, cache)?;
        self.check_cache(config, cache)?;
        cache.write(
            NAME,
            kv.key,
            kv.value,
            kv.slot_mapping,
            config.mla.is_some(),
        )
    }

    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        self.supports(config)?;
        let cache = cache_as::<CpuKvCache>(NAME, cache)?;
        self.check_cache(config, cache)?;
        step.validate(config, cache.geometry.num_blocks)
            .map_err(|m| self.invalid(m))?;
        match &cache.data {
            KvData::F32(d) => self.run(config, d, &cache.token_scales, cache.geometry, step),
            KvData::Bf16(d) => self.run(config, d, &cache.token_scales, cache.geometry, step),
            KvData::F16(d) => self.run(config, d, &cache.token_scales, cache.geometry, step),
            KvData::Fp8E4m3(d) => self.run(config, d, &cache.token_scales, cache.geometry, step),
            KvData::Fp8E5m2(d) => self.run(config, d, &cache.token_scales, cache.geometry, step),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_cache_size;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("12Q"), None);
        assert_eq!(parse_cache_size(""), None);
    }
}
