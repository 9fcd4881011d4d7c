//! What the poster answers, decided from what GitHub says rather than from what the bot run
//! left. The run executed pull-request code, which can replace, delete or flood the request
//! artifact (a re-run of the whole run gives it a new plan job to time its upload with), so:
//!
//! - the pull request and the comment come from the run's title, its `run-name`, which GitHub
//!   renders from the default branch's workflow and the event ([`run_title`]);
//! - the comment is fetched and read again here: a refusal or a usage reply is written from it,
//!   never taken from the artifact's `reply.md`;
//! - the request artifact is used only for what the plan job alone knows: whether the commit
//!   was bound, and which. It must agree with the comment, and its commit must be one of the
//!   pull request's ([`in_pull_request`]), so a forged one can at most put this pull request's
//!   own claim on another of its own commits;
//! - an artifact that is missing, replaced, refused or at odds with the comment gets a fixed
//!   "could not verify" notice, not silence.

use crate::allowlist::{authorized, AllowList};
use crate::post::{compose_run, is_full_sha, run_link, Comment, Post, PostError, RequestArtifact};
use crate::post::{ResultArtifact, RunFacts};
use crate::reply::{
    render_unbound_notice, render_unverified_notice, render_usage_reply, REFUSAL_REPLY,
};
use crate::request::{is_bot_command, parse, BotRequest, ParseError};
use crate::run::Outcome;
use crate::time::parse_time;

const TITLE_START: &str = "bot for comment ";
const TITLE_MIDDLE: &str = " on pull request ";

/// The pull request and comment a bot run answers, from its title.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub pr: u64,
    pub comment_id: u64,
}

/// The title `bot.yml`'s `run-name` gives a run (`workflows` tests that the two agree).
pub fn run_title(pr: u64, comment_id: u64) -> String {
    format!("{TITLE_START}{comment_id}{TITLE_MIDDLE}{pr}")
}

fn decimal(s: &str) -> Option<u64> {
    let canonical = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0');
    canonical.then(|| s.parse().ok()).flatten()
}

/// Read a run's title back: exactly [`run_title`]'s form, else an error.
pub fn parse_run_title(title: &str) -> Result<Target, PostError> {
    let bad = || PostError::BadTitle(title.chars().take(100).collect());
    let rest = title.strip_prefix(TITLE_START).ok_or_else(bad)?;
    let (comment, pr) = rest.split_once(TITLE_MIDDLE).ok_or_else(bad)?;
    Ok(Target {
        pr: decimal(pr).ok_or_else(bad)?,
        comment_id: decimal(comment).ok_or_else(bad)?,
    })
}

/// The pull request's commits, one full id per line (as `gh api --jq '.[].sha'` prints them,
/// and its head's); blank lines are skipped, anything else is an error.
pub fn commits_from_lines(text: &str) -> Result<Vec<String>, PostError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let l = l.trim();
            if is_full_sha(l) {
                Ok(l.to_string())
            } else {
                Err(PostError::BadCommit { line: i + 1 })
            }
        })
        .collect()
}

/// Whether `sha` is one of the pull request's commits, as the poster listed them.
pub fn in_pull_request(sha: &str, commits: &[String]) -> bool {
    is_full_sha(sha) && commits.iter().any(|c| c == sha)
}

/// Why the request artifact is not used. Fixed words: nothing of the artifact is repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unverified {
    /// The run has no request artifact (deleted, or never uploaded).
    Missing,
    /// One was created outside every plan job: replaced or flooded.
    Replaced,
    /// Its archive failed the checks.
    Refused,
    /// It names another comment or pull request, or another request than the comment's.
    Mismatch,
    /// Its commit is not one of the pull request's.
    ForeignCommit,
}

impl Unverified {
    pub fn why(self) -> &'static str {
        match self {
            Unverified::Missing => "the run has no request artifact",
            Unverified::Replaced => "a request artifact was created outside the plan job",
            Unverified::Refused => "the request artifact failed the bot's checks",
            Unverified::Mismatch => "the request does not match the comment",
            Unverified::ForeignCommit => {
                "the request's commit is not one of this pull request's commits"
            }
        }
    }
}

/// What the comment asks for, read here from its text and its author.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    /// Not addressed to the bot: no answer.
    Nothing,
    /// From someone the allow-list does not name.
    Refused,
    /// Addressed to the bot, not parseable.
    Rejected(ParseError),
    /// A request.
    Request(BotRequest),
}

