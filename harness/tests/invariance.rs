//! Invariance pairs: what `cpu` declares holds at every seed (and its batch-invariant mode
//! holds the batch relation too), and a backend that declares a relation and breaks it is
//! failed, once per relation, with a replay file that rebuilds both forms and fails again.

use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_reference::relation::Relation;
use attn_reference::Case;
use attn_results::Origin;
use std::process::Command;

fn pairs_only(backends: &[&str], pairs: u32, seed: u64, out: &std::path::Path) -> CheckOptions {
    let backends = backends
        .iter()
        .map(|n| attn_backends::backend_by_name(n).expect("a registered backend"))
        .collect();
    CheckOptions {
        seed,
        traces: 0,
        pairs,
        ..CheckOptions::new(backends, 0, out.to_path_buf())
    }
}

/// `attn-diff replay -q FILE --backend BACKEND`.
fn replay(file: &std::path::Path, backend: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .args(["replay", "-q"])
        .arg(file)
        .args(["--backend", backend])
        .output()
        .expect("attn-diff runs")
}

/// The distinct class signatures of a backend's failures.
fn class_signatures(
    b: &attn_results::BackendSummary,
) -> std::collections::BTreeSet<Option<String>> {
    b.failures
        .iter()
        .map(|f| f.class.as_ref().map(|c| c.signature.clone()))
        .collect()
}

