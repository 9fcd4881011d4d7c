//! The history of physical blocks over a trace: who wrote them, who read them through a
//! prefix hit, when they were freed. A divergence report shows it for the blocks the
//! diverging step reads, since trace-only bugs live in that history.

use super::{FreeReason, Trace};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockEventKind {
    /// Sequence `seq` wrote positions `first..=last` into the block.
    Written {
        seq: usize,
        first: usize,
        last: usize,
    },
    /// Sequence `seq` got the block from the prefix cache (written by someone else).
    PrefixHit { seq: usize },
    /// Sequence `seq` let go of the block, and nobody else held it.
    Freed { seq: usize, reason: FreeReason },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockEvent {
    pub step: usize,
    pub block: u32,
    pub kind: BlockEventKind,
}

impl std::fmt::Display for BlockEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {:>3}  block {:>3}  ", self.step, self.block)?;
        match &self.kind {
            BlockEventKind::Written { seq, first, last } if first == last => {
                write!(f, "written by seq {seq} (position {first})")
            }
            BlockEventKind::Written { seq, first, last } => {
                write!(f, "written by seq {seq} (positions {first}..={last})")
            }
            BlockEventKind::PrefixHit { seq } => write!(f, "prefix hit of seq {seq}"),
            BlockEventKind::Freed { seq, reason } => write!(
                f,
                "freed by seq {seq} ({})",
                match reason {
                    FreeReason::Finished => "finished",
                    FreeReason::Preempted => "preempted",
                    FreeReason::Skipped => "left behind by its window or chunk",
                }
            ),
        }
    }
}

/// Every event of `blocks` in steps `0..=last_step`, in order. The trace must be valid.
pub fn block_history(trace: &Trace, blocks: &[u32], last_step: usize) -> Vec<BlockEvent> {
    let wanted: HashSet<u32> = blocks.iter().copied().collect();
    let bs = trace.config.block_size;
    let mut events = Vec::new();
    for (si, st) in trace.steps.iter().enumerate().take(last_step + 1) {
        // Preemptions and skipped blocks are freed before the step runs.
        let push_freed = |reason: FreeReason, events: &mut Vec<BlockEvent>| {
            for f in st.freed.iter().filter(|f| f.reason == reason) {
                for &b in f.blocks.iter().filter(|b| wanted.contains(b)) {
                    events.push(BlockEvent {
                        step: si,
                        block: b,
                        kind: BlockEventKind::Freed { seq: f.seq, reason },
                    });
                }
            }
        };
        push_freed(FreeReason::Preempted, &mut events);
        push_freed(FreeReason::Skipped, &mut events);
        let hits: Vec<(usize, usize)> = st.prefix_hits.clone();
        for s in &st.seqs {
            let hit = hits.iter().find(|h| h.0 == s.seq).map_or(0, |h| h.1);
            for (i, &b) in s.block_table.iter().enumerate() {
                if !wanted.contains(&b) {
                    continue;
                }
                if i < hit {
                    events.push(BlockEvent {
                        step: si,
                        block: b,
                        kind: BlockEventKind::PrefixHit { seq: s.seq },
                    });
                }
                let first = (i * bs).max(s.context_len);
                let last = ((i + 1) * bs).min(s.seq_len());
                if first < last {
                    events.push(BlockEvent {
                        step: si,
                        block: b,
                        kind: BlockEventKind::Written {
                            seq: s.seq,
                            first,
                            last: last - 1,
                        },
                    });
                }
            }
        }
        if si < last_step {
            push_freed(FreeReason::Finished, &mut events);
        }
    }
    events
}
