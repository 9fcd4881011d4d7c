//! Mutants that wrap the real `cpu` backend and hand it something subtly wrong.

use crate::cpu::CpuBackend;
use crate::{Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs, Unsupported};
use attn_reference::AttentionConfig;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The window passed down is one key wider.
    WindowOneWider,
    /// Query head h is computed against kv head h % Hkv (by permuting query heads).
    GqaModulo,
    /// Slot -1 is written to the last slot of the cache, as negative indexing would.
    PaddingSlotWraps,
    /// The last logical block of each sequence comes from the next sequence's row.
    NeighbourTableRow,
    /// ALiBi slopes negated.
    AlibiSignFlipped,
    /// The scale squared.
    ScaleTwice,
    /// An FP8 query read as its codes: `fp8(q / q_scale)` without the `q_scale` back (the
    /// kernel is not passed its q descale).
    QueryDescaleMissing,
}

pub struct WrappedMutant {
    name: String,
    mutation: Mutation,
    inner: CpuBackend,
    /// Blocks of the cache made last, for wrapping slot -1 around to the last slot.
    num_blocks: AtomicUsize,
}

impl WrappedMutant {
    pub fn new(name: &str, mutation: Mutation) -> Self {
        WrappedMutant {
            name: attn_results::BackendRef::mutant(name).to_string(),
            mutation,
            inner: CpuBackend::auto(),
            num_blocks: AtomicUsize::new(0),
        }
    }

    fn config(&self, c: &AttentionConfig) -> AttentionConfig {
        let mut c = c.clone();
        match self.mutation {
            Mutation::WindowOneWider => c.sliding_window = c.sliding_window.map(|w| w + 1),
            Mutation::AlibiSignFlipped => {
                c.alibi_slopes = c.alibi_slopes.map(|s| s.iter().map(|x| -x).collect())
            }
            Mutation::ScaleTwice => {
                c.scale = Some((c.effective_scale() * c.effective_scale()) as f32)
            }
            Mutation::GqaModulo => {
                let perm = head_permutation(&c);
                let permute = |v: Vec<f32>| perm.iter().map(|&h| v[h]).collect::<Vec<f32>>();
                c.alibi_slopes = c.alibi_slopes.map(permute);
                c.sinks = c.sinks.map(permute);
            }
            // With the query divided by its scale beforehand (`forward`), a scale of 1 reads
            // the codes of `fp8(q / q_scale)` as they are.
            Mutation::QueryDescaleMissing => {
                if let Some(k) = c.kv_cache.as_mut().filter(|k| k.q_scale.is_some()) {
                    k.q_scale = Some(1.0);
                }
            }
            Mutation::PaddingSlotWraps | Mutation::NeighbourTableRow => {}
        }
        c
    }
}

/// `perm[h']` = the original head computed as inner head `h'`: inner head `h'` reads kv head
/// `h' / g`, and we want original head `h` to read kv head `h % Hkv`, so `h' = (h % Hkv) * g + h / Hkv`.
fn head_permutation(c: &AttentionConfig) -> Vec<usize> {
    let (hq, hkv) = (c.num_heads, c.num_kv_heads);
    let g = hq / hkv;
    let mut perm = vec![0; hq];
    for h in 0..hq {
        perm[(h % hkv) * g + h / hkv] = h;
    }
    perm
}

impl Backend for WrappedMutant {
    fn name(&self) -> &str {
        &self.name
    }

    fn role(&self) -> attn_results::BackendRole {
        attn_results::BackendRole::Mutant
    }

    fn supports(&self, config: &AttentionConfig) -> Result<(), Unsupported> {
        self.inner.supports(config)
    }

    fn space(&self) -> attn_reference::Space {
        self.inner.space()
    }

    fn optional_features(&self) -> Vec<attn_reference::Feature> {
        self.inner.optional_features()
    }

    fn cache_layout(&self) -> CacheLayout {
        self.inner.cache_layout()
    }

    fn new_cache(
        &self,
        config: &AttentionConfig,
        num_blocks: usize,
    ) -> Result<KvCache, BackendError> {
        self.num_blocks.store(num_blocks, Ordering::Relaxed);
        self.inner.new_cache(&self.config(config), num_blocks)
    }

    fn write_kv(
        &self,
        config: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let c = self.config(config);
        if self.mutation != Mutation::PaddingSlotWraps {
            return self.inner.write_kv(&c, cache, kv);
        }
        let num_slots = self.num_blocks.load(Ordering::Relaxed) * c.block_size;
        let slots: Vec<i64> = kv
            .slot_mapping
            .iter()
            .map(|&s| if s < 0 { num_slots as i64 + s } else { s })
            .collect();
        self.inner.write_kv(
            &c,
            cache,
            &KvWrite {
                slot_mapping: &slots,
                ..*kv
            },
        )
    }

    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let c = self.config(config);
        match self.mutation {
            Mutation::GqaModulo => {
                let perm = head_permutation(config);
                let d = config.head_size;
                let hq = config.num_heads;
                let mut q = vec![0.0; step.query.len()];
                for t in 0..step.num_tokens {
                    for (inner, &orig) in perm.iter().enumerate() {
                        q[(t * hq + inner) * d..][..d]
                            .copy_from_slice(&step.query[(t * hq + orig) * d..][..d]);
                    }
                }
                let out = self
                    .inner
                    .forward(&c, cache, &StepInputs { query: &q, ..*step })?;
                let mut back = vec![0.0; out.len()];
                for t in 0..step.num_tokens {
                    for (inner, &orig) in perm.iter().enumerate() {
                        back[(t * hq + orig) * d..][..d]
                            .copy_from_slice(&out[(t * hq + inner) * d..][..d]);
                    }
                }
                Ok(back)
            }
            Mutation::NeighbourTableRow => {
                let bs = config.block_size;
                let n = step.seq_lens.len();
                let mut table = step.block_table.to_vec();
                for (s, row) in table.iter_mut().enumerate() {
                    let last = step.seq_lens[s].div_ceil(bs) - 1;
                    let next = &step.block_table[(s + 1) % n];
                    if n > 1 && next.get(last).is_some_and(|&b| b != 0) {
                        row[last] = next[last];
                    }
                }
                self.inner.forward(
                    &c,
                    cache,
                    &StepInputs {
                        block_table: &table,
                        ..*step
                    },
                )
            }
            Mutation::QueryDescaleMissing => match config.kv_cache.as_ref().and_then(|k| k.q_scale)
            {
                Some(s) => {
                    let q: Vec<f32> = step.query.iter().map(|&x| x / s).collect();
                    self.inner
                        .forward(&c, cache, &StepInputs { query: &q, ..*step })
                }
                None => self.inner.forward(&c, cache, step),
            },
            _ => self.inner.forward(&c, cache, step),
        }
    }
}
