//! A crash is its exception: two different Python exceptions, whose tracebacks begin with the
//! same line, are two classes, each named by what was raised, and each report leads with
//! the exception and keeps the traceback below it.

mod support;

use std::process::Command;
use support::{adapter_python_with, repo};

#[test]
fn two_python_exceptions_are_two_classes_named_by_what_was_raised() {
    let python = adapter_python_with("numpy, safetensors");
    let script = repo().join("harness/tests/adapters/two_crashes.py");
    let adapters = repo().join("adapters/python");
    let external = format!("two={python} {} {}", script.display(), adapters.display());
    let out_dir = std::env::temp_dir().join(format!("attn-diff-exceptions-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .current_dir(repo())
        .args([
            "check",
            "-q",
            "--backend",
            "external:two",
            "--external",
            &external,
        ])
        .args([
            "--cases", "60", "--traces", "0", "--format", "json", "--out",
        ])
        .arg(&out_dir)
        .output()
        .expect("attn-diff runs");
    let s: attn_results::CheckSummary = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    let b = &s.backends[0];
    let classes: Vec<String> = b
        .failures
        .iter()
        .map(|f| f.class.as_ref().expect("a class").signature.clone())
        .collect();
    assert_eq!(classes.len(), 2, "{classes:#?}");
    for raised in [
        "IndexError: index_copy_()",
        "RuntimeError: The size of tensor a",
    ] {
        let class = classes
            .iter()
            .find(|c| c.contains(raised))
            .unwrap_or_else(|| panic!("no class names {raised}: {classes:#?}"));
        assert!(!class.contains("Traceback"), "{class}");
    }
    for f in &b.failures {
        let what = f
            .text
            .lines()
            .find(|l| l.starts_with("what:"))
            .expect("a what line");
        assert!(what.contains("Error: "), "{}", f.text);
        // The traceback is kept, below the exception.
        assert!(
            f.text.lines().any(|l| l.starts_with("  | ")
                && l.ends_with("Traceback (most recent call last):")),
            "{}",
            f.text
        );
    }
}
