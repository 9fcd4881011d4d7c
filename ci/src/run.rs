//! The bot's three steps over files, as the workflow's jobs and `cargo xtask bot` run them:
//!
//! 1. [`plan`]: the comment (gated by association and allow-list) becomes `request.json`, and
//!    `reply.md` when it is refused or cannot be parsed; nothing runs then.
//! 2. [`shard`]: shard I runs `attn-diff check --shard I/N --format json` through cargo and
//!    leaves `shard-I/summary.json` and its replay files (or `shard-I/error.txt`).
//! 3. [`report`]: every shard's summary merged; `summary.json`, `reply.md`, `status.json` and
//!    the replay files of the minimal failing cases, flat, in one folder.

use crate::allowlist::{authorized, AllowList};
use crate::binding::{bind_request, BoundBy, Evidence};
use crate::merge::merge;
use crate::plan::{cargo_run_args, check_args, REPLAY_DIR, SUMMARY_FILE};
use crate::reply::{
    error_status, render_error_reply, render_reply, render_unbound_reply, render_usage_reply,
    status_of, ReplyContext, Verdict,
};
use crate::request::{is_bot_command, parse, BotRequest};
use crate::summary::CheckSummary;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use thiserror::Error;

pub const REQUEST_FILE: &str = "request.json";
pub const REPLY_FILE: &str = "reply.md";
pub const STATUS_FILE: &str = "status.json";
pub const ERROR_FILE: &str = "error.txt";

/// Lines of a failed shard's stderr kept for the reply.
const STDERR_LINES: usize = 30;

#[derive(Debug, Error)]
pub enum RunError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{0}")]
    AllowList(#[from] crate::allowlist::AllowListError),
    #[error("the request was {0:?}, so there is nothing to run")]
    NotRunnable(Outcome),
    #[error("shard {index} is not one of the request's {count} shard(s)")]
    ShardIndex { index: u32, count: u32 },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("not posting: {0}")]
    Post(String),
    #[error("{0}")]
    Bind(#[from] crate::binding::BindError),
    #[error("{0}")]
    Input(String),
    #[error("shard {index}: attn-diff exited with {code}:\n{stderr}")]
    Shard {
        index: u32,
        code: String,
        stderr: String,
    },
}

/// What became of a comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Parsed and authorized: the shards run.
    Run,
    /// Addressed to the bot but not parseable: the usage reply, nothing runs.
    Rejected,
    /// From someone the bot does not run for: a short reply, nothing runs.
    Refused,
    /// Not addressed to the bot: no reply.
    Ignored,
    /// The plan step itself failed (the workflow writes this request): an error reply.
    Failed,
}

/// `request.json`: the outcome, the parsed request, and where the reply goes (as the
/// workflow's trusted step resolved it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestFile {
    pub outcome: Outcome,
    pub request: Option<BotRequest>,
    pub pr: Option<u64>,
    pub sha: Option<String>,
    pub comment_id: Option<u64>,
    pub author: Option<String>,
    /// When the comment was made (the event's `comment.created_at`).
    #[serde(default)]
    pub comment_at: Option<String>,
    /// How `sha` was bound to the comment.
    #[serde(default)]
    pub bound_by: Option<BoundBy>,
}

/// Who may run the bot.
pub enum Gate {
    /// A local run (`cargo xtask bot`): no one to check.
    Local,
    /// From a comment: the author's association and the allow-list both must let them.
    Comment {
        allowlist: AllowList,
        author: String,
        association: String,
    },
}

pub struct PlanInput {
    pub comment: String,
    pub gate: Gate,
    pub pr: Option<u64>,
    /// The commit to test when there is no evidence to bind one (a local run).
    pub sha: Option<String>,
    pub comment_id: Option<u64>,
    /// What GitHub says about the pull request's head (and the repository of its branch:
    /// without `SHA=`, only a head in this repository or an allow-listed owner's is bound).
    pub evidence: Option<Evidence>,
}

