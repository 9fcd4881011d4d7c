//! `cargo xtask <task>`: developer tasks that need nothing heavy to build.
//!
//! - `setup`    assemble a CPU-only libtorch for tch and the adapters' Python environment
//!   (once; cached outside the repo)
//! - `check`    setup if needed, then `attn-diff check` over every registered backend
//! - `test`     setup if needed, then the whole workspace's tests
//! - `fixtures` rewrite the golden fixtures (refused under CI)
//! - `bot`      run a `bot:test` comment locally as the pull-request bot would, print its reply
//! - `lint`     actionlint and zizmor on the workflows, clippy with warnings denied, cargo-deny,
//!   rustfmt check

mod bot;
mod libtorch;
mod lint;
mod python;

use std::process::{Command, ExitCode};

fn usage() -> ExitCode {
    eprintln!(
        "usage: cargo xtask <task> [args]\n\n\
         tasks:\n  \
         setup            assemble libtorch {} (CPU) and the adapters' Python packages\n  \
         check [ARGS]     set up, then run `attn-diff check ARGS` over every backend\n  \
         test [ARGS]      set up, then run the workspace's tests (`cargo test ARGS`)\n  \
         fixtures         rewrite fixtures/golden from the oracle (not under CI)\n  \
         bot --comment C  run a `bot:test` comment as the pull-request bot would; print its reply\n  \
         lint [WHICH]     actionlint, zizmor, clippy -D warnings, deny, fmt --check (WHICH: any of them)",
        libtorch::VERSION
    );
    ExitCode::from(2)
}

/// The cargo that runs xtask (or `cargo`).
fn cargo_command() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Everything the README's commands need: libtorch for tch, and the Python environment whose
/// `bin` goes first on PATH for the commands xtask runs (so tests and adapters find numpy
/// without anyone activating anything). Returns that PATH.
fn setup() -> Result<std::ffi::OsString, String> {
    libtorch::setup()?;
    let env = python::setup()?;
    Ok(python::path_with(&env))
}

fn cargo(args: &[&str], extra: &[String]) -> Result<(), String> {
    cargo_with_path(args, extra, None)
}

/// `cargo ARGS EXTRA` in the repo root, with PATH replaced when `path` is given.
fn cargo_with_path(
    args: &[&str],
    extra: &[String],
    path: Option<&std::ffi::OsStr>,
) -> Result<(), String> {
    let mut command = cargo_command();
    if let Some(path) = path {
        command.env("PATH", path);
    }
    let status = command
        .args(args)
        .args(extra)
        .current_dir(libtorch::repo_root())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        return Err(String::new());
    };
    let rest = &args[1..];
    match task.as_str() {
        "setup" => setup().map(|_| ()),
        "check" => {
            let path = setup()?;
            cargo_with_path(
                &[
                    "run",
                    "--locked",
                    "--package",
                    "attn-harness",
                    "--bin",
                    "attn-diff",
                    "--",
                    "check",
                ],
                rest,
                Some(&path),
            )
        }
        "test" => {
            let path = setup()?;
            cargo_with_path(
                &["test", "--locked", "--workspace", "--all-features"],
                rest,
                Some(&path),
            )
        }
        "bot" => bot::run(rest),
        "lint" => lint::run(rest),
        "fixtures" => {
            if std::env::var_os("CI").is_some() {
                return Err("refusing to rewrite fixtures under CI; run `cargo xtask fixtures` locally and review `git diff fixtures/`".into());
            }
            let status = cargo_command()
                .args([
                    "test",
                    "--locked",
                    "--package",
                    "attn-reference",
                    "--test",
                    "golden",
                ])
                .env("UPDATE_GOLDEN", "1")
                .current_dir(libtorch::repo_root())
                .status()
                .map_err(|e| format!("cannot run cargo: {e}"))?;
            if status.success() {
                eprintln!("fixtures rewritten; review them with `git diff fixtures/`");
                Ok(())
            } else {
                Err("fixture rewrite failed".into())
            }
        }
        _ => Err(String::new()),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_empty() => usage(),
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
