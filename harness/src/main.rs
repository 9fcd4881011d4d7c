//! `attn-diff`: exit 0 when every backend agreed with the oracle, 1 on a divergence, 2 on a
//! usage or set-up error.

use attn_harness::cli::Cli;
use attn_harness::commands::{run, Outcome};
use clap::Parser;
use std::process::ExitCode;

/// libtorch's OpenMP threads spin after each parallel region by default, stealing the cores
/// from the other backends' threads that run next (measured: 10–100x slower medians when
/// backends are interleaved). libgomp reads its policy when it loads, before `main`, so the
/// process re-executes itself once with a passive policy unless the user chose one, and only
/// when a libtorch backend will run (`--version`, `list` or `--backend cpu` pay nothing).
fn ensure_passive_openmp() {
    if std::env::var_os("OMP_WAIT_POLICY").is_some() {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        if let Ok(exe) = std::env::current_exe() {
            let err = std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env("OMP_WAIT_POLICY", "PASSIVE")
                .exec();
            // Only reached when exec failed: carry on with the default policy.
            eprintln!("attn-diff: note: could not re-execute with OMP_WAIT_POLICY=PASSIVE ({err}); timings may be noisy");
        }
    }
}

/// `println!` panics when stdout is a pipe whose reader has gone (`attn-diff list | head -1`):
/// that panic ends the program quietly with status 0, as the reader that stopped reading
/// wanted, for every command. SIGPIPE itself stays ignored (Rust's default): a write to an
/// adapter that died must be an error the run reports, not a signal that kills attn-diff.
fn quiet_on_closed_stdout() {
    let previous = std::panic::take_hook();
    let epipe = std::io::Error::from_raw_os_error(libc::EPIPE).to_string();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains(&epipe) {
            std::process::exit(0);
        }
        previous(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    if cli.runs_libtorch() {
        ensure_passive_openmp();
    }
    let result = run(cli);
    match result {
        Ok(Outcome::Passed) => ExitCode::SUCCESS,
        Ok(Outcome::Failed) => ExitCode::from(1),
        Ok(Outcome::Interrupted) => ExitCode::from(attn_harness::interrupt::EXIT_INTERRUPTED),
        // An error the interrupt caused is still said: an interrupted run never ends silent.
        Err(e) if attn_harness::interrupt::interrupted() => {
            eprintln!("attn-diff: interrupted: {e:#}");
            ExitCode::from(attn_harness::interrupt::EXIT_INTERRUPTED)
        }
        Err(e) => {
            // Every error that reaches here is one of usage or set-up (bad input, unknown name).
            eprintln!("attn-diff: {e:#}");
            ExitCode::from(2)
        }
    }
}
