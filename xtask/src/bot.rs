//! `cargo xtask bot --comment 'bot:test …'`: what the pull-request bot's workflow runs, here and
//! in the same order: `attn-bot plan` (with no author to check), `attn-bot shard` for every
//! shard one after the other, `attn-bot report`; then the reply it would post is printed.
//! A comment it cannot parse prints the usage reply and fails.

use crate::{cargo_command, libtorch};
use std::path::{Path, PathBuf};

const USAGE: &str = "usage: cargo xtask bot --comment 'bot:test KEY=VALUE…' [--out DIR]";

fn attn_bot(args: &[&str]) -> Result<i32, String> {
    let status = cargo_command()
        .args([
            "run",
            "--locked",
            "--quiet",
            "--package",
            "attn-ci",
            "--bin",
            "attn-bot",
            "--",
        ])
        .args(args)
        .current_dir(libtorch::repo_root())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    status
        .code()
        .ok_or_else(|| format!("`attn-bot {}` was killed", args.join(" ")))
}

/// `key=value` lines as `attn-bot plan` writes them for `$GITHUB_OUTPUT`.
fn output(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
}

fn path(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut comment = None;
    let mut out = libtorch::repo_root().join("target/attn-bot");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--comment" => comment = Some(it.next().ok_or(USAGE)?.clone()),
            "--out" => out = PathBuf::from(it.next().ok_or(USAGE)?),
            _ => return Err(format!("unknown argument `{a}`\n{USAGE}")),
        }
    }
    let comment = comment.ok_or(USAGE)?;
    // A fresh folder: a stale shard summary must not leak into this report.
    if out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| format!("cannot clear {}: {e}", out.display()))?;
    }
    let request_dir = out.join("request");
    let outputs = out.join("outputs.txt");
    let code = attn_bot(&[
        "plan",
        "--local",
        "--comment",
        &comment,
        "--out",
        path(&request_dir)?,
        "--github-output",
        path(&outputs)?,
    ])?;
    if code != 0 {
        return Err(format!("attn-bot plan failed (exit {code})"));
    }
    let outputs =
        std::fs::read_to_string(&outputs).map_err(|e| format!("cannot read plan outputs: {e}"))?;
    if output(&outputs, "run").as_deref() != Some("true") {
        // The usage reply (or nothing, for a comment not addressed to the bot).
        match std::fs::read_to_string(request_dir.join("reply.md")) {
            Ok(reply) => println!("{reply}"),
            Err(_) => println!("(not a bot:test comment: the bot would not answer)"),
        }
        return Err("the comment was not run".into());
    }
    let shards: u32 = output(&outputs, "shards")
        .and_then(|s| s.parse().ok())
        .ok_or("attn-bot plan gave no shard count")?;
    libtorch::setup()?;
    let request = request_dir.join("request.json");
    let shard_dir = out.join("shards");
    for i in 0..shards {
        let code = attn_bot(&[
            "shard",
            "--request",
            path(&request)?,
            "--index",
            &i.to_string(),
            "--shards",
            path(&shard_dir)?,
        ])?;
        // 0 agreed, 1 diverged, 3 the shard broke (the report says so); 2 is ours to fix.
        if code == 2 {
            return Err(format!("attn-bot shard {i} failed"));
        }
    }
    let code = attn_bot(&[
        "report",
        "--request",
        path(&request)?,
        "--shards",
        path(&shard_dir)?,
        "--out",
        path(&out.join("report"))?,
        "--replay-artifact",
        "attn-diff-replays",
    ])?;
    eprintln!("bot files: {}", out.display());
    match code {
        0 => Ok(()),
        1 => Err("the run diverged (the reply above is what the bot would post)".into()),
        _ => Err(format!("attn-bot report exited {code}")),
    }
}
