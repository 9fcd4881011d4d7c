//! A trace from a recipe: a scheduler in the manner of vLLM's (running sequences first, then
//! admissions in arrival order, a token budget per step, chunked prefill, preemption of the
//! newest running sequence when blocks run out, recompute on readmission) over the
//! [`BlockManager`]. The recipe's numbers are what a strategy draws and a shrinker makes
//! smaller; the trace is a deterministic function of it.

use super::manager::{BlockManager, PrefixKey};
use super::{
    FreeReason, Freed, Phase, ScheduledSeq, SequenceMasks, Trace, TraceSequence, TraceStep,
};
use crate::oracle::Visibility;
use crate::{AttentionConfig, AttentionKind, Batch, InputRng, PrefixLm, Rswa};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRecipe {
    pub config: AttentionConfig,
    /// Prompt tokens per sequence (at least 1), in arrival order.
    pub prompts: Vec<usize>,
    /// Decoded tokens per sequence after its prompt.
    pub outputs: Vec<usize>,
    /// The first `sharing` sequences share their first `shared_prefix` tokens (prefix-cache
    /// hits on the full blocks of it).
    pub sharing: usize,
    pub shared_prefix: usize,
    /// Most prompt tokens of one sequence per step (chunked prefill).
    pub chunk: usize,
    /// Most tokens per step, all sequences together.
    pub token_budget: usize,
    /// Most sequences running at once.
    pub max_running: usize,
    /// Usable blocks (the null block aside); raised to fit the longest sequence.
    pub cache_blocks: usize,
    /// The trace stops after this many steps, even with work left.
    pub max_steps: usize,
    /// Seed of the tokens' values.
    pub seed: u64,
    /// What unwritten slots hold ([`crate::Poison`]; absent: large finite values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison: Option<crate::Poison>,
    /// vLLM 0.33's per-request masks (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masks: Option<MaskRecipe>,
}

/// vLLM 0.33's per-request masks of a trace recipe, as bits and thousandths, so that dropping
/// a sequence or shortening a prompt keeps them valid.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaskRecipe {
    /// Bit `s`: sequence `s` is non-causal (sequences past 63 stay causal).
    #[serde(default)]
    pub non_causal: u64,
    /// PrefixLM ranges inside each prompt (its image or document tokens, which chunked
    /// prefill may split across steps), `[start, end]` in thousandths of the prompt, for the
    /// sequences of bits `range_seqs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<(u16, u16)>,
    #[serde(default)]
    pub range_seqs: u64,
    /// Gemma 4's clamp of the ranges to the sliding window.
    #[serde(default)]
    pub clamp: bool,
    /// R-SWA: its window, and each prompt's prefix in thousandths (left out beside a sliding
    /// window or PrefixLM ranges, which the case model refuses with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rswa: Option<(usize, u16)>,
}

impl MaskRecipe {
    /// The recipe once sequence `s` is gone: later sequences keep their own masks.
    pub fn remove_seq(&mut self, s: usize) {
        let without = |bits: u64| match s {
            0..=63 => bits & ((1u64 << s) - 1) | (bits >> s >> 1) << s,
            _ => bits,
        };
        self.non_causal = without(self.non_causal);
        self.range_seqs = without(self.range_seqs);
    }

