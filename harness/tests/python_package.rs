//! The Python package (`adapters/python`: the adapter helper, its capability checks and the
//! pytest helper a plugin's test suite calls) by its own pytest suite, against this build of
//! the binary. Needs the adapters' Python environment with pytest: `cargo xtask setup`.

use std::process::Command;
use support::{adapter_python_with, repo};

mod support;

#[test]
fn the_python_package_passes_its_own_tests() {
    let repo = repo();
    let python = adapter_python_with("pytest, numpy, safetensors");
    let out = Command::new(&python)
        .current_dir(&repo)
        .env("ATTN_DIFF", env!("CARGO_BIN_EXE_attn-diff"))
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "adapters/python/tests",
        ])
        .output()
        .expect("pytest runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // pytest's closing line, e.g. "22 passed, 1 skipped in 8.6s": most of it really ran.
    let passed: usize = text
        .lines()
        .rev()
        .find_map(|l| l.split(" passed").next()?.trim().parse().ok())
        .unwrap_or(0);
    assert!(passed >= 15, "too few Python tests ran:\n{text}");
}
