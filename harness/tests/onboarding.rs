//! Onboarding a new backend: `new-adapter` writes an adapter that `check` runs green from
//! any directory, and `handshake` shows what an adapter declares.
//!
//! Needs `python3` with `numpy` and `safetensors` (`cargo xtask setup` provisions them as
//! `.python-env`, used here when present).

use attn_harness::external::adapter_python;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "attn-diff-onboarding-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// attn-diff in `cwd`.
fn attn_diff(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-diff"))
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("attn-diff runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_generated_adapter_passes_check_from_any_directory() {
    let root = temp("new");
    std::fs::create_dir_all(&root).unwrap();
    let dir = root.join("my-adapter");
    let o = attn_diff(&root, &["new-adapter", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let script = dir.join("adapter.py");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(
        readme.contains(&format!(
            "attn-diff check --backend external:my-adapter --external my-adapter='python3 {}'",
            script.display()
        )),
        "{readme}"
    );
    let adapter = std::fs::read_to_string(&script).unwrap();
    for key in [
        "head_sizes",
        "block_size_multiple_of",
        "kinds",
        "features",
        "max_seqs",
        "kv_cache_dtypes",
    ] {
        assert!(
            adapter.contains(&format!("\"{key}\"")),
            "capabilities lack {key}"
        );
    }

    // A second time into the same, now non-empty, directory is refused.
    let again = attn_diff(&root, &["new-adapter", dir.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("not empty"), "{}", text(&again));

    // Run from a directory with no attn-diff.toml and nothing of the checkout.
    let elsewhere = root.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let flag = format!("x={} {}", adapter_python(&repo()), script.display());
    let out = root.join("failures");
    let o = attn_diff(
        &elsewhere,
        &[
            "check",
            "--backend",
            "external:x",
            "--external",
            &flag,
            "--cases",
            "20",
            "--traces",
            "2",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("external:x"), "{}", text(&o));

    // The handshake alone: name, protocol version, description and the declared space.
    let o = attn_diff(&elsewhere, &["handshake", "--external", &flag]);
    let shown = text(&o);
    assert_eq!(o.status.code(), Some(0), "{shown}");
    for needle in [
        "backend:      external:x",
        "name:         my-adapter",
        "protocol:     version 2",
        "description:  paged attention in numpy",
        "\"features\":[\"sliding_window\",\"logits_soft_cap\",\"alibi\",\"sinks\"]",
        "case space:",
    ] {
        assert!(shown.contains(needle), "`{needle}` missing from:\n{shown}");
    }
    let o = attn_diff(
        &elsewhere,
        &[
            "handshake",
            "--backend",
            "external:x",
            "--external",
            &flag,
            "--format",
            "json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["name"], "my-adapter");
    assert_eq!(v["version"], 2);
    assert_eq!(
        v["capabilities"]["kv_cache_dtypes"],
        serde_json::json!(["auto"])
    );
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn handshake_names_what_is_missing() {
    let here = repo();
    // Nothing named, several declared in ./attn-diff.toml: which one?
    let o = attn_diff(&here, &["handshake"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("external:numpy-ref"), "{}", text(&o));
    // A near miss is suggested.
    let o = attn_diff(&here, &["handshake", "--backend", "external:numpy-rf"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("did you mean `numpy-ref`?"),
        "{}",
        text(&o)
    );
    // An adapter that cannot start is a set-up error.
    let o = attn_diff(
        &here,
        &["handshake", "--external", "x=/nonexistent/adapter"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
