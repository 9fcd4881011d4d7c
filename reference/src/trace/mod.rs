//! Serving traces: one KV cache driven through many steps, as a scheduler drives it.
//!
//! A [`Trace`] holds the logical sequences (every token's query, key and value, whatever step
//! computes it) and the steps a block manager scheduled: per step, which sequences ran, how
//! many of their tokens were already in the cache, how many were new, and their block table.
//! The slot mapping follows from the table. Blocks are allocated, freed and reused without
//! clearing, full blocks are shared by prefix-cache hits, preempted sequences are
//! recomputed, and blocks a window or local chunk has left behind become the null block in
//! their table and go back to the free queue: what a backend's cache sees in serving, and
//! what a single fresh-cache case never shows.
//!
//! Each step is also a [`Case`] ([`Trace::step_case`]): its context comes from the logical
//! sequences, never from the cache, so the oracle of a step is the oracle of that case. A
//! replay file is a serialized `Trace`.

mod error;
mod generate;
mod history;
mod manager;
mod validate;

pub use error::TraceError;
pub use generate::{generate, MaskRecipe, TraceRecipe};
pub use history::{block_history, BlockEvent, BlockEventKind};
pub use manager::BlockManager;
pub use validate::MAX_TRACE_STEPS;

pub use crate::SequenceMasks;
use crate::{AttentionConfig, Batch, Case, PagedLayout, PrefixLm, Rswa, Tensors};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    pub config: AttentionConfig,
    /// Blocks of the one cache the whole trace runs on (block 0 is the null block).
    pub num_blocks: usize,
    /// The logical sequences, indexed by [`ScheduledSeq::seq`].
    pub sequences: Vec<TraceSequence>,
    pub steps: Vec<TraceStep>,
    /// What unwritten cache slots hold when the trace starts (absent: large finite stale
    /// values); freed blocks keep it until overwritten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison: Option<crate::Poison>,
    /// Where a trace file came from (absent in traces that are not replay files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<crate::Recorded>,
    /// vLLM 0.33's per-request masks, one entry per logical sequence over its whole length:
    /// a request keeps them across every step that runs it, whole, as vLLM passes them (a
    /// range or a prefix may reach past a step's `seq_len`). Absent: every request causal,
    /// with none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masks: Option<SequenceMasks>,
}

/// Every token of one sequence, whichever step computes (or recomputes) it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSequence {
    /// `[len, num_heads, head_size]`: the query each position issues.
    pub query: Vec<f32>,
    /// `[len, num_kv_heads, head_size]`
    pub key: Vec<f32>,
    /// `[len, num_kv_heads, head_size]` (empty under MLA: V is the key row's prefix)
    pub value: Vec<f32>,
}

/// What one sequence does in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The first chunk of its prompt (after any prefix-cache hit).
    Prefill,
    /// A later chunk of its prompt.
    ChunkedPrefill,
    /// One new token.
    Decode,
    /// Recomputing tokens it had before it was preempted.
    Recompute,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Prefill => "prefill",
            Phase::ChunkedPrefill => "chunked prefill",
            Phase::Decode => "decode",
            Phase::Recompute => "recompute",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledSeq {
    /// Index into [`Trace::sequences`].
    pub seq: usize,
    pub phase: Phase,
    /// Tokens already in the cache (computed in earlier steps or hit in the prefix cache).
    pub context_len: usize,
    /// New tokens this step: positions `context_len..context_len + query_len`.
    pub query_len: usize,
    /// Logical block -> physical block, exactly `ceil((context_len + query_len) / block_size)`.
    pub block_table: Vec<u32>,
}

/// Why the block manager freed a sequence's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FreeReason {
    Finished,
    Preempted,
    /// Wholly before every key the sequence's queries can still see (a sliding window or a
    /// local chunk moved past it): replaced by the null block in its table and given back
    /// when the step was scheduled, as vLLM's `remove_skipped_blocks` does.
    Skipped,
}

/// Blocks a sequence gave back: preempted and skipped ones before the step ran, finished
/// ones after it (a block shared by a prefix hit is only free once nobody holds it; it is
/// listed when its last holder lets go).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freed {
    pub seq: usize,
    pub reason: FreeReason,
    pub blocks: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceStep {
    /// The batch, in row order.
    pub seqs: Vec<ScheduledSeq>,
    /// Hits in the prefix cache when a sequence was admitted this step: (sequence, blocks).
    #[serde(default)]
    pub prefix_hits: Vec<(usize, usize)>,
    /// What was freed after the step.
    #[serde(default)]
    pub freed: Vec<Freed>,
}

impl ScheduledSeq {
    pub fn seq_len(&self) -> usize {
        self.context_len + self.query_len
    }
}

