//! Traces: the block manager's traces are valid and exercise what serving does to a cache;
//! every broken trace is a typed error naming the step and field.

use attn_reference::trace::{
    generate, FreeReason, MaskRecipe, Phase, SequenceMasks, Trace, TraceError, TraceRecipe,
};
use attn_reference::{reference_output, AttentionConfig, CaseError, DType, InputRng, Rswa};

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
        masks: None,
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

/// One sequence of a 10-token prompt with an image span at positions 3..=6, prefilled in
/// chunks of 4, then decoded: the span is split across the first two steps.
fn trace_with_a_split_range(non_causal: bool) -> Trace {
    let r = TraceRecipe {
        config: AttentionConfig::new(2, 1, 4, 2, DType::F32),
        prompts: vec![10],
        outputs: vec![2],
        sharing: 0,
        shared_prefix: 0,
        chunk: 4,
        token_budget: 8,
        max_running: 1,
        cache_blocks: 8,
        max_steps: 8,
        seed: 5,
        poison: None,
        masks: Some(MaskRecipe {
            non_causal: u64::from(non_causal),
            // Thousandths of the prompt: 300 and 600 of 10 tokens are positions 3 and 6.
            ranges: vec![(300, 600)],
            range_seqs: 1,
            ..MaskRecipe::default()
        }),
    };
    let t = generate(&r);
    t.validate().unwrap();
    t
}

#[test]
fn a_requests_masks_go_whole_into_every_step_and_its_keys_stop_at_seq_len() {
    let t = trace_with_a_split_range(false);
    let ranges = |step: usize| {
        t.step_case(step)
            .batch
            .prefix_lm
            .map(|p| p.ranges[0].clone())
    };
    // Step 0 computes positions 0..4: the span [3, 6] goes whole, as vLLM passes an image's
    // range while chunked prefill is inside it; the later steps and the decodes keep it.
    assert_eq!(t.steps[0].seqs[0].seq_len(), 4);
    for i in 0..t.steps.len() {
        assert_eq!(ranges(i), Some(vec![(3, 6)]), "step {i}");
        assert_eq!(t.step_case(i).validate(), Ok(()), "step {i}");
        assert_eq!(t.step_case(i).batch.causal, None);
    }
    // Its keys stop at the last computed one: step 0 as if the range were [3, 3].
    let step0 = t.step_case(0);
    let mut cut = step0.clone();
    cut.batch.prefix_lm.as_mut().unwrap().ranges[0] = vec![(3, 3)];
    assert_eq!(reference_output(&step0), reference_output(&cut));
    // In step 1 (positions 4..8) positions 4 and 5 see the range's keys after them.
    let step1 = t.step_case(1);
    let mut none = step1.clone();
    none.batch.prefix_lm = None;
    assert_ne!(reference_output(&step1), reference_output(&none));
    // A non-causal request is non-causal in every step.
    let t = trace_with_a_split_range(true);
    for i in 0..t.steps.len() {
        assert_eq!(t.step_case(i).batch.causal, Some(vec![false]), "step {i}");
    }
    // The masks survive JSON.
    let back = Trace::from_json(&serde_json::to_string(&t).unwrap()).unwrap();
    assert_eq!(back, t);
}

#[test]
fn r_swa_prefixes_go_whole_into_every_step_and_are_left_out_beside_a_window() {
    let mut r = recipe(3);
    r.prompts = vec![9, 4];
    r.outputs = vec![1, 1];
    r.masks = Some(MaskRecipe {
        rswa: Some((2, 500)),
        ..MaskRecipe::default()
    });
    let t = generate(&r);
    t.validate().unwrap();
    let masks = t.masks.as_ref().expect("masks");
    assert_eq!(masks.rswa.as_ref().unwrap().prefix_lens, vec![4, 2]);
    for i in 0..t.steps.len() {
        let case = t.step_case(i);
        let rswa = case.batch.rswa.as_ref().expect("every step carries R-SWA");
        let whole: Vec<usize> = t.steps[i].seqs.iter().map(|s| [4, 2][s.seq]).collect();
        assert_eq!(rswa.prefix_lens, whole, "step {i}");
        assert_eq!(case.validate(), Ok(()), "step {i}");
    }
    r.config.sliding_window = Some(3);
    assert_eq!(generate(&r).masks, None);
}

#[test]
fn broken_masks_are_typed_errors_naming_the_field() {
    let base = trace_with_a_split_range(false);
    let broken = |f: &dyn Fn(&mut SequenceMasks)| {
        let mut t = base.clone();
        f(t.masks.as_mut().unwrap());
        t.validate().unwrap_err().to_string()
    };
    let e = broken(&|m| m.prefix_lm.as_mut().unwrap().ranges[0] = vec![(3, 6), (5, 8)]);
    assert!(e.contains("masks.prefix_lm.ranges[0][1]"), "{e}");
    let e = broken(&|m| m.prefix_lm.as_mut().unwrap().ranges[0] = vec![(6, 3)]);
    assert!(e.contains("masks.prefix_lm.ranges[0][0]"), "{e}");
    let e = broken(&|m| m.prefix_lm.as_mut().unwrap().ranges[0] = vec![(3, 1 << 40)]);
    assert!(
        e.contains("masks.prefix_lm.ranges[0][0]") && e.contains("int32"),
        "{e}"
    );
    let e = broken(&|m| m.causal = Some(vec![true, false]));
    assert!(e.contains("masks.causal"), "{e}");
    let e = broken(&|m| {
        m.prefix_lm = None;
        m.rswa = Some(Rswa {
            window: 2,
            prefix_lens: vec![1 << 40],
        });
    });
    assert!(e.contains("masks.rswa.prefix_lens[0]"), "{e}");
    let e = broken(&|m| {
        m.prefix_lm = None;
        m.rswa = Some(Rswa {
            window: 0,
            prefix_lens: vec![1],
        });
    });
    assert!(e.contains("masks.rswa.window"), "{e}");
    let e = broken(&|m| {
        m.rswa = Some(Rswa {
            window: 2,
            prefix_lens: vec![1],
        })
    });
    assert!(e.contains("masks.rswa") && e.contains("prefix_lm"), "{e}");
    // Unknown fields of a trace's masks are refused.
    let mut json: serde_json::Value = serde_json::to_value(&base).unwrap();
    json["masks"]["windows"] = serde_json::json!(3);
    let e = Trace::from_json(&json.to_string()).unwrap_err().to_string();
    assert!(e.contains("windows"), "{e}");
}