pub fn asked(comment: &Comment, allowlist: &AllowList) -> Asked {
    let body = comment.body.as_deref().unwrap_or("");
    if !is_bot_command(body) {
        return Asked::Nothing;
    }
    if !authorized(allowlist, &comment.user.login, &comment.author_association) {
        return Asked::Refused;
    }
    match parse(body) {
        Ok(req) => Asked::Request(req),
        Err(e) => Asked::Rejected(e),
    }
}

/// The comment must be the run's: the one the title names, on its pull request, by the run's
/// actor (the commenter; a re-run by someone else does not change it), made before the run.
pub fn verify_comment(target: Target, comment: &Comment, run: &RunFacts) -> Result<(), PostError> {
    if comment.id != target.comment_id {
        return Err(PostError::WrongComment {
            got: comment.id,
            want: target.comment_id,
        });
    }
    if !comment
        .issue_url
        .ends_with(&format!("/issues/{}", target.pr))
    {
        return Err(PostError::WrongPullRequest {
            comment: comment.id,
            pr: target.pr,
        });
    }
    if !comment.user.login.eq_ignore_ascii_case(&run.actor) {
        return Err(PostError::WrongAuthor {
            comment: comment.user.login.clone(),
            run: run.actor.clone(),
        });
    }
    if parse_time(&comment.created_at)? > parse_time(&run.created_at)? {
        return Err(PostError::WrongTime {
            comment: comment.created_at.clone(),
            run: run.created_at.clone(),
        });
    }
    Ok(())
}

/// What the poster has: the run's target, the comment (fetched, checked by
/// [`verify_comment`]), the allow-list of the default branch, the request artifact or why it
/// is not usable, the pull request's commits, and the result artifact.
pub struct Inputs<'a> {
    pub target: Target,
    pub comment: &'a Comment,
    pub run: &'a RunFacts,
    pub allowlist: &'a AllowList,
    pub request: Result<RequestArtifact, Unverified>,
    pub commits: &'a [String],
    pub result: &'a ResultArtifact,
}

fn reply(pr: u64, body: String) -> Option<Post> {
    Some(Post {
        pr,
        body,
        status: None,
    })
}

/// The request's commit, if the request artifact agrees with the comment.
fn checked_request(
    i: &Inputs,
    asked: &BotRequest,
) -> Result<(Outcome, Option<String>), Unverified> {
    let file = &i.request.as_ref().map_err(|u| *u)?.file;
    let same_time = match (file.comment_at.as_deref(), &i.comment.created_at) {
        (Some(a), b) => parse_time(a)
            .ok()
            .zip(parse_time(b).ok())
            .is_some_and(|(a, b)| a == b),
        (None, _) => false,
    };
    let same = file.pr == Some(i.target.pr)
        && file.comment_id == Some(i.target.comment_id)
        && file
            .author
            .as_deref()
            .is_some_and(|a| a.eq_ignore_ascii_case(&i.comment.user.login))
        && same_time;
    if !same {
        return Err(Unverified::Mismatch);
    }
    match file.outcome {
        Outcome::Run if file.request.as_ref() != Some(asked) => Err(Unverified::Mismatch),
        // The comment named its commit: the request's must be that one.
        Outcome::Run if asked.sha.is_some() && file.sha != asked.sha => Err(Unverified::Mismatch),
        Outcome::Run => match file.sha.as_deref() {
            Some(sha) if in_pull_request(sha, i.commits) => Ok((Outcome::Run, Some(sha.into()))),
            _ => Err(Unverified::ForeignCommit),
        },
        // The comment is an allowed, valid request: the plan cannot have ignored or refused it.
        Outcome::Ignored | Outcome::Refused => Err(Unverified::Mismatch),
        o => Ok((o, None)),
    }
}

/// Said under a result when the comment named no commit, so no status was set.
pub const NO_STATUS_NOTE: &str = "\n(No commit status was set: the comment named no commit. A \
    status goes only on the commit a comment names with `SHA=`.)\n";

/// The commit the comment names, if any.
fn asked_sha(req: &BotRequest) -> Option<&str> {
    req.sha.as_deref()
}

