//! The `attn-bot` command line: `plan`, `shard`, `report`, `post-select`, `post`, `usage`. Arguments are `--name value` pairs and a few flags; the comment itself
//! comes from `--comment`, from the event file the bot workflow's run got (`--event`, the
//! comment's `body`: any length, where a comment in the environment or on a command line over
//! 128 KiB could not be passed at all), or from the environment variable `BOT_COMMENT`.

use std::path::PathBuf;
use thiserror::Error;

pub const USAGE: &str = "\
usage:
  attn-bot plan --out DIR [--comment TEXT | --event FILE] (--local | --allowlist FILE --author LOGIN --association ASSOC)
                [--pr N] [--sha SHA] [--comment-id N] [--github-output FILE]
                [--head SHA --comment-at TIME [--repo OWNER/NAME --head-repo OWNER/NAME|-]
                 [--head-suites FILE] [--force-pushes FILE]]
      the comment (--comment, else the event FILE's comment.body, else $BOT_COMMENT) becomes
      DIR/request.json (+ DIR/reply.md); with --head (required with --allowlist) the tested
      commit is bound to the comment: FILEs hold, one per line, when the head's check suites
      were created, and each force-push of the branch as `TIME BEFORE AFTER` (commits in full,
      or -); without SHA=, only when the pull request's branch is in this repository (--repo)
      or in one (--head-repo, - when GitHub names none) whose owner is allow-listed
  attn-bot shard --request FILE --index I --shards DIR
      run shard I through cargo (in the current folder) into DIR/shard-I/
  attn-bot report --request FILE --shards DIR --out DIR [--replay-artifact NAME] [--run-url URL]
      merge DIR/shard-*/summary.json; write reply.md, status.json, summary.json, replays/; print the reply
  attn-bot post-select --title TEXT --jobs FILE --artifacts FILE [--github-output FILE]
      the bot run's title (its run-name: the pull request and the comment) and its jobs and
      artifacts (JSON lines) -> pr=, comment-id=, and the ids of the plan job's request
      artifact (empty when there is none to trust) and of the result artifact
  attn-bot post --title TEXT --jobs FILE --artifacts FILE [--request DIR] --request-download OUTCOME
                --comment FILE --commits FILE --allowlist FILE --actor LOGIN --run-created-at TIME
                --run-url URL --conclusion WORD [--result DIR] --result-download OUTCOME --out DIR
                [--github-output FILE]
      answer the comment the title names, from the comment itself; for a request that ran,
      check the request (DIR holds its zip) against it and its commit against the pull
      request's (FILE: one per line), and read the result (DIR holds its zip; a result that
      fails the checks, or whose download step's OUTCOME is not `success`, is not read);
      write DIR/comment.json and DIR/status.json (request
      bodies for GitHub's API) and pr=, sha=, post=, status=
  attn-bot usage
      print the comment grammar
exit: 0 done (report: all passed), 1 divergence, 2 usage or I/O error, 3 a shard or the merge failed";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CliError {
    #[error("no command given")]
    NoCommand,
    #[error("unknown command `{0}`")]
    UnknownCommand(String),
    #[error("unknown option `{0}`")]
    UnknownOption(String),
    #[error("option `{0}` needs a value")]
    MissingValue(String),
    #[error("option `{0}` is given twice")]
    Duplicate(String),
    #[error("`{0}` is required")]
    Required(&'static str),
    #[error("`{option}`: `{value}` is not a whole number")]
    NotANumber { option: String, value: String },
    #[error("give either --local or all of --allowlist, --author and --association")]
    Gate,
    #[error("no comment: pass --comment or --event, or set BOT_COMMENT")]
    NoComment,
    #[error("give --comment or --event, not both")]
    TwoComments,
    #[error("a comment's request needs --head and --comment-at, to bind the commit it tests")]
    NoEvidence,
}

#[derive(Debug, PartialEq, Eq)]
pub enum GateArgs {
    Local,
    Comment {
        allowlist: PathBuf,
        author: String,
        association: String,
    },
}

/// Where the plan finds what GitHub says about the pull request's head.
#[derive(Debug, PartialEq, Eq)]
pub struct EvidenceArgs {
    pub head: String,
    pub comment_at: String,
    /// This repository, `owner/name`.
    pub repo: Option<String>,
    /// The repository of the pull request's branch (`-` when GitHub names none): without
    /// `SHA=`, the head is bound only when it is this one or an allow-listed owner's.
    pub head_repo: Option<String>,
    pub head_suites: Option<PathBuf>,
    pub force_pushes: Option<PathBuf>,
}

/// Where the plan reads the comment from.
#[derive(Debug, PartialEq, Eq)]
pub enum CommentArg {
    Text(String),
    /// The event payload (`$GITHUB_EVENT_PATH`): its `comment.body`.
    Event(PathBuf),
}

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Plan {
        out: PathBuf,
        comment: CommentArg,
        gate: GateArgs,
        pr: Option<u64>,
        sha: Option<String>,
        comment_id: Option<u64>,
        github_output: Option<PathBuf>,
        evidence: Option<EvidenceArgs>,
    },
    PostSelect {
        title: String,
        jobs: PathBuf,
        artifacts: PathBuf,
        github_output: Option<PathBuf>,
    },
    Post {
        title: String,
        jobs: PathBuf,
        artifacts: PathBuf,
        request: Option<PathBuf>,
        /// How the request's download step ended (`steps.<id>.outcome`).
        request_download: String,
        comment: PathBuf,
        commits: PathBuf,
        allowlist: PathBuf,
        actor: String,
        run_created_at: String,
        run_url: String,
        conclusion: String,
        result: Option<PathBuf>,
        /// How the result's download step ended.
        result_download: String,
        out: PathBuf,
        github_output: Option<PathBuf>,
    },
    Shard {
        request: PathBuf,
        index: u32,
        shards: PathBuf,
    },
    Report {
        request: PathBuf,
        shards: PathBuf,
        out: PathBuf,
        replay_artifact: String,
        run_url: Option<String>,
    },
    Usage,
}

/// `--name value` options and `--flag`s, each at most once.
struct Options {
    values: Vec<(String, String)>,
    flags: Vec<String>,
}

impl Options {
    fn parse(args: &[String], flags: &[&str], valued: &[&str]) -> Result<Options, CliError> {
        let mut o = Options {
            values: Vec::new(),
            flags: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let seen = o.flags.contains(a) || o.values.iter().any(|(k, _)| k == a);
            if seen {
                return Err(CliError::Duplicate(a.clone()));
            }
            if flags.contains(&a.as_str()) {
                o.flags.push(a.clone());
            } else if valued.contains(&a.as_str()) {
                let v = it.next().ok_or_else(|| CliError::MissingValue(a.clone()))?;
                o.values.push((a.clone(), v.clone()));
            } else {
                return Err(CliError::UnknownOption(a.clone()));
            }
        }
        Ok(o)
    }

    fn get(&self, name: &str) -> Option<String> {
        self.values
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    fn required(&self, name: &'static str) -> Result<String, CliError> {
        self.get(name).ok_or(CliError::Required(name))
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, CliError> {
        self.get(name)
            .map(|v| {
                v.parse().map_err(|_| CliError::NotANumber {
                    option: name.to_string(),
                    value: v.clone(),
                })
            })
            .transpose()
    }

    fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }
}

/// Parse `attn-bot`'s arguments (without the program name); `env_comment` is `$BOT_COMMENT`.
pub fn parse_args(args: &[String], env_comment: Option<String>) -> Result<Command, CliError> {
    let (cmd, rest) = args.split_first().ok_or(CliError::NoCommand)?;
    match cmd.as_str() {
        "plan" => {
            let o = Options::parse(
                rest,
                &["--local"],
                &[
                    "--out",
                    "--comment",
                    "--event",
                    "--allowlist",
                    "--author",
                    "--association",
                    "--pr",
                    "--sha",
                    "--comment-id",
                    "--github-output",
                    "--head",
                    "--comment-at",
                    "--repo",
                    "--head-repo",
                    "--head-suites",
                    "--force-pushes",
                ],
            )?;
            let evidence = match (o.get("--head"), o.get("--comment-at")) {
                (Some(head), Some(comment_at)) => Some(EvidenceArgs {
                    head,
                    comment_at,
                    repo: o.get("--repo"),
                    head_repo: o.get("--head-repo"),
                    head_suites: o.get("--head-suites").map(PathBuf::from),
                    force_pushes: o.get("--force-pushes").map(PathBuf::from),
                }),
                (None, None) => None,
                _ => return Err(CliError::NoEvidence),
            };
            let gate = match (
                o.flag("--local"),
                o.get("--allowlist"),
                o.get("--author"),
                o.get("--association"),
            ) {
                (true, None, None, None) => GateArgs::Local,
                (false, Some(list), Some(author), Some(association)) => GateArgs::Comment {
                    allowlist: PathBuf::from(list),
                    author,
                    association,
                },
                _ => return Err(CliError::Gate),
            };
            // A comment's commit is always bound to it; only a local run may go without.
            if matches!(gate, GateArgs::Comment { .. }) && evidence.is_none() {
                return Err(CliError::NoEvidence);
            }
            let comment = match (o.get("--comment"), o.get("--event")) {
                (Some(_), Some(_)) => return Err(CliError::TwoComments),
                (Some(text), None) => CommentArg::Text(text),
                (None, Some(event)) => CommentArg::Event(PathBuf::from(event)),
                (None, None) => CommentArg::Text(env_comment.ok_or(CliError::NoComment)?),
            };
            Ok(Command::Plan {
                out: PathBuf::from(o.required("--out")?),
                comment,
                gate,
                pr: o.number("--pr")?,
                sha: o.get("--sha"),
                comment_id: o.number("--comment-id")?,
                github_output: o.get("--github-output").map(PathBuf::from),
                evidence,
            })
        }
        "post-select" => {
            let o = Options::parse(
                rest,
                &[],
                &["--title", "--jobs", "--artifacts", "--github-output"],
            )?;
            Ok(Command::PostSelect {
                title: o.required("--title")?,
                jobs: PathBuf::from(o.required("--jobs")?),
                artifacts: PathBuf::from(o.required("--artifacts")?),
                github_output: o.get("--github-output").map(PathBuf::from),
            })
        }
        "post" => {
            let o = Options::parse(
                rest,
                &[],
                &[
                    "--title",
                    "--jobs",
                    "--artifacts",
                    "--request",
                    "--comment",
                    "--commits",
                    "--allowlist",
                    "--actor",
                    "--run-created-at",
                    "--run-url",
                    "--conclusion",
                    "--result",
                    "--request-download",
                    "--result-download",
                    "--out",
                    "--github-output",
                ],
            )?;
            Ok(Command::Post {
                title: o.required("--title")?,
                jobs: PathBuf::from(o.required("--jobs")?),
                artifacts: PathBuf::from(o.required("--artifacts")?),
                request: o.get("--request").map(PathBuf::from),
                request_download: o.required("--request-download")?,
                comment: PathBuf::from(o.required("--comment")?),
                commits: PathBuf::from(o.required("--commits")?),
                allowlist: PathBuf::from(o.required("--allowlist")?),
                actor: o.required("--actor")?,
                run_created_at: o.required("--run-created-at")?,
                run_url: o.required("--run-url")?,
                conclusion: o.required("--conclusion")?,
                result: o.get("--result").map(PathBuf::from),
                result_download: o.required("--result-download")?,
                out: PathBuf::from(o.required("--out")?),
                github_output: o.get("--github-output").map(PathBuf::from),
            })
        }
        "shard" => {
            let o = Options::parse(rest, &[], &["--request", "--index", "--shards"])?;
            Ok(Command::Shard {
                request: PathBuf::from(o.required("--request")?),
                index: o.number("--index")?.ok_or(CliError::Required("--index"))?,
                shards: PathBuf::from(o.required("--shards")?),
            })
        }
        "report" => {
            let o = Options::parse(
                rest,
                &[],
                &[
                    "--request",
                    "--shards",
                    "--out",
                    "--replay-artifact",
                    "--run-url",
                ],
            )?;
            Ok(Command::Report {
                request: PathBuf::from(o.required("--request")?),
                shards: PathBuf::from(o.required("--shards")?),
                out: PathBuf::from(o.required("--out")?),
                replay_artifact: o
                    .get("--replay-artifact")
                    .unwrap_or_else(|| "attn-diff-replays".to_string()),
                run_url: o.get("--run-url"),
            })
        }
        "usage" => Ok(Command::Usage),
        other => Err(CliError::UnknownCommand(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan for a comment, through the allowlist gate (without the commit's evidence).
    const COMMENT_GATE: [&str; 9] = [
        "plan",
        "--out",
        "o",
        "--allowlist",
        "l",
        "--author",
        "a",
        "--association",
        "OWNER",
    ];

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn plan_takes_the_comment_from_the_environment() {
        let mut plan = COMMENT_GATE.to_vec();
        plan.extend(["--pr", "5", "--head", "h", "--comment-at", "t"]);
        let c = parse_args(&args(&plan), Some("bot:test".into())).unwrap();
        assert!(
            matches!(c, Command::Plan { comment: CommentArg::Text(ref comment), pr: Some(5), gate: GateArgs::Comment { .. }, .. } if comment == "bot:test")
        );
    }

    #[test]
    fn plan_takes_the_comment_from_the_event_file() {
        let mut plan = COMMENT_GATE.to_vec();
        plan.extend(["--head", "h", "--comment-at", "t", "--event", "e.json"]);
        let c = parse_args(&args(&plan), None).unwrap();
        assert!(
            matches!(c, Command::Plan { comment: CommentArg::Event(ref p), .. } if p == &PathBuf::from("e.json")),
            "{c:?}"
        );
        // Before the environment; never together with --comment.
        let c = parse_args(&args(&plan), Some("bot:test".into())).unwrap();
        assert!(matches!(
            c,
            Command::Plan {
                comment: CommentArg::Event(_),
                ..
            }
        ));
        plan.extend(["--comment", "bot:test"]);
        assert_eq!(parse_args(&args(&plan), None), Err(CliError::TwoComments));
    }

    #[test]
    fn plan_needs_one_gate() {
        let e = parse_args(
            &args(&["plan", "--out", "o", "--local", "--author", "a"]),
            Some("x".into()),
        );
        assert_eq!(e, Err(CliError::Gate));
        let e = parse_args(&args(&["plan", "--out", "o"]), Some("x".into()));
        assert_eq!(e, Err(CliError::Gate));
        let e = parse_args(&args(&["plan", "--out", "o", "--local"]), None);
        assert_eq!(e, Err(CliError::NoComment));
    }

    #[test]
    fn a_comments_plan_needs_the_evidence_to_bind_its_commit() {
        let gate = COMMENT_GATE;
        let e = parse_args(&args(&gate), Some("bot:test".into()));
        assert_eq!(e, Err(CliError::NoEvidence));
        let mut half = gate.to_vec();
        half.extend(["--head", "h"]);
        assert_eq!(
            parse_args(&args(&half), Some("x".into())),
            Err(CliError::NoEvidence)
        );
        // A local run binds nothing.
        assert!(parse_args(&args(&["plan", "--out", "o", "--local"]), Some("x".into())).is_ok());
    }

    #[test]
    fn bad_arguments() {
        assert_eq!(parse_args(&[], None), Err(CliError::NoCommand));
        assert_eq!(
            parse_args(&args(&["x"]), None),
            Err(CliError::UnknownCommand("x".into()))
        );
        assert_eq!(
            parse_args(
                &args(&["shard", "--index", "a", "--request", "r", "--shards", "s"]),
                None
            ),
            Err(CliError::NotANumber {
                option: "--index".into(),
                value: "a".into()
            })
        );
        assert_eq!(
            parse_args(&args(&["shard", "--index"]), None),
            Err(CliError::MissingValue("--index".into()))
        );
        assert_eq!(
            parse_args(&args(&["shard", "--index", "1", "--index", "2"]), None),
            Err(CliError::Duplicate("--index".into()))
        );
        assert_eq!(
            parse_args(&args(&["report", "--what", "x"]), None),
            Err(CliError::UnknownOption("--what".into()))
        );
    }
}
