//! The oracle against hand-computed answers and invariants that any correct attention obeys.
#![allow(clippy::needless_range_loop)] // index loops read more plainly in hand-computed checks

use attn_reference::{
    build_case, reference_output, AttentionConfig, AttentionKind, BuildOptions, Case, DType,
};
use proptest::prelude::*;

fn cfg(hq: usize, hkv: usize, d: usize, bs: usize) -> AttentionConfig {
    AttentionConfig::new(hq, hkv, d, bs, DType::F32)
}

fn case(seq_lens: &[usize], query_lens: &[usize], c: AttentionConfig, seed: u64) -> Case {
    build_case(seq_lens, query_lens, c, seed, &BuildOptions::default())
}

fn out_row(case: &Case, out: &[f64], token: usize, head: usize) -> Vec<f64> {
    let d = case.config.head_size;
    let hq = case.config.num_heads;
    out[(token * hq + head) * d..(token * hq + head + 1) * d].to_vec()
}

/// K/V row `pos` of sequence `seq`, kv head `h`.
fn kv_row(case: &Case, seq: usize, pos: usize, h: usize) -> (Vec<f64>, Vec<f64>) {
    let (k, v) = case.contiguous_kv(seq);
    let (hkv, d) = (case.config.num_kv_heads, case.config.head_size);
    let r = |t: &[f32]| {
        t[(pos * hkv + h) * d..(pos * hkv + h + 1) * d]
            .iter()
            .map(|&x| x as f64)
            .collect()
    };
    (r(&k), r(&v))
}

/// The mean of the values at `positions` of sequence 0, kv head 0: what attention over
/// identical keys must give.
fn mean_value(case: &Case, positions: std::ops::Range<usize>) -> Vec<f64> {
    let n = positions.len() as f64;
    let mut mean = vec![0.0; case.config.head_size];
    for p in positions {
        let (_, v) = kv_row(case, 0, p, 0);
        for (m, x) in mean.iter_mut().zip(v) {
            *m += x / n;
        }
    }
    mean
}

/// Give sequence 0's context keys at `context` and the step's keys at `new` the first new
/// token's key (one kv head): attention over them then averages their values.
fn same_keys(c: &mut Case, context: std::ops::Range<usize>, new: std::ops::Range<usize>) {
    let d = c.config.head_size;
    let k0 = c.tensors.key[..d].to_vec();
    for p in context {
        c.tensors.context_key[0][p * d..(p + 1) * d].copy_from_slice(&k0);
    }
    for j in new {
        c.tensors.key[j * d..(j + 1) * d].copy_from_slice(&k0);
    }
}

fn assert_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn one_key_gives_its_value() {
    let c = case(&[1], &[1], cfg(2, 1, 5, 4), 1);
    let out = reference_output(&c);
    let (_, v) = kv_row(&c, 0, 0, 0);
    assert_close(&out_row(&c, &out, 0, 0), &v, 1e-15);
    assert_close(&out_row(&c, &out, 0, 1), &v, 1e-15);
}

#[test]
fn identical_keys_give_the_mean_of_the_values() {
    let mut c = case(&[5], &[1], cfg(1, 1, 3, 2), 2);
    let d = 3;
    let k0: Vec<f32> = c.tensors.context_key[0][..d].to_vec();
    for p in 0..4 {
        c.tensors.context_key[0][p * d..(p + 1) * d].copy_from_slice(&k0);
    }
    c.tensors.key[..d].copy_from_slice(&k0);
    let out = reference_output(&c);
    let mean = mean_value(&c, 0..5);
    assert_close(&out_row(&c, &out, 0, 0), &mean, 1e-14);
}

