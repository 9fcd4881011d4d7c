//! Everything that turns results into something to read: summaries as text, markdown or JSON,
//! tables and plots (a failure's own report is built where it is found: `failure`). Nothing
//! here runs a backend, and nothing here depends on the pipeline.

pub mod bench;
pub mod check;
pub mod junit;
#[cfg(feature = "mutants")]
pub mod mutants;
pub mod plot;
pub mod table;

use clap::ValueEnum;

/// How a command writes its result.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// Aligned tables for a terminal.
    Text,
    /// A JSON document (with `schema_version`), for machines.
    Json,
    /// GitHub markdown, for pull requests.
    Markdown,
}
