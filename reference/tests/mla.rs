//! Multi-head latent attention: the oracle against answers worked out by hand, invariants
//! that tie it to the ordinary oracle, and validation naming the field of every
//! inconsistency of an MLA case.

use attn_reference::{
    build_case, reference_output, AttentionConfig, AttentionKind, BuildOptions, Case, CaseError,
    DType, Fp8Format, Fp8KvCache, Mla,
};
use proptest::prelude::*;

/// An MLA config: `hq` heads over one latent entry of `dk`, V its first `dv`.
fn mla(hq: usize, dk: usize, dv: usize, bs: usize, scale: f32) -> AttentionConfig {
    let mut c = AttentionConfig::new(hq, 1, dk, bs, DType::F32);
    c.mla = Some(Mla { head_size_v: dv });
    c.scale = Some(scale);
    c
}

fn case(seq_lens: &[usize], query_lens: &[usize], c: AttentionConfig, seed: u64) -> Case {
    build_case(seq_lens, query_lens, c, seed, &BuildOptions::default())
}

/// Sequence 0 with the given latent rows (context then new tokens) and query rows.
fn with_rows(mut c: Case, keys: &[&[f32]], queries: &[&[f32]]) -> Case {
    let q = c.batch.query_lens[0];
    let ctx = c.batch.seq_lens[0] - q;
    c.tensors.context_key[0] = keys[..ctx].concat();
    c.tensors.key = keys[ctx..].concat();
    c.tensors.query = queries.concat();
    c
}

fn assert_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "element {i}: {x} vs {y}");
    }
}

#[test]
fn one_key_gives_the_latent_prefix() {
    let c = with_rows(
        case(&[1], &[1], mla(2, 3, 2, 4, 0.5), 1),
        &[&[1.5, -2.0, 7.0]],
        &[&[1.0, 0.0, 1.0], &[0.0, 3.0, -1.0]],
    );
    assert_eq!(c.validate(), Ok(()));
    // Two heads, two output dims each: the first two dims of the one entry, never its third.
    assert_eq!(reference_output(&c), vec![1.5, -2.0, 1.5, -2.0]);
}

#[test]
fn two_keys_by_hand_with_the_models_scale() {
    // q = [1, 0, 1]; keys [1, 2, 0] and [0, 1, 2]; q·k = 1 and 2; scale 0.5: logits 0.5, 1.
    // V = [1, 2] and [0, 1] (the first two dims of each key).
    let c = with_rows(
        case(&[2], &[1], mla(1, 3, 2, 2, 0.5), 2),
        &[&[1.0, 2.0, 0.0], &[0.0, 1.0, 2.0]],
        &[&[1.0, 0.0, 1.0]],
    );
    let (w0, w1) = (0.5f64.exp(), 1.0f64.exp());
    let expected = [w0 / (w0 + w1), (2.0 * w0 + w1) / (w0 + w1)];
    assert_close(&reference_output(&c), &expected, 1e-15);
    // The default scale (3^-0.5 here) would give another answer: the scale is the model's.
    let (d0, d1) = ((1.0 / 3f64.sqrt()).exp(), (2.0 / 3f64.sqrt()).exp());
    let with_default = [d0 / (d0 + d1), (2.0 * d0 + d1) / (d0 + d1)];
    assert!((reference_output(&c)[0] - with_default[0]).abs() > 1e-3);
}

#[test]
fn speculative_queries_are_causal_over_the_latent() {
    // Context of one key, two new tokens: token 0 (position 1) sees keys 0..=1, token 1 sees
    // all three. Keys are orthogonal to the query, so the weights are uniform over what is seen.
    let keys: [&[f32]; 3] = [&[2.0, 0.0, 0.0], &[4.0, 0.0, 0.0], &[9.0, 0.0, 0.0]];
    let q: &[f32] = &[0.0, 0.0, 1.0];
    let c = with_rows(case(&[3], &[2], mla(1, 3, 1, 2, 1.0), 3), &keys, &[q, q]);
    assert_eq!(c.validate(), Ok(()));
    assert_close(&reference_output(&c), &[3.0, 5.0], 1e-15);
}