/// The request artifact as the poster has it: `Err` when there is none to read (`picked` is
/// false: none was selected) or its download step (`outcome`) did not succeed, else read
/// from `dir` ([`crate::post::read_request`]).
pub fn request_from_download(
    picked: bool,
    outcome: &str,
    dir: Option<&std::path::Path>,
) -> Result<RequestArtifact, Unverified> {
    if !picked {
        return Err(Unverified::Missing);
    }
    if !crate::post::downloaded(outcome) {
        return Err(Unverified::Refused);
    }
    match dir.filter(|d| crate::post::has_files(d)) {
        None => Err(Unverified::Missing),
        Some(dir) => crate::post::read_request(dir).map_err(|e| {
            eprintln!("attn-bot: the request artifact is refused: {e}");
            Unverified::Refused
        }),
    }
}

/// What to post for the run, or nothing (a comment not addressed to the bot).
pub fn answer(i: &Inputs) -> Result<Option<Post>, PostError> {
    verify_comment(i.target, i.comment, i.run)?;
    let pr = i.target.pr;
    let link = run_link(i.run);
    let req = match asked(i.comment, i.allowlist) {
        Asked::Nothing => return Ok(None),
        Asked::Refused => return Ok(reply(pr, REFUSAL_REPLY.to_string())),
        Asked::Rejected(e) => return Ok(reply(pr, render_usage_reply(&e))),
        Asked::Request(req) => req,
    };
    Ok(match checked_request(i, &req) {
        Err(u) => reply(pr, render_unverified_notice(u.why(), &link)),
        Ok((Outcome::Run, Some(sha))) => {
            let mut post = compose_run(&sha, pr, i.run, i.result);
            // A status goes only on the commit the comment names (`SHA=`). Any other commit
            // is one the request artifact names, and "a commit of the pull request" includes
            // whatever its author pushes by posting time: another pull request's head, say.
            if asked_sha(&req) != Some(sha.as_str()) {
                post.status = None;
                post.body.push_str(NO_STATUS_NOTE);
            }
            Some(post)
        }
        Ok((Outcome::Failed, _)) => reply(
            pr,
            format!(
                "### attn-diff: the bot could not plan this request\n\nNothing was run: see the \
                 {link}.\n"
            ),
        ),
        Ok(_) => reply(pr, render_unbound_notice(&link)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::post::tests::{request, run};
    use crate::post::User;
    use crate::run::RequestFile;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";
    const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba98";
    const TARGET: Target = Target {
        pr: 5,
        comment_id: 77,
    };

    fn comment(body: &str) -> Comment {
        Comment {
            id: 77,
            issue_url: "https://api.github.com/repos/o/r/issues/5".into(),
            user: User {
                login: "alice".into(),
            },
            created_at: "2026-05-01T12:00:00Z".into(),
            body: Some(body.into()),
            author_association: "MEMBER".into(),
        }
    }

    fn allowlist() -> AllowList {
        AllowList::parse("alice\n").unwrap()
    }

    fn artifact(file: RequestFile) -> Result<RequestArtifact, Unverified> {
        Ok(RequestArtifact { file })
    }

    fn run_file(body: &str, sha: &str) -> RequestFile {
        let mut f = request(Outcome::Run);
        f.request = Some(parse(body).unwrap());
        f.sha = Some(sha.into());
        f
    }

    fn answer_with(
        c: &Comment,
        request: Result<RequestArtifact, Unverified>,
        commits: &[String],
    ) -> Option<Post> {
        let (r, list) = (run(), allowlist());
        let result = ResultArtifact::Files {
            reply: Some(("### attn-diff: all passed\n".into(), false)),
            status: None,
        };
        answer(&Inputs {
            target: TARGET,
            comment: c,
            run: &r,
            allowlist: &list,
            request,
            commits,
            result: &result,
        })
        .unwrap()
    }

    #[test]
    fn the_run_title_names_the_pull_request_and_the_comment() {
        assert_eq!(run_title(5, 77), "bot for comment 77 on pull request 5");
        assert_eq!(parse_run_title(&run_title(5, 77)), Ok(TARGET));
        for bad in [
            "",
            "bot",
            "bot for comment 77 on pull request",
            "bot for comment 77 on pull request 05",
            "bot for comment +77 on pull request 5",
            "bot for comment 77 on pull request 5 ",
            "bot for comment 7 7 on pull request 5",
            "bot for comment 77 on pull request 99999999999999999999999",
            "xbot for comment 77 on pull request 5",
        ] {
            assert!(
                matches!(parse_run_title(bad), Err(PostError::BadTitle(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn usage_and_refusal_replies_are_written_from_the_comment_not_the_artifact() {
        // The artifact's reply.md is not read at all; a forged request saying "rejected" with
        // a live mention in its reply changes nothing.
        let forged = || {
            let mut f = request(Outcome::Rejected);
            f.request = None;
            artifact(f)
        };
        let post = answer_with(&comment("bot:test CASES=four"), forged(), &[]).unwrap();
        assert!(
            post.body
                .starts_with("### attn-diff: cannot run this request"),
            "{}",
            post.body
        );
        assert!(post.body.contains("CASES=four"), "{}", post.body);
        assert_eq!(post.status, None);
        // Someone off the allow-list: the refusal, whatever the artifact says.
        let mut c = comment("bot:test");
        c.user.login = "alice".into();
        let list = AllowList::parse("bob\n").unwrap();
        let r = run();
        let result = ResultArtifact::Missing;
        let post = answer(&Inputs {
            target: TARGET,
            comment: &c,
            run: &r,
            allowlist: &list,
            request: artifact(run_file("bot:test", SHA)),
            commits: &[SHA.into()],
            result: &result,
        })
        .unwrap()
        .unwrap();
        assert_eq!((post.body.as_str(), post.status), (REFUSAL_REPLY, None));
        // Not addressed to the bot (edited since?): nothing.
        assert_eq!(answer_with(&comment("thanks"), forged(), &[]), None);
        // A read-only association is refused like any other not in the set.
        let mut c = comment("bot:test");
        c.author_association = "CONTRIBUTOR".into();
        assert_eq!(asked(&c, &allowlist()), Asked::Refused);
    }

    #[test]
    fn a_status_goes_only_on_the_commit_the_comment_names() {
        // The comment names SHA: the reply and the status, on it.
        let commits = [SHA.to_string(), OTHER.to_string()];
        let named = format!("bot:test SHA={SHA}");
        let post =
            answer_with(&comment(&named), artifact(run_file(&named, SHA)), &commits).unwrap();
        assert_eq!(post.status.as_ref().unwrap().0, SHA);
        assert!(!post.body.contains(NO_STATUS_NOTE), "{}", post.body);
        // The request artifact names another commit of the pull request (its head at posting
        // time, pushed there from another pull request): no status anywhere.
        let mut f = run_file(&named, SHA);
        f.sha = Some(OTHER.into());
        let post = answer_with(&comment(&named), artifact(f), &commits).unwrap();
        assert_eq!(post.status, None);
        assert!(
            post.body.contains(Unverified::Mismatch.why()),
            "{}",
            post.body
        );
        // The comment names no commit: the result is posted under the bound commit's header,
        // with no status, and says why.
        for sha in [SHA, OTHER] {
            let post = answer_with(
                &comment("bot:test"),
                artifact(run_file("bot:test", sha)),
                &commits,
            )
            .unwrap();
            assert_eq!(post.status, None, "{sha}");
            assert!(
                post.body.contains(&format!("at commit {sha}")),
                "{}",
                post.body
            );
            assert!(post.body.ends_with(NO_STATUS_NOTE), "{}", post.body);
        }
    }

    #[test]
    fn a_request_download_that_failed_is_answered_with_the_notice() {
        assert_eq!(
            request_from_download(true, "failure", None).unwrap_err(),
            Unverified::Refused
        );
        assert_eq!(
            request_from_download(false, "skipped", None).unwrap_err(),
            Unverified::Missing
        );
        assert_eq!(
            request_from_download(true, "success", None).unwrap_err(),
            Unverified::Missing
        );
        let c = comment("bot:test");
        let post = answer_with(&c, Err(Unverified::Refused), &[SHA.into()]).unwrap();
        assert!(
            post.body.contains(Unverified::Refused.why()),
            "{}",
            post.body
        );
    }

    #[test]
    fn a_request_runs_only_on_a_commit_of_its_pull_request() {
        let commits = [SHA.to_string()];
        let post = answer_with(
            &comment("bot:test"),
            artifact(run_file("bot:test", SHA)),
            &commits,
        )
        .unwrap();
        assert!(
            post.body.contains(&format!("at commit {SHA}")),
            "{}",
            post.body
        );
        assert!(post.body.contains("all passed"), "{}", post.body);
        // A forged request naming main's head or another pull request's: refused, and no
        // status anywhere.
        let post = answer_with(
            &comment("bot:test"),
            artifact(run_file("bot:test", OTHER)),
            &commits,
        )
        .unwrap();
        assert_eq!(post.status, None);
        assert!(
            post.body.contains(Unverified::ForeignCommit.why()),
            "{}",
            post.body
        );
        assert!(!post.body.contains("all passed"));
        let mut f = run_file("bot:test", SHA);
        f.sha = None;
        let post = answer_with(&comment("bot:test"), artifact(f), &commits).unwrap();
        assert_eq!(post.status, None);
    }

    #[test]
    fn a_forged_request_is_refused_with_a_fixed_notice() {
        let commits = [SHA.to_string()];
        let c = comment("bot:test CASES=4");
        let notice = |u: Unverified| render_unverified_notice(u.why(), &run_link(&run()));
        // Another request than the comment's, another comment, pull request, author or time.
        let mut cases = vec![run_file("bot:test CASES=5", SHA)];
        let mut f = run_file("bot:test CASES=4", SHA);
        f.comment_id = Some(78);
        cases.push(f);
        let mut f = run_file("bot:test CASES=4", SHA);
        f.pr = Some(6);
        cases.push(f);
        let mut f = run_file("bot:test CASES=4", SHA);
        f.author = Some("mallory".into());
        cases.push(f);
        let mut f = run_file("bot:test CASES=4", SHA);
        f.comment_at = Some("2026-05-01T11:00:00Z".into());
        cases.push(f);
        let mut f = run_file("bot:test CASES=4", SHA);
        f.outcome = Outcome::Refused;
        cases.push(f);
        for f in cases {
            let post = answer_with(&c, artifact(f.clone()), &commits).unwrap();
            assert_eq!(post.body, notice(Unverified::Mismatch), "{f:?}");
            assert_eq!(post.status, None);
        }
        // Deleted, flooded or malformed: the notice too, not silence.
        for u in [
            Unverified::Missing,
            Unverified::Replaced,
            Unverified::Refused,
        ] {
            let post = answer_with(&c, Err(u), &commits).unwrap();
            assert_eq!((post.pr, post.body, post.status), (5, notice(u), None));
        }
        // An unbound request and a failed plan: fixed replies.
        let mut f = run_file("bot:test CASES=4", SHA);
        f.outcome = Outcome::Rejected;
        f.sha = None;
        let post = answer_with(&c, artifact(f), &commits).unwrap();
        assert!(post.body.contains("`SHA=`"), "{}", post.body);
        let mut f = run_file("bot:test CASES=4", SHA);
        f.outcome = Outcome::Failed;
        let post = answer_with(&c, artifact(f), &commits).unwrap();
        assert!(post.body.contains("could not plan"), "{}", post.body);
    }

    #[test]
    fn the_comment_must_be_the_runs() {
        let r = run();
        assert_eq!(verify_comment(TARGET, &comment("x"), &r), Ok(()));
        let mut c = comment("x");
        c.id = 78;
        assert!(matches!(
            verify_comment(TARGET, &c, &r),
            Err(PostError::WrongComment { .. })
        ));
        let mut c = comment("x");
        c.issue_url = "https://api.github.com/repos/o/r/issues/55".into();
        assert!(matches!(
            verify_comment(TARGET, &c, &r),
            Err(PostError::WrongPullRequest { .. })
        ));
        let mut c = comment("x");
        c.user.login = "mallory".into();
        assert!(matches!(
            verify_comment(TARGET, &c, &r),
            Err(PostError::WrongAuthor { .. })
        ));
        let mut c = comment("x");
        c.created_at = "2026-05-01T12:00:03Z".into();
        assert!(matches!(
            verify_comment(TARGET, &c, &r),
            Err(PostError::WrongTime { .. })
        ));
    }

    #[test]
    fn commit_lists_are_full_ids() {
        let text = format!("{SHA}\n\n{OTHER}\n");
        assert_eq!(commits_from_lines(&text).unwrap(), [SHA, OTHER]);
        assert_eq!(
            commits_from_lines(&format!("{SHA}\nmain\n")),
            Err(PostError::BadCommit { line: 2 })
        );
        assert!(in_pull_request(SHA, &[SHA.into()]));
        assert!(!in_pull_request(&SHA[..7], &[SHA.into()]));
        assert!(!in_pull_request(OTHER, &[SHA.into()]));
    }
}
