//! What the posting workflow (`bot-post.yml`, which holds the write token) posts, decided from
//! data only. The bot run it follows executed pull-request code, and that code holds the run's
//! artifact token: it can upload, or overwrite, any artifact of the run. So:
//!
//! - the request is read only from the `bot-request` artifact the `plan` job uploaded (the one
//!   job that runs no pull-request code), picked by id among the run's artifacts and accepted
//!   only if it was created while a `plan` job of the run was running; one created at any
//!   other time means it was replaced, and nothing is posted;
//! - the pull request and the comment come from the run's title (its `run-name`, which GitHub
//!   renders from the trusted workflow and the event), and what to answer is decided from the
//!   comment itself ([`crate::answer`]): the request artifact is used only for the commit the
//!   plan bound, which must be one of the pull request's;
//! - both artifacts are downloaded as zip files and read in memory ([`crate::artifact`]): no
//!   name inside an archive decides where anything is written, and only the expected files
//!   are read, each checked;
//! - the pull request's output (`bot-result`) is sanitised ([`crate::sanitize`]) and posted
//!   under a header naming the commit the request bound; the status goes on that commit. A
//!   result artifact that fails the checks is not read at all: the reply says it was refused
//!   and the status is an error.

use crate::artifact::{read_artifact, ArtifactError};
use crate::run::{RequestFile, REPLY_FILE, REQUEST_FILE, STATUS_FILE};
use crate::sanitize::{capped, wrap};
use crate::time::parse_time;
use serde::{Deserialize, Serialize};
use std::path::Path;
use thiserror::Error;

