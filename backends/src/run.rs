//! Driving a backend through one case, the way an engine would: a fresh cache, stale data in
//! every slot no live token owns, the context written, the step's new K/V written through
//! `slot_mapping`, then the forward call.

use crate::{Backend, BackendError, KvCache, KvWrite, StepInputs};
use attn_reference::{Case, InputRng, Poison};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq)]
pub struct CaseRun {
    /// `[num_tokens, num_heads, head_size_v]` as the backend returned it.
    pub output: Vec<f32>,
    /// Time of the forward call alone.
    pub forward_time: Duration,
}

/// Evicts the CPU caches before a timed call, as the other layers of a model do between two
/// attention calls for one layer: whatever the size of a step's K/V, it then comes from
/// memory. Benchmarks that call one step again and again otherwise time K/V that sits in
/// the last-level cache.
pub struct CacheEvictor {
    buf: Vec<u64>,
}

impl CacheEvictor {
    /// Larger than the last-level cache of any machine this runs on.
    const BYTES: usize = 256 << 20;

    pub fn new() -> CacheEvictor {
        CacheEvictor {
            buf: vec![1; Self::BYTES / 8],
        }
    }

    /// Dirty one word of every cache line of the buffer.
    pub fn evict(&mut self) {
        let mut sum = 0u64;
        for line in self.buf.chunks_mut(8) {
            line[0] = line[0].wrapping_add(1);
            sum = sum.wrapping_add(line[0]);
        }
        std::hint::black_box(sum);
    }
}

impl Default for CacheEvictor {
    fn default() -> Self {
        Self::new()
    }
}

/// Seed of the stale data written into unused slots before a case runs.
const POISON_SEED: u64 = 0xdead_beef;
/// Stale values are this many times larger than real inputs, so a leaked key dominates its
/// softmax and a leaked value shows in the output.
const POISON_STD: f64 = 4.0;

/// Caches up to this many blocks get stale data in every block; larger ones only around the
/// blocks in use, so memory and time grow with the blocks a case uses, not with the cache
/// (a 140,000-block cache would otherwise cost gigabytes of stale rows for a few tokens).
pub const STALE_EVERY_BLOCK_UP_TO: usize = 4096;

/// The blocks that get stale data: every block of a small cache; of a large one, the blocks
/// in use (by a table or a slot), their neighbours on both sides (where an off-by-one block
/// read lands), the null block and the last block.
fn stale_blocks(case: &Case) -> Vec<usize> {
    let n = case.layout.num_blocks;
    if n <= STALE_EVERY_BLOCK_UP_TO {
        return (0..n).collect();
    }
    let bs = case.config.block_size as i64;
    let mut blocks = std::collections::BTreeSet::from([0, n - 1]);
    let used = case
        .layout
        .block_table
        .iter()
        .flatten()
        .map(|&b| b as usize)
        .chain(
            case.layout
                .slot_mapping
                .iter()
                .filter(|&&s| s >= 0)
                .map(|&s| (s / bs) as usize),
        );
    for b in used {
        blocks.extend([b.saturating_sub(1), b, (b + 1).min(n - 1)]);
    }
    blocks.into_iter().collect()
}

/// Slots that no live token of the case owns (the null block, tails of partial blocks, spare
/// blocks): what a real engine's cache would hold from earlier requests. In a large cache,
/// only those of the blocks around the ones in use ([`STALE_EVERY_BLOCK_UP_TO`]).
pub fn stale_slots(case: &Case) -> Vec<i64> {
    let bs = case.config.block_size;
    let mut live = std::collections::HashSet::new();
    for s in 0..case.num_seqs() {
        for p in 0..case.batch.seq_lens[s] {
            live.insert(case.slot_of(s, p));
        }
    }
    stale_blocks(case)
        .into_iter()
        .flat_map(|b| (b * bs) as i64..((b + 1) * bs) as i64)
        .filter(|s| !live.contains(s))
        .collect()
}

/// A fresh cache for `case` (which must be valid), filled as an engine would have left it:
/// stale data in the slots no live token owns ([`stale_slots`]), the context, then the
/// step's new K/V written through `slot_mapping`.
pub fn prepare_cache(backend: &dyn Backend, case: &Case) -> Result<KvCache, BackendError> {
    let config = &case.config;
    crate::declines_case(backend, case)?;
    let mut cache = backend.new_cache(config, case.layout.num_blocks)?;
    stale_fill(backend, config, &mut cache, &stale_slots(case), case.poison)?;
    let mut write = |key: &[f32], value: &[f32], slot_mapping: &[i64]| {
        backend.write_kv(
            config,
            &mut cache,
            &KvWrite {
                key,
                value,
                slot_mapping,
            },
        )
    };
    let ctx_slots = case.context_slot_mapping();
    if !ctx_slots.is_empty() {
        let (k, v) = case.context_kv_flat();
        write(&k, &v, &ctx_slots)?;
    }
    let t = &case.tensors;
    match poisoned_step_kv(case) {
        Some((k, v)) => write(&k, &v, &case.layout.slot_mapping)?,
        None => write(&t.key, &t.value, &case.layout.slot_mapping)?,
    }
    Ok(cache)
}

