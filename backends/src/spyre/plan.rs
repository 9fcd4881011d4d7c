//! Batching sequences into padded groups, and the index tensors a group is computed from.
//!
//! Every op costs a fixed dispatch time, so sequences are computed together as one padded
//! batch `[b, q_max, ...]` against keys `[b, len_max, ...]`; padding costs work, so a
//! sequence joins a group only when that is cheaper than a group of its own.

use super::step::Seq;
use super::tensors::from_i64;
use attn_reference::oracle::Visibility;
use attn_reference::AttentionConfig;
use tch::{TchError, Tensor};

/// Sequences computed as one padded batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub seqs: Vec<Seq>,
    /// Query rows per sequence (padded).
    pub q_max: usize,
    /// Longest sequence (keys per sequence before padding to whole pages).
    pub len_max: usize,
}

/// Cost model for grouping, in units of one (query token x key) product over all heads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupCost {
    /// Fixed cost of a group: the dispatch time of its ops.
    pub overhead: usize,
    /// Cost of gathering and converting one key/value row, relative to one query row.
    pub kv_row: usize,
    /// Upper bound on `b * len_max` of a group (gathered K/V rows), if any.
    pub max_kv_rows: Option<usize>,
}

impl Group {
    pub fn single(seq: Seq) -> Self {
        Group {
            seqs: vec![seq],
            q_max: seq.q_len,
            len_max: seq.seq_len,
        }
    }

    pub fn b(&self) -> usize {
        self.seqs.len()
    }

    fn cost(b: usize, q_max: usize, len_max: usize, m: &GroupCost) -> usize {
        m.overhead + b * len_max * (q_max + m.kv_row)
    }

    fn with(&self, seq: Seq) -> Group {
        let mut seqs = self.seqs.clone();
        seqs.push(seq);
        Group {
            seqs,
            q_max: self.q_max.max(seq.q_len),
            len_max: self.len_max.max(seq.seq_len),
        }
    }
}

/// Greedy grouping over sequences sorted by (query length, length): a sequence joins the
/// current group when the padded group costs no more than two separate ones.
pub(crate) fn group_sequences(seqs: &[Seq], m: &GroupCost) -> Vec<Group> {
    let mut sorted = seqs.to_vec();
    sorted.sort_by_key(|s| (s.q_len, s.seq_len, s.index));
    let mut groups: Vec<Group> = Vec::new();
    for seq in sorted {
        if let Some(g) = groups.last_mut() {
            let merged = g.with(seq);
            let fits = m
                .max_kv_rows
                .is_none_or(|cap| merged.b() * merged.len_max <= cap);
            let separate = Group::cost(g.b(), g.q_max, g.len_max, m)
                + Group::cost(1, seq.q_len, seq.seq_len, m);
            if fits && Group::cost(merged.b(), merged.q_max, merged.len_max, m) <= separate {
                *g = merged;
                continue;
            }
        }
        groups.push(Group::single(seq));
    }
    groups
}

/// One sequence per group with its queries padded to whole chunks of `q_chunk` rows, as a
/// device with static shapes computes them.
pub(crate) fn one_per_group(seqs: &[Seq], q_chunk: usize) -> Vec<Group> {
    seqs.iter()
        .map(|&s| Group {
            seqs: vec![s],
            q_max: s.q_len.div_ceil(q_chunk) * q_chunk,
            len_max: s.seq_len,
        })
        .collect()
}

/// A group's host-side facts as index tensors.
pub(crate) struct GroupIndex {
    /// `[b * q_max]`: the step token each padded query row reads (padding rows read their
    /// sequence's first query token; their output is discarded).
    pub q_rows: Tensor,
    /// `[b, q_max]`: absolute position of each query row; padding rows sit at 0, where key 0
    /// is always visible, so no row is fully masked.
    pub q_pos: Tensor,
    /// `[b, q_max]` bool: whether a row is a real query (not padding).
    pub q_real: Tensor,
    /// `[b]`
    pub seq_lens: Tensor,
    /// The same lengths on the host (what decides which gathered keys lie past an end).
    pub ends: Vec<i64>,
    /// Per sequence, the first key any of its queries sees (a window's or local chunk's
    /// start): the pages before it may be skipped blocks, the null block in the table.
    pub starts: Vec<i64>,
    /// `[b, pages]`: physical blocks, padded with the null block 0.
    pub blocks: Tensor,
    /// Pages per sequence: `len_max` rounded up to whole blocks.
    pub pages: usize,
}

