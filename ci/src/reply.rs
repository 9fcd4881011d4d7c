//! What the bot posts: the markdown reply to a request (per-backend table, each minimal
//! failing case in a collapsed section naming its replay artifact), the usage reply to a
//! comment it cannot parse, and the commit status.
//!
//! Nothing of the comment's own text is echoed but the offending word (and the value in the
//! error message), both inside a fenced block longer than any run of backticks they hold, so
//! no value can close it and become live markdown; a request is shown in its canonical form.

use crate::request::{BotRequest, ParseError, USAGE};
use crate::summary::{CheckSummary, FailureRecord};
pub use attn_results::check_view::Verdict;
use attn_results::markdown::{check_body, code, fenced};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// The commit status context the report writes. The poster replaces it with
/// [`status_context`], which names the pull request whose code made the claim.
pub const STATUS_CONTEXT: &str = "attn-diff/bot";

/// The context of the status the poster sets on pull request `pr`'s commit: the state is what
/// that pull request's own code reported, and says so. It differs per pull request, so no
/// branch protection rule can require it.
pub fn status_context(pr: u64) -> String {
    format!("{STATUS_CONTEXT}: self-reported by pull request {pr}'s code")
}

/// The reply to a `bot:test` comment from someone the allow-list does not name.
pub const REFUSAL_REPLY: &str = "### attn-diff: not run\n\nThe bot runs only for the \
     repository's owners, members and collaborators listed in `.github/bot-allowlist.txt`.\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Success,
    Failure,
    Error,
}

/// A commit status as the posting workflow sets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    pub description: String,
    pub context: String,
}

impl Status {
    fn new(state: State, description: String) -> Status {
        // GitHub cuts a status description at 140 characters.
        let description: String = description.chars().take(140).collect();
        Status {
            state,
            description,
            context: STATUS_CONTEXT.to_string(),
        }
    }
}

/// Where the reply points for files: the artifact holding the replay files, and the run.
#[derive(Clone, Debug, Default)]
pub struct ReplyContext {
    pub replay_artifact: String,
    pub run_url: Option<String>,
}

/// The file name of a replay path (its folder is the shard's, not the artifact's).
fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// Where a failure's replay file is, under its report.
fn replay_note(f: &FailureRecord, ctx: &ReplyContext) -> String {
    match &f.replay {
        Some(path) => {
            let name = file_name(path);
            format!(
                "\nreplay file {} in artifact {}: {}\n",
                code(name),
                code(&ctx.replay_artifact),
                code(&format!("attn-diff replay {name} --backend {}", f.backend))
            )
        }
        None => "\n(no replay file was written)\n".to_string(),
    }
}

/// Whether the run as a whole is good: every real backend agreed, every mutant was caught.
pub fn all_ok(s: &CheckSummary) -> bool {
    s.backends.iter().all(|b| Verdict::of(b).ok())
}

/// The reply to a request that ran.
pub fn render_reply(req: &BotRequest, s: &CheckSummary, ctx: &ReplyContext) -> String {
    let mut out = String::new();
    let verdict = if all_ok(s) {
        "all passed"
    } else if s.any_divergence() {
        "DIVERGENCE"
    } else {
        "NOTHING TESTED"
    };
    let _ = writeln!(out, "### attn-diff: {verdict}\n");
    let _ = writeln!(out, "{}\n", code(&req.canonical()));
    let upstream_cases = s.upstream.len() / s.backends.len().max(1);
    let _ = writeln!(
        out,
        "{} property case(s){} over {} shard(s), seed {}, and {} upstream case(s) per backend.\n",
        s.cases,
        if s.deep { " (deep)" } else { "" },
        req.shards,
        s.seed,
        upstream_cases
    );
    out.push_str(&check_body(s, &|f| replay_note(f, ctx)));
    if let Some(url) = &ctx.run_url {
        let _ = writeln!(out, "\n[workflow run]({url})");
    }
    out
}

/// The commit status of a request that ran.
pub fn status_of(s: &CheckSummary) -> Status {
    let bad: Vec<String> = s
        .backends
        .iter()
        .filter(|b| !Verdict::of(b).ok())
        .map(|b| b.backend.name.clone())
        .collect();
    let cases: usize = s.backends.iter().map(|b| b.reached()).sum();
    if bad.is_empty() {
        Status::new(
            State::Success,
            format!(
                "{} backend(s), {cases} case runs: all passed",
                s.backends.len()
            ),
        )
    } else {
        let what = if s.any_divergence() {
            "diverged"
        } else {
            "ran nothing"
        };
        Status::new(State::Failure, format!("{what}: {}", bad.join(", ")))
    }
}

