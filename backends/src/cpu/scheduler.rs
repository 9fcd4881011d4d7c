//! The work list of one forward call.
//!
//! A *task* is one kv head of one sequence over a tile of its query tokens: its rows are the
//! tile's tokens times the query heads that share the kv head, so K/V are read once for the
//! whole group. A task's keys are the union of what its rows may see. Decode tasks (one
//! query token) may be split along the keys (flash-decoding): each split is a *work item*
//! that leaves an unnormalised partial result (output rows, running max, running sum) for a
//! log-sum-exp merge. Items are handed out largest first (by an estimate of their cost,
//! dominated by KV length) and dealt to the threads ahead of time (`claims`).

use super::claims::deal;
use super::mask::visible_keys;
use super::partial::Partial;
use super::SplitKv;
use attn_reference::AttentionConfig;
use std::ops::Range;

/// Query rows per task at most: enough to reuse each K/V tile many times in prefill, few
/// enough that the task's query, scores and output tiles stay in L2.
const MAX_ROWS_PER_TASK: usize = 64;
/// Automatic splits keep at least this many keys per split, so the merge stays cheap.
const MIN_KEYS_PER_SPLIT: usize = 256;
/// Lengths where the schedule changes: rows per task (query tokens × heads) and the keys
/// that make a second split (and a third).
pub const SPLIT_THRESHOLDS: [usize; 3] = [
    MAX_ROWS_PER_TASK,
    MIN_KEYS_PER_SPLIT,
    2 * MIN_KEYS_PER_SPLIT,
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub seq: usize,
    pub kv_head: usize,
    /// Index of the first query token in the step.
    pub token0: usize,
    /// Absolute position of the first query token.
    pub pos0: usize,
    pub ntok: usize,
    /// Rows = `ntok * group`, ordered token-major: row `t * group + g` is query head
    /// `kv_head * group + g` of token `token0 + t`.
    pub rows: usize,
    /// Keys any of the task's rows may see.
    pub keys: Range<usize>,
    pub splits: usize,
    /// Index of the task's first work item; its splits are the `splits` items from there.
    pub first_item: usize,
}

impl Task {
    /// Staging floats per split (none when the task is not split: its one partial goes
    /// straight from the worker's scratch to the output).
    pub fn split_len(&self, head_size: usize) -> usize {
        if self.splits > 1 {
            Partial::staged_len(self.rows, head_size)
        } else {
            0
        }
    }

