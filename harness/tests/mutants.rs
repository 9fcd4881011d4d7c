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
        // A window that starts past the first KV split of 256 keys.
        "mutant:sink-twice-split-kv" => (1, 300, 8),
        // Past 8,192 query tokens in one step: the case is that big by definition.
        "mutant:tokens-past-8192-skipped" => (2, 8_192, 8),
        // Killed by a big batch (a thousand decodes), bisected down to the one sequence
        // past 256 keys the bug needs.
        "mutant:alibi-positions-in-bf16" => (1, 300, 8),
        _ => (3, 40, 64),
    }
}

fn too_big(mutant: &str, size: &CaseSize) -> bool {
    let (seqs, len, work) = bounds(mutant);
    size.sequences > seqs || size.max_seq_len > len || size.heads * size.head_size > work
}

#[test]
fn every_mutant_is_killed_and_shrunk_small() {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let s = run_mutants(
        DEFAULT_CASES,
        1,
        (&[], jobs),
        std::env::temp_dir().join("attn-diff-mutants-test"),
        &|_| {},
    )
    .summary;
    assert!(s.rows.len() >= 34);
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
        if r.trace_only && r.cases_to_kill.is_some() {
            problems.push(format!(
                "{} is trace-only but a single-step case killed it",
                r.mutant
            ));
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

/// The trace-only mutants: no single-step property case of the default budget and no case
/// of the upstream suite kills them; the default traces do, each shrunk to a trace of at
/// most three steps whose report names the diverging step and the blocks' history.
#[test]
fn trace_only_mutants_escape_single_steps_and_die_on_traces() {
    use attn_backends::mutants::{mutant, CATALOGUE};
    use attn_harness::check::{run_check, CheckOptions};
    use attn_harness::compare::Tolerance;
    use attn_harness::runner::{evaluate, Outcome};
    let names: Vec<&str> = CATALOGUE
        .iter()
        .filter(|m| m.trace_only)
        .map(|m| m.name)
        .collect();
    assert!(names.len() >= 5, "{names:?}");
    let upstream: Vec<_> = attn_harness::upstream::small_suite()
        .iter()
        .map(|u| {
            let case = u.build();
            let expected = attn_reference::reference_output(&case);
            (u.label(), case, expected)
        })
        .collect();
    for name in names {
        let backend = mutant(name).unwrap();
        for (label, case, expected) in &upstream {
            let (o, _) = evaluate(backend.as_ref(), case, expected, Tolerance::upstream());
            assert!(
                !matches!(o, Outcome::Diverged(_)),
                "{name} killed by upstream {label}"
            );
        }
        let run = run_check(CheckOptions::new(
            vec![backend],
            DEFAULT_CASES,
            std::env::temp_dir().join("attn-diff-mutants-traces"),
        ));
        let b = &run.summary.backends[0];
        assert_eq!(
            b.first_failing_case, None,
            "{name}: a single-step case diverged"
        );
        assert!(
            b.traces.failed > 0,
            "{name} survived {} traces",
            b.traces.sent
        );
        let f = &b.failures[0];
        println!("{}", f.text);
        let attn_results::Origin::Trace { steps, .. } = f.origin else {
            panic!("{name} was not killed by a trace: {}", f.origin);
        };
        assert!(
            steps <= 3,
            "{name} shrunk only to {steps} steps:\n{}",
            f.text
        );
        assert!(f.text.contains("history of blocks"), "{}", f.text);
    }
}