/// The step's K and V rows as a backend is given them on a poisoned case with padding
/// tokens: the case's, with the poison in the padding tokens' rows (slot -1). An engine's
/// buffer holds whatever it held there; a kernel that writes slot -1, or reads the step's
/// rows past a sequence's last one (a ragged prefill tile), meets it. None: nothing to
/// poison.
fn poisoned_step_kv(case: &Case) -> Option<(Vec<f32>, Vec<f32>)> {
    let p = case.poison?;
    let (real, all) = (case.num_real_tokens(), case.num_tokens());
    if real >= all {
        return None;
    }
    let x = p.value(case.config.dtype);
    let poisoned = |rows: &[f32]| {
        let mut v = rows.to_vec();
        let from = real * (v.len() / all);
        v[from.min(rows.len())..].fill(x);
        v
    };
    Some((poisoned(&case.tensors.key), poisoned(&case.tensors.value)))
}

/// Write stale data into `slots`, as earlier requests (or `torch.empty`) would have left:
/// large seeded values, or `poison` in every element.
pub(crate) fn stale_fill(
    backend: &dyn Backend,
    config: &attn_reference::AttentionConfig,
    cache: &mut KvCache,
    slots: &[i64],
    poison: Option<Poison>,
) -> Result<(), BackendError> {
    if slots.is_empty() {
        return Ok(());
    }
    let row = config.num_kv_heads * config.head_size;
    let mut rng = InputRng::new(POISON_SEED);
    // Sized from the case: a machine that cannot hold it declines the case, never aborts.
    let n = slots.len().saturating_mul(row);
    let mut values = |n: usize| {
        let filled = match poison {
            Some(p) => try_filled(n, p.value(config.dtype)),
            None => rng.try_normal_vec(n, POISON_STD, config.dtype),
        };
        filled.ok_or_else(|| {
            attn_reference::Unsupported::new(
                attn_reference::Dimension::CacheSize,
                "cannot allocate stale data for every spare slot on this machine",
            )
            .value(format!("{} slots", slots.len()))
        })
    };
    let key = values(n)?;
    // An MLA entry has no V of its own (it is the prefix of the key row).
    let value = values(slots.len().saturating_mul(config.value_row()))?;
    backend.write_kv(
        config,
        cache,
        &KvWrite {
            key: &key,
            value: &value,
            slot_mapping: slots,
        },
    )
}

/// `n` copies of `x`, or None when the machine cannot hold them.
fn try_filled(n: usize, x: f32) -> Option<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, x);
    Some(v)
}

/// The query a backend is given: the case's, with `poison` in the rows of padding tokens
/// (which belong to no sequence and whose outputs are ignored).
fn poisoned_query(case: &Case) -> Option<Vec<f32>> {
    let p = case.poison?;
    let row = case.config.num_heads * case.config.head_size;
    let mut q = case.tensors.query.clone();
    let real = (case.num_real_tokens() * row).min(q.len());
    q[real..].fill(p.value(case.config.dtype));
    Some(q)
}

/// `Err` unless `output` has one row per token of `case`.
pub(crate) fn check_output_len(
    backend: &dyn Backend,
    case: &Case,
    output: &[f32],
) -> Result<(), BackendError> {
    let want = case.num_tokens() * case.config.output_row();
    if output.len() == want {
        return Ok(());
    }
    Err(BackendError::Failed {
        backend: backend.name().to_string(),
        message: format!(
            "returned {} output values, expected {want} ([num_tokens, num_heads, head_size_v])",
            output.len()
        ),
    })
}

/// The forward inputs of `case`; `query_start_loc` is `case.query_start_loc()`.
pub fn step_inputs<'a>(case: &'a Case, query_start_loc: &'a [usize]) -> StepInputs<'a> {
    StepInputs {
        query: &case.tensors.query,
        query_start_loc,
        seq_lens: &case.batch.seq_lens,
        block_table: &case.layout.block_table,
        num_tokens: case.num_tokens(),
        causal: case.batch.causal.as_deref(),
        prefix_lm: case.batch.prefix_lm.as_ref(),
        rswa: case.batch.rswa.as_ref(),
    }
}

/// Run `case` (which must be valid) through `backend`.
pub fn run_case(backend: &dyn Backend, case: &Case) -> Result<CaseRun, BackendError> {
    let config = &case.config;
    let cache = prepare_cache(backend, case)?;
    let qsl = case.query_start_loc();
    let poisoned = poisoned_query(case);
    let mut step = step_inputs(case, &qsl);
    if let Some(q) = &poisoned {
        step.query = q;
    }
    let start = Instant::now();
    let output = backend.forward(config, &cache, &step)?;
    let forward_time = start.elapsed();
    check_output_len(backend, case, &output)?;
    Ok(CaseRun {
        output,
        forward_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::{build_case, AttentionConfig, BuildOptions, DType};

    #[test]
    fn a_poisoned_case_hands_over_its_padding_tokens_kv_rows_poisoned() {
        let opts = BuildOptions {
            padding_tokens: 2,
            ..BuildOptions::default()
        };
        let config = AttentionConfig::new(2, 1, 4, 2, DType::F32);
        let mut case = build_case(&[5, 3], &[2, 1], config, 7, &opts);
        assert_eq!(
            poisoned_step_kv(&case),
            None,
            "no poison, nothing to change"
        );
        case.poison = Some(Poison::Nan);
        let (k, v) = poisoned_step_kv(&case).expect("padding rows to poison");
        let real = 3 * 4;
        assert_eq!(k[..real], case.tensors.key[..real]);
        assert_eq!(v[..real], case.tensors.value[..real]);
        assert_eq!(k.len(), 5 * 4);
        assert!(k[real..].iter().chain(&v[real..]).all(|x| x.is_nan()));
    }
}
