//! Fuzz the case and trace loaders: any bytes, as a JSON case, as a JSON trace and as a
//! safetensors case, must give a case (or trace) or a typed error, never a panic, a hang or a
//! huge allocation. Whatever loads must keep every allocation a backend sizes from it within
//! `MAX_ALLOC_BYTES` (a 633 TB cache once passed validation and aborted `cpu`), and a case
//! that loads must also be accepted by the oracle (validation is the oracle's only guard).
#![no_main]

use attn_reference::{validate_cache_size, Case, Trace, MAX_ALLOC_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(case) = Case::from_json(text) {
            check_loaded(&case);
        }
        if let Ok(trace) = Trace::from_json(text) {
            check_trace(&trace);
        }
    }
    if let Ok((case, _)) = attn_harness::export::case_from_safetensors(data) {
        check_loaded(&case);
    }
});

/// K and V of every slot at the compute dtype, as validation counts it.
fn cache_bytes(config: &attn_reference::AttentionConfig, num_blocks: usize) -> u128 {
    [
        num_blocks,
        config.block_size,
        config.num_kv_heads,
        config.head_size,
        2,
        config.dtype.size_bytes(),
    ]
    .iter()
    .fold(1u128, |acc, &n| acc.saturating_mul(n as u128))
}

fn check_loaded(case: &Case) {
    assert!(cache_bytes(&case.config, case.layout.num_blocks) <= MAX_ALLOC_BYTES as u128);
    assert_eq!(
        validate_cache_size(&case.config, case.layout.num_blocks, "layout.num_blocks"),
        Ok(())
    );
    // Keep the oracle's work bounded: a valid case can legitimately be large.
    let work: usize = case
        .batch
        .seq_lens
        .iter()
        .zip(&case.batch.query_lens)
        .map(|(l, q)| l * q)
        .sum::<usize>()
        * case.config.num_heads
        * case.config.head_size;
    if work < 1 << 22 {
        let out = attn_reference::reference_output(case);
        assert_eq!(
            out.len(),
            case.num_real_tokens() * case.config.num_heads * case.config.head_size
        );
    }
}

fn check_trace(trace: &Trace) {
    assert!(cache_bytes(&trace.config, trace.num_blocks) <= MAX_ALLOC_BYTES as u128);
    for step in 0..trace.steps.len().min(8) {
        let case = trace.step_case(step);
        assert_eq!(
            case.validate(),
            Ok(()),
            "step {step} of a valid trace is a valid case"
        );
        check_loaded(&case);
    }
}
