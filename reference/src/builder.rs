//! The upstream-style case builder: vLLM's `create_and_prepopulate_kv_cache` in spirit.
//!
//! Sequence contexts are laid out from block 1 in sequence order (block 0 is the null block
//! and never holds data); the physical blocks are then randomly permuted with block 0 fixed;
//! block-table rows are padded with the null block to the longest row; slot_mapping places the
//! new tokens through the table. Every tensor comes from one seeded [`InputRng`] in a fixed
//! order: per sequence context K then context V, then query, new K and new V of all tokens.
//!
//! Prefix sharing (as prefix caching produces): a group of sequences can share their first
//! `blocks` full context blocks. Members then hold the first member's K/V for those tokens and
//! their block-table rows name the same physical blocks.

use crate::{
    AttentionConfig, AttentionKind, Batch, BatchSpec, Case, InputRng, PagedLayout, Tensors,
};

/// Sequences that share the physical blocks of their first `blocks` logical blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedPrefix {
    /// Indices of the sharing sequences; the first one's data is the shared data.
    pub seqs: Vec<usize>,
    /// Full context blocks shared (each member needs `blocks * block_size <= context_len`).
    pub blocks: usize,
}

#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Permute physical blocks (block 0 stays), as upstream does.
    pub permute_blocks: bool,
    /// Unused blocks added to the cache beyond what the batch needs.
    pub spare_blocks: usize,
    /// Padding tokens appended after the real ones (slot -1).
    pub padding_tokens: usize,
    /// Standard deviation of the generated values.
    pub std: f64,
    /// Prefix-sharing groups (disjoint).
    pub shared_prefixes: Vec<SharedPrefix>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            permute_blocks: true,
            spare_blocks: 0,
            padding_tokens: 0,
            std: 1.0,
            shared_prefixes: Vec::new(),
        }
    }
}

/// Build the case for a named spec with a config and a seed.
pub fn build_spec_case(spec: &BatchSpec, mut config: AttentionConfig, seed: u64) -> Case {
    config.kind = spec.kind;
    build_case(
        &spec.seq_lens,
        &spec.query_lens,
        config,
        seed,
        &BuildOptions::default(),
    )
}

/// Build a case from lengths. `seq_lens`, `query_lens` and the sharing groups must describe a
/// valid batch (the caller's responsibility; the result is checked with `validate` in debug
/// builds).
pub fn build_case(
    seq_lens: &[usize],
    query_lens: &[usize],
    config: AttentionConfig,
    seed: u64,
    opts: &BuildOptions,
) -> Case {
    let mut rng = InputRng::new(seed);
    let bs = config.block_size;
    let row_kv = config.num_kv_heads * config.head_size;
    // An MLA case draws no V (it is the prefix of each key row).
    let row_v = config.value_row();
    let row_q = config.num_heads * config.head_size;
    let dt = config.dtype;

    // Cross-attention: every key is context (the encoder's K/V), the step writes nothing.
    let cross = config.kind == AttentionKind::EncoderDecoder;
    let context = |l: usize, q: usize| if cross { l } else { l - q };
    let mut context_key = Vec::with_capacity(seq_lens.len());
    let mut context_value = Vec::with_capacity(seq_lens.len());
    for (&l, &q) in seq_lens.iter().zip(query_lens) {
        context_key.push(rng.normal_vec(context(l, q) * row_kv, opts.std, dt));
        context_value.push(rng.normal_vec(context(l, q) * row_v, opts.std, dt));
    }
    let real: usize = query_lens.iter().sum();
    let tokens = real + opts.padding_tokens;
    let query = rng.normal_vec(tokens * row_q, opts.std, dt);
    let key = rng.normal_vec(tokens * row_kv, opts.std, dt);
    let value = rng.normal_vec(tokens * row_v, opts.std, dt);

    // Shared tokens hold the first member's data; remember which logical blocks reuse whose.
    let blocks_per_seq: Vec<usize> = seq_lens.iter().map(|l| l.div_ceil(bs)).collect();
    let mut reuse: Vec<Vec<Option<usize>>> =
        blocks_per_seq.iter().map(|&n| vec![None; n]).collect();
    for group in &opts.shared_prefixes {
        let Some((&leader, members)) = group.seqs.split_first() else {
            continue;
        };
        let (n, n_v) = (group.blocks * bs * row_kv, group.blocks * bs * row_v);
        for &m in members {
            let (k, v) = (
                context_key[leader][..n].to_vec(),
                context_value[leader][..n_v].to_vec(),
            );
            context_key[m][..n].copy_from_slice(&k);
            context_value[m][..n_v].copy_from_slice(&v);
            for slot in reuse[m].iter_mut().take(group.blocks) {
                *slot = Some(leader);
            }
        }
    }

    // Logical layout: consecutive blocks from 1, shared blocks taken from their leader.
    let used = blocks_per_seq.iter().sum::<usize>()
        - reuse.iter().flatten().filter(|r| r.is_some()).count();
    let num_blocks = 1 + used + opts.spare_blocks;
    let perm: Vec<u32> = if opts.permute_blocks {
        // perm[b] for b >= 1 is a random block in 1..num_blocks; block 0 maps to itself.
        std::iter::once(0)
            .chain(
                rng.permutation(num_blocks - 1)
                    .into_iter()
                    .map(|b| b as u32 + 1),
            )
            .collect()
    } else {
        (0..num_blocks as u32).collect()
    };
    let width = blocks_per_seq.iter().copied().max().unwrap_or(0);
    let mut next = 1usize;
    let mut block_table: Vec<Vec<u32>> = Vec::with_capacity(seq_lens.len());
    for (s, &nb) in blocks_per_seq.iter().enumerate() {
        let mut row = Vec::with_capacity(width);
        for i in 0..nb {
            match reuse[s][i] {
                Some(leader) => row.push(block_table[leader][i]),
                None => {
                    row.push(perm[next]);
                    next += 1;
                }
            }
        }
        row.resize(width, 0);
        block_table.push(row);
    }

    let mut slot_mapping = Vec::with_capacity(tokens);
    for (s, (&l, &q)) in seq_lens.iter().zip(query_lens).enumerate() {
        if cross {
            slot_mapping.extend(std::iter::repeat_n(-1, q));
            continue;
        }
        for pos in l - q..l {
            slot_mapping.push(block_table[s][pos / bs] as i64 * bs as i64 + (pos % bs) as i64);
        }
    }
    slot_mapping.resize(tokens, -1);

    let case = Case {
        config,
        batch: Batch {
            num_padding_tokens: opts.padding_tokens,
            ..Batch::plain(seq_lens.to_vec(), query_lens.to_vec())
        },
        layout: PagedLayout {
            num_blocks,
            block_table,
            slot_mapping,
        },
        tensors: Tensors {
            query,
            key,
            value,
            context_key,
            context_value,
        },
        poison: None,
        recorded: None,
    };
    debug_assert_eq!(case.validate(), Ok(()));
    case
}
