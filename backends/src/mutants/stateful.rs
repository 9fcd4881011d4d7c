//! Mutants that keep state between steps, as serving backends do (a persistent batch,
//! per-sequence block pointers, a cache of converted blocks), and get it wrong only when a
//! cache lives across steps: blocks freed and reused, prefix hits, chunked prefill, decode
//! crossing a block boundary. A single case runs one forward on a fresh cache, so none of
//! them can show there; only a trace catches them.
//!
//! Each wraps the real `cpu` backend. Writes are queued and applied when the step's forward
//! comes (as a backend that fuses reshape-and-cache into its forward call does), so a bug can
//! depend on which sequence a token belongs to.

use crate::cpu::CpuBackend;
use crate::{
    cache_as, cache_as_mut, Backend, BackendError, CacheLayout, KvCache, KvWrite, StepInputs,
    Unsupported,
};
use attn_reference::{AttentionConfig, PrefixLm, Rswa};
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepBug {
    /// A decode token that starts a new block is written at offset 0 of the sequence's
    /// previous block: the writer's block pointer advances one step late.
    NewBlockIntoPrevious,
    /// Each batch row keeps the block table of the sequence it held last step and reads its
    /// old entries: never invalidated when the row's sequence finishes, is preempted, or its
    /// blocks are freed and reused.
    StaleRowTable,
    /// A sequence admitted with a prefix hit writes its first chunk over the last hit block
    /// as well (the positions counted from the hit block instead of after it).
    PrefixHitOverwritten,
    /// Full blocks are kept converted after the step that read them and reused while the
    /// block is partial; a block freed and reused by a shorter sequence reads the old one.
    StaleBlockSnapshot,
    /// A continuing chunk of a chunked prefill is written one position early: its first
    /// token over the previous chunk's last, its last slot left unwritten.
    ChunkOffByOne,
    /// Each batch row keeps the per-request masks (causal flag, PrefixLM ranges, R-SWA
    /// prefix) of the first request it held, as a persistent batch whose mask columns are
    /// filled once: a later request in that row runs under another's masks.
    StaleRowMasks,
    /// Query heads are processed in packs of 16 per kv head; the accumulator of every pack
    /// past the first is a scratch buffer that is not zeroed between calls, so with more than
    /// 16 query heads per kv head those heads start from what the previous call left.
    HeadPackAccumulator,
}

/// Query heads per kv head in one pack of the head-pack mutant.
const HEAD_PACK: usize = 16;

pub struct StatefulMutant {
    name: String,
    bug: StepBug,
    inner: CpuBackend,
}

impl StatefulMutant {
    pub fn new(name: &str, bug: StepBug) -> Self {
        StatefulMutant {
            name: attn_results::BackendRef::mutant(name).to_string(),
            bug,
            inner: CpuBackend::auto(),
        }
    }
}

/// A queued write.
struct Pending {
    key: Vec<f32>,
    value: Vec<f32>,
    slots: Vec<i64>,
}

/// What a batch row held at the previous step.
#[derive(Clone)]
struct RowMemory {
    /// The blocks in use (the table without its padding).
    table: Vec<u32>,
    seq_len: usize,
    /// Slot of the row's last new token.
    last_slot: i64,
}

/// The K and V rows a slot holds.
type SlotRows = (i64, Vec<f32>, Vec<f32>);

#[derive(Default)]
struct Memory {
    rows: Vec<RowMemory>,
    /// Every row written so far, by slot (for the block snapshots).
    shadow: HashMap<i64, (Vec<f32>, Vec<f32>)>,
    /// Contents of blocks as they were when last read full.
    snapshots: HashMap<u32, Vec<SlotRows>>,
    /// Per batch row, the masks of the first request it held.
    masks: Vec<RowMasks>,
    /// The previous call's output (the head-pack scratch accumulators).
    last_output: Vec<f32>,
}

/// One request's masks: causal, PrefixLM ranges, R-SWA prefix length.
type RowMasks = (bool, Vec<(usize, usize)>, usize);

