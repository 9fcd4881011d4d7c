//! `attn-bot`: the pull-request bot's steps, as the workflows and `cargo xtask bot` run them.

use attn_ci::allowlist::AllowList;
use attn_ci::answer::{self, Unverified};
use attn_ci::binding::{force_pushes_from_lines, times_from_lines, Evidence};
use attn_ci::cli::{parse_args, Command, CommentArg, EvidenceArgs, GateArgs, USAGE};
use attn_ci::post::{self, PostError, RunFacts};
use attn_ci::reply::ReplyContext;
use attn_ci::run::{self, Gate, PlanInput, Report, RunError};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn read(path: &Path) -> Result<String, RunError> {
    std::fs::read_to_string(path).map_err(|source| RunError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Append `key=value` lines to the workflow's output file (and say them on stderr).
fn write_outputs(outputs: &str, path: Option<PathBuf>) -> Result<(), RunError> {
    eprint!("{outputs}");
    if let Some(path) = path {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(outputs.as_bytes()))
            .map_err(|source| RunError::Write { path, source })?;
    }
    Ok(())
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), RunError> {
    let text = serde_json::to_string(value).map_err(|source| RunError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text).map_err(|source| RunError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn evidence(args: EvidenceArgs) -> Result<Evidence, RunError> {
    let times = |p: Option<PathBuf>| -> Result<Vec<String>, RunError> {
        p.map_or(Ok(Vec::new()), |p| read(&p).map(|t| times_from_lines(&t)))
    };
    let force_pushes = match args.force_pushes {
        Some(p) => force_pushes_from_lines(&read(&p)?)?,
        None => Vec::new(),
    };
    Ok(Evidence {
        comment_at: args.comment_at,
        head: args.head,
        head_suites: times(args.head_suites)?,
        force_pushes,
        repo: args.repo.unwrap_or_default(),
        // `-`: GitHub names no repository for the branch (a deleted fork).
        head_repo: args.head_repo.filter(|r| r != "-"),
    })
}

/// The comment: given, or the `comment.body` of the event file (read from a file, so a
/// comment of any length gets here and is answered).
fn comment(arg: CommentArg) -> Result<String, RunError> {
    match arg {
        CommentArg::Text(text) => Ok(text),
        CommentArg::Event(path) => run::comment_from_event(&read(&path)?)
            .map_err(|e| RunError::Input(format!("{}: {e}", path.display()))),
    }
}

/// The posting step's refusals are errors like any other: nothing is posted.
fn post_error(e: PostError) -> RunError {
    RunError::Post(e.to_string())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_args(&args, std::env::var("BOT_COMMENT").ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attn-bot: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match execute(command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("attn-bot: {e}");
            ExitCode::from(2)
        }
    }
}

fn execute(command: Command) -> Result<u8, RunError> {
    match command {
        Command::Plan {
            out,
            comment: comment_arg,
            gate,
            pr,
            sha,
            comment_id,
            github_output,
            evidence: evidence_args,
        } => {
            let gate = match gate {
                GateArgs::Local => Gate::Local,
                GateArgs::Comment {
                    allowlist,
                    author,
                    association,
                } => {
                    let text =
                        std::fs::read_to_string(&allowlist).map_err(|source| RunError::Read {
                            path: allowlist.clone(),
                            source,
                        })?;
                    Gate::Comment {
                        allowlist: AllowList::parse(&text)?,
                        author,
                        association,
                    }
                }
            };
            let file = run::plan(
                PlanInput {
                    comment: comment(comment_arg)?,
                    gate,
                    pr,
                    sha,
                    comment_id,
                    evidence: evidence_args.map(evidence).transpose()?,
                },
                &out,
            )?;
            write_outputs(&run::github_outputs(&file), github_output)?;
            Ok(0)
        }
        Command::PostSelect {
            title,
            jobs,
            artifacts,
            github_output,
        } => {
            let target = answer::parse_run_title(&title).map_err(post_error)?;
            let jobs = post::json_lines(&read(&jobs)?, "the jobs").map_err(post_error)?;
            let artifacts =
                post::json_lines(&read(&artifacts)?, "the artifacts").map_err(post_error)?;
            // No request to trust (deleted, replaced, flooded): nothing is downloaded, and
            // `post` answers with the fixed notice.
            let (request, result) = match post::select(&jobs, &artifacts) {
                Ok(s) => (s.request.to_string(), s.result.map(|id| id.to_string())),
                Err(PostError::NoRequest | PostError::Replaced { .. }) => (String::new(), None),
                Err(e) => return Err(post_error(e)),
            };
            write_outputs(
                &format!(
                    "pr={}\ncomment-id={}\nrequest-id={request}\nresult-id={}\n",
                    target.pr,
                    target.comment_id,
                    result.unwrap_or_default()
                ),
                github_output,
            )?;
            Ok(0)
        }
        Command::Post {
            title,
            jobs,
            artifacts,
            request,
            request_download,
            comment,
            commits,
            allowlist,
            actor,
            run_created_at,
            run_url,
            conclusion,
            result,
            result_download,
            out,
            github_output,
        } => {
            let target = answer::parse_run_title(&title).map_err(post_error)?;
            let jobs = post::json_lines(&read(&jobs)?, "the jobs").map_err(post_error)?;
            let artifacts =
                post::json_lines(&read(&artifacts)?, "the artifacts").map_err(post_error)?;
            // A download step that failed (a digest or size other than GitHub recorded) is
            // answered like a missing or refused artifact: never with silence.
            let (request, picked_result, oversized) = match post::select(&jobs, &artifacts) {
                Err(PostError::NoRequest) => (Err(Unverified::Missing), None, false),
                Err(PostError::Replaced { .. }) => (Err(Unverified::Replaced), None, false),
                Err(e) => return Err(post_error(e)),
                Ok(s) => (
                    answer::request_from_download(true, &request_download, request.as_deref()),
                    s.result,
                    s.oversized,
                ),
            };
            let run = RunFacts {
                actor,
                created_at: run_created_at,
                url: run_url,
                conclusion,
            };
            let comment: post::Comment =
                serde_json::from_str(&read(&comment)?).map_err(|source| RunError::Json {
                    path: comment.clone(),
                    source,
                })?;
            let commits = answer::commits_from_lines(&read(&commits)?).map_err(post_error)?;
            let allowlist = AllowList::parse(&read(&allowlist)?)?;
            let result = post::result_from_download(
                picked_result,
                oversized,
                &result_download,
                result.as_deref(),
            );
            if let post::ResultArtifact::Refused(why) = &result {
                eprintln!("attn-bot: the result artifact is refused: {why}");
            }
            let answered = answer::answer(&answer::Inputs {
                target,
                comment: &comment,
                run: &run,
                allowlist: &allowlist,
                request,
                commits: &commits,
                result: &result,
            })
            .map_err(post_error)?;
            let Some(p) = answered else {
                write_outputs("post=false\nstatus=false\n", github_output)?;
                return Ok(0);
            };
            std::fs::create_dir_all(&out).map_err(|source| RunError::Write {
                path: out.clone(),
                source,
            })?;
            write_json(
                &out.join("comment.json"),
                &serde_json::json!({ "body": p.body }),
            )?;
            let (sha, status) = match &p.status {
                Some((sha, s)) => {
                    write_json(&out.join("status.json"), s)?;
                    (sha.as_str(), true)
                }
                None => ("", false),
            };
            write_outputs(
                &format!("post=true\nstatus={status}\npr={}\nsha={sha}\n", p.pr),
                github_output,
            )?;
            Ok(0)
        }
        Command::Shard {
            request,
            index,
            shards,
        } => {
            let file = run::load_request(&request)?;
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let root = std::env::current_dir().map_err(|source| RunError::Read {
                path: ".".into(),
                source,
            })?;
            match run::shard(&file, index, &shards, &cargo, &root) {
                Ok(true) => Ok(0),
                Ok(false) => Ok(1),
                // The error is in shard-I/error.txt for the report; say it here too.
                Err(e @ RunError::Shard { .. }) => {
                    eprintln!("attn-bot: {e}");
                    Ok(3)
                }
                Err(e) => Err(e),
            }
        }
        Command::Report {
            request,
            shards,
            out,
            replay_artifact,
            run_url,
        } => {
            let file = run::load_request(&request)?;
            let ctx = ReplyContext {
                replay_artifact,
                run_url,
            };
            let outcome = run::report(&file, &shards, &out, &ctx)?;
            let reply = out.join(run::REPLY_FILE);
            match std::fs::read_to_string(&reply) {
                Ok(text) => println!("{text}"),
                Err(source) => {
                    return Err(RunError::Read {
                        path: reply,
                        source,
                    })
                }
            }
            Ok(match outcome {
                Report::Passed => 0,
                Report::Diverged => 1,
                Report::Broken => 3,
            })
        }
        Command::Usage => {
            println!("{}", attn_ci::request::USAGE);
            Ok(0)
        }
    }
}
