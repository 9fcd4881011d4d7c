//! Everything that can be wrong with a case, each naming the field at fault.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum CaseError {
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("malformed case JSON at line {line}, column {column}: {message}")]
    Parse {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{field} is too large: {size} exceeds the limit of {limit}")]
    TooLarge {
        field: String,
        size: u64,
        limit: u64,
    },
    /// An allocation sized from the case would exceed the bound of
    /// [`crate::MAX_ALLOC_BYTES`]: `what` spells the product.
    #[error(
        "{field} is too large: {what} is {bytes}, over the limit of {limit} for one allocation"
    )]
    TooManyBytes {
        field: String,
        what: String,
        bytes: String,
        limit: String,
    },
    #[error("{field} must be at least 1, got 0")]
    Zero { field: &'static str },
    #[error(
        "config.num_heads ({num_heads}) is not a multiple of config.num_kv_heads ({num_kv_heads})"
    )]
    HeadsNotMultiple {
        num_heads: usize,
        num_kv_heads: usize,
    },
    #[error("config.sliding_window must be at least 1 key, got 0")]
    WindowZero,
    #[error("{field} is invalid: {reason}")]
    InvalidParam { field: String, reason: String },
    #[error("batch is empty: batch.seq_lens has no sequences")]
    EmptyBatch,
    #[error("{field} has {actual} entries, expected {expected}")]
    LengthMismatch {
        field: String,
        expected: usize,
        actual: usize,
    },
    #[error(
        "batch.query_lens[{seq}] is 0 but batch.seq_lens[{seq}] = {seq_len}: only a padded request \
         (query_len 0 and seq_len 0, as vLLM pads a batch's request count) has no new token"
    )]
    QueryLenZero { seq: usize, seq_len: usize },
    #[error(
        "batch.seq_lens[{seq}] is a padded request (query_len 0, seq_len 0) before the real request \
         {real}: vLLM puts padded requests after every real one"
    )]
    PaddedRequestBeforeReal { seq: usize, real: usize },
    #[error("batch.query_lens: every request is padded (query_len 0); a step has at least one real request")]
    OnlyPaddedRequests,
    #[error("batch.query_lens[{seq}] = {query_len} exceeds batch.seq_lens[{seq}] = {seq_len}")]
    QueryLenExceedsSeqLen {
        seq: usize,
        query_len: usize,
        seq_len: usize,
    },
    #[error("batch.query_lens[{seq}] = {query_len} but encoder-only attention needs query_len == seq_len ({seq_len})")]
    EncoderNeedsFullQuery {
        seq: usize,
        query_len: usize,
        seq_len: usize,
    },
    #[error("layout.block_table has rows of different widths: row {seq} has {actual}, row 0 has {expected}")]
    RaggedBlockTable {
        seq: usize,
        expected: usize,
        actual: usize,
    },
    #[error("layout.block_table[{seq}] has {actual} blocks but seq_len {seq_len} needs {needed}")]
    TableRowTooShort {
        seq: usize,
        needed: usize,
        actual: usize,
        seq_len: usize,
    },
    #[error("layout.block_table[{seq}][{index}] = {block} is past the cache (layout.num_blocks = {num_blocks})")]
    BlockOutOfRange {
        seq: usize,
        index: usize,
        block: u64,
        num_blocks: usize,
    },
    #[error("layout.block_table[{seq}][{index}] is the null block 0, but a query of sequence {seq} reads keys there (only blocks wholly before every key its queries see may be skipped)")]
    NullBlockUsed { seq: usize, index: usize },
    #[error("layout.slot_mapping[{token}] = {actual}, but the block table puts that token (sequence {seq}, position {pos}) at slot {expected}")]
    SlotMismatch {
        token: usize,
        seq: usize,
        pos: usize,
        expected: i64,
        actual: i64,
    },
    #[error("layout.slot_mapping[{token}] = {actual}: a cross-attention (encoder_decoder) step writes nothing (the encoder's K/V is in the cross cache from the request's first step), so every slot must be -1")]
    CrossAttentionWrite { token: usize, actual: i64 },
    #[error("layout.slot_mapping[{token}] = {actual}: padding tokens must have slot -1")]
    PaddingSlot { token: usize, actual: i64 },
    #[error("slot {slot} is used twice: by {first} and by {second}")]
    SlotCollision {
        slot: i64,
        first: String,
        second: String,
    },
    #[error("block {block} is shared by sequences {seq_a} and {seq_b} (logical block {index}) but its contents differ at {field}")]
    SharedBlockDiffers {
        block: u32,
        seq_a: usize,
        seq_b: usize,
        index: usize,
        field: &'static str,
    },
    #[error("block {block} is shared by sequences {seq_a} and {seq_b} but is not a full context block of both (logical blocks {index_a} and {index_b})")]
    SharedBlockNotFullContext {
        block: u32,
        seq_a: usize,
        seq_b: usize,
        index_a: usize,
        index_b: usize,
    },
    #[error("block {block} is shared by sequences {seq_a} and {seq_b} at logical blocks {index_a} and {index_b}: shared blocks must be a common prefix (same logical blocks from 0)")]
    SharedBlockNotPrefix {
        block: u32,
        seq_a: usize,
        seq_b: usize,
        index_a: usize,
        index_b: usize,
    },
    #[error("layout.slot_mapping[{token}] = {slot} writes a new token of sequence {seq} into block {block}, which sequence {other} shares as context")]
    NewTokenInSharedBlock {
        token: usize,
        seq: usize,
        other: usize,
        block: u32,
        slot: i64,
    },
    #[error("{field} has a non-finite value {value} at index {index}")]
    NonFinite {
        field: String,
        index: usize,
        value: f32,
    },
    #[error("{field}[{index}] = {value} is not representable in {dtype}")]
    NotRepresentable {
        field: String,
        index: usize,
        value: f32,
        dtype: crate::DType,
    },
}
