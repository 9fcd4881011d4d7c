//! A recipe built into its case, deterministically: lengths, block tables in the recipe's
//! order, values, sharing, the features and the padding.

use super::{CaseRecipe, TableOrder, Values};
use attn_reference::{build_case, AttentionKind, BuildOptions, Case, InputRng, SharedPrefix};

impl CaseRecipe {
    /// The full case, deterministically.
    pub fn build(&self) -> Case {
        let (seq_lens, query_lens) = self.lens();
        let (seed, std) = match self.values {
            Values::Simple(seed) => (seed, 1.0),
            Values::Normal { seed, std } => (seed, std as f64),
        };
        let opts = BuildOptions {
            permute_blocks: false,
            spare_blocks: self.spare_blocks,
            padding_tokens: self.padding_tokens,
            std,
            shared_prefixes: self.sharing().into_iter().collect(),
        };
        let mut case = build_case(&seq_lens, &query_lens, self.config(), seed, &opts);
        case.batch.causal = self.causal_flags();
        case.batch.prefix_lm = self.prefix_lm_of(&seq_lens);
        case.batch.rswa = self.rswa_of(&seq_lens);
        case.poison = self.poison;
        if let Values::Simple(seed) = self.values {
            simplify_values(&mut case, seed, self.sharing().as_ref());
        }
        if let Some(shift) = self.logits {
            shift.apply(&mut case);
        }
        self.lay_out_blocks(&mut case);
        if let Some(total) = self.cache_blocks {
            move_to_the_top(&mut case, total);
        }
        debug_assert_eq!(case.validate(), Ok(()), "{self:?}");
        case
    }

    fn lay_out_blocks(&self, case: &mut Case) {
        let bs = self.block_size;
        let blocks: Vec<usize> = case.batch.seq_lens.iter().map(|l| l.div_ceil(bs)).collect();
        let sharing = self.sharing();
        // Blocks of sharing members that reuse the leader's physical block get no id of their own.
        let reused = |s: usize, i: usize| {
            sharing
                .as_ref()
                .is_some_and(|g| s != g.seqs[0] && g.seqs.contains(&s) && i < g.blocks)
        };
        let num_blocks = case.layout.num_blocks;
        // Order in which (seq, logical block) pairs receive physical ids 1, 2, ...
        let mut order: Vec<(usize, usize)> = Vec::new();
        match self.table {
            TableOrder::Interleaved => {
                let most = blocks.iter().copied().max().unwrap_or(0);
                for i in 0..most {
                    for (s, &nb) in blocks.iter().enumerate() {
                        if i < nb {
                            order.push((s, i));
                        }
                    }
                }
            }
            _ => {
                for (s, &nb) in blocks.iter().enumerate() {
                    order.extend((0..nb).map(|i| (s, i)));
                }
            }
        }
        let physical: Vec<u32> = match self.table {
            TableOrder::Sequential | TableOrder::Interleaved => (1..num_blocks as u32).collect(),
            TableOrder::Reversed => (1..num_blocks as u32).rev().collect(),
            TableOrder::Permuted(seed) => InputRng::new(seed)
                .permutation(num_blocks - 1)
                .into_iter()
                .map(|b| b as u32 + 1)
                .collect(),
        };
        order.retain(|&(s, i)| !reused(s, i));
        for (n, &(s, i)) in order.iter().enumerate() {
            case.layout.block_table[s][i] = physical[n];
        }
        if let Some(g) = &sharing {
            for &m in &g.seqs[1..] {
                for i in 0..g.blocks {
                    case.layout.block_table[m][i] = case.layout.block_table[g.seqs[0]][i];
                }
            }
        }
        if case.config.kind == AttentionKind::EncoderDecoder {
            // A cross-attention step writes nothing: its slots stay -1.
            return;
        }
        let starts = case.query_start_loc();
        for (s, &start) in starts.iter().take(case.num_seqs()).enumerate() {
            let ctx = case.context_len(s);
            for j in 0..case.batch.query_lens[s] {
                case.layout.slot_mapping[start + j] = case.slot_of(s, ctx + j);
            }
        }
    }
}

/// Grow the cache to `total` blocks and move every block the case uses (all but the null
/// block) to its top, so block ids and element offsets are as large as the cache allows.
fn move_to_the_top(case: &mut Case, total: usize) {
    let n = case.layout.num_blocks;
    if total <= n {
        return;
    }
    let shift = (total - n) as u32;
    let bs = case.config.block_size as i64;
    for b in case.layout.block_table.iter_mut().flatten() {
        if *b != 0 {
            *b += shift;
        }
    }
    for s in case.layout.slot_mapping.iter_mut().filter(|s| **s >= bs) {
        *s += shift as i64 * bs;
    }
    case.layout.num_blocks = total;
}

/// Replace every tensor value with a small integer in [-2, 2] (exact in every dtype),
/// keeping shared prefix tokens identical.
fn simplify_values(case: &mut Case, seed: u64, sharing: Option<&SharedPrefix>) {
    let mut rng = InputRng::new(seed ^ 0x5151);
    let mut fill = |v: &mut Vec<f32>| v.iter_mut().for_each(|x| *x = rng.below(5) as f32 - 2.0);
    let t = &mut case.tensors;
    fill(&mut t.query);
    fill(&mut t.key);
    fill(&mut t.value);
    t.context_key.iter_mut().for_each(&mut fill);
    t.context_value.iter_mut().for_each(&mut fill);
    if let Some(g) = sharing {
        let per_block = g.blocks * case.config.block_size;
        let n = per_block * case.config.num_kv_heads * case.config.head_size;
        let n_v = per_block * case.config.value_row();
        let (k, v) = (
            t.context_key[g.seqs[0]][..n].to_vec(),
            t.context_value[g.seqs[0]][..n_v].to_vec(),
        );
        for &m in &g.seqs[1..] {
            t.context_key[m][..n].copy_from_slice(&k);
            t.context_value[m][..n_v].copy_from_slice(&v);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::pipeline::recipe::{CaseRecipe, Share, TableOrder};

    #[test]
    fn table_orders_place_blocks_as_named() {
        let mut r = CaseRecipe {
            seqs: vec![(3, 1), (3, 1)],
            ..CaseRecipe::plain()
        };
        assert_eq!(r.build().layout.block_table, vec![vec![1, 2], vec![3, 4]]);
        r.table = TableOrder::Reversed;
        assert_eq!(r.build().layout.block_table, vec![vec![4, 3], vec![2, 1]]);
        r.table = TableOrder::Interleaved;
        assert_eq!(r.build().layout.block_table, vec![vec![1, 3], vec![2, 4]]);
        r.table = TableOrder::Sequential;
        r.share = Some(Share {
            group: 2,
            blocks: 1,
        });
        assert_eq!(r.build().layout.block_table, vec![vec![1, 2], vec![1, 3]]);
    }
}