impl GroupIndex {
    /// `pages` may exceed what `len_max` needs (a device pads keys further).
    pub fn new(
        c: &AttentionConfig,
        g: &Group,
        block_table: &[Vec<u32>],
        pages: usize,
    ) -> Result<Self, TchError> {
        let (b, q_max) = (g.b(), g.q_max);
        let mut q_rows = Vec::with_capacity(b * q_max);
        let mut q_pos = Vec::with_capacity(b * q_max);
        let mut q_real = Vec::with_capacity(b * q_max);
        let mut blocks = Vec::with_capacity(b * pages);
        for s in &g.seqs {
            for j in 0..q_max {
                let real = j < s.q_len;
                q_rows.push((s.q_start + if real { j } else { 0 }) as i64);
                q_pos.push(if real {
                    (s.context_len() + j) as i64
                } else {
                    0
                });
                q_real.push(real as i64);
            }
            let row = &block_table[s.index];
            blocks.extend((0..pages).map(|p| row.get(p).copied().unwrap_or(0) as i64));
        }
        let seq_lens: Vec<i64> = g.seqs.iter().map(|s| s.seq_len as i64).collect();
        // Windows and chunks only move forward: the first query's first key is the lowest.
        let visibility = Visibility::of(c);
        let starts = g
            .seqs
            .iter()
            .map(|s| {
                let first = visibility.keys(s.context_len(), s.seq_len.max(1)).bounds();
                first.map_or(0, |(lo, _)| lo as i64)
            })
            .collect();
        Ok(GroupIndex {
            q_rows: from_i64(&q_rows)?,
            q_pos: from_i64(&q_pos)?.f_view([b as i64, q_max as i64])?,
            q_real: from_i64(&q_real)?
                .f_view([b as i64, q_max as i64])?
                .f_to_kind(tch::Kind::Bool)?,
            seq_lens: from_i64(&seq_lens)?,
            ends: seq_lens,
            starts,
            blocks: from_i64(&blocks)?.f_view([b as i64, pages as i64])?,
            pages,
        })
    }
}

/// The rows of a group's output (`b * q_max` rows, padded queries among them) that hold real
/// queries, and the step's tokens they belong to; None for the rows when every row is real.
pub(crate) fn real_rows(g: &Group) -> (Option<Vec<i64>>, Vec<i64>) {
    let mut rows = Vec::new();
    let mut tokens = Vec::new();
    for (i, s) in g.seqs.iter().enumerate() {
        for j in 0..s.q_len {
            rows.push((i * g.q_max + j) as i64);
            tokens.push((s.q_start + j) as i64);
        }
    }
    let all = rows.len() == g.b() * g.q_max;
    (if all { None } else { Some(rows) }, tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(index: usize, q_start: usize, q_len: usize, seq_len: usize) -> Seq {
        Seq {
            index,
            q_start,
            q_len,
            seq_len,
        }
    }

    #[test]
    fn equal_sequences_share_a_group_and_distant_ones_do_not() {
        let m = GroupCost {
            overhead: 1000,
            kv_row: 4,
            max_kv_rows: None,
        };
        let same: Vec<Seq> = (0..4).map(|i| seq(i, i, 1, 2048)).collect();
        assert_eq!(group_sequences(&same, &m).len(), 1);
        let far = vec![seq(0, 0, 1, 64), seq(1, 1, 1, 8192)];
        assert_eq!(group_sequences(&far, &m).len(), 2);
        let capped = GroupCost {
            max_kv_rows: Some(4096),
            ..m
        };
        assert_eq!(group_sequences(&same, &capped).len(), 2);
    }

    #[test]
    fn real_rows_skip_padded_queries_and_name_their_tokens() {
        let a = seq(0, 0, 2, 5);
        let b = seq(1, 2, 1, 3);
        let g = Group {
            seqs: vec![b, a],
            q_max: 2,
            len_max: 5,
        };
        // Row 1 is b's padded query.
        assert_eq!(real_rows(&g), (Some(vec![0, 2, 3]), vec![2, 0, 1]));
        let decodes = Group {
            seqs: vec![seq(0, 0, 1, 5), seq(1, 1, 1, 3)],
            q_max: 1,
            len_max: 5,
        };
        assert_eq!(real_rows(&decodes), (None, vec![0, 1]));
    }
}