#[test]
fn every_head_reads_the_one_latent_head() {
    // Identical queries in every head give identical rows, whatever the head count.
    for hq in [1, 2, 16, 128] {
        let mut c = case(&[7], &[1], mla(hq, 6, 4, 4, 0.3), 4);
        let q0 = c.tensors.query[..6].to_vec();
        c.tensors.query = q0.repeat(hq);
        let out = reference_output(&c);
        for h in 1..hq {
            assert_eq!(out[h * 4..(h + 1) * 4], out[..4], "head {h} of {hq}");
        }
    }
}

#[test]
fn an_fp8_latent_reads_v_from_the_stored_entry() {
    // 1.1 is not an E4M3 value: stored as fp8(1.1 / 0.5) * 0.5 = 1.125 in K and in V alike.
    let mut c = mla(1, 2, 1, 2, 1.0);
    c.kv_cache = Some(Fp8KvCache::new(Fp8Format::E4m3, 0.5, 0.5));
    let c = with_rows(case(&[1], &[1], c, 5), &[&[1.1, 0.0]], &[&[1.0, 1.0]]);
    assert_eq!(reference_output(&c), vec![1.125]);
}

/// The same case as ordinary attention: V rows written out as the latent prefix, padded with
/// zeros to the key width.
fn as_mha(c: &Case) -> Case {
    let (dk, dv) = (c.config.head_size, c.config.head_size_v());
    let pad = |keys: &[f32]| -> Vec<f32> {
        keys.chunks(dk)
            .flat_map(|row| {
                row[..dv]
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(0.0, dk - dv))
            })
            .collect()
    };
    let mut m = c.clone();
    m.config.mla = None;
    m.tensors.value = pad(&c.tensors.key);
    m.tensors.context_value = c.tensors.context_key.iter().map(|k| pad(k)).collect();
    m
}

