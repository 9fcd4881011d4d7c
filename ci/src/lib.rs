//! # attn-ci
//!
//! What CI and the pull-request bot run, light enough to build without libtorch:
//!
//! - [`artifact`]: an artifact's zip read in memory, every entry checked (no path traversal);
//! - [`request`]: the `bot:test` comment grammar, parsed into a typed request or an error
//!   naming the offending word;
//! - [`allowlist`]: who may trigger the bot;
//! - [`binding`]: the commit a request tests, bound to the comment (`SHA=` or the head then);
//! - [`time`]: GitHub's timestamps as seconds;
//! - [`catalog`]: the backend names a comment may use;
//! - [`plan`]: a request as `attn-diff` command lines, one per shard;
//! - [`summary`]: the JSON summary `attn-diff check --format json` writes, as read here;
//! - [`merge`]: N shard summaries merged into one;
//! - [`reply`]: the markdown reply, the usage reply and the commit status;
//! - [`sanitize`]: the pull request's own markdown made safe to post under the bot's name;
//! - [`post`]: what the posting workflow posts, from artifacts it verifies first;
//! - [`answer`]: the poster's answer, decided from the run's title and the comment itself;
//! - [`run`]: the bot's steps (plan, shard, report) over files, as the workflow and
//!   `cargo xtask bot` call them through the `attn-bot` binary.

pub mod allowlist;
pub mod answer;
pub mod artifact;
pub mod binding;
pub mod catalog;
pub mod cli;
pub mod merge;
pub mod plan;
pub mod post;
pub mod reply;
pub mod request;
pub mod run;
pub mod sanitize;
pub mod summary;
pub mod time;
