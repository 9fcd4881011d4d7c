//! Traces: the block manager's traces are valid and exercise what serving does to a cache;
//! every broken trace is a typed error naming the step and field.

use attn_reference::trace::{generate, FreeReason, Phase, Trace, TraceError, TraceRecipe};
use attn_reference::{AttentionConfig, CaseError, DType, InputRng};

fn recipe(seed: u64) -> TraceRecipe {
    let mut rng = InputRng::new(seed);
    let mut pick = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let block_size = [1, 2, 3, 4, 8][pick(0, 4)];
    let n = pick(1, 6);
    TraceRecipe {
        config: AttentionConfig::new(2, 1, 4, block_size, DType::F32),
        prompts: (0..n).map(|_| pick(1, 20)).collect(),
        outputs: (0..n).map(|_| pick(0, 10)).collect(),
        sharing: pick(0, n),
        shared_prefix: pick(0, 16),
        chunk: pick(1, 12),
        token_budget: pick(2, 24),
        max_running: pick(1, 4),
        cache_blocks: pick(1, 12),
        max_steps: 40,
        seed,
        poison: None,
    }
}

#[test]
fn generated_traces_are_valid_and_reach_every_serving_event() {
    let (mut reused, mut hits, mut preempted, mut chunked, mut decode_new_block) = (0, 0, 0, 0, 0);
    for seed in 0..300 {
        let t = generate(&recipe(seed));
        t.validate()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", t.shape_summary()));
        let mut freed = std::collections::HashSet::new();
        for st in &t.steps {
            for s in &st.seqs {
                reused += s
                    .block_table
                    .iter()
                    .skip(s.context_len / t.config.block_size)
                    .filter(|b| freed.contains(*b))
                    .count();
                chunked += (s.phase == Phase::ChunkedPrefill) as usize;
                decode_new_block += (s.phase == Phase::Decode
                    && s.context_len.is_multiple_of(t.config.block_size))
                    as usize;
            }
            hits += st.prefix_hits.len();
            for f in &st.freed {
                preempted += (f.reason == FreeReason::Preempted) as usize;
                freed.extend(f.blocks.iter().copied());
            }
        }
    }
    for (what, n) in [
        ("freed blocks reused", reused),
        ("prefix hits", hits),
        ("preemptions", preempted),
        ("chunked prefills", chunked),
        ("decodes starting a block", decode_new_block),
    ] {
        println!("{what}: {n}");
        assert!(n >= 10, "{what}: only {n} in 300 traces");
    }
}

#[test]
fn a_trace_survives_json() {
    let t = generate(&recipe(7));
    let back = Trace::from_json(&serde_json::to_string(&t).unwrap()).unwrap();
    assert_eq!(back, t);
    assert!(Trace::looks_like_trace(&serde_json::to_string(&t).unwrap()));
    assert!(!Trace::looks_like_trace("{\"config\": {}}"));
}

/// A trace with a freed block that a later sequence reuses (found by search, so the test
/// does not depend on one seed's shape).
fn trace_with_reuse() -> (Trace, usize, usize) {
    for seed in 0..300 {
        let t = generate(&recipe(seed));
        let mut freed = std::collections::HashSet::new();
        for (si, st) in t.steps.iter().enumerate() {
            for (row, s) in st.seqs.iter().enumerate() {
                if s.context_len > 0 && s.block_table.iter().any(|b| freed.contains(b)) {
                    return (t, si, row);
                }
            }
            for f in &st.freed {
                freed.extend(f.blocks.iter().copied());
            }
        }
    }
    panic!("no trace reuses a freed block");
}

