//! One test per validation error: each malformed case gives its own typed error naming the
//! field, never a panic.

use attn_reference::{
    build_case, AttentionConfig, AttentionKind, BuildOptions, Case, CaseError, DType,
};

/// Two sequences: seq 0 has 3 context + 2 new tokens (blocks of 2: 3 blocks), seq 1 has
/// 3 new tokens (2 blocks); 4 query heads over 2 kv heads, head size 4.
fn base() -> Case {
    let c = AttentionConfig::new(4, 2, 4, 2, DType::Bf16);
    let case = build_case(
        &[5, 3],
        &[2, 3],
        c,
        1,
        &BuildOptions {
            padding_tokens: 1,
            ..BuildOptions::default()
        },
    );
    assert_eq!(case.validate(), Ok(()));
    case
}

fn err(f: impl FnOnce(&mut Case)) -> CaseError {
    let mut c = base();
    f(&mut c);
    c.validate().expect_err("case should be invalid")
}

#[test]
fn query_len_zero() {
    assert_eq!(
        err(|c| c.batch.query_lens[1] = 0),
        CaseError::QueryLenZero { seq: 1, seq_len: 3 }
    );
}

/// vLLM pads a batch's request count (for CUDA graphs) with requests of query_len 0 and
/// seq_len 0 after the real ones: exactly those are valid.
#[test]
fn padded_requests_are_valid_only_as_vllm_makes_them() {
    use attn_reference::{build_case, AttentionConfig, BuildOptions, DType};
    let config = AttentionConfig::new(4, 2, 8, 4, DType::F32);
    let padded = build_case(
        &[5, 3, 0, 0],
        &[2, 1, 0, 0],
        config,
        1,
        &BuildOptions::default(),
    );
    assert_eq!(padded.validate(), Ok(()));
    assert_eq!(padded.query_start_loc(), vec![0, 2, 3, 3, 3]);
    let mut before = padded.clone();
    before.batch.seq_lens = vec![5, 0, 3, 0];
    before.batch.query_lens = vec![2, 0, 1, 0];
    assert_eq!(
        before.validate(),
        Err(CaseError::PaddedRequestBeforeReal { seq: 1, real: 2 })
    );
    let mut only = padded;
    only.batch.seq_lens = vec![0; 4];
    only.batch.query_lens = vec![0; 4];
    assert_eq!(only.validate(), Err(CaseError::OnlyPaddedRequests));
}

#[test]
fn query_len_past_seq_len() {
    assert_eq!(
        err(|c| c.batch.query_lens[1] = 4),
        CaseError::QueryLenExceedsSeqLen {
            seq: 1,
            query_len: 4,
            seq_len: 3
        }
    );
}

#[test]
fn heads_not_a_multiple() {
    assert_eq!(
        err(|c| c.config.num_kv_heads = 3),
        CaseError::HeadsNotMultiple {
            num_heads: 4,
            num_kv_heads: 3
        }
    );
}

#[test]
fn zero_sizes_name_their_field() {
    assert_eq!(
        err(|c| c.config.head_size = 0),
        CaseError::Zero {
            field: "config.head_size"
        }
    );
    assert_eq!(
        err(|c| c.config.block_size = 0),
        CaseError::Zero {
            field: "config.block_size"
        }
    );
    assert_eq!(
        err(|c| c.config.num_heads = 0),
        CaseError::Zero {
            field: "config.num_heads"
        }
    );
    assert_eq!(
        err(|c| c.config.num_kv_heads = 0),
        CaseError::Zero {
            field: "config.num_kv_heads"
        }
    );
}

#[test]
fn window_zero() {
    assert_eq!(
        err(|c| c.config.sliding_window = Some(0)),
        CaseError::WindowZero
    );
}

#[test]
fn local_chunks_need_a_size_and_a_decoder() {
    assert_eq!(
        err(|c| c.config.attention_chunk_size = Some(0)),
        CaseError::Zero {
            field: "config.attention_chunk_size"
        }
    );
    for kind in [AttentionKind::EncoderOnly, AttentionKind::EncoderDecoder] {
        let e = err(|c| {
            c.config.attention_chunk_size = Some(4);
            c.config.kind = kind;
        });
        assert!(
            matches!(&e, CaseError::InvalidParam { field, .. } if field == "config.attention_chunk_size"),
            "{e}"
        );
    }
}

