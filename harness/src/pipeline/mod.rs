//! From cases to results. Four rooms, imports one way: [`recipe`] (what a case is before it is
//! built) ← [`draw`] (drawing recipes and traces) and [`shrink`] (simplifying a failing one) ←
//! [`check`] (the check loop and its subjects). [`runner`] judges a backend's answer against
//! the oracle; [`coverage`] sorts cases into buckets; `bench`, `mutants` and `replay` are the
//! other commands' loops; [`upstream`] is vLLM's suite.

pub mod bench;
pub mod check;
pub mod coverage;
pub mod draw;
#[cfg(feature = "mutants")]
pub mod mutants;
pub mod recipe;
pub mod recording;
pub mod replay;
pub mod runner;
pub mod shrink;
pub mod upstream;