/// The artifact the plan job leaves the request in.
pub const REQUEST_ARTIFACT: &str = "bot-request";
/// The artifact the pull request's code leaves its reply and status in.
pub const RESULT_ARTIFACT: &str = "bot-result";
/// The job that writes the request (and runs no pull-request code).
pub const PLAN_JOB: &str = "plan";
/// A result artifact bigger than this is not downloaded, and no file in it is read past this.
pub const MAX_RESULT_BYTES: u64 = 4 * 1024 * 1024;
/// The request artifact, and each file in it, at most.
pub const MAX_REQUEST_BYTES: u64 = 1024 * 1024;
/// The files the plan job leaves in the request artifact.
pub const REQUEST_FILES: [&str; 2] = [REQUEST_FILE, REPLY_FILE];
/// The files the report job leaves in the result artifact (`summary.json` is not read here,
/// but checked like the others).
pub const RESULT_FILES: [&str; 3] = [REPLY_FILE, STATUS_FILE, crate::plan::SUMMARY_FILE];
/// Seconds after the plan job's end an upload may still be stamped (GitHub rounds both times
/// to the second; a job that needs the plan cannot start and upload that fast).
const SLACK: i64 = 2;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PostError {
    #[error("line {line} of {what} is not valid JSON: {message}")]
    Json {
        what: &'static str,
        line: usize,
        message: String,
    },
    #[error("the run has no {REQUEST_ARTIFACT} artifact written by its plan job")]
    NoRequest,
    #[error("artifact {id} ({REQUEST_ARTIFACT}) was created at {at}, outside every plan job: it was replaced, so nothing is posted")]
    Replaced { id: u64, at: String },
    #[error("the bot run's title `{0}` is not `bot for comment ID on pull request N`")]
    BadTitle(String),
    #[error("line {line} of the pull request's commits is not a full commit id")]
    BadCommit { line: usize },
    #[error("comment {got} is not the run's comment {want}")]
    WrongComment { got: u64, want: u64 },
    #[error("comment {comment} is not on pull request {pr}")]
    WrongPullRequest { comment: u64, pr: u64 },
    #[error("the comment's author `{comment}` is not the run's actor `{run}`")]
    WrongAuthor { comment: String, run: String },
    #[error("the comment was made at {comment}, after the run began ({run})")]
    WrongTime { comment: String, run: String },
    #[error("the {REQUEST_ARTIFACT} artifact is refused: {0}")]
    Request(ArtifactError),
    #[error("the {REQUEST_ARTIFACT} artifact has no {REQUEST_FILE}")]
    NoRequestFile,
    #[error("the {REQUEST_ARTIFACT} artifact's {REQUEST_FILE} is not valid: {0}")]
    RequestJson(String),
    #[error("{0}")]
    Time(#[from] crate::time::TimeError),
}

/// A job of the run, as `GET .../actions/runs/{id}/jobs?filter=all` lists it.
#[derive(Debug, Deserialize)]
pub struct Job {
    pub name: String,
    pub started_at: Option<String>,
    pub completed_at: Option<String>,
}

/// An artifact of the run, as `GET .../actions/runs/{id}/artifacts` lists it.
#[derive(Debug, Deserialize)]
pub struct Artifact {
    pub id: u64,
    pub name: String,
    pub size_in_bytes: u64,
    pub created_at: Option<String>,
    #[serde(default)]
    pub expired: bool,
}

#[derive(Debug, Deserialize)]
pub struct User {
    pub login: String,
}

/// The comment, as `GET .../issues/comments/{id}` returns it.
#[derive(Debug, Deserialize)]
pub struct Comment {
    pub id: u64,
    pub issue_url: String,
    pub user: User,
    pub created_at: String,
    /// Its text (GitHub sends `null` for an empty one): the poster answers from it.
    #[serde(default)]
    pub body: Option<String>,
    /// The author's association with the repository now (`OWNER`, `MEMBER`, ...).
    #[serde(default)]
    pub author_association: String,
}

/// JSON values one per line (as `gh api --paginate --jq '.jobs[]'` prints them).
pub fn json_lines<T: for<'de> Deserialize<'de>>(
    text: &str,
    what: &'static str,
) -> Result<Vec<T>, PostError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| PostError::Json {
                what,
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

/// The artifacts to download: the request's (required) and the result's (if any, and small).
#[derive(Debug, PartialEq, Eq)]
pub struct Selected {
    pub request: u64,
    pub result: Option<u64>,
    /// The run has a result artifact too big to download (none was picked): the answer says
    /// so instead of "did not finish".
    pub oversized: bool,
}

/// Pick the request artifact the plan job wrote, and the newest result artifact.
pub fn select(jobs: &[Job], artifacts: &[Artifact]) -> Result<Selected, PostError> {
    let mut windows = Vec::new();
    for j in jobs.iter().filter(|j| j.name == PLAN_JOB) {
        if let (Some(s), Some(e)) = (&j.started_at, &j.completed_at) {
            windows.push((parse_time(s)?, parse_time(e)? + SLACK));
        }
    }
    let mut request: Option<(i64, u64)> = None;
    for a in artifacts
        .iter()
        .filter(|a| a.name == REQUEST_ARTIFACT && !a.expired)
    {
        let at = a.created_at.clone().unwrap_or_default();
        let t = parse_time(&at).map_err(|_| PostError::Replaced {
            id: a.id,
            at: at.clone(),
        })?;
        if !windows.iter().any(|&(s, e)| s <= t && t <= e) {
            return Err(PostError::Replaced { id: a.id, at });
        }
        // The newest: a re-run's plan job writes a new one.
        if request.is_none_or(|r| (t, a.id) > r) {
            request = Some((t, a.id));
        }
    }
    let request = request.ok_or(PostError::NoRequest)?.1;
    let result = artifacts
        .iter()
        .filter(|a| a.name == RESULT_ARTIFACT && !a.expired && a.size_in_bytes <= MAX_RESULT_BYTES)
        .max_by_key(|a| {
            (
                a.created_at.as_deref().and_then(|t| parse_time(t).ok()),
                a.id,
            )
        })
        .map(|a| a.id);
    let oversized = result.is_none()
        && artifacts
            .iter()
            .any(|a| a.name == RESULT_ARTIFACT && !a.expired);
    Ok(Selected {
        request,
        result,
        oversized,
    })
}

/// Whether `dir` is a folder with something in it (a download that happened).
pub fn has_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some())
}