    /// The masks of sequences with `prompts` (at least 1 token each) and whole lengths
    /// `lens` under `config`; None when no request has one.
    pub fn masks(
        &self,
        config: &AttentionConfig,
        prompts: &[usize],
        lens: &[usize],
    ) -> Option<SequenceMasks> {
        let bit = |bits: u64, s: usize| s < 64 && bits >> s & 1 == 1;
        let causal: Vec<bool> = (0..lens.len()).map(|s| !bit(self.non_causal, s)).collect();
        let ranges: Vec<Vec<(usize, usize)>> = prompts
            .iter()
            .enumerate()
            .map(|(s, &p)| match bit(self.range_seqs, s) {
                true => PrefixLm::ranges_at(&self.ranges, p),
                false => Vec::new(),
            })
            .collect();
        let prefix_lm = ranges.iter().any(|r| !r.is_empty()).then_some(PrefixLm {
            ranges,
            clamp_to_window: self.clamp,
        });
        let rswa = self
            .rswa
            .filter(|_| config.sliding_window.is_none() && prefix_lm.is_none())
            .map(|(window, t)| Rswa {
                window: window.max(1),
                prefix_lens: prompts
                    .iter()
                    .map(|&p| p * t.min(1000) as usize / 1000)
                    .collect(),
            });
        let masks = SequenceMasks {
            causal: causal.contains(&false).then_some(causal),
            prefix_lm,
            rswa,
        };
        (masks != SequenceMasks::default()).then_some(masks)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Waiting,
    Running,
    Finished,
}

struct SeqState {
    prompt: usize,
    len: usize,
    /// Tokens in the cache.
    computed: usize,
    /// Tokens it had when last preempted (recomputed as prompt on readmission).
    recompute_until: usize,
    table: Vec<u32>,
    /// Blocks registered in the prefix cache (a prefix of `table`).
    registered: usize,
    status: Status,
    first_chunk: bool,
}

impl SeqState {
    /// Tokens computed as a prefill (prompt, or everything it had before a preemption).
    fn prefill_end(&self) -> usize {
        self.prompt.max(self.recompute_until)
    }
}

/// The trace a recipe describes.
pub fn generate(r: &TraceRecipe) -> Trace {
    let config = r.config.clone();
    let bs = config.block_size.max(1);
    let n = r.prompts.len().min(r.outputs.len());
    let sequences = token_data(r, n);
    let mut seqs: Vec<SeqState> = (0..n)
        .map(|i| SeqState {
            prompt: r.prompts[i].max(1),
            len: r.prompts[i].max(1) + r.outputs[i],
            computed: 0,
            recompute_until: 0,
            table: Vec::new(),
            registered: 0,
            status: Status::Waiting,
            first_chunk: true,
        })
        .collect();
    let masks = r.masks.as_ref().and_then(|m| {
        let prompts: Vec<usize> = seqs.iter().map(|s| s.prompt).collect();
        let lens: Vec<usize> = seqs.iter().map(|s| s.len).collect();
        m.masks(&config, &prompts, &lens)
    });
    let horizon = Horizon::new(&config, seqs.iter().map(|s| s.len).collect(), &masks);
    let longest = seqs.iter().map(|s| s.len.div_ceil(bs)).max().unwrap_or(1);
    let num_blocks = 1 + r.cache_blocks.max(longest);
    let key = |s: usize, index: usize| {
        if s < r.sharing && (index + 1) * bs <= r.shared_prefix {
            PrefixKey::Shared { group: 0, index }
        } else {
            PrefixKey::Own { seq: s, index }
        }
    };
    let mut mgr = BlockManager::new(num_blocks);
    let mut waiting: VecDeque<usize> = (0..n).collect();
    let mut running: Vec<usize> = Vec::new();
    let mut steps = Vec::new();
    let chunk = r.chunk.max(1);

    while steps.len() < r.max_steps && seqs.iter().any(|s| s.status != Status::Finished) {
        let mut budget = r.token_budget.max(1);
        let mut batch: Vec<ScheduledSeq> = Vec::new();
        let mut step = TraceStep {
            seqs: Vec::new(),
            prefix_hits: Vec::new(),
            freed: Vec::new(),
        };
        let mut i = 0;
        while i < running.len() && budget > 0 {
            let s = running[i];
            skip_blocks(s, &mut seqs[s], &horizon, &mut mgr, &mut step);
            let st = &seqs[s];
            let q = if st.computed < st.prefill_end() {
                chunk.min(st.prefill_end() - st.computed).min(budget)
            } else {
                1
            };
            let need = (st.computed + q).div_ceil(bs) - st.table.len();
            // Preempt from the newest until the blocks fit (possibly this sequence itself).
            let mut preempted_self = false;
            while mgr.num_free() < need {
                let victim = *running.last().expect("s is running");
                running.pop();
                let freed = preempt(&mut seqs[victim], &mut mgr);
                step.freed.push(Freed {
                    seq: victim,
                    reason: FreeReason::Preempted,
                    blocks: freed,
                });
                waiting.push_front(victim);
                if victim == s {
                    preempted_self = true;
                    break;
                }
            }
            if preempted_self {
                break;
            }
            let st = &mut seqs[s];
            for _ in 0..need {
                st.table.push(mgr.allocate().expect("enough free blocks"));
            }
            batch.push(scheduled(s, st, q));
            budget -= q;
            i += 1;
        }
        while running.len() < r.max_running.max(1) && budget > 0 {
            let Some(&s) = waiting.front() else { break };
            let st = &mut seqs[s];
            // Hits on full blocks, leaving at least one token to compute.
            let mut hits = Vec::new();
            while (hits.len() + 1) * bs < st.prefill_end() {
                match mgr.lookup(key(s, hits.len())) {
                    Some(b) => hits.push(b),
                    None => break,
                }
            }
            let computed = hits.len() * bs;
            let q = chunk.min(st.prefill_end() - computed).min(budget);
            let need = (computed + q).div_ceil(bs) - hits.len();
            if mgr.num_free() < need {
                for &b in hits.iter().rev() {
                    mgr.release(b);
                }
                break;
            }
            waiting.pop_front();
            if !hits.is_empty() {
                step.prefix_hits.push((s, hits.len()));
            }
            st.registered = hits.len();
            st.table = hits;
            for _ in 0..need {
                st.table.push(mgr.allocate().expect("enough free blocks"));
            }
            st.computed = computed;
            st.status = Status::Running;
            st.first_chunk = true;
            skip_blocks(s, st, &horizon, &mut mgr, &mut step);
            running.push(s);
            batch.push(scheduled(s, st, q));
            budget -= q;
        }
        if batch.is_empty() {
            break;
        }
        for b in &batch {
            let st = &mut seqs[b.seq];
            st.computed += b.query_len;
            st.first_chunk = false;
            if st.computed >= st.recompute_until {
                st.recompute_until = 0;
            }
            // A block joins the prefix cache only after the block before it in this table
            // (a chain, as vLLM's hashes chain): so a hit's blocks are one table's prefix.
            while st.registered < st.computed / bs {
                let i = st.registered;
                let chained = i == 0 || mgr.cached(key(b.seq, i - 1)) == Some(st.table[i - 1]);
                if chained && st.table[i] != 0 {
                    mgr.register(st.table[i], key(b.seq, i));
                }
                st.registered += 1;
            }
            if st.computed == st.len {
                st.status = Status::Finished;
                let blocks = release_all(st, &mut mgr);
                step.freed.push(Freed {
                    seq: b.seq,
                    reason: FreeReason::Finished,
                    blocks,
                });
                running.retain(|&x| x != b.seq);
            }
        }
        step.seqs = batch;
        steps.push(step);
    }
    Trace {
        config,
        num_blocks,
        sequences,
        steps,
        poison: r.poison,
        recorded: None,
        masks,
    }
}

fn scheduled(s: usize, st: &SeqState, q: usize) -> ScheduledSeq {
    let phase = if st.computed >= st.prefill_end() {
        Phase::Decode
    } else if st.recompute_until > 0 {
        Phase::Recompute
    } else if st.first_chunk {
        Phase::Prefill
    } else {
        Phase::ChunkedPrefill
    };
    ScheduledSeq {
        seq: s,
        phase,
        context_len: st.computed,
        query_len: q,
        block_table: st.table.clone(),
    }
}

/// Give back every block of `st` (the tail first, as vLLM does, so the prefix stays
/// cached longest); the blocks that became free.
fn release_all(st: &mut SeqState, mgr: &mut BlockManager) -> Vec<u32> {
    let freed = st
        .table
        .iter()
        .rev()
        .copied()
        .filter(|&b| b != 0 && mgr.release(b))
        .collect();
    st.table.clear();
    st.registered = 0;
    freed
}

fn preempt(st: &mut SeqState, mgr: &mut BlockManager) -> Vec<u32> {
    st.recompute_until = st.recompute_until.max(st.computed);
    st.computed = 0;
    st.status = Status::Waiting;
    release_all(st, mgr)
}

/// The lowest key each sequence's queries can still see, under the config's window and
/// local chunks and the trace's masks: what vLLM's sliding-window and chunked-local managers
/// compute to skip blocks. Traces without a window or chunks skip nothing, as vLLM's full
/// attention manager does.
struct Horizon {
    config: AttentionConfig,
    whole: Batch,
    skips: bool,
}

impl Horizon {
    fn new(config: &AttentionConfig, lens: Vec<usize>, masks: &Option<SequenceMasks>) -> Self {
        Horizon {
            config: config.clone(),
            whole: super::whole_batch(lens, masks.clone()),
            skips: config.kind == AttentionKind::Decoder
                && (config.sliding_window.is_some() || config.attention_chunk_size.is_some()),
        }
    }