/// The reply to a comment the bot cannot parse. The message and the word hold the comment's
/// own text, so they go in a fenced block, where mentions, links and HTML are inert.
pub fn render_usage_reply(e: &ParseError) -> String {
    format!(
        "### attn-diff: cannot run this request\n\nNothing was run. The problem, and the word of \
         the comment it is about:\n\n{}\nUsage:\n\n{}",
        fenced(
            &format!("{e}\noffending word: {}", e.offending_word()),
            "text"
        ),
        fenced(USAGE, "text")
    )
}

/// The reply to a request whose commit could not be bound to the comment (the head moved, or
/// `SHA=` is not the head): nothing ran.
pub fn render_unbound_reply(e: &crate::binding::BindError) -> String {
    format!(
        "### attn-diff: not run\n\nNothing was run: the commit to test could not be bound to \
         this comment.\n\n{}",
        fenced(&e.to_string(), "text")
    )
}

/// The poster's reply to a request the plan job left unbound. What the poster knows of it
/// could have been written by the pull request's code, so it says no more than this and
/// points to the plan job's log.
pub fn render_unbound_notice(link: &str) -> String {
    format!(
        "### attn-diff: not run\n\nNothing was run: the bot could not show that the pull \
         request's head is the commit it was when this comment was made (the head moved or was \
         force-pushed around the comment, or the pull request's author is not on the \
         allow-list). Review the head and comment again with `SHA=` and its full commit id. The \
         plan job's log in the {link} says why.\n"
    )
}

/// The poster's reply when the request the plan job left cannot be trusted: missing,
/// replaced, refused, or at odds with the comment. Fixed text: nothing of it is repeated.
pub fn render_unverified_notice(why: &str, link: &str) -> String {
    format!(
        "### attn-diff: could not verify this run\n\nNothing from the run is posted and no \
         status is set: the request the plan job left could not be verified ({why}). Comment \
         again to run it anew; see the {link}.\n"
    )
}

/// The reply when the run itself broke (a shard produced no summary, the merge failed).
pub fn render_error_reply(req: &BotRequest, what: &str, ctx: &ReplyContext) -> String {
    let mut out = format!(
        "### attn-diff: the run failed\n\n{}\n\n{}",
        code(&req.canonical()),
        fenced(what, "text")
    );
    if let Some(url) = &ctx.run_url {
        let _ = writeln!(out, "\n[workflow run]({url})");
    }
    out
}

/// The commit status of a run that broke.
pub fn error_status(what: &str) -> Status {
    Status::new(
        State::Error,
        what.lines().next().unwrap_or(what).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse;

    /// The reply with every fenced block removed, found as CommonMark does: an opening fence
    /// of N backticks is closed only by a line of at least N backticks.
    fn outside_fences(md: &str) -> String {
        let mut out = String::new();
        let mut open: Option<usize> = None;
        for line in md.lines() {
            let ticks = line.chars().take_while(|&c| c == '`').count();
            match open {
                None if ticks >= 3 => open = Some(ticks),
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
                Some(n) if ticks >= n && line.trim_end().len() == ticks => open = None,
                Some(_) => {}
            }
        }
        out
    }

    #[test]
    fn usage_reply_keeps_echoed_values_inside_the_fence() {
        for comment in [
            "bot:test CASES=a`@team`b",
            "bot:test SEED=```@org/team```",
            "bot:test FOO=``````\u{20}@you",
            "bot:test BACKENDS=<img>,[x](http://e.com)",
        ] {
            let r = render_usage_reply(&parse(comment).unwrap_err());
            let outside = outside_fences(&r);
            for live in ["@", "<img", "](", "team"] {
                assert!(
                    !outside.contains(live),
                    "{comment}: {live} outside the fence:\n{r}"
                );
            }
            // The values are shown, inside.
            assert!(r.contains("offending word: "), "{r}");
        }
    }

    #[test]
    fn usage_reply_names_the_word_and_runs_nothing() {
        let e = parse("bot:test CASES=0").unwrap_err();
        let r = render_usage_reply(&e);
        assert!(r.contains("offending word: CASES=0\n"), "{r}");
        assert!(r.contains("CASES=0 is out of range 1..=100000"));
        assert!(r.contains("Nothing was run"));
        assert!(r.contains("BACKENDS=a,b,..."));
    }

    #[test]
    fn statuses_are_short() {
        let s = error_status(&"x".repeat(500));
        assert_eq!(s.description.len(), 140);
        assert_eq!(s.context, "attn-diff/bot");
        assert_eq!(
            serde_json::to_string(&State::Failure).unwrap(),
            "\"failure\""
        );
    }
}
