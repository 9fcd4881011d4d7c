//! The Python user's path, end to end: build the attn-diff wheel and sdist as a release does
//! (`tools/release/build.sh`: a py3-none-manylinux_2_17_x86_64 wheel carrying the `attn-diff`
//! binary, built without libtorch; `auditwheel show` must report that tag), install the wheel
//! into a fresh virtual environment, and from a project outside the checkout, with no `cargo`
//! on PATH, run two pytest tests through the plugin (`wheel_project/`): the numpy adapter
//! passes, the same adapter with a planted bug fails with the shrunk report, whose replay
//! command then runs as printed. Then the composite action's check step (`action/check.sh`,
//! the script `action.yml` runs) on a stand-in plugin repository (`plugin_repo/`): it passes
//! the clean backend and finds the planted bug, writing the summaries, JUnit report and
//! replay files the action uploads.
//!
//! Needs the adapters' Python environment (`cargo xtask setup`) and PyPI (build.sh's pinned,
//! hash-checked tools: maturin, ziglang, auditwheel; the venv's numpy, safetensors and pytest;
//! pip's cache makes reruns quick). The binary's cargo build keeps its own target directory,
//! `target/wheel`, so reruns rebuild only what changed and never wait on the lock of the
//! build running this test.

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

    // 1. The wheel and the sdist, as the release builds them (tools/release/build.sh: maturin,
    //    zig linking against glibc 2.17's symbols, then auditwheel show and objdump must agree
    //    on the tag). cargo on PATH here.
    let started = Instant::now();
    let built = run_ok(
        Command::new("bash")
            .arg(repo.join("tools/release/build.sh"))
            .arg(&dist)
            .env("CARGO_TARGET_DIR", repo.join("target/wheel"))
            .current_dir(&work),
        "tools/release/build.sh (Rust, python3 with venv, binutils and PyPI needed)",
    );
    let build_log = text(&built);
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
        name.starts_with(&format!("attn_diff-{version}-py3-none-"))
            && name.ends_with("manylinux_2_17_x86_64.whl"),
        "a py3-none-manylinux_2_17 wheel of version {version} (a binary, no extension): {name}"
    );
    // auditwheel show's verdict, as build.sh printed it (its lines wrap).
    let words = build_log.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains(&format!(
            "{name} is consistent with the following platform tag: \"manylinux_2_17_x86_64\""
        )) && words.contains("glibc floor 2.17"),
        "auditwheel show reports manylinux_2_17_x86_64:\n{build_log}"
    );
    assert!(
        dist.join(format!("attn_diff-{version}.tar.gz")).is_file(),
        "the sdist is built:\n{build_log}"
    );
    // The crates the sdist packages carry their build script: copies of the shared one.
    let rpath = fs::read_to_string(repo.join("tools/build/rpath.rs")).unwrap();
    for krate in ["harness", "backends"] {
        assert_eq!(
            fs::read_to_string(repo.join(krate).join("build.rs")).unwrap(),
            rpath,
            "{krate}/build.rs is a copy of tools/build/rpath.rs"
        );
    }
    eprintln!("wheel built in {:.1?}: {name}", started.elapsed());

    // The release's publish step, as a tag's run does it: a dry run by default
    // (tools/release/publish-mode), and a tag that is not the version is refused.
    let mode = work.join("publish-mode.out");
    let verified = run_ok(
        Command::new("bash")
            .arg(repo.join("tools/release/verify.sh"))
            .arg(&dist)
            .arg(format!("v{version}"))
            .arg("--mode")
            .arg(&mode),
        "tools/release/verify.sh",
    );
    assert_eq!(fs::read_to_string(&mode).unwrap(), "publish=false\n");
    assert!(
        text(&verified).contains("dry run, nothing is uploaded")
            && text(&verified).contains(&format!("ready to publish attn-diff {version}")),
        "{}",
        text(&verified)
    );
    let wrong = Command::new("bash")
        .arg(repo.join("tools/release/verify.sh"))
        .arg(&dist)
        .arg("v0.0.0-not-this")
        .output()
        .unwrap();
    assert!(
        !wrong.status.success() && text(&wrong).contains("is not v"),
        "{}",
        text(&wrong)
    );

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

    // 6. The composite action's check step, on a stand-in plugin repository.
    the_action_checks_a_plugin_repository(&repo, &work, &bin, &path, &home);
}