#[test]
fn cpu_keeps_every_relation_it_declares_at_every_seed() {
    let out = std::env::temp_dir().join(format!("attn-diff-invariance-{}", std::process::id()));
    let mut tried = std::collections::BTreeMap::<(String, Relation), usize>::new();
    for seed in 1..=6 {
        let run = run_check(pairs_only(&["cpu", "cpu-batch-invariant"], 40, seed, &out));
        for b in &run.summary.backends {
            let name = &b.backend.name;
            assert_eq!(b.failed(), 0, "{name} at seed {seed}: {:?}", b.failures);
            // Most pairs reach it (a few cases have no relation that applies).
            assert!(b.pairs.sent >= 30, "{name} at seed {seed}: {:?}", b.pairs);
            for (relation, t) in &b.invariance {
                let declared = match name.as_str() {
                    "cpu" => [Relation::Order, Relation::Placement, Relation::Repetition]
                        .contains(relation),
                    _ => *relation != Relation::Chunking,
                };
                assert_eq!(t.declared, declared, "{name} {relation}");
                if declared {
                    assert_eq!(t.held, t.tried, "{name} {relation} at seed {seed}: {t:?}");
                }
                *tried.entry((name.clone(), *relation)).or_default() += t.tried;
            }
        }
    }
    // Every relation was tried on both, so the assertions above judged something.
    for name in ["cpu", "cpu-batch-invariant"] {
        for relation in Relation::ALL {
            let n = tried
                .get(&(name.to_string(), relation))
                .copied()
                .unwrap_or(0);
            assert!(n >= 10, "{name} {relation}: {n} pairs over six seeds");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_declared_relation_that_moves_a_bit_is_a_variant_failure_its_file_replays() {
    let out = std::env::temp_dir().join(format!("attn-diff-variant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = run_check(pairs_only(&["mutant:split-by-batch-position"], 40, 1, &out));
    run.write_artifacts();
    let b = &run.summary.backends[0];
    assert!(b.pairs.failed > 0, "{:?}", b.pairs);
    assert_eq!(b.first_failing_pair, Some(1));
    let order = &b.invariance[&Relation::Order];
    assert!(order.declared && order.held < order.tried, "{order:?}");
    // Moved drift of a relation it does not declare is measured, never a failure.
    for f in &b.failures {
        assert!(
            matches!(
                f.origin,
                Origin::Invariance {
                    relation: Relation::Order,
                    ..
                }
            ),
            "{:?}",
            f.origin
        );
    }
    // One cause, one class: every moved pair is the order relation's.
    let classes = class_signatures(b);
    assert_eq!(classes.len(), 1, "{classes:?}");
    let f = &b.failures[0];
    let hint = f.hint.as_deref().unwrap_or_default();
    assert!(hint.contains("position"), "{hint}");
    assert!(
        f.size.sequences >= 2 && f.size.sequences <= 4,
        "{:?}",
        f.size
    );

    // The replay file records the pair; the other form is written beside it.
    let file = out.join("mutant_split-by-batch-position-seed1-pair1.json");
    let case = Case::load(&file).expect("the replay file loads");
    let pair = case.recorded.as_ref().and_then(|r| r.pair).expect("a pair");
    assert_eq!(pair.relation, Relation::Order);
    assert!(out
        .join("mutant_split-by-batch-position-seed1-pair1.order1.json")
        .is_file());
    let replay = |backend: &str| replay(&file, backend);
    let again = replay("mutant:split-by-batch-position");
    let text = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(1), "{text}");
    assert!(text.contains("variant:"), "{text}");
    // On a backend that keeps the relation, the same file holds.
    let cpu = replay("cpu");
    let text = String::from_utf8_lossy(&cpu.stdout);
    assert_eq!(cpu.status.code(), Some(0), "{text}");
    assert!(text.contains("cpu: held"), "{text}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_held_relation_turns_measured_drift_into_a_failure_with_its_file() {
    // cpu does not declare the batch relation and moves under it at this seed; its
    // batch-invariant mode keeps it.
    let out = std::env::temp_dir().join(format!("attn-diff-hold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = run_check(CheckOptions {
        hold: vec![Relation::Batch],
        ..pairs_only(&["cpu", "cpu-batch-invariant"], 100, 2, &out)
    });
    run.write_artifacts();
    let (cpu, invariant) = (&run.summary.backends[0], &run.summary.backends[1]);
    assert!(invariant.failures.is_empty(), "{:?}", invariant.failures);
    assert!(cpu.invariance[&Relation::Batch].declared);
    assert!(!cpu.failures.is_empty(), "{:?}", cpu.invariance);
    for f in &cpu.failures {
        assert!(f.message.contains("--hold"), "{}", f.message);
        let Origin::Invariance {
            index,
            relation: Relation::Batch,
            ..
        } = f.origin
        else {
            panic!("{:?}", f.origin)
        };
        let case = Case::load(&out.join(format!("cpu-seed2-pair{index}.json"))).unwrap();
        let pair = case.recorded.and_then(|r| r.pair).expect("a pair");
        assert!(pair.held_to && pair.relation == Relation::Batch);
    }
    // Without the hold the same drift is measured, never failed.
    let run = run_check(pairs_only(&["cpu"], 100, 2, &out));
    assert!(run.summary.backends[0].failures.is_empty());
    let _ = std::fs::remove_dir_all(&out);
}

/// A reduction whose order changes from one call to the next (atomics, a scheduling
/// dependent split-K merge) is right on every call, so no property case or trace can fail
/// it; a repetition pair does, in one class whose hint names non-determinism, shrunk to one
/// request, and its replay file moves again.
#[test]
fn a_call_that_rounds_otherwise_when_repeated_fails_the_repetition_relation_only() {
    let out = std::env::temp_dir().join(format!("attn-diff-repetition-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let name = "mutant:split-every-other-call";
    let run = run_check(pairs_only(&[name], 60, 1, &out));
    run.write_artifacts();
    let b = &run.summary.backends[0];
    assert!(b.pairs.failed > 0, "{:?}", b.pairs);
    for (relation, t) in &b.invariance {
        assert_eq!(t.declared, *relation == Relation::Repetition, "{relation}");
    }
    let classes = class_signatures(b);
    assert_eq!(classes.len(), 1, "{:#?}", b.failures);
    let f = &b.failures[0];
    assert!(
        matches!(
            f.origin,
            Origin::Invariance {
                relation: Relation::Repetition,
                ..
            }
        ),
        "{:?}",
        f.origin
    );
    let hint = f.hint.as_deref().unwrap_or_default();
    assert!(
        hint.contains("the same call ran again") && hint.contains("non-determinism"),
        "{hint}"
    );
    // The report a person reads says it too.
    assert!(f.text.contains(&format!("hint:    {hint}")), "{}", f.text);
    assert_eq!(f.size.sequences, 1, "{:?}", f.size);
    let pair = b.first_failing_pair.expect("a first failing pair");
    let file = out.join(format!(
        "mutant_split-every-other-call-seed1-pair{pair}.json"
    ));
    let o = replay(&file, name);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("variant") && text.contains("repetition"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
