//! Which commit a request tests, bound to the comment: the commit the maintainer named with
//! `SHA=` (a full commit id), or else the pull request's head when the comment was made.
//! GitHub does not say what the head was at a past time, so the plan job gathers evidence and
//! the head now is bound only when the evidence shows it was the head at the comment; else the
//! request is refused and `SHA=` asked for:
//!
//! - the pull request's force-push events (the timeline's `HeadRefForcePushedEvent`: when, and
//!   the head before and after), the only moves of the head that are not fast-forwards, and
//! - the head's first check suite in this repository (created when a push of it first reached
//!   GitHub here; the pull request's author cannot backdate it, unlike a commit date).
//!
//! Between two force-pushes the branch only moves forward, to descendants: a commit the head
//! left cannot come back without a force-push. So the head now was the head at the comment when
//! no force-push came at or after the comment, and either the last force-push before the
//! comment set the head to it, or it first arrived after that force-push and before the comment.
//! A commit first seen before that force-push (pushed, forced away, then pushed again after the
//! comment as a fast-forward) is refused, as is one a force-push moved the head away from.
//!
//! The check suites are not tied to this pull request: a commit pushed earlier anywhere in the
//! repository (a second pull request, opened and closed before the comment) has a suite from
//! then, and can reach this branch after the comment as a fast-forward. So the head is bound
//! this way only when whoever controls the pull request's branch is trusted not to do that:
//! the branch is in this repository (whose writers are its maintainers), or in a fork owned by
//! an allow-listed login. Who opened the pull request says nothing of that (a maintainer can
//! open one from an outsider's fork). Anywhere else, or when GitHub no longer names the head's
//! repository (a deleted fork), the comment must name the commit with `SHA=`
//! ([`bind_request`]).
//!
//! A refusal runs nothing and asks for `SHA=`; the plan job runs as soon as the comment is made
//! (no queue before it), so a refusal means someone pushed in the seconds around the comment or
//! the branch was rewritten in a way the evidence cannot order.

use crate::time::{parse_time, TimeError};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A force-push of the pull request's branch: when, and the head before and after it (`None`
/// when GitHub no longer names the commit).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForcePush {
    pub at: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// What the plan job learned from GitHub about the pull request, as RFC 3339 times.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// When the comment was made (the event's `comment.created_at`).
    pub comment_at: String,
    /// The pull request's head now (the pulls API's `head.sha`).
    pub head: String,
    /// When the check suites for `head` in this repository were created.
    pub head_suites: Vec<String>,
    /// The pull request's force-pushes.
    pub force_pushes: Vec<ForcePush>,
    /// This repository, `owner/name` (the workflow's `github.repository`).
    pub repo: String,
    /// The repository of the pull request's branch, `owner/name` (the pulls API's
    /// `head.repo.full_name`); `None` when GitHub names none (a deleted fork).
    pub head_repo: Option<String>,
}

/// How the tested commit was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BoundBy {
    /// The comment's `SHA=`.
    Sha,
    /// The head when the comment was made.
    HeadAtComment,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The full commit id to test.
    pub sha: String,
    pub by: BoundBy,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum BindError {
    #[error("the pull request's head `{0}` is not a full commit id")]
    BadHead(String),
    #[error(transparent)]
    Time(#[from] TimeError),
    #[error(
        "line {line} of the force-push list is not `TIME BEFORE AFTER` (commits in full, or `-`)"
    )]
    BadForcePush { line: usize },
    #[error("SHA={requested} is not the pull request's head ({head}): it moved, or SHA= names another commit")]
    NotTheHead { requested: String, head: String },
    #[error("the pull request's head moved after the comment (a push at {at}): review {head} and comment again, or give SHA={head}")]
    MovedAfterComment { head: String, at: String },
    #[error("{head} was the head before the force-push at {at} and is the head again now; when it came back is unknown: give SHA={head} to test it")]
    CameBack { head: String, at: String },
    #[error("{head} was first pushed at {pushed}, before the force-push at {forced} that set the head to another commit; it may have come back after the comment: give SHA={head} to test it")]
    SeenBeforeForcePush {
        head: String,
        pushed: String,
        forced: String,
    },
    #[error("cannot tell when {head} became the pull request's head: give SHA={head} to test it")]
    Unknown { head: String },
    #[error("the pull request's branch is in {repo}, neither this repository nor an allow-listed owner's, so its head is not taken on trust: review {head} and give SHA={head} to test it")]
    HeadNotTrusted { head: String, repo: String },
}

fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether the pull request's branch is controlled by someone trusted with an unnamed head:
/// it is in this repository, or in one owned by a login `owner_allowed` lets (the allow-list).
pub fn head_trusted(ev: &Evidence, owner_allowed: impl Fn(&str) -> bool) -> bool {
    match ev.head_repo.as_deref() {
        Some(r) if !ev.repo.is_empty() && r.eq_ignore_ascii_case(&ev.repo) => true,
        Some(r) => r
            .split_once('/')
            .is_some_and(|(owner, name)| !name.is_empty() && owner_allowed(owner)),
        None => false,
    }
}

/// Bind a comment's request to a commit: its `SHA=`, or, on a pull request whose branch is in
/// this repository or an allow-listed owner's ([`head_trusted`]) only, the head at the comment
/// as the evidence shows it ([`bind`]).
pub fn bind_request(
    requested: Option<&str>,
    ev: &Evidence,
    owner_allowed: impl Fn(&str) -> bool,
) -> Result<Binding, BindError> {
    if requested.is_none() && !head_trusted(ev, owner_allowed) {
        if !is_full_sha(&ev.head) {
            return Err(BindError::BadHead(ev.head.chars().take(64).collect()));
        }
        return Err(BindError::HeadNotTrusted {
            head: ev.head.clone(),
            repo: ev
                .head_repo
                .as_deref()
                .map_or("a repository GitHub no longer names".to_string(), |r| {
                    r.chars().take(140).collect()
                }),
        });
    }
    bind(requested, ev)
}

/// Bind the request to a commit from the evidence, or say why not.
pub fn bind(requested: Option<&str>, ev: &Evidence) -> Result<Binding, BindError> {
    if !is_full_sha(&ev.head) {
        return Err(BindError::BadHead(ev.head.chars().take(64).collect()));
    }
    let comment_at = parse_time(&ev.comment_at)?;
    if let Some(requested) = requested {
        // The maintainer named the commit they reviewed, in full: the head must still be it.
        return if requested == ev.head {
            Ok(Binding {
                sha: ev.head.clone(),
                by: BoundBy::Sha,
            })
        } else {
            Err(BindError::NotTheHead {
                requested: requested.to_string(),
                head: ev.head.clone(),
            })
        };
    }
    let head = ev.head.as_str();
    let unknown = || BindError::Unknown {
        head: head.to_string(),
    };
    // A force-push at or after the comment (the same second counts: nobody reviewed it).
    let mut forced = Vec::new();
    for f in &ev.force_pushes {
        let t = parse_time(&f.at)?;
        if t >= comment_at {
            return Err(BindError::MovedAfterComment {
                head: head.to_string(),
                at: f.at.clone(),
            });
        }
        forced.push((t, f));
    }
    // The last force-push before the comment: the branch only moved forward since.
    let last_time = forced.iter().map(|&(t, _)| t).max();
    let last: Vec<&ForcePush> = forced
        .iter()
        .filter(|&&(t, _)| Some(t) == last_time)
        .map(|&(_, f)| f)
        .collect();
    if let Some(f) = last.first() {
        // Two in the same second cannot be ordered; a commit GitHub no longer names cannot be
        // compared.
        if last.iter().any(|g| g.after != f.after) || f.after.is_none() {
            return Err(unknown());
        }
        if f.after.as_deref() == Some(head) {
            return Ok(Binding {
                sha: head.to_string(),
                by: BoundBy::HeadAtComment,
            });
        }
    }
    // A commit a force-push moved the head away from came back by a later push: when is not
    // known (its check suite is from its first push).
    if let Some(f) = ev
        .force_pushes
        .iter()
        .find(|f| f.before.as_deref() == Some(head))
    {
        return Err(BindError::CameBack {
            head: head.to_string(),
            at: f.at.clone(),
        });
    }
    let mut first: Option<(i64, &String)> = None;
    for at in &ev.head_suites {
        let t = parse_time(at)?;
        if first.is_none_or(|(f, _)| t < f) {
            first = Some((t, at));
        }
    }
    let Some((pushed, pushed_at)) = first else {
        return Err(unknown());
    };
    if pushed >= comment_at {
        return Err(BindError::MovedAfterComment {
            head: head.to_string(),
            at: pushed_at.clone(),
        });
    }
    if let (Some(t), Some(f)) = (last_time, last.first()) {
        if pushed <= t {
            return Err(BindError::SeenBeforeForcePush {
                head: head.to_string(),
                pushed: pushed_at.clone(),
                forced: f.at.clone(),
            });
        }
    }
    Ok(Binding {
        sha: head.to_string(),
        by: BoundBy::HeadAtComment,
    })
}

