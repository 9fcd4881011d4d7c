//! Fuzz the case loaders: any bytes, as a JSON case and as a safetensors case, must give a
//! case or a typed error, never a panic, a hang or a huge allocation. A case that loads must
//! also be accepted by the oracle (validation is the oracle's only guard).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(case) = attn_reference::Case::from_json(text) {
            check_loaded(&case);
        }
    }
    if let Ok((case, _)) = attn_harness::export::case_from_safetensors(data) {
        check_loaded(&case);
    }
});

fn check_loaded(case: &attn_reference::Case) {
    // Keep the oracle's work bounded: a valid case can legitimately be large.
    let work: usize = case.batch.seq_lens.iter().zip(&case.batch.query_lens).map(|(l, q)| l * q).sum::<usize>() * case.config.num_heads * case.config.head_size;
    if work < 1 << 22 {
        let out = attn_reference::reference_output(case);
        assert_eq!(out.len(), case.num_real_tokens() * case.config.num_heads * case.config.head_size);
    }
}
