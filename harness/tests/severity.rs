//! A shrink keeps the failure's severity: a non-finite failure shrinks to a non-finite case,
//! one beyond 10x the tolerance to one still beyond it.
#![cfg(feature = "mutants")]

use attn_backends::mutants::mutant;
use attn_harness::pipeline::check::run::run_check;
use attn_harness::pipeline::check::CheckOptions;
use attn_harness::pipeline::shrink::ShrinkBudget;

/// The severity words of each class's signature, in report order.
fn severities(name: &str, shrink: ShrinkBudget) -> Vec<String> {
    let run = run_check(CheckOptions {
        traces: 0,
        shrink,
        ..CheckOptions::new(
            vec![mutant(name).expect("known mutant")],
            200,
            std::env::temp_dir().join(format!("attn-diff-severity-{name}")),
        )
    });
    run.summary.backends[0]
        .failures
        .iter()
        .map(|f| {
            let sig = &f
                .class
                .as_ref()
                .expect("every failure has a class")
                .signature;
            sig.split(", ").nth(1).unwrap_or("").to_string()
        })
        .collect()
}

#[test]
fn shrinks_keep_the_severity_they_were_found_with() {
    for (name, severity) in [
        ("padding-row-nan", "non-finite"),
        ("scale-applied-twice", "beyond 10x the tolerance"),
    ] {
        // The first failure leads the first class, shrunk or not.
        let found = severities(name, ShrinkBudget::NONE);
        assert_eq!(
            found.first().map(String::as_str),
            Some(severity),
            "{name}: {found:?}"
        );
        let shrunk = severities(name, ShrinkBudget::default());
        assert_eq!(shrunk.first(), found.first(), "{name}: {shrunk:?}");
    }
}
