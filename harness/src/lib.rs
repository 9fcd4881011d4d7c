//! # attn-harness
//!
//! The differential harness behind the `attn-diff` binary. Imports run one way, down this list
//! (`tests/layers.rs` checks it on the source, and that no two files import each other):
//! - [`cli`] parses the command line and [`commands`] holds one file per subcommand;
//! - [`pipeline`]: from cases to results, in rooms: recipes, drawing them, shrinking them, and
//!   the check loop with its three kinds of subject; running and judging a backend, coverage,
//!   the upstream suite, and the bench, mutants and replay loops that fill the result model
//!   (`attn-results`);
//! - [`failure`]: what a divergence says (its typed record, its text, hints, classes);
//! - [`render`]: summaries as text, markdown, JSON or JUnit, tables and plots; [`artifacts`]
//!   writes replay files and heat maps; [`external`] declares and starts adapters.

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