    pub fn split_keys(&self, split: usize) -> Range<usize> {
        let (k0, len) = (self.keys.start, self.keys.len());
        k0 + len * split / self.splits..k0 + len * (split + 1) / self.splits
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkItem {
    pub task: usize,
    pub split: usize,
    pub keys: Range<usize>,
    pub cost: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Schedule {
    pub tasks: Vec<Task>,
    /// In staging order (task-major, split-minor).
    pub items: Vec<WorkItem>,
    /// Indices into `items` dealt to each thread (see `claims`).
    pub lists: Vec<Vec<usize>>,
    pub staging_len: usize,
}

/// Plan the step; `query_start_loc` and `seq_lens` must already be validated.
pub fn plan<'m>(
    cfg: &AttentionConfig,
    query_start_loc: &[usize],
    seq_lens: &[usize],
    masks: impl Fn(usize) -> attn_reference::RequestMask<'m>,
    threads: usize,
    split: SplitKv,
) -> Schedule {
    let group = cfg.num_heads / cfg.num_kv_heads;
    let tile_tokens = (MAX_ROWS_PER_TASK / group).max(1);
    let mut tasks = Vec::new();
    let limits = super::mask::KeyLimits::of(cfg);
    for (seq, &seq_len) in seq_lens.iter().enumerate() {
        let limits = limits.request(masks(seq));
        let (start, end) = (query_start_loc[seq], query_start_loc[seq + 1]);
        // Cross-attention queries may outnumber the encoder's keys and have no position
        // among them (every key is visible): any position will do.
        let ctx = seq_len.saturating_sub(end - start);
        let mut t = start;
        while t < end {
            let ntok = tile_tokens.min(end - t);
            let pos0 = ctx + (t - start);
            // Every token's keys: a PrefixLM range or R-SWA's prefix can reach past the
            // first's and the last's.
            let keys = (pos0..pos0 + ntok)
                .map(|p| visible_keys(cfg.kind, limits, p, seq_len).hull())
                .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
                .unwrap_or(0..0);
            for kv_head in 0..cfg.num_kv_heads {
                tasks.push(Task {
                    seq,
                    kv_head,
                    token0: t,
                    pos0,
                    ntok,
                    rows: ntok * group,
                    keys: keys.clone(),
                    splits: 1,
                    first_item: 0,
                });
            }
            t += ntok;
        }
    }

    let threads = threads.max(1);
    let per_task = threads.div_ceil(tasks.len().max(1));
    let few_tasks = tasks.len() < threads;
    for task in tasks.iter_mut().filter(|t| t.ntok == 1) {
        let len = task.keys.len();
        task.splits = match split {
            SplitKv::Never => 1,
            SplitKv::Auto if few_tasks => per_task.min(len / MIN_KEYS_PER_SPLIT).max(1),
            SplitKv::Auto => 1,
            SplitKv::Invariant => threads.min(len / MIN_KEYS_PER_SPLIT).max(1),
            SplitKv::Always => per_task.max(2).min(len).max(1),
        };
    }

    let mut items = Vec::new();
    let mut staging = 0;
    for (i, task) in tasks.iter_mut().enumerate() {
        task.first_item = items.len();
        staging += task.splits * task.split_len(cfg.head_size_v());
        for split in 0..task.splits {
            let keys = task.split_keys(split);
            // Reading K/V dominates decode, multiply-adds dominate prefill.
            let cost = keys.len() as u64 * (task.rows as u64 + 4) + 64;
            items.push(WorkItem {
                task: i,
                split,
                keys,
                cost,
            });
        }
    }
    let costs: Vec<u64> = items.iter().map(|i| i.cost).collect();
    let lists = deal(&costs, threads);
    Schedule {
        tasks,
        items,
        lists,
        staging_len: staging,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::DType;

    fn cfg() -> AttentionConfig {
        AttentionConfig::new(8, 2, 16, 4, DType::F32)
    }

    #[test]
    fn tasks_cover_every_token_and_kv_head_once() {
        let s = plan(
            &cfg(),
            &[0, 1, 40, 41],
            &[10, 39, 5],
            |_| attn_reference::RequestMask::CAUSAL,
            2,
            SplitKv::Never,
        );
        let mut seen = vec![0; 41 * 2];
        for t in &s.tasks {
            for tok in t.token0..t.token0 + t.ntok {
                seen[tok * 2 + t.kv_head] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
    }

    #[test]
    fn splits_partition_the_keys() {
        let s = plan(
            &cfg(),
            &[0, 1],
            &[1000],
            |_| attn_reference::RequestMask::CAUSAL,
            4,
            SplitKv::Always,
        );
        for t in &s.tasks {
            assert!(t.splits >= 2);
            let parts: Vec<_> = (0..t.splits).map(|i| t.split_keys(i)).collect();
            assert_eq!(parts.first().map(|r| r.start), Some(0));
            assert_eq!(parts.last().map(|r| r.end), Some(1000));
            assert!(parts.windows(2).all(|w| w[0].end == w[1].start));
        }
        let never = plan(
            &cfg(),
            &[0, 1],
            &[1000],
            |_| attn_reference::RequestMask::CAUSAL,
            4,
            SplitKv::Never,
        );
        assert!(never.tasks.iter().all(|t| t.splits == 1));
        let auto_one_thread = plan(
            &cfg(),
            &[0, 1],
            &[1000],
            |_| attn_reference::RequestMask::CAUSAL,
            1,
            SplitKv::Auto,
        );
        assert!(auto_one_thread.tasks.iter().all(|t| t.splits == 1));
    }

    #[test]
    fn lists_hold_every_item_once() {
        let s = plan(
            &cfg(),
            &[0, 1, 2, 3],
            &[10, 1000, 100],
            |_| attn_reference::RequestMask::CAUSAL,
            2,
            SplitKv::Auto,
        );
        assert_eq!(s.lists.len(), 2);
        let mut all = s.lists.concat();
        all.sort();
        assert_eq!(all, (0..s.items.len()).collect::<Vec<_>>());
        let split = plan(
            &cfg(),
            &[0, 1, 2],
            &[1000, 700],
            |_| attn_reference::RequestMask::CAUSAL,
            4,
            SplitKv::Always,
        );
        for (t, task) in split.tasks.iter().enumerate() {
            for k in 0..task.splits {
                let item = &split.items[task.first_item + k];
                assert_eq!((item.task, item.split), (t, k));
            }
        }
    }
}