#[test]
fn a_chunk_look_back_needs_chunks_and_at_least_one_chunk() {
    for edit in [
        (|c: &mut Case| c.config.chunk_lookback = Some(1)) as fn(&mut Case),
        |c: &mut Case| {
            c.config.attention_chunk_size = Some(4);
            c.config.chunk_lookback = Some(0);
        },
    ] {
        let e = err(edit);
        assert!(
            matches!(&e, CaseError::InvalidParam { field, .. } if field == "config.chunk_lookback"),
            "{e}"
        );
    }
}

#[test]
fn causal_flags_are_one_per_request_and_only_for_decoders() {
    let e = err(|c| c.batch.causal = Some(vec![false]));
    assert!(
        matches!(&e, CaseError::LengthMismatch { field, .. } if field == "batch.causal"),
        "{e}"
    );
    let e = err(|c| {
        let n = c.batch.seq_lens.len();
        c.batch.causal = Some(vec![false; n]);
        c.config.kind = AttentionKind::EncoderOnly;
        c.batch.seq_lens = c.batch.query_lens.clone();
    });
    assert!(
        matches!(&e, CaseError::InvalidParam { field, .. } if field == "batch.causal[0]"),
        "{e}"
    );
}

fn prefix_lm(ranges: Vec<Vec<(usize, usize)>>) -> Option<attn_reference::PrefixLm> {
    Some(attn_reference::PrefixLm {
        ranges,
        clamp_to_window: false,
    })
}

fn invalid_field(e: &CaseError) -> &str {
    match e {
        CaseError::InvalidParam { field, .. } | CaseError::LengthMismatch { field, .. } => field,
        CaseError::Zero { field } => field,
        _ => "",
    }
}

#[test]
fn prefix_lm_ranges_are_sorted_and_disjoint_and_may_reach_past_their_sequence() {
    // seq_lens [5, 3]; ends inclusive.
    let mut ok = base();
    ok.batch.prefix_lm = prefix_lm(vec![vec![(0, 1), (3, 4)], vec![(2, 2)]]);
    assert_eq!(ok.validate(), Ok(()));
    // Past the step's keys, as vLLM passes an image chunked prefill has not finished.
    ok.batch.prefix_lm = prefix_lm(vec![vec![(3, 9), (12, 20)], vec![(1, 3)]]);
    assert_eq!(ok.validate(), Ok(()));
    for (ranges, field) in [
        (vec![vec![(0, 1)]], "batch.prefix_lm.ranges"),
        (vec![vec![(2, 1)], vec![]], "batch.prefix_lm.ranges[0][0]"),
        (
            vec![vec![], vec![(1, 1 << 40)]],
            "batch.prefix_lm.ranges[1][0]",
        ),
        (
            vec![vec![(0, 2), (2, 3)], vec![]],
            "batch.prefix_lm.ranges[0][1]",
        ),
        (
            vec![vec![(3, 4), (0, 1)], vec![]],
            "batch.prefix_lm.ranges[0][1]",
        ),
    ] {
        let e = err(|c| c.batch.prefix_lm = prefix_lm(ranges.clone()));
        assert_eq!(invalid_field(&e), field, "{ranges:?}: {e}");
    }
    let e = err(|c| {
        c.batch.prefix_lm = prefix_lm(vec![vec![(0, 1)], vec![]]);
        c.config.kind = AttentionKind::EncoderOnly;
        c.batch.seq_lens = c.batch.query_lens.clone();
    });
    assert_eq!(invalid_field(&e), "batch.prefix_lm", "{e}");
}

