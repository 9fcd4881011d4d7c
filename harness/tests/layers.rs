//! The harness's folders depend one way: `pipeline/` runs checks and builds failures with
//! `failure/`; `render/` prints results; `failure/` and `render/` never reach into the
//! pipeline, and the pipeline never into `render/`. Checked on the source, so a new `use`
//! that breaks it fails here rather than in a reader's head. Nor does any crate read what a
//! backend is out of its name: that is its `BackendRole`.

use std::path::{Path, PathBuf};

/// The pipeline's modules, also reachable through the crate's aliases (`crate::check`…).
const PIPELINE: &[&str] = &[
    "crate::pipeline",
    "crate::bench",
    "crate::check",
    "crate::coverage",
    "crate::replay",
    "crate::runner",
    "crate::shrink",
    "crate::strategy",
    "crate::upstream",
    "crate::mutants",
];

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// Lines of the files under `folder` naming any of `forbidden`.
fn uses(folder: &str, forbidden: &[&str]) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(folder);
    let mut found = Vec::new();
    for file in sources(&dir) {
        let text = std::fs::read_to_string(&file).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if forbidden.iter().any(|f| code.contains(f)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn the_pipeline_never_uses_render() {
    let found = uses("pipeline", &["crate::render"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn render_and_failure_never_use_the_pipeline() {
    for folder in ["render", "failure"] {
        let found = uses(folder, PIPELINE);
        assert!(found.is_empty(), "{}", found.join("\n"));
    }
    let found = uses("failure", &["crate::render"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_check_loop_is_one_file() {
    // Every kind of subject runs through `drive`: no other file of the pipeline spawns
    // workers or walks the subjects in order itself.
    let found: Vec<String> = uses("pipeline", &["fn drive", "thread::scope"])
        .into_iter()
        .filter(|l| !l.contains("pipeline/drive.rs") && !l.contains("pipeline/bench.rs"))
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_role_is_read_from_a_backend_name() {
    // What a backend is (a mutant, external, built on libtorch, trace-only) is data: its
    // `role()`, `uses_libtorch()`, the catalogue's `trace_only`. No crate tells it by a
    // name's prefix. Unit tests (after `#[cfg(test)]`) may spell names as they like.
    const READ_FROM_A_NAME: &[&str] = &[
        "name.starts_with(",
        "name().starts_with(",
        "backend.starts_with(",
        ".starts_with(\"mutant",
        ".starts_with(\"spyre",
        ".starts_with(\"trace-",
        ".starts_with(\"external",
        "trim_start_matches(\"mutant",
        "strip_prefix(\"mutant",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for krate in ["backends", "harness", "ci", "results", "reference"] {
        for file in sources(&root.join(krate).join("src")) {
            let text = std::fs::read_to_string(&file).expect("readable source");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap_or("");
                if READ_FROM_A_NAME.iter().any(|f| line.contains(f)) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
