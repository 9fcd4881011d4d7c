//! The Python user's path, end to end: build the wheel of `adapters/python` (which carries the
//! `attn-diff` binary, built without libtorch), install it into a fresh virtual environment,
//! and from a project outside the checkout, with no `cargo` on PATH, run two pytest tests
//! through the plugin (`wheel_project/`): the numpy adapter passes, the same adapter with a
//! planted bug fails with the shrunk report, whose replay command then runs as printed.
//!
//! Needs the adapters' Python environment (`cargo xtask setup`) and PyPI (the build's
//! setuptools-rust, the venv's numpy, safetensors and pytest; pip's cache makes reruns quick).
//! The binary's cargo build keeps its own target directory, `target/wheel`, so reruns
//! rebuild only what changed and never wait on the lock of the build running this test.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// The pins of `xtask/src/python.rs` that a user's venv needs beside the wheel.
const USER_PACKAGES: &[&str] = &["numpy==2.3.5", "safetensors==0.7.0", "pytest==9.2.0"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repo")
        .to_path_buf()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run_ok(command: &mut Command, what: &str) -> Output {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed:\n{}", text(&out));
    out
}

/// A PATH of the system's own directories (and `first`), without cargo's: the venv must need
/// no Rust.
fn bare_path(first: &Path) -> String {
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", first.display());
    for dir in path.split(':') {
        assert!(
            !Path::new(dir).join("cargo").exists(),
            "{dir}/cargo exists: this PATH would not prove a machine without Rust"
        );
    }
    path
}

/// A command with only the environment a Python user's shell would have.
fn bare(program: impl AsRef<std::ffi::OsStr>, path: &str, home: &Path) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("LANG", "C.UTF-8");
    // pip's download cache, so the venv's packages are not fetched again on every run.
    if let Some(cache) = std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/pip")) {
        c.env("PIP_CACHE_DIR", cache);
    }
    c
}