#[test]
fn removing_a_sequence_keeps_the_others_masks() {
    let mut m = MaskRecipe {
        non_causal: 0b1011,
        range_seqs: 0b0110,
        ..MaskRecipe::default()
    };
    m.remove_seq(1);
    assert_eq!((m.non_causal, m.range_seqs), (0b101, 0b010));
    m.remove_seq(63);
    assert_eq!((m.non_causal, m.range_seqs), (0b101, 0b010));
}

/// Recipes with a window or local chunks (look-back too), long enough to leave blocks behind.
fn windowed_recipe(seed: u64) -> TraceRecipe {
    let mut r = recipe(seed);
    let mut rng = InputRng::new(seed ^ 0xC0FFEE);
    let mut pick = |lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    r.prompts.iter_mut().for_each(|p| *p += pick(0, 24));
    r.outputs.iter_mut().for_each(|o| *o += pick(0, 16));
    r.cache_blocks = pick(4, 16);
    match seed % 3 {
        0 => r.config.sliding_window = Some(pick(1, 12)),
        1 => r.config.attention_chunk_size = Some(pick(1, 12)),
        _ => {
            r.config.attention_chunk_size = Some(pick(1, 8));
            r.config.chunk_lookback = Some(pick(1, 2));
        }
    }
    r
}

#[test]
fn windows_and_chunks_leave_blocks_behind_as_vllm_frees_them() {
    let (mut skipped, mut reused_while_running, mut null_entries) = (0, 0, 0);
    for seed in 0..300 {
        let t = generate(&windowed_recipe(seed));
        t.validate()
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", t.shape_summary()));
        // Blocks a sequence left behind, by sequence, while it still runs.
        let mut left: Vec<(usize, u32)> = Vec::new();
        for st in &t.steps {
            for f in &st.freed {
                match f.reason {
                    FreeReason::Skipped => {
                        skipped += f.blocks.len();
                        left.extend(f.blocks.iter().map(|&b| (f.seq, b)));
                    }
                    _ => left.retain(|&(s, _)| s != f.seq),
                }
            }
            for s in &st.seqs {
                null_entries += s.block_table.iter().filter(|&&b| b == 0).count();
                // Another sequence writes a block this one left behind, while it runs on.
                let bs = t.config.block_size;
                let written = &s.block_table[s.context_len / bs..];
                reused_while_running += left
                    .iter()
                    .filter(|&&(o, b)| o != s.seq && written.contains(&b))
                    .filter(|&&(o, _)| st.seqs.iter().any(|x| x.seq == o))
                    .count();
            }
        }
    }
    for (what, n) in [
        ("skipped blocks", skipped),
        ("null entries in tables", null_entries),
        (
            "skipped blocks rewritten while their sequence runs",
            reused_while_running,
        ),
    ] {
        println!("{what}: {n}");
        assert!(n >= 10, "{what}: only {n} in 300 traces");
    }
}

#[test]
fn without_a_window_or_chunks_no_block_is_skipped() {
    for seed in 0..100 {
        let t = generate(&recipe(seed));
        for st in &t.steps {
            assert!(st.freed.iter().all(|f| f.reason != FreeReason::Skipped));
            assert!(st.seqs.iter().all(|s| !s.block_table.contains(&0)));
        }
    }
}

#[test]
fn a_null_block_where_a_query_still_reads_is_a_typed_error() {
    // A trace whose steps skip blocks: move each null entry one block later (a block its
    // queries read), and the step is rejected, naming the sequence and the block.
    let t = (0..100)
        .map(|seed| generate(&windowed_recipe(seed * 3)))
        .find(|t| {
            t.steps
                .iter()
                .any(|st| st.seqs.iter().any(|s| s.block_table.contains(&0)))
        })
        .expect("a windowed trace that skips a block");
    let (si, row) = t
        .steps
        .iter()
        .enumerate()
        .find_map(|(si, st)| {
            st.seqs
                .iter()
                .position(|s| s.block_table.contains(&0))
                .map(|row| (si, row))
        })
        .unwrap();
    let mut broken = t.clone();
    let table = &mut broken.steps[si].seqs[row].block_table;
    let last_null = table.iter().rposition(|&b| b == 0).unwrap();
    table[last_null + 1] = 0;
    match broken.validate() {
        Err(TraceError::Case {
            step: Some(step),
            error: CaseError::NullBlockUsed { seq, index },
        }) => assert_eq!((step, seq, index), (si, row, last_null + 1)),
        other => panic!("expected NullBlockUsed, got {other:?}"),
    }
}
