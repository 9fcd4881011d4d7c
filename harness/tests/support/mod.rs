//! A deliberately plain paged-attention backend for the harness's own tests, with switches
//! that plant bugs. Not registered anywhere.
#![allow(dead_code)]

use attn_backends::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_reference::{AttentionConfig, AttentionKind};
use std::path::PathBuf;
use std::process::Command;

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python the adapters were set up for, checked to import `modules` (comma-separated):
/// a test that needs them fails with how to get them rather than with an adapter's crash.
pub fn adapter_python_with(modules: &str) -> String {
    let python = attn_harness::external::adapter_python(&repo());
    let ok = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{python} lacks {modules}: `cargo xtask setup` provisions them"
    );
    python
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Plant {
    /// Decoder window sees w + 1 keys instead of w.
    pub window_off_by_one: bool,
    /// Query head h reads kv head h % Hkv.
    pub gqa_modulo: bool,
    /// Panic on any case with more than one sequence.
    pub panic_on_batches: bool,
    /// P·V runs to the end of the last block, multiplying the stale tail by probability 0:
    /// right on finite stale data, NaN on poisoned memory.
    pub whole_block_tail: bool,
    /// A padding token's slot −1 is written into the cache's last slot (Python's `[-1]`).
    pub padding_into_last_slot: bool,
    /// The forward fails for this one block size.
    pub fails_on_block_size: Option<usize>,
    /// A padding token's write (slot -1) raises Python's IndexError, as `index_copy_` does.
    pub raises_on_padding_write: bool,
    /// The forward raises a shape error (a mask tile of 64) for blocks of this size and up.
    pub raises_from_block_size: Option<usize>,
    /// In f16, q·k is held in f16 (rounded, and infinite past 65504) before the scale.
    pub scores_in_f16: bool,
}

pub struct Naive {
    pub name: String,
    pub plant: Plant,
}

impl Naive {
    pub fn correct() -> Self {
        Naive {
            name: "naive".into(),
            plant: Plant::default(),
        }
    }
    pub fn with(name: &str, plant: Plant) -> Self {
        Naive {
            name: name.into(),
            plant,
        }
    }
}