impl Trace {
    /// The step as a case: the block table padded with the null block, the slot mapping
    /// from the table, new tokens' Q/K/V and the context's K/V from the logical sequences.
    /// The trace must be valid.
    pub fn step_case(&self, step: usize) -> Case {
        let c = &self.config;
        let bs = c.block_size;
        let (qrow, kvrow) = (c.num_heads * c.head_size, c.num_kv_heads * c.head_size);
        let vrow = c.value_row();
        let st = &self.steps[step];
        let width = st
            .seqs
            .iter()
            .map(|s| s.block_table.len())
            .max()
            .unwrap_or(0);
        let mut tensors = Tensors {
            query: Vec::new(),
            key: Vec::new(),
            value: Vec::new(),
            context_key: Vec::new(),
            context_value: Vec::new(),
        };
        let mut slot_mapping = Vec::new();
        let mut block_table = Vec::new();
        for s in &st.seqs {
            let data = &self.sequences[s.seq];
            let (ctx, end) = (s.context_len, s.seq_len());
            tensors
                .query
                .extend_from_slice(&data.query[ctx * qrow..end * qrow]);
            tensors
                .key
                .extend_from_slice(&data.key[ctx * kvrow..end * kvrow]);
            tensors
                .value
                .extend_from_slice(&data.value[ctx * vrow..end * vrow]);
            tensors.context_key.push(data.key[..ctx * kvrow].to_vec());
            tensors
                .context_value
                .push(data.value[..ctx * vrow].to_vec());
            slot_mapping.extend((ctx..end).map(|p| slot(&s.block_table, bs, p)));
            let mut row = s.block_table.clone();
            row.resize(width, 0);
            block_table.push(row);
        }
        Case {
            config: c.clone(),
            batch: self.step_batch(st),
            layout: PagedLayout {
                num_blocks: self.num_blocks,
                block_table,
                slot_mapping,
            },
            tensors,
            // A step's own tokens are all real; its cache is the trace's.
            poison: None,
            recorded: None,
        }
    }

    /// A step's batch: its lengths, and each running request's masks whole, as vLLM passes
    /// them while chunked prefill is still inside a range or a prefix (its keys stop at the
    /// step's `seq_len`).
    fn step_batch(&self, st: &TraceStep) -> Batch {
        let masks = self.masks.as_ref();
        let causal = masks
            .and_then(|m| m.causal.as_ref())
            .map(|c| -> Vec<bool> {
                st.seqs
                    .iter()
                    .map(|s| c.get(s.seq).copied().unwrap_or(true))
                    .collect()
            })
            .filter(|c| c.contains(&false));
        let prefix_lm = masks
            .and_then(|m| m.prefix_lm.as_ref())
            .map(|p| PrefixLm {
                ranges: st
                    .seqs
                    .iter()
                    .map(|s| p.ranges.get(s.seq).cloned().unwrap_or_default())
                    .collect(),
                clamp_to_window: p.clamp_to_window,
            })
            .filter(|p| p.ranges.iter().any(|r| !r.is_empty()));
        let rswa = masks.and_then(|m| m.rswa.as_ref()).map(|r| Rswa {
            window: r.window,
            prefix_lens: st
                .seqs
                .iter()
                .map(|s| r.prefix_lens.get(s.seq).copied().unwrap_or(0))
                .collect(),
        });
        Batch {
            seq_lens: st.seqs.iter().map(ScheduledSeq::seq_len).collect(),
            query_lens: st.seqs.iter().map(|s| s.query_len).collect(),
            num_padding_tokens: 0,
            causal,
            prefix_lm,
            rswa,
        }
    }

    /// Every logical sequence at its whole length, with the trace's masks: what validation
    /// checks the masks against, and what coverage reads their features from.
    pub fn whole_batch(&self) -> Batch {
        let qrow = (self.config.num_heads * self.config.head_size).max(1);
        let lens: Vec<usize> = self
            .sequences
            .iter()
            .map(|s| s.query.len() / qrow)
            .collect();
        whole_batch(lens, self.masks.clone())
    }

    /// Tokens computed over the whole trace.
    pub fn num_tokens(&self) -> usize {
        self.steps
            .iter()
            .flat_map(|s| &s.seqs)
            .map(|s| s.query_len)
            .sum()
    }

    /// Parse and validate a trace from JSON; every problem is a typed error.
    pub fn from_json(text: &str) -> Result<Trace, TraceError> {
        let trace: Trace =
            crate::json::parse(text).map_err(|(line, column, message)| TraceError::Parse {
                line,
                column,
                message,
            })?;
        trace.validate()?;
        Ok(trace)
    }

    /// Read, parse and validate a trace file.
    pub fn load(path: &std::path::Path) -> Result<Trace, TraceError> {
        let io = |message: String| TraceError::Io {
            path: path.display().to_string(),
            message,
        };
        let meta = std::fs::metadata(path).map_err(|e| io(e.to_string()))?;
        if meta.is_dir() {
            return Err(io("is a directory, expected a JSON trace file".into()));
        }
        if meta.len() > crate::validate::MAX_CASE_FILE_BYTES {
            return Err(TraceError::Case {
                step: None,
                error: crate::CaseError::TooLarge {
                    field: "file".into(),
                    size: meta.len(),
                    limit: crate::validate::MAX_CASE_FILE_BYTES,
                },
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| io(e.to_string()))?;
        Trace::from_json(&text)
    }

    /// Whether a JSON document looks like a trace rather than a case (it has `steps`).
    pub fn looks_like_trace(text: &str) -> bool {
        serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v.get("steps").map(|_| ()))
            .is_some()
    }

    /// One-line summary of the trace's shape.
    pub fn shape_summary(&self) -> String {
        format!(
            "{} step(s), {} sequence(s), {} token(s), {} blocks, {}{}",
            self.steps.len(),
            self.sequences.len(),
            self.num_tokens(),
            self.num_blocks,
            self.config,
            self.poison.map_or(String::new(), |p| format!(
                ", poison {p} in unwritten slots"
            ))
        )
    }
}

/// Sequences of `lens` as one prefill each, with `masks`.
pub(crate) fn whole_batch(lens: Vec<usize>, masks: Option<SequenceMasks>) -> Batch {
    let mut batch = Batch::plain(lens.clone(), lens);
    batch.set_masks(masks.unwrap_or_default());
    batch
}

/// The slot of position `pos` through a (valid) table row.
pub(crate) fn slot(table: &[u32], block_size: usize, pos: usize) -> i64 {
    table[pos / block_size] as i64 * block_size as i64 + (pos % block_size) as i64
}
