//! One file per subcommand: each takes its parsed arguments, runs the pipeline, writes the
//! artifacts and prints the rendered result. `Ok(true)`: everything agreed (exit 0);
//! `Ok(false)`: a divergence (exit 1); `Err`: a usage or set-up error (exit 2).

mod bench;
mod check;
mod export;
mod handshake;
mod list;
#[cfg(feature = "mutants")]
mod mutants;
mod new_adapter;
mod replay;
pub mod setup;

use crate::cli::{Cli, Command};
#[cfg(not(feature = "mutants"))]
use setup::usage;

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<bool> {
    let global = cli.global;
    crate::progress::set_quiet(global.quiet);
    match cli.command {
        Command::Check(args) => {
            // Only files attn-diff wrote, and not those of the last run that wrote there.
            crate::artifacts::prune_failures(&args.out);
            check::run(args, global)
        }
        Command::Replay(args) => replay::run(args),
        Command::Export(args) => export::run(args),
        Command::Bench(args) => bench::run(args, global),
        Command::List(args) => list::run(args),
        Command::Handshake(args) => handshake::run(args),
        Command::NewAdapter(args) => new_adapter::run(args),
        #[cfg(feature = "mutants")]
        Command::Mutants(args) => mutants::run(args, global),
        #[cfg(not(feature = "mutants"))]
        Command::Mutants(_) => Err(usage(
            "this attn-diff was built without the mutants (deliberately wrong backends); they \
             need the `mutants` feature: cargo run --release -p attn-harness --features mutants \
             -- mutants",
        )),
    }
}