fn write(path: &Path, text: &str) -> Result<(), RunError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| RunError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| RunError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn read(path: &Path) -> Result<String, RunError> {
    std::fs::read_to_string(path).map_err(|source| RunError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The comment's text from the event payload the bot workflow's run got
/// (`$GITHUB_EVENT_PATH`): its `comment.body`, whatever its length. (In the environment or on a
/// command line, a comment over 128 KiB cannot be passed to a program at all.)
pub fn comment_from_event(event: &str) -> Result<String, String> {
    let event: serde_json::Value = serde_json::from_str(event).map_err(|e| e.to_string())?;
    match event.pointer("/comment/body") {
        Some(serde_json::Value::String(body)) => Ok(body.clone()),
        // GitHub sends `null` for an empty body.
        Some(serde_json::Value::Null) => Ok(String::new()),
        _ => Err("the event has no comment body".to_string()),
    }
}

/// Step 1: decide what the comment asks for and write `request.json` (and `reply.md`).
pub fn plan(input: PlanInput, out: &Path) -> Result<RequestFile, RunError> {
    let author = match &input.gate {
        Gate::Local => None,
        Gate::Comment { author, .. } => Some(author.clone()),
    };
    let mut file = RequestFile {
        outcome: Outcome::Ignored,
        request: None,
        pr: input.pr,
        sha: input.sha,
        comment_id: input.comment_id,
        author,
        comment_at: input.evidence.as_ref().map(|e| e.comment_at.clone()),
        bound_by: None,
    };
    let mut reply = None;
    if is_bot_command(&input.comment) {
        let allowed = match &input.gate {
            Gate::Local => true,
            Gate::Comment {
                allowlist,
                author,
                association,
            } => authorized(allowlist, author, association),
        };
        if !allowed {
            file.outcome = Outcome::Refused;
            reply = Some(crate::reply::REFUSAL_REPLY.to_string());
        } else {
            let owner_allowed = |owner: &str| match &input.gate {
                Gate::Local => true,
                Gate::Comment { allowlist, .. } => allowlist.allows(owner),
            };
            let bound =
                |req: &BotRequest, e: &Evidence| bind_request(req.sha.as_deref(), e, owner_allowed);
            match parse(&input.comment) {
                Ok(req) => match input.evidence.as_ref().map(|e| bound(&req, e)) {
                    None => {
                        file.outcome = Outcome::Run;
                        file.request = Some(req);
                    }
                    Some(Ok(b)) => {
                        file.outcome = Outcome::Run;
                        file.request = Some(req);
                        file.sha = Some(b.sha);
                        file.bound_by = Some(b.by);
                    }
                    Some(Err(e)) => {
                        file.outcome = Outcome::Rejected;
                        file.sha = None;
                        reply = Some(render_unbound_reply(&e));
                    }
                },
                Err(e) => {
                    file.outcome = Outcome::Rejected;
                    reply = Some(render_usage_reply(&e));
                }
            }
        }
    }
    write(&out.join(REQUEST_FILE), &to_json(&file))?;
    if let Some(text) = reply {
        write(&out.join(REPLY_FILE), &text)?;
    }
    Ok(file)
}

/// The step outputs a workflow reads (`key=value` lines for `$GITHUB_OUTPUT`).
pub fn github_outputs(file: &RequestFile) -> String {
    let (run, matrix, shards) = match (&file.outcome, &file.request) {
        (Outcome::Run, Some(r)) => (true, crate::plan::matrix_json(r), r.shards),
        _ => (false, "[]".to_string(), 0),
    };
    let post = !matches!(file.outcome, Outcome::Ignored);
    // The bound commit, for the shards to check out; only a request that runs has one.
    let sha = match (run, &file.sha) {
        (true, Some(sha)) => sha.as_str(),
        _ => "",
    };
    format!("run={run}\npost={post}\nshards={shards}\nmatrix={matrix}\nsha={sha}\n")
}

pub fn load_request(path: &Path) -> Result<RequestFile, RunError> {
    serde_json::from_str(&read(path)?).map_err(|source| RunError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn runnable(file: &RequestFile) -> Result<&BotRequest, RunError> {
    match (&file.outcome, &file.request) {
        (Outcome::Run, Some(r)) => Ok(r),
        (o, _) => Err(RunError::NotRunnable(*o)),
    }
}

/// The folder of shard `index` under `shards`.
pub fn shard_dir(shards: &Path, index: u32) -> PathBuf {
    shards.join(format!("shard-{index}"))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Step 2: run shard `index` with `cargo` in `root`, leaving its summary (or error) in
/// `shard_dir(shards, index)`. Ok(true) when every backend's verdict is good.
pub fn shard(
    file: &RequestFile,
    index: u32,
    shards: &Path,
    cargo: &str,
    root: &Path,
) -> Result<bool, RunError> {
    let req = runnable(file)?;
    if index >= req.shards {
        return Err(RunError::ShardIndex {
            index,
            count: req.shards,
        });
    }
    let dir = shard_dir(shards, index);
    std::fs::create_dir_all(&dir).map_err(|source| RunError::Write {
        path: dir.clone(),
        source,
    })?;
    let mut args = cargo_run_args(req);
    args.extend(check_args(req, index, &dir));
    eprintln!("shard {index}/{}: {cargo} {}", req.shards, args.join(" "));
    let output = Command::new(cargo)
        .args(&args)
        .current_dir(root)
        .output()
        .map_err(|source| RunError::Spawn {
            program: cargo.to_string(),
            source,
        })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // attn-diff: 0 agreed, 1 diverged (both with a summary), anything else is an error.
    let summary = match output.status.code() {
        Some(0 | 1) => attn_results::from_json::<CheckSummary>(&stdout).ok(),
        _ => None,
    };
    let Some(summary) = summary else {
        let code = output
            .status
            .code()
            .map_or_else(|| "a signal".to_string(), |c| format!("code {c}"));
        let err = RunError::Shard {
            index,
            code,
            stderr: tail(&stderr, STDERR_LINES),
        };
        write(&dir.join(ERROR_FILE), &err.to_string())?;
        return Err(err);
    };
    write(&dir.join(SUMMARY_FILE), &stdout)?;
    Ok(summary.backends.iter().all(|b| Verdict::of(b).ok()))
}

/// How a report came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    Passed,
    Diverged,
    /// A shard or the merge failed: the reply says what.
    Broken,
}

fn copy_artifacts(
    merged: &CheckSummary,
    shards: &Path,
    count: u32,
    out: &Path,
) -> Result<(), RunError> {
    let dest = out.join(REPLAY_DIR);
    let files = merged
        .backends
        .iter()
        .flat_map(|b| &b.failures)
        .flat_map(|f| [f.replay.as_deref(), f.heatmap.as_deref()])
        .flatten();
    for path in files {
        let Some(name) = Path::new(path).file_name() else {
            continue;
        };
        let found = (0..count)
            .map(|i| shard_dir(shards, i).join(REPLAY_DIR).join(name))
            .find(|p| p.is_file());
        if let Some(src) = found {
            std::fs::create_dir_all(&dest).map_err(|source| RunError::Write {
                path: dest.clone(),
                source,
            })?;
            std::fs::copy(&src, dest.join(name)).map_err(|source| RunError::Write {
                path: dest.join(name),
                source,
            })?;
        }
    }
    Ok(())
}

/// Step 3: merge the shards' summaries under `shards` and write the reply, the status, the
/// merged summary and the replay files to `out`.
pub fn report(
    file: &RequestFile,
    shards: &Path,
    out: &Path,
    ctx: &ReplyContext,
) -> Result<Report, RunError> {
    let req = runnable(file)?;
    let mut summaries = Vec::new();
    let mut problems = Vec::new();
    for i in 0..req.shards {
        let dir = shard_dir(shards, i);
        let path = dir.join(SUMMARY_FILE);
        if path.is_file() {
            match attn_results::from_json::<CheckSummary>(&read(&path)?) {
                Ok(s) => summaries.push(s),
                Err(e) => problems.push(format!("shard {i}: {} is not valid: {e}", path.display())),
            }
        } else if let Ok(text) = std::fs::read_to_string(dir.join(ERROR_FILE)) {
            problems.push(text);
        } else {
            problems.push(format!("shard {i}: no summary (its job did not finish)"));
        }
    }
    let merged = if problems.is_empty() {
        merge(summaries)
            .map_err(|e| problems.push(format!("merging the shards: {e}")))
            .ok()
    } else {
        None
    };
    let Some(merged) = merged else {
        let what = problems.join("\n\n");
        write(&out.join(REPLY_FILE), &render_error_reply(req, &what, ctx))?;
        write(&out.join(STATUS_FILE), &to_json(&error_status(&what)))?;
        return Ok(Report::Broken);
    };
    copy_artifacts(&merged, shards, req.shards, out)?;
    write(&out.join(SUMMARY_FILE), &attn_results::to_json(&merged))?;
    write(&out.join(REPLY_FILE), &render_reply(req, &merged, ctx))?;
    write(&out.join(STATUS_FILE), &to_json(&status_of(&merged)))?;
    Ok(if crate::reply::all_ok(&merged) {
        Report::Passed
    } else {
        Report::Diverged
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "89abcdef0123456789abcdef0123456789abcdef";

    fn input(comment: &str, suites: &[&str]) -> PlanInput {
        PlanInput {
            comment: comment.into(),
            gate: Gate::Comment {
                allowlist: AllowList::parse("alice\n").unwrap(),
                author: "alice".into(),
                association: "MEMBER".into(),
            },
            pr: Some(3),
            sha: None,
            comment_id: Some(9),
            evidence: Some(Evidence {
                comment_at: "2026-05-01T12:00:00Z".into(),
                head: HEAD.into(),
                head_suites: suites.iter().map(|s| s.to_string()).collect(),
                force_pushes: Vec::new(),
                repo: "o/r".into(),
                head_repo: Some("o/r".into()),
            }),
        }
    }

    fn out_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("attn-ci-run-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_request_runs_on_the_commit_bound_to_the_comment() {
        let out = out_dir("bound");
        let file = plan(input("bot:test CASES=4", &["2026-05-01T11:00:00Z"]), &out).unwrap();
        assert_eq!(file.outcome, Outcome::Run);
        assert_eq!(file.sha.as_deref(), Some(HEAD));
        assert_eq!(file.bound_by, Some(BoundBy::HeadAtComment));
        assert_eq!(file.comment_at.as_deref(), Some("2026-05-01T12:00:00Z"));
        assert!(github_outputs(&file).contains(&format!("\nsha={HEAD}\n")));
        // What the shards and the poster read back is the same.
        assert_eq!(load_request(&out.join(REQUEST_FILE)).unwrap(), file);
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn a_head_pushed_after_the_comment_runs_nothing() {
        let out = out_dir("moved");
        let file = plan(input("bot:test CASES=4", &["2026-05-01T12:05:00Z"]), &out).unwrap();
        assert_eq!(file.outcome, Outcome::Rejected);
        assert_eq!(file.sha, None);
        let outputs = github_outputs(&file);
        assert!(
            outputs.contains("run=false") && outputs.contains("\nsha=\n"),
            "{outputs}"
        );
        let reply = std::fs::read_to_string(out.join(REPLY_FILE)).unwrap();
        assert!(reply.contains("moved after the comment"), "{reply}");
        // SHA= naming another commit: the same.
        let file = plan(
            input("bot:test SHA=0000000", &["2026-05-01T11:00:00Z"]),
            &out,
        )
        .unwrap();
        assert_eq!(file.outcome, Outcome::Rejected);
        // SHA= naming the head in full: bound, whatever the evidence.
        let file = plan(input(&format!("bot:test SHA={HEAD}"), &[]), &out).unwrap();
        assert_eq!(
            (file.outcome, file.bound_by),
            (Outcome::Run, Some(BoundBy::Sha))
        );
        // An abbreviation: the usage reply, nothing bound.
        let file = plan(input(&format!("bot:test SHA={}", &HEAD[..7]), &[]), &out).unwrap();
        assert_eq!((file.outcome, file.sha), (Outcome::Rejected, None));
        let reply = std::fs::read_to_string(out.join(REPLY_FILE)).unwrap();
        assert!(reply.contains("is not a full commit id"), "{reply}");
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn a_branch_outside_this_and_allow_listed_repositories_needs_sha() {
        let out = out_dir("stranger");
        let head_in = |repo: Option<&str>, comment: &str, suites: &[&str]| {
            let mut i = input(comment, suites);
            if let Some(e) = i.evidence.as_mut() {
                e.head_repo = repo.map(str::to_string);
            }
            i
        };
        let i = head_in(
            Some("mallory/r"),
            "bot:test CASES=4",
            &["2026-05-01T11:00:00Z"],
        );
        let file = plan(i, &out).unwrap();
        assert_eq!((file.outcome, &file.sha), (Outcome::Rejected, &None));
        let reply = std::fs::read_to_string(out.join(REPLY_FILE)).unwrap();
        assert!(reply.contains("mallory/r"), "{reply}");
        assert!(reply.contains(&format!("SHA={HEAD}")), "{reply}");
        // A deleted fork: the same.
        let i = head_in(None, "bot:test CASES=4", &["2026-05-01T11:00:00Z"]);
        assert_eq!(plan(i, &out).unwrap().outcome, Outcome::Rejected);
        // An allow-listed owner's fork (the allow-list is `alice`): bound.
        let i = head_in(
            Some("Alice/r"),
            "bot:test CASES=4",
            &["2026-05-01T11:00:00Z"],
        );
        assert_eq!(plan(i, &out).unwrap().outcome, Outcome::Run);
        // With SHA= naming the head, it runs wherever the branch is.
        let i = head_in(Some("mallory/r"), &format!("bot:test SHA={HEAD}"), &[]);
        let file = plan(i, &out).unwrap();
        assert_eq!(
            (file.outcome, file.bound_by),
            (Outcome::Run, Some(BoundBy::Sha))
        );
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn the_force_push_dance_runs_nothing() {
        // M first pushed at 11:00, forced back to B at 11:30, the comment at 12:00 (on B), M
        // pushed again after it: M is the head now, but was not at the comment.
        let out = out_dir("dance");
        let mut i = input("bot:test CASES=4", &["2026-05-01T11:00:00Z"]);
        if let Some(e) = i.evidence.as_mut() {
            e.force_pushes = vec![crate::binding::ForcePush {
                at: "2026-05-01T11:30:00Z".into(),
                before: Some(HEAD.into()),
                after: Some("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb".into()),
            }];
        }
        let file = plan(i, &out).unwrap();
        assert_eq!((file.outcome, &file.sha), (Outcome::Rejected, &None));
        assert!(github_outputs(&file).contains("run=false"));
        let reply = std::fs::read_to_string(out.join(REPLY_FILE)).unwrap();
        assert!(reply.contains(&format!("SHA={HEAD}")), "{reply}");
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn a_comment_of_any_length_is_read_from_the_event_and_answered() {
        // Over 128 KiB: more than one environment variable or argument can hold.
        let tail = "x".repeat(200 * 1024);
        for (first, outcome) in [
            ("bot:test CASES=4", Outcome::Run),
            ("bot:test CASES=four", Outcome::Rejected),
            ("BOT:TEST", Outcome::Rejected),
        ] {
            let body = format!("{first}\n{tail}");
            let event = serde_json::json!({ "comment": { "body": body, "id": 9 } }).to_string();
            let comment = comment_from_event(&event).unwrap();
            assert_eq!(comment.len(), body.len());
            let out = out_dir("long");
            let file = plan(input(&comment, &["2026-05-01T11:00:00Z"]), &out).unwrap();
            assert_eq!(file.outcome, outcome, "{first}");
            if outcome == Outcome::Rejected {
                let reply = std::fs::read_to_string(out.join(REPLY_FILE)).unwrap();
                assert!(reply.contains("Usage:"), "{reply}");
                assert!(reply.len() < 4096, "the reply does not echo the comment");
            }
            let _ = std::fs::remove_dir_all(&out);
        }
        assert_eq!(
            comment_from_event(r#"{"comment":{"body":null}}"#),
            Ok(String::new())
        );
        assert!(comment_from_event(r#"{"issue":{}}"#).is_err());
        assert!(comment_from_event("not json").is_err());
    }
}