#[test]
fn window_of_one_gives_the_tokens_own_value() {
    for kind in [AttentionKind::Decoder, AttentionKind::EncoderOnly] {
        let mut config = cfg(4, 2, 8, 3);
        config.kind = kind;
        config.sliding_window = Some(1);
        let c = case(&[7, 4], &[7, 4], config, 3);
        let out = reference_output(&c);
        let starts = c.query_start_loc();
        for s in 0..2 {
            for j in 0..c.batch.query_lens[s] {
                for h in 0..4 {
                    let (_, v) = kv_row(&c, s, c.context_len(s) + j, h / 2);
                    assert_close(&out_row(&c, &out, starts[s] + j, h), &v, 1e-15);
                }
            }
        }
    }
}

#[test]
fn decoder_window_counts_w_keys_including_the_query() {
    // With all-identical keys, a window of w averages exactly the last w values.
    let mut config = cfg(1, 1, 2, 4);
    config.sliding_window = Some(3);
    let mut c = case(&[6], &[1], config, 4);
    same_keys(&mut c, 0..5, 0..0);
    let out = reference_output(&c);
    let mean = mean_value(&c, 3..6);
    assert_close(&out_row(&c, &out, 0, 0), &mean, 1e-14);
}

#[test]
fn local_chunks_see_only_their_own_chunk() {
    // Identical keys: a decoder query averages the values of its chunk up to itself.
    let mut config = cfg(1, 1, 2, 4);
    config.attention_chunk_size = Some(4);
    let mut c = case(&[11], &[5], config, 6);
    same_keys(&mut c, 0..6, 0..5);
    let out = reference_output(&c);
    // Positions 6..11: 6 and 7 in the chunk from 4, 8..11 in the chunk from 8.
    for (j, p) in (6..11).enumerate() {
        let mean = mean_value(&c, p - p % 4..p + 1);
        assert_close(&out_row(&c, &out, j, 0), &mean, 1e-14);
    }
    // A chunk of one: the token's own value; a chunk past the sequence: no chunk at all.
    let mut one = c.clone();
    one.config.attention_chunk_size = Some(1);
    let out = reference_output(&one);
    for j in 0..5 {
        let (_, v) = kv_row(&one, 0, 6 + j, 0);
        assert_close(&out_row(&one, &out, j, 0), &v, 1e-15);
    }
    let mut past = c.clone();
    past.config.attention_chunk_size = Some(11);
    let mut none = c.clone();
    none.config.attention_chunk_size = None;
    assert_eq!(reference_output(&past), reference_output(&none));
}

#[test]
fn chunk_look_back_sees_whole_chunks_before_the_query_s_own() {
    // Identical keys: a query averages the values from the start of the chunk `k` before
    // its own up to itself (vLLM 0.33's rule: p / c - key / c <= k).
    let mut config = cfg(1, 1, 2, 4);
    config.attention_chunk_size = Some(3);
    config.chunk_lookback = Some(1);
    let mut c = case(&[11], &[5], config, 6);
    same_keys(&mut c, 0..6, 0..5);
    let out = reference_output(&c);
    // Positions 6..11 are in chunks 2 and 3: chunk 2 looks back to key 3, chunk 3 to 6.
    for (j, p) in (6..11).enumerate() {
        let from = [0, 0, 3, 6][p / 3];
        let mean = mean_value(&c, from..p + 1);
        assert_close(&out_row(&c, &out, j, 0), &mean, 1e-14);
    }
    // A look-back past the first chunk sees everything: plain causal attention.
    let mut far = c.clone();
    far.config.chunk_lookback = Some(4);
    let mut causal = c.clone();
    causal.config.attention_chunk_size = None;
    causal.config.chunk_lookback = None;
    assert_eq!(reference_output(&far), reference_output(&causal));
}