struct Cache {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Backend for Naive {
    fn name(&self) -> &str {
        &self.name
    }
    fn supports(&self, _: &AttentionConfig) -> Result<(), Unsupported> {
        Ok(())
    }
    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            shape: "[num_blocks * block_size, num_kv_heads, head_size] x2",
            description: "flat slots",
        }
    }
    fn new_cache(&self, c: &AttentionConfig, num_blocks: usize) -> Result<KvCache, BackendError> {
        let n = num_blocks * c.block_size * c.num_kv_heads * c.head_size;
        Ok(Box::new(Cache {
            k: vec![0.0; n],
            v: vec![0.0; n],
        }))
    }
    fn write_kv(
        &self,
        c: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let cache = cache_as_mut::<Cache>(&self.name, cache)?;
        let row = c.num_kv_heads * c.head_size;
        let slots = cache.k.len() / row.max(1);
        if self.plant.raises_on_padding_write && kv.slot_mapping.contains(&-1) {
            return Err(BackendError::Failed {
                backend: self.name.clone(),
                message: python_traceback(
                    "write_kv",
                    "cache.index_copy_(0, slots, key)",
                    &format!("IndexError: index_copy_(): index -1 is out of bounds for dimension 0 with size {slots}"),
                ),
            });
        }
        for (t, &slot) in kv.slot_mapping.iter().enumerate() {
            let s = match slot {
                s if s >= 0 => s as usize,
                _ if self.plant.padding_into_last_slot && slots > 0 => slots - 1,
                _ => continue,
            };
            cache.k[s * row..(s + 1) * row].copy_from_slice(&kv.key[t * row..(t + 1) * row]);
            cache.v[s * row..(s + 1) * row].copy_from_slice(&kv.value[t * row..(t + 1) * row]);
        }
        Ok(())
    }
    fn forward(
        &self,
        c: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let cache = cache_as::<Cache>(&self.name, cache)?;
        if self.plant.fails_on_block_size == Some(c.block_size) {
            return Err(BackendError::Failed {
                backend: self.name.clone(),
                message: format!("no kernel for block size {}", c.block_size),
            });
        }
        if self
            .plant
            .raises_from_block_size
            .is_some_and(|b| c.block_size >= b)
        {
            return Err(BackendError::Failed {
                backend: self.name.clone(),
                message: python_traceback(
                    "forward",
                    "scores = scores + mask",
                    &format!("RuntimeError: The size of tensor a ({}) must match the size of tensor b (64) at non-singleton dimension 3", 2 * c.block_size),
                ),
            });
        }
        if self.plant.panic_on_batches && step.seq_lens.len() > 1 {
            panic!("planted panic on a batch of {}", step.seq_lens.len());
        }
        let (hq, hkv, d, bs) = (c.num_heads, c.num_kv_heads, c.head_size, c.block_size);
        let mut out = vec![0.0f32; step.num_tokens * hq * d];
        for s in 0..step.seq_lens.len() {
            let (q0, q1) = (step.query_start_loc[s], step.query_start_loc[s + 1]);
            let len = step.seq_lens[s];
            let ctx = len - (q1 - q0);
            for t in q0..q1 {
                let p = ctx + t - q0;
                let (mut lo, mut hi) = attn_reference::oracle::Visibility::of(c)
                    .keys(p, len)
                    .bounds()
                    .expect("a query sees itself");
                if self.plant.window_off_by_one
                    && c.sliding_window.is_some()
                    && c.kind == AttentionKind::Decoder
                {
                    lo = lo.saturating_sub(1);
                }
                hi = hi.min(len - 1);
                for h in 0..hq {
                    let kvh = if self.plant.gqa_modulo {
                        h % hkv
                    } else {
                        h / (hq / hkv)
                    };
                    let q = &step.query[(t * hq + h) * d..(t * hq + h + 1) * d];
                    let slot = |k: usize| step.block_table[s][k / bs] as usize * bs + k % bs;
                    let mut logits: Vec<f64> = (lo..=hi)
                        .map(|k| {
                            let kr = &cache.k[(slot(k) * hkv + kvh) * d..][..d];
                            let mut dot = q
                                .iter()
                                .zip(kr)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>();
                            if self.plant.scores_in_f16 && c.dtype == attn_reference::DType::F16 {
                                dot = c.dtype.round(dot as f32) as f64;
                            }
                            let mut l = c.effective_scale() * dot;
                            if let Some(cap) = c.logits_soft_cap {
                                l = cap as f64 * (l / cap as f64).tanh();
                            }
                            if let Some(a) = &c.alibi_slopes {
                                l += a[h] as f64 * (k as f64 - p as f64);
                            }
                            l
                        })
                        .collect();
                    let sink = c.sinks.as_ref().map(|x| x[h] as f64);
                    let m = logits
                        .iter()
                        .copied()
                        .chain(sink)
                        .fold(f64::NEG_INFINITY, f64::max);
                    logits.iter_mut().for_each(|l| *l = (*l - m).exp());
                    let denom: f64 =
                        logits.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
                    let end = if self.plant.whole_block_tail {
                        len.div_ceil(bs) * bs - 1
                    } else {
                        hi
                    };
                    for i in 0..d {
                        let acc: f64 = (lo..=end)
                            .map(|k| {
                                let w = if k <= hi { logits[k - lo] } else { 0.0 };
                                w * cache.v[(slot(k) * hkv + kvh) * d + i] as f64
                            })
                            .sum();
                        out[(t * hq + h) * d + i] = c.dtype.round((acc / denom) as f32);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// An exception as a Python adapter reports it: the traceback, `exception` its last line.
fn python_traceback(function: &str, line: &str, exception: &str) -> String {
    format!(
        "Traceback (most recent call last):\n  File \"/srv/plugin/attention.py\", line 214, in {function}\n    {line}\n{exception}"
    )
}

/// `cpu` differing in one way a test needs: a name, optional features it leaves out, a
/// refusal `supports` adds, and a check of each step before the forward (an error there is
/// the forward's).
pub struct CpuWith {
    pub name: &'static str,
    pub inner: attn_backends::cpu::CpuBackend,
    pub without: Vec<attn_reference::Feature>,
    pub refuses: fn(&AttentionConfig) -> Result<(), Unsupported>,
    pub before_forward: fn(&StepInputs<'_>) -> Result<(), BackendError>,
}

impl CpuWith {
    /// `cpu` itself, under `name`.
    pub fn new(name: &'static str) -> CpuWith {
        CpuWith {
            name,
            inner: attn_backends::cpu::CpuBackend::auto(),
            without: Vec::new(),
            refuses: |_| Ok(()),
            before_forward: |_| Ok(()),
        }
    }
}

impl Backend for CpuWith {
    fn name(&self) -> &str {
        self.name
    }
    fn supports(&self, c: &AttentionConfig) -> Result<(), Unsupported> {
        (self.refuses)(c)?;
        self.inner.supports(c)
    }
    fn optional_features(&self) -> Vec<attn_reference::Feature> {
        let mut f = self.inner.optional_features();
        f.retain(|x| !self.without.contains(x));
        f
    }
    fn cache_layout(&self) -> CacheLayout {
        self.inner.cache_layout()
    }
    fn new_cache(&self, c: &AttentionConfig, num_blocks: usize) -> Result<KvCache, BackendError> {
        self.inner.new_cache(c, num_blocks)
    }
    fn write_kv(
        &self,
        c: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        self.inner.write_kv(c, cache, kv)
    }
    fn forward(
        &self,
        c: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        (self.before_forward)(step)?;
        self.inner.forward(c, cache, step)
    }
}
