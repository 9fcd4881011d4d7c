//! One file per subcommand: each takes its parsed arguments, runs the pipeline, writes the
//! artifacts and prints the rendered result as an [`Outcome`]; `Err`: a usage or set-up error
//! (exit 2).

mod bench;
mod check;
mod export;
mod handshake;
mod list;
#[cfg(feature = "mutants")]
mod mutants;
mod new_adapter;
mod outcome;
mod record;
mod replay;
pub mod setup;

pub use outcome::Outcome;

use crate::cli::{Cli, Command};
#[cfg(not(feature = "mutants"))]
use setup::usage;

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    let global = cli.global;
    crate::progress::set_quiet(global.quiet);
    match cli.command {
        Command::Check(args) => {
            // Only files attn-diff wrote, and not those of the last run that wrote there.
            crate::artifacts::prune_failures(&args.out);
            check::run(args, global)
        }
        Command::Replay(args) => replay::run(args).map(Outcome::from),
        Command::Export(args) => export::run(args).map(Outcome::from),
        Command::Bench(args) => bench::run(args, global).map(Outcome::from),
        Command::List(args) => list::run(args).map(Outcome::from),
        Command::Handshake(args) => handshake::run(args).map(Outcome::from),
        Command::NewAdapter(args) => new_adapter::run(args).map(Outcome::from),
        Command::Record(args) => record::run(args),
        #[cfg(feature = "mutants")]
        Command::Mutants(args) => mutants::run(args, global).map(Outcome::from),
        #[cfg(not(feature = "mutants"))]
        Command::Mutants(_) => Err(usage(
            "this attn-diff was built without the mutants (deliberately wrong backends); they \
             need the `mutants` feature: cargo run --release -p attn-harness --features mutants \
             -- mutants",
        )),
    }
}