#[test]
fn an_r_swa_prefix_may_pass_its_sequence_and_replaces_the_window() {
    let rswa = |window, prefix_lens| {
        Some(attn_reference::Rswa {
            window,
            prefix_lens,
        })
    };
    let mut ok = base();
    ok.batch.rswa = rswa(2, vec![5, 0]);
    assert_eq!(ok.validate(), Ok(()));
    let e = err(|c| c.batch.rswa = rswa(0, vec![1, 1]));
    assert_eq!(invalid_field(&e), "batch.rswa.window", "{e}");
    let e = err(|c| c.batch.rswa = rswa(2, vec![1]));
    assert_eq!(invalid_field(&e), "batch.rswa.prefix_lens", "{e}");
    // The prompt's length while chunked prefill is still inside it, as vLLM passes it.
    ok.batch.rswa = rswa(2, vec![9, 4]);
    assert_eq!(ok.validate(), Ok(()));
    let e = err(|c| c.batch.rswa = rswa(2, vec![1, 1 << 40]));
    assert_eq!(invalid_field(&e), "batch.rswa.prefix_lens[1]", "{e}");
    let e = err(|c| {
        c.batch.rswa = rswa(2, vec![1, 1]);
        c.config.sliding_window = Some(4);
    });
    assert_eq!(invalid_field(&e), "batch.rswa", "{e}");
    let e = err(|c| {
        c.batch.rswa = rswa(2, vec![1, 1]);
        c.batch.prefix_lm = prefix_lm(vec![vec![(0, 1)], vec![]]);
    });
    assert_eq!(invalid_field(&e), "batch.rswa", "{e}");
}

#[test]
fn block_id_past_the_cache() {
    let e = err(|c| c.layout.block_table[1][1] = 99);
    assert_eq!(
        e,
        CaseError::BlockOutOfRange {
            seq: 1,
            index: 1,
            block: 99,
            num_blocks: 6
        }
    );
    assert!(e.to_string().contains("layout.block_table[1][1]"));
}

#[test]
fn table_row_too_short() {
    let e = err(|c| {
        for row in &mut c.layout.block_table {
            row.truncate(1);
        }
    });
    assert_eq!(
        e,
        CaseError::TableRowTooShort {
            seq: 0,
            needed: 3,
            actual: 1,
            seq_len: 5
        }
    );
}

#[test]
fn ragged_table() {
    assert_eq!(
        err(|c| c.layout.block_table[1].push(0)),
        CaseError::RaggedBlockTable {
            seq: 1,
            expected: 3,
            actual: 4
        }
    );
}

#[test]
fn null_block_holding_tokens() {
    assert_eq!(
        err(|c| c.layout.block_table[0][0] = 0),
        CaseError::NullBlockUsed { seq: 0, index: 0 }
    );
}