fn mla_case() -> impl Strategy<Value = Case> {
    (
        1usize..=8,
        1usize..=24,
        1usize..=9,
        prop::collection::vec((0usize..=700, 1usize..=6), 1..=3),
        any::<u64>(),
    )
        .prop_map(|(hq, dk, bs, seqs, seed)| {
            let dv = 1 + (seed as usize % dk);
            let (l, q): (Vec<usize>, Vec<usize>) = seqs.iter().map(|&(c, q)| (c + q, q)).unzip();
            case(&l, &q, mla(hq, dk, dv, bs, 0.17), seed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn mla_equals_attention_over_zero_padded_prefix_values(c in mla_case()) {
        prop_assert_eq!(c.validate(), Ok(()));
        let (dk, dv, hq) = (c.config.head_size, c.config.head_size_v(), c.config.num_heads);
        let m = as_mha(&c);
        prop_assert_eq!(m.validate(), Ok(()));
        let (a, b) = (reference_output(&c), reference_output(&m));
        prop_assert_eq!(a.len(), c.num_real_tokens() * hq * dv);
        for (row_a, row_b) in a.chunks(dv).zip(b.chunks(dk)) {
            prop_assert_eq!(row_a, &row_b[..dv]);
            prop_assert!(row_b[dv..].iter().all(|&x| x == 0.0));
        }
    }
}

#[test]
fn an_mla_case_round_trips_through_json() {
    let c = case(&[600, 3], &[1, 2], mla(16, 576, 512, 16, 0.0722), 6);
    let json = serde_json::to_string(&c).unwrap();
    assert!(json.contains(r#""mla":{"head_size_v":512}"#));
    assert_eq!(Case::from_json(&json).unwrap(), c);
    let plain = case(&[3], &[1], AttentionConfig::new(2, 1, 4, 2, DType::F32), 7);
    assert!(!serde_json::to_string(&plain).unwrap().contains("mla"));
    let unknown = json.replace(r#"{"head_size_v":512}"#, r#"{"head_size_v":512,"rope":64}"#);
    assert!(matches!(
        Case::from_json(&unknown),
        Err(CaseError::Parse { .. })
    ));
}

fn invalid_field(e: CaseError) -> String {
    match e {
        CaseError::InvalidParam { field, .. } | CaseError::LengthMismatch { field, .. } => field,
        CaseError::Zero { field } => field.to_string(),
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn every_inconsistency_names_its_field() {
    let base = case(&[5], &[2], mla(4, 6, 4, 2, 0.5), 8);
    assert_eq!(base.validate(), Ok(()));
    let err = |edit: &dyn Fn(&mut Case)| {
        let mut c = base.clone();
        edit(&mut c);
        invalid_field(c.validate().expect_err("invalid"))
    };
    type Edit = Box<dyn Fn(&mut Case)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "config.mla.head_size_v",
            Box::new(|c| c.config.mla = Some(Mla { head_size_v: 0 })),
        ),
        (
            "config.mla.head_size_v",
            Box::new(|c| c.config.mla = Some(Mla { head_size_v: 7 })),
        ),
        (
            "config.num_kv_heads",
            Box::new(|c| c.config.num_kv_heads = 2),
        ),
        ("config.scale", Box::new(|c| c.config.scale = None)),
        (
            "config.kind",
            Box::new(|c| c.config.kind = AttentionKind::EncoderOnly),
        ),
        (
            "config.sliding_window",
            Box::new(|c| c.config.sliding_window = Some(2)),
        ),
        (
            "config.logits_soft_cap",
            Box::new(|c| c.config.logits_soft_cap = Some(5.0)),
        ),
        (
            "config.alibi_slopes",
            Box::new(|c| c.config.alibi_slopes = Some(vec![0.5; 4])),
        ),
        (
            "config.sinks",
            Box::new(|c| c.config.sinks = Some(vec![0.0; 4])),
        ),
        (
            "config.kv_cache.v_scale",
            Box::new(|c| c.config.kv_cache = Some(Fp8KvCache::new(Fp8Format::E4m3, 0.5, 0.25))),
        ),
        (
            "tensors.value",
            Box::new(|c| c.tensors.value = vec![0.0; 2 * 6]),
        ),
        (
            "tensors.context_value[0]",
            Box::new(|c| c.tensors.context_value[0] = vec![0.0; 3 * 6]),
        ),
        ("tensors.key", Box::new(|c| c.tensors.key.truncate(6))),
    ];
    for (field, edit) in &cases {
        assert_eq!(err(edit.as_ref()), *field);
    }
    // The messages say why.
    let mut c = base.clone();
    c.config.scale = None;
    assert!(c.validate().unwrap_err().to_string().contains("192^-0.5"));
    let mut c = base.clone();
    c.config.mla = Some(Mla { head_size_v: 7 });
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("first head_size_v dims"));
}

#[test]
fn prefix_sharing_holds_for_latent_blocks() {
    use attn_reference::SharedPrefix;
    let opts = BuildOptions {
        shared_prefixes: vec![SharedPrefix {
            seqs: vec![0, 1],
            blocks: 2,
        }],
        ..Default::default()
    };
    let c = build_case(&[9, 7], &[1, 2], mla(2, 5, 3, 2, 0.4), 9, &opts);
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(c.layout.block_table[0][..2], c.layout.block_table[1][..2]);
    // The shared latent rows give both sequences the same V there.
    let (v0, v1) = (c.contiguous_kv(0).1, c.contiguous_kv(1).1);
    assert_eq!(v0[..4 * 3], v1[..4 * 3]);
    let mut broken = c.clone();
    broken.tensors.context_key[1][0] += 1.0;
    assert!(matches!(
        broken.validate(),
        Err(CaseError::SharedBlockDiffers {
            field: "tensors.context_key",
            ..
        })
    ));
}

#[test]
fn deepseek_v3_decode_layer() {
    let c = AttentionConfig::deepseek_v3_mla(128, 16, DType::Bf16);
    assert_eq!(
        (c.head_size, c.head_size_v(), c.num_kv_heads),
        (576, 512, 1)
    );
    assert!((c.effective_scale() - 192f64.powf(-0.5)).abs() < 1e-7);
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(c.output_row(), 128 * 512);
    assert_eq!(c.value_row(), 0);
}
