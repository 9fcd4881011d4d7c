//! Every mutant of the catalogue is killed by the default budget and shrunk to a small case.
#![cfg(feature = "mutants")]

use attn_harness::check::DEFAULT_CASES;
use attn_harness::mutants::run_mutants;

/// Bounds on a shrunk case: a person reads it on one screen.
const MAX_SEQUENCES: usize = 3;
const MAX_SEQ_LEN: usize = 40;
/// Low-precision accumulation is statistical: its minimal case keeps enough heads for one
/// rounding excursion to pass the tolerance.
const MAX_HEADS: usize = 16;
const MAX_HEAD_SIZE: usize = 8;

#[test]
fn every_mutant_is_killed_and_shrunk_small() {
    let s = run_mutants(
        DEFAULT_CASES,
        1,
        &[],
        std::env::temp_dir().join("attn-diff-mutants-test"),
        &|_| {},
    )
    .summary;
    assert!(s.rows.len() >= 15);
    let mut problems = Vec::new();
    for r in &s.rows {
        if !r.killed {
            problems.push(format!(
                "{} survived {} cases ({})",
                r.mutant, DEFAULT_CASES, r.description
            ));
            continue;
        }
        let size = r
            .shrunk
            .as_ref()
            .expect("a killed mutant has a shrunk case");
        if size.sequences > MAX_SEQUENCES
            || size.max_seq_len > MAX_SEQ_LEN
            || size.heads > MAX_HEADS
            || size.head_size > MAX_HEAD_SIZE
        {
            problems.push(format!("{} shrunk only to {size:?}", r.mutant));
        }
    }
    println!("{}", attn_harness::render::mutants::render_text(&s));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_sharing_mutant_breaks_only_with_shared_blocks() {
    let s = run_mutants(
        DEFAULT_CASES,
        1,
        &[],
        std::env::temp_dir().join("attn-diff-mutants-share"),
        &|_| {},
    )
    .summary;
    let r = s
        .rows
        .iter()
        .find(|r| r.mutant == "mutant:shared-block-gathered-once")
        .unwrap();
    let size = r.shrunk.as_ref().expect("killed");
    assert_eq!(size.sequences, 2, "{size:?}");
}