/// `step`'s masks with each row's as `memory` first saw them there.
fn stale_masks(
    memory: &mut Memory,
    step: &StepInputs<'_>,
    rows: &[Row<'_>],
) -> (Vec<bool>, PrefixLm, Rswa) {
    while memory.masks.len() < rows.len() {
        let r = memory.masks.len();
        let mask = step.request_mask(r);
        memory.masks.push((
            mask.causal,
            mask.ranges.to_vec(),
            mask.rswa.map_or(0, |x| x.1),
        ));
    }
    let kept = &memory.masks[..rows.len()];
    let causal = kept.iter().map(|m| m.0).collect();
    let prefix_lm = PrefixLm {
        ranges: kept.iter().map(|m| m.1.clone()).collect(),
        clamp_to_window: step.prefix_lm.is_some_and(|p| p.clamp_to_window),
    };
    let rswa = Rswa {
        window: step.rswa.map_or(1, |r| r.window),
        prefix_lens: kept.iter().map(|m| m.2).collect(),
    };
    (causal, prefix_lm, rswa)
}

/// The cache sits behind a mutex (`Mutex<StatefulCache>` is the `KvCache`): `forward` applies
/// the queued writes and updates the memory through a shared reference.
struct StatefulCache {
    inner: KvCache,
    pending: Vec<Pending>,
    memory: Mutex<Memory>,
}

/// One batch row of a step.
struct Row<'a> {
    table: &'a [u32],
    seq_len: usize,
    context_len: usize,
    /// Token range of its new tokens.
    tokens: std::ops::Range<usize>,
}

impl Row<'_> {
    fn slot(&self, pos: usize, bs: usize) -> i64 {
        self.table[pos / bs] as i64 * bs as i64 + (pos % bs) as i64
    }

    /// The row that held this sequence at the previous step, when it continues it.
    fn continues<'m>(&self, memory: &'m Memory) -> Option<&'m RowMemory> {
        memory.rows.iter().find(|m| {
            m.seq_len == self.context_len && !m.table.is_empty() && self.table.starts_with(&m.table)
        })
    }
}

fn rows<'a>(step: &'a StepInputs<'a>, bs: usize) -> Vec<Row<'a>> {
    (0..step.seq_lens.len())
        .map(|r| {
            let tokens = step.query_start_loc[r]..step.query_start_loc[r + 1];
            let seq_len = step.seq_lens[r];
            Row {
                table: &step.block_table[r][..seq_len.div_ceil(bs)],
                seq_len,
                context_len: seq_len - tokens.len(),
                tokens,
            }
        })
        .collect()
}

impl StatefulMutant {
    /// Where the buggy writer puts the step's new tokens: (token, slot) pairs, in order.
    fn placements(
        &self,
        memory: &Memory,
        rows: &[Row<'_>],
        slots: &[i64],
        bs: usize,
    ) -> Vec<(usize, i64)> {
        let mut out: Vec<(usize, i64)> = slots.iter().copied().enumerate().collect();
        let bsi = bs as i64;
        for row in rows {
            let prev = row.continues(memory);
            let q = row.tokens.len();
            match self.bug {
                StepBug::NewBlockIntoPrevious => {
                    let t = row.tokens.start;
                    if let (1, Some(p)) = (q, prev) {
                        if slots[t] % bsi == 0 && p.last_slot % bsi == bsi - 1 {
                            out[t].1 = p.last_slot + 1 - bsi;
                        }
                    }
                }
                StepBug::ChunkOffByOne => {
                    if q > 1 && prev.is_some() {
                        for (j, t) in row.tokens.clone().enumerate() {
                            out[t].1 = row.slot(row.context_len + j - 1, bs);
                        }
                    }
                }
                StepBug::PrefixHitOverwritten => {
                    let admitted = !memory.rows.is_empty() && prev.is_none();
                    if admitted && row.context_len > 0 && row.context_len.is_multiple_of(bs) {
                        let start = row.context_len - bs;
                        for (j, t) in row.tokens.clone().take(bs).enumerate() {
                            out.push((t, row.slot(start + j, bs)));
                        }
                    }
                }
                StepBug::StaleRowTable
                | StepBug::StaleBlockSnapshot
                | StepBug::StaleRowMasks
                | StepBug::HeadPackAccumulator => {}
            }
        }
        out
    }
}

fn write_rows(
    inner: &CpuBackend,
    config: &AttentionConfig,
    cache: &mut KvCache,
    rows: &[(i64, &[f32], &[f32])],
) -> Result<(), BackendError> {
    let slots: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let key: Vec<f32> = rows.iter().flat_map(|r| r.1.iter().copied()).collect();
    let value: Vec<f32> = rows.iter().flat_map(|r| r.2.iter().copied()).collect();
    inner.write_kv(
        config,
        cache,
        &KvWrite {
            key: &key,
            value: &value,
            slot_mapping: &slots,
        },
    )
}

impl Backend for StatefulMutant {
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