/// How the workflow's download step of an artifact ended (its `steps.<id>.outcome`: the step
/// may fail, as when the zip's digest or size is not what GitHub recorded at upload, and the
/// job goes on to answer): only `success` lets what it wrote be read.
pub fn downloaded(outcome: &str) -> bool {
    outcome == "success"
}

/// The reasons a result is refused before any of it is read (fixed words: nothing of the
/// artifact is repeated).
pub const RESULT_NOT_DOWNLOADED: &str = "its download failed (a digest or size other than GitHub recorded at upload, or no download at all)";
pub const RESULT_TOO_BIG: &str = "it is bigger than the bot reads";

/// The result artifact as the poster has it: the one [`select`] picked (`picked`), downloaded
/// into `dir` by a step that ended with `outcome`. A picked result whose download failed or
/// left nothing, and one too big to download, are refused (the reply says so, the status is
/// an error); only a run with no result at all is [`ResultArtifact::Missing`].
pub fn result_from_download(
    picked: Option<u64>,
    oversized: bool,
    outcome: &str,
    dir: Option<&Path>,
) -> ResultArtifact {
    match (picked, dir.filter(|d| has_files(d))) {
        (Some(_), Some(dir)) if downloaded(outcome) => read_result(Some(dir)),
        (Some(_), _) => ResultArtifact::Refused(RESULT_NOT_DOWNLOADED.into()),
        (None, _) if oversized => ResultArtifact::Refused(RESULT_TOO_BIG.into()),
        (None, _) => ResultArtifact::Missing,
    }
}

/// The run that is being answered, from the `workflow_run` event (GitHub's, not the run's).
#[derive(Clone, Debug)]
pub struct RunFacts {
    /// Who made the comment that started the run (`workflow_run.actor`).
    pub actor: String,
    pub created_at: String,
    pub url: String,
    pub conclusion: String,
}

/// A commit status, as `POST .../statuses/{sha}` takes it.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusBody {
    pub state: String,
    pub description: String,
    pub context: String,
    pub target_url: String,
}

/// What to post.
#[derive(Debug, PartialEq, Eq)]
pub struct Post {
    pub pr: u64,
    pub body: String,
    /// The commit and its status, for a request that ran.
    pub status: Option<(String, StatusBody)>,
}

pub(crate) fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Text GitHub shows as it is (status descriptions are not markdown), kept to letters, digits,
/// punctuation and single spaces.
fn plain(s: &str, max: usize) -> String {
    let words: Vec<&str> = s.split_whitespace().collect();
    words
        .join(" ")
        .chars()
        .filter(|c| !crate::sanitize::dropped(*c))
        .take(max)
        .collect()
}

/// The run's link and conclusion as safe to print: a GitHub URL or nothing, a word.
pub(crate) fn run_link(run: &RunFacts) -> String {
    let ok = run.url.starts_with("https://")
        && run
            .url
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/:.-_".contains(&b));
    if ok {
        format!("[workflow run]({})", run.url)
    } else {
        "the workflow run".to_string()
    }
}

fn conclusion(run: &RunFacts) -> String {
    run.conclusion
        .chars()
        .filter(|c| c.is_ascii_lowercase() || *c == '_')
        .take(20)
        .collect()
}

/// The request artifact, as the plan job wrote it: `request.json` (its `reply.md`, for a
/// refused or rejected request, is checked like any entry but never posted: the poster writes
/// its own reply from the comment).
#[derive(Debug)]
pub struct RequestArtifact {
    pub file: RequestFile,
}

/// Read the request artifact from its download folder (one zip file), in memory.
pub fn read_request(dir: &Path) -> Result<RequestArtifact, PostError> {
    let files = read_artifact(dir, MAX_REQUEST_BYTES, &REQUEST_FILES, MAX_REQUEST_BYTES)
        .map_err(PostError::Request)?;
    let json = files.get(REQUEST_FILE).ok_or(PostError::NoRequestFile)?;
    let file = serde_json::from_slice(json).map_err(|e| PostError::RequestJson(e.to_string()))?;
    Ok(RequestArtifact { file })
}

