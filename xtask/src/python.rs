//! The Python environment the external-backend adapters and their tests run in: a virtual
//! environment in the same cache as libtorch, holding the pinned packages below, made from
//! whatever `python3` is on PATH without touching that Python.
//!
//! Like libtorch, it is built in a temporary directory beside its cache entry, verified (every
//! package imports at its pinned version) and renamed into place, so an interrupted run leaves
//! nothing half-made. A venv stays usable after the rename because its interpreter finds
//! `pyvenv.cfg` and `site-packages` next to itself; only pip's script shebangs name the old
//! path, so pip is always run as `python -m pip`.
//!
//! `<repo>/.python-env` links to it; the harness resolves a bare `python3` in `attn-diff.toml`
//! to `.python-env/bin/python3`, and xtask puts its `bin` first on PATH for what it runs.

use crate::libtorch::{cache_root, install_entry, run};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every package the shipped adapters (`adapters/python/`) and the tests import, pinned.
/// numpy 2.3 has wheels for CPython 3.11 to 3.14; safetensors' wheels are abi3; pytest runs
/// the Python package's own tests (its pytest helper included) from `cargo test`.
pub const PACKAGES: &[(&str, &str)] = &[
    ("numpy", "2.3.5"),
    ("safetensors", "0.7.0"),
    ("pytest", "9.2.0"),
];

/// The repo's link to the environment (git-ignored), which the harness looks for.
pub const LINK: &str = ".python-env";

/// Written last into a finished environment: the pins it was made with.
const MARKER: &str = "attn-diff-packages.txt";

fn pins() -> String {
    PACKAGES
        .iter()
        .map(|(name, version)| format!("{name}=={version}\n"))
        .collect()
}

/// A name that changes with the pins and the base Python, so a new pin or a new Python gets a
/// fresh environment instead of a stale one.
fn entry_name(base_version: &str) -> String {
    // FNV-1a: stable across Rust versions, unlike DefaultHasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in pins().bytes().chain(base_version.bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("python-{:012x}", hash & 0xffff_ffff_ffff)
}

fn interpreter(env: &Path) -> PathBuf {
    env.join("bin").join("python3")
}

/// The version of the `python3` on PATH (the environment's base), e.g. "3.11.7".
fn base_version() -> Result<String, String> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .map_err(|e| format!("python3 is required for the adapters' environment: {e}"))?;
    if !out.status.success() {
        return Err("`python3` on PATH does not run; install Python 3.11 or newer".into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Every pinned package imports from `env` at its pinned version.
fn verify(env: &Path) -> Result<(), String> {
    let checks: String = PACKAGES
        .iter()
        .map(|(name, version)| {
            format!(
                "import {name}; v = {name}.__version__; \
                 assert v == '{version}', '{name} is ' + v + ', not {version}'\n"
            )
        })
        .collect();
    let out = Command::new(interpreter(env))
        .args(["-c", &checks])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", interpreter(env).display()))?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "the Python environment {} fails its check: {}",
            env.display(),
            err.lines().last().unwrap_or("(no message)")
        ))
    }
}

fn is_complete(env: &Path) -> bool {
    fs::read_to_string(env.join(MARKER)).is_ok_and(|text| text == pins()) && verify(env).is_ok()
}

/// A virtual environment at `env` from the `python3` on PATH.
fn make_venv(env: &Path) -> Result<(), String> {
    run(
        Command::new("python3").args(["-m", "venv"]).arg(env),
        "creating a virtual environment (Debian: apt-get install python3-venv)",
    )
}

/// `pip install` of `specs` into the environment `env` (binary wheels only when asked).
fn pip_install(env: &Path, specs: &[String], only_binary: bool) -> Result<(), String> {
    run(
        Command::new(interpreter(env))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(only_binary.then_some("--only-binary=:all:"))
            .args(specs),
        &format!("pip install of {} (is PyPI reachable?)", specs.join(" ")),
    )
}

fn build(tmp: &Path) -> Result<(), String> {
    make_venv(tmp)?;
    let specs: Vec<String> = PACKAGES.iter().map(|(n, v)| format!("{n}=={v}")).collect();
    eprintln!(
        "xtask: installing {} into the adapters' Python environment",
        specs.join(" ")
    );
    pip_install(tmp, &specs, true)?;
    verify(tmp)?;
    fs::write(tmp.join(MARKER), pins()).map_err(|e| format!("cannot write the marker: {e}"))
}

/// Ensure the environment exists, verified, and linked as `<repo>/.python-env`; returns it.
pub fn setup() -> Result<PathBuf, String> {
    let dest = cache_root()?.join(entry_name(&base_version()?));
    if !is_complete(&dest) {
        // A stale entry (half-made, or its base Python removed) is replaced.
        install_entry(&dest, build)?;
        // The rename must not have broken it (see the module docs).
        verify(&dest)?;
        eprintln!("xtask: Python environment ready in {}", dest.display());
    }
    crate::libtorch::link(&dest, LINK)?;
    Ok(dest)
}

/// The requirements file that pins `package==version` to the wheels of `sha256` (pip then
/// installs nothing else: `--require-hashes`, `--no-deps`, binary wheels only).
pub fn hashed_requirement(package: &str, version: &str, sha256: &[&str]) -> String {
    let mut line = format!("{package}=={version}");
    for h in sha256 {
        line.push_str(&format!(" \\\n    --hash=sha256:{h}"));
    }
    line.push('\n');
    line
}

/// A command-line tool from PyPI (`package==version`, one of the wheels `sha256` names), in a
/// virtual environment of its own in the set-up cache (made now if missing or not `works`);
/// returns the path of `binary`. The system Python is never modified.
pub fn tool(
    package: &str,
    version: &str,
    sha256: &[&str],
    binary: &str,
    works: impl Fn(&Path) -> bool,
) -> Result<PathBuf, String> {
    let env = cache_root()?.join(format!("{package}-{version}"));
    let bin = env.join("bin").join(binary);
    if works(&bin) {
        return Ok(bin);
    }
    eprintln!(
        "xtask: installing {package} {version} (hash-checked) into {}",
        env.display()
    );
    install_entry(&env, |tmp| {
        make_venv(tmp)?;
        let requirements = tmp.join("requirements.txt");
        fs::write(&requirements, hashed_requirement(package, version, sha256))
            .map_err(|e| format!("cannot write {}: {e}", requirements.display()))?;
        run(
            Command::new(interpreter(tmp))
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--require-hashes",
                    "--no-deps",
                    "--only-binary=:all:",
                    "-r",
                ])
                .arg(&requirements),
            &format!("pip install of {package}=={version} with its pinned hashes"),
        )
    })?;
    if works(&bin) {
        Ok(bin)
    } else {
        Err(format!(
            "{package} {version} installed but {} does not run",
            bin.display()
        ))
    }
}

/// PATH with the environment's `bin` first, for the commands xtask runs.
pub fn path_with(env: &Path) -> std::ffi::OsString {
    let mut dirs = vec![env.join("bin")];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}