/// Copy the folder `from` (dot-files included) to `to`.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "__pycache__" {
                copy_tree(&entry.path(), &target);
            }
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// `action.yml` hands every input to the check step as an ATTN_DIFF_* variable that
/// `python -m attn_diff_adapter.ci` reads, runs `action/check.sh`, and installs this release;
/// then that script, as the action runs it, passes the plugin's clean backend and fails on its
/// planted bug with the files the action uploads and the job summary.
fn the_action_checks_a_plugin_repository(
    repo: &Path,
    work: &Path,
    bin: &Path,
    path: &str,
    home: &Path,
) {
    let action = fs::read_to_string(repo.join("action.yml")).unwrap();
    let ci = fs::read_to_string(repo.join("adapters/python/attn_diff_adapter/ci.py")).unwrap();
    let inputs = &action[action.find("\ninputs:\n").unwrap()..action.find("\noutputs:").unwrap()];
    let mut wired = 0;
    for line in action.lines() {
        let Some((var, value)) = line.trim().split_once(": ${{ inputs.") else {
            continue;
        };
        let input = value.trim_end_matches(" }}");
        assert!(
            inputs.contains(&format!("\n  {input}:\n")),
            "action.yml uses an undeclared input {input}"
        );
        if let Some(key) = var.strip_prefix("ATTN_DIFF_") {
            wired += 1;
            let key = key.to_lowercase();
            assert!(
                key == "python" || ci.contains(&format!("_env(\"{key}\"")),
                "ci.py does not read {var}"
            );
        }
    }
    assert!(wired >= 12, "{wired} inputs reach the check step");
    assert!(
        action.contains("\"$GITHUB_ACTION_PATH/action/check.sh\""),
        "the action runs action/check.sh"
    );
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        action.contains(&format!("default: attn-diff=={version}\n")),
        "the action installs this release, attn-diff=={version}"
    );

    let plugin = work.join("plugin-repo");
    copy_tree(&repo.join("xtask/tests/plugin_repo"), &plugin);
    for (planted, expected) in [(false, 0), (true, 1)] {
        let what = if planted { "planted-bug" } else { "clean" };
        let out_dir = work.join(format!("action-out-{what}"));
        let step_summary = work.join(format!("step-summary-{what}.md"));
        let mut command = bare("bash", path, home);
        command
            .arg(repo.join("action/check.sh"))
            .env("ATTN_DIFF_PYTHON", bin.join("python"))
            .env("ATTN_DIFF_ADAPTER", "python attn_adapter.py")
            .env("ATTN_DIFF_NAME", "my-plugin")
            .env("ATTN_DIFF_ONLY", "dtypes=f32\n")
            .env("ATTN_DIFF_CASES", "60")
            .env("ATTN_DIFF_TRACES", "4")
            .env("ATTN_DIFF_OUT", &out_dir)
            .env("GITHUB_STEP_SUMMARY", &step_summary)
            .current_dir(&plugin);
        if planted {
            command.env("MY_PLUGIN_PLANTED_BUG", "1");
        }
        let started = Instant::now();
        let out = command.output().expect("action/check.sh runs");
        let log = text(&out);
        eprintln!("action/check.sh ({what}) in {:.1?}", started.elapsed());
        assert_eq!(out.status.code(), Some(expected), "{what}:\n{log}");
        let summary = fs::read_to_string(out_dir.join("summary.md")).unwrap();
        let junit = fs::read_to_string(out_dir.join("junit.xml")).unwrap();
        assert!(out_dir.join("summary.json").is_file(), "{what}");
        assert_eq!(
            fs::read_to_string(&step_summary).unwrap().trim(),
            summary.trim(),
            "the markdown summary is the job summary"
        );
        assert!(
            junit.starts_with("<?xml") && junit.contains("attn-diff.external:my-plugin"),
            "{junit}"
        );
        let replays: Vec<_> = fs::read_dir(out_dir.join("replays"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".json"))
            .collect();
        if planted {
            assert!(
                summary.contains("**diverged**") && summary.contains("replay:  "),
                "{summary}"
            );
            assert!(junit.contains("<failure message=\""), "{junit}");
            assert!(!replays.is_empty(), "replay files for the artifact");
            assert!(log.contains("external:my-plugin diverged"), "{log}");
        } else {
            assert!(summary.contains(": passed"), "{summary}");
            assert!(!junit.contains("<failure"), "{junit}");
            assert!(replays.is_empty(), "{replays:?}");
        }
    }
}