/// The result artifact, as the posting step sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum ResultArtifact {
    /// The run left none (it failed or was cancelled first), or one too big to download.
    Missing,
    /// It failed the checks ([`crate::artifact`]): none of it is read.
    Refused(String),
    /// Its reply (text, and whether it was cut) and status, each if present.
    Files {
        reply: Option<(String, bool)>,
        status: Option<Vec<u8>>,
    },
}

/// Read the result artifact from its download folder (one zip file), in memory; `None` when
/// there was none to download.
pub fn read_result(dir: Option<&Path>) -> ResultArtifact {
    let Some(dir) = dir else {
        return ResultArtifact::Missing;
    };
    match read_artifact(dir, MAX_RESULT_BYTES, &RESULT_FILES, MAX_RESULT_BYTES) {
        Ok(files) => ResultArtifact::Files {
            reply: files.get(REPLY_FILE).map(capped),
            status: files.get(STATUS_FILE).map(<[u8]>::to_vec),
        },
        Err(e) => ResultArtifact::Refused(e.to_string()),
    }
}

/// A fenced block holding `s` whatever backticks it contains, with no info string.
fn fenced(s: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}\n{s}\n{fence}\n")
}

/// What to post for a request that ran on `sha`, a commit of pull request `pr` (checked by
/// the caller): `result` is the pull request's output (untrusted).
pub fn compose_run(sha: &str, pr: u64, run: &RunFacts, result: &ResultArtifact) -> Post {
    let link = run_link(run);
    let (reply, status) = match result {
        ResultArtifact::Files { reply, status } => (reply.as_ref(), status.as_deref()),
        _ => (None, None),
    };
    let body = match (result, reply) {
        (ResultArtifact::Refused(why), _) => format!(
            "### attn-diff: the run's result was refused\n\nCommit {sha}: the result artifact \
             failed the bot's checks, so none of it was read:\n\n{}\nSee the {link}.\n",
            fenced(&plain(why, 300))
        ),
        (_, Some((text, cut))) => wrap(text, *cut, sha, &run.url),
        (_, None) => format!(
            "### attn-diff: the run did not finish ({})\n\nCommit {sha}: see the {link}. A \
             cancelled run may have been cancelled by anyone's workflow, not a maintainer: \
             comment again to run it anew.\n",
            conclusion(run)
        ),
    };
    let status =
        status.and_then(|bytes| serde_json::from_slice::<crate::reply::Status>(bytes).ok());
    let (state, what) = match status {
        Some(s) => (
            serde_json::to_value(s.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "error".into()),
            s.description,
        ),
        None if matches!(result, ResultArtifact::Refused(_)) => (
            "error".to_string(),
            "the result artifact was refused".to_string(),
        ),
        None => (
            "error".to_string(),
            format!("the run did not finish ({})", conclusion(run)),
        ),
    };
    let status = StatusBody {
        state,
        description: plain(&format!("{}: {what}", &sha[..7.min(sha.len())]), 140),
        context: crate::reply::status_context(pr),
        target_url: run.url.clone(),
    };
    Post {
        pr,
        body,
        status: Some((sha.to_string(), status)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::request::BotRequest;
    use crate::run::Outcome;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    fn job(name: &str, from: &str, to: &str) -> Job {
        Job {
            name: name.into(),
            started_at: Some(from.into()),
            completed_at: Some(to.into()),
        }
    }

    fn artifact(id: u64, name: &str, at: &str) -> Artifact {
        Artifact {
            id,
            name: name.into(),
            size_in_bytes: 1000,
            created_at: Some(at.into()),
            expired: false,
        }
    }

    fn jobs() -> Vec<Job> {
        vec![
            job("plan", "2026-05-01T12:00:10Z", "2026-05-01T12:01:00Z"),
            job(
                "run / shard 0",
                "2026-05-01T12:01:20Z",
                "2026-05-01T12:30:00Z",
            ),
        ]
    }

    #[test]
    fn the_plan_jobs_request_is_selected_by_id_and_time() {
        let arts = vec![
            artifact(7, "bot-request", "2026-05-01T12:00:58Z"),
            artifact(9, "bot-result", "2026-05-01T12:31:00Z"),
            artifact(8, "attn-diff-shard-0", "2026-05-01T12:29:00Z"),
        ];
        assert_eq!(
            select(&jobs(), &arts),
            Ok(Selected {
                request: 7,
                result: Some(9),
                oversized: false,
            })
        );
    }

    #[test]
    fn a_request_uploaded_by_a_shard_is_refused() {
        // The pull request's code overwrote the request while a shard ran.
        let arts = vec![artifact(11, "bot-request", "2026-05-01T12:10:00Z")];
        assert_eq!(
            select(&jobs(), &arts),
            Err(PostError::Replaced {
                id: 11,
                at: "2026-05-01T12:10:00Z".into()
            })
        );
        // Also when the plan job's own one is still there beside it.
        let arts = vec![
            artifact(7, "bot-request", "2026-05-01T12:00:58Z"),
            artifact(11, "bot-request", "2026-05-01T12:01:30Z"),
        ];
        assert!(matches!(
            select(&jobs(), &arts),
            Err(PostError::Replaced { id: 11, .. })
        ));
        // None at all, or a "plan" job that never finished: nothing to trust.
        assert_eq!(select(&jobs(), &[]), Err(PostError::NoRequest));
        let unfinished = vec![Job {
            name: "plan".into(),
            started_at: Some("2026-05-01T12:00:10Z".into()),
            completed_at: None,
        }];
        let arts = vec![artifact(7, "bot-request", "2026-05-01T12:00:58Z")];
        assert!(matches!(
            select(&unfinished, &arts),
            Err(PostError::Replaced { .. })
        ));
    }

    #[test]
    fn a_rerun_takes_its_own_plans_request_and_big_results_are_skipped() {
        let mut js = jobs();
        js.push(job("plan", "2026-05-02T08:00:00Z", "2026-05-02T08:01:00Z"));
        let mut big = artifact(13, "bot-result", "2026-05-02T09:00:00Z");
        big.size_in_bytes = MAX_RESULT_BYTES + 1;
        let arts = vec![
            artifact(7, "bot-request", "2026-05-01T12:00:58Z"),
            artifact(12, "bot-request", "2026-05-02T08:01:01Z"),
            artifact(9, "bot-result", "2026-05-01T12:31:00Z"),
            big,
        ];
        assert_eq!(
            select(&js, &arts),
            Ok(Selected {
                request: 12,
                result: Some(9),
                oversized: false,
            })
        );
    }

    #[test]
    fn a_failed_missing_or_oversized_result_download_is_answered_as_refused() {
        use crate::artifact::tests::{zip, Entry};
        let dir = download(
            "download",
            &zip(&[Entry::file("reply.md", b"### attn-diff: all passed\n")]),
        );
        // The download step ended well: read.
        assert!(matches!(
            result_from_download(Some(9), false, "success", Some(&dir)),
            ResultArtifact::Files { reply: Some(_), .. }
        ));
        // It failed (a false digest or size: download-artifact refuses the zip), or was
        // cancelled or skipped, whatever it left: refused, never read, never silence.
        for outcome in ["failure", "cancelled", "skipped", ""] {
            let r = result_from_download(Some(9), false, outcome, Some(&dir));
            assert_eq!(
                r,
                ResultArtifact::Refused(RESULT_NOT_DOWNLOADED.into()),
                "{outcome}"
            );
            let post = compose_run(SHA, 5, &run(), &r);
            assert!(
                post.body
                    .starts_with("### attn-diff: the run's result was refused"),
                "{}",
                post.body
            );
            assert_eq!(post.status.unwrap().1.state, "error");
        }
        // Picked, "downloaded", but nothing there.
        let empty = std::env::temp_dir().join(format!("attn-ci-post-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        assert_eq!(
            result_from_download(Some(9), false, "success", Some(&empty)),
            ResultArtifact::Refused(RESULT_NOT_DOWNLOADED.into())
        );
        assert_eq!(
            result_from_download(Some(9), false, "success", None),
            ResultArtifact::Refused(RESULT_NOT_DOWNLOADED.into())
        );
        // Too big to download: refused; none at all: the run did not finish.
        assert_eq!(
            result_from_download(None, true, "skipped", None),
            ResultArtifact::Refused(RESULT_TOO_BIG.into())
        );
        assert_eq!(
            result_from_download(None, false, "skipped", Some(&dir)),
            ResultArtifact::Missing
        );
        let mut big = artifact(13, "bot-result", "2026-05-01T12:31:00Z");
        big.size_in_bytes = MAX_RESULT_BYTES + 1;
        let arts = vec![artifact(7, "bot-request", "2026-05-01T12:00:58Z"), big];
        assert_eq!(
            select(&jobs(), &arts),
            Ok(Selected {
                request: 7,
                result: None,
                oversized: true
            })
        );
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn json_lines_read_gh_paginated_output() {
        let text = "{\"name\":\"plan\",\"started_at\":null,\"completed_at\":null,\"x\":1}\n\n{\"name\":\"b\"}\n";
        let jobs: Vec<Job> = json_lines(text, "jobs").unwrap();
        assert_eq!(jobs.len(), 2);
        let e = json_lines::<Job>("{\"name\":\"a\"}\nnot json\n", "jobs").unwrap_err();
        assert!(matches!(e, PostError::Json { line: 2, .. }), "{e:?}");
    }

    pub(crate) fn request(outcome: Outcome) -> RequestFile {
        RequestFile {
            outcome,
            request: Some(BotRequest::default()),
            pr: Some(5),
            sha: Some(SHA.into()),
            comment_id: Some(77),
            author: Some("Alice".into()),
            comment_at: Some("2026-05-01T12:00:00Z".into()),
            bound_by: None,
        }
    }

    pub(crate) fn run() -> RunFacts {
        RunFacts {
            actor: "ALICE".into(),
            created_at: "2026-05-01T12:00:02Z".into(),
            url: "https://github.com/o/r/actions/runs/1".into(),
            conclusion: "success".into(),
        }
    }

    fn files(reply: Option<&str>, status: Option<&str>) -> ResultArtifact {
        ResultArtifact::Files {
            reply: reply.map(|r| capped(r.as_bytes())),
            status: status.map(|s| s.as_bytes().to_vec()),
        }
    }

    #[test]
    fn a_run_is_posted_sanitised_under_its_commit() {
        let result = files(
            Some("### attn-diff: all passed\n@team [x](https://e.example)\n"),
            Some(
                r#"{"state":"success","description":"2 backends: all passed @bob\u0007","context":"attn-diff/bot"}"#,
            ),
        );
        let post = compose_run(SHA, 5, &run(), &result);
        assert_eq!(post.pr, 5);
        assert!(
            post.body.contains(&format!("at commit {SHA}")),
            "{}",
            post.body
        );
        assert!(post.body.contains("＠team \\[x]"), "{}", post.body);
        let (sha, status) = post.status.unwrap();
        assert_eq!(sha, SHA);
        assert_eq!(status.state, "success");
        assert_eq!(status.description, "0123456: 2 backends: all passed @bob");
        // The pull request's own claim, named so; not the context its code wrote.
        assert_eq!(
            status.context,
            "attn-diff/bot: self-reported by pull request 5's code"
        );
    }

    #[test]
    fn a_run_without_a_usable_result_is_an_error_status() {
        let result = files(
            None,
            Some(r#"{"state":"pending","description":"x","context":"c"}"#),
        );
        let mut r = run();
        r.conclusion = "cancelled".into();
        let post = compose_run(SHA, 5, &r, &result);
        assert!(post
            .body
            .starts_with("### attn-diff: the run did not finish (cancelled)"));
        assert!(post.body.contains(SHA));
        let (_, status) = post.status.unwrap();
        assert_eq!(status.state, "error");
        assert_eq!(
            status.description,
            "0123456: the run did not finish (cancelled)"
        );
        // Cancelled: said so, and that anyone's workflow may have done it.
        assert!(post.body.contains("comment again"), "{}", post.body);
        let post = compose_run(SHA, 5, &r, &ResultArtifact::Missing);
        assert_eq!(post.status.unwrap().1.state, "error");
    }

    fn download(tag: &str, zip: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("attn-ci-post-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("artifact.zip"), zip).unwrap();
        dir
    }

    #[test]
    fn a_result_artifact_that_tries_to_escape_is_refused_not_read() {
        use crate::artifact::tests::{zip, Entry};
        let dir = download(
            "escape",
            &zip(&[
                Entry::file("reply.md", b"### attn-diff: all passed\n"),
                Entry::file(
                    "status.json",
                    br#"{"state":"success","description":"ok","context":"attn-diff/bot"}"#,
                ),
                Entry::file("x/../../target/debug/attn-bot", b"\x7fELF"),
            ]),
        );
        let result = read_result(Some(&dir));
        assert!(
            matches!(result, ResultArtifact::Refused(ref why) if why.contains("unsafe name")),
            "{result:?}"
        );
        let post = compose_run(SHA, 5, &run(), &result);
        assert!(
            post.body
                .starts_with("### attn-diff: the run's result was refused"),
            "{}",
            post.body
        );
        assert!(!post.body.contains("all passed"), "{}", post.body);
        let (_, status) = post.status.unwrap();
        assert_eq!(
            (status.state.as_str(), status.description.as_str()),
            ("error", "0123456: the result artifact was refused")
        );
        // The same archive, well-formed, is read.
        let dir = download(
            "ok",
            &zip(&[
                Entry::file("reply.md", b"### attn-diff: all passed\n"),
                Entry::file("summary.json", b"{}"),
            ]),
        );
        let result = read_result(Some(&dir));
        assert!(
            matches!(
                result,
                ResultArtifact::Files {
                    reply: Some(_),
                    status: None
                }
            ),
            "{result:?}"
        );
        assert_eq!(read_result(None), ResultArtifact::Missing);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_request_artifact_is_read_in_memory_and_checked() {
        use crate::artifact::tests::{zip, Entry};
        let json = serde_json::to_vec(&request(Outcome::Rejected)).unwrap();
        let dir = download(
            "request",
            &zip(&[
                Entry::file("request.json", &json),
                Entry::file("reply.md", b"### attn-diff: cannot run this request\n"),
            ]),
        );
        let req = read_request(&dir).unwrap();
        assert_eq!(req.file, request(Outcome::Rejected));
        // A forged request smuggled in beside it, an absolute path, no request at all.
        for (tag, entries) in [
            (
                "forged",
                vec![
                    Entry::file("request.json", &json),
                    Entry::file("x/../../bot-request/request.json", b"{}"),
                ],
            ),
            ("absolute", vec![Entry::file("/request.json", &json)]),
        ] {
            let dir = download(tag, &zip(&entries));
            let e = read_request(&dir).unwrap_err();
            assert!(
                matches!(e, PostError::Request(ArtifactError::UnsafeName(_))),
                "{tag}: {e:?}"
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
        let dir = download("none", &zip(&[Entry::file("reply.md", b"x")]));
        assert_eq!(read_request(&dir).unwrap_err(), PostError::NoRequestFile);
        let dir = download("bad-json", &zip(&[Entry::file("request.json", b"{")]));
        assert!(matches!(read_request(&dir), Err(PostError::RequestJson(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
