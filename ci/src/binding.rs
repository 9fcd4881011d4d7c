//! Which commit a request tests, bound to the comment: the commit the maintainer named with
//! `SHA=`, or else the pull request's head when the comment was made. GitHub does not say
//! what the head was at a past time, so the plan job gathers evidence of when the current head
//! arrived, and the request is refused whenever the head may have moved after the comment:
//!
//! - the head's first check suite in this repository (created when the push reached the pull
//!   request; the pull request's author cannot backdate it, unlike a commit date), and
//! - the pull request's force-push events.
//!
//! A refusal runs nothing and asks for `SHA=`; the plan job runs as soon as the comment is made
//! (no queue before it), so a refusal means someone pushed in the seconds around the comment.

use crate::time::{parse_time, TimeError};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What the plan job learned from GitHub about the pull request, as RFC 3339 times.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// When the comment was made (the event's `comment.created_at`).
    pub comment_at: String,
    /// The pull request's head now (the pulls API's `head.sha`).
    pub head: String,
    /// When the check suites for `head` in this repository were created.
    pub head_suites: Vec<String>,
    /// When the pull request's branch was force-pushed.
    pub force_pushes: Vec<String>,
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
    #[error("SHA={requested} is not the pull request's head ({head}): it moved, or SHA= names another commit")]
    NotTheHead { requested: String, head: String },
    #[error("the pull request's head moved after the comment (a push at {at}): review {head} and comment again, or give SHA={head}")]
    MovedAfterComment { head: String, at: String },
    #[error("cannot tell when {head} became the pull request's head: give SHA={head} to test it")]
    Unknown { head: String },
}

fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Bind the request to a commit, or say why not.
pub fn bind(requested: Option<&str>, ev: &Evidence) -> Result<Binding, BindError> {
    if !is_full_sha(&ev.head) {
        return Err(BindError::BadHead(ev.head.chars().take(64).collect()));
    }
    let comment_at = parse_time(&ev.comment_at)?;
    if let Some(requested) = requested {
        // The maintainer named the commit they reviewed: the head must still be it.
        return if ev.head.starts_with(requested) {
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
    // A push in the same second as the comment counts as after it: nobody reviewed it.
    let mut moved = None;
    for at in &ev.force_pushes {
        if parse_time(at)? >= comment_at {
            moved = Some(at.clone());
        }
    }
    let mut first: Option<(i64, &String)> = None;
    for at in &ev.head_suites {
        let t = parse_time(at)?;
        if first.is_none_or(|(f, _)| t < f) {
            first = Some((t, at));
        }
    }
    match (moved, first) {
        (Some(at), _) => Err(BindError::MovedAfterComment {
            head: ev.head.clone(),
            at,
        }),
        (None, None) => Err(BindError::Unknown {
            head: ev.head.clone(),
        }),
        (None, Some((t, at))) if t >= comment_at => Err(BindError::MovedAfterComment {
            head: ev.head.clone(),
            at: at.clone(),
        }),
        (None, Some(_)) => Ok(Binding {
            sha: ev.head.clone(),
            by: BoundBy::HeadAtComment,
        }),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "89abcdef0123456789abcdef0123456789abcdef";
    const COMMENT: &str = "2026-05-01T12:00:00Z";

    fn ev(suites: &[&str], force: &[&str]) -> Evidence {
        Evidence {
            comment_at: COMMENT.into(),
            head: HEAD.into(),
            head_suites: suites.iter().map(|s| s.to_string()).collect(),
            force_pushes: force.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_head_pushed_before_the_comment_is_bound() {
        let b = bind(None, &ev(&["2026-05-01T11:59:59Z"], &[])).unwrap();
        assert_eq!(b.sha, HEAD);
        assert_eq!(b.by, BoundBy::HeadAtComment);
        // The earliest suite counts: a later one (a re-run) does not move the push.
        let b = bind(
            None,
            &ev(
                &["2026-05-01T13:00:00Z", "2026-05-01T10:00:00Z"],
                &["2026-04-30T00:00:00Z"],
            ),
        );
        assert!(b.is_ok(), "{b:?}");
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
            &ev(&["2026-05-01T09:00:00Z"], &["2026-05-01T12:30:00Z"]),
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
    fn no_evidence_is_a_refusal_not_a_guess() {
        assert_eq!(
            bind(None, &ev(&[], &[])),
            Err(BindError::Unknown { head: HEAD.into() })
        );
    }

    #[test]
    fn sha_must_still_be_the_head() {
        // SHA= names the head (in full or abbreviated): bound even with no evidence.
        for requested in [HEAD, &HEAD[..7]] {
            let b = bind(Some(requested), &ev(&[], &["2026-05-01T12:30:00Z"])).unwrap();
            assert_eq!((b.sha.as_str(), b.by), (HEAD, BoundBy::Sha));
        }
        // Anything else: the head moved since the maintainer looked.
        let e = bind(Some("0123456"), &ev(&["2026-05-01T09:00:00Z"], &[])).unwrap_err();
        assert!(matches!(e, BindError::NotTheHead { .. }), "{e:?}");
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
    fn times_are_read_one_per_line() {
        assert_eq!(
            times_from_lines("a\n\n  b \n"),
            vec!["a".to_string(), "b".to_string()]
        );
    }
}