#[test]
fn the_wheel_installs_into_a_bare_venv_and_its_pytest_plugin_catches_a_planted_bug() {
    let repo = repo();
    let python = repo.join(".python-env/bin/python3");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (or `cargo xtask test`)",
        python.display()
    );
    let work = repo.join("target/wheel-test");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).unwrap();
    let dist = work.join("dist");

    // 1. The wheel, as `pip wheel ./adapters/python` builds it (cargo on PATH here).
    let started = Instant::now();
    run_ok(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--disable-pip-version-check",
                "--quiet",
                "-w",
            ])
            .arg(&dist)
            .arg(repo.join("adapters/python"))
            .env("CARGO_TARGET_DIR", repo.join("target/wheel"))
            .current_dir(&work),
        "pip wheel ./adapters/python",
    );
    let wheels: Vec<PathBuf> = fs::read_dir(&dist)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    assert_eq!(wheels.len(), 1, "one wheel: {wheels:?}");
    let wheel = &wheels[0];
    let name = wheel.file_name().unwrap().to_string_lossy().to_string();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        name.starts_with(&format!("attn_diff_adapter-{version}-")) && !name.contains("-none-any"),
        "a platform wheel of version {version} (it carries a binary): {name}"
    );
    eprintln!("wheel built in {:.1?}: {name}", started.elapsed());

    // 2. A fresh venv holding the wheel and a user's test packages; no cargo on its PATH.
    let started = Instant::now();
    let venv = work.join("venv");
    let home = work.join("home");
    fs::create_dir_all(&home).unwrap();
    run_ok(
        Command::new(&python).args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    let bin = venv.join("bin");
    let path = bare_path(&bin);
    run_ok(
        bare(bin.join("python"), &path, &home)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--only-binary=:all:",
            ])
            .arg(wheel)
            .args(USER_PACKAGES),
        "pip install of the wheel into a fresh venv (is PyPI reachable?)",
    );
    eprintln!("venv installed in {:.1?}", started.elapsed());

    // The binary came with the wheel, links no libtorch, and both entry points run it.
    let exe = bin.join("attn-diff");
    assert!(exe.is_file(), "the wheel installs {}", exe.display());
    let dynamic = run_ok(
        Command::new("readelf").arg("-d").arg(&exe),
        "readelf -d (binutils)",
    );
    let needed: Vec<String> = text(&dynamic)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(str::to_string)
        .collect();
    assert!(!needed.is_empty(), "readelf shows the libraries it needs");
    assert!(
        !needed
            .iter()
            .any(|l| l.contains("torch") || l.contains("c10") || l.contains("gomp")),
        "the wheel's binary links libtorch: {needed:?}"
    );
    for (what, mut command) in [
        ("attn-diff --version", bare(&exe, &path, &home)),
        ("python -m attn_diff --version", {
            let mut c = bare(bin.join("python"), &path, &home);
            c.args(["-m", "attn_diff"]);
            c
        }),
    ] {
        let out = run_ok(command.arg("--version").current_dir(&home), what);
        assert_eq!(text(&out).trim(), format!("attn-diff {version}"), "{what}");
    }
    let list = run_ok(
        bare(&exe, &path, &home).arg("list").current_dir(&home),
        "attn-diff list",
    );
    assert!(
        text(&list).lines().any(|l| l.starts_with("cpu ")),
        "the wheel's binary has the cpu backend:\n{}",
        text(&list)
    );
    // A build without the mutants feature has a `mutants` that only says how to build them.
    let mutants = run_ok(
        bare(&exe, &path, &home)
            .args(["mutants", "--help"])
            .current_dir(&home),
        "attn-diff mutants --help",
    );
    assert!(
        text(&mutants).contains("Property cases per mutant"),
        "the wheel's binary has the mutants:\n{}",
        text(&mutants)
    );

    // 3. A user's project outside the checkout: two tests through the plugin.
    let project = work.join("project");
    fs::create_dir_all(&project).unwrap();
    for file in ["numpy_adapter.py", "test_numpy_adapter.py"] {
        fs::copy(
            repo.join("xtask/tests/wheel_project").join(file),
            project.join(file),
        )
        .unwrap();
    }
    let basetemp = work.join("pytest-tmp");
    let started = Instant::now();
    let out = bare(bin.join("python"), &path, &home)
        .args([
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rA",
            "--basetemp",
        ])
        .arg(&basetemp)
        .args(["--attn-diff-cases", "60", "--attn-diff-seed", "3"])
        .current_dir(&project)
        .output()
        .expect("pytest runs");
    let report = text(&out);
    eprintln!("pytest through the plugin in {:.1?}", started.elapsed());
    assert_eq!(out.status.code(), Some(1), "one test fails:\n{report}");
    assert!(
        report.contains("1 failed, 1 passed"),
        "the clean adapter passes and the planted bug fails:\n{report}"
    );
    assert!(
        report.contains("PASSED test_numpy_adapter.py::test_the_adapter_agrees_with_the_oracle")
            && report.contains("FAILED test_numpy_adapter.py::test_the_planted_bug_is_caught"),
        "{report}"
    );
    for needle in [
        "external:planted diverged",
        "shrunk",
        "replay:  ",
        "reached the backend",
    ] {
        assert!(
            report.contains(needle),
            "the report has {needle:?}:\n{report}"
        );
    }
    // Failures are written under pytest's tmp_path, never into the project.
    assert!(
        report.contains(&basetemp.display().to_string()),
        "replay files under --basetemp:\n{report}"
    );
    let stray: Vec<_> = fs::read_dir(&project)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !n.ends_with(".py") && n != "__pycache__")
        .collect();
    assert!(
        stray.is_empty(),
        "nothing written into the project: {stray:?}"
    );

    // 4. The replay command runs as printed, from another directory and a PATH without the
    //    venv, and shows the divergence again.
    let replay = report
        .lines()
        .find_map(|l| {
            l.split_once("replay:  ")
                .map(|(_, cmd)| cmd.trim().to_string())
        })
        .expect("a replay line");
    let out = bare("sh", "/usr/bin:/bin", &home)
        .args(["-c", &replay])
        .current_dir(&home)
        .output()
        .expect("sh runs");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the replay command `{replay}` reproduces the divergence:\n{}",
        text(&out)
    );
    assert!(text(&out).contains("diverged"), "{}", text(&out));

    // 5. No binary fails the test loudly; skipping is an explicit option.
    for (extra, expected) in [
        (None, "1 failed"),
        (Some("--attn-diff-missing=skip"), "1 skipped"),
    ] {
        let mut command = bare(bin.join("python"), &path, &home);
        command
            .args([
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-rA",
                "--basetemp",
            ])
            .arg(&basetemp)
            .args(["-k", "agrees"])
            .args(extra)
            .env("ATTN_DIFF", work.join("no-such-attn-diff"))
            .current_dir(&project);
        let out = command.output().expect("pytest runs");
        let t = text(&out);
        assert!(
            t.contains(expected) && t.contains("no-such-attn-diff"),
            "{extra:?}:\n{t}"
        );
    }
}
