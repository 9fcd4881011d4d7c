//! # attn-harness
//!
//! The differential harness behind the `attn-diff` binary, in three layers:
//! - [`pipeline`]: from cases to results without I/O: property strategies, comparison with
//!   per-dtype tolerances, running and judging a backend, shrinking, the upstream suite, and
//!   the check, bench, mutants and replay loops that fill the result model (`attn-results`);
//! - [`render`]: summaries as text, markdown or JSON, failure reports and hints, tables and
//!   plots; [`artifacts`] writes replay files and heat maps afterwards;
//! - [`cli`] parses the command line and [`commands`] holds one file per subcommand.

pub mod artifacts;
pub mod cli;
pub mod commands;
pub mod export;
pub mod external;
pub mod failure;
pub mod interrupt;
pub mod pipeline;
pub mod progress;
pub mod render;
pub mod suggest;
