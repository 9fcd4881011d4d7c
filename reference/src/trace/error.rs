//! Everything that can be wrong with a trace, each naming the step and field at fault.

use crate::CaseError;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum TraceError {
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("malformed trace JSON at line {line}, column {column}: {message}")]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
    /// The config, or one step seen as a case, is invalid.
    #[error("{}{error}", step.map(|s| format!("steps[{s}] as a case: ")).unwrap_or_default())]
    Case {
        step: Option<usize>,
        error: CaseError,
    },
    #[error("{field} is too large: {size} exceeds the limit of {limit}")]
    TooLarge {
        field: String,
        size: usize,
        limit: usize,
    },
    #[error("{field} must be at least 1, got 0")]
    Zero { field: String },
    #[error("{field} has {actual} values, expected a multiple of {row} (one row per token)")]
    RaggedRows {
        field: String,
        actual: usize,
        row: usize,
    },
    #[error("sequences[{seq}] has {query} query rows but {kv} key/value rows")]
    SequenceLengths { seq: usize, query: usize, kv: usize },
    #[error("{field} = {seq} names no sequence (the trace has {num_seqs})")]
    UnknownSequence {
        field: String,
        seq: usize,
        num_seqs: usize,
    },
    #[error("steps[{step}] schedules sequence {seq} twice")]
    ScheduledTwice { step: usize, seq: usize },
    #[error("steps[{step}].seqs[{row}] runs past sequences[{seq}]: positions up to {end} but it has {len} tokens")]
    PastSequence {
        step: usize,
        row: usize,
        seq: usize,
        end: usize,
        len: usize,
    },
    #[error("steps[{step}].seqs[{row}].block_table has {actual} blocks, expected {expected} for {seq_len} tokens")]
    TableLength {
        step: usize,
        row: usize,
        expected: usize,
        actual: usize,
        seq_len: usize,
    },
    /// The cache, as the steps so far left it, does not hold this sequence's token where its
    /// table says: the step would read another token's K/V (a block freed and reused, never
    /// written, or written by a sequence that does not share this prefix).
    #[error("steps[{step}].seqs[{row}] (sequence {seq}) reads position {pos} at slot {slot}, which holds {holder}")]
    StaleContext {
        step: usize,
        row: usize,
        seq: usize,
        pos: usize,
        slot: i64,
        holder: String,
    },
    #[error("steps[{step}].freed lists block {block}, which is out of range or the null block")]
    FreedBlock { step: usize, block: u32 },
}
