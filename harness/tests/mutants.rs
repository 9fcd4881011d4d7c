//! Every mutant of the catalogue is killed by the default budget and shrunk to a small case:
//! one a person reads on one screen, or, for a bug that lives at a threshold, a case at the
//! threshold itself (257 keys for a 256-key partition, not 40k).
#![cfg(feature = "mutants")]

use attn_harness::check::DEFAULT_CASES;
use attn_harness::mutants::run_mutants;
use attn_results::CaseSize;

/// Bounds on a shrunk case: (sequences, longest sequence, heads × head size).
fn bounds(mutant: &str) -> (usize, usize, usize) {
    match mutant {
        // Thresholds: the smallest case past them.
        "mutant:page-offset-past-128" => (1, 129, 8),
        "mutant:partition-merge-no-rescale" => (1, 257, 8),
        "mutant:simd-tail-dropped" => (1, 8, 9),
        // Element offsets past 2^31 need the huge cache's 8 kv heads of about 128.
        "mutant:int32-write-offset" | "mutant:int32-read-offset" => (1, 8, 8 * 128),
        // Statistical: enough terms for one rounding excursion to pass the tolerance.
        "mutant:low-precision-accumulation" => (3, 40, 256),
        _ => (3, 40, 64),
    }
}

fn too_big(mutant: &str, size: &CaseSize) -> bool {
    let (seqs, len, work) = bounds(mutant);
    size.sequences > seqs || size.max_seq_len > len || size.heads * size.head_size > work
}

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
    assert!(s.rows.len() >= 29);
    let public = s.rows.iter().filter(|r| r.public_bug.is_some()).count();
    assert!(public >= 14, "{public} mutants name a public bug");
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
        if too_big(&r.mutant, size) {
            problems.push(format!("{} shrunk only to {size:?}", r.mutant));
        }
    }
    println!("{}", attn_harness::render::mutants::render_text(&s));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_sharing_mutant_breaks_only_with_shared_blocks() {
    use attn_harness::check::{run_check, CheckOptions};
    let run = run_check(CheckOptions::new(
        vec![attn_backends::mutants::mutant("shared-block-gathered-once").unwrap()],
        DEFAULT_CASES,
        std::env::temp_dir().join("attn-diff-mutants-share"),
    ));
    let f = &run.summary.backends[0].failures[0];
    assert_eq!(f.size.sequences, 2, "{}", f.text);
}
