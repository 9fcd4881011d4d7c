//! `attn-diff`: exit 0 when every backend agreed with the oracle, 1 on a divergence, 2 on a
//! usage or set-up error.

use attn_harness::cli::{run, Cli};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            // Every error that reaches here is one of usage or set-up (bad input, unknown name).
            eprintln!("attn-diff: {e:#}");
            ExitCode::from(2)
        }
    }
}
