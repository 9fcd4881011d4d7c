//! What a failure says, built where it is found: the typed [`FailureRecord`] of a divergence
//! (its case size, first and worst mismatch, hint, shrinking, files) and its text, the
//! minimal case on one screen. It needs the case, the oracle's output and the comparison,
//! which only exist while the check runs; the pipeline builds it here, and `render` only
//! prints what it holds. Depends on the result model and the case model, never on the
//! pipeline or on `render`.
//!
//! [`FailureRecord`]: attn_results::FailureRecord

pub mod arithmetic;
pub mod class;
pub mod exception;
pub mod hint;
pub mod logit_stats;
pub mod report;
pub mod trace;
