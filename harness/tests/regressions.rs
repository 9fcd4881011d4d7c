//! Every replay file under `fixtures/regressions/` runs against every registered backend:
//! copying a shrunk failure's replay file there pins it as a test.

use attn_harness::pipeline::replay::replay_case;
use attn_harness::pipeline::runner::Outcome;
use attn_reference::Case;
use std::path::PathBuf;

fn regression_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/regressions");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn pinned_cases_pass_on_every_backend() {
    let files = regression_files();
    assert!(
        !files.is_empty(),
        "fixtures/regressions has no replay files"
    );
    let backends = attn_backends::all_backends();
    assert!(!backends.is_empty(), "no backend registered");
    let mut failures = Vec::new();
    for f in &files {
        let case = Case::load(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for r in replay_case(
            &case,
            &f.display().to_string(),
            &backends,
            attn_reference::Judge::Tolerance,
        ) {
            if let (Outcome::Diverged(d), rep) = (&r.outcome, &r.report) {
                failures.push(rep.as_ref().map_or_else(
                    || format!("{}: {}: {}", f.display(), r.backend, d.message),
                    |x| x.text.clone(),
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