#[test]
fn a_table_pointing_at_a_block_someone_else_rewrote_is_stale_context() {
    let (mut t, si, row) = trace_with_reuse();
    // Point this sequence's first block at a block last written by another sequence.
    let seq = t.steps[si].seqs[row].seq;
    let other = t.steps[..si]
        .iter()
        .flat_map(|st| &st.seqs)
        .find(|s| s.seq != seq && s.context_len == 0)
        .map(|s| s.block_table[0]);
    let Some(other) = other else { return };
    if t.steps[si].seqs[row].block_table[0] == other {
        return;
    }
    t.steps[si].seqs[row].block_table[0] = other;
    match t.validate() {
        Err(TraceError::StaleContext { step, .. })
        | Err(TraceError::Case {
            step: Some(step), ..
        }) => {
            assert!(step <= si)
        }
        other => panic!("expected stale context, got {other:?}"),
    }
}

#[test]
fn every_broken_trace_is_a_typed_error_naming_the_field() {
    let base = generate(&recipe(3));
    let check = |f: &dyn Fn(&mut Trace), want: &str| {
        let mut t = base.clone();
        f(&mut t);
        let e = t.validate().expect_err(want);
        assert!(e.to_string().contains(want), "{e} should name {want}");
    };
    check(&|t| t.num_blocks = 0, "num_blocks");
    check(&|t| t.sequences[0].key.push(0.0), "sequences[0].key");
    check(&|t| t.steps[0].seqs[0].seq = 99, "steps[0].seqs[0].seq");
    check(
        &|t| {
            let s = t.steps[0].seqs[0].clone();
            t.steps[0].seqs.push(s)
        },
        "twice",
    );
    check(&|t| t.steps[0].seqs[0].query_len += 1000, "runs past");
    check(&|t| t.steps[0].seqs[0].block_table.push(1), "block_table");
    check(&|t| t.config.num_kv_heads = 0, "config.num_kv_heads");
    check(
        &|t| t.steps[0].seqs[0].block_table[0] = t.num_blocks as u32,
        "steps[0] as a case",
    );
    check(
        &|t| {
            t.steps[0].freed.push(attn_reference::trace::Freed {
                seq: 0,
                reason: FreeReason::Finished,
                blocks: vec![0],
            })
        },
        "steps[0].freed",
    );
    assert!(matches!(
        Trace::from_json("{\"config\": 1}"),
        Err(TraceError::Parse { .. })
    ));
    let mut t = base.clone();
    t.steps[0].seqs[0].query_len = 0;
    assert!(matches!(
        t.validate(),
        Err(TraceError::Case {
            step: Some(0),
            error: CaseError::QueryLenZero { .. } | CaseError::LengthMismatch { .. }
        }) | Err(TraceError::TableLength { .. })
    ));
}

#[test]
fn each_step_is_a_valid_case_whose_context_comes_from_the_sequences() {
    let t = generate(&recipe(11));
    let kvrow = t.config.num_kv_heads * t.config.head_size;
    for (si, st) in t.steps.iter().enumerate() {
        let case = t.step_case(si);
        case.validate().unwrap();
        for (row, s) in st.seqs.iter().enumerate() {
            assert_eq!(
                case.tensors.context_key[row],
                t.sequences[s.seq].key[..s.context_len * kvrow]
            );
        }
    }
}

/// A trace's one cache is bounded like a case's: a cache of 2^26 blocks of 256 slots and 576
/// elements is refused naming `num_blocks`, before any step is looked at.
#[test]
fn a_trace_cache_no_machine_holds_is_rejected() {
    let mut t = generate(&recipe(3));
    t.validate().unwrap();
    t.num_blocks = attn_reference::MAX_BLOCKS;
    t.config.block_size = 256;
    t.config.head_size = 576;
    let e = t.validate().expect_err("too large");
    assert!(
        matches!(
            e,
            TraceError::Case {
                step: None,
                error: CaseError::TooManyBytes { ref field, .. }
            } if field == "num_blocks"
        ),
        "{e:?}"
    );
    let text = serde_json::to_string(&t).unwrap();
    assert_eq!(Trace::from_json(&text), Err(e));
}