#[test]
fn a_non_causal_request_sees_its_whole_sequence_and_a_window_both_ways() {
    // Identical keys: each query averages the values it sees. A non-causal request (vLLM
    // 0.33's per-request `causal`) sees every key of its sequence; its window, |p - k| < w.
    let config = cfg(1, 1, 2, 4);
    let mut c = case(&[8], &[3], config, 7);
    same_keys(&mut c, 0..5, 0..3);
    c.batch.causal = Some(vec![false]);
    assert_eq!(c.validate(), Ok(()));
    let out = reference_output(&c);
    let all = mean_value(&c, 0..8);
    for j in 0..3 {
        assert_close(&out_row(&c, &out, j, 0), &all, 1e-14);
    }
    let mut windowed = c.clone();
    windowed.config.sliding_window = Some(2);
    let out = reference_output(&windowed);
    // Positions 5, 6, 7: keys 4..=6, 5..=7, 6..=7.
    for (j, keys) in [4..7, 5..8, 6..8].into_iter().enumerate() {
        assert_close(
            &out_row(&windowed, &out, j, 0),
            &mean_value(&windowed, keys),
            1e-14,
        );
    }
    // Marked causal, it is the plain case.
    let mut causal = c.clone();
    causal.batch.causal = Some(vec![true]);
    let mut plain = c.clone();
    plain.batch.causal = None;
    assert_eq!(reference_output(&causal), reference_output(&plain));
}

#[test]
fn causality_is_per_request() {
    // Two requests, the second non-causal: only its rows change.
    let config = cfg(2, 1, 4, 4);
    let plain = case(&[6, 7], &[2, 3], config, 9);
    let mut mixed = plain.clone();
    mixed.batch.causal = Some(vec![true, false]);
    let (a, b) = (reference_output(&plain), reference_output(&mixed));
    let row = 2 * 4;
    assert_eq!(
        a[..2 * row],
        b[..2 * row],
        "the causal request is untouched"
    );
    // The non-causal request's last query already sees every key: it is the same.
    assert_eq!(a[4 * row..], b[4 * row..]);
    assert_ne!(a[2 * row..4 * row], b[2 * row..4 * row]);
}

#[test]
fn encoder_window_is_symmetric() {
    let mut config = cfg(1, 1, 2, 4);
    config.kind = AttentionKind::EncoderOnly;
    config.sliding_window = Some(2);
    let mut c = case(&[5], &[5], config, 5);
    same_keys(&mut c, 0..0, 0..5);
    let out = reference_output(&c);
    // Query 2 sees keys 1, 2, 3 (|p - k| < 2).
    let mean = mean_value(&c, 1..4);
    assert_close(&out_row(&c, &out, 2, 0), &mean, 1e-14);
}

#[test]
fn a_huge_sink_drives_the_output_to_zero() {
    let mut config = cfg(2, 2, 4, 4);
    config.sinks = Some(vec![1000.0, 0.0]);
    let c = case(&[9], &[2], config, 6);
    let out = reference_output(&c);
    assert!(out_row(&c, &out, 1, 0).iter().all(|x| x.abs() < 1e-300));
    assert!(out_row(&c, &out, 1, 1).iter().any(|x| x.abs() > 1e-6));
}

#[test]
fn a_sink_scales_the_output_by_its_share_of_the_denominator() {
    // One key: weight 1 for the key, exp(s - l) for the sink.
    let mut config = cfg(1, 1, 4, 4);
    config.scale = Some(1.0);
    config.sinks = Some(vec![0.5]);
    let c = case(&[1], &[1], config, 7);
    let out = reference_output(&c);
    let (k, v) = kv_row(&c, 0, 0, 0);
    let q: Vec<f64> = c.tensors.query[..4].iter().map(|&x| x as f64).collect();
    let l: f64 = q.iter().zip(&k).map(|(a, b)| a * b).sum();
    let share = 1.0 / (1.0 + (0.5 - l).exp());
    let want: Vec<f64> = v.iter().map(|x| x * share).collect();
    assert_close(&out_row(&c, &out, 0, 0), &want, 1e-14);
}

