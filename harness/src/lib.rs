//! # attn-harness
//!
//! The differential harness behind the `attn-diff` binary: property strategies
//! ([`strategy`]), comparison with per-dtype tolerances ([`compare`]), running and judging a
//! backend ([`runner`]), shrinking ([`shrink`]), reports ([`report`], [`hint`]), the upstream
//! suite ([`upstream`]), the check command's loop ([`check`]) and its summaries ([`summary`]).

pub mod bench;
pub mod check;
pub mod cli;
pub mod compare;
pub mod export;
pub mod external;
pub mod hint;
#[cfg(feature = "mutants")]
pub mod mutants;
pub mod plot;
pub mod replay;
pub mod report;
pub mod runner;
pub mod shrink;
pub mod strategy;
pub mod summary;
pub mod table;
pub mod upstream;
