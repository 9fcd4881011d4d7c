//! The harness's folders depend one way: `pipeline/` runs checks and builds failures with
//! `failure/`; `render/` prints results; `failure/` and `render/` never reach into the
//! pipeline, and the pipeline never into `render/`. Inside the pipeline, `recipe/` uses no
//! other room, `draw/` and `shrink/` only `recipe/`, and only `check/` runs the loop. No two
//! files of `harness/src` import each other, however indirectly. Checked on the source (every
//! `use` and path, resolved to the file it lands in), so a new import that breaks a rule fails
//! here rather than in a reader's head. Nor does any crate read what a backend is out of its
//! name: that is its `BackendRole`.

mod imports;

use imports::{cycles, import_graph, rust_files, Graph};
use std::collections::BTreeMap;
use std::path::Path;

/// Lines of the files under `folder` naming any of `forbidden`.
fn uses(folder: &str, forbidden: &[&str]) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(folder);
    let mut found = Vec::new();
    for file in rust_files(&dir) {
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

fn graph() -> Graph {
    import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The imports (file, target) of files under `from` that land in a file under one of `to`.
fn imports_between<'g>(graph: &'g Graph, from: &str, to: &[&str]) -> Vec<(&'g str, &'g str)> {
    graph
        .iter()
        .filter(|(file, _)| file.starts_with(from))
        .flat_map(|(file, targets)| targets.iter().map(move |t| (file.as_str(), t.as_str())))
        .filter(|(_, t)| to.iter().any(|folder| t.starts_with(folder)))
        .collect()
}

/// The imports of files under `room` into the pipeline that land outside `allowed`.
fn pipeline_imports_outside<'g>(
    graph: &'g Graph,
    room: &str,
    allowed: &[&str],
) -> Vec<(&'g str, &'g str)> {
    imports_between(graph, room, &["pipeline/"])
        .into_iter()
        .filter(|(_, t)| !allowed.iter().any(|a| t.starts_with(a)))
        .collect()
}

/// `imports` as an assertion shows them, one per line.
fn listed(imports: &[(&str, &str)]) -> String {
    imports
        .iter()
        .map(|(file, target)| format!("{file} imports {target}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_pipeline_never_uses_render() {
    let g = graph();
    let found = imports_between(&g, "pipeline/", &["render/"]);
    assert!(found.is_empty(), "{}", listed(&found));
}

#[test]
fn render_and_failure_never_use_the_pipeline() {
    let g = graph();
    for folder in ["render/", "failure/"] {
        let found = imports_between(&g, folder, &["pipeline/"]);
        assert!(found.is_empty(), "{}", listed(&found));
    }
    let found = imports_between(&g, "failure/", &["render/"]);
    assert!(found.is_empty(), "{}", listed(&found));
}

#[test]
fn the_rooms_of_the_pipeline_import_one_way() {
    let g = graph();
    // A recipe is what a case is: it knows no draw, shrink or check.
    let mut found = pipeline_imports_outside(&g, "pipeline/recipe/", &["pipeline/recipe/"]);
    // Drawing and shrinking build on recipes only: never on the check loop or each other.
    found.extend(pipeline_imports_outside(
        &g,
        "pipeline/draw/",
        &["pipeline/recipe/", "pipeline/draw/"],
    ));
    found.extend(pipeline_imports_outside(
        &g,
        "pipeline/shrink/",
        &["pipeline/recipe/", "pipeline/shrink/"],
    ));
    // The kinds of subject share `subject.rs` and `lifecycle.rs`, never each other's files.
    let subjects = ["property.rs", "trace.rs", "invariance.rs", "upstream.rs"];
    for s in subjects {
        for other in subjects.iter().filter(|&&o| o != s) {
            found.extend(imports_between(
                &g,
                &format!("pipeline/check/{s}"),
                &[&format!("pipeline/check/{other}")],
            ));
        }
    }
    assert!(found.is_empty(), "{}", listed(&found));
}

#[test]
fn no_file_of_the_harness_is_in_an_import_cycle() {
    let g = graph();
    // Enough files and edges that an empty graph (a broken parser) cannot pass.
    assert!(g.len() > 60, "{} files", g.len());
    assert!(g.values().map(|t| t.len()).sum::<usize>() > 200);
    let cycles = cycles(&g);
    assert!(
        cycles.is_empty(),
        "import cycles among files (each: files that import each other):\n{}",
        cycles
            .iter()
            .map(|c| c.join(" -> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_import_graph_sees_every_kind_of_path() {
    // The resolver on a small tree of its own: a grouped use, `super::`, a child module by
    // its bare name, an inline `crate::` path, and a test module (ignored).
    let dir = std::env::temp_dir().join(format!("attn-diff-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write(
        "a/mod.rs",
        "pub mod x;\npub mod y;\nuse x::One;\nuse crate::{b::{self, Two}};\n",
    );
    write("a/x.rs", "use super::y::Three;\npub struct One;\n");
    write(
        "a/y.rs",
        "pub fn f() { crate::b::g() }\n#[cfg(test)]\nuse crate::a::x::One;\n",
    );
    write("b.rs", "// use crate::a::y;\npub fn g() {}\n");
    let g = import_graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let expected: BTreeMap<String, Vec<String>> = [
        ("a/mod.rs", vec!["a/x.rs", "b.rs"]),
        ("a/x.rs", vec!["a/y.rs"]),
        ("a/y.rs", vec!["b.rs"]),
        ("b.rs", vec![]),
        ("lib.rs", vec![]),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_string(), t.into_iter().map(String::from).collect()))
    .collect();
    let got: BTreeMap<String, Vec<String>> = g
        .iter()
        .map(|(f, t)| (f.clone(), t.iter().cloned().collect()))
        .collect();
    assert_eq!(got, expected);
    assert!(cycles(&g).is_empty());
    let mut looped = g.clone();
    looped
        .get_mut("a/y.rs")
        .unwrap()
        .insert("a/mod.rs".to_string());
    assert_eq!(cycles(&looped), vec![vec!["a/mod.rs", "a/x.rs", "a/y.rs"]]);
}

#[test]
fn the_check_loop_is_one_file() {
    // Every kind of subject runs through `drive`: no other file of the pipeline spawns
    // workers or walks the subjects in order itself.
    let found: Vec<String> = uses("pipeline", &["fn drive", "thread::scope"])
        .into_iter()
        .filter(|l| !l.contains("pipeline/check/drive.rs") && !l.contains("pipeline/bench.rs"))
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_role_is_read_from_a_backend_name() {
    // What a backend is (a mutant, external, built on libtorch, trace-only) is data: its
    // `role()`, `uses_libtorch()`, the catalogue's `trace_only`, a parsed `BackendRef`. No
    // crate tells it by a name's prefix or builds one by hand. Unit tests (after
    // `#[cfg(test)]`) may spell names as they like.
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
        // The prefixes themselves, as literals or constants: `BackendRef` spells them.
        "\"external:",
        "\"mutant:",
        "_PREFIX",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for krate in ["backends", "harness", "ci", "results", "reference"] {
        for file in rust_files(&root.join(krate).join("src")) {
            let text = std::fs::read_to_string(&file).expect("readable source");
            // `BackendRef` is where a name's prefix is read and written, once.
            if file.ends_with("results/src/backend_ref.rs") {
                continue;
            }
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