#[test]
fn slot_disagrees_with_table() {
    let e = err(|c| c.layout.slot_mapping[0] += 1);
    assert!(
        matches!(
            e,
            CaseError::SlotMismatch {
                token: 0,
                seq: 0,
                pos: 3,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn padding_token_with_a_slot() {
    assert_eq!(
        err(|c| c.layout.slot_mapping[5] = 3),
        CaseError::PaddingSlot {
            token: 5,
            actual: 3
        }
    );
}

#[test]
fn two_live_tokens_on_one_slot() {
    // Point seq 1's first block at seq 0's last block (holding seq 0's new token 4): the new
    // tokens of both sequences land on one slot.
    let e = err(|c| {
        let shared = c.layout.block_table[0][2];
        c.layout.block_table[1][0] = shared;
        let bs = 2;
        for j in 0..3 {
            c.layout.slot_mapping[2 + j] =
                c.layout.block_table[1][j / bs] as i64 * bs as i64 + (j % bs) as i64;
        }
    });
    assert!(matches!(e, CaseError::SlotCollision { .. }), "{e:?}");
    assert!(
        e.to_string().contains("sequence 0 position 4")
            && e.to_string().contains("sequence 1 position 0"),
        "{e}"
    );
}

#[test]
fn non_finite_inputs() {
    assert_eq!(
        err(|c| c.tensors.query[7] = f32::NAN).to_string(),
        "tensors.query has a non-finite value NaN at index 7"
    );
    assert!(
        matches!(err(|c| c.tensors.context_value[0][2] = f32::INFINITY), CaseError::NonFinite { ref field, index: 2, .. } if field == "tensors.context_value[0]")
    );
}

#[test]
fn values_not_representable_in_the_dtype() {
    let e = err(|c| c.tensors.key[0] = 0.1);
    assert!(
        matches!(e, CaseError::NotRepresentable { ref field, index: 0, dtype: DType::Bf16, .. } if field == "tensors.key"),
        "{e:?}"
    );
}

#[test]
fn tensor_lengths_disagree_with_shapes() {
    assert_eq!(
        err(|c| {
            c.tensors.query.pop();
        }),
        CaseError::LengthMismatch {
            field: "tensors.query".into(),
            expected: 6 * 16,
            actual: 6 * 16 - 1
        }
    );
    assert_eq!(
        err(|c| {
            c.tensors.context_key[0].push(0.0);
        }),
        CaseError::LengthMismatch {
            field: "tensors.context_key[0]".into(),
            expected: 24,
            actual: 25
        }
    );
    assert_eq!(
        err(|c| {
            c.layout.slot_mapping.pop();
        }),
        CaseError::LengthMismatch {
            field: "layout.slot_mapping".into(),
            expected: 6,
            actual: 5
        }
    );
    assert_eq!(
        err(|c| {
            c.batch.query_lens.pop();
        }),
        CaseError::LengthMismatch {
            field: "batch.query_lens".into(),
            expected: 2,
            actual: 1
        }
    );
}

#[test]
fn empty_batch() {
    assert_eq!(
        err(|c| {
            c.batch.seq_lens.clear();
            c.batch.query_lens.clear();
        }),
        CaseError::EmptyBatch
    );
}

#[test]
fn encoder_needs_query_equal_to_sequence() {
    assert_eq!(
        err(|c| c.config.kind = AttentionKind::EncoderOnly),
        CaseError::EncoderNeedsFullQuery {
            seq: 0,
            query_len: 2,
            seq_len: 5
        }
    );
}

#[test]
fn bad_parameters() {
    assert!(
        matches!(err(|c| c.config.scale = Some(f32::NAN)), CaseError::InvalidParam { ref field, .. } if field == "config.scale")
    );
    assert!(
        matches!(err(|c| c.config.logits_soft_cap = Some(0.0)), CaseError::InvalidParam { ref field, .. } if field == "config.logits_soft_cap")
    );
    assert_eq!(
        err(|c| c.config.alibi_slopes = Some(vec![0.5; 3])),
        CaseError::LengthMismatch {
            field: "config.alibi_slopes".into(),
            expected: 4,
            actual: 3
        }
    );
    assert!(
        matches!(err(|c| c.config.sinks = Some(vec![0.0, 1.0, f32::INFINITY, 0.0])), CaseError::InvalidParam { ref field, .. } if field == "config.sinks[2]")
    );
    use attn_reference::{Fp8Format, Fp8KvCache};
    assert!(
        matches!(err(|c| c.config.kv_cache = Some(Fp8KvCache::new(Fp8Format::E4m3, 0.0, 1.0))), CaseError::InvalidParam { ref field, .. } if field == "config.kv_cache.k_scale")
    );
    assert!(
        matches!(err(|c| c.config.kv_cache = Some(Fp8KvCache::new(Fp8Format::E5m2, 1.0, f32::INFINITY))), CaseError::InvalidParam { ref field, .. } if field == "config.kv_cache.v_scale")
    );
    for bad in [0.0, -0.5, f32::NAN] {
        let cache = Fp8KvCache {
            q_scale: Some(bad),
            ..Fp8KvCache::new(Fp8Format::E4m3, 1.0, 1.0)
        };
        assert!(
            matches!(err(|c| c.config.kv_cache = Some(cache)), CaseError::InvalidParam { ref field, .. } if field == "config.kv_cache.q_scale"),
            "{bad}"
        );
    }
}

#[test]
fn lengths_that_overflow_when_multiplied() {
    let e = err(|c| {
        c.config.head_size = attn_reference::MAX_DIM;
        c.config.num_heads = attn_reference::MAX_HEADS;
        c.config.num_kv_heads = attn_reference::MAX_HEADS;
        c.batch.seq_lens[0] = usize::MAX / 2;
        c.batch.query_lens[0] = usize::MAX / 4;
    });
    // Whatever the first complaint is, it is an error about sizes, not a panic or an allocation.
    assert!(
        matches!(
            e,
            CaseError::TooLarge { .. }
                | CaseError::LengthMismatch { .. }
                | CaseError::TooManyBytes { .. }
        ),
        "{e:?}"
    );
}

#[test]
fn huge_cache_is_refused_before_anything_is_allocated() {
    let e = err(|c| c.layout.num_blocks = usize::MAX);
    assert!(
        matches!(e, CaseError::TooLarge { ref field, .. } if field == "layout.num_blocks"),
        "{e:?}"
    );
}

#[test]
fn malformed_json_names_line_and_column() {
    let e = Case::from_json("{\"config\": {\"num_heads\": -1").unwrap_err();
    assert!(matches!(e, CaseError::Parse { line: 1, .. }), "{e:?}");
    let e = Case::from_json("{\"config\": 3}").unwrap_err();
    assert!(e.to_string().contains("invalid type"), "{e}");
    let mut v: serde_json::Value = serde_json::to_value(base()).unwrap();
    v["config"]["surprise"] = 1.into();
    let e = Case::from_json(&v.to_string()).unwrap_err();
    assert!(e.to_string().contains("unknown field `surprise`"), "{e}");
}

#[test]
fn a_case_round_trips_through_json() {
    let c = base();
    let text = serde_json::to_string(&c).unwrap();
    assert_eq!(Case::from_json(&text), Ok(c));
}

#[test]
fn loading_a_directory_or_missing_file_is_an_io_error() {
    let dir = std::env::temp_dir();
    assert!(matches!(Case::load(&dir), Err(CaseError::Io { .. })));
    assert!(matches!(
        Case::load(std::path::Path::new("/nonexistent/case.json")),
        Err(CaseError::Io { .. })
    ));
}

mod prefix_sharing {
    use super::*;

    /// Two sequences of 6 tokens (4 context + 2 new), block size 2: both share their first
    /// two (full context) blocks.
    fn shared() -> Case {
        let c = AttentionConfig::new(2, 1, 2, 2, DType::F32);
        let mut case = build_case(&[6, 6], &[2, 2], c, 3, &BuildOptions::default());
        case.layout.block_table[1][0] = case.layout.block_table[0][0];
        case.layout.block_table[1][1] = case.layout.block_table[0][1];
        let ctx = case.tensors.context_key[0].clone();
        let ctv = case.tensors.context_value[0].clone();
        case.tensors.context_key[1] = ctx;
        case.tensors.context_value[1] = ctv;
        case
    }

    #[test]
    fn identical_shared_full_context_blocks_are_valid() {
        assert_eq!(shared().validate(), Ok(()));
    }

    #[test]
    fn shared_block_with_different_contents() {
        let mut c = shared();
        c.tensors.context_value[1][1] += 1.0;
        let e = c.validate().unwrap_err();
        assert!(
            matches!(
                e,
                CaseError::SharedBlockDiffers {
                    seq_a: 0,
                    seq_b: 1,
                    index: 0,
                    field: "tensors.context_value",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// [`shared`] with seq 1's new tokens moved into seq 0's second (full context) block.
    fn new_tokens_in_seq_0s_block() -> Case {
        let mut c = shared();
        c.batch.seq_lens[1] = 4;
        c.batch.query_lens[1] = 2;
        c.tensors.context_key[1].truncate(2 * 2);
        c.tensors.context_value[1].truncate(2 * 2);
        let b = c.layout.block_table[1][1] as i64;
        c.layout.slot_mapping[2] = b * 2;
        c.layout.slot_mapping[3] = b * 2 + 1;
        c
    }

    #[test]
    fn new_token_in_a_shared_block() {
        let c = new_tokens_in_seq_0s_block();
        let e = c.validate().unwrap_err();
        assert!(
            matches!(
                e,
                CaseError::NewTokenInSharedBlock {
                    seq: 1,
                    other: 0,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    /// vLLM's prefix cache hits a block another request of the same step computes: the
    /// writer's new K/V are the very values the reader holds as context there.
    #[test]
    fn a_block_computed_in_the_same_step_may_be_read_as_context() {
        let mut c = new_tokens_in_seq_0s_block();
        let row = c.config.num_kv_heads * c.config.head_size;
        let (k, v) = (
            c.tensors.context_key[0].clone(),
            c.tensors.context_value[0].clone(),
        );
        c.tensors.key[2 * row..4 * row].copy_from_slice(&k[2 * row..4 * row]);
        c.tensors.value[2 * row..4 * row].copy_from_slice(&v[2 * row..4 * row]);
        assert_eq!(c.validate(), Ok(()));
        // One value off: two tokens on one slot again.
        c.tensors.value[3 * row] += 1.0;
        assert!(matches!(
            c.validate(),
            Err(CaseError::NewTokenInSharedBlock {
                seq: 1,
                other: 0,
                ..
            })
        ));
    }
}

mod prefix_builder {
    use super::*;
    use attn_reference::SharedPrefix;

    #[test]
    fn the_builder_makes_valid_sharing_batches() {
        let c = AttentionConfig::new(4, 2, 3, 2, DType::Bf16);
        let opts = BuildOptions {
            shared_prefixes: vec![SharedPrefix {
                seqs: vec![0, 2, 3],
                blocks: 2,
            }],
            spare_blocks: 2,
            ..Default::default()
        };
        let case = build_case(&[9, 3, 6, 5], &[2, 3, 1, 1], c, 5, &opts);
        assert_eq!(case.validate(), Ok(()));
        let t = &case.layout.block_table;
        assert_eq!(&t[0][..2], &t[2][..2]);
        assert_eq!(&t[0][..2], &t[3][..2]);
        assert_ne!(t[0][2], t[2][2]);
        // 5 + 2 + 3 + 3 logical blocks, 4 of them reused, 2 spare, plus the null block.
        assert_eq!(case.layout.num_blocks, 1 + 13 - 4 + 2);
    }

    #[test]
    fn sharing_at_another_logical_position_is_not_a_prefix() {
        let c = AttentionConfig::new(2, 1, 2, 2, DType::F32);
        let mut case = build_case(&[6, 6], &[2, 2], c, 3, &BuildOptions::default());
        // Seq 1's block 1 is seq 0's block 0 (same data), but not at the same position.
        case.layout.block_table[1][1] = case.layout.block_table[0][0];
        let head = case.tensors.context_key[0][..4].to_vec();
        case.tensors.context_key[1][4..8].copy_from_slice(&head);
        let head = case.tensors.context_value[0][..4].to_vec();
        case.tensors.context_value[1][4..8].copy_from_slice(&head);
        let e = case.validate().unwrap_err();
        assert!(
            matches!(
                e,
                CaseError::SharedBlockNotPrefix {
                    seq_a: 0,
                    seq_b: 1,
                    index_a: 0,
                    index_b: 1,
                    ..
                }
            ),
            "{e:?}"
        );
    }
}

/// Cross-attention: the step writes nothing, and there is no window or ALiBi; more decoder
/// tokens than encoder keys are fine.
#[test]
fn cross_attention_cases() {
    use attn_reference::{build_case, AttentionConfig, AttentionKind, BuildOptions, DType};
    let mut c = AttentionConfig::new(2, 1, 4, 2, DType::F32);
    c.kind = AttentionKind::EncoderDecoder;
    let ok = build_case(&[3, 2], &[1, 5], c, 1, &BuildOptions::default());
    assert_eq!(ok.validate(), Ok(()));
    let mut bad = ok.clone();
    bad.layout.slot_mapping[2] = 3;
    assert_eq!(
        bad.validate(),
        Err(CaseError::CrossAttentionWrite {
            token: 2,
            actual: 3
        })
    );
    let mut bad = ok.clone();
    bad.config.sliding_window = Some(2);
    assert!(
        matches!(bad.validate(), Err(CaseError::InvalidParam { ref field, .. }) if field == "config.sliding_window")
    );
    let mut bad = ok.clone();
    bad.config.alibi_slopes = Some(vec![0.5, 0.25]);
    assert!(
        matches!(bad.validate(), Err(CaseError::InvalidParam { ref field, .. }) if field == "config.alibi_slopes")
    );
    let mut bad = ok;
    bad.tensors.context_key[1].pop();
    assert!(matches!(
        bad.validate(),
        Err(CaseError::LengthMismatch { ref field, expected: 8, .. }) if field == "tensors.context_key[1]"
    ));
}

/// A case the loaders accepted before the allocation bound: 67,108,864 blocks of 256 slots, 8
/// kv heads of 576 (a 633 TB cache in f32). Validation rejects it naming the field, so no
/// backend is ever asked to allocate it.
#[test]
fn a_cache_no_machine_holds_is_rejected_naming_num_blocks() {
    let config = AttentionConfig::new(8, 8, 576, 256, DType::F32);
    let mut case = build_case(&[1], &[1], config, 1, &BuildOptions::default());
    assert_eq!(case.validate(), Ok(()));
    case.layout.num_blocks = 67_108_864;
    let e = case.validate().expect_err("633 TB cache");
    assert!(
        matches!(e, CaseError::TooManyBytes { ref field, .. } if field == "layout.num_blocks"),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("67108864 blocks × 256 slots × 8 kv heads × 576 elements"),
        "{text}"
    );
    assert!(
        text.contains("576.0 TiB") && text.contains("64.0 GiB"),
        "{text}"
    );
    // The same through the JSON loader.
    let json = serde_json::to_string(&case).unwrap();
    assert_eq!(Case::from_json(&json), Err(e));
}

/// Every case the strategies draw stays inside the bound: the largest, the huge-cache tier
/// (140,000 blocks of 16 slots, 8 kv heads of 128), in every dtype.
#[test]
fn the_huge_cache_tier_is_admitted() {
    for dt in [DType::F32, DType::Bf16, DType::F16] {
        let config = AttentionConfig::new(8, 8, 128, 16, dt);
        assert_eq!(
            attn_reference::validate_cache_size(&config, 140_000, "layout.num_blocks"),
            Ok(())
        );
        let mut case = build_case(&[40], &[3], config, 1, &BuildOptions::default());
        case.layout.num_blocks = 140_000;
        assert_eq!(case.validate(), Ok(()), "{dt:?}");
    }
}

/// A table padded far past what the cache holds would make a gather-then-attend backend
/// allocate every entry's K/V; padding tokens size the query and output rows.
#[test]
fn block_table_width_and_token_count_are_bounded() {
    let config = AttentionConfig::new(1, 1, 4096, 4096, DType::F32);
    let mut case = build_case(&[1], &[1], config, 1, &BuildOptions::default());
    assert_eq!(case.validate(), Ok(()));
    case.layout.block_table[0].resize(600, 0);
    let e = case.validate().expect_err("75 GiB gather");
    assert!(
        matches!(e, CaseError::TooManyBytes { ref field, .. } if field == "layout.block_table"),
        "{e:?}"
    );

    let mut case = base();
    case.batch.num_padding_tokens = 1 << 40;
    let e = case.validate().expect_err("2^40 padding tokens");
    assert!(
        matches!(e, CaseError::TooManyBytes { ref field, .. } if field == "tensors.query"),
        "{e:?}"
    );
}

mod huge_dimensions {
    use attn_reference::{Case, CaseError, MAX_ALLOC_BYTES, MAX_BLOCKS, MAX_DIM};
    use proptest::prelude::*;

    /// A one-token case as JSON with any dimensions (its tensors as long as they must be).
    fn case_json(heads: usize, head_size: usize, block_size: usize, num_blocks: usize) -> String {
        let zeros = |n: usize| format!("[{}]", vec!["0"; n].join(","));
        format!(
            r#"{{"config": {{"num_heads": {heads}, "num_kv_heads": {heads}, "head_size": {head_size},
                "block_size": {block_size}, "dtype": "f32", "scale": null, "kind": "decoder",
                "sliding_window": null, "logits_soft_cap": null, "alibi_slopes": null, "sinks": null}},
              "batch": {{"seq_lens": [1], "query_lens": [1]}},
              "layout": {{"num_blocks": {num_blocks}, "block_table": [[1]], "slot_mapping": [{block_size}]}},
              "tensors": {{"query": {q}, "key": {q}, "value": {q}, "context_key": [[]], "context_value": [[]]}}}}"#,
            q = zeros(heads * head_size)
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// Whatever the dimensions, the loader gives a case whose cache fits the bound or a
        /// typed error, never a panic; a cache past the bound is always refused.
        #[test]
        fn the_loader_bounds_every_cache(
            heads in 1usize..=8,
            head_size in prop_oneof![1usize..=64, (MAX_DIM / 2)..=(MAX_DIM / 8 * 9)],
            block_size in prop_oneof![1usize..=16, 2usize..=(MAX_DIM * 2)],
            num_blocks in prop_oneof![2usize..=64, 2usize..=(MAX_BLOCKS * 2)],
        ) {
            let bytes = 2u128 * 4 * (num_blocks * block_size * heads * head_size) as u128;
            let got = Case::from_json(&case_json(heads, head_size, block_size, num_blocks));
            match got {
                Ok(case) => prop_assert!(bytes <= MAX_ALLOC_BYTES as u128, "{}", case.shape_summary()),
                Err(CaseError::TooManyBytes { ref field, .. }) => {
                    prop_assert_eq!(field.as_str(), "layout.num_blocks");
                    prop_assert!(bytes > MAX_ALLOC_BYTES as u128);
                }
                Err(e) => {
                    // Only the plain size limits may come first.
                    prop_assert!(
                        matches!(e, CaseError::TooLarge { .. }),
                        "unexpected {e}"
                    );
                    prop_assert!(head_size > MAX_DIM || block_size > MAX_DIM || num_blocks > MAX_BLOCKS, "{e}");
                }
            }
        }
    }
}

#[test]
fn finer_fp8_scales_are_checked_by_named_field() {
    use attn_reference::{Fp8Format, Fp8KvCache, KvScales};
    let with = |scales: KvScales, format: Fp8Format, k_scale: f32| Fp8KvCache {
        scales,
        ..Fp8KvCache::new(format, k_scale, 1.0)
    };
    let head = |k: Vec<f32>, v: Vec<f32>| KvScales::Head { k, v };
    let field_of = |cache: Fp8KvCache| match err(|c| c.config.kv_cache = Some(cache)) {
        CaseError::InvalidParam { field, .. } | CaseError::LengthMismatch { field, .. } => field,
        other => panic!("{other:?}"),
    };
    // Two kv heads in the base case.
    let ok = with(head(vec![0.5, 4.0], vec![1.0, 0.25]), Fp8Format::E5m2, 1.0);
    let mut c = base();
    c.config.kv_cache = Some(ok.clone());
    assert_eq!(c.validate(), Ok(()));
    let h = Fp8Format::E4m3;
    assert_eq!(
        field_of(with(head(vec![0.5], vec![1.0, 1.0]), h, 1.0)),
        "config.kv_cache.scales.k"
    );
    assert_eq!(
        field_of(with(head(vec![0.5, 1.0], vec![1.0, -1.0]), h, 1.0)),
        "config.kv_cache.scales.v[1]"
    );
    assert_eq!(
        field_of(with(head(vec![f32::NAN, 1.0], vec![1.0, 1.0]), h, 1.0)),
        "config.kv_cache.scales.k[0]"
    );
    // The per-tensor scales are replaced by the finer ones, so they must be 1.
    assert_eq!(
        field_of(with(head(vec![1.0; 2], vec![1.0; 2]), h, 0.5)),
        "config.kv_cache.k_scale"
    );
    assert_eq!(
        field_of(with(KvScales::Token, h, 2.0)),
        "config.kv_cache.k_scale"
    );
    // Per-token scales are vLLM's E4M3 cache only.
    assert_eq!(
        field_of(with(KvScales::Token, Fp8Format::E5m2, 1.0)),
        "config.kv_cache.scales"
    );
    // In JSON: the granularity by name, per tensor left out; an unknown one is an error.
    let mut c = base();
    c.config.kv_cache = Some(with(KvScales::Token, h, 1.0));
    let text = serde_json::to_string(&c).unwrap();
    assert!(
        text.contains(r#""scales":{"granularity":"token"}"#),
        "{text}"
    );
    assert_eq!(Case::from_json(&text), Ok(c));
    let bad = text.replace(r#""granularity":"token""#, r#""granularity":"block""#);
    let e = Case::from_json(&bad).unwrap_err();
    assert!(e.to_string().contains("block"), "{e}");
    let mut c = base();
    c.config.kv_cache = Some(Fp8KvCache::new(h, 0.5, 0.25));
    assert!(!serde_json::to_string(&c).unwrap().contains("scales\""));
}
