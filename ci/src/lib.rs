//! # attn-ci
//!
//! What CI and the pull-request bot run, light enough to build without libtorch:
//!
//! - [`request`]: the `bot:test` comment grammar, parsed into a typed request or an error
//!   naming the offending word;
//! - [`allowlist`]: who may trigger the bot;
//! - [`catalog`]: the backend names a comment may use;
//! - [`plan`]: a request as `attn-diff` command lines, one per shard;
//! - [`summary`]: the JSON summary `attn-diff check --format json` writes, as read here;
//! - [`merge`]: N shard summaries merged into one;
//! - [`reply`]: the markdown reply, the usage reply and the commit status;
//! - [`run`]: the bot's steps (plan, shard, report) over files, as the workflow and
//!   `cargo xtask bot` call them through the `attn-bot` binary.

pub mod allowlist;
pub mod catalog;
pub mod cli;
pub mod merge;
pub mod plan;
pub mod reply;
pub mod request;
pub mod run;
pub mod summary;