#[test]
fn a_large_cap_equals_no_cap_and_a_small_cap_changes_the_output() {
    let base = case(&[20, 13], &[3, 13], cfg(4, 2, 16, 4), 8);
    let plain = reference_output(&base);
    let mut capped = base.clone();
    capped.config.logits_soft_cap = Some(1e6);
    assert_close(&reference_output(&capped), &plain, 1e-9);
    capped.config.logits_soft_cap = Some(0.5);
    let small = reference_output(&capped);
    assert!(small.iter().zip(&plain).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn soft_cap_applies_before_alibi() {
    // One query, two keys, scale 1: logits are cap*tanh(q.k/cap) + slope*(k - p).
    let mut config = cfg(1, 1, 2, 4);
    config.scale = Some(1.0);
    config.logits_soft_cap = Some(2.0);
    config.alibi_slopes = Some(vec![0.75]);
    let c = case(&[2], &[1], config, 9);
    let out = reference_output(&c);
    let q: Vec<f64> = c.tensors.query[..2].iter().map(|&x| x as f64).collect();
    let (k0, v0) = kv_row(&c, 0, 0, 0);
    let (k1, v1) = kv_row(&c, 0, 1, 0);
    let dot = |k: &[f64]| q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>();
    let l0 = 2.0 * (dot(&k0) / 2.0).tanh() + 0.75 * (0.0 - 1.0);
    let l1 = 2.0 * (dot(&k1) / 2.0).tanh();
    let (w0, w1) = (l0.exp(), l1.exp());
    let want: Vec<f64> = (0..2)
        .map(|i| (w0 * v0[i] + w1 * v1[i]) / (w0 + w1))
        .collect();
    assert_close(&out_row(&c, &out, 0, 0), &want, 1e-14);
}

#[test]
fn zero_alibi_slopes_equal_no_alibi_and_gqa_maps_heads_by_division() {
    let base = case(&[11], &[4], cfg(6, 2, 8, 2), 10);
    let mut zero = base.clone();
    zero.config.alibi_slopes = Some(vec![0.0; 6]);
    assert_close(&reference_output(&zero), &reference_output(&base), 0.0);
    // Heads 0..3 read kv head 0: make kv head 1 garbage and heads 0..3 must not move.
    let mut poisoned = base.clone();
    let (d, hkv) = (8, 2);
    for t in [&mut poisoned.tensors.key, &mut poisoned.tensors.value] {
        for row in t.chunks_mut(d * hkv) {
            row[d..].iter_mut().for_each(|x| *x = 9.0);
        }
    }
    for t in [
        &mut poisoned.tensors.context_key[0],
        &mut poisoned.tensors.context_value[0],
    ] {
        for row in t.chunks_mut(d * hkv) {
            row[d..].iter_mut().for_each(|x| *x = 9.0);
        }
    }
    let a = reference_output(&base);
    let b = reference_output(&poisoned);
    for tok in 0..4 {
        for h in 0..3 {
            assert_close(
                &out_row(&base, &b, tok, h),
                &out_row(&base, &a, tok, h),
                0.0,
            );
        }
        assert_ne!(out_row(&base, &b, tok, 3), out_row(&base, &a, tok, 3));
    }
}

#[test]
fn causal_mask_uses_the_context_offset() {
    // Query j of a chunked prefill sees exactly context_len + j + 1 keys: with identical keys
    // it is the mean of those values.
    let mut c = case(&[6], &[2], cfg(1, 1, 2, 4), 11);
    same_keys(&mut c, 0..4, 1..2);
    let out = reference_output(&c);
    let mean = mean_value(&c, 0..5);
    assert_close(&out_row(&c, &out, 0, 0), &mean, 1e-14);
}

#[test]
fn logits_in_the_hundreds_stay_finite() {
    let opts = BuildOptions {
        std: 30.0,
        ..BuildOptions::default()
    };
    let c = build_case(&[40, 7], &[5, 7], cfg(4, 1, 16, 8), 12, &opts);
    assert!(reference_output(&c).iter().all(|x| x.is_finite()));
}

fn small_config() -> impl Strategy<Value = AttentionConfig> {
    (
        1usize..4,
        prop::sample::select(vec![1usize, 2, 3]),
        1usize..9,
        1usize..6,
        any::<bool>(),
        prop::option::of(1usize..8),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(hkv, g, d, bs, enc, w, alibi, sinks)| {
            let mut c = AttentionConfig::new(hkv * g, hkv, d, bs, DType::F32);
            c.kind = if enc {
                AttentionKind::EncoderOnly
            } else {
                AttentionKind::Decoder
            };
            c.sliding_window = w;
            if alibi {
                c.alibi_slopes = Some((0..hkv * g).map(|h| 0.5f32.powi(h as i32 + 1)).collect());
            }
            if sinks {
                c.sinks = Some((0..hkv * g).map(|h| h as f32 * 0.3 - 0.5).collect());
            }
            c
        })
}

fn small_case() -> impl Strategy<Value = Case> {
    (
        small_config(),
        prop::collection::vec((1usize..12, 1usize..12), 1..4),
        any::<u64>(),
    )
        .prop_map(|(c, lens, seed)| {
            let seq_lens: Vec<usize> = lens.iter().map(|&(a, b)| a.max(b)).collect();
            let query_lens: Vec<usize> = if c.kind == AttentionKind::EncoderOnly {
                seq_lens.clone()
            } else {
                lens.iter().map(|&(a, b)| a.min(b)).collect()
            };
            build_case(&seq_lens, &query_lens, c, seed, &BuildOptions::default())
        })
}

proptest! {
    #[test]
    fn physical_block_placement_does_not_change_the_output(c in small_case(), seed in any::<u64>()) {
        // Same tensors, another permutation of physical blocks and a rewritten table.
        let opts = BuildOptions { permute_blocks: false, spare_blocks: 3, ..BuildOptions::default() };
        let mut other = build_case(&c.batch.seq_lens, &c.batch.query_lens, c.config.clone(), seed, &opts);
        other.tensors = c.tensors.clone();
        prop_assert_eq!(other.validate(), Ok(()));
        prop_assert_eq!(reference_output(&other), reference_output(&c));
    }

    #[test]
    fn every_output_lies_within_the_visible_values(c in small_case()) {
        let out = reference_output(&c);
        let (hq, d) = (c.config.num_heads, c.config.head_size);
        let starts = c.query_start_loc();
        let has_sinks = c.config.sinks.is_some();
        for s in 0..c.num_seqs() {
            let (_, v) = c.contiguous_kv(s);
            for j in 0..c.batch.query_lens[s] {
                let p = c.context_len(s) + j;
                let keys = attn_reference::oracle::Visibility::of_seq(&c, s).keys(p, c.batch.seq_lens[s]);
                for h in 0..hq {
                    let kvh = c.config.kv_head_of(h);
                    for i in 0..d {
                        let vals = keys.iter().map(|k| v[(k * c.config.num_kv_heads + kvh) * d + i] as f64);
                        let (mut mn, mut mx) = vals.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
                        if has_sinks { mn = mn.min(0.0); mx = mx.max(0.0); }
                        let o = out[((starts[s] + j) * hq + h) * d + i];
                        prop_assert!(o >= mn - 1e-12 && o <= mx + 1e-12, "{} not in [{}, {}]", o, mn, mx);
                    }
                }
            }
        }
    }

    #[test]
    fn encoder_equals_decoder_for_the_last_token(c in small_case()) {
        let mut enc = c.clone();
        let mut dec = c.clone();
        enc.config.kind = AttentionKind::EncoderOnly;
        dec.config.kind = AttentionKind::Decoder;
        // Both need query == sequence: rebuild with that shape and the same seed-derived data.
        let lens = c.batch.seq_lens.clone();
        enc = build_case(&lens, &lens, enc.config, 5, &BuildOptions::default());
        dec = build_case(&lens, &lens, dec.config, 5, &BuildOptions::default());
        let (a, b) = (reference_output(&enc), reference_output(&dec));
        let row = c.config.num_heads * c.config.head_size;
        let starts = enc.query_start_loc();
        for s in 0..enc.num_seqs() {
            let last = starts[s + 1] - 1;
            prop_assert_eq!(&a[last * row..(last + 1) * row], &b[last * row..(last + 1) * row]);
        }
    }
}

#[test]
fn the_oracle_needs_nothing_for_prefix_sharing() {
    // The oracle reads contiguous K/V, so a batch whose sequences share prefix blocks gives
    // the same output as the same tensors with every block private.
    let c = AttentionConfig::new(4, 2, 8, 4, DType::Bf16);
    let shared = BuildOptions {
        shared_prefixes: vec![attn_reference::SharedPrefix {
            seqs: vec![0, 1],
            blocks: 2,
        }],
        ..BuildOptions::default()
    };
    let a = build_case(&[13, 10, 5], &[2, 1, 5], c.clone(), 4, &shared);
    let mut b = build_case(&[13, 10, 5], &[2, 1, 5], c, 4, &BuildOptions::default());
    b.tensors = a.tensors.clone();
    assert_eq!(b.validate(), Ok(()));
    assert_ne!(a.layout.block_table[1][..2], b.layout.block_table[1][..2]);
    assert_eq!(reference_output(&a), reference_output(&b));
}

/// An FP8 cache: the oracle attends over what the cache gives back. One query over two
/// keys (head size 1, scale 1): k = [1, 1000], v = [3, 600] with k_scale 1 and v_scale 2
/// in E4M3. K stores 1 and saturates 1000 to 448; V stores 1.5 -> 1.5 and 300 -> 288 (the
/// E4M3 neighbours of 300 are 288 and 320). With q = 0.01: logits 0.01 and 4.48, so the
/// output is (3 e^0.01 + 576 e^4.48) / (e^0.01 + e^4.48).
#[test]
fn an_fp8_cache_attends_over_its_stored_values() {
    use attn_reference::{Fp8Format, Fp8KvCache};
    let mut c = cfg(1, 1, 1, 4);
    c.scale = Some(1.0);
    c.kv_cache = Some(Fp8KvCache::new(Fp8Format::E4m3, 1.0, 2.0));
    let mut k = case(&[2], &[1], c, 1);
    k.tensors.context_key[0] = vec![1.0];
    k.tensors.context_value[0] = vec![3.0];
    k.tensors.key = vec![1000.0];
    k.tensors.value = vec![600.0];
    k.tensors.query = vec![0.01];
    assert_eq!(k.validate(), Ok(()));
    let out = reference_output(&k);
    let q = 0.01f32 as f64;
    let (a, b) = (q.exp(), (q * 448.0).exp());
    let want = (3.0 * a + 576.0 * b) / (a + b);
    assert_close(&out, &[want], 1e-14);
    // The same case in E5M2: 1000 -> 1024 (neighbours 896 and 1024), 300 -> 320 (256,
    // 320), 1.5 -> 1.5.
    k.config.kv_cache = Some(Fp8KvCache::new(Fp8Format::E5m2, 1.0, 2.0));
    let out = reference_output(&k);
    let b = (q * 1024.0).exp();
    let want = (3.0 * a + 640.0 * b) / (a + b);
    assert_close(&out, &[want], 1e-14);
}

/// An FP8 query: the query as E4M3 with its scale gives it back (`fp8(q / q_scale) *
/// q_scale`, saturating), whatever the cache's format; the keys and values as the cache
/// gives them back.
#[test]
fn an_fp8_query_attends_with_its_read_back_value() {
    use attn_reference::{Fp8Format, Fp8KvCache};
    let mut c = cfg(1, 1, 1, 4);
    c.scale = Some(1.0);
    c.kv_cache = Some(Fp8KvCache {
        q_scale: Some(0.5),
        ..Fp8KvCache::new(Fp8Format::E5m2, 1.0, 1.0)
    });
    let mut k = case(&[2], &[1], c, 1);
    // Keys 1 and 0, values 1 and 0: the output is the first key's weight, e^q' / (e^q' + 1).
    k.tensors.context_key[0] = vec![1.0];
    k.tensors.context_value[0] = vec![1.0];
    k.tensors.key = vec![0.0];
    k.tensors.value = vec![0.0];
    let share = |q: f64| q.exp() / (q.exp() + 1.0);
    // 1.3 / 0.5 = 2.6: E4M3's neighbours are 2.5 and 2.75, so q' = 2.5 * 0.5 = 1.25 (E5M2
    // would have given 2.5 too, but 1.7 / 0.5 = 3.4 tells them apart: E4M3 3.5, E5M2 3).
    for (q, read_back) in [(1.3f32, 1.25), (1.7, 1.75), (-1.3, -1.25), (1000.0, 224.0)] {
        k.tensors.query = vec![q];
        assert_eq!(k.validate(), Ok(()));
        assert_close(&reference_output(&k), &[share(read_back)], 1e-14);
    }
    // Without the query's scale, the query is read as it is.
    k.config.kv_cache = Some(Fp8KvCache::new(Fp8Format::E5m2, 1.0, 1.0));
    k.tensors.query = vec![1.3];
    assert_close(&reference_output(&k), &[share(1.3f32 as f64)], 1e-14);
}

/// Cross-attention: every decoder query sees every encoder key, whatever its index and
/// however many decoder tokens there are (here 3 over an encoder of 2: more queries than
/// keys). One head of size 1, scale 1: keys k = [0, ln 3] give weights 1 and 3, so with
/// values [4, 8] every query with q = 1 gets (4 + 3 * 8) / 4 = 7, and with q = 0 the mean, 6.
#[test]
fn cross_attention_sees_the_whole_encoder_from_every_query() {
    let mut c = cfg(1, 1, 1, 2);
    c.scale = Some(1.0);
    c.kind = AttentionKind::EncoderDecoder;
    let mut k = case(&[2], &[3], c, 1);
    assert_eq!(k.context_len(0), 2, "every key is the encoder's");
    assert_eq!(
        k.layout.slot_mapping,
        vec![-1, -1, -1],
        "the step writes nothing"
    );
    let ln3 = 3f32.ln();
    k.tensors.context_key[0] = vec![0.0, ln3];
    k.tensors.context_value[0] = vec![4.0, 8.0];
    k.tensors.query = vec![1.0, 0.0, 1.0];
    // The step's own K/V rows are not in the cross cache: they must change nothing.
    k.tensors.key = vec![100.0; 3];
    k.tensors.value = vec![-100.0; 3];
    assert_eq!(k.validate(), Ok(()));
    let out = reference_output(&k);
    let ln3 = ln3 as f64;
    let seven = (4.0 + ln3.exp() * 8.0) / (1.0 + ln3.exp());
    assert_close(&out, &[seven, 6.0, seven], 1e-12);
}

/// The mean of sequence 0's values at `positions`: what a query with identical keys outputs.
fn mean_at(case: &Case, positions: &[usize]) -> Vec<f64> {
    let mut mean = vec![0.0; case.config.head_size];
    for &p in positions {
        let (_, v) = kv_row(case, 0, p, 0);
        for (m, x) in mean.iter_mut().zip(v) {
            *m += x / positions.len() as f64;
        }
    }
    mean
}

fn each_row_averages(c: &Case, rows: &[Vec<usize>]) {
    assert_eq!(c.validate(), Ok(()));
    let out = reference_output(c);
    for (j, keys) in rows.iter().enumerate() {
        assert_close(&out_row(c, &out, j, 0), &mean_at(c, keys), 1e-14);
    }
}

#[test]
fn a_query_in_a_prefix_lm_range_sees_the_whole_range() {
    // Identical keys: each query averages the values it sees. Positions 6..=9 are the
    // step's; the ranges [2, 3] and [7, 9] (ends inclusive, vLLM 0.33's mm_req_doc_ranges).
    let mut c = case(&[10], &[4], cfg(1, 1, 2, 4), 11);
    same_keys(&mut c, 0..6, 0..4);
    c.batch.prefix_lm = Some(attn_reference::PrefixLm {
        ranges: vec![vec![(2, 3), (7, 9)]],
        clamp_to_window: false,
    });
    let upto = |hi: usize| (0..=hi).collect::<Vec<_>>();
    each_row_averages(&c, &[upto(6), upto(9), upto(9), upto(9)]);
    // A window of 2: (causal ∧ window) ∨ in-range. Position 6 sees 5, 6; 7 sees 6..=9.
    let mut w = c.clone();
    w.config.sliding_window = Some(2);
    each_row_averages(
        &w,
        &[vec![5, 6], vec![6, 7, 8, 9], vec![7, 8, 9], vec![7, 8, 9]],
    );
    // Clamped to the window (Gemma 4): position 9 sees only 8 and 9 of its range.
    let mut clamped = w.clone();
    clamped.batch.prefix_lm.as_mut().unwrap().clamp_to_window = true;
    each_row_averages(
        &clamped,
        &[vec![5, 6], vec![6, 7, 8, 9], vec![7, 8, 9], vec![8, 9]],
    );
    // A range across the context and the step: position 6 sees key 7, after it.
    let mut across = c.clone();
    across.batch.prefix_lm.as_mut().unwrap().ranges = vec![vec![(4, 7)]];
    each_row_averages(&across, &[upto(7), upto(7), upto(8), upto(9)]);
    // A one-token range changes nothing; nor do another request's ranges.
    let mut single = c.clone();
    single.batch.prefix_lm.as_mut().unwrap().ranges = vec![vec![(8, 8)]];
    let mut plain = c.clone();
    plain.batch.prefix_lm = None;
    assert_eq!(reference_output(&single), reference_output(&plain));
    // A range past the step's keys (an image chunked prefill has not finished, as vLLM
    // passes it): its keys stop at the last computed one, 9; one wholly past changes nothing.
    let mut past = c.clone();
    past.batch.prefix_lm.as_mut().unwrap().ranges = vec![vec![(7, 30), (40, 50)]];
    each_row_averages(&past, &[upto(6), upto(9), upto(9), upto(9)]);
}

#[test]
fn r_swa_keeps_the_prefix_visible_past_the_window() {
    // Identical keys; positions 6..=9 are the step's. R-SWA with a window of 2 and a
    // prefix of 3: keys 0, 1, 2 and the two last.
    let mut c = case(&[10], &[4], cfg(1, 1, 2, 4), 12);
    same_keys(&mut c, 0..6, 0..4);
    let rswa = |prefix| {
        Some(attn_reference::Rswa {
            window: 2,
            prefix_lens: vec![prefix],
        })
    };
    c.batch.rswa = rswa(3);
    each_row_averages(
        &c,
        &[
            vec![0, 1, 2, 5, 6],
            vec![0, 1, 2, 6, 7],
            vec![0, 1, 2, 7, 8],
            vec![0, 1, 2, 8, 9],
        ],
    );
    // Prefix 0 is a plain window of 2; a prefix of the whole sequence, plain causal.
    let mut none = c.clone();
    none.batch.rswa = rswa(0);
    let mut window = c.clone();
    window.batch.rswa = None;
    window.config.sliding_window = Some(2);
    assert_eq!(reference_output(&none), reference_output(&window));
    let mut all = c.clone();
    all.batch.rswa = rswa(10);
    let mut causal = c.clone();
    causal.batch.rswa = None;
    assert_eq!(reference_output(&all), reference_output(&causal));
    // A prefix past the step's keys (vLLM passes the prompt's length while chunked prefill
    // is inside it): every computed key is in it, plain causal too.
    let mut past = c.clone();
    past.batch.rswa = rswa(25);
    assert_eq!(reference_output(&past), reference_output(&causal));
}