    /// `cpu`'s, less cross-attention: these bugs live in the writes of a decoder's own
    /// tokens, and a cross-attention step writes none (its query may also outnumber its keys,
    /// which the row bookkeeping here does not model).
    fn optional_features(&self) -> Vec<attn_reference::Feature> {
        // Their bugs live in a cache across steps: cross-attention, padded requests and MLA
        // (whose writes carry no V), which their row bookkeeping does not model, are not
        // theirs to run.
        use attn_reference::Feature;
        let mut features = self.inner.optional_features();
        let not_theirs = [
            Feature::CrossAttention,
            Feature::PaddedRequests,
            Feature::Mla,
        ];
        features.retain(|f| !not_theirs.contains(f));
        features
    }

    fn cache_layout(&self) -> CacheLayout {
        self.inner.cache_layout()
    }

    fn new_cache(
        &self,
        config: &AttentionConfig,
        num_blocks: usize,
    ) -> Result<KvCache, BackendError> {
        Ok(Box::new(Mutex::new(StatefulCache {
            inner: self.inner.new_cache(config, num_blocks)?,
            pending: Vec::new(),
            memory: Mutex::new(Memory::default()),
        })))
    }

    fn write_kv(
        &self,
        _: &AttentionConfig,
        cache: &mut KvCache,
        kv: &KvWrite<'_>,
    ) -> Result<(), BackendError> {
        let cache = cache_as_mut::<Mutex<StatefulCache>>(&self.name, cache)?;
        cache
            .get_mut()
            .expect("not poisoned")
            .pending
            .push(Pending {
                key: kv.key.to_vec(),
                value: kv.value.to_vec(),
                slots: kv.slot_mapping.to_vec(),
            });
        Ok(())
    }