    /// The lowest key any query of sequence `s` at position `from` or later sees (`from`
    /// itself when it has no such query).
    fn first_key(&self, s: usize, from: usize) -> usize {
        let len = self.whole.seq_lens[s];
        let request = self.whole.request_mask(s);
        let visibility = Visibility {
            request,
            ..Visibility::of(&self.config)
        };
        let lowest = |p: usize| visibility.keys(p, len).bounds().map_or(p, |b| b.0);
        // Windows and chunks only move forward; ranges and R-SWA prefixes may reach back.
        let monotone = request.ranges.is_empty() && request.rswa.is_none();
        match monotone {
            true if from < len => lowest(from),
            true => from,
            false => (from..len).map(lowest).min().unwrap_or(from),
        }
    }
}

/// Replace the blocks of `st` wholly before every key its queries can still see with the
/// null block and give them back (listed in the step's `freed`), as vLLM does when it
/// schedules a windowed or chunked request: other requests may rewrite them from now on.
fn skip_blocks(
    s: usize,
    st: &mut SeqState,
    horizon: &Horizon,
    mgr: &mut BlockManager,
    step: &mut TraceStep,
) {
    if !horizon.skips {
        return;
    }
    let bs = horizon.config.block_size.max(1);
    let upto = (horizon.first_key(s, st.computed) / bs).min(st.table.len());
    let blocks: Vec<u32> = st.table[..upto]
        .iter_mut()
        .filter(|b| **b != 0)
        .map(|b| std::mem::replace(b, 0))
        .filter(|&b| mgr.release(b))
        .collect();
    if !blocks.is_empty() {
        step.freed.push(Freed {
            seq: s,
            reason: FreeReason::Skipped,
            blocks,
        });
    }
}

/// Every sequence's query, key and value rows (none of value under MLA); the shared prefix's
/// K/V copied into each sharing sequence.
fn token_data(r: &TraceRecipe, n: usize) -> Vec<TraceSequence> {
    let c = &r.config;
    let (qrow, kvrow) = (c.num_heads * c.head_size, c.num_kv_heads * c.head_size);
    let mut rng = InputRng::new(r.seed);
    let shared_k = rng.normal_vec(r.shared_prefix * kvrow, 1.0, c.dtype);
    let shared_v = rng.normal_vec(r.shared_prefix * c.value_row(), 1.0, c.dtype);
    (0..n)
        .map(|s| {
            let len = r.prompts[s].max(1) + r.outputs[s];
            let mut key = rng.normal_vec(len * kvrow, 1.0, c.dtype);
            let mut value = rng.normal_vec(len * c.value_row(), 1.0, c.dtype);
            if s < r.sharing {
                let n = r.shared_prefix.min(len);
                key[..n * kvrow].copy_from_slice(&shared_k[..n * kvrow]);
                let v = n * c.value_row();
                value[..v].copy_from_slice(&shared_v[..v]);
            }
            TraceSequence {
                query: rng.normal_vec(len * qrow, 1.0, c.dtype),
                key,
                value,
            }
        })
        .collect()
}
