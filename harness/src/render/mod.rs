//! Everything that turns results into something to read: summaries as text, markdown or JSON,
//! failure reports with their hints, tables and plots. Nothing here runs a backend.

pub mod bench;
pub mod check;
pub mod hint;
pub mod junit;
#[cfg(feature = "mutants")]
pub mod mutants;
pub mod plot;
pub mod report;
pub mod table;
pub mod trace_report;

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