/// Timestamps one per line (as the workflow writes them with `gh api --jq`); blank lines are
/// skipped.
pub fn times_from_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Force-pushes one per line, `TIME BEFORE AFTER`, the commits in full or `-` where GitHub
/// names none (as the workflow writes them from the timeline); blank lines are skipped, any
/// other line is an error.
pub fn force_pushes_from_lines(text: &str) -> Result<Vec<ForcePush>, BindError> {
    let commit = |w: &str| -> Option<Option<String>> {
        match w {
            "-" => Some(None),
            w if is_full_sha(w) => Some(Some(w.to_string())),
            _ => None,
        }
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        let bad = BindError::BadForcePush { line: i + 1 };
        let [at, before, after] = words[..] else {
            return Err(bad);
        };
        parse_time(at)?;
        let (Some(before), Some(after)) = (commit(before), commit(after)) else {
            return Err(bad);
        };
        out.push(ForcePush {
            at: at.to_string(),
            before,
            after,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The allow-list of these tests: `alice` (any case).
    fn alice(owner: &str) -> bool {
        owner.eq_ignore_ascii_case("alice")
    }

    #[test]
    fn without_sha_only_a_head_in_this_or_an_allow_listed_owners_repository_is_bound() {
        // The pre-seeded commit: M pushed in a second pull request before the comment (its
        // suite is older than the comment), fast-forwarded here after it. The evidence cannot
        // tell, so a branch whose owner is not trusted must be met with SHA=.
        let mut e = ev(&["2026-05-01T11:00:00Z"], &[]);
        e.head_repo = Some("mallory/attn-diff".into());
        assert_eq!(
            bind_request(None, &e, alice),
            Err(BindError::HeadNotTrusted {
                head: HEAD.into(),
                repo: "mallory/attn-diff".into()
            })
        );
        let msg = bind_request(None, &e, alice).unwrap_err().to_string();
        assert!(msg.contains(&format!("SHA={HEAD}")), "{msg}");
        // SHA= naming the head binds it, wherever the branch is.
        assert_eq!(
            bind_request(Some(HEAD), &e, alice).map(|b| b.by),
            Ok(BoundBy::Sha)
        );
        // The branch in this repository, or in an allow-listed owner's fork (any case): bound
        // as the evidence shows.
        for trusted in ["o/r", "O/R", "alice/attn-diff", "ALICE/fork"] {
            e.head_repo = Some(trusted.into());
            assert_eq!(bind_request(None, &e, alice), bind(None, &e), "{trusted}");
            assert!(bind_request(None, &e, alice).is_ok(), "{trusted}");
        }
        // A deleted fork, a name that is not `owner/name`, an empty repository: refused.
        for unknown in [None, Some("alice"), Some("alice/"), Some("")] {
            e.head_repo = unknown.map(str::to_string);
            assert!(
                matches!(
                    bind_request(None, &e, alice),
                    Err(BindError::HeadNotTrusted { .. })
                ),
                "{unknown:?}"
            );
        }
        e.head_repo = Some("o/r".into());
        e.repo = String::new();
        assert!(bind_request(None, &e, alice).is_err());
        let mut bad = ev(&["2026-05-01T11:00:00Z"], &[]);
        bad.head_repo = Some("mallory/x".into());
        bad.head = "x".into();
        assert!(matches!(
            bind_request(None, &bad, alice),
            Err(BindError::BadHead(_))
        ));
    }

    #[test]
    fn who_opened_the_pull_request_does_not_matter() {
        // A maintainer's pull request from an outsider's fork: the outsider controls the
        // branch, so its head is not taken on trust; an outsider's pull request from a branch
        // of this repository (pushed by a maintainer) is.
        let mut e = ev(&["2026-05-01T11:00:00Z"], &[]);
        e.head_repo = Some("outsider/attn-diff".into());
        assert!(bind_request(None, &e, alice).is_err());
        e.head_repo = Some("o/r".into());
        assert!(bind_request(None, &e, |_| false).is_ok());
    }

    const HEAD: &str = "89abcdef0123456789abcdef0123456789abcdef";
    const OTHER: &str = "0000000000000000000000000000000000000001";
    const COMMENT: &str = "2026-05-01T12:00:00Z";

    fn fp(at: &str, before: Option<&str>, after: Option<&str>) -> ForcePush {
        ForcePush {
            at: at.into(),
            before: before.map(str::to_string),
            after: after.map(str::to_string),
        }
    }

    fn ev(suites: &[&str], force: &[ForcePush]) -> Evidence {
        Evidence {
            comment_at: COMMENT.into(),
            head: HEAD.into(),
            head_suites: suites.iter().map(|s| s.to_string()).collect(),
            force_pushes: force.to_vec(),
            repo: "o/r".into(),
            head_repo: Some("o/r".into()),
        }
    }

    #[test]
    fn the_head_pushed_before_the_comment_is_bound() {
        let b = bind(None, &ev(&["2026-05-01T11:59:59Z"], &[])).unwrap();
        assert_eq!(b.sha, HEAD);
        assert_eq!(b.by, BoundBy::HeadAtComment);
        // The earliest suite counts: a later one (a re-run) does not move the push. A
        // force-push before the first push of the head is history.
        let b = bind(
            None,
            &ev(
                &["2026-05-01T13:00:00Z", "2026-05-01T10:00:00Z"],
                &[fp("2026-04-30T00:00:00Z", Some(OTHER), Some(OTHER))],
            ),
        );
        assert!(b.is_ok(), "{b:?}");
        // A force-push before the comment that set the head to this very commit.
        let b = bind(
            None,
            &ev(&[], &[fp("2026-05-01T11:00:00Z", Some(OTHER), Some(HEAD))]),
        );
        assert_eq!(b.map(|b| b.by), Ok(BoundBy::HeadAtComment));
    }

    #[test]
    fn a_head_that_moved_after_the_comment_is_refused() {
        // Pushed after the comment, or in the same second.
        for at in ["2026-05-01T12:00:01Z", COMMENT, "2026-05-01T13:00:00+01:00"] {
            let e = bind(None, &ev(&[at], &[])).unwrap_err();
            assert!(
                matches!(e, BindError::MovedAfterComment { .. }),
                "{at}: {e:?}"
            );
        }
        // A force-push after the comment, even back to a commit first seen before it.
        let e = bind(
            None,
            &ev(
                &["2026-05-01T09:00:00Z"],
                &[fp("2026-05-01T12:30:00Z", Some(OTHER), Some(HEAD))],
            ),
        )
        .unwrap_err();
        assert_eq!(
            e,
            BindError::MovedAfterComment {
                head: HEAD.into(),
                at: "2026-05-01T12:30:00Z".into()
            }
        );
        assert!(e.to_string().contains(&format!("SHA={HEAD}")));
    }

    #[test]
    fn the_force_push_dance_is_refused() {
        // M pushed at 11:00 (its check suite), force-pushed back to B at 11:30, the comment at
        // 12:00 (the head is B), M pushed again at 12:01 as a fast-forward of B: no force-push
        // at or after the comment, and M's check suite is older than the comment. M was not the
        // head at the comment.
        let b = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
        let dance = fp("2026-05-01T11:30:00Z", Some(HEAD), Some(b));
        let e = bind(None, &ev(&["2026-05-01T11:00:00Z"], &[dance])).unwrap_err();
        assert_eq!(
            e,
            BindError::CameBack {
                head: HEAD.into(),
                at: "2026-05-01T11:30:00Z".into()
            }
        );
        assert!(e.to_string().contains(&format!("SHA={HEAD}")));
        // The same when GitHub no longer names the commit the force-push left: the head was
        // first seen before the branch was rewritten.
        let dance = fp("2026-05-01T11:30:00Z", None, Some(b));
        let e = bind(None, &ev(&["2026-05-01T11:00:00Z"], &[dance])).unwrap_err();
        assert!(matches!(e, BindError::SeenBeforeForcePush { .. }), "{e:?}");
        // And first seen in the same second as the force-push: not ordered, refused.
        let dance = fp("2026-05-01T11:30:00Z", None, Some(b));
        let e = bind(None, &ev(&["2026-05-01T11:30:00Z"], &[dance])).unwrap_err();
        assert!(matches!(e, BindError::SeenBeforeForcePush { .. }), "{e:?}");
        // Pushed for the first time after the rewrite and before the comment: bound.
        let rewrite = fp("2026-05-01T11:30:00Z", Some(OTHER), Some(b));
        let ok = bind(None, &ev(&["2026-05-01T11:45:00Z"], &[rewrite]));
        assert_eq!(ok.map(|b| b.sha), Ok(HEAD.to_string()));
    }

    #[test]
    fn force_pushes_that_cannot_be_ordered_or_named_are_refused() {
        // The last force-push before the comment left a commit GitHub no longer names.
        let e = bind(
            None,
            &ev(
                &["2026-05-01T11:45:00Z"],
                &[fp("2026-05-01T11:30:00Z", Some(OTHER), None)],
            ),
        );
        assert_eq!(e, Err(BindError::Unknown { head: HEAD.into() }));
        // Two force-pushes in the same second to different commits.
        let e = bind(
            None,
            &ev(
                &["2026-05-01T09:00:00Z"],
                &[
                    fp("2026-05-01T11:30:00Z", Some(OTHER), Some(HEAD)),
                    fp("2026-05-01T11:30:00Z", Some(HEAD), Some(OTHER)),
                ],
            ),
        );
        assert_eq!(e, Err(BindError::Unknown { head: HEAD.into() }));
    }

    #[test]
    fn no_evidence_is_a_refusal_not_a_guess() {
        assert_eq!(
            bind(None, &ev(&[], &[])),
            Err(BindError::Unknown { head: HEAD.into() })
        );
    }

    #[test]
    fn sha_must_be_the_head_in_full() {
        // SHA= names the head: bound even with no evidence, or a force-push after the comment.
        let b = bind(
            Some(HEAD),
            &ev(&[], &[fp("2026-05-01T12:30:00Z", None, None)]),
        )
        .unwrap();
        assert_eq!((b.sha.as_str(), b.by), (HEAD, BoundBy::Sha));
        // An abbreviation is not the head (the parser refuses it first), nor another commit.
        for requested in [&HEAD[..7], &HEAD[..39], OTHER] {
            let e = bind(Some(requested), &ev(&["2026-05-01T09:00:00Z"], &[])).unwrap_err();
            assert!(matches!(e, BindError::NotTheHead { .. }), "{e:?}");
        }
    }

    #[test]
    fn malformed_input_is_an_error() {
        let mut e = ev(&["2026-05-01T09:00:00Z"], &[]);
        e.head = "main".into();
        assert!(matches!(bind(None, &e), Err(BindError::BadHead(_))));
        let mut e = ev(&["yesterday"], &[]);
        assert!(matches!(bind(None, &e), Err(BindError::Time(_))));
        e.head_suites.clear();
        e.comment_at = "now".into();
        assert!(matches!(bind(None, &e), Err(BindError::Time(_))));
    }

    #[test]
    fn evidence_is_read_one_per_line() {
        assert_eq!(
            times_from_lines("a\n\n  b \n"),
            vec!["a".to_string(), "b".to_string()]
        );
        let text = format!("2026-05-01T11:30:00Z {OTHER} {HEAD}\n\n2026-05-01T11:40:00Z - -\n");
        assert_eq!(
            force_pushes_from_lines(&text).unwrap(),
            vec![
                fp("2026-05-01T11:30:00Z", Some(OTHER), Some(HEAD)),
                fp("2026-05-01T11:40:00Z", None, None),
            ]
        );
        for bad in [
            "2026-05-01T11:30:00Z".to_string(),
            format!("2026-05-01T11:30:00Z {OTHER}"),
            format!("2026-05-01T11:30:00Z {OTHER} {HEAD} x"),
            format!("2026-05-01T11:30:00Z {} {HEAD}", &OTHER[..7]),
            format!("2026-05-01T11:30:00Z null {HEAD}"),
        ] {
            assert!(
                matches!(
                    force_pushes_from_lines(&bad),
                    Err(BindError::BadForcePush { line: 1 })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            force_pushes_from_lines(&format!("soon {OTHER} {HEAD}")),
            Err(BindError::Time(_))
        ));
    }
}
