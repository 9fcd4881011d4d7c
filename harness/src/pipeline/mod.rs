//! From cases to results, without I/O: strategies draw cases, the runner judges a backend's
//! answer against the oracle, shrinking finds the smallest case that still diverges, and the
//! check, bench, mutants and replay loops fill the result model (`attn-results`).

pub mod bench;
pub mod check;
pub mod control;
pub mod coverage;
pub mod covering;
pub mod drive;
pub mod extremes;
pub mod failure_classes;
pub mod logit_stats;
pub mod long_masks;
#[cfg(feature = "mutants")]
pub mod mutants;
pub mod precision;
pub mod property_check;
pub mod replay;
pub mod runner;
pub mod shrink;
pub mod strategy;
pub mod strategy_mla;
pub mod trace;
pub mod trace_check;
pub mod trace_production;
pub mod trace_shrink;
pub mod upstream;
pub mod upstream_check;