    fn forward(
        &self,
        config: &AttentionConfig,
        cache: &KvCache,
        step: &StepInputs<'_>,
    ) -> Result<Vec<f32>, BackendError> {
        let mut guard = cache_as::<Mutex<StatefulCache>>(&self.name, cache)?
            .lock()
            .expect("not poisoned");
        let c = &mut *guard;
        let memory = c.memory.get_mut().expect("not poisoned");
        let bs = config.block_size;
        let row = config.num_kv_heads * config.head_size;
        let rows = rows(step, bs);
        let pending = std::mem::take(&mut c.pending);
        for (i, w) in pending.iter().enumerate() {
            let is_step = i + 1 == pending.len() && w.slots.len() == step.num_tokens;
            let placements = if is_step {
                self.placements(memory, &rows, &w.slots, bs)
            } else {
                w.slots.iter().copied().enumerate().collect()
            };
            let writes: Vec<(i64, &[f32], &[f32])> = placements
                .iter()
                .filter(|p| p.1 >= 0)
                .map(|&(t, s)| (s, &w.key[t * row..][..row], &w.value[t * row..][..row]))
                .collect();
            if self.bug == StepBug::StaleBlockSnapshot {
                for &(s, k, v) in &writes {
                    memory.shadow.insert(s, (k.to_vec(), v.to_vec()));
                }
            }
            write_rows(&self.inner, config, &mut c.inner, &writes)?;
        }
        let output = match self.bug {
            StepBug::StaleRowTable => {
                let mut table = step.block_table.to_vec();
                for (r, t) in table.iter_mut().enumerate() {
                    if let Some(m) = memory.rows.get(r) {
                        let n = m.table.len().min(rows[r].table.len());
                        t[..n].copy_from_slice(&m.table[..n]);
                    }
                }
                let step = StepInputs {
                    block_table: &table,
                    ..*step
                };
                self.inner.forward(config, &c.inner, &step)?
            }
            StepBug::StaleBlockSnapshot => {
                // Partial blocks with a snapshot are read from it.
                let stale: Vec<u32> = rows
                    .iter()
                    .filter(|r| !r.seq_len.is_multiple_of(bs))
                    .map(|r| r.table[r.seq_len / bs])
                    .filter(|b| memory.snapshots.contains_key(b))
                    .collect();
                let swap = |blocks: &[u32], m: &Memory, cache: &mut KvCache, old: bool| {
                    let rows: Vec<(i64, &[f32], &[f32])> = blocks
                        .iter()
                        .flat_map(|b| &m.snapshots[b])
                        .filter_map(|(s, k, v)| {
                            if old {
                                Some((*s, k.as_slice(), v.as_slice()))
                            } else {
                                m.shadow
                                    .get(s)
                                    .map(|(k, v)| (*s, k.as_slice(), v.as_slice()))
                            }
                        })
                        .collect();
                    write_rows(&self.inner, config, cache, &rows)
                };
                swap(&stale, memory, &mut c.inner, true)?;
                let out = self.inner.forward(config, &c.inner, step);
                swap(&stale, memory, &mut c.inner, false)?;
                for r in &rows {
                    for &b in &r.table[..r.seq_len / bs] {
                        let snap = (b as i64 * bs as i64..(b as i64 + 1) * bs as i64)
                            .filter_map(|s| {
                                memory
                                    .shadow
                                    .get(&s)
                                    .map(|(k, v)| (s, k.clone(), v.clone()))
                            })
                            .collect();
                        memory.snapshots.insert(b, snap);
                    }
                }
                out?
            }
            StepBug::StaleRowMasks => {
                let (causal, prefix_lm, rswa) = stale_masks(memory, step, &rows);
                let step = StepInputs {
                    causal: causal.contains(&false).then_some(causal.as_slice()),
                    prefix_lm: prefix_lm
                        .ranges
                        .iter()
                        .any(|r| !r.is_empty())
                        .then_some(&prefix_lm),
                    rswa: step.rswa.map(|_| &rswa),
                    ..*step
                };
                self.inner.forward(config, &c.inner, &step)?
            }
            StepBug::HeadPackAccumulator => {
                let mut out = self.inner.forward(config, &c.inner, step)?;
                let (group, d) = (config.group_size(), config.head_size_v());
                if group > HEAD_PACK {
                    let last = std::mem::take(&mut memory.last_output);
                    for (cell, (o, l)) in out.chunks_mut(d).zip(last.chunks(d)).enumerate() {
                        if cell % config.num_heads % group >= HEAD_PACK {
                            o.iter_mut().zip(l).for_each(|(o, l)| *o += l);
                        }
                    }
                    memory.last_output = out.clone();
                }
                out
            }
            _ => self.inner.forward(config, &c.inner, step)?,
        };
        memory.rows = rows
            .iter()
            .map(|r| RowMemory {
                table: r.table.to_vec(),
                seq_len: r.seq_len,
                last_slot: r.slot(r.seq_len - 1, bs),
            })
            .collect();
        Ok(output)
    }
}
